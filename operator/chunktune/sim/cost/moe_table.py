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
count as the fastest; block FP8 is also kept as Triton's ``fused_moe`` alone
(``fp8_block_triton``), which vLLM runs on the B200 when FlashInfer and DeepGEMM are turned
off. A kernel timed on other shapes than the model's (the B200's MXFP8-activation MXFP4 kernel)
is borrowed from the nearest shape (:func:`nearest`;
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
from chunktune.sim.cost.coefficients import group_sources, load_document

DATA = Path(__file__).with_name("data")
MOE_PATH = DATA / "aic_moe_us.csv"
#: The token counts each committed curve keeps.
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)

Key = tuple[str, str, int, int, int, int, int, int]  # gpu, dtype, hidden, inter, E, k, tp, ep


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
