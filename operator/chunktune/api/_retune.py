"""A workload derived from a running deployment (``spec.workload.fromPrometheus``) and keeping
the deployment tuned as its traffic drifts (``spec.retune``); re-exported by
:mod:`chunktune.api.v1alpha1`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from chunktune.api._goals import Constraint
from chunktune.api._types import HTTP_URL, Model, duration_type, pattern_str
from chunktune.core.selectors import SELECTOR_PATTERN

#: The longest window a derivation may read (Prometheus keeps 15 days by default).
WINDOW_CEILING = 30 * 24 * 3600
#: The latency histograms of vLLM's a re-tune's SLO check reads: TTFT, ITL, end to end.
SLO_BASES = ("ttft", "itl", "e2e")


def slo_watched(c: Constraint) -> bool:
    """Whether ``spec.retune.slo`` can check ``c`` against the deployment's own histograms: an
    upper bound on a percentile of TTFT, ITL or end-to-end latency of all requests (the server
    does not tell the classes apart)."""
    base, _, pct = c.metric.rpartition("_p")
    return c.class_ is None and c.max is not None and base in SLO_BASES and pct.isdigit()


class FromPrometheus(Model):
    """Derive the workload from the deployment's own vLLM metrics in Prometheus when the study
    starts: Poisson arrivals at the mean request rate of the window (or its peak), and a
    ``short`` and a ``long`` class split at ``longPromptTokens``, drawing prompt lengths from the
    ``vllm:request_prompt_tokens`` histogram's buckets and output lengths from
    ``vllm:request_generation_tokens``. What was derived is kept in the study (a restarted
    operator replays the same workload) and shown in ``status.workload``;
    ``spec.workload.duration``, ``warmup`` and ``seed`` still apply (default 5m, 30s, 0)."""

    url: pattern_str(  # type: ignore[valid-type]
        HTTP_URL, 1024, "an http:// or https:// URL of a host (no credentials), e.g. "
        "http://prometheus-operated.monitoring:9090")
    """Prometheus' base URL."""
    selector: pattern_str(  # type: ignore[valid-type]
        SELECTOR_PATTERN, 1024, 'PromQL label matchers such as {model_name="llama"} '
        '(label="value", label!="value", label=~"regex", label!~"regex", separated by commas)')
    """Label matchers that pick the deployment's series, e.g.
    ``{model_name="meta-llama/Llama-3.1-8B-Instruct",namespace="prod"}``."""
    window: duration_type(ceiling=WINDOW_CEILING) = 86400.0  # type: ignore[valid-type]
    """How far back to look. Default: 24h."""
    peak_window: duration_type(ceiling=86400) | None = None  # type: ignore[valid-type]
    """The stretch the peak rate is measured over. Default: an eighth of the window, 10s to
    5m."""
    rate: Literal["mean", "peak"] = "mean"
    """The arrival rate the trials replay: the window's mean, or its peak."""
    long_prompt_tokens: int = Field(default=2048, ge=1, le=2**24)
    """Prompts above this many tokens are the ``long`` class (moved to the nearest bucket
    bound of vLLM's histogram: 2048 becomes 2000)."""


class DriftSpec(Model):
    """How far the derived workload may move from the one the running configuration was tuned
    for before a re-tune starts; a limit left out is not checked."""

    rate: float | None = Field(default=None, gt=0, le=100)
    """Relative change of the mean arrival rate (0.3: 30% up or down)."""
    prompt_length: float | None = Field(default=None, gt=0, le=100)
    """Relative change of any prompt-length percentile (p50, p90, p99)."""
    long_share: float | None = Field(default=None, gt=0, le=1)
    """Absolute change of the share of long prompts (0.1: ten percentage points)."""


def _default_drift() -> DriftSpec:
    return DriftSpec(rate=0.3, prompt_length=0.5, long_share=0.1)


class RetuneSpec(Model):
    """Keep the deployment tuned: after the study succeeds, the operator derives the workload
    again every ``interval`` (as ``spec.workload.fromPrometheus`` does) and starts a new study
    when it has drifted past ``drift`` or the deployment misses a latency bound of
    ``spec.constraints``, warm-started from the previous one (its best configurations queued,
    its twin's calibration reused). The running configuration is measured beside the new best
    under the new workload, and the new best is written to ``spec.output`` only when a real
    confirmation trial of it beats the running one. Needs ``spec.workload.fromPrometheus``;
    ``status.retune`` keeps the history."""

    interval: duration_type(ceiling=WINDOW_CEILING) = 600.0  # type: ignore[valid-type]
    """How often the workload is checked. Default: 10m."""
    window: duration_type(ceiling=WINDOW_CEILING) | None = None  # type: ignore[valid-type]
    """The window each check reads. Default: ``spec.workload.fromPrometheus.window``."""
    drift: DriftSpec = Field(default_factory=_default_drift)
    """Drift limits. Default: rate 0.3, promptLength 0.5, longShare 0.1."""
    slo: bool = True
    """Also re-tune when the deployment's own latency histograms (TTFT, ITL, end to end) miss
    a bound of ``spec.constraints`` over the window (constraints on all requests only: the
    server does not tell the classes apart)."""
    min_requests: int = Field(default=100, ge=1, le=10**9)
    """A check needs this many requests in its window to judge; fewer: no decision."""
    consecutive_checks: int = Field(default=2, ge=1, le=100)
    """Checks in a row that must find drift before a re-tune starts."""
    strategy: Literal["twin", "real"] = "twin"
    """How each re-tune spends real trials: ``twin`` (default: the previous study's twin
    calibration reused when it has one, else calibrated anew) or ``real``."""
    max_trials: int = Field(default=8, ge=2, le=1000)
    """Real trials of each re-tune (the running configuration's included), besides
    ``confirmTrials``."""
    confirm_trials: int = Field(default=1, ge=1, le=16)
    """Real trials that measure the re-tune's best once more before it may be applied; the
    decision takes the mean of its measurements."""
    min_gain: float = Field(default=0.05, ge=0, lt=1)
    """Relative gain on the first objective the new best must show over the running
    configuration (measured under the same workload) to be applied; a running configuration
    that misses a constraint the new best meets is always replaced."""
    warm_start: int = Field(default=3, ge=0, le=64)
    """The previous study's best measured configurations queued first in each re-tune."""


__all__ = ["SLO_BASES", "WINDOW_CEILING", "DriftSpec", "FromPrometheus", "RetuneSpec",
           "slo_watched"]
