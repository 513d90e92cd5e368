"""Summaries of a replay: latency percentiles per traffic class and overall, throughput,
preemptions, KV usage — the figures ``chunktune sim run`` prints and the tuner scores.

Measured requests are those that arrive in ``[warmup, duration)``; latencies in seconds.
TTFT = first token - arrival; ITL = gaps between a request's consecutive tokens; E2E = last
token - arrival; TPOT = (E2E - TTFT) / (output tokens - 1); queue = first scheduled - arrival.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from chunktune.core.workload import Profile
from chunktune.sim.engine.request import FINISHED, REJECTED, Request
from chunktune.sim.engine.virtual import Engine, ReplayResult

PERCENTILES = (50, 90, 95, 99)


def distribution(values: list[float] | np.ndarray) -> dict[str, float | None]:
    """p50/p90/p95/p99, mean and max (numpy's linear interpolation); None when empty."""
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        return {**{f"p{p}": None for p in PERCENTILES}, "mean": None, "max": None}
    qs = np.percentile(a, PERCENTILES)
    out: dict[str, float | None] = {f"p{p}": float(q) for p, q in zip(PERCENTILES, qs,
                                                                       strict=True)}
    out["mean"] = float(a.mean())
    out["max"] = float(a.max())
    return out


@dataclass
class _Acc:
    ttft: list[float]
    itl: list[float]
    e2e: list[float]
    tpot: list[float]
    queue: list[float]
    ok: int = 0
    failed: int = 0
    output_tokens: int = 0
    prompt_tokens: int = 0
    preemptions: int = 0
    last_finish: float = 0.0

    @classmethod
    def new(cls) -> _Acc:
        return cls([], [], [], [], [])

    def add(self, r: Request) -> None:
        self.ttft.append(r.first_token - r.arrival)
        self.e2e.append(r.last_token - r.arrival)
        self.queue.append(r.first_scheduled - r.arrival)
        self.itl.extend(r.itl)
        if r.num_output > 1:
            self.tpot.append((r.last_token - r.first_token) / (r.num_output - 1))
        self.ok += 1
        self.output_tokens += r.num_output
        self.prompt_tokens += r.prompt_len
        self.preemptions += r.num_preemptions
        self.last_finish = max(self.last_finish, r.finish_time)


def summarize(engine: Engine, result: ReplayResult, profile: Profile) -> dict[str, Any]:
    """The summary of one replay, as a JSON-ready dict."""
    names = profile.class_names()
    accs = {n: _Acc.new() for n in names}
    overall = _Acc.new()
    failures: dict[str, dict[str, int]] = {n: {} for n in names}
    lo, hi = profile.warmup, profile.duration
    measured = [r for r in result.requests if lo <= r.arrival < hi]
    for r in measured:
        name = names[r.cls]
        if r.status == FINISHED and r.num_output >= r.max_tokens:
            accs[name].add(r)
            overall.add(r)
        else:
            reason = "rejected_max_model_len" if r.status == REJECTED else "incomplete"
            failures[name][reason] = failures[name].get(reason, 0) + 1
            accs[name].failed += 1
            overall.failed += 1
    window_end = max([a.last_finish for a in accs.values()] + [hi])
    span = max(window_end - lo, 1e-9)
    steps = result.steps
    mem = engine.memory
    by_class = {n: _section(a, failures[n], span) for n, a in accs.items()}
    all_failures: dict[str, int] = {}
    for f in failures.values():
        for k, v in f.items():
            all_failures[k] = all_failures.get(k, 0) + v
    kv_peak = result.peak_kv_blocks / mem.num_gpu_blocks if mem.num_gpu_blocks else 0.0
    step_dur = np.asarray(steps.duration) if len(steps) else np.zeros(0)
    return {
        "overall": _section(overall, all_failures, span),
        "classes": by_class,
        "engine": {
            "preemptions": result.num_preemptions,
            "preemptions_per_minute": result.num_preemptions / (result.end_time / 60)
            if result.end_time > 0 else 0.0,
            "kv_cache_usage_peak": kv_peak,
            "kv_cache_tokens": mem.kv_cache_tokens,
            "num_gpu_blocks": mem.num_gpu_blocks,
            "steps": len(steps),
            "step_time": distribution(step_dur),
            "simulated_seconds": result.end_time,
        },
        "config": engine.cfg.flags(),
        "window": {"start": lo, "end": hi, "span": span},
    }


def _section(a: _Acc, failures: dict[str, int], span: float) -> dict[str, Any]:
    total = a.ok + a.failed
    return {
        "requests": {"ok": a.ok, "failed": a.failed, "total": total},
        "failures": dict(sorted(failures.items())),
        "error_rate": a.failed / total if total else 0.0,
        "ttft": distribution(a.ttft),
        "itl": distribution(a.itl),
        "e2e": distribution(a.e2e),
        "tpot": distribution(a.tpot),
        "queue_time": distribution(a.queue),
        "output_tokens_per_s": a.output_tokens / span,
        "total_tokens_per_s": (a.output_tokens + a.prompt_tokens) / span,
        "request_rate": a.ok / span,
        "preemptions": a.preemptions,
    }


def _ms(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v * 1e3:,.0f}" if v >= 0.1 else f"{v * 1e3:.1f}"


def format_summary(s: dict[str, Any]) -> str:
    """The table ``chunktune sim run`` prints."""
    head = (f"{'class':14} {'reqs':>6} {'fail':>5}  {'TTFT p50/p90/p99 ms':>22}  "
            f"{'ITL p50/p90/p99 ms':>20}  {'E2E p50/p90/p99 ms':>24}  {'out tok/s':>9}  "
            f"{'preempt':>7}")
    lines = [head, "-" * len(head)]
    rows = [*s["classes"].items(), ("overall", s["overall"])]
    for name, sec in rows:
        def trip(d: dict[str, float | None]) -> str:
            return "/".join(_ms(d[k]) for k in ("p50", "p90", "p99"))
        lines.append(
            f"{name:14} {sec['requests']['ok']:>6} {sec['requests']['failed']:>5}  "
            f"{trip(sec['ttft']):>22}  {trip(sec['itl']):>20}  {trip(sec['e2e']):>24}  "
            f"{sec['output_tokens_per_s']:>9,.0f}  {sec['preemptions']:>7}"
        )
    e = s["engine"]
    lines.append("")
    lines.append(
        f"KV cache: {e['kv_cache_tokens']:,} tokens ({e['num_gpu_blocks']:,} blocks), peak usage "
        f"{e['kv_cache_usage_peak']:.1%}; preemptions: {e['preemptions']} "
        f"({e['preemptions_per_minute']:.1f}/min); steps: {e['steps']:,}; simulated "
        f"{e['simulated_seconds']:.1f} s"
    )
    return "\n".join(lines)
