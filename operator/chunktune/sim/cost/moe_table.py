"""Fused-MoE layer times looked up in the GPU's measured table (AIConfigurator's vLLM MoE layer).

vLLM runs a mixture-of-experts layer's routed experts as one fused kernel whose backend
depends on the GPU, the weights' format and the release (``vllm/model_executor/layers/
fused_moe``, 0.33.0: Triton ``fused_moe`` for bf16 and FP8 on Hopper, Marlin for INT4 W4A16
(``compressed_tensors_moe``: ``CompressedTensorsWNA16MarlinMoEMethod``) and for MXFP4 on
Hopper (``quantization/mxfp4.py``: Marlin or Triton), FlashInfer TRT-LLM kernels for FP8
block, NVFP4 and MXFP4 on Blackwell (``modelopt.py``, ``mxfp4.py``)). AIConfigurator timed that
layer per GPU and vLLM release, per weight format, model shape (hidden, expert width, experts,
top-k), the experts' tensor-parallel and expert-parallel split and token count, the tokens
routed evenly (``balanced``) or by a power law. Where the GPU's table has the model's shape in
the weights' format, the step time interpolates it (linear in log time over log tokens; past
the largest measured count, proportional to tokens) instead of the fitted roofline
(:func:`chunktune.sim.cost.step_time.moe_form`): the roofline knows neither the backend's
fixed costs nor how its tiles fill at a few tokens per expert.

Which release's table: the newest that has the curve. Only vLLM 0.24's collector times
vLLM's own MoE layer as its backend selection runs it (``kernel_source`` names the method and
backend: ``vllm_fp8moe_flashinfer_trtllm_...`` on the B200); the older ones (0.14-0.22) time
the Triton ``fused_moe`` kernel whatever vLLM would pick (on the B200 at 16 tokens, TP 2,
MiniMax-M2.5's block-FP8 experts: 191 us under 0.19's collector, 161 us under 0.24's; replayed
with the 0.19 curve, the B200 MiniMax TP 2 rows of vLLM 0.19 come out 22% slow). Several
backends timed for one format (B200: the TRT-LLM monolithic and modular kernels, CUTLASS)
count as the fastest.

Committed derivative: ``data/aic_moe_us.csv`` (``python -m chunktune.sim.cost.moe_table
--data ../shared/data`` rewrites it), one line per measured curve.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import sys
from collections import defaultdict
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

DATA = Path(__file__).with_name("data")
MOE_PATH = DATA / "aic_moe_us.csv"
SOURCE = ("NVIDIA AIConfigurator (ai-dynamo/aiconfigurator, Apache-2.0, Copyright NVIDIA "
          "CORPORATION & AFFILIATES) systems/data/<gpu>/vllm/<version>/moe_perf")
#: AIConfigurator's system folders read -> our GPU names (the GPUs with MoE serving runs).
MOE_GPUS = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200"}
#: AIConfigurator's ``moe_dtype`` -> the weight format the table is keyed by: ``bf16``,
#: ``fp8`` (per-tensor), ``fp8_block`` (128x128 blocks, as FP8 MoE checkpoints ship),
#: ``int4`` (W4A16, group-quantised: Kimi-K2.x), ``nvfp4`` (W4A4), ``mxfp4`` (W4A16 MXFP4:
#: gpt-oss on Hopper and, by default, on Blackwell).
MOE_DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "int4_wo": "int4",
              "nvfp4": "nvfp4", "w4a16_mxfp4": "mxfp4"}
#: How the timed tokens were routed: AIConfigurator's ``power_law_1.01`` (expert loads drawn
#: from a power law, as real routers skew them) rather than ``balanced`` (every expert an
#: even share: the most experts a step can touch; gpt-oss-120b on the B200 at 16 tokens:
#: 204 us balanced, 156 us power law).
DISTRIBUTION = "power_law_1.01"
#: The token counts each committed curve keeps.
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)

Key = tuple[str, str, int, int, int, int, int, int]  # gpu, dtype, hidden, inter, E, k, tp, ep


def derive(root: Path) -> list[tuple[Key, str, list[float]]]:
    """Per (GPU, format, shape, split), from the newest vLLM release that has it: the fastest
    backend's microseconds at each of :data:`TOKENS` (:data:`DISTRIBUTION` routing; curves
    missing a count are left out)."""
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
                    key = (gpu, dtype, int(r["hidden_size"]), int(r["inter_size"]),
                           int(r["num_experts"]), int(r["topk"]), int(r["moe_tp_size"]),
                           int(r["moe_ep_size"]))
                    us = float(r["latency"]) * 1e3
                    curve = best[key]
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
                 f"{' '.join(map(str, TOKENS))} ({DISTRIBUTION} routing).\n"
                 "# Rewrite: python -m chunktune.sim.cost.moe_table --data DIR\n")
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(["gpu", "version", "dtype", "hidden", "inter", "experts", "topk", "tp", "ep",
                    "us"])
        for key, version, us in rows:
            gpu, dtype, *shape = key
            w.writerow([gpu, version, dtype, *shape, " ".join(f"{u:.1f}" for u in us)])


@lru_cache(maxsize=1)
def _load() -> dict[Key, np.ndarray]:
    curves: dict[Key, np.ndarray] = {}
    with MOE_PATH.open() as fh:
        for r in csv.DictReader(line for line in fh if not line.startswith("#")):
            key = (r["gpu"], r["dtype"], int(r["hidden"]), int(r["inter"]), int(r["experts"]),
                   int(r["topk"]), int(r["tp"]), int(r["ep"]))
            curves[key] = np.array([float(u) for u in r["us"].split()], dtype=np.float64)
    return curves


def curve(gpu: str, dtype: str, hidden: int, inter: int, experts: int, topk: int, tp: int,
          ep: int) -> np.ndarray | None:
    """The measured microseconds at :data:`TOKENS` of one MoE layer's routed experts
    (``inter``: one expert's full width; ``tp``/``ep``: how the experts are split); None
    where the GPU's table lacks the shape."""
    return _load().get((gpu, dtype, hidden, inter, experts, topk, tp, ep))


def seconds(us: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """A measured curve (:func:`curve`) at ``tokens``: linear in log time over log tokens,
    proportional to tokens past the largest measured count; 0 at 0 tokens."""
    t = np.asarray(tokens, dtype=np.float64)
    grid = np.log(np.array(TOKENS, dtype=np.float64))
    logt = np.log(np.maximum(t, 1.0))
    out = np.exp(np.interp(logt, grid, np.log(us))) * 1e-6
    top = float(TOKENS[-1])
    out = np.where(t > top, us[-1] * 1e-6 * t / top, out)
    res: np.ndarray = np.where(t > 0, out, 0.0)
    return res


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
