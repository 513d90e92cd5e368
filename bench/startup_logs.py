"""Replay published vLLM start-up logs through the simulator's memory model, term by term.

Each row of ``bench/data/startup_logs.csv`` is one public log of issue 32's models (or their
closest relative): the flags the engine was started with, the vLLM release and GPU, and the
figures it printed ("Model loading took", "Available KV cache memory", "GPU KV cache size").
The row's configuration goes through :func:`chunktune.sim.engine.memory.plan_memory` at the
log's release (its start-up defaults) and the simulator's terms are printed beside the log's:

    python bench/startup_logs.py            # every row
    python bench/startup_logs.py --id kimi  # rows whose id contains "kimi"

Columns: weights, non-torch, activation peak, CUDA graphs (``*``: inside the KV budget at that
release, from 0.21 on), KV GiB and tokens, simulated and logged, and the signed error. The
logs print the KV memory but rarely the other terms, so the part of the budget that is neither
weights nor KV is compared whole ("rest": non-torch + activation peak [+ graphs]): the
logged rest is ``total x gpu_memory_utilization - logged weights - logged KV`` (the
simulator's weights where the log prints none, marked ``~``), and "KV@w" is the simulator's
KV had it the logged weights (the error left by the terms that are not weights).

The simulator models one vLLM release (``core/vllm_release.py``); these logs are older. What it
reproduces of an older release is listed there (defaults, whether graphs are profiled) and in
``sim/engine/activation.py`` (the sampler warm-up of the releases whose code was read); the
weights are vLLM 0.33's model classes' (``bench/vllm_weights_reference.py``) but for gpt-oss's
MXFP4 experts, stored as the log's release does on its GPU (``sim/engine/mxfp4.py``: Marlin,
OAI Triton or FlashInfer TRT-LLM padding and copies). A figure from the simulator is
simulated, not measured.
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))

from chunktune.core.engine_args import EngineArgs, EngineStartupError, resolve  # noqa: E402
from chunktune.core.gpus import resolve_gpu  # noqa: E402
from chunktune.core.models import resolve_model  # noqa: E402
from chunktune.core.vllm_release import cudagraphs_profiled, parse_version  # noqa: E402
from chunktune.sim.engine.memory import GiB, plan_memory  # noqa: E402

TABLE = ROOT / "bench" / "data" / "startup_logs.csv"

#: the start-up refusals whose KV figure vLLM still prints before failing
REFUSALS = ("KVCacheTooSmall", "MaxModelLenTooLarge")


def load(path: Path = TABLE) -> list[dict[str, str]]:
    """The table's rows (its ``#`` header lines skipped)."""
    with path.open() as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def _num(text: str) -> float | None:
    return float(text) if text.strip() else None


def engine_args(row: dict[str, str]) -> EngineArgs:
    """The flags the row's engine was started with (empty cells: the release's defaults)."""
    kw: dict[str, Any] = {"tensor_parallel_size": int(row["tensor_parallel_size"])}
    for name in ("gpu_memory_utilization",):
        if row[name].strip():
            kw[name] = float(row[name])
    for name in ("max_model_len", "max_num_batched_tokens", "max_num_seqs"):
        if row[name].strip():
            kw[name] = int(row[name])
    if row["enforce_eager"].strip().lower() == "true":
        kw["enforce_eager"] = True
    return EngineArgs(**kw)


def replay(row: dict[str, str]) -> dict[str, Any]:
    """The simulator's start-up plan for the row's engine and the comparison with its log.
    Where vLLM (or the simulator) refuses to start for want of KV memory, the KV memory is
    still computed (the blocks pinned so the plan completes) and the tokens are None."""
    version = parse_version(row["vllm_version"])
    cfg = resolve(engine_args(row), resolve_model(row["model"]), resolve_gpu(row["gpu"]),
                  version=version)
    starts = True
    try:
        plan = plan_memory(cfg)
    except EngineStartupError as e:
        if e.reason not in REFUSALS:
            raise
        starts = False
        plan = plan_memory(replace(cfg, num_gpu_blocks_override=1 << 40))
    in_budget = cudagraphs_profiled(version)
    graphs = plan.cudagraph if in_budget else 0.0
    rest = plan.non_torch + plan.activation_peak + graphs
    logged_w, logged_kv = _num(row["logged_weights_gib"]), _num(row["logged_kv_gib"])
    tokens = _num(row["logged_kv_tokens"])
    weights = plan.weights / GiB
    out: dict[str, Any] = {
        "id": row["id"], "version": row["vllm_version"], "gpu": row["gpu"],
        "tp": cfg.tensor_parallel_size, "gmu": cfg.gpu_memory_utilization,
        "max_model_len": cfg.max_model_len, "budget": cfg.max_num_batched_tokens,
        "seqs": cfg.max_num_seqs,
        "requested": plan.requested / GiB, "weights": weights,
        "non_torch": plan.non_torch / GiB, "activation": plan.activation_peak / GiB,
        "forward": plan.forward_activation / GiB, "sampler": plan.sampler_activation / GiB,
        "moe_workspace": plan.moe_workspace / GiB,
        "graphs": plan.cudagraph / GiB, "graphs_in_budget": in_budget,
        "rest": rest / GiB, "kv": plan.kv_cache / GiB,
        "tokens": plan.kv_cache_tokens if starts else None, "starts": starts,
        "logged_weights": logged_w, "logged_kv": logged_kv, "logged_tokens": tokens,
        "logged_starts": row["started"].strip().lower() == "true",
    }
    if logged_kv is not None:
        w = logged_w if logged_w is not None else weights
        out["logged_rest"] = plan.requested / GiB - w - logged_kv
        out["rest_from_sim_weights"] = logged_w is None
        out["kv_err_gib"] = out["kv"] - logged_kv
        out["kv_err"] = out["kv_err_gib"] / logged_kv if logged_kv > 0 else None
        out["kv_at_logged_weights"] = out["kv"] + weights - w
        out["kv_at_w_err"] = (out["kv_at_logged_weights"] - logged_kv) / logged_kv \
            if logged_kv > 0 else None
    if logged_w is not None:
        out["weights_err"] = (weights - logged_w) / logged_w
    if tokens and out["tokens"]:
        out["tokens_err"] = (out["tokens"] - tokens) / tokens
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--id", default="", help="only rows whose id contains this text")
    ap.add_argument("--table", type=Path, default=TABLE)
    args = ap.parse_args(argv)
    rows = [r for r in load(args.table) if args.id in r["id"]]
    print("| log | vLLM | GPU x TP | weights sim / log | non-torch | act. peak (fwd / smp / "
          "ws) | graphs | rest sim / log | KV GiB sim / log (err) | KV@w err | "
          "KV tokens sim / log (err) |")
    print("|---|---|---|---|---:|---|---:|---|---|---:|---|")
    for row in rows:
        r = replay(row)
        graphs = f"{r['graphs']:.2f}{'*' if r['graphs_in_budget'] else ''}"
        tilde = "~" if r.get("rest_from_sim_weights") else ""
        tokens = "refused" if not r["starts"] else f"{r['tokens']:,}"
        if not r["logged_starts"]:
            tokens += " (vLLM refused)"
        print(f"| {r['id']} | {r['version']} | {r['gpu']} x{r['tp']} | "
              f"{r['weights']:.2f} / {_f(r['logged_weights'])} | {r['non_torch']:.2f} | "
              f"{r['activation']:.2f} ({r['forward']:.2f} / {r['sampler']:.2f} / "
              f"{r['moe_workspace']:.2f}) | {graphs} | "
              f"{r['rest']:.2f} / {tilde}{_f(r.get('logged_rest'))} | "
              f"{r['kv']:.2f} / {_f(r['logged_kv'])} ({_pct(r.get('kv_err'))}) | "
              f"{_pct(r.get('kv_at_w_err'))} | "
              f"{tokens} / {_f(r['logged_tokens'], ',.0f')} ({_pct(r.get('tokens_err'))}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
