"""Fit the step-time model to an engine's own step log (the core of ``chunktune calibrate``).

vLLM (v0.32, ``--enable-logging-iteration-details``) logs one line per engine step:

    Iteration(17): 2 context requests, 2048 context tokens, 30 generation requests,
    30 generation tokens, iteration elapsed time: 41.52 ms, GPU KV cache usage: 12.5%

(``vllm/v1/metrics/loggers.py::_log_iteration_details``; a context request is one still in
prefill, so a chunked prompt's later chunks count as context). The start-up line ``GPU KV cache
size: N tokens`` (``CPU ...`` on the CPU engine) gives the capacity that turns the usage into KV
tokens. Lines are parsed by :mod:`chunktune.core.steps` (the parser the backends use when they
keep a trial's steps); this module adds the checks and the fit.

The log has no per-request positions, so the fit keeps the model's shape and scales its terms:

    t = s_step x step overhead + s_req x requests + s_linear x linear(T) + s_attn x attention

with ``linear`` and ``attention`` from :class:`~chunktune.sim.cost.step_time.StepCostModel`
(context requests split their tokens evenly and start at position 0; the decodes' KV is the KV
in use less the context tokens). The scales are non-negative least squares on relative error.
Pure functions: parsing takes lines, fitting takes parsed steps.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from chunktune.core.errors import SpecError
from chunktune.core.steps import StepLogMeta, StepRecord, parse_meta, parse_steps
from chunktune.sim.cost.step_time import StepCostModel

MIN_STEPS = 20


@dataclass(frozen=True)
class StepLog:
    steps: list[StepRecord]
    kv_capacity_tokens: int | None
    meta: StepLogMeta = field(default_factory=StepLogMeta)


def check_steps(steps: list[StepRecord], meta: StepLogMeta, seen_any: bool,
                source: str = "log") -> StepLog:
    """A :class:`StepLog` of parsed steps; raises :class:`SpecError` naming ``source`` when
    the log was empty or held no iteration lines."""
    if not seen_any:
        raise SpecError(f"{source} is empty", field="--log")
    if not steps:
        raise SpecError(f"{source} has no vLLM step lines ('Iteration(N): ... context "
                        "requests ...'): start vLLM with --enable-logging-iteration-details",
                        field="--log")
    return StepLog(steps, meta.kv_cache_tokens, meta)


def parse_step_log(lines: Iterable[str], source: str = "log") -> StepLog:
    """Steps of a vLLM log (parsed by :mod:`chunktune.core.steps`; dummy data-parallel steps
    dropped). Raises :class:`SpecError` naming ``source`` when the log is empty or holds no
    iteration lines."""
    text = list(lines)
    return check_steps(parse_steps(text), parse_meta(text), any(x.strip() for x in text),
                       source)


@dataclass(frozen=True)
class StepFit:
    """Scales of the model's terms and how well the scaled model reproduces the steps."""

    step_overhead_scale: float
    per_request_scale: float
    linear_scale: float
    attention_scale: float
    num_steps: int
    median_rel_err: float
    p90_rel_err: float
    #: Median error on each fifth of the steps when fitted on the other four.
    cross_validated_median_rel_err: float

    def predict(self, features: np.ndarray) -> np.ndarray:
        out: np.ndarray = features @ np.array([self.step_overhead_scale, self.per_request_scale,
                                               self.linear_scale, self.attention_scale])
        return out


def step_features(log: StepLog, cost: StepCostModel) -> np.ndarray:
    """Per step: (step overhead, per-request overhead, linear, attention) seconds as the
    unscaled model gives them."""
    rows = []
    for s in log.steps:
        reqs = s.context_requests + s.generation_requests
        tokens = s.tokens
        chunks: list[tuple[int, int]] = []
        if s.context_requests:
            each = max(1, s.context_tokens // s.context_requests)
            chunks = [(each, 0)] * s.context_requests
        if log.kv_capacity_tokens and s.generation_requests and s.kv_usage_pct is not None:
            in_use = s.kv_usage_pct / 100 * log.kv_capacity_tokens
            dec_ctx = max(s.generation_requests, int(in_use) - s.context_tokens)
        else:
            dec_ctx = 0
        attn = cost.attention_time(chunks, s.generation_requests, dec_ctx)
        rows.append((cost.c.step_overhead_s, cost.c.per_request_overhead_s * reqs,
                     cost.linear_time(tokens) if tokens else 0.0, attn))
    return np.array(rows, dtype=np.float64)


def _nnls_rel(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares of ``x @ s / y - 1`` (numpy only: with four terms every
    subset of free terms is tried, the best non-negative solution kept)."""
    a = x / y[:, None]
    b = np.ones_like(y)
    n = a.shape[1]
    best, best_err = np.zeros(n), float(b @ b)
    for mask in range(1, 2**n):
        cols = [i for i in range(n) if mask >> i & 1]
        sol, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
        if (sol < 0).any():
            continue
        r = a[:, cols] @ sol - b
        if (err := float(r @ r)) < best_err:
            best, best_err = np.zeros(n), err
            best[cols] = sol
    return best


def fit_step_log(log: StepLog, cost: StepCostModel, source: str = "log") -> StepFit:
    """Fit the four scales to ``log``. Raises :class:`SpecError` when there are too few steps
    to fit (fewer than :data:`MIN_STEPS`, or no step with any tokens)."""
    steps = [s for s in log.steps if s.tokens > 0]
    if len(steps) < MIN_STEPS:
        raise SpecError(f"{source}: {len(steps)} steps with tokens; at least {MIN_STEPS} are "
                        "needed to fit (run the engine longer or under more load)",
                        field="--log")
    log = StepLog(steps, log.kv_capacity_tokens, log.meta)
    x = step_features(log, cost)
    y = np.array([s.elapsed_ms / 1e3 for s in steps])
    return fit_arrays(x, y)


def fit_arrays(x: np.ndarray, y: np.ndarray) -> StepFit:
    """The scales of :func:`step_features` rows ``x`` that best give step times ``y``
    (seconds), with in-sample and 5-fold cross-validated errors."""
    scales = _nnls_rel(x, y)
    err = np.abs(x @ scales / y - 1.0)
    folds = np.arange(len(y)) % 5
    cv = []
    for k in range(5):
        tr, te = folds != k, folds == k
        sc = _nnls_rel(x[tr], y[tr])
        cv.append(np.abs(x[te] @ sc / y[te] - 1.0))
    return StepFit(float(scales[0]), float(scales[1]), float(scales[2]), float(scales[3]),
                   num_steps=len(y),
                   median_rel_err=float(np.median(err)),
                   p90_rel_err=float(np.percentile(err, 90)),
                   cross_validated_median_rel_err=float(np.median(np.concatenate(cv))))
