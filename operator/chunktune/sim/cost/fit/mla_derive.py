"""The committed MLA table (:mod:`chunktune.sim.cost.mla_table`) rewritten from AIConfigurator's
vLLM ``mla_{generation,context}_module_perf`` tables in the shared data: ``python -m
chunktune.sim.cost.fit.mla_derive --data ../shared/data``.

``python -m chunktune.sim.cost.fit.mla_derive --norm-chain PRE --data ../shared/data``
rewrites the other committed table, the native norm chain's cost
(:data:`chunktune.sim.cost.mla_table.NORM_CHAIN_PATH`): ``PRE`` holds the B200's vLLM 0.24.0
module tables as AIConfigurator first committed them (``mla_generation_module_perf.csv.gz``
from its commit bb300a327's parent, ``mla_context_module_perf.csv.gz`` from 6c72579ef's
parent, their parquet files written as gzip CSV with every row and column), the shared data's
B200 0.24.0 tables the re-collection that replaced them.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from chunktune.sim.cost.fit.aic_kernels import AIC_GPUS
from chunktune.sim.cost.fit.moe_derive import rewrite_main
from chunktune.sim.cost.mla_table import (
    MLA_PATH,
    NORM_CHAIN_PATH,
    PROMPTS,
    STEPS,
    Key,
    measured_us,
)

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


def derive(root: Path, gpus: dict[str, str] = MLA_GPUS) -> list[tuple[Key, str, list[float]]]:
    """Per GPU of ``gpus`` (AIConfigurator folder -> our name; newest release with the table):
    the generation curves over :data:`STEPS` per batch, and the context curves (batch 1) over
    :data:`PROMPTS`, microseconds, fastest backend; curves missing a point are left out."""
    out = []
    for folder, gpu in gpus.items():
        base = root / "aiconfigurator-vllm" / folder
        if not base.is_dir():
            continue
        for kind, table, grid, col in (("gen", "mla_generation_module_perf", STEPS, "step"),
                                       ("ctx", "mla_context_module_perf", PROMPTS, "isl")):
            path = _newest(base, table)
            if path is None:
                continue
            best = _fastest(path, gpu, kind, col)
            for key, curve in sorted(best.items()):
                if all(x in curve for x in grid):
                    out.append((key, path.parent.name, [curve[x] for x in grid]))
    return out


def served_curves(root: Path) -> dict[Key, list[float]]:
    """Every GPU's module curves with an MLA table in the shared data (not only the committed
    ones: :data:`MLA_GPUS`), on the committed grids, as the engine reads a committed curve
    (:func:`chunktune.sim.cost.mla_table.measured_us`: the H100's and H200's less the native
    norm chain), microseconds. What the held-out comparison
    (:func:`chunktune.sim.cost.fit.kernel_report.mla_report`) predicts and is predicted from."""
    return {key: measured_us(key, us) for key, _, us in derive(root, AIC_GPUS)}


def _fastest(path: Path, gpu: str, kind: str, col: str) -> dict[Key, dict[int, float]]:
    """One module table's microseconds per key and grid point (``col``: step or prompt),
    the fastest backend's."""
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
    return best


#: A key of the norm chain's table: kind, projections' format, KV format, heads, batch.
ChainKey = tuple[str, str, str, int, int]


def derive_norm_chain(pre: Path, root: Path) -> list[tuple[ChainKey, list[float]]]:
    """The B200's native norm chain (:data:`chunktune.sim.cost.mla_table.NORM_CHAIN_PATH`):
    per kind, formats, heads and decode batch, the first collection (``pre``) less the
    re-collection (the shared data's B200 0.24.0 tables), microseconds. A decode batch's
    chain acts on its tokens, not on their context: one figure, the median over the
    context grid. A prefill's grows with its prompt: one figure per prompt of the grid."""
    post = root / "aiconfigurator-vllm" / "b200_sxm" / "0.24.0"
    out: list[tuple[ChainKey, list[float]]] = []
    for kind, table, grid, col in (("gen", "mla_generation_module_perf", STEPS, "step"),
                                   ("ctx", "mla_context_module_perf", PROMPTS, "isl")):
        before = _fastest(pre / f"{table}.csv.gz", "b200", kind, col)
        after = _fastest(post / f"{table}.csv.gz", "b200", kind, col)
        for key, curve in sorted(before.items()):
            now = after.get(key, {})
            if not all(x in curve and x in now for x in grid):
                continue
            diff = [curve[x] - now[x] for x in grid]
            out.append((key[1:], [statistics.median(diff)] if kind == "gen" else diff))
    return out


def write_norm_chain(rows: list[tuple[ChainKey, list[float]]],
                     path: Path = NORM_CHAIN_PATH) -> None:
    with path.open("w", newline="") as fh:
        fh.write(f"# Derived from {SOURCE} on b200_sxm, vLLM 0.24.0: the module as first "
                 "collected (commits bb300a327^ and 6c72579ef^: rms_norm and rotary\n# through "
                 "their native PyTorch chains) less its re-collection with vLLM's fused CUDA ops "
                 "(as served; the shared data's), microseconds\n# per kind, formats, heads on "
                 "the rank and decode batch: gen, the median over the context grid; ctx, over "
                 f"the prompt grid ({' '.join(map(str, PROMPTS))}).\n# Rewrite: python -m "
                 "chunktune.sim.cost.fit.mla_derive --norm-chain PRE --data DIR\n")
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(["kind", "gemm", "kv", "heads", "batch", "us"])
        for (kind, g, kv, heads, batch), us in rows:
            w.writerow([kind, g, kv, heads, batch, " ".join(f"{u:.1f}" for u in us)])


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
    if "--norm-chain" in sys.argv:
        ap = argparse.ArgumentParser(description="rewrite the committed MLA norm-chain table")
        ap.add_argument("--norm-chain", type=Path, required=True,
                        help="the B200's first-collected module tables (gzip CSV)")
        ap.add_argument("--data", type=Path, required=True, help="the shared data folder")
        a = ap.parse_args()
        chain = derive_norm_chain(a.norm_chain, a.data)
        write_norm_chain(chain)
        print(f"wrote {len(chain)} curves to {NORM_CHAIN_PATH}")
        return 0
    return rewrite_main("MLA", derive, write, MLA_PATH)


if __name__ == "__main__":
    sys.exit(main())
