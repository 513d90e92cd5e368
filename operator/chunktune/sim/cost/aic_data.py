"""AIConfigurator's vLLM kernel timings as a simulation reads them: the committed GEMM grids
and all-reduce curves, and the envelope that makes a measured curve non-decreasing.

Source: NVIDIA AIConfigurator (ai-dynamo/aiconfigurator, Apache-2.0, Copyright NVIDIA
CORPORATION & AFFILIATES): vLLM's own linear layer (``gemm_perf``) and tensor-parallel
all-reduce in a CUDA graph (``custom_allreduce_perf``) timed per GPU and vLLM release.
Committed derivatives (headers name source and licence): ``data/aic_gemm_us.csv`` (the GEMM
grid at powers of two of ``m``, ``n`` and ``k`` of at least 128) and ``data/aic_allreduce_us.csv``
(every CUDA-graph all-reduce row). The raw tables are read, and these files written, by the
offline fit (:mod:`chunktune.sim.cost.fit.aic_kernels`).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DATA = Path(__file__).with_name("data")
GEMM_PATH = DATA / "aic_gemm_us.csv"
ALLREDUCE_PATH = DATA / "aic_allreduce_us.csv"
#: The same on PCIe GPUs without a peer-to-peer path (NCCL through host memory)
NO_P2P_ALLREDUCE_PATH = DATA / "aic_allreduce_no_p2p_us.csv"

#: The measured PCIe all-reduces whose GPUs had no peer-to-peer path between them, so that
#: vLLM ran NCCL through host memory: (GPU, vLLM version of the table, None: the newest;
#: rank counts). Read from what vLLM does (``CustomAllreduce``: at two ranks over PCIe its
#: custom kernel runs only where the pair has peer-to-peer access, ``_can_p2p``) and what the
#: tables show (bytes each way a GPU moves at the largest message, 128 MiB): the RTX PRO 6000
#: box of AIConfigurator's vLLM 0.19 table takes 8.7 us for the smallest message at two ranks
#: and moves 15.3 GB/s, where its vLLM 0.24 box's custom kernel takes 4.3 us and 37 GB/s (the
#: link's peer-to-peer path); the L40S box's ring moves 3.7 / 2.0 GB/s at 4 / 8 ranks, a fifth
#: and a tenth of its own two-rank custom kernel's 19.2 GB/s: host memory, not the PCIe link.
#: Version None: the GPU's newest table, the one ``ALLREDUCE_PATH`` holds.
NO_P2P_TABLES: tuple[tuple[str, str | None, tuple[int, ...]], ...] = (
    ("rtx-pro-6000", "0.19.0", (2,)), ("l40s", None, (4, 8)))
#: The ``m`` (tokens) of the committed GEMM grid; ``n`` and ``k`` are the measured ones >= 128.
M_GRID = tuple(2**i for i in range(15))


# ---- GEMMs -------------------------------------------------------------------------------

@dataclass(frozen=True)
class GemmPoint:
    gpu: str
    dtype: str
    m: int
    n: int
    k: int
    us: float
    #: The kernel timed where the grid holds several of one dtype (``nvfp4``: the NVFP4 linear
    #: kernel, :func:`chunktune.sim.cost.gemm_table.nvfp4_kernel`); "" for the others.
    kernel: str = ""


def read_committed_gemm(path: Path = GEMM_PATH) -> list[GemmPoint]:
    out = []
    with path.open() as fh:
        for r in csv.DictReader(line for line in fh if not line.startswith("#")):
            for m in M_GRID:
                v = r[f"m{m}"]
                if v:
                    out.append(GemmPoint(r["gpu"], r["dtype"], m, int(r["n"]), int(r["k"]),
                                         float(v), r["kernel"]))
    return out


def envelope(log_us: np.ndarray) -> np.ndarray:
    """A measured curve (log time at increasing size: a GEMM's rows ``m``, an all-reduce's
    bytes) made non-decreasing: each point is at most the fastest time measured at a larger
    size. Less work never costs more in an engine (a GEMM's rows can run as the larger GEMM:
    vLLM pads a decode batch to a CUDA-graph size anyway), and a benchmark's timing is slower,
    never faster, than the kernel can be (a busy GPU, an unlucky kernel or algorithm choice),
    so a slower point at a smaller size is the benchmark's, not the engine's. Where it
    matters: B200's FP8 GEMM grid, whose single-row and few-row points ran up to 6.9x slower
    than a larger ``m`` of the same weight (325 of its 399 one-row points over 1.25x; the
    other grids' worst are 1.2-6.3x, mostly at ``m`` <= 16); B200's all-reduce over 8 ranks,
    whose 256 KiB and 512 KiB messages took 26 us where 1 MiB took 17 us (vLLM's custom
    all-reduce switches to its two-stage algorithm at 256 KiB on 8 ranks; the engine's
    end-to-end decode steps do not show it, ``bench/fidelity_e2e.py``)."""
    return np.asarray(np.minimum.accumulate(np.asarray(log_us)[::-1])[::-1])


# ---- all-reduce --------------------------------------------------------------------------

@dataclass(frozen=True)
class AllReduceRow:
    """vLLM's tensor-parallel all-reduce inside a CUDA graph: ``nbytes`` over ``ranks``."""

    gpu: str
    ranks: int
    nbytes: int
    us: float


def read_committed_allreduce(path: Path = ALLREDUCE_PATH) -> list[AllReduceRow]:
    with path.open() as fh:
        return [AllReduceRow(r["gpu"], int(r["ranks"]), int(r["bytes"]), float(r["us"]))
                for r in csv.DictReader(line for line in fh if not line.startswith("#"))]
