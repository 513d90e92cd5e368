"""GEMM times interpolated in a GPU's measured table (AIConfigurator's vLLM linear layers).

Where a GPU's measured grid covers a shape, the step-time model interpolates it rather than
fitting a form to it: on the RTX PRO 6000, whose GEMMs two independent sources timed, the
interpolated table predicts LLMServingSim's per-operator times at 3.6-5.1% (median by token
band) where the fitted roofline gives 5.7-8.7% (``docs/simulator.md``). Each curve over ``m``
is first made non-decreasing (:func:`chunktune.sim.cost.aic_data.envelope`). Interpolation is
linear in log time over log ``m`` between the grid's powers of two (proportional to ``m``
beyond the last measured one) and bilinear over log ``n`` and log ``k`` between the measured
widths. Shapes outside the grid's ``n`` or ``k`` range are the fitted form's
(:func:`chunktune.sim.cost.step_time.linear_op_times`).

A GPU without a grid of its own that borrows its GEMMs from a measured GPU of the same
architecture (``coefficients.NEAREST``: the H100 PCIe from the H100 SXM, the B300 and GB200
from the B200) can borrow that GPU's measured table, scaled by the ratio of the two data
sheets under the fitted form, instead of the fitted form alone (:func:`lent`). Which of the two
it uses is decided per family and architecture by the fit (``kernel_fit``: leave-one-GPU-out
over the measured pairs of the same architecture, all such pairs where an architecture has
none; ``gemm_borrowing`` in the coefficients document).

The grid's benchmark repeats one GEMM, so a weight that fits the GPU's L2 stays there between
its calls; in a served engine each layer's weights stream from HBM. The engine therefore never
runs a GEMM faster than its weights stream from HBM at the rate this GPU's own grids reach
where the weights cannot stay in L2 (:func:`hbm_stream_fraction`, committed by the fit as
``gemm_hbm_stream``; a GPU borrowing a neighbour's grid uses the lender's fraction on its own
data sheet): on the L40S and RTX PRO 6000 (GDDR) one-token GEMMs of weights inside the L2
read them at up to 2.9x and 1.9x the data sheet's bandwidth, where their weights of several
times the L2 reach 87% and 96% of it; on the HBM GPUs no weight inside the L2 is read faster
than the large weights stream (A100 87%, H100 93%, H200 90%, B200 89%), so the floor binds
only between, or beyond, their measured points.

NVFP4 grids are kept per kernel, because the kernel vLLM runs for a ModelOpt NVFP4 linear
layer changed between releases (:func:`nvfp4_kernel`): the engine reads the grid of the kernel
its release runs (``--vllm-version``; the current release where none is named).
"""

from __future__ import annotations

from collections import defaultdict
from functools import lru_cache
from typing import Any

import numpy as np

from chunktune.core.gpus import GPU, resolve_gpu
from chunktune.core.models import DTYPE_BYTES
from chunktune.core.vllm_release import CURRENT, Version, parse_version
from chunktune.sim.cost import aic_data
from chunktune.sim.cost.allreduce_backends import compute_capability
from chunktune.sim.cost.coefficients import NEAREST, group_sources, load_document

#: Bytes per weight of each grid dtype (NVFP4: 4-bit values and an FP8 scale per 16).
WEIGHT_BYTES = {"bf16": 2.0, "fp8": 1.0, "nvfp4": DTYPE_BYTES["nvfp4"]}
#: A grid shape streams its weights from HBM on every call when they are at least this many
#: times the GPU's L2 (an LRU cache keeps nothing of a stream twice its size) ...
STREAM_L2_MULTIPLE = 2.0
#: ... and it is bound by reading them at up to this many rows.
STREAM_MAX_M = 16

#: The NVFP4 (W4A4) linear kernels vLLM runs on FP4 tensor cores by default: FlashInfer's
#: CUTLASS GEMM (``FlashInferCutlassNvFp4LinearKernel``; before 0.22 the ``flashinfer-cutlass``
#: backend of ``ModelOptNvFp4LinearMethod`` / ``select_nvfp4_linear_backend``) and its CuTe DSL
#: GEMM (``FlashInferCuteDslNvFp4LinearKernel``, SM 10.x only).
NVFP4_CUTLASS = "flashinfer-cutlass"
NVFP4_CUTEDSL = "flashinfer-cutedsl"
#: AIConfigurator's ``kernel_source`` values that name one of them (``vllm_default``: the
#: release's default, :func:`nvfp4_kernel`).
NVFP4_KERNEL_SOURCES = {"FlashInferCutlassNvFp4LinearKernel": NVFP4_CUTLASS,
                        "FlashInferCuteDslNvFp4LinearKernel": NVFP4_CUTEDSL}
#: vLLM 0.24.0 puts ``FlashInferCuteDslNvFp4LinearKernel`` first in ``_POSSIBLE_NVFP4_KERNELS``
#: (``kernels/linear/__init__.py``; 0.22 and 0.23 list FlashInfer CUTLASS first).
NVFP4_CUTEDSL_SINCE: Version = (0, 24, 0)


def nvfp4_kernel(gpu: GPU, version: Version | None) -> str:
    """The NVFP4 linear kernel vLLM ``version`` (None: :data:`CURRENT`) runs by default on
    ``gpu`` (one with FP4 tensor cores): from 0.24 the first of ``_POSSIBLE_NVFP4_KERNELS``
    that supports the GPU, FlashInfer's CuTe DSL GEMM on compute capability 10.x (its
    ``is_supported``: ``is_device_capability_family(100)``), else FlashInfer CUTLASS (0.24-0.34
    list it second; on SM 12.0 it is the first supported). Before 0.24 FlashInfer CUTLASS
    everywhere: 0.10.2 ``ModelOptNvFp4LinearMethod`` (``flashinfer-cutlass`` where FlashInfer
    is installed, as in vLLM's images, unless ``VLLM_USE_TRTLLM_FP4_GEMM``), 0.15.1 the same
    unless ``VLLM_NVFP4_GEMM_BACKEND``, 0.17 and 0.19 ``select_nvfp4_linear_backend``
    (``FLASHINFER_CUTLASS`` on SM >= 10.0), 0.22 and 0.23 ``_POSSIBLE_NVFP4_KERNELS``. The
    environment variables and ``--linear-backend`` that ask for another kernel are not read
    here (no grid times the others)."""
    v = version or CURRENT
    if compute_capability(gpu).startswith("10.") and v >= NVFP4_CUTEDSL_SINCE:
        return NVFP4_CUTEDSL
    return NVFP4_CUTLASS


def row_nvfp4_kernel(gpu: GPU, version: str, kernel_source: str) -> str | None:
    """The NVFP4 kernel an AIConfigurator ``gemm_perf`` row of vLLM ``version`` on ``gpu``
    timed: the one its ``kernel_source`` names, or for ``vllm_default`` (its collector builds
    vLLM's own compressed-tensors W4A4 layer and lets the release choose) the release's
    default (:func:`nvfp4_kernel`); None for a kernel vLLM does not run by default."""
    if kernel_source == "vllm_default":
        return nvfp4_kernel(gpu, parse_version(version, "version"))
    return NVFP4_KERNEL_SOURCES.get(kernel_source)


class GemmTable:
    """One GPU's measured GEMM grid for one dtype: microseconds at (``m``, ``n``, ``k``)."""

    def __init__(self, points: list[aic_data.GemmPoint]) -> None:
        by_nk: dict[tuple[int, int], dict[int, float]] = defaultdict(dict)
        for p in points:
            by_nk[(p.n, p.k)][p.m] = p.us
        self.ns = np.array(sorted({n for n, _ in by_nk}), dtype=np.float64)
        self.ks = np.array(sorted({k for _, k in by_nk}), dtype=np.float64)
        self._curves: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {
            nk: (np.log(np.array(sorted(v), dtype=np.float64)),
                 aic_data.envelope(np.log(np.array([v[m] for m in sorted(v)], dtype=np.float64))))
            for nk, v in by_nk.items()}

    def covers(self, n: float, k: float) -> bool:
        """Whether (``n``, ``k``) lies inside the grid and a measured corner surrounds it."""
        if not (self.ns[0] <= n <= self.ns[-1] and self.ks[0] <= k <= self.ks[-1]):
            return False
        i = int(np.clip(np.searchsorted(self.ns, n) - 1, 0, len(self.ns) - 2))
        j = int(np.clip(np.searchsorted(self.ks, k) - 1, 0, len(self.ks) - 2))
        return any((int(self.ns[i + di]), int(self.ks[j + dj])) in self._curves
                   for di in (0, 1) for dj in (0, 1))

    def _log_us(self, n: int, k: int, log_m: np.ndarray) -> np.ndarray:
        lm, lt = self._curves[(n, k)]
        out: np.ndarray = np.interp(log_m, lm, lt)
        # beyond the largest measured m: proportional to m (compute-bound)
        return np.where(log_m > lm[-1], lt[-1] + (log_m - lm[-1]), out)

    def seconds(self, m: np.ndarray, n: float, k: float) -> np.ndarray:
        """Seconds for ``m`` tokens (an array, each >= 1) through a ``k x n`` weight;
        :meth:`covers` must hold."""
        log_m = np.log(np.maximum(np.asarray(m, dtype=np.float64), 1.0))
        total = np.zeros_like(log_m)
        i = int(np.clip(np.searchsorted(self.ns, n) - 1, 0, len(self.ns) - 2))
        j = int(np.clip(np.searchsorted(self.ks, k) - 1, 0, len(self.ks) - 2))
        a = float(np.log(n / self.ns[i]) / np.log(self.ns[i + 1] / self.ns[i]))
        b = float(np.log(k / self.ks[j]) / np.log(self.ks[j + 1] / self.ks[j]))
        weight = 0.0
        for di, wa in ((0, 1.0 - a), (1, a)):
            for dj, wb in ((0, 1.0 - b), (1, b)):
                nk = (int(self.ns[i + di]), int(self.ks[j + dj]))
                if wa * wb > 0 and nk in self._curves:  # a corner not measured: the others
                    total += wa * wb * self._log_us(*nk, log_m)
                    weight += wa * wb
        total /= weight
        out: np.ndarray = np.exp(total) * 1e-6
        return out


@lru_cache(maxsize=1)
def _tables() -> dict[tuple[str, str, str], GemmTable]:
    by: dict[tuple[str, str, str], list[aic_data.GemmPoint]] = defaultdict(list)
    for p in aic_data.read_committed_gemm():
        by[(p.gpu, p.dtype, p.kernel)].append(p)
    return {key: GemmTable(pts) for key, pts in by.items()}


def table(gpu: str, dtype: str, kernel: str = "") -> GemmTable | None:
    """The committed table of ``gpu``'s own measured GEMMs in ``dtype`` (``bf16``, ``fp8``;
    ``nvfp4`` with its ``kernel``, :func:`nvfp4_table`), or None where it was not measured."""
    return _tables().get((gpu, dtype, kernel))


def nvfp4_table(gpu: GPU, version: Version | None) -> GemmTable | None:
    """``gpu``'s measured grid of the NVFP4 kernel vLLM ``version`` runs there
    (:func:`nvfp4_kernel`), or None where no grid times it."""
    return table(gpu.name, "nvfp4", nvfp4_kernel(gpu, version))


def has_nvfp4(gpu: str) -> bool:
    """Whether ``gpu`` has a measured NVFP4 grid of any kernel."""
    return any(g == gpu and d == "nvfp4" for g, d, _ in _tables())


def nvfp4_lender(gpu: GPU) -> GPU | None:
    """The GPU whose NVFP4 grids ``gpu`` borrows where it has none of its own: the nearest
    (``coefficients.NEAREST``) of its compute capability family with one, where both state
    their FP4 peak (:attr:`GPU.fp4_tflops`: vLLM's W4A4 kernels are built per family, the
    B300 and GB200 run the B200's); None where it has its own or no such neighbour."""
    if has_nvfp4(gpu.name) or gpu.fp4_tflops <= 0:
        return None
    cap = compute_capability(gpu).split(".")[0]
    for name in NEAREST.get(gpu.name, ()):
        other = resolve_gpu(name)
        if (has_nvfp4(name) and other.fp4_tflops > 0
                and compute_capability(other).split(".")[0] == cap):
            return other
    return None


def table_gpus() -> list[tuple[str, str]]:
    return sorted({(g, d) for g, d, _ in _tables()})


def hbm_stream_fraction(points: list[aic_data.GemmPoint], gpu: GPU) -> dict[str, float] | None:
    """The fraction of ``gpu``'s data-sheet HBM bandwidth its measured GEMMs (``points``: its
    grids, every dtype) reach reading weights that cannot stay in its L2 (at least
    :data:`STREAM_L2_MULTIPLE` times it) at :data:`STREAM_MAX_M` rows or fewer: per shape the
    weight bytes over its fastest such call; ``fraction`` the highest over the shapes (what
    the GPU reaches from HBM: a floor below it would slow measured calls), ``median`` and
    ``shapes`` beside it. None where no shape qualifies."""
    best: dict[tuple[str, int, int], float] = {}
    for p in points:
        w = p.n * p.k * WEIGHT_BYTES[p.dtype]
        beyond_l2 = w >= STREAM_L2_MULTIPLE * gpu.l2_mib * 2**20
        if p.gpu == gpu.name and p.m <= STREAM_MAX_M and beyond_l2:
            best[(p.dtype, p.n, p.k)] = max(best.get((p.dtype, p.n, p.k), 0.0),
                                            w / (p.us * 1e-6) / (gpu.hbm_tb_s * 1e12))
    if not best:
        return None
    v = np.array(list(best.values()))
    return {"fraction": float(f"{v.max():.4g}"), "median": float(f"{np.median(v):.4g}"),
            "shapes": len(v)}


def hbm_stream_document(points: list[aic_data.GemmPoint]) -> dict[str, dict[str, float]]:
    """The committed ``gemm_hbm_stream``: :func:`hbm_stream_fraction` of each GPU with a
    grid."""
    out = {}
    for name in sorted({p.gpu for p in points}):
        f = hbm_stream_fraction(points, resolve_gpu(name))
        if f is not None:
            out[name] = f
    return out


def weight_stream_s(k: float, n: float, weight_dtype: str, gpu: GPU, grid_gpu: str) -> float:
    """Seconds ``gpu`` takes to stream a ``k x n`` weight in ``weight_dtype`` from HBM at the
    fraction of its data sheet that ``grid_gpu`` (the GPU whose grid is interpolated: ``gpu``
    itself, or the neighbour it borrows from) reaches (``gemm_hbm_stream`` in the coefficients
    document; the whole data sheet where that has none): the least a GEMM interpolated in a
    grid takes in an engine."""
    doc = load_document().get("gemm_hbm_stream", {}).get(grid_gpu)
    eff = 1.0 if doc is None else float(doc["fraction"])
    return k * n * WEIGHT_BYTES[weight_dtype] / (gpu.hbm_tb_s * 1e12 * eff)


#: The operator family of a GEMM table's dtype, and the reverse.
FAMILY = {"bf16": "gemm", "fp8": "gemm-fp8"}
DTYPE = {f: d for d, f in FAMILY.items()}


def borrowing(gpu: GPU, family: str, decisions: dict[str, Any] | None = None
              ) -> dict[str, Any] | None:
    """The fit's decision for borrowing ``family`` on ``gpu``'s architecture
    (``gemm_borrowing`` in the coefficients document, or ``decisions`` in its form: that
    architecture's measured pairs, or all pairs where it has none): ``table``, ``form``
    (held-out errors) and ``use``."""
    if decisions is None:
        decisions = load_document().get("gemm_borrowing", {})
    doc = decisions.get(family)
    if doc is None:
        return None
    rule: dict[str, Any] = doc.get("by_family", {}).get(gpu.family, doc)
    return rule


def lends_table(gpu: GPU, src: GPU, family: str, decisions: dict[str, Any] | None = None
                ) -> bool:
    """Whether ``gpu``, without a table of its own, runs ``src``'s measured ``family`` table
    (scaled) rather than ``src``'s fitted form: ``src`` is of its architecture and the fit chose
    the table there (:func:`borrowing`). The engine's rule (:func:`lent`) and the one
    ``kernel_report`` holds each measured GPU out by."""
    rule = borrowing(gpu, family, decisions)
    return rule is not None and rule["use"] == "table" and src.family == gpu.family


def lent(gpu: GPU, dtype: str) -> tuple[GPU, GemmTable] | None:
    """The measured GPU and its ``dtype`` table that ``gpu`` (without a table of its own)
    borrows, where the GPU it borrows from is of its own architecture and the fit chose the
    neighbour's table over the fitted form for that family there (:func:`lends_table`); else
    None. The caller scales the table by the ratio of the two GPUs' fitted forms."""
    if table(gpu.name, dtype) is not None:
        return None
    fam = FAMILY[dtype]
    src = group_sources(gpu.name).get(fam)
    if src is None or src == gpu.name:
        return None
    other = resolve_gpu(src)
    t = table(src, dtype)
    if t is None or not lends_table(gpu, other, fam):
        return None
    return other, t
