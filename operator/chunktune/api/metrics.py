"""The metric vocabulary: every name an objective or a constraint may use, with its unit and
default direction. This is the single registry; the tuner, the load driver and the status all
read metric names from here.

Latency metrics are in seconds and are percentiles over the measured requests of a trial
(``ttft_p99`` = the 99th percentile time to first token). Per-class values use the key
``CLASS.METRIC`` (``chat.itl_p99``); engine-wide metrics (preemptions, KV-cache usage) have no
per-class value.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

from chunktune.core.errors import SpecError
from chunktune.core.suggest import closest
from chunktune.core.workload import parse_duration

Direction = Literal["minimize", "maximize"]

#: Units: ``s`` (seconds), ``fraction`` (0..1), ``tokens/s``, ``req/s``, ``1/min``.
Unit = Literal["s", "fraction", "tokens/s", "req/s", "1/min"]


@dataclass(frozen=True)
class Metric:
    """One measurable quantity of a trial."""

    name: str
    unit: Unit
    direction: Direction
    """Which way is better; the default direction of an objective on this metric."""
    description: str
    per_class: bool = True
    """Whether the metric has a value per traffic class (``chat.ttft_p99``)."""

    @property
    def is_latency(self) -> bool:
        return self.unit == "s"


_LATENCIES = {
    "ttft": "time to first token (arrival to first streamed token)",
    "itl": "inter-token latency (gap between consecutive streamed tokens)",
    "e2e": "end-to-end request latency (arrival to last token)",
    "tpot": "time per output token of a request (decode time / (output tokens - 1))",
}
PERCENTILES = (50, 90, 95, 99)


def _build() -> dict[str, Metric]:
    out: dict[str, Metric] = {}
    for base, what in _LATENCIES.items():
        for p in PERCENTILES:
            name = f"{base}_p{p}"
            out[name] = Metric(name, "s", "minimize", f"p{p} {what}, seconds")
    extra = (
        Metric("queue_time_p99", "s", "minimize",
               "p99 time a request waits before its first scheduled step, seconds"),
        Metric("throughput_tokens_per_s", "tokens/s", "maximize",
               "output (generated) tokens per second"),
        Metric("total_tokens_per_s", "tokens/s", "maximize",
               "prompt plus output tokens per second"),
        Metric("request_rate", "req/s", "maximize", "completed requests per second"),
        Metric("goodput", "req/s", "maximize",
               "completed requests per second whose own latencies meet every latency bound "
               "that spec.constraints sets for their class"),
        Metric("error_rate", "fraction", "minimize", "failed requests / all requests"),
        Metric("preemptions_per_minute", "1/min", "minimize",
               "engine preemptions per minute (vllm:num_preemptions)", per_class=False),
        Metric("prefix_cache_hit_rate", "fraction", "maximize",
               "share of the prompt tokens looked up in vLLM's prefix cache that it found, "
               "0..1 (vllm:prefix_cache_hits / vllm:prefix_cache_queries; only where the "
               "engine looks prompts up: prefix caching on)", per_class=False),
        Metric("kv_cache_usage_peak", "fraction", "minimize",
               "peak KV-cache usage, 0..1 (the largest of vllm:kv_cache_usage_perc as sampled "
               "and the per-step usage of vLLM's step log, when kept)", per_class=False),
        Metric("engine_itl_p99", "s", "minimize",
               "p99 inter-token latency as the engine's own steps gave it: vLLM's step log, "
               "each step's time counted once per request decoding in it (only for trials "
               "that keep a step log); free of the API server, network, load client and other "
               "work on the host", per_class=False),
    )
    for m in extra:
        out[m.name] = m
    return out


#: Every metric by name, in documentation order.
METRICS: dict[str, Metric] = _build()

#: The metric names, as a tuple (for enums and messages).
METRIC_NAMES: tuple[str, ...] = tuple(METRICS)


def get_metric(name: str) -> Metric:
    """The metric called ``name``; raises :class:`SpecError` with a suggestion otherwise."""
    try:
        return METRICS[name]
    except KeyError as e:
        raise SpecError(unknown_metric_message(name)) from e


def unknown_metric_message(name: object) -> str:
    hint = closest(str(name), METRIC_NAMES)
    if hint:
        return f"unknown metric {name!r}; did you mean {hint!r}?"
    return f"unknown metric {name!r}; use one of {', '.join(METRIC_NAMES)}"


def metric_key(metric: str, cls: str | None = None) -> str:
    """``ttft_p99`` or ``chat.ttft_p99``: the key a trial's metrics dict uses."""
    return f"{cls}.{metric}" if cls else metric


_PERCENT = re.compile(r"\s*(\d+(?:\.\d+)?)\s*%\s*")


def parse_value(metric: str, raw: Any) -> float:
    """A bound for ``metric`` in its base unit: latencies take seconds or ``"50ms"``/``"4s"``,
    fractions take ``0.01`` or ``"1%"``, the others plain numbers. Raises :class:`SpecError`."""
    m = get_metric(metric)
    if m.unit == "s":
        if isinstance(raw, str) and _PERCENT.fullmatch(raw):
            raise SpecError(f"{metric} is a latency: give seconds or a duration such as "
                            f"'50ms' or '4s' (got {raw!r})")
        try:
            return parse_duration(raw, "")
        except SpecError as e:
            raise SpecError(f"{metric} is a latency: give seconds or a duration such as "
                            f"'50ms' or '4s' (got {raw!r})") from e
    if m.unit == "fraction":
        if isinstance(raw, str) and (pm := _PERCENT.fullmatch(raw)):
            pct = float(pm.group(1))
            if pct > 100:
                raise SpecError(f"must be at most 100% (got {raw!r})")
            return pct / 100
        if _is_number(raw) and 0 <= raw <= 1:
            return float(raw)
        raise SpecError(f"{metric} is a fraction: give a number in [0, 1] or a percentage "
                        f"such as '1%' (got {raw!r})")
    if _is_number(raw) and raw >= 0:
        return float(raw)
    raise SpecError(f"{metric} is in {m.unit}: give a number >= 0 (got {raw!r})")


def format_value(metric: str, value: float) -> str:
    """A short human form: ``412ms``, ``1.5s``, ``0.8%``, ``1234 tokens/s``."""
    m = METRICS.get(metric.rsplit(".", 1)[-1])
    if m is None or not math.isfinite(value):
        return f"{value:g}"
    if m.unit == "s":
        return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"
    if m.unit == "fraction":
        return f"{value * 100:.2g}%"
    return f"{value:.4g} {m.unit}"


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
