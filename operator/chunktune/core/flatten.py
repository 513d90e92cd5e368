"""A trial's load summary as one flat dict of metrics (the keys objectives and constraints use).

Keys follow :func:`chunktune.api.metrics.metric_key`: ``ttft_p99`` over all traffic,
``chat.ttft_p99`` for one class; engine-wide figures (``preemptions_per_minute``,
``kv_cache_usage_peak``, ``queue_time_p99``) come from the server and have no class.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from chunktune.core.stats import PERCENTILES
from chunktune.core.summary import ClassSummary, LoadSummary, Window

LATENCIES = ("ttft", "itl", "e2e", "tpot")


def _class_metrics(cs: ClassSummary, prefix: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for lat in LATENCIES:
        stats = getattr(cs, lat)
        if stats is None:
            continue
        for q in PERCENTILES:
            p = int(q)
            out[f"{prefix}{lat}_p{p}"] = float(getattr(stats, f"p{p}"))
    t = cs.throughput
    out[f"{prefix}throughput_tokens_per_s"] = t.output_tokens_per_s
    out[f"{prefix}total_tokens_per_s"] = t.total_tokens_per_s
    out[f"{prefix}request_rate"] = t.request_rate
    sent = cs.requests.ok + cs.requests.failed
    out[f"{prefix}error_rate"] = cs.requests.failed / sent if sent else 0.0
    return out


def flatten(summary: LoadSummary, server: Mapping[str, Any] | None = None) -> dict[str, float]:
    """Every metric of a trial as one flat dict."""
    out = _class_metrics(summary.overall, "")
    for name, cs in summary.classes.items():
        out.update(_class_metrics(cs, f"{name}."))
    if summary.goodput is not None:
        out["goodput"] = summary.goodput.request_rate
        for name, g in summary.goodput.classes.items():
            out[f"{name}.goodput"] = g.request_rate
    for key in ("preemptions_per_minute", "kv_cache_usage_peak", "queue_time_p99",
                "prefix_cache_hit_rate"):
        v = (server or {}).get(key)
        if v is not None and math.isfinite(float(v)):
            out[key] = float(v)
    return out


def flatten_window(w: Window) -> dict[str, float]:
    """The metrics of one intermediate window (the requests that ended in it), for pruning by
    backends that see the load driver's windows rather than every request."""
    out = _class_metrics(w.overall, "")
    for name, cs in w.classes.items():
        out.update(_class_metrics(cs, f"{name}."))
    return out
