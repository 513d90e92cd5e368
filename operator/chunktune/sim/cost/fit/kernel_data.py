"""Readers for the measured kernel and engine data the step-time model is fitted and checked on.

Raw data (MIT-licensed, each folder with its PROVENANCE.md) lives beside the checkout in
``../shared/data``; only small derived tables are committed (``sim/cost/data/kernel_points.csv``,
with source and licence in its header). Datasets:

- ``llmss``: casys-kaist/LLMServingSim (MIT, Copyright (c) 2024 CASYS Lab at KAIST), vLLM 0.19
  per-layer timings on RTX 4090 and RTX PRO 6000: ``attention.csv`` (prefill chunk x its context
  x decodes x their KV length -> one layer's attention time), ``dense.csv`` (linear operators);
- ``splitwise``: Mutinifni/splitwise-sim ``data/perf_model.csv`` (MIT, Copyright (c) 2024
  Pratyush Patel): Llama-2-70B prefill and decode-iteration times at TP 2/4/8 on A100/H100;
- ``vidur-network``: microsoft/vidur ``data/profiling/network/*/all_reduce.csv`` (MIT, Copyright
  (c) Microsoft Corporation): NCCL all-reduce times by message size (bytes) and GPU count; a
  sub-sample is committed as ``data/vidur_allreduce_ms.csv``;
- ``vidur``: microsoft/vidur ``data/profiling/compute/{a100,h100}/<model>/mlp.csv`` (MIT),
  per-layer median timings of the linear operators on A100 and H100 at TP 1-8 for Llama-2-7B/70B,
  CodeLlama-34B and Llama-3-8B/70B (Llama-3 on A100 only), and from its ``unseen/`` folder the
  A40's timings of the catalog's Llama-2 and CodeLlama models; committed as
  ``data/vidur_linear_ms.csv`` (every power of two and multiple of 256 tokens: per-layer sums
  and their GEMM and elementwise parts).

AIConfigurator's vLLM kernel timings have their own reader, :mod:`.aic_kernels`.
"""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: The committed tables, beside the runtime step-time model's (``chunktune/sim/cost/data``).
DATA = Path(__file__).parents[1] / "data"
POINTS_PATH = DATA / "kernel_points.csv"
VIDUR_PATH = DATA / "vidur_linear_ms.csv"
#: Vidur's linear operators in ``mlp.csv``, and its GEMMs under the cost model's names (the
#: others are elementwise).
VIDUR_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
             "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
VIDUR_GEMMS = {"attn_pre_proj": "qkv", "attn_post_proj": "o", "mlp_up_proj": "up",
               "mlp_down_proj": "down"}
#: Vidur's model directory names -> our catalog; its GPU names -> ours.
VIDUR_MODELS = {
    "Llama-2-7b-hf": "llama-2-7b",
    "Llama-2-70b-hf": "llama-2-70b",
    "CodeLlama-34b-Instruct-hf": "codellama-34b",
    "Meta-Llama-3-8B": "llama-3-8b",
    "Meta-Llama-3-70B": "llama-3-70b",
}
VIDUR_GPUS = {"a100": "a100-sxm", "h100": "h100-sxm", "a40": "a40"}

#: LLMServingSim's hardware folder -> our GPU name; model folder -> our catalog name.
LLMSS_GPUS = {"RTX4090": "rtx4090", "RTXPRO6000": "rtx-pro-6000"}
LLMSS_MODELS = {"Llama-3.1-8B": "llama-3.1-8b", "Qwen3-32B": "qwen3-32b",
                "Qwen3-30B-A3B-Instruct-2507": "qwen3-30b-a3b"}
#: dense.csv operators of one decoder layer (the norm runs twice: before attention and MLP).
DENSE_LAYER_OPS = {"layernorm": 2, "qkv_proj": 1, "qk_norm": 1, "rotary_emb": 1, "o_proj": 1,
                   "gate_up_proj": 1, "act_fn": 1, "down_proj": 1}
#: The per-operator times a ``LinearPoint`` carries, in this order: the four GEMMs, then every
#: elementwise kernel together (the cost model's ``linear_op_times`` keys).
LINEAR_FIT_OPS = ("qkv", "o", "up", "down", "elementwise")
#: dense.csv's GEMMs under those names (every other operator is elementwise).
DENSE_GEMMS = {"qkv_proj": "qkv", "o_proj": "o", "gate_up_proj": "up", "down_proj": "down"}
#: The attention grid committed for the regression test (a sub-grid of the measured one).
COMMITTED_CHUNKS = {0, 16, 64, 256, 1024, 2048}
COMMITTED_KV = {0, 64, 1024, 4096, 16384}
COMMITTED_DECODES = {0, 1, 4, 16, 64, 256}


@dataclass(frozen=True)
class AttentionPoint:
    gpu: str
    model: str
    tp: int
    chunk: int
    kv_prefill: int
    decodes: int
    kv_decode: int
    us: float


@dataclass(frozen=True)
class LinearPoint:
    """Per-layer sum of the linear operators for ``tokens`` tokens (one rank), and where
    measured, each ``LINEAR_FIT_OPS`` entry's share of it (ms; empty when not known)."""

    gpu: str
    model: str
    tp: int
    tokens: int
    per_layer_ms: float
    ops: tuple[float, ...] = ()


def _kept(tokens: int) -> bool:
    """The token counts the derived table keeps: powers of two and multiples of 256."""
    return tokens & (tokens - 1) == 0 or tokens % 256 == 0


def derive_vidur(data_dir: Path) -> list[LinearPoint]:
    """Per-layer linear time from Vidur's raw ``mlp.csv`` files (``data_dir``: the
    ``vidur-profiling`` folder), and its GEMM and elementwise parts (duplicates averaged),
    under our GPU and catalog names."""
    acc: dict[tuple[str, str, int, int], list[tuple[float, ...]]] = defaultdict(list)
    files = sorted(data_dir.glob("*__*.mlp.csv")) + sorted(
        (data_dir / "unseen").glob("a40__*.mlp.csv"))
    for f in files:
        gpu, model = f.name.removesuffix(".mlp.csv").split("__")
        if model not in VIDUR_MODELS or gpu not in VIDUR_GPUS:
            continue
        with f.open() as fh:
            for r in csv.DictReader(fh):
                t = int(r["num_tokens"])
                if not _kept(t):
                    continue
                by_op = dict.fromkeys(LINEAR_FIT_OPS, 0.0)
                for op in VIDUR_OPS:
                    by_op[VIDUR_GEMMS.get(op, "elementwise")] += float(
                        r[f"time_stats.{op}.median"])
                key = (VIDUR_GPUS[gpu], VIDUR_MODELS[model],
                       int(r["num_tensor_parallel_workers"]), t)
                acc[key].append(tuple(by_op[o] for o in LINEAR_FIT_OPS))
    out = []
    for (g, m, tp, t), v in sorted(acc.items()):
        ops = tuple(statistics.fmean(x[i] for x in v) for i in range(len(LINEAR_FIT_OPS)))
        out.append(LinearPoint(g, m, tp, t, sum(ops), ops))
    return out


def write_vidur(samples: list[LinearPoint], path: Path = VIDUR_PATH) -> None:
    with path.open("w", newline="") as fh:
        fh.write("# Derived from microsoft/vidur data/profiling/compute/*/mlp.csv and "
                 "unseen/a40__*.mlp.csv (MIT licence, Copyright (c) Microsoft Corporation):\n")
        fh.write("# per-layer sum of the linear operators' median times, duplicates averaged, "
                 "and its parts: the four GEMMs and the elementwise kernels together.\n")
        w = csv.writer(fh)
        w.writerow(["gpu", "model", "tp", "num_tokens", "per_layer_ms"]
                   + [f"{o}_ms" for o in LINEAR_FIT_OPS])
        for s in samples:
            w.writerow([s.gpu, s.model, s.tp, s.tokens, f"{s.per_layer_ms:.5f}"]
                       + [f"{v:.5f}" for v in s.ops])


def read_vidur(path: Path = VIDUR_PATH) -> list[LinearPoint]:
    with path.open() as fh:
        rows = csv.DictReader(line for line in fh if not line.startswith("#"))
        return [LinearPoint(r["gpu"], r["model"], int(r["tp"]), int(r["num_tokens"]),
                            float(r["per_layer_ms"]),
                            tuple(float(r[f"{o}_ms"]) for o in LINEAR_FIT_OPS
                                  if r.get(f"{o}_ms"))) for r in rows]


def _llmss_sets(root: Path) -> Iterator[tuple[str, str, int, Path]]:
    perf = root / "llmservingsim-vllm019" / "profiler" / "perf"
    for tp_dir in sorted(perf.glob("*/*/*/bf16/tp*")):
        hw, model = tp_dir.parts[-5], tp_dir.parts[-3]
        if hw in LLMSS_GPUS and model in LLMSS_MODELS:
            yield LLMSS_GPUS[hw], LLMSS_MODELS[model], int(tp_dir.name[2:]), tp_dir


def read_attention(root: Path) -> list[AttentionPoint]:
    """Every measured attention point under ``root`` (the shared data folder)."""
    out = []
    for gpu, model, tp, d in _llmss_sets(root):
        with (d / "attention.csv").open() as fh:
            for r in csv.DictReader(fh):
                out.append(AttentionPoint(gpu, model, tp, int(r["prefill_chunk"]),
                                          int(r["kv_prefill"]), int(r["n_decode"]),
                                          int(r["kv_decode"]), float(r["time_us"])))
    if not out:
        raise FileNotFoundError(f"no llmservingsim-vllm019 attention.csv under {root}")
    return out


def read_llmss_linear(root: Path) -> list[LinearPoint]:
    """Per-layer linear time from ``dense.csv`` (dense models; the MoE's experts are separate)."""
    out = []
    for gpu, model, tp, d in _llmss_sets(root):
        if model == "qwen3-30b-a3b":
            continue
        acc: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        with (d / "dense.csv").open() as fh:
            for r in csv.DictReader(fh):
                k = DENSE_LAYER_OPS.get(r["layer"], 0)
                op = DENSE_GEMMS.get(r["layer"], "elementwise")
                acc[int(r["tokens"])][op] += k * float(r["time_us"]) / 1e3
        for t, by_op in sorted(acc.items()):
            ops = tuple(by_op[o] for o in LINEAR_FIT_OPS)
            out.append(LinearPoint(gpu, model, tp, t, sum(ops), ops))
    return out


def committed_subset(points: list[AttentionPoint]) -> list[AttentionPoint]:
    return [p for p in points if p.chunk in COMMITTED_CHUNKS and p.kv_prefill in COMMITTED_KV
            and p.decodes in COMMITTED_DECODES and p.kv_decode in COMMITTED_KV]


def write_points(attention: list[AttentionPoint], linear: list[LinearPoint],
                 path: Path = POINTS_PATH) -> None:
    with path.open("w", newline="") as fh:
        fh.write("# Derived from casys-kaist/LLMServingSim profiler/perf/*/bf16/tp*/"
                 "{attention,dense}.csv (vLLM 0.19; MIT licence, Copyright (c) 2024 CASYS Lab "
                 "at KAIST).\n")
        fh.write("# kind=attention: a sub-grid of the measured points, time in us per layer; "
                 "kind=linear: per-layer sum of dense.csv operators (norm x2), ms, and in ops "
                 "its qkv;o;up;down;elementwise parts.\n")
        w = csv.writer(fh)
        w.writerow(["kind", "gpu", "model", "tp", "chunk", "kv_prefill", "decodes", "kv_decode",
                    "value", "ops"])
        for a in attention:
            w.writerow(["attention", a.gpu, a.model, a.tp, a.chunk, a.kv_prefill, a.decodes,
                        a.kv_decode, f"{a.us:.6g}", ""])
        for s in linear:
            w.writerow(["linear", s.gpu, s.model, s.tp, s.tokens, 0, 0, 0,
                        f"{s.per_layer_ms:.6g}", ";".join(f"{v:.6g}" for v in s.ops)])


def _ops(cell: str | None) -> tuple[float, ...]:
    """A committed table's ``a;b;...`` per-operator cell (empty: not known)."""
    return tuple(float(v) for v in cell.split(";")) if cell else ()


def read_points(path: Path = POINTS_PATH) -> tuple[list[AttentionPoint], list[LinearPoint]]:
    att, lin = [], []
    with path.open() as fh:
        for r in csv.DictReader(line for line in fh if not line.startswith("#")):
            if r["kind"] == "attention":
                att.append(AttentionPoint(r["gpu"], r["model"], int(r["tp"]), int(r["chunk"]),
                                          int(r["kv_prefill"]), int(r["decodes"]),
                                          int(r["kv_decode"]), float(r["value"])))
            else:
                lin.append(LinearPoint(r["gpu"], r["model"], int(r["tp"]), int(r["chunk"]),
                                       float(r["value"]), _ops(r.get("ops"))))
    return att, lin


@dataclass(frozen=True)
class SplitwisePoint:
    gpu: str
    tp: int
    prompt: int
    batch: int
    generated: int
    prompt_ms: float
    token_ms: float


SPLITWISE_GPUS = {"a100-80gb": "a100-sxm", "h100-80gb": "h100-sxm"}


def read_splitwise(root: Path) -> list[SplitwisePoint]:
    """Llama-2-70B points (median over repetitions); the power-capped H100 and BLOOM are left
    out (no power model; ALiBi MHA is not a supported architecture)."""
    acc: dict[tuple[str, int, int, int, int], list[tuple[float, float]]] = defaultdict(list)
    with (root / "splitwise" / "perf_model.csv").open() as fh:
        for r in csv.DictReader(fh):
            if r["model"] != "llama2-70b" or r["hardware"] not in SPLITWISE_GPUS:
                continue
            key = (SPLITWISE_GPUS[r["hardware"]], int(r["tensor_parallel"]),
                   int(r["prompt_size"]), int(r["batch_size"]), int(r["token_size"]))
            acc[key].append((float(r["prompt_time"]), float(r["token_time"])))
    return [SplitwisePoint(*k, statistics.median(v[0] for v in vs),
                           statistics.median(v[1] for v in vs)) for k, vs in sorted(acc.items())]


@dataclass(frozen=True)
class AllReducePoint:
    topology: str
    #: the GPU generation (``a100``, ``h100``): what leave-one-GPU-out holds out
    gpu: str
    workers: int
    nbytes: int
    ms: float


ALLREDUCE_PATH = DATA / "vidur_allreduce_ms.csv"
#: Every how many sizes of a (topology, ranks) sweep the committed sub-sample keeps.
ALLREDUCE_STRIDE = 20


def read_allreduce(root: Path) -> list[AllReducePoint]:
    """NCCL all-reduce medians, one node only (``devices_per_node == num_workers``; Vidur's
    ``size`` is in bytes), sorted by (topology, ranks, size)."""
    out = []
    for f in sorted((root / "vidur-profiling" / "network").glob("*/all_reduce.csv")):
        topo = f.parent.name
        with f.open() as fh:
            for r in csv.DictReader(fh):
                n = int(r["num_workers"])
                if int(r["devices_per_node"]) != n:
                    continue
                out.append(AllReducePoint(topo, topo.split("_")[0], n, int(r["size"]),
                                          float(r["time_stats.all_reduce.median"])))
    if not out:
        raise FileNotFoundError(f"no vidur-profiling/network/*/all_reduce.csv under {root}")
    return sorted(out, key=lambda p: (p.topology, p.workers, p.nbytes))


def allreduce_subsample(points: list[AllReducePoint]) -> list[AllReducePoint]:
    """Every ``ALLREDUCE_STRIDE``-th size of each (topology, ranks) sweep, and its largest."""
    groups: dict[tuple[str, int], list[AllReducePoint]] = defaultdict(list)
    for p in points:
        groups[(p.topology, p.workers)].append(p)
    out = []
    for _, pts in sorted(groups.items()):
        pts = sorted(pts, key=lambda p: p.nbytes)
        keep = pts[::ALLREDUCE_STRIDE]
        if keep[-1] is not pts[-1]:
            keep.append(pts[-1])
        out += keep
    return out


def write_allreduce(points: list[AllReducePoint], path: Path = ALLREDUCE_PATH) -> None:
    with path.open("w", newline="") as fh:
        fh.write("# Derived from microsoft/vidur data/profiling/network/*/all_reduce.csv (MIT "
                 "licence, Copyright (c) Microsoft Corporation):\n")
        fh.write(f"# one node (devices_per_node == num_workers), every {ALLREDUCE_STRIDE}th size "
                 "of each sweep and its largest; size in bytes, median NCCL kernel time in ms.\n")
        w = csv.writer(fh)
        w.writerow(["topology", "num_workers", "size_bytes", "median_ms"])
        for p in points:
            w.writerow([p.topology, p.workers, p.nbytes, f"{p.ms:.6g}"])


def read_committed_vidur_allreduce(path: Path = ALLREDUCE_PATH) -> list[AllReducePoint]:
    """Vidur's NCCL all-reduce sweeps as committed (median kernel time in ms; the measured vLLM
    all-reduce of AIConfigurator, in us, is :func:`chunktune.sim.cost.aic_data.
    read_committed_allreduce`)."""
    with path.open() as fh:
        rows = csv.DictReader(line for line in fh if not line.startswith("#"))
        return [AllReducePoint(r["topology"], r["topology"].split("_")[0],
                               int(r["num_workers"]), int(r["size_bytes"]),
                               float(r["median_ms"])) for r in rows]


@dataclass(frozen=True)
class EngineRun:
    """One LLMServingSim end-to-end vLLM run: engine arguments and per-request timings."""

    name: str
    gpu: str
    model: str
    tp: int
    dp: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int | None
    kv_blocks: int | None
    #: (arrival offset s, prompt tokens, output tokens, ttft s, e2e s)
    requests: list[tuple[float, int, int, float, float]]
    #: ``enable_expert_parallel``: an MoE model's experts split whole over the ranks
    ep: bool = False


def read_engine_runs(root: Path) -> list[EngineRun]:
    import json

    out = []
    base = root / "llmservingsim-vllm019" / "bench" / "examples"
    for d in sorted(base.glob("*/*/vllm")):
        hw, model = d.parts[-3], d.parts[-2]
        meta = json.loads((d / "meta.json").read_text())
        kw = meta["engine_kwargs"]
        rows = [json.loads(line) for line in (d / "requests.jsonl").read_text().splitlines()
                if line.strip()]
        t0 = min(r["arrival_time"] for r in rows)
        reqs = [(r["arrival_time"] - t0, int(r["input_toks"]), int(r["output_toks"]),
                 r["first_token_ts"] - r["queued_ts"], r["last_token_ts"] - r["queued_ts"])
                for r in rows]
        kv = (meta.get("kv_cache") or {}).get("num_gpu_blocks")
        out.append(EngineRun(f"{hw}/{model}", LLMSS_GPUS[hw], LLMSS_MODELS[model],
                             int(kw.get("tensor_parallel_size", 1)),
                             int(kw.get("data_parallel_size", 1)), int(kw["max_num_seqs"]),
                             int(kw["max_num_batched_tokens"]), kw.get("max_model_len"), kv,
                             sorted(reqs), bool(kw.get("enable_expert_parallel", False))))
    return out
