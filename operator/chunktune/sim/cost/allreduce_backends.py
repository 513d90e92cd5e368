"""Which all-reduce vLLM runs for a message, and its time priced per backend.

vLLM's ``CudaCommunicator.all_reduce`` (vLLM 0.14-0.24, ``vllm/distributed/device_communicators``;
the releases AIConfigurator's all-reduce tables were timed with) tries, in order: its custom
all-reduce (``CustomAllreduce.should_custom_ar``: NVLink-connected ranks, or two ranks over
PCIe with peer-to-peer access; messages below ``max_size``: 8 MiB, lowered to
``CUSTOM_ALL_REDUCE_MAX_SIZES`` where torch's symmetric memory is on), then torch's symmetric
memory (``SymmMemCommunicator``, on by default: ``VLLM_ALLREDUCE_USE_SYMM_MEM=1``; only on the
compute capabilities of ``SYMM_MEM_ALL_REDUCE_MAX_SIZES`` and where NVSwitch multicast exists,
so never over PCIe; messages up to that size; multimem on ``_WORLD_SIZES_MULTIMEM``, else two
shot), then NCCL. The custom kernel (``csrc/custom_all_reduce.cuh``, ``REDUCE_CASE``) is one
shot at two ranks and on fully connected ranks below 512 KiB (up to 4 ranks) or 256 KiB (up to
8), else two shot.

Each backend moves a known number of bytes over each GPU's link (:func:`backend_bytes`): one
shot reads every peer's whole message (``(n - 1) S``), two shot (custom or symmetric memory) and
NCCL's ring reduce-scatter then gather (``2 (n - 1) / n x S``), multimem has the NVSwitch reduce
(``S``). Its time is ``latency(backend, n) + bytes / (per-direction link x eff(backend))``,
with the latencies and efficiencies fitted per backend on the measured GPUs' tables
(:func:`fit_backends`), so a GPU without a table is priced from the others per backend, not from
one GPU's whole curve. A GPU that borrows another's measured table (the same interconnect: the
B300, SM 10.3, the B200's, SM 10.0) keeps it only where vLLM runs the same backend on both, and
elsewhere runs its own backend as fitted on the lender's table (:func:`borrowed_allreduce_s`).
vLLM 0.32's thresholds for 9.0 / 10.0 / 10.3 are 0.24's; its default FlashInfer all-reduce
(``VLLM_ALLREDUCE_USE_FLASHINFER=1`` from 0.31, tried first) is not modelled: no timing of it.

A backend's latency is the kernel's own part (launch, address arithmetic, spinning on flags),
fitted at Hopper's SM clock and run at the GPU's, plus the link crossings the kernel waits on in
turn (:data:`HOPS`, counted in vLLM's and torch's kernels) at one crossing's latency each
(:func:`hop_latency_s`: NCCL's tuner's figure, and the NVLink generation's difference of NCCL's
smallest all-reduce, which crosses the link once). The same custom one-shot kernel (one
512-thread block below 8 KiB, no per-architecture code path in ``custom_all_reduce.cuh``) takes
6.6-7.4 us on the B200 against 4.3-4.7 on Hopper and 4.9-5.7 on the A100: the B200's crossings
are longer, the A100's SMs slower (1,410 MHz against 1,980). Neither figure is taken from a
GPU's own table, so a GPU without one is priced from data sheets and published latencies.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from chunktune.core.gpus import GPU

MiB = 1024 * 1024
KiB = 1024

CUSTOM_ONE_SHOT = "custom-1shot"
CUSTOM_TWO_SHOT = "custom-2shot"
SYMM_TWO_SHOT = "symm-2shot"
SYMM_MULTIMEM = "symm-multimem"
NCCL = "nccl"
BACKENDS = (CUSTOM_ONE_SHOT, CUSTOM_TWO_SHOT, SYMM_TWO_SHOT, SYMM_MULTIMEM, NCCL)

#: ``CustomAllreduce``'s default ``max_size`` (8192 x 1024 bytes).
CUSTOM_AR_DEFAULT_MAX = 8 * MiB
#: vLLM 0.24 ``all_reduce_utils.CUSTOM_ALL_REDUCE_MAX_SIZES`` (0.14-0.19: the same for 9.0 and
#: 10.0), per compute capability and world size; applied only where symmetric memory is on.
CUSTOM_ALL_REDUCE_MAX_SIZES = {
    "9.0": {2: 64 * MiB, 4: 32 * MiB, 6: MiB // 2, 8: MiB // 4},
    "10.0": {2: 2 * MiB, 4: 2 * MiB, 6: 1 * MiB, 8: 1 * MiB},
    "10.3": {2: 4 * MiB, 4: 4 * MiB, 6: 8 * MiB, 8: 4 * MiB},
}
#: vLLM 0.24 ``all_reduce_utils.SYMM_MEM_ALL_REDUCE_MAX_SIZES``.
SYMM_MEM_ALL_REDUCE_MAX_SIZES = {
    "9.0": {2: 64 * MiB, 4: 32 * MiB, 6: 64 * MiB, 8: 64 * MiB},
    "10.0": {2: 8 * MiB, 4: 32 * MiB, 6: 128 * MiB, 8: 128 * MiB},
    "10.3": {2: 4 * MiB, 4: 32 * MiB, 6: 32 * MiB, 8: 64 * MiB},
}
#: vLLM 0.24 ``SymmMemCommunicator._WORLD_SIZES_MULTIMEM``.
SYMM_MEM_MULTIMEM_WORLD_SIZES = {"9.0": (4, 6, 8), "10.0": (6, 8), "10.3": (6, 8)}
#: ``CustomAllreduce._SUPPORTED_WORLD_SIZES``.
CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8)

#: CUDA compute capability by architecture family (the SXM / datacenter parts), and the cards
#: whose capability differs from their family's (B300: Blackwell Ultra 10.3; RTX PRO 6000:
#: GB202, 12.0; A10G / A40: GA102, 8.6).
_FAMILY_CAPABILITY = {"ampere": "8.0", "ada": "8.9", "hopper": "9.0", "blackwell": "10.0"}
_CAPABILITY = {"b300": "10.3", "rtx-pro-6000": "12.0", "a10g": "8.6", "a40": "8.6"}


#: NCCL's smallest all-reduce per NVLink generation (keyed by the link's data-sheet GB/s, both
#: directions), us: nccl-tests ``all_reduce_perf`` at 8 bytes over 8 GPUs, NCCL 2.27 symmetric
#: memory in CUDA graphs, 8 x B200 about 3.0, 8 x H200 / H800 about 2.3 (NVIDIA/nccl issue
#: 1940, 2025-12). That kernel (``ncclSymkRun_AllReduce_AGxLL_R``, src/device/symmetric/
#: all_reduce.cuh) stores its pack to every peer with the low-latency protocol's flags and
#: polls its own slots: one link crossing, so the generations' difference is one crossing's
#: (:func:`hop_latency_s`). No published figure for NVLink 3 (A100): it counts as Hopper's.
NVLINK_SMALL_MESSAGE_LATENCY_US = {900.0: 2.3, 1800.0: 3.0}
#: The generation the other figures are relative to (NVLink 4, Hopper).
REFERENCE_LINK_GB_S = 900.0
#: One link crossing's latency, us, as NCCL's tuner takes it for its low-latency protocol
#: (NCCL ``src/graph/tuning.cc``, ``hwLatencies``, LL: NVLink 0.6, PCIe 1.0; one figure for
#: every generation, NVLink 4's by :data:`NVLINK_SMALL_MESSAGE_LATENCY_US`).
HOP_LATENCY_US = {"nvlink": 0.6, "pcie": 1.0}
#: Link crossings each backend waits on one after the other. vLLM's custom kernels
#: (``csrc/custom_all_reduce.cuh``, 0.14-0.33): one shot = the start barrier (a flag stored to
#: every peer, then awaited: 1), every peer's data loaded (a round trip: 2), the end barrier
#: (1); two shot = start barrier, the reduce-scatter's loads, a barrier, the all-gather's loads
#: from the peers' buffers (1 + 2 + 1 + 2). torch's symmetric-memory kernels
#: (``CUDASymmetricMemoryOps.cu``: ``two_shot_all_reduce_kernel``, ``multimem_all_reduce_kernel``):
#: barrier, the peers' data loaded or ``multimem.ld_reduce`` (2), the sum stored to the peers or
#: ``multimem.st`` (1), the release barrier (1). NCCL's fitted latency is its MiB messages'
#: (vLLM runs it on no smaller one on NVLink), not counted in crossings.
HOPS = {CUSTOM_ONE_SHOT: 4, CUSTOM_TWO_SHOT: 6, SYMM_TWO_SHOT: 5, SYMM_MULTIMEM: 5, NCCL: 0}
#: The SM clock, MHz, the kernels' own part of a latency is fitted at (Hopper's boost clock).
REFERENCE_CLOCK_MHZ = 1980.0


def hop_latency_s(gpu: GPU) -> float:
    """Seconds one link crossing of an all-reduce takes on ``gpu``: NCCL's tuner's figure for
    its link (:data:`HOP_LATENCY_US`), on NVLink plus the generation's difference of NCCL's
    smallest all-reduce from Hopper's (:data:`NVLINK_SMALL_MESSAGE_LATENCY_US`: 0.7 us on
    NVLink 5)."""
    if not gpu.nvlink:
        return HOP_LATENCY_US["pcie"] * 1e-6
    ref = NVLINK_SMALL_MESSAGE_LATENCY_US[REFERENCE_LINK_GB_S]
    own = NVLINK_SMALL_MESSAGE_LATENCY_US.get(gpu.link_gb_s, ref)
    return (HOP_LATENCY_US["nvlink"] + own - ref) * 1e-6


def kernel_scale(gpu: GPU, backend: str) -> float:
    """The factor the fitted kernel's own part of ``backend``'s latency takes on ``gpu``:
    Hopper's SM clock over the GPU's (:data:`REFERENCE_CLOCK_MHZ`; 1 where the catalog has no
    clock); 1 for NCCL, whose fitted latency is of MiB messages."""
    if backend == NCCL or gpu.boost_mhz <= 0:
        return 1.0
    return REFERENCE_CLOCK_MHZ / gpu.boost_mhz


def crossings_s(gpu: GPU, backend: str) -> float:
    """Seconds ``backend`` waits on link crossings on ``gpu`` (:data:`HOPS` x
    :func:`hop_latency_s`)."""
    return HOPS[backend] * hop_latency_s(gpu)


def compute_capability(gpu: GPU) -> str:
    """The GPU's CUDA compute capability as vLLM writes it (``"9.0"``)."""
    return _CAPABILITY.get(gpu.name, _FAMILY_CAPABILITY.get(gpu.family, "8.0"))


def vllm_allreduce_backend(gpu: GPU, n: int, nbytes: float, p2p: bool = True) -> str:
    """The backend vLLM runs for an all-reduce of ``nbytes`` per rank over ``n`` ranks of
    ``gpu`` (one of ``BACKENDS``). NVLink GPUs are taken as fully connected (one NVSwitch
    board, multicast available); PCIe GPUs run the custom kernel only at two ranks with
    peer-to-peer access (``p2p``), NCCL otherwise."""
    cap = compute_capability(gpu)
    if not gpu.nvlink:
        return CUSTOM_ONE_SHOT if n == 2 and p2p and nbytes < CUSTOM_AR_DEFAULT_MAX else NCCL
    symm = n in SYMM_MEM_ALL_REDUCE_MAX_SIZES.get(cap, {})
    ca_max = CUSTOM_AR_DEFAULT_MAX
    if symm and cap in CUSTOM_ALL_REDUCE_MAX_SIZES:
        ca_max = min(CUSTOM_ALL_REDUCE_MAX_SIZES[cap][n], ca_max)
    if n in CUSTOM_AR_WORLD_SIZES and nbytes < ca_max:
        one = n == 2 or (n <= 4 and nbytes < 512 * KiB) or (n <= 8 and nbytes < 256 * KiB)
        return CUSTOM_ONE_SHOT if one else CUSTOM_TWO_SHOT
    if symm and nbytes <= SYMM_MEM_ALL_REDUCE_MAX_SIZES[cap][n]:
        return SYMM_MULTIMEM if n in SYMM_MEM_MULTIMEM_WORLD_SIZES[cap] else SYMM_TWO_SHOT
    return NCCL


def backend_bytes(backend: str, n: int, nbytes: float) -> float:
    """Bytes each GPU moves in one direction over its link for ``backend`` (a sum of ``n``
    messages of ``nbytes``)."""
    if backend == CUSTOM_ONE_SHOT:
        return (n - 1) * nbytes
    if backend == SYMM_MULTIMEM:
        return float(nbytes)
    return 2.0 * (n - 1) / n * nbytes


def link_bytes_s(gpu: GPU) -> float:
    """Per-direction bytes/s of the GPU's link (half the data sheet's bidirectional figure)."""
    return gpu.link_gb_s * 1e9 / 2


@dataclass(frozen=True)
class BackendCoefficients:
    """Per backend: the kernel's own part of its latency (seconds at
    :data:`REFERENCE_CLOCK_MHZ`; the link crossings are priced apart, :func:`crossings_s`) per
    world size measured, and the fraction of the per-direction link bandwidth reached."""

    latency_s: dict[tuple[str, int], float]
    link_eff: dict[str, float]

    def latency(self, backend: str, n: int) -> float | None:
        """The backend's latency at ``n`` ranks, else at the nearest world size fitted."""
        ns = [m for b, m in self.latency_s if b == backend]
        if not ns:
            return None
        return self.latency_s[(backend, min(ns, key=lambda m: (abs(m - n), m)))]


@dataclass(frozen=True)
class Timing:
    """One measured all-reduce: ``nbytes`` per rank over ``ranks`` ranks of ``gpu``."""

    gpu: GPU
    ranks: int
    nbytes: int
    seconds: float


#: Gauss-Newton steps of :func:`fit_backends` in log time after its linear start.
GAUSS_NEWTON_STEPS = 20


def fit_backends(points: Iterable[Timing]) -> BackendCoefficients:
    """The kernel's own latency per (backend, ranks) and efficiency per backend, least squares
    in log time over ``points`` (each backend alone; each point's own latency taken at its
    GPU's :func:`kernel_scale`, its link crossings, :func:`crossings_s`, known): the model is
    linear in the latencies and in 1 / eff: a least-squares start in relative error, then
    Gauss-Newton steps in log time; eff at most 1)."""
    groups: dict[str, list[Timing]] = {}
    for p in points:
        groups.setdefault(vllm_allreduce_backend(p.gpu, p.ranks, p.nbytes), []).append(p)
    lat: dict[tuple[str, int], float] = {}
    eff: dict[str, float] = {}
    for b, pts in groups.items():
        ns = sorted({p.ranks for p in pts})
        a = np.zeros((len(pts), len(ns) + 1))
        t = np.array([p.seconds for p in pts])
        hops = np.array([crossings_s(p.gpu, b) for p in pts])
        for i, p in enumerate(pts):
            a[i, ns.index(p.ranks)] = kernel_scale(p.gpu, b)
            a[i, -1] = backend_bytes(b, p.ranks, p.nbytes) / link_bytes_s(p.gpu)
        x = _at_most_the_link(_nonneg_lstsq(a / t[:, None], 1.0 - hops / t))
        for _ in range(GAUSS_NEWTON_STEPS):
            pred = np.maximum(a @ x + hops, 1e-12)
            step, *_ = np.linalg.lstsq(a / pred[:, None], -np.log(pred / t), rcond=None)
            x = _at_most_the_link(np.maximum(x + step, 0.0))
        for j, n in enumerate(ns):
            lat[(b, n)] = float(x[j])
        eff[b] = 1.0 / float(x[-1]) if x[-1] > 0 else 1.0
    return BackendCoefficients(lat, eff)


def _at_most_the_link(x: np.ndarray) -> np.ndarray:
    """``x`` with its last coefficient (1 / eff) at least 1: no backend moves its bytes faster
    than the link's data-sheet bandwidth (a backend measured only where its latency dominates,
    the B200's two shot, leaves eff otherwise unbounded)."""
    x[-1] = max(float(x[-1]), 1.0)
    return x


def _nonneg_lstsq(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient kept at zero or above (refit without the ones a
    plain solve makes negative)."""
    free = np.ones(a.shape[1], dtype=bool)
    x = np.zeros(a.shape[1])
    while free.any():
        sol, *_ = np.linalg.lstsq(a[:, free], y, rcond=None)
        if (sol >= 0).all():
            x[free] = sol
            break
        idx = np.flatnonzero(free)
        free[idx[sol < 0]] = False
    return x


def priced_s(backend: str, n: int, nbytes: float, gpu: GPU, coef: BackendCoefficients
             ) -> float | None:
    """Seconds of ``backend``'s all-reduce of ``nbytes`` over ``n`` ranks of ``gpu`` under
    ``coef``: the kernel's own latency at the GPU's clock, its link crossings, its bytes over
    the link; None where ``coef`` did not fit the backend."""
    lat = coef.latency(backend, n)
    if lat is None or backend not in coef.link_eff:
        return None
    return (lat * kernel_scale(gpu, backend) + crossings_s(gpu, backend)
            + backend_bytes(backend, n, nbytes) / (link_bytes_s(gpu) * coef.link_eff[backend]))


def backend_allreduce_s(nbytes: Sequence[float] | np.ndarray, n: int, gpu: GPU,
                        coef: BackendCoefficients) -> np.ndarray | None:
    """Seconds of vLLM's all-reduce of each of ``nbytes`` over ``n`` ranks of ``gpu``, each
    priced by the backend vLLM runs for it (:func:`vllm_allreduce_backend`) under ``coef``
    (:func:`priced_s`); None where a backend it runs was not fitted."""
    out = np.empty(len(nbytes))
    for i, s in enumerate(nbytes):
        t = priced_s(vllm_allreduce_backend(gpu, n, float(s)), n, float(s), gpu, coef)
        if t is None:
            return None
        out[i] = t
    return out


def borrowed_allreduce_s(table_s: np.ndarray, nbytes: Sequence[float] | np.ndarray, n: int,
                         gpu: GPU, lender: GPU, lender_coef: BackendCoefficients,
                         coef: BackendCoefficients) -> np.ndarray:
    """Seconds of vLLM's all-reduce of each of ``nbytes`` over ``n`` ranks of ``gpu``, which
    borrows the measured table of ``lender`` (the same interconnect; ``table_s``: that table's
    times at ``nbytes``): the lender's time where vLLM runs the same backend on both (its
    thresholds are per compute capability), else the backend ``gpu`` runs priced as on the
    lender (``lender_coef``: fitted on the lender's table alone; ``coef``: on every measured
    GPU, for a backend the lender never ran) over ``gpu``'s own link and clock."""
    out = np.array(table_s, dtype=np.float64)
    for i, s in enumerate(nbytes):
        b = vllm_allreduce_backend(gpu, n, float(s))
        if b == vllm_allreduce_backend(lender, n, float(s)):
            continue
        for c in (lender_coef, coef):
            t = priced_s(b, n, float(s), gpu, c)
            if t is not None:
                out[i] = t
                break
    return out
