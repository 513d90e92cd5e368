"""A workload profile derived from a running deployment's vLLM metrics, and drift between two.

Pure: :class:`Observation` holds what Prometheus answered for one window (the request count
and peak rate, both length histograms' buckets); :func:`derive` turns it into a
:class:`~chunktune.core.workload.Profile` and the :class:`WorkloadStats` that describe it;
:func:`drift` compares two stats against the user's limits. The HTTP lives in
:mod:`chunktune.metrics.client`.

What a histogram can tell and what it cannot:

- the arrival rate is the rate of finished requests (``vllm:request_prompt_tokens_count``,
  observed once per finished request), which equals the arrival rate while the engine keeps
  up; its peak is the highest rate over shorter stretches of the window;
- lengths are known to a bucket: vLLM's token histograms have 1-2-5 buckets (1, 2, 5, 10, 20,
  50, ... up to the model length), so a percentile read from them (:meth:`Buckets.quantile`,
  Prometheus' ``histogram_quantile``: linear inside the bucket) is exact to the bucket that holds
  it, and the derived profile draws lengths uniformly inside each bucket (the ``histogram``
  distribution), so its own percentiles fall in the same buckets;
- the share of long requests is exact at a bucket bound, so the threshold between the ``short``
  and ``long`` classes is moved to the nearest bound (2048 becomes 2000);
- prompt and output lengths are separate histograms: the classes share one output
  distribution, since which outputs belong to the long prompts is not recorded.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from chunktune.core.distributions import Constant, Histogram
from chunktune.core.errors import ChunktuneError, SpecError
from chunktune.core.speculative import acceptance_from_counters
from chunktune.core.stats import hit_rate
from chunktune.core.workload import (
    DERIVED_CLASSES,
    DERIVED_DURATION,
    Arrival,
    Profile,
    TrafficClass,
    derived_warmup,
    parse_profile,
)
from chunktune.metrics.promtext import histogram_quantile, le_bound

#: The classes a derived profile has (prompt length at most / above the threshold).
SHORT, LONG = DERIVED_CLASSES
#: Default threshold between the classes, prompt tokens (moved to the nearest bucket bound).
LONG_PROMPT_TOKENS = 2048
#: Percentiles of the lengths reported and compared for drift.
LENGTH_QUANTILES = (0.5, 0.9, 0.99)


class WorkloadUnavailable(ChunktuneError):
    """No workload can be derived: Prometheus does not answer (``reason``
    ``PrometheusUnreachable``) or nothing matches the selector in the window
    (``NoMatchingSeries``, ``NoRequests``). The message names the selector and the fix."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Buckets:
    """A histogram's cumulative counts over a window by upper bound (``+Inf`` last)."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]

    @classmethod
    def from_le(cls, by_le: Mapping[str, float]) -> Buckets:
        """From ``{le: count}`` as Prometheus gives them (``"2.0"``, ``"+Inf"``); counts made
        monotonic as ``histogram_quantile`` does."""
        pairs = sorted((b, max(0.0, v)) for le, v in by_le.items()
                       if not math.isnan(v) and (b := le_bound(le)) is not None)
        if not pairs or not math.isinf(pairs[-1][0]):
            pairs.append((math.inf, pairs[-1][1] if pairs else 0.0))
        out: list[float] = []
        for _, v in pairs:
            out.append(max(v, out[-1]) if out else v)
        return cls(tuple(b for b, _ in pairs), tuple(out))

    @property
    def total(self) -> float:
        return self.cumulative[-1] if self.cumulative else 0.0

    def quantile(self, q: float) -> float | None:
        """Prometheus' ``histogram_quantile`` (:func:`chunktune.metrics.promtext.
        histogram_quantile`): linear inside the bucket that holds rank ``q * total``; None
        when empty."""
        return histogram_quantile(q, list(zip(self.bounds, self.cumulative, strict=True)))

    def nearest_bound(self, value: float) -> float:
        """The finite bound closest to ``value`` (ties: the lower)."""
        finite = [b for b in self.bounds if math.isfinite(b)]
        return min(finite, key=lambda b: (abs(b - value), b)) if finite else value

    def count_at_most(self, bound: float) -> float:
        """Observations at most ``bound`` (a bucket bound)."""
        below = [c for b, c in zip(self.bounds, self.cumulative, strict=True) if b <= bound]
        return below[-1] if below else 0.0

    def histogram(self, lower: float = 0.0, upper: float = math.inf) -> Histogram | None:
        """The buckets inside ``(lower, upper]`` as a ``histogram`` distribution, trimmed to
        the first and last non-empty bucket; the ``+Inf`` bucket's observations are drawn in
        the largest finite bucket. None when no observation lies inside."""
        edges: list[float] = []
        weights: list[float] = []
        prev_b, prev_c = 0.0, 0.0
        for b, c in zip(self.bounds, self.cumulative, strict=True):
            n = c - prev_c
            if math.isinf(b):
                if weights and n > 0 and prev_b <= upper:
                    weights[-1] += n
                break
            if prev_b >= lower and b <= upper:
                if not edges:
                    edges.append(prev_b)
                edges.append(b)
                weights.append(n)
            prev_b, prev_c = b, c
        first = next((i for i, w in enumerate(weights) if w > 0), None)
        if first is None:
            return None
        last = max(i for i, w in enumerate(weights) if w > 0)
        return Histogram(edges=tuple(_num(e) for e in edges[first:last + 2]),
                         weights=tuple(_num(round(w, 3)) for w in weights[first:last + 1]))


def _num(x: float) -> float:
    """``x``, as an int when it is a whole number (so that profiles read ``2000``, not
    ``2000.0``)."""
    return int(x) if float(x).is_integer() else x


@dataclass(frozen=True)
class Observation:
    """What Prometheus answered for one window of a deployment's metrics."""

    url: str
    selector: str
    window: float
    """Seconds, ending at :attr:`at`."""
    at: float
    """The window's end, Unix seconds."""
    peak_window: float
    """The stretch the peak rate is measured over, seconds."""
    requests: float
    """Finished requests in the window (``increase`` of the prompt histogram's count)."""
    peak_rate: float | None
    prompt: Buckets
    output: Buckets
    prompt_sum: float | None = None
    output_sum: float | None = None
    latency: Mapping[str, Buckets] = field(default_factory=dict)
    """Server-side latency histograms by base (``ttft``, ``itl``, ``e2e``), when read."""
    prefix_queries: float | None = None
    """Prompt tokens of new requests looked up in vLLM's prefix cache
    (``vllm:prefix_cache_queries``); None where the engine exports none."""
    prefix_hits: float | None = None
    """Of those, the tokens found cached (``vllm:prefix_cache_hits``)."""
    spec_drafts: float | None = None
    """Speculative decoding's verifications (``vllm:spec_decode_num_drafts``), draft tokens
    and accepted tokens in the window; None where the engine exports none (no
    ``--speculative-config``)."""
    spec_draft_tokens: float | None = None
    spec_accepted: float | None = None


@dataclass(frozen=True)
class WorkloadStats:
    """The figures that describe a derived workload (status, printout, drift)."""

    rate: float
    """Mean requests per second over the window."""
    peak_rate: float | None
    requests: float
    long_share: float
    """Share of requests whose prompt is above :attr:`long_threshold`."""
    long_threshold: float
    prompt: dict[str, float]
    """Prompt-length percentiles (``p50``, ``p90``, ``p99``), tokens."""
    output: dict[str, float]
    prompt_mean: float | None = None
    output_mean: float | None = None
    prefix_hit_rate: float | None = None
    """Share of the new requests' prompt tokens vLLM found in its prefix cache; None where
    the engine counted no lookup (prefix caching off, or no metric)."""
    spec_acceptance: float | None = None
    """The chance a draft token was accepted given the ones before it were, from the
    speculative-decoding counters (:func:`~chunktune.core.speculative.acceptance_from_counters`);
    None where the engine drafted nothing."""

    def to_dict(self) -> dict[str, Any]:
        """camelCase, as the status keeps them (rounded)."""
        out: dict[str, Any] = {
            "rate": round(self.rate, 4), "requests": round(self.requests, 1),
            "longShare": round(self.long_share, 4), "longThreshold": self.long_threshold,
            "promptTokens": {k: round(v, 1) for k, v in self.prompt.items()},
            "outputTokens": {k: round(v, 1) for k, v in self.output.items()}}
        if self.peak_rate is not None:
            out["peakRate"] = round(self.peak_rate, 4)
        if self.prompt_mean is not None:
            out["promptTokens"]["mean"] = round(self.prompt_mean, 1)
        if self.output_mean is not None:
            out["outputTokens"]["mean"] = round(self.output_mean, 1)
        if self.prefix_hit_rate is not None:
            out["prefixCacheHitRate"] = round(self.prefix_hit_rate, 4)
        if self.spec_acceptance is not None:
            out["specAcceptance"] = self.spec_acceptance
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WorkloadStats:
        prompt = {k: float(v) for k, v in (d.get("promptTokens") or {}).items()}
        output = {k: float(v) for k, v in (d.get("outputTokens") or {}).items()}
        peak = d.get("peakRate")
        hit = d.get("prefixCacheHitRate")
        spec = d.get("specAcceptance")
        return cls(rate=float(d["rate"]), peak_rate=None if peak is None else float(peak),
                   requests=float(d.get("requests", 0.0)),
                   long_share=float(d.get("longShare", 0.0)),
                   long_threshold=float(d.get("longThreshold", LONG_PROMPT_TOKENS)),
                   prompt={k: v for k, v in prompt.items() if k != "mean"},
                   output={k: v for k, v in output.items() if k != "mean"},
                   prompt_mean=prompt.get("mean"), output_mean=output.get("mean"),
                   prefix_hit_rate=None if hit is None else float(hit),
                   spec_acceptance=None if spec is None else float(spec))

    def prefix_caveat(self) -> str | None:
        """What a notable prefix-cache hit rate means for trials replaying this workload, or
        None (not known, or under :data:`NOTABLE_PREFIX_HIT_RATE`)."""
        return prefix_caveat(self.prefix_hit_rate)


#: A prefix-cache hit rate from which the derived workload says that its trials prefill more
#: than production did.
NOTABLE_PREFIX_HIT_RATE = 0.1


def prefix_caveat(hit_rate: float | None) -> str | None:
    """The caveat of a production prefix-cache hit rate (see
    :meth:`WorkloadStats.prefix_caveat`)."""
    if hit_rate is None or hit_rate < NOTABLE_PREFIX_HIT_RATE:
        return None
    more = "far more" if hit_rate > 0.95 else f"{1 / (1 - hit_rate):.1f}x"
    return (f"production found {100 * hit_rate:.0f}% of its prompt tokens in vLLM's prefix "
            f"cache; the derived prompts share no prefix, so trials prefill {more} the "
            f"prompt tokens production did: their TTFT and step times are pessimistic for "
            f"this traffic")


@dataclass(frozen=True)
class DerivedWorkload:
    """A profile derived from an :class:`Observation`, with its figures and source."""

    profile: Profile
    stats: WorkloadStats
    source: dict[str, Any]
    """``url``, ``selector``, ``window`` and ``peakWindow`` (seconds), ``at`` (RFC 3339)."""

    def to_dict(self) -> dict[str, Any]:
        """What a study stores and the status shows (the profile in its file form)."""
        return {"source": dict(self.source), "stats": self.stats.to_dict(),
                "profile": self.profile.to_dict()}

    def describe(self) -> str:
        """What was derived and from which window, for people."""
        s, src = self.stats, self.source
        peak = (f", peak {s.peak_rate:.3g} req/s over {_secs(src['peakWindow'])}"
                if s.peak_rate is not None else "")
        lines = [
            f"from {src['url']}, selector {src['selector']}, {_secs(src['window'])} ending "
            f"{src['at']}: {s.requests:.0f} requests",
            f"  arrival rate: {s.rate:.3g} req/s mean{peak}; the profile replays "
            f"{self.profile.arrival.rate:.3g} req/s ({src.get('rateFrom', 'mean')})",
            "  prompt tokens: " + _quantiles(s.prompt, s.prompt_mean),
            "  output tokens: " + _quantiles(s.output, s.output_mean),
            f"  long prompts (> {s.long_threshold:g} tokens, a bucket bound): "
            f"{100 * s.long_share:.1f}% of requests",
            "  prefix cache: " + ("no lookups counted (prefix caching off, or no metric)"
                                  if s.prefix_hit_rate is None else
                                  f"{100 * s.prefix_hit_rate:.1f}% of prompt tokens found "
                                  f"cached"),
        ]
        if s.spec_acceptance is not None:
            lines.append(f"  speculative decoding: each draft token accepted with chance "
                         f"{s.spec_acceptance:.3g} (every class's spec_acceptance)")
        caveat = s.prefix_caveat()
        if caveat:
            lines.append(f"  note: {caveat}")
        return "\n".join(lines)


def _quantiles(q: Mapping[str, float], mean: float | None) -> str:
    parts = [f"{k} {v:,.0f}" for k, v in q.items()]
    if mean is not None:
        parts.append(f"mean {mean:,.0f}")
    return ", ".join(parts) + " (percentiles to the histogram's bucket)"


def _secs(seconds: float) -> str:
    for unit, n in (("h", 3600), ("m", 60)):
        if seconds >= n and seconds % n == 0:
            return f"{seconds / n:g}{unit}"
    return f"{seconds:g}s"


def length_quantiles(b: Buckets) -> dict[str, float]:
    out = {}
    for q in LENGTH_QUANTILES:
        v = b.quantile(q)
        if v is not None:
            out[f"p{round(q * 100)}"] = v
    return out


def stats_of(obs: Observation, long_threshold: float = LONG_PROMPT_TOKENS) -> WorkloadStats:
    """The figures of an observation (the threshold moved to the nearest bucket bound)."""
    n = obs.prompt.total or obs.requests
    threshold = obs.prompt.nearest_bound(long_threshold)
    long_share = (1 - obs.prompt.count_at_most(threshold) / n) if n > 0 else 0.0
    return WorkloadStats(
        rate=obs.requests / obs.window if obs.window > 0 else 0.0,
        peak_rate=obs.peak_rate, requests=obs.requests,
        long_share=min(1.0, max(0.0, long_share)), long_threshold=threshold,
        prompt=length_quantiles(obs.prompt), output=length_quantiles(obs.output),
        prompt_mean=obs.prompt_sum / n if obs.prompt_sum is not None and n > 0 else None,
        output_mean=obs.output_sum / obs.output.total
        if obs.output_sum is not None and obs.output.total > 0 else None,
        prefix_hit_rate=hit_rate(obs.prefix_queries, obs.prefix_hits),
        spec_acceptance=acceptance_from_counters(obs.spec_drafts, obs.spec_draft_tokens,
                                                 obs.spec_accepted))


def derive(obs: Observation, *, long_threshold: float = LONG_PROMPT_TOKENS,
           rate_from: str = "mean", duration: float = DERIVED_DURATION,
           warmup: float | None = None,
           seed: int = 0, name: str | None = None) -> DerivedWorkload:
    """The profile of an observation: Poisson arrivals at the mean rate (``rate_from="peak"``:
    the peak), a ``short`` and a ``long`` class split at the threshold, each drawing prompt
    lengths from its buckets and output lengths from the output histogram. Raises
    :class:`WorkloadUnavailable` when the window holds no request."""
    if obs.requests <= 0 or obs.prompt.total <= 0 or obs.output.total <= 0:
        raise WorkloadUnavailable(
            "NoRequests", f"no finished request matches {obs.selector} in the "
            f"{_secs(obs.window)} ending {_rfc3339(obs.at)} at {obs.url}: derive over a window "
            "with traffic (a longer --window / fromPrometheus.window)")
    stats = stats_of(obs, long_threshold)
    threshold = stats.long_threshold
    output = obs.output.histogram() or Constant(value=1.0)
    classes: list[TrafficClass] = []
    for cls, lo, hi in ((SHORT, 0.0, threshold), (LONG, threshold, math.inf)):
        prompt = obs.prompt.histogram(lo, hi)
        if prompt is None:
            continue
        share = sum(prompt.weights) / obs.prompt.total
        # production's counters do not split by class: both get the deployment's acceptance
        classes.append(TrafficClass(cls, round(share, 6), prompt, output, "completions",
                                    spec_acceptance=stats.spec_acceptance))
    if not classes:  # every observation in the +Inf bucket, or counts that never grow
        raise WorkloadUnavailable(
            "NoRequests", f"the prompt-length histogram of {obs.selector} at {obs.url} has no "
            f"observation in a finite bucket over the {_secs(obs.window)} ending "
            f"{_rfc3339(obs.at)}: no profile can be drawn from it (check vLLM's "
            "request_prompt_tokens buckets)")
    if rate_from == "peak" and stats.peak_rate:
        rate = stats.peak_rate
    else:
        rate_from, rate = "mean", stats.rate
    source = {"url": obs.url, "selector": obs.selector, "window": obs.window,
              "peakWindow": obs.peak_window, "at": _rfc3339(obs.at), "rateFrom": rate_from}
    label = name or _name_of(obs.selector)
    profile = Profile(
        name=label, classes=tuple(classes), arrival=Arrival("poisson", rate=round(rate, 4)),
        duration=duration, warmup=derived_warmup(duration) if warmup is None else warmup,
        seed=seed,
        description=f"derived from vLLM's metrics at {obs.url} ({obs.selector}, "
                    f"{_secs(obs.window)} ending {_rfc3339(obs.at)})")
    try:  # the checks every profile passes, before anything replays it
        parse_profile(profile.to_dict(), source="derived")
    except SpecError as e:
        raise WorkloadUnavailable(
            "NoRequests", f"the workload derived from {obs.selector} at {obs.url} is not a "
            f"profile chunktune can replay ({e.problems[0][0]}: {e.problems[0][1]})") from e
    return DerivedWorkload(profile, stats, source)


def _name_of(selector: str) -> str:
    words = re.findall(r'"([^"]+)"', selector)
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", "-".join(words)).strip("-.")[:50]
    return f"derived-{base}" if base else "derived"


def _rfc3339(at: float) -> str:
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- drift --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DriftLimits:
    """How far a workload may move before it counts as drift; None: not checked."""

    rate: float | None = None
    """Relative change of the mean arrival rate (0.3 = 30% either way)."""
    prompt: float | None = None
    """Relative change of any prompt-length percentile (p50, p90, p99)."""
    long_share: float | None = None
    """Absolute change of the long requests' share (0.1 = ten percentage points)."""


def drift(reference: WorkloadStats, current: WorkloadStats, limits: DriftLimits) -> list[str]:
    """Why ``current`` has drifted from ``reference`` past ``limits`` (empty: it has not)."""
    out: list[str] = []
    if limits.rate is not None and reference.rate > 0:
        change = current.rate / reference.rate - 1
        if abs(change) > limits.rate:
            out.append(f"arrival rate {reference.rate:.3g} -> {current.rate:.3g} req/s "
                       f"({change:+.0%}; limit ±{limits.rate:.0%})")
    if limits.prompt is not None:
        for key, ref in reference.prompt.items():
            cur = current.prompt.get(key)
            if cur is None or ref <= 0:
                continue
            change = cur / ref - 1
            if abs(change) > limits.prompt:
                out.append(f"prompt length {key} {ref:,.0f} -> {cur:,.0f} tokens "
                           f"({change:+.0%}; limit ±{limits.prompt:.0%})")
    if limits.long_share is not None:
        change = current.long_share - reference.long_share
        if abs(change) > limits.long_share:
            out.append(f"long-prompt share (> {current.long_threshold:g} tokens) "
                       f"{reference.long_share:.0%} -> {current.long_share:.0%} "
                       f"({100 * change:+.0f} points; limit ±{100 * limits.long_share:.0f})")
    return out


__all__ = ["DERIVED_CLASSES", "LENGTH_QUANTILES", "LONG", "LONG_PROMPT_TOKENS",
           "NOTABLE_PREFIX_HIT_RATE", "SHORT",
           "Buckets", "DerivedWorkload", "DriftLimits", "Observation", "WorkloadStats",
           "WorkloadUnavailable", "derive", "drift", "length_quantiles", "prefix_caveat",
           "stats_of"]
