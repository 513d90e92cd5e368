"""Readers of AIConfigurator's raw vLLM kernel timings, and writers of the small tables derived
from them (the committed ones a simulation reads are :mod:`chunktune.sim.cost.aic_data`'s).

Source: NVIDIA AIConfigurator (ai-dynamo/aiconfigurator, Apache-2.0, Copyright NVIDIA
CORPORATION & AFFILIATES), ``systems/data/<gpu>/<family>/vllm/<version>/``, kept beside the
checkout as ``../shared/data/aiconfigurator-vllm/<gpu>/<version>/<table>.csv.gz``: vLLM's own
layers and kernels timed on A100 SXM, H100 SXM, H200, L40S, RTX PRO 6000 Server Edition and B200 by
vLLM 0.14-0.24 (one call per row, ms). Tables read here:

- ``gemm_perf``: vLLM's linear layer, an ``m x k`` input times a ``k x n`` weight, in bf16,
  fp8 (per-tensor scaled, the activation quantised on the fly) and, on the Blackwell GPUs,
  nvfp4 (ModelOpt W4A4: FP4 weights with an FP8 scale per 16, the activation quantised to
  NVFP4 on the fly), per kernel: on the B200 vLLM 0.19 and 0.22 timed FlashInfer's CUTLASS
  GEMM (their default), 0.24 its CuTe DSL GEMM (named in ``kernel_source``);
- ``context_attention_perf``: ``batch_size`` prompts of ``isl`` tokens prefilled from scratch
  in one attention call of one layer; ``generation_attention_perf``: ``batch_size`` decodes
  with ``step`` tokens of history each;
- ``custom_allreduce_perf``: vLLM's tensor-parallel all-reduce (``vllm_graph``: inside a CUDA
  graph, as the engine runs it) of ``message_size`` bf16 elements over 2, 4 and 8 GPUs;
- ``moe_perf``: vLLM's fused MoE layer.

Each GPU's table comes from the newest vLLM version that has it (for the GEMMs: that has rows
of the dtype, and for NVFP4 of the kernel): the versions closest to the one users run.
Committed derivatives under ``sim/cost/data/`` (headers name source and licence):
``aic_gemm_us.csv`` (the GEMM grid at powers of two of ``m``, ``n`` and ``k`` of at least
128), ``aic_allreduce_us.csv`` (every CUDA-graph all-reduce row) and ``aic_kernel_points.csv``
(a sub-grid of the attention and MoE rows for the regression test).
"""

from __future__ import annotations

import csv
import gzip
import statistics
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from chunktune.core.gpus import resolve_gpu
from chunktune.sim.cost.aic_data import (
    ALLREDUCE_PATH,
    DATA,
    GEMM_PATH,
    M_GRID,
    NO_P2P_TABLES,
    AllReduceRow,
    GemmPoint,
)
from chunktune.sim.cost.gemm_table import row_nvfp4_kernel
from chunktune.sim.cost.moe_table import counts

AIC_DIR = "aiconfigurator-vllm"
POINTS_PATH = DATA / "aic_kernel_points.csv"
SOURCE = ("NVIDIA AIConfigurator (ai-dynamo/aiconfigurator, Apache-2.0, Copyright NVIDIA "
          "CORPORATION & AFFILIATES) systems/data/<gpu>/vllm/<version>/")

#: AIConfigurator's system folder -> our GPU name.
AIC_GPUS = {"a100_sxm": "a100-sxm", "h100_sxm": "h100-sxm", "h200_sxm": "h200", "l40s": "l40s",
            "rtx_pro_6000_server": "rtx-pro-6000", "b200_sxm": "b200"}
#: ``gemm_dtype`` values read, under the cost model's names.
GEMM_DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "nvfp4": "nvfp4"}
#: ``moe_dtype`` values the regression sub-grid reads (the fits are bf16 and fp8).
FIT_MOE_DTYPES = {"bfloat16": "bf16", "fp8": "fp8"}
MIN_NK = 128


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".") if x.isdigit())


def _versions(root: Path, folder: str, table: str) -> list[Path]:
    """The ``<table>.csv.gz`` files of one GPU, newest vLLM version first."""
    d = root / AIC_DIR / folder
    files = [p / f"{table}.csv.gz" for p in d.iterdir() if (p / f"{table}.csv.gz").exists()]
    return sorted(files, key=lambda f: _version_key(f.parent.name), reverse=True)


def _rows(path: Path) -> Iterator[dict[str, str]]:
    with gzip.open(path, "rt", newline="") as fh:
        yield from csv.DictReader(fh)


def gpu_folders(root: Path) -> dict[str, str]:
    """Our GPU name -> its AIConfigurator folder, for the folders present under ``root``."""
    base = root / AIC_DIR
    if not base.is_dir():
        raise FileNotFoundError(f"no {AIC_DIR}/ folder under {root}")
    return {g: f for f, g in AIC_GPUS.items() if (base / f).is_dir()}


# ---- GEMMs -------------------------------------------------------------------------------

def read_gemm(root: Path) -> tuple[list[GemmPoint], dict[tuple[str, str, str], str]]:
    """Every bf16, fp8 and nvfp4 GEMM timing of each GPU's newest version with that dtype
    (median of duplicates), and the vLLM version each (GPU, dtype, kernel) came from. NVFP4
    per kernel (:func:`chunktune.sim.cost.gemm_table.row_nvfp4_kernel`: the newest version
    timing each kernel vLLM runs by default in some release; rows of other kernels are not
    read), as ``moe_table.counts`` keeps the MoE rows: the engine reads the grid of the
    kernel its release runs."""
    out: list[GemmPoint] = []
    versions: dict[tuple[str, str, str], str] = {}
    for gpu, folder in sorted(gpu_folders(root).items()):
        g = resolve_gpu(gpu)
        for path in _versions(root, folder, "gemm_perf"):
            acc: dict[tuple[str, str, int, int, int], list[float]] = defaultdict(list)
            for r in _rows(path):
                dtype = GEMM_DTYPES.get(r["gemm_dtype"])
                if dtype is None:
                    continue
                kernel = "" if dtype != "nvfp4" else row_nvfp4_kernel(
                    g, path.parent.name, r["kernel_source"])
                if kernel is None or (gpu, dtype, kernel) in versions:
                    continue
                acc[(dtype, kernel, int(r["m"]), int(r["n"]), int(r["k"]))].append(
                    float(r["latency"]) * 1e3)
            for dtype, kernel in sorted({k[:2] for k in acc}):
                versions[(gpu, dtype, kernel)] = path.parent.name
            out += [GemmPoint(gpu, d, m, n, k, statistics.median(v), kern)
                    for (d, kern, m, n, k), v in sorted(acc.items())]
    return out, versions


def gemm_grid(points: Iterable[GemmPoint]) -> list[GemmPoint]:
    """The committed grid: ``m`` in ``M_GRID``, ``n`` and ``k`` at least ``MIN_NK``."""
    ms = set(M_GRID)
    return [p for p in points if p.m in ms and p.n >= MIN_NK and p.k >= MIN_NK]


def gemm_versions_text(versions: dict[tuple[str, str, str], str]) -> str:
    """``b200/bf16=0.24.0 b200/nvfp4/flashinfer-cutlass=0.22.0 ...``: where each grid came
    from."""
    return " ".join(f"{g}/{d}{'/' + kn if kn else ''}={v}"
                    for (g, d, kn), v in sorted(versions.items()))


def write_gemm(points: list[GemmPoint], versions: dict[tuple[str, str, str], str],
               path: Path = GEMM_PATH) -> None:
    """One row per (GPU, dtype, kernel, n, k): microseconds at each ``M_GRID`` m (empty: not
    measured)."""
    rows: dict[tuple[str, str, str, int, int], dict[int, float]] = defaultdict(dict)
    for p in points:
        rows[(p.gpu, p.dtype, p.kernel, p.n, p.k)][p.m] = p.us
    with path.open("w", newline="") as fh:
        fh.write(f"# Derived from {SOURCE}gemm_perf (vLLM's linear layer, one call):\n")
        fh.write("# microseconds for an m x k input times a k x n weight, at m = 1, 2, 4, ..."
                 f" {M_GRID[-1]}; n, k >= {MIN_NK}; kernel: the NVFP4 linear kernel timed "
                 "(gemm_table.nvfp4_kernel); vLLM version per (gpu, dtype[/kernel]): "
                 + gemm_versions_text(versions) + "\n")
        w = csv.writer(fh)
        w.writerow(["gpu", "dtype", "kernel", "n", "k"] + [f"m{m}" for m in M_GRID])
        for (g, d, kn, n, k), by_m in sorted(rows.items()):
            w.writerow([g, d, kn, n, k]
                       + [f"{by_m[m]:.4g}" if m in by_m else "" for m in M_GRID])


# ---- attention ---------------------------------------------------------------------------

@dataclass(frozen=True)
class AttentionRow:
    """One layer's attention on one rank: ``batch`` prompts of ``prompt`` tokens prefilled
    from scratch (``kind`` ``prefill``) or ``batch`` decodes with ``history`` tokens of KV each
    (``decode``: a bf16 KV cache; ``decode-fp8``: an FP8 one, ``--kv-cache-dtype fp8``);
    ``heads`` and ``kv_heads`` per rank, head size 128."""

    gpu: str
    kind: str
    batch: int
    prompt: int
    history: int
    heads: int
    kv_heads: int
    us: float


#: Rows read: full attention (no sliding window), head size 128, query heads a multiple of
#: the KV heads and at most ``MAX_GROUP`` per KV head (the models simulated); bf16 KV, and for
#: decodes also FP8 KV (kind ``decode-fp8``; prefills with an FP8 KV cache are not read).
HEAD_DIM = 128
MAX_GROUP = 16
ATTENTION_TABLES = {"prefill": "context_attention_perf", "decode": "generation_attention_perf"}
#: A row's kind by its table's kind and its ``kv_cache_dtype`` (rows of other pairs are not read).
ROW_KINDS = {("prefill", "bfloat16"): "prefill", ("decode", "bfloat16"): "decode",
             ("decode", "fp8"): "decode-fp8"}


def read_attention(root: Path) -> list[AttentionRow]:
    out = []
    for gpu, folder in sorted(gpu_folders(root).items()):
        for kind, table in ATTENTION_TABLES.items():
            files = _versions(root, folder, table)
            if not files:
                continue
            acc: dict[tuple[str, int, int, int, int, int], list[float]] = defaultdict(list)
            for r in _rows(files[0]):
                row_kind = ROW_KINDS.get((kind, r["kv_cache_dtype"]))
                if (row_kind is None or r.get("window_size", "0") != "0"
                        or int(r["head_dim"]) != HEAD_DIM):
                    continue
                h, kv = int(r["num_heads"]), int(r["num_key_value_heads"])
                if h % kv or h // kv > MAX_GROUP:
                    continue
                b = int(r["batch_size"])
                prompt, hist = (int(r["isl"]), 0) if kind == "prefill" else (1, int(r["step"]))
                acc[(row_kind, b, prompt, hist, h, kv)].append(float(r["latency"]) * 1e3)
            out += [AttentionRow(gpu, *k, statistics.median(v)) for k, v in sorted(acc.items())]
    return out


# ---- all-reduce --------------------------------------------------------------------------

def _allreduce_rows(gpu: str, path: Path, ranks: Iterable[int] | None = None
                    ) -> list[AllReduceRow]:
    """The CUDA-graph bf16 all-reduces of one ``custom_allreduce_perf`` file (median of
    duplicates), at the rank counts ``ranks`` (None: all)."""
    keep = None if ranks is None else set(ranks)
    acc: dict[tuple[int, int], list[float]] = defaultdict(list)
    for r in _rows(path):
        if r["backend"] != "vllm_graph" or r["allreduce_dtype"] != "bfloat16":
            continue
        n = int(r["num_gpus"])
        if keep is None or n in keep:
            acc[(n, 2 * int(r["message_size"]))].append(float(r["latency"]) * 1e3)
    return [AllReduceRow(gpu, n, s, statistics.median(v)) for (n, s), v in sorted(acc.items())]


def read_allreduce(root: Path) -> list[AllReduceRow]:
    out = []
    for gpu, folder in sorted(gpu_folders(root).items()):
        files = _versions(root, folder, "custom_allreduce_perf")
        for path in files[:1]:
            out += _allreduce_rows(gpu, path)
    return out


def read_no_p2p_allreduce(root: Path) -> list[AllReduceRow]:
    """vLLM's all-reduce on PCIe GPUs without a peer-to-peer path
    (:data:`chunktune.sim.cost.aic_data.NO_P2P_TABLES`), keyed by the GPU it was timed on."""
    folders = gpu_folders(root)
    out = []
    for gpu, version, ranks in NO_P2P_TABLES:
        files = _versions(root, folders[gpu], "custom_allreduce_perf")
        path = next((f for f in files if version is None or f.parent.name == version), None)
        if path is None:
            raise FileNotFoundError(f"no custom_allreduce_perf of {gpu} vLLM {version}")
        out += _allreduce_rows(gpu, path, ranks)
    return out


ALLREDUCE_HEADER = (f"# Derived from {SOURCE}custom_allreduce_perf: vLLM's all-reduce in a "
                    "CUDA graph (backend vllm_graph), bf16; bytes per rank, microseconds.")
NO_P2P_HEADER = (f"# Derived from {SOURCE}custom_allreduce_perf: vLLM's all-reduce in a "
                 "CUDA graph (backend vllm_graph), bf16, on PCIe GPUs without a peer-to-peer "
                 "path (NCCL through host memory; aic_data.NO_P2P_TABLES says which and "
                 "why): two ranks from the RTX PRO 6000 box of vLLM 0.19's table, four and "
                 "eight from the L40S box (also in aic_allreduce_us.csv); bytes per rank, "
                 "microseconds.")


def write_allreduce(rows: list[AllReduceRow], path: Path = ALLREDUCE_PATH,
                    header: str = ALLREDUCE_HEADER) -> None:
    """``rows`` as a committed all-reduce table (``ALLREDUCE_PATH``; with ``NO_P2P_HEADER``:
    ``NO_P2P_ALLREDUCE_PATH``)."""
    with path.open("w", newline="") as fh:
        fh.write(header + "\n")
        w = csv.writer(fh)
        w.writerow(["gpu", "ranks", "bytes", "us"])
        for r in rows:
            w.writerow([r.gpu, r.ranks, r.nbytes, f"{r.us:.4g}"])


# ---- fused MoE ---------------------------------------------------------------------------

@dataclass(frozen=True)
class MoeRow:
    """vLLM's fused MoE layer on one rank: ``tokens`` tokens routed to ``topk`` of
    ``experts`` experts of width ``inter`` (per rank: ``inter / tp``), balanced routing."""

    gpu: str
    dtype: str
    tokens: int
    hidden: int
    inter: int
    topk: int
    experts: int
    tp: int
    us: float

    @property
    def key(self) -> tuple[str, int, int, int, int, int, int]:
        """The layer timed, apart from the GPU: the same key on two GPUs is the same work."""
        return (self.dtype, self.tokens, self.hidden, self.inter, self.topk, self.experts,
                self.tp)


def read_moe(root: Path) -> list[MoeRow]:
    """bf16 and fp8 rows with balanced routing and no expert parallelism (the newest version
    with such rows; ``power_law_1.01`` where a version has no balanced rows) that time what
    vLLM 0.33 runs on the GPU (:func:`chunktune.sim.cost.moe_table.counts`: its kernel
    and, for Triton's, its tiles; the A100's vLLM 0.14 rows only on shapes with a tuned
    config)."""
    out = []
    for gpu, folder in sorted(gpu_folders(root).items()):
        done: set[str] = set()
        for path in _versions(root, folder, "moe_perf"):
            rows = [r for r in _rows(path) if r["moe_ep_size"] == "1"
                    and FIT_MOE_DTYPES.get(r["moe_dtype"]) not in (None, *done)
                    and counts(gpu, FIT_MOE_DTYPES[r["moe_dtype"]], path.parent.name, r)]
            dists = {r["distribution"] for r in rows}
            dist = "balanced" if "balanced" in dists else "power_law_1.01"
            acc: dict[tuple[str, int, int, int, int, int, int], list[float]] = defaultdict(list)
            for r in rows:
                if r["distribution"] == dist:
                    acc[(FIT_MOE_DTYPES[r["moe_dtype"]], int(r["num_tokens"]),
                         int(r["hidden_size"]), int(r["inter_size"]), int(r["topk"]),
                         int(r["num_experts"]), int(r["moe_tp_size"]))].append(
                        float(r["latency"]) * 1e3)
            out += [MoeRow(gpu, *k, statistics.median(v)) for k, v in sorted(acc.items())]
            done |= {k[0] for k in acc}
    return out


# ---- multi-head latent attention (DeepSeek-V3) --------------------------------------------

# ---- the committed sub-grid of attention and MoE rows ------------------------------------

#: What the regression test keeps of the attention and MoE rows (a small sub-grid).
KEEP_BATCH = {1, 4, 16, 64, 256}
KEEP_PROMPT = {16, 128, 512, 2048, 8192, 16384}
KEEP_HISTORY = {127, 1023, 4095, 16383}
KEEP_HEADS = {(8, 1), (16, 2), (32, 8), (64, 8), (32, 4), (48, 8)}
KEEP_MOE_TOKENS = {1, 16, 128, 1024, 4096, 16384}


def committed_subset(att: list[AttentionRow], moe: list[MoeRow]
                     ) -> tuple[list[AttentionRow], list[MoeRow]]:
    a = [r for r in att if r.batch in KEEP_BATCH and (r.heads, r.kv_heads) in KEEP_HEADS
         and (r.prompt in KEEP_PROMPT if r.kind == "prefill" else r.history in KEEP_HISTORY)]
    m = [r for r in moe if r.tokens in KEEP_MOE_TOKENS and r.tp in (1, 2, 4)]
    return a, m


def write_points(att: list[AttentionRow], moe: list[MoeRow], path: Path = POINTS_PATH) -> None:
    with path.open("w", newline="") as fh:
        fh.write(f"# Derived from {SOURCE}{{context,generation}}_attention_perf and moe_perf: "
                 "a sub-grid, microseconds per layer on one rank.\n")
        fh.write("# attention: a=batch, b=prompt (prefill) or 1, c=history (decode) or 0, "
                 "d=heads, e=kv heads (head size 128; KV bf16, fp8 in decode-fp8); moe: dtype "
                 "in kind, a=tokens, b=hidden, c=inter, d=topk, e=experts, f=tp (balanced "
                 "routing).\n")
        w = csv.writer(fh)
        w.writerow(["kind", "gpu", "a", "b", "c", "d", "e", "f", "us"])
        for r in att:
            w.writerow([r.kind, r.gpu, r.batch, r.prompt, r.history, r.heads, r.kv_heads, "",
                        f"{r.us:.4g}"])
        for m in moe:
            w.writerow([f"moe-{m.dtype}", m.gpu, m.tokens, m.hidden, m.inter, m.topk,
                        m.experts, m.tp, f"{m.us:.4g}"])


def read_points(path: Path = POINTS_PATH) -> tuple[list[AttentionRow], list[MoeRow]]:
    att, moe = [], []
    with path.open() as fh:
        for r in csv.DictReader(line for line in fh if not line.startswith("#")):
            if r["kind"].startswith("moe-"):
                moe.append(MoeRow(r["gpu"], r["kind"][4:], int(r["a"]), int(r["b"]),
                                  int(r["c"]), int(r["d"]), int(r["e"]), int(r["f"]),
                                  float(r["us"])))
            else:
                att.append(AttentionRow(r["gpu"], r["kind"], int(r["a"]), int(r["b"]),
                                        int(r["c"]), int(r["d"]), int(r["e"]), float(r["us"])))
    return att, moe
