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
count as the fastest; only rows of what vLLM 0.33 runs on the GPU count (:func:`counts`):
bf16 experts on Blackwell only FlashInfer's kernels (the older collectors' Triton curves of the
B200 and RTX PRO 6000 left out), block FP8 on the B200 likewise, Triton's only with the tiles
vLLM runs today (vLLM 0.14's rows, the A100's only ones, only on shapes with a tuned config:
before 0.17 the default tiles were fixed and smaller, :data:`DEFAULT_TILES_SINCE`), INT4 not
the 0.18-0.22 collectors' slow Marlin op (:data:`SLOW_INT4_SOURCE`); block FP8 is also kept as
Triton's ``fused_moe`` alone (``fp8_block_triton``), which vLLM runs on the B200 when
FlashInfer and DeepGEMM are turned off. A kernel timed on other shapes than the model's (the B200's
MXFP8-activation MXFP4 kernel) is borrowed from the nearest shape (:func:`nearest`;
:func:`chunktune.sim.cost.step_time.borrowed_moe_curve`).

Every GPU AIConfigurator timed has its table (H100, H200, B200, L40S, RTX PRO 6000 and A100;
the A100's are vLLM 0.14's only, Triton's ``fused_moe`` under power-law routing). A GPU
without one (B300 and GB200; H100 PCIe; L4 and RTX 4090; A40 and A10G) borrows the table of
the GPU it takes its MoE coefficients from, the nearest measured GPU running the same MoE
kernel (``coefficients.moe_kernel``: FlashInfer on Blackwell, Triton elsewhere), where
holding out the measured GPUs says that beats borrowing the fitted form (``moe_borrowing``
in the coefficients document, :func:`lent`): each curve scaled by the ratio of the fitted
form on the two data sheets (:func:`chunktune.sim.cost.step_time.lent_moe_seconds`), so a
layer bound by its fixed cost keeps the measured time, one bound by streaming the experts'
weights scales by HBM bandwidth and one bound by their FLOPs by the peak.

Committed derivative: ``data/aic_moe_us.csv``, one line per measured curve (``python -m
chunktune.sim.cost.fit.moe_derive --data ../shared/data`` rewrites it).
"""

from __future__ import annotations

import csv
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from chunktune.core.gpus import GPU, resolve_gpu
from chunktune.core.vllm_release import parse_version
from chunktune.sim.cost.coefficients import group_sources, load_document, moe_kernel

DATA = Path(__file__).with_name("data")
MOE_PATH = DATA / "aic_moe_us.csv"
#: The token counts each committed curve keeps.
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)

Key = tuple[str, str, int, int, int, int, int, int]  # gpu, dtype, hidden, inter, E, k, tp, ep


def row_kernel(kernel_source: str) -> str | None:
    """The MoE kernel a row timed, as :func:`chunktune.sim.cost.coefficients.moe_kernel` names
    them, from its ``kernel_source``: ``flashinfer`` (vLLM 0.24's collector timing vLLM's
    own backend selection: FlashInfer's TRT-LLM or CUTLASS kernel), ``triton`` (``triton`` in
    the name, or the older collectors' ``vllm_fused_moe``: Triton's ``fused_moe`` whatever
    vLLM would pick), None where unnamed or another kernel."""
    if "flashinfer" in kernel_source:
        return "flashinfer"
    if kernel_source == "vllm_fused_moe" or "triton" in kernel_source:
        return "triton"
    return None


#: Data-centre Blackwell GPUs (SM100, vLLM's ``is_device_capability_family(100)``), where
#: vLLM runs MoE layers with FlashInfer's TRT-LLM kernels.
SM100_GPUS = frozenset({"b200", "b300", "gb200"})


def runs_kernel(gpu: str, dtype: str, kernel_source: str) -> bool:
    """Whether a row of ``gpu``'s in weight format ``dtype`` timed the kernel vLLM runs there:
    for bf16 experts the one :func:`chunktune.sim.cost.coefficients.moe_kernel` names (vLLM
    0.33 ``fused_moe/oracle/unquantized.py``). On Blackwell vLLM runs FlashInfer's bf16 MoE
    kernels, so the older collectors' Triton ``fused_moe`` rows there (the B200's and RTX PRO
    6000's vLLM 0.19 and 0.22 curves of shapes 0.24's collector did not time) are not what it
    runs: on the shapes both timed, Triton is mostly 1.1-1.7x the TRT-LLM kernel on the B200 and
    0.4-2.5x the CUTLASS kernel on the RTX PRO 6000. Block-FP8 experts on an SM100 GPU likewise
    (vLLM 0.24's collector times FlashInfer TRT-LLM there; the older collectors' Triton rows
    take 1.5-1.6x as long at the median on the shapes both timed): those rows count only for
    ``fp8_block_triton``, the kernel vLLM falls back to with FlashInfer and DeepGEMM turned off.
    Other formats: every row counts (their kernels are named per format,
    ``moe_derive.KERNEL_FORMATS``)."""
    kernel = row_kernel(kernel_source)
    if dtype == "fp8_block":
        return not (gpu in SM100_GPUS and kernel == "triton")
    if dtype != "bf16":
        return True
    return kernel is None or kernel == moe_kernel(resolve_gpu(gpu))


#: The release whose Triton ``fused_moe`` default tiles vLLM still runs: 0.17.0's
#: ``fused_moe.get_default_config`` grows a bf16 layer's tiles with the tokens (BLOCK_SIZE_M 16
#: to 128, N 64 or 128, K 128 or 64, 4 or 8 warps); up to 0.15 it ran 16x32x64 up to as many
#: tokens as experts and 64x64x32 (4 warps) past that. On the H100, whose curves both
#: releases timed, vLLM 0.14's are 1.5-2.5x vLLM 0.24's at 16,384 tokens on shapes without a
#: tuned config (2048x768 E128 at TP 1: 1.84x) and 0.96-1.07x on shapes with one (TP 4: 0.98x).
DEFAULT_TILES_SINCE = (0, 17)
#: Per older release the collector timed, the tuned bf16 Triton configs vLLM shipped
#: (``fused_moe/configs/E=<E>,N=<N>,device_name=<GPU>.json``, no dtype: E the experts on the
#: rank, N one expert's width on it), which that release ran instead of its default tiles, as
#: vLLM 0.33 does (every one of the A100's and L40S's below ships with 0.33 too). From the
#: vllm-0.14.0 wheel (Apache-2.0).
TUNED_TRITON: dict[str, dict[str, frozenset[tuple[int, int]]]] = {"0.14.0": {
    "a100-sxm": frozenset({(1, 1792), (1, 3584), (1, 7168), (1, 14336), (8, 1792), (8, 2048),
                           (8, 3584), (8, 4096), (8, 7168), (16, 1344), (16, 1792), (16, 2688),
                           (16, 3584), (16, 7168), (16, 14336), (64, 640), (64, 1280),
                           (128, 192), (512, 64), (512, 128)}),
    "b200": frozenset({(16, 1024), (32, 1408), (64, 1408), (128, 768), (512, 64), (512, 128),
                       (512, 256), (512, 512)}),
    "h100-sxm": frozenset({(1, 3072), (8, 1792), (8, 2048), (8, 3584), (8, 4096), (8, 7168),
                           (16, 1344), (16, 1792), (16, 2688), (62, 256), (62, 512), (64, 320),
                           (64, 640), (64, 1280), (72, 384), (72, 768), (128, 192),
                           (128, 512), (128, 928), (128, 1856), (256, 512), (512, 128),
                           (512, 256), (512, 512)}),
    "h200": frozenset({(8, 1792), (8, 2048), (8, 3584), (8, 4096), (8, 7168), (8, 14336),
                       (16, 1024), (16, 2048), (64, 320), (64, 640), (64, 1280), (64, 2560),
                       (128, 192), (128, 384), (128, 768), (128, 1024), (512, 64), (512, 128),
                       (512, 256), (512, 512)}),
    "l40s": frozenset({(8, 3584), (128, 928), (128, 1856)}),
}}


def current_tiles(gpu: str, version: str, experts: int, inter: int, tp: int, ep: int) -> bool:
    """Whether a Triton ``fused_moe`` bf16 row of ``gpu`` timed under vLLM ``version`` ran the
    tiles vLLM 0.33 runs: a release with today's default tiles (:data:`DEFAULT_TILES_SINCE`),
    or a shape with a tuned config for the GPU in that release (:data:`TUNED_TRITON`; E the
    ``experts / ep`` on the rank, N the width ``inter / tp``). The A100's only rows are vLLM
    0.14's: those of its shapes without a tuned config ran the old default tiles and are
    not what vLLM runs there now."""
    if parse_version(version, "version")[:2] >= DEFAULT_TILES_SINCE:
        return True
    return (experts // ep, inter // tp) in TUNED_TRITON[version].get(gpu, frozenset())


#: The INT4 (W4A16) rows that do not time Marlin's MoE kernel as vLLM runs it: the 0.18, 0.19
#: and 0.22 collectors' ``vllm_marlin_int4_moe`` op takes 2.2-2.6x as long as vLLM 0.24's
#: collector (``vllm_compressedtensorswna16marlinmoe_marlin_marlinexperts``: vLLM's own
#: ``CompressedTensorsWNA16MarlinMoEMethod``) at the one shape both timed (Kimi-K2's 7168 x
#: 2048, 384 experts, top 8, power-law routing; median over 165-180 token counts and splits on
#: each of the H100, H200, B200, RTX PRO 6000 and L40S, 10th-90th percentile 1.5x-4.1x): on the
#: H100 at 256 tokens, TP 1, they stream the experts at 0.5 TB/s, 0.24's at 2.6. The 0.14
#: collector's ``vllm_marlin_moe`` rows agree with 0.24's there (H100, H200: 0.92-0.94x at the
#: median) and stay. The Kimi-K2.5 INT4 serving runs replay within 3-5% on 0.24's curves.
SLOW_INT4_SOURCE = "vllm_marlin_int4_moe"


def counts(gpu: str, dtype: str, version: str, r: dict[str, str]) -> bool:
    """Whether a raw ``moe_perf`` row ``r`` of ``gpu`` under vLLM ``version`` in weight format
    ``dtype`` times what vLLM 0.33 runs there: the kernel (:func:`runs_kernel`; for INT4
    experts not the op that times Marlin slower than vLLM runs it, :data:`SLOW_INT4_SOURCE`)
    and, for Triton's bf16 kernel, its tiles (:func:`current_tiles`). The committed table
    (``fit.moe_derive.derive``) and the MoE fit (``fit.aic_kernels.read_moe``) read only such
    rows."""
    source = r.get("kernel_source") or ""
    if not runs_kernel(gpu, dtype, source):
        return False
    if dtype == "int4" and source == SLOW_INT4_SOURCE:
        return False
    if dtype != "bf16" or row_kernel(source) != "triton":
        return True
    return current_tiles(gpu, version, int(r["num_experts"]), int(r["inter_size"]),
                         int(r["moe_tp_size"]), int(r["moe_ep_size"]))


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


def curves(gpu: str, dtype: str) -> dict[tuple[int, int, int, int, int, int], np.ndarray]:
    """Every measured curve of ``gpu`` in ``dtype`` (:func:`curve`), by shape and split
    (hidden, width, experts, top-k, TP, EP)."""
    return {(k[2], k[3], k[4], k[5], k[6], k[7]): us for k, us in _load().items()
            if k[0] == gpu and k[1] == dtype}


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


@lru_cache(maxsize=1)
def _gpus() -> frozenset[str]:
    return frozenset(k[0] for k in _load())


def has_table(gpu: str) -> bool:
    """Whether ``gpu`` has measured MoE curves of its own."""
    return gpu in _gpus()


def borrowing() -> dict[str, Any] | None:
    """The fit's decision for borrowing MoE tables (``moe_borrowing`` in the coefficients
    document: held-out errors of the ``table`` and the ``form``, and the one to ``use``)."""
    rule: dict[str, Any] | None = load_document().get("moe_borrowing")
    return rule


def lends_table(decision: dict[str, Any] | None = None) -> bool:
    """Whether a GPU without an MoE table runs its lender's measured curves (scaled) rather
    than the lender's fitted form, where the lender has the shape: the fit chose the table
    (``decision``: ``moe_borrowing``'s form; default the committed one). The engine's rule
    (:func:`lent`) and the one ``kernel_report`` holds each measured GPU out by."""
    rule = borrowing() if decision is None else decision
    return rule is not None and rule["use"] == "table"


def lent(gpu: GPU) -> GPU | None:
    """The measured GPU whose MoE table ``gpu`` borrows: where ``gpu`` has no table of its
    own, the GPU it takes its MoE coefficients from (the nearest in ``coefficients.NEAREST``
    running the same MoE kernel, ``coefficients.KERNEL_MATCHED``) has one, and
    the fit chose the table over the form (:func:`lends_table`); else None. The caller scales
    the curve by the ratio of the fitted form on the two GPUs."""
    if has_table(gpu.name) or not lends_table():
        return None
    src = group_sources(gpu.name).get("moe")
    if src is None or src == gpu.name or not has_table(src):
        return None
    return resolve_gpu(src)


def nearest(gpu: str, dtype: str, hidden: int, inter: int, tp: int, ep: int
            ) -> tuple[tuple[int, int, int, int], np.ndarray] | None:
    """The GPU's measured curve in ``dtype`` at the ``tp``/``ep`` split whose experts are
    nearest in size to ``hidden`` x ``inter`` (in log of hidden x width; then the lower
    hidden size), with its shape (hidden, width, experts, top-k); None where it has none."""
    found = [(k[2:6], us) for k, us in _load().items()
             if k[0] == gpu and k[1] == dtype and k[6] == tp and k[7] == ep]
    if not found:
        return None
    size = np.log(hidden * inter)
    shape, us = min(found, key=lambda f: (abs(np.log(f[0][0] * f[0][1]) - size), f[0]))
    return (shape[0], shape[1], shape[2], shape[3]), us
