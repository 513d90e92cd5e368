"""Pure reading of Prometheus text exposition: vLLM's metrics between two scrapes.

Names are matched in both spellings, ``vllm:num_preemptions_total`` and
``vllm_num_preemptions_total``: a client that negotiates OpenMetrics with prometheus-client >=
0.23 gets colons turned into underscores (toolchain notes), and real vLLM pods meet the same.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from chunktune.core.stats import hit_rate

#: Histogram bucket edges are kept as floats; ``+Inf`` is ``math.inf``.
Buckets = list[tuple[float, float]]


def _canon(name: str) -> str:
    return name.replace("vllm_", "vllm:", 1) if name.startswith("vllm_") else name


@dataclass
class Scrape:
    """Samples of one scrape: ``{name: [(labels, value)]}`` with canonical ``vllm:`` names."""

    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Scrape:
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out.setdefault(_canon(s.name), []).append((dict(s.labels), float(s.value)))
        return cls(out)

    def total(self, name: str, match: Mapping[str, str] | None = None) -> float | None:
        """Sum of the samples of ``name`` whose labels include ``match``; None if absent."""
        rows = self.samples.get(_canon(name))
        if not rows:
            return None
        return sum(v for labels, v in rows if _matches(labels, match))

    def buckets(self, name: str, match: Mapping[str, str] | None = None) -> Buckets:
        """Cumulative ``(le, count)`` of histogram ``name`` (the ``_bucket`` series), summed
        over series that match."""
        acc: dict[float, float] = {}
        for labels, v in self.samples.get(_canon(name) + "_bucket", []):
            if not _matches(labels, match):
                continue
            le = le_bound(labels.get("le"))
            if le is None or math.isnan(v):  # not a bucket bound: the series is not a bucket
                continue
            acc[le] = acc.get(le, 0.0) + v
        return sorted(acc.items())

    def label_values(self, name: str, label: str) -> set[str]:
        return {labels[label] for labels, _ in self.samples.get(_canon(name), [])
                if label in labels}


def le_bound(le: str | None) -> float | None:
    """A histogram bucket's upper bound from its ``le`` label (``"2.0"``, ``"+Inf"``); None for
    a label that is no bound (missing, not a number, NaN, negative)."""
    if le is None:
        return None
    if le.strip() in ("+Inf", "inf", "Inf", "+inf"):
        return math.inf
    try:
        v = float(le) if len(le) <= 64 else math.nan
    except ValueError:
        return None
    return v if math.isfinite(v) and v >= 0 else None


def _matches(labels: Mapping[str, str], match: Mapping[str, str] | None) -> bool:
    return not match or all(labels.get(k) == v for k, v in match.items())


def delta_buckets(after: Buckets, before: Buckets) -> Buckets:
    b = dict(before)
    return [(le, c - b.get(le, 0.0)) for le, c in after]


def histogram_quantile(q: float, buckets: Buckets) -> float | None:
    """Prometheus' ``histogram_quantile``: linear interpolation inside the bucket holding the
    q-th observation; the upper edge of the last finite bucket when it falls in ``+Inf``."""
    if not buckets:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if math.isinf(le):
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return buckets[-1][0] if not math.isinf(buckets[-1][0]) else prev_le


VLLM_COUNTERS = ("vllm:num_preemptions_total", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:request_success_total",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")


def prefix_cache_hit_rate(figures: dict[str, float]) -> None:
    """``prefix_cache_hit_rate`` from the window's ``prefix_cache_queries`` and ``_hits``
    (prompt tokens looked up and found), where any was looked up."""
    rate = hit_rate(figures.get("prefix_cache_queries"), figures.get("prefix_cache_hits"))
    if rate is not None:
        figures["prefix_cache_hit_rate"] = rate


def server_metrics(before: Scrape, after: Scrape, seconds: float,
                   kv_samples: Iterable[float] = (),
                   match: Mapping[str, str] | None = None) -> dict[str, float]:
    """A trial's engine-side figures from scrapes before and after the load: preemptions (and
    per minute), token counts, the prefix cache's hit rate, KV usage peak (the largest sampled
    ``kv_cache_usage_perc``), and queue / TTFT / ITL quantiles from the histogram deltas."""
    out: dict[str, float] = {}
    for name in VLLM_COUNTERS:
        a, b = after.total(name, match), before.total(name, match)
        if a is not None:
            out[name.removeprefix("vllm:").removesuffix("_total")] = a - (b or 0.0)
    if "num_preemptions" in out:
        out["preemptions"] = out.pop("num_preemptions")
        out["preemptions_per_minute"] = out["preemptions"] / (seconds / 60) if seconds else 0.0
    prefix_cache_hit_rate(out)
    kv = [*kv_samples]
    for s in (before, after):
        v = s.total("vllm:kv_cache_usage_perc", match)
        if v is not None:
            kv.append(v)
    if kv:
        out["kv_cache_usage_peak"] = max(kv)
    for hist, key in (("vllm:request_queue_time_seconds", "queue_time"),
                      ("vllm:time_to_first_token_seconds", "server_ttft"),
                      ("vllm:inter_token_latency_seconds", "server_itl")):
        d = delta_buckets(after.buckets(hist, match), before.buckets(hist, match))
        for q in (0.5, 0.99):
            v = histogram_quantile(q, d)
            if v is not None:
                out[f"{key}_p{int(q * 100)}"] = v
    blocks = after.label_values("vllm:cache_config_info", "num_gpu_blocks")
    if blocks:
        out["num_gpu_blocks"] = float(next(iter(blocks)))
    return out
