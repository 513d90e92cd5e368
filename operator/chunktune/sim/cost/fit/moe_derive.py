"""The committed MoE table (:mod:`chunktune.sim.cost.moe_table`) rewritten from AIConfigurator's
vLLM ``moe_perf`` tables in the shared data: ``python -m chunktune.sim.cost.fit.moe_derive
--data ../shared/data``."""

from __future__ import annotations

import argparse
import csv
import gzip
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chunktune.sim.cost.moe_table import MOE_PATH, TOKENS, Key, counts

SOURCE = ("NVIDIA AIConfigurator (ai-dynamo/aiconfigurator, Apache-2.0, Copyright NVIDIA "
          "CORPORATION & AFFILIATES) systems/data/<gpu>/vllm/<version>/moe_perf")
#: AIConfigurator's system folders read -> our GPU names: every GPU it timed vLLM's MoE layer
#: on (those of ``aic_kernels.AIC_GPUS``), so each runs its own measured layer and a GPU
#: without one borrows the table of the nearest that runs the same MoE kernel
#: (``coefficients.moe_kernel``). The A100's only rows are vLLM 0.14's, power-law routing,
#: Triton's ``fused_moe``.
MOE_GPUS = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200", "l40s": "l40s",
            "rtx_pro_6000_server": "rtx-pro-6000", "a100_sxm": "a100-sxm"}
#: AIConfigurator's ``moe_dtype`` -> the weight format the table is keyed by: ``bf16``,
#: ``fp8`` (per-tensor), ``fp8_block`` (128x128 blocks, as FP8 MoE checkpoints ship),
#: ``int4`` (W4A16, group-quantised: Kimi-K2.x), ``nvfp4`` (W4A4), ``mxfp4`` (W4A16 MXFP4:
#: gpt-oss on Hopper and, by default, on Blackwell), ``mxfp4_mxfp8`` (MXFP4 weights, MXFP8
#: activations: FlashInfer's TRT-LLM kernel on Blackwell, which vLLM runs for MXFP4 experts
#: under ``VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1``).
MOE_DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "int4_wo": "int4",
              "nvfp4": "nvfp4", "w4a16_mxfp4": "mxfp4", "w4a8_mxfp4_mxfp8": "mxfp4_mxfp8"}
#: Formats also kept per kernel, by (format, kernel): block-FP8 experts as vLLM's Triton
#: ``fused_moe`` runs them (``fp8_block_triton``: the collector's ``vllm_fused_moe`` or
#: ``..._triton_...`` rows), the kernel vLLM falls back to on Blackwell when FlashInfer and
#: DeepGEMM are turned off (``VLLM_USE_FLASHINFER_MOE_FP8=0 VLLM_MOE_USE_DEEP_GEMM=0``), where
#: ``fp8_block`` is the fastest backend timed (FlashInfer TRT-LLM on the B200 under vLLM
#: 0.24); MXFP4 experts as Marlin runs them (``mxfp4_marlin``: the ``..._marlin_...`` rows),
#: which vLLM runs on Hopper under ``VLLM_MXFP4_USE_MARLIN=1`` where ``mxfp4`` is the fastest
#: timed (OpenAI's Triton kernel for gpt-oss's shapes).
KERNEL_FORMATS = {("fp8_block", "triton"): "fp8_block_triton", ("mxfp4", "marlin"): "mxfp4_marlin"}


def kernel_format(dtype: str, kernel_source: str) -> str | None:
    """The per-kernel format (:data:`KERNEL_FORMATS`) a row also counts for, or None."""
    if kernel_source == "vllm_fused_moe" or (
            "triton" in kernel_source and "flashinfer" not in kernel_source):
        kernel = "triton"
    elif "marlin" in kernel_source:
        kernel = "marlin"
    else:
        return None
    return KERNEL_FORMATS.get((dtype, kernel))
#: How the timed tokens were routed: AIConfigurator's ``power_law_1.01`` (expert loads drawn
#: from a power law, as real routers skew them) rather than ``balanced`` (every expert an
#: even share: the most experts a step can touch; gpt-oss-120b on the B200 at 16 tokens:
#: 204 us balanced, 156 us power law).
DISTRIBUTION = "power_law_1.01"


def derive(root: Path) -> list[tuple[Key, str, list[float]]]:
    """Per (GPU, format, shape, split), from the newest vLLM release that has it: the fastest
    backend's microseconds at each of :data:`TOKENS` (:data:`DISTRIBUTION` routing; curves
    missing a count are left out; only rows of the kernel and tiles vLLM runs on the GPU,
    :func:`counts`)."""
    out: dict[Key, tuple[tuple[int, ...], str, list[float]]] = {}
    for folder, gpu in MOE_GPUS.items():
        base = root / "aiconfigurator-vllm" / folder
        if not base.is_dir():
            continue
        for vdir in sorted(base.iterdir()):
            path = vdir / "moe_perf.csv.gz"
            if not path.exists():
                continue
            best: dict[Key, dict[int, float]] = defaultdict(dict)
            with gzip.open(path, "rt", newline="") as fh:
                for r in csv.DictReader(fh):
                    dtype = MOE_DTYPES.get(r["moe_dtype"])
                    t = int(r["num_tokens"])
                    if dtype is None or r["distribution"] != DISTRIBUTION or t not in TOKENS:
                        continue
                    shape = (int(r["hidden_size"]), int(r["inter_size"]), int(r["num_experts"]),
                             int(r["topk"]), int(r["moe_tp_size"]), int(r["moe_ep_size"]))
                    us = float(r["latency"]) * 1e3
                    for fmt in (dtype, kernel_format(dtype, r.get("kernel_source") or "")):
                        if fmt is not None and counts(gpu, fmt, vdir.name, r):
                            curve = best[(gpu, fmt, *shape)]
                            curve[t] = min(us, curve.get(t, us))
            rank = tuple(int(x) for x in vdir.name.split(".") if x.isdigit())
            for key, curve in best.items():
                if (key[6] * key[7] <= 8 and all(t in curve for t in TOKENS)
                        and (key not in out or out[key][0] < rank)):
                    out[key] = (rank, vdir.name, [curve[t] for t in TOKENS])
    return [(key, version, us) for key, (_, version, us) in sorted(out.items())]


def write(rows: list[tuple[Key, str, list[float]]], path: Path = MOE_PATH) -> None:
    with path.open("w", newline="") as fh:
        fh.write(f"# Derived from {SOURCE}: per GPU, vLLM release, weight format, hidden size, "
                 "expert width, experts, top-k,\n# the experts' TP and EP sizes: the fastest "
                 "backend's microseconds at tokens "
                 f"{' '.join(map(str, TOKENS))} ({DISTRIBUTION} routing;\n"
                 "# fp8_block_triton: Triton's fused_moe only; mxfp4_marlin: Marlin only).\n"
                 "# Rewrite: python -m chunktune.sim.cost.fit.moe_derive --data DIR\n")
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(["gpu", "version", "dtype", "hidden", "inter", "experts", "topk", "tp", "ep",
                    "us"])
        for key, version, us in rows:
            gpu, dtype, *shape = key
            w.writerow([gpu, version, dtype, *shape, " ".join(f"{u:.1f}" for u in us)])


def rewrite_main(what: str, derive: Callable[[Path], list[Any]],
                 write: Callable[[list[Any]], None], path: Path) -> int:
    """The command that rewrites a committed table from the shared data: ``--data DIR``."""
    ap = argparse.ArgumentParser(description=f"rewrite the committed {what} table from the "
                                             "shared data")
    ap.add_argument("--data", type=Path, required=True, help="the shared data folder")
    a = ap.parse_args()
    rows = derive(a.data)
    write(rows)
    print(f"wrote {len(rows)} curves to {path}")
    return 0


def main() -> int:
    return rewrite_main("MoE", derive, write, MOE_PATH)


if __name__ == "__main__":
    sys.exit(main())
