"""Tensor-parallel all-reduce time: vLLM's own, measured, and NCCL's curve fitted on Vidur's.

vLLM's all-reduce as it runs it (custom all-reduce inside CUDA graphs for small messages, NCCL
above): AIConfigurator's ``custom_allreduce_perf`` (Apache-2.0, NVIDIA), timed on A100, H100,
B200, L40S and RTX PRO 6000 nodes over 2, 4 and 8 GPUs (``data/aic_allreduce_us.csv``). On NVLink
:func:`tp_allreduce_s` interpolates the table of the GPU or of one on the same interconnect, and
else prices each message by the backend vLLM runs for it (custom all-reduce one or two shot,
torch symmetric memory, NCCL: :mod:`chunktune.sim.cost.allreduce_backends`) with latencies and
efficiencies fitted per backend on every measured NVLink GPU (:func:`backend_coefficients`).

NCCL's curve: microsoft/vidur ``data/profiling/network/<topology>/all_reduce.csv`` (MIT licence,
Copyright (c) Microsoft Corporation): NCCL all-reduce kernel times (``torch.distributed``, eager,
the median of 11 back-to-back calls) for messages of 2 KB to 64 MB (512 MB on one machine) over
2, 4 and 8 GPUs of one node. Vidur's profiler records ``size`` in **bytes** (its
``collectives_wrapper.py``: ``"size": self._size * 2  # bytes`` for fp16 elements). Four
machines: DGX A100 and DGX H100 (every GPU on NVSwitches), and 4-GPU boxes of PCIe A100s and
H100s joined in pairs by NVLink bridges, where a 4-GPU ring crosses PCIe. The model, per GPU,
for ``S`` bytes over ``n`` ranks:

    ring(n) = 2 (n - 1) / n                        bytes each GPU sends (and receives) per byte
    device  = latency + 2 (n - 1) x chunk / (eff x B) + ring(n) x S / (eff x B)

``B`` is the per-direction bandwidth of the slowest link the ring crosses (data sheet: half of
the bidirectional NVLink or PCIe figure), ``eff`` the fraction of it a ring reaches (fitted per
kind of link, :mod:`chunktune.sim.cost.fit.nccl_fit`), ``chunk`` the bytes that must cross each of
the ring's ``2 (n - 1)`` steps before it streams. What Vidur's eager loop records is a soft
maximum of that device time and a host floor (the rate at which ``torch.distributed`` issues
calls and the ranks' skew, 20-60 us on these machines), which is fitted but not simulated. The
engine runs it over PCIe at TP 2 and on nodes whose links are given (``interconnect``), with
vLLM's custom all-reduce up to ``CUSTOM_AR_MAX_BYTES`` on a given NVLink. Over PCIe above TP 2
vLLM runs NCCL in CUDA graphs: :func:`pcie_allreduce_s` prices it at the graphed latency the
measured PCIe tables give and the ring's bytes at the PCIe efficiency fitted here.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from chunktune.core.gpus import GPU, resolve_gpu
from chunktune.sim.cost import aic_data
from chunktune.sim.cost import allreduce_backends as ab
from chunktune.sim.cost.coefficients import NEAREST

COLLECTIVE_COEFFICIENTS_PATH = Path(__file__).with_name("data") / "allreduce_coefficients.json"

#: Kinds of link a ring's slowest hop can be, each with its own fitted efficiency.
LINK_KINDS = ("nvswitch-nvlink3", "nvswitch-nvlink4", "nvlink-bridge", "pcie")
#: vLLM's custom all-reduce handles messages up to this size (``CustomAllreduce.max_size``,
#: 8 MiB); larger ones go to NCCL.
CUSTOM_AR_MAX_BYTES = 8 * 1024 * 1024
#: Its latency where nothing measured says otherwise (a GPU priced on Vidur's NCCL curve).
CUSTOM_AR_LATENCY_S = 1e-5
#: NVSwitch generation by GPU family (A100 SXM: NVLink 3, H100/H200 SXM: NVLink 4).
NVSWITCH_KIND = {"ampere": "nvswitch-nvlink3", "hopper": "nvswitch-nvlink4"}


@dataclass(frozen=True)
class Interconnect:
    """How the GPUs of one node are linked (data-sheet figures, both directions, GB/s)."""

    #: NVLink bandwidth per GPU (0: none)
    nvlink_gb_s: float
    #: GPUs one NVLink domain joins: 8 on an NVSwitch board, 2 with NVLink bridges
    nvlink_gpus: int
    #: kind of the NVLink domain: one of ``LINK_KINDS`` except ``pcie``
    nvlink_kind: str
    #: PCIe bandwidth per GPU (x16)
    pcie_gb_s: float

    def bottleneck(self, n: int) -> tuple[float, str]:
        """(per-direction bytes/s, link kind) of the slowest hop of an ``n``-rank ring."""
        if self.nvlink_gb_s > 0 and n <= self.nvlink_gpus:
            return self.nvlink_gb_s * 1e9 / 2, self.nvlink_kind
        return self.pcie_gb_s * 1e9 / 2, "pcie"


#: The machines of Vidur's collectives (data sheets): DGX A100 (12 NVLink 3 links of 50 GB/s
#: per GPU through six NVSwitches: 600 GB/s; PCIe Gen4 x16: 64 GB/s), DGX H100 (18 NVLink 4
#: links: 900 GB/s; PCIe Gen5: 128 GB/s), and A100 80GB PCIe / H100 PCIe cards joined in pairs by
#: NVLink bridges (600 GB/s between the two; PCIe Gen4 / Gen5 beyond).
VIDUR_TOPOLOGIES = {
    "a100_dgx": Interconnect(600.0, 8, "nvswitch-nvlink3", 64.0),
    "h100_dgx": Interconnect(900.0, 8, "nvswitch-nvlink4", 128.0),
    "a100_pairwise_nvlink": Interconnect(600.0, 2, "nvlink-bridge", 64.0),
    "h100_pairwise_nvlink": Interconnect(600.0, 2, "nvlink-bridge", 128.0),
}


@dataclass(frozen=True)
class CollectiveCoefficients:
    """The shared NCCL curve (``data/allreduce_coefficients.json``)."""

    latency_s: float
    chunk_bytes: float
    #: fraction of the per-direction bandwidth a ring reaches, per ``LINK_KINDS`` entry
    link_eff: dict[str, float]
    #: the measurement's host floor and the soft maximum's exponent (fit and report only)
    host_floor_s: float
    smoothness: float

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CollectiveCoefficients:
        return cls(float(d["latency_s"]), float(d["chunk_bytes"]),
                   {k: float(d["link_eff"][k]) for k in LINK_KINDS},
                   float(d["host_floor_s"]), float(d["smoothness"]))

    def to_dict(self) -> dict[str, Any]:
        return {"latency_s": self.latency_s, "chunk_bytes": self.chunk_bytes,
                "link_eff": dict(self.link_eff), "host_floor_s": self.host_floor_s,
                "smoothness": self.smoothness}


@lru_cache(maxsize=1)
def _load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(COLLECTIVE_COEFFICIENTS_PATH.read_text())
    return data


def collective_coefficients() -> CollectiveCoefficients:
    return CollectiveCoefficients.from_dict(_load()["coefficients"])


def ring_factor(n: int | np.ndarray) -> Any:
    """Bytes each GPU sends per byte reduced by a ring all-reduce of ``n`` ranks (0 for 1)."""
    return 2.0 * (np.asarray(n, dtype=np.float64) - 1.0) / np.asarray(n, dtype=np.float64)


def nccl_allreduce_s(nbytes: float | np.ndarray, n: int, link_bytes_s: float, eff: float,
                     c: CollectiveCoefficients) -> Any:
    """Device time of an NCCL ring all-reduce of ``nbytes`` over ``n`` ranks whose slowest hop
    carries ``link_bytes_s`` per direction at efficiency ``eff`` (0 for one rank)."""
    if n <= 1:
        return np.zeros_like(np.asarray(nbytes, dtype=np.float64))
    bw = link_bytes_s * eff
    return (c.latency_s + 2.0 * (n - 1) * c.chunk_bytes / bw
            + ring_factor(n) * np.asarray(nbytes, dtype=np.float64) / bw)


def measured_allreduce_s(nbytes: np.ndarray, n: np.ndarray, link_bytes_s: np.ndarray,
                         eff: np.ndarray, c: CollectiveCoefficients) -> np.ndarray:
    """What Vidur's eager loop records: the soft maximum of the host floor and the device
    time (arrays of one entry per measurement)."""
    n = np.asarray(n, dtype=np.float64)
    bw = link_bytes_s * eff
    dev = c.latency_s + 2.0 * (n - 1) * c.chunk_bytes / bw + ring_factor(n) * nbytes / bw
    p = c.smoothness
    out: np.ndarray = (c.host_floor_s**p + dev**p) ** (1.0 / p)
    return out


def gpu_interconnect(gpu: GPU) -> Interconnect:
    """The interconnect a GPU of the catalog sits on: NVSwitch of its family's NVLink
    generation when its link is NVLink (SXM boards; a family without a fitted NVSwitch gets the
    NVLink efficiency of the bridges, which both measured generations share), else PCIe at its
    link figure. Rings beyond one NVSwitch node (8 GPUs) cross the network, which is not
    measured here; they are priced at the node's own link figure and the PCIe efficiency."""
    if gpu.nvlink:
        return Interconnect(gpu.link_gb_s, 8, NVSWITCH_KIND.get(gpu.family, "nvlink-bridge"),
                            gpu.link_gb_s)
    return Interconnect(0.0, 1, "nvlink-bridge", gpu.link_gb_s)


def allreduce_tables(rows: Iterable[aic_data.AllReduceRow]
                     ) -> dict[tuple[str, int], tuple[np.ndarray, np.ndarray]]:
    """(GPU, ranks) -> (log bytes, log seconds) of vLLM's measured all-reduce ``rows``, made
    non-decreasing (:func:`chunktune.sim.cost.aic_data.envelope`)."""
    acc: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for r in rows:
        acc.setdefault((r.gpu, r.ranks), []).append((float(r.nbytes), r.us * 1e-6))
    return {k: (np.log([b for b, _ in sorted(v)]),
                aic_data.envelope(np.log([t for _, t in sorted(v)])))
            for k, v in acc.items()}


@lru_cache(maxsize=1)
def _measured() -> dict[tuple[str, int], tuple[np.ndarray, np.ndarray]]:
    """:func:`allreduce_tables` of the committed measurements."""
    return allreduce_tables(aic_data.read_committed_allreduce())


def table_allreduce_s(table: tuple[np.ndarray, np.ndarray], nbytes: np.ndarray) -> np.ndarray:
    """Seconds of an all-reduce of ``nbytes`` read off a measured ``table`` (log bytes, log
    seconds): interpolated in log bytes and log time, proportional to the bytes beyond the
    largest measured message."""
    lb, lt = table
    ls = np.log(np.maximum(nbytes, 1.0))
    t = np.interp(ls, lb, lt)
    out: np.ndarray = np.exp(np.where(ls > lb[-1], lt[-1] + ls - lb[-1], t))
    return out


def same_interconnect(a: GPU, b: GPU) -> bool:
    """Whether two GPUs' all-reduces run over the same interconnect: the same link bandwidth
    and the same family (its NVLink generation), e.g. the H100 SXM and H200 on NVLink 4."""
    return a.link_gb_s == b.link_gb_s and a.family == b.family


def measured_allreduce_source(gpu: GPU, measured: Collection[str] | None = None
                              ) -> str | None:
    """The measured GPU whose vLLM all-reduce tables ``gpu`` uses: itself, or its nearest
    measured GPU (``coefficients.NEAREST``) on the same interconnect
    (:func:`same_interconnect`: the H200 on the H100's NVSwitch board); None where none is.
    ``measured``: the GPUs with tables (default: the committed ones; the kernel report passes
    them less the GPU it holds out)."""
    have = {g for g, _ in _measured()} if measured is None else set(measured)
    for name in (gpu.name, *NEAREST.get(gpu.name, ())):
        if name in have and (name == gpu.name or same_interconnect(resolve_gpu(name), gpu)):
            return name
    return None


def measured_allreduce_table(gpu: GPU, ranks: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(log bytes, log seconds) of vLLM's all-reduce over ``ranks`` measured on
    :func:`measured_allreduce_source`'s GPU."""
    src = measured_allreduce_source(gpu)
    return None if src is None else _measured().get((src, ranks))


def table_timings(tables: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]], gpu: str
                  ) -> list[ab.Timing]:
    """``gpu``'s all-reduces as the engine reads them off its ``tables``
    (:func:`allreduce_tables`: non-decreasing), as
    :func:`chunktune.sim.cost.allreduce_backends.fit_backends` takes them."""
    g = resolve_gpu(gpu)
    return [ab.Timing(g, n, round(float(np.exp(b))), float(np.exp(t)))
            for (name, n), (lb, lt) in sorted(tables.items()) if name == gpu
            for b, t in zip(lb, lt, strict=True)]


@lru_cache(maxsize=8)
def lender_backend_coefficients(gpu: str) -> ab.BackendCoefficients:
    """vLLM's all-reduce backends fitted on the committed table of ``gpu`` alone, as the
    engine reads it: how another GPU that borrows it prices a backend vLLM runs on it and not
    on ``gpu`` (:func:`chunktune.sim.cost.allreduce_backends.borrowed_allreduce_s`)."""
    return ab.fit_backends(table_timings(_measured(), gpu))


def nvlink_timings(rows: Iterable[aic_data.AllReduceRow]) -> list[ab.Timing]:
    """The NVLink GPUs' measured vLLM all-reduces among ``rows``, as
    :func:`chunktune.sim.cost.allreduce_backends.fit_backends` takes them."""
    out = []
    for r in rows:
        g = resolve_gpu(r.gpu)
        if g.nvlink:
            out.append(ab.Timing(g, r.ranks, r.nbytes, r.us * 1e-6))
    return out


@lru_cache(maxsize=1)
def backend_coefficients() -> ab.BackendCoefficients:
    """vLLM's all-reduce backends fitted on every committed NVLink table."""
    return ab.fit_backends(nvlink_timings(aic_data.read_committed_allreduce()))


def vllm_allreduce_s(nbytes: np.ndarray, tp: int, gpu: GPU, latency_s: float,
                     link_eff: float) -> np.ndarray:
    """The per-GPU fitted form of vLLM's all-reduce: ``latency + ring(n) x S / (link x eff)``
    with the per-direction data-sheet bandwidth of the GPU's link (the kernel report's
    in-sample line; the engine prices a GPU without a table per backend instead)."""
    out: np.ndarray = latency_s + ring_factor(tp) * nbytes / (gpu.link_gb_s * 1e9 / 2 * link_eff)
    return out


def pcie_nccl_latencies(tables: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]]
                        ) -> dict[int, float]:
    """NCCL's latency in a CUDA graph over PCIe, seconds per rank count: over the PCIe GPUs'
    measured ``tables`` (:func:`allreduce_tables`) at the rank counts where vLLM runs NCCL
    there (more than two: :func:`chunktune.sim.cost.allreduce_backends.
    vllm_allreduce_backend`), the geometric mean of each table's smallest all-reduce (256 B a
    rank, where the bytes take nanoseconds). AIConfigurator's L40S and RTX PRO 6000 boxes
    agree on it (4 ranks 13.3 / 12.7 us, 8 ranks 25.0 / 23.6) though their hosts' bandwidths
    differ tenfold."""
    acc: dict[int, list[float]] = {}
    for (name, n), (lb, lt) in tables.items():
        g = resolve_gpu(name)
        if not g.nvlink and ab.vllm_allreduce_backend(g, n, float(np.exp(lb[0]))) == ab.NCCL:
            acc.setdefault(n, []).append(float(lt[0]))
    return {n: float(np.exp(np.mean(v))) for n, v in sorted(acc.items())}


def measured_pcie_gpus() -> list[str]:
    """The PCIe GPUs with committed all-reduce tables (whose NCCL latencies
    :func:`pcie_allreduce_s` prices above TP 2)."""
    return sorted({g for g, _ in _measured() if not resolve_gpu(g).nvlink})


#: The committed PCIe tables (``data/aic_allreduce_us.csv``, each GPU's newest) timed on a
#: box whose GPUs had no peer-to-peer path at that rank count, so that vLLM ran NCCL through
#: host memory (:data:`chunktune.sim.cost.aic_data.NO_P2P_TABLES` says which and why: the
#: L40S box above two ranks). Every other PCIe table was timed with one.
HOST_MEMORY_TABLES = frozenset((gpu, n) for gpu, version, ranks in aic_data.NO_P2P_TABLES
                               if version is None for n in ranks)


@lru_cache(maxsize=1)
def _host_memory() -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Ranks -> (log bytes, log seconds) of vLLM's all-reduce through host memory
    (``data/aic_allreduce_no_p2p_us.csv``: two ranks timed on an RTX PRO 6000 box, four and
    eight on the L40S box)."""
    tables = allreduce_tables(aic_data.read_committed_allreduce(
        aic_data.NO_P2P_ALLREDUCE_PATH))
    return {n: t for (_, n), t in sorted(tables.items())}


def host_memory_allreduce_s(nbytes: np.ndarray, tp: int, gpu: GPU) -> np.ndarray:
    """Seconds of vLLM's all-reduce over ``tp`` PCIe GPUs of ``gpu`` without a peer-to-peer
    path: NCCL through host memory, read off the measured table of the smallest rank count at
    or above ``tp`` (the largest beyond them), whatever the card (the host's memory and
    sockets set the pace), and no faster than the ring's bytes cross the GPU's own link."""
    tables = _host_memory()
    n = next((m for m in sorted(tables) if m >= tp), max(tables))
    out: np.ndarray = np.maximum(table_allreduce_s(tables[n], nbytes),
                                 ring_factor(tp) * nbytes / ab.link_bytes_s(gpu))
    return out


def p2p_table(gpu: GPU, ranks: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The measured PCIe all-reduce over ``ranks`` of ``gpu`` or of a GPU on the same
    interconnect (:func:`measured_allreduce_source`: the L4 runs the L40S's) timed with a
    peer-to-peer path (not :data:`HOST_MEMORY_TABLES`); None where none is."""
    src = measured_allreduce_source(gpu)
    if src is None or (src, ranks) in HOST_MEMORY_TABLES:
        return None
    return _measured().get((src, ranks))


def p2p_timings(rows: Iterable[aic_data.AllReduceRow]) -> list[ab.Timing]:
    """The PCIe all-reduces at two ranks timed with a peer-to-peer path among ``rows``, of the
    GPUs whose catalog link carries what they measured: a table that moves more bytes a
    second each way than its GPU's link figure (the RTX PRO 6000's, kept at PCIe Gen4's on
    purpose: :mod:`chunktune.core.gpus`) cannot price another GPU by its link."""
    by: dict[str, list[aic_data.AllReduceRow]] = {}
    for r in rows:
        if r.ranks == 2 and not resolve_gpu(r.gpu).nvlink \
                and (r.gpu, r.ranks) not in HOST_MEMORY_TABLES:
            by.setdefault(r.gpu, []).append(r)
    out = []
    for name, rs in sorted(by.items()):
        g = resolve_gpu(name)
        if max(r.nbytes / (r.us * 1e-6) for r in rs) <= ab.link_bytes_s(g):
            out += [ab.Timing(g, r.ranks, r.nbytes, r.us * 1e-6) for r in rs]
    return out


@lru_cache(maxsize=1)
def pcie_p2p_backend_coefficients() -> ab.BackendCoefficients:
    """vLLM's all-reduce at two PCIe ranks with a peer-to-peer path (its custom kernel up to
    8 MiB, NCCL above) fitted per backend on the committed tables timed with one
    (:func:`p2p_timings`: the L40S box's): how a PCIe GPU without such a table prices it, at
    the same fraction of its own link."""
    return ab.fit_backends(p2p_timings(aic_data.read_committed_allreduce()))


@lru_cache(maxsize=1)
def _pcie_latencies() -> dict[int, float]:
    """:func:`pcie_nccl_latencies` of the committed measurements."""
    return pcie_nccl_latencies(_measured())


def graphed_nccl_latency_s(n: int, latencies: dict[int, float]) -> float:
    """NCCL's latency over ``n`` PCIe ranks from ``latencies`` (:func:`pcie_nccl_latencies`):
    the measured rank count's, else linear in the ring's ``n - 1`` hops through the measured
    ones (least squares; 4 and 8 ranks: 4.5 us + 2.8 us a hop), the one measured where there
    is one."""
    if n in latencies:
        return latencies[n]
    ns = np.array(sorted(latencies), dtype=np.float64)
    lat = np.array([latencies[int(m)] for m in ns])
    if len(ns) == 1:
        return float(lat[0])
    slope, intercept = np.polyfit(ns - 1.0, lat, 1)
    return max(float(intercept + slope * (n - 1)), 0.0)


def pcie_allreduce_s(nbytes: float | np.ndarray, tp: int, gpu: GPU,
                     c: CollectiveCoefficients | None = None,
                     latencies: dict[int, float] | None = None) -> Any:
    """Seconds of vLLM's all-reduce of ``nbytes`` per rank over ``tp`` ranks of a PCIe GPU
    (0 at TP 1). At TP 2 vLLM runs its custom all-reduce where the pair has peer-to-peer
    access: priced by NCCL's curve fitted on Vidur's collectives (:func:`nccl_allreduce_s`),
    which replays LLMServingSim's RTX PRO 6000 TP 2 serving runs better than that box's own
    measured custom all-reduce. Above TP 2 vLLM runs NCCL (custom all-reduce needs NVLink
    beyond two ranks), captured in CUDA graphs for decode steps: the graphed latency per rank
    count measured on the PCIe boxes (``latencies``, default :func:`pcie_nccl_latencies` of the
    committed tables; :func:`graphed_nccl_latency_s`) plus the ring's ``2 (n - 1) / n`` bytes
    over the per-direction PCIe link at Vidur's PCIe ring efficiency (``c.link_eff["pcie"]``:
    rings with peer-to-peer access over PCIe Gen4 and Gen5, 0.74 / 0.76 of the link on both).
    Without any PCIe table, NCCL's curve at every TP. That is where the node's peer-to-peer
    path is not stated (``gpu.peer_to_peer`` None); where it is (:func:`chunktune.core.gpus.
    with_peer_to_peer`), vLLM's own choice priced on the boxes timed alike: with one, the
    GPU's (or its interconnect's) table timed with one, else at two ranks vLLM's custom
    all-reduce fitted on those tables (:func:`pcie_p2p_backend_coefficients`) and above
    NCCL as said; without one, NCCL through host memory at every TP
    (:func:`host_memory_allreduce_s`: the L40S box's ring moves 3.7 / 2.0 GB/s each way at
    4 / 8 ranks, a fifth and a tenth of what its two-rank custom kernel moves peer to peer)."""
    s = np.asarray(nbytes, dtype=np.float64)
    if tp <= 1:
        return np.zeros_like(s)
    if gpu.peer_to_peer is False:
        return host_memory_allreduce_s(s, tp, gpu)
    if gpu.peer_to_peer:
        table = p2p_table(gpu, tp)
        if table is not None:
            return table_allreduce_s(table, s)
        if tp == 2:
            flat = np.atleast_1d(s).ravel()
            priced = ab.backend_allreduce_s(flat, 2, gpu, pcie_p2p_backend_coefficients())
            if priced is not None:
                return priced.reshape(s.shape)
    c = c or collective_coefficients()
    link, kind = gpu_interconnect(gpu).bottleneck(tp)
    lat = _pcie_latencies() if latencies is None else latencies
    if tp == 2 or not lat:
        return nccl_allreduce_s(s, tp, link, c.link_eff[kind], c)
    return graphed_nccl_latency_s(tp, lat) + ring_factor(tp) * s / (link * c.link_eff[kind])


def tp_allreduce_s(nbytes: float | np.ndarray, tp: int, gpu: GPU,
                   c: CollectiveCoefficients | None = None,
                   interconnect: Interconnect | None = None) -> Any:
    """Seconds one tensor-parallel all-reduce of ``nbytes`` per rank takes in vLLM (0 at TP 1).

    On NVLink, in order: vLLM's all-reduce at ``tp`` ranks measured on the GPU or on one of
    the same interconnect (AIConfigurator's CUDA-graph timings,
    :func:`measured_allreduce_table`, interpolated in log bytes and log time, proportional to
    the bytes beyond the largest; a borrowed table only where vLLM runs the same backend on
    both GPUs, elsewhere the backend this GPU runs priced as on the lender:
    :func:`chunktune.sim.cost.allreduce_backends.borrowed_allreduce_s`, the B300's SM 10.3
    keeping custom all-reduce up to 4 MiB where the B200 hands over at 1-2 MiB); else each
    message priced by the backend vLLM runs for it
    on this GPU's compute capability (:func:`chunktune.sim.cost.allreduce_backends.
    backend_allreduce_s`, fitted per backend on the measured NVLink GPUs). Over
    PCIe: :func:`pcie_allreduce_s` (NCCL's curve at TP 2, NCCL's measured graphed latency and
    the ring's bytes above). Whenever ``interconnect`` says how the GPUs are linked (PCIe
    cards with NVLink bridges), and where no NVLink GPU was measured: the NCCL curve fitted on
    Vidur's collectives (:func:`nccl_allreduce_s`) with vLLM's custom all-reduce on NVLink up
    to ``CUSTOM_AR_MAX_BYTES``."""
    s = np.asarray(nbytes, dtype=np.float64)
    if tp <= 1:
        return np.zeros_like(s)
    if interconnect is None and gpu.nvlink:
        src = measured_allreduce_source(gpu)
        table = None if src is None else _measured().get((src, tp))
        if src is not None and table is not None:
            t = table_allreduce_s(table, s)
            if src == gpu.name:
                return t
            flat = np.atleast_1d(s).ravel()
            return ab.borrowed_allreduce_s(
                np.atleast_1d(t).ravel(), flat, tp, gpu, resolve_gpu(src),
                lender_backend_coefficients(src), backend_coefficients()).reshape(s.shape)
        priced = ab.backend_allreduce_s(np.atleast_1d(s).ravel(), tp, gpu,
                                        backend_coefficients())
        if priced is not None:
            return priced.reshape(s.shape)
    if interconnect is None and not gpu.nvlink:
        return pcie_allreduce_s(s, tp, gpu, c)
    c = c or collective_coefficients()
    ic = interconnect or gpu_interconnect(gpu)
    link, kind = ic.bottleneck(tp)
    eff = c.link_eff[kind]
    nccl = nccl_allreduce_s(s, tp, link, eff, c)
    if kind == "pcie":
        return nccl
    custom = CUSTOM_AR_LATENCY_S + ring_factor(tp) * s / (link * eff)
    return np.where(s <= CUSTOM_AR_MAX_BYTES, custom, nccl)


def nccl_gather_scatter_s(nbytes: float | np.ndarray, n: int, gpu: GPU,
                          c: CollectiveCoefficients | None = None,
                          interconnect: Interconnect | None = None) -> Any:
    """Seconds of an NCCL all-gather that builds a tensor of ``nbytes`` on each of ``n`` ranks
    and the reduce-scatter that returns it (0 at one rank): the dispatch and combine of
    vLLM's ``allgather_reducescatter`` all2all backend (``AgRsAll2AllManager``, the default
    of vLLM 0.17-0.19, pynccl's ``all_gatherv`` and ``reduce_scatterv`` over the data-parallel
    group). Each is a ring of ``n - 1`` steps, half an all-reduce's: the NCCL curve fitted on
    Vidur's all-reduces (:func:`nccl_allreduce_s`) with its latency paid twice; PCIe GPUs
    stated to have no peer-to-peer path (``gpu.peer_to_peer`` False) move those bytes through
    host memory (:func:`host_memory_allreduce_s`), the latency paid twice too."""
    s = np.asarray(nbytes, dtype=np.float64)
    if n <= 1:
        return np.zeros_like(s)
    c = c or collective_coefficients()
    if interconnect is None and not gpu.nvlink and gpu.peer_to_peer is False:
        return c.latency_s + host_memory_allreduce_s(s, n, gpu)
    ic = interconnect or gpu_interconnect(gpu)
    link, kind = ic.bottleneck(n)
    return c.latency_s + nccl_allreduce_s(s, n, link, c.link_eff[kind], c)


#: vLLM 0.10's FlashInfer all-reduce fusion (``--compilation-config`` ``pass_config``
#: ``enable_fi_allreduce_fusion``; ``vllm/compilation/collective_fusion.py``, 0.10.2): the
#: largest all-reduce input, MiB by TP size, that runs through FlashInfer's
#: ``trtllm_allreduce_fusion`` (``_FI_MAX_SIZES``; other sizes ``_DEFAULT_FI_MAX_SIZE``, 0.5),
#: which ``VLLM_FLASHINFER_ALLREDUCE_FUSION_THRESHOLDS_MB`` overrides per TP size.
FI_ALLREDUCE_FUSION_MAX_MB = {2: 64.0, 4: 1.0, 6: 0.5, 8: 0.5}
FI_ALLREDUCE_FUSION_DEFAULT_MB = 0.5
#: ``PassConfig.fi_allreduce_fusion_max_token_num`` (0.10.2 default)
FI_ALLREDUCE_FUSION_MAX_TOKENS = 16384
#: the architectures FlashInfer's fused all-reduce kernels run on (TensorRT-LLM's one-shot
#: Lamport kernels: SM 9.0 and 10.x)
FI_ALLREDUCE_FUSION_FAMILIES = ("hopper", "blackwell")


def fi_allreduce_fusion_tokens(hidden_size: int, dtype_bytes: float, tp: int, gpu: GPU,
                               thresholds_mb: dict[int, float] | None = None) -> int:
    """The largest step, in tokens, whose tensor-parallel all-reduces vLLM 0.10 runs fused
    with the residual add and RMSNorm after them (FlashInfer's ``trtllm_allreduce_fusion``,
    one shot) when the server enables ``enable_fi_allreduce_fusion``; 0 where it runs none
    (TP 1, a GPU without the kernel). ``thresholds_mb``: the server's
    ``VLLM_FLASHINFER_ALLREDUCE_FUSION_THRESHOLDS_MB`` (merged over the release's table).

    ``AllReduceFusionPass`` sizes its workspace for ``max_size // (hidden x tp x 2)`` tokens
    (bf16 activations) and each call takes the fused kernel only when its input is at most
    ``min(max_size, that x hidden x 2)`` bytes, else vLLM's all-reduce and the separate norm
    kernels: so the reach is ``max_size / (hidden x tp x 2)`` tokens."""
    if tp <= 1 or gpu.family not in FI_ALLREDUCE_FUSION_FAMILIES:
        return 0
    sizes = {**FI_ALLREDUCE_FUSION_MAX_MB, **(thresholds_mb or {})}
    max_bytes = int(sizes.get(tp, FI_ALLREDUCE_FUSION_DEFAULT_MB) * 1024 * 1024)
    return min(max_bytes // int(hidden_size * tp * dtype_bytes), FI_ALLREDUCE_FUSION_MAX_TOKENS)
