"""Summaries of a replay, counted as the load driver counts a run against a server.

A replay's requests become the records the load client would have made of them
(:func:`records`), and :func:`chunktune.core.aggregate.build_summary` summarizes them with the
population rules of :mod:`chunktune.core.summary`: so ``chunktune sim run``, the tuner's
simulated backend and ``chunktune load run`` against a server give one answer for one workload.
Requests still in flight when the arrival window ends are drained (the replay runs on for up to
the drain timeout, :meth:`~chunktune.sim.engine.virtual.Engine.replay_profile`); only those still
running after it fail, with reason ``timeout``, as the load driver records them.

:func:`summarize` adds what the engine saw (preemptions, KV usage, steps) and the configuration:
the figures ``chunktune sim run`` prints (:func:`format_summary`) and writes with ``--json``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from chunktune.core.aggregate import RunInfo, build_summary
from chunktune.core.records import RequestRecord
from chunktune.core.stats import hit_rate
from chunktune.core.stats import summarize as stats
from chunktune.core.summary import ArrivalInfo, LoadSummary, Slo
from chunktune.core.workload import Profile
from chunktune.sim.engine.request import FINISHED, REJECTED, Request
from chunktune.sim.engine.virtual import QUEUE_FULL_MESSAGE, Engine, ReplayResult

#: ``deliver(token_times, rid)``: when the client receives tokens the engine made at
#: ``token_times`` (a calibration profile's delivery stalls); None: as made.
Deliver = Callable[[np.ndarray, int], np.ndarray]


def record(r: Request, names: Sequence[str], warmup: float, now: float, engine: Engine,
           deliver: Deliver | None = None) -> RequestRecord:
    """What the load client records of ``r`` at virtual time ``now``: ok with its latencies,
    ``http_400`` when the engine refused it (too long for ``max_model_len``), ``http_503``
    when ``--max-num-queued-reqs`` did, else
    ``timeout`` (still running when the drain timeout expired)."""
    rec = RequestRecord(rid=r.rid, cls=names[r.cls], arrival=r.arrival, start=r.arrival,
                        prompt_tokens=r.prompt_len, max_tokens=r.max_tokens,
                        warmup=r.arrival < warmup)
    if r.status == FINISHED and r.num_output >= r.max_tokens:
        rec.ok = True
        rec.ttft = r.first_token - r.arrival
        rec.e2e = r.last_token - r.arrival
        rec.output_tokens = r.num_output
        rec.itl = r.itl
        if deliver is not None:
            made = r.first_token + np.concatenate(([0.0], np.cumsum(r.itl)))
            got = deliver(made, r.rid)
            rec.ttft = float(got[0]) - r.arrival
            rec.e2e = float(got[-1]) - r.arrival
            rec.itl = [float(x) for x in np.diff(got)]
    elif r.status == REJECTED:
        too_long = engine.validate_request(r.prompt_len, r.max_tokens)
        if too_long is None:  # refused by --max-num-queued-reqs
            rec.fail("http_503", QUEUE_FULL_MESSAGE, 503)
        else:
            rec.fail("http_400", too_long, 400)
    else:
        rec.output_tokens = r.num_output
        if r.first_token >= 0:
            rec.ttft = r.first_token - r.arrival
        rec.e2e = now - r.arrival
        rec.fail("timeout", f"still running {now - r.arrival:.1f} s after arrival when the "
                            "drain timeout expired")
    return rec


def load_summary(profile: Profile, engine: Engine, reqs: Sequence[Request], *,
                 dispatch_end: float, now: float, complete: bool = True, target: str = "sim",
                 model: str = "", slos: Mapping[str, Slo] | None = None,
                 deliver: Deliver | None = None, include_raw: bool = False) -> LoadSummary:
    """The load-run summary of the replayed requests ``reqs`` at virtual time ``now``
    (``dispatch_end``: when arrivals stopped)."""
    names = profile.class_names()
    recs = [record(r, names, profile.warmup, now, engine, deliver) for r in reqs]
    info = RunInfo(
        target=target, model=model, profile=profile.name,
        arrival=ArrivalInfo(profile.arrival.mode, profile.arrival.rate,
                            profile.arrival.concurrency),
        seed=profile.seed, class_names=tuple(names), started_wall=0.0, ended_wall=now,
        configured=profile.duration, warmup=profile.warmup,
        dispatch_end=min(dispatch_end, profile.duration),
        drain=max(0.0, now - profile.duration), complete=complete)
    return build_summary(recs, info, slos=slos or None, include_raw=include_raw)


def summarize(engine: Engine, result: ReplayResult, profile: Profile, *,
              deliver: Deliver | None = None, include_raw: bool = False) -> dict[str, Any]:
    """The summary of one whole replay (as :func:`load_summary`), plus ``engine`` (what the
    engine saw) and ``config`` (its flags), as a JSON-ready dict."""
    out = load_summary(profile, engine, result.requests, dispatch_end=profile.duration,
                       now=result.end_time, deliver=deliver, include_raw=include_raw).to_dict()
    names = profile.class_names()
    by_class = dict.fromkeys(names, 0)
    for r in result.requests:
        if r.arrival >= profile.warmup:
            by_class[names[r.cls]] += r.num_preemptions
    mem = engine.memory
    steps = result.steps
    blocks = mem.pool_blocks or mem.num_gpu_blocks  # vLLM's num_gpu_blocks: its pool's
    kv_peak = result.peak_kv_blocks / blocks if blocks else 0.0
    step_time = stats(steps.duration)
    out["engine"] = {
        "preemptions": result.num_preemptions,
        "preemptions_per_minute": result.num_preemptions / (result.end_time / 60)
        if result.end_time > 0 else 0.0,
        "preemptions_by_class": by_class,
        "kv_cache_usage_peak": kv_peak,
        "kv_cache_tokens": mem.kv_cache_tokens,
        "num_gpu_blocks": blocks,
        "steps": len(steps),
        "step_time": None if step_time is None else step_time.to_dict(),
        "simulated_seconds": result.end_time,
    }
    sched = engine.scheduler
    if sched.spec is not None:  # vLLM's spec_decode counters
        out["engine"]["spec_decode"] = {"num_drafts": sched.num_drafts,
                                        "num_draft_tokens": sched.num_draft_tokens,
                                        "num_accepted_tokens": sched.num_accepted_tokens}
    if engine.num_queue_rejections:
        out["engine"]["queue_rejections"] = engine.num_queue_rejections
    cache = engine.scheduler.cache
    if cache is not None:  # --enable-prefix-caching: prompt tokens looked up and found
        out["engine"]["prefix_cache"] = {"queries": cache.queries, "hits": cache.hits}
    out["config"] = engine.cfg.flags()
    return out


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
    e = s["engine"]
    by_class = e["preemptions_by_class"]
    rows = [*((n, c, by_class.get(n, 0)) for n, c in s["classes"].items()),
            ("overall", s["overall"], sum(by_class.values()))]
    for name, sec, preempt in rows:
        def trip(d: dict[str, float] | None) -> str:
            return "/".join(_ms(None if d is None else d[k]) for k in ("p50", "p90", "p99"))
        lines.append(
            f"{name:14} {sec['requests']['ok']:>6} {sec['requests']['failed']:>5}  "
            f"{trip(sec['ttft']):>22}  {trip(sec['itl']):>20}  {trip(sec['e2e']):>24}  "
            f"{sec['throughput']['output_tokens_per_s']:>9,.0f}  {preempt:>7}"
        )
    failures = s["overall"]["failures"]
    if failures:
        lines.append("failed: " + "; ".join(f"{k} x{v['count']} ({v['example']})"
                                            for k, v in failures.items()))
    lines.append("")
    d = s["duration"]
    lines.append(
        f"KV cache: {e['kv_cache_tokens']:,} tokens ({e['num_gpu_blocks']:,} blocks), peak usage "
        f"{e['kv_cache_usage_peak']:.1%}; preemptions: {e['preemptions']} "
        f"({e['preemptions_per_minute']:.1f}/min); steps: {e['steps']:,}; simulated "
        f"{e['simulated_seconds']:.1f} s (arrivals {d['configured']:g} s, drain "
        f"{d['drain']:.1f} s)"
    )
    cache = e.get("prefix_cache")
    if cache:
        share = hit_rate(cache["queries"], cache["hits"]) or 0.0
        lines.append(f"prefix cache: {share:.1%} of prompt tokens found cached "
                     f"({cache['hits']:,} of {cache['queries']:,})")
    return "\n".join(lines)
