"""The committed MLA table (:mod:`chunktune.sim.cost.mla_table`) rewritten from AIConfigurator's
vLLM ``mla_{generation,context}_module_perf`` tables in the shared data: ``python -m
chunktune.sim.cost.fit.mla_derive --data ../shared/data``."""

from __future__ import annotations

import csv
import gzip
import sys
from collections import defaultdict
from pathlib import Path

from chunktune.sim.cost.fit.moe_derive import rewrite_main
from chunktune.sim.cost.mla_table import MLA_PATH, PROMPTS, STEPS, Key

SOURCE = ("NVIDIA AIConfigurator (ai-dynamo/aiconfigurator, Apache-2.0, Copyright NVIDIA "
          "CORPORATION & AFFILIATES) systems/data/<gpu>/vllm/<version>/mla_{generation,context}"
          "_module_perf")
#: AIConfigurator's system folders read -> our GPU names.
MLA_GPUS = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200"}
#: The projections' formats read, under the cost model's names (``fp8_block``: DeepSeek's
#: 128x128 block-scaled FP8).
GEMM_TYPES = {"bfloat16": "bf16", "fp8_block": "fp8_block", "nvfp4": "nvfp4"}
KV_TYPES = {"bfloat16": "bf16", "fp8": "fp8"}


def _newest(base: Path, table: str) -> Path | None:
    found = sorted((p for p in base.iterdir() if (p / f"{table}.csv.gz").exists()),
                   key=lambda p: tuple(int(x) for x in p.name.split(".") if x.isdigit()))
    return found[-1] / f"{table}.csv.gz" if found else None


def derive(root: Path) -> list[tuple[Key, str, list[float]]]:
    """Per GPU (newest release with the table): the generation curves over :data:`STEPS` per
    batch, and the context curves (batch 1) over :data:`PROMPTS`, microseconds, fastest
    backend; curves missing a point are left out."""
    out = []
    for folder, gpu in MLA_GPUS.items():
        base = root / "aiconfigurator-vllm" / folder
        if not base.is_dir():
            continue
        for kind, table, grid, col in (("gen", "mla_generation_module_perf", STEPS, "step"),
                                       ("ctx", "mla_context_module_perf", PROMPTS, "isl")):
            path = _newest(base, table)
            if path is None:
                continue
            best: dict[Key, dict[int, float]] = defaultdict(dict)
            with gzip.open(path, "rt", newline="") as fh:
                for r in csv.DictReader(fh):
                    g, kv = GEMM_TYPES.get(r["gemm_type"]), KV_TYPES.get(r["kv_cache_dtype"])
                    batch = int(r["batch_size"])
                    if g is None or kv is None or r["tp_size"] != "1":
                        continue
                    if kind == "ctx" and (batch != 1 or r["mla_dtype"] != "bfloat16"):
                        continue
                    key = (gpu, kind, g, kv, int(r["num_heads"]), batch if kind == "gen" else 0)
                    x = int(r[col])
                    us = float(r["latency"]) * 1e3
                    best[key][x] = min(us, best[key].get(x, us))
            for key, curve in sorted(best.items()):
                if all(x in curve for x in grid):
                    out.append((key, path.parent.name, [curve[x] for x in grid]))
    return out


def write(rows: list[tuple[Key, str, list[float]]], path: Path = MLA_PATH) -> None:
    with path.open("w", newline="") as fh:
        fh.write(f"# Derived from {SOURCE}: per GPU, the newest vLLM release's MLA module "
                 "(DeepSeek-V3's dimensions), projections' and KV\n# format, heads on the rank "
                 "and decode batch: microseconds over the decodes' context "
                 f"({' '.join(map(str, STEPS))})\n# (kind gen), or over the prompt of one "
                 f"prefill from scratch ({' '.join(map(str, PROMPTS))}) (kind ctx, batch 0);\n"
                 "# the fastest backend. Rewrite: python -m chunktune.sim.cost.fit.mla_derive "
                 "--data DIR\n")
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(["gpu", "version", "kind", "gemm", "kv", "heads", "batch", "us"])
        for (gpu, kind, g, kv, heads, batch), version, us in rows:
            w.writerow([gpu, version, kind, g, kv, heads, batch,
                        " ".join(f"{u:.1f}" for u in us)])


def main() -> int:
    return rewrite_main("MLA", derive, write, MLA_PATH)


if __name__ == "__main__":
    sys.exit(main())
