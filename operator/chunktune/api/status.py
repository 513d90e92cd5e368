"""The ``status`` of a ChunkedPrefillTuning: its typed shape and a pure renderer.

The tuner summarises its study as a :class:`~chunktune.core.study_records.StudySummary` (plain
dataclasses, no Optuna types, in core)
and :func:`render_status` turns it into the ``status`` mapping the operator patches and the local
runner prints. :func:`set_condition` updates a Kubernetes-style condition list. Nothing here does
I/O or reads the clock: times come in as arguments.

Trial states are :class:`chunktune.core.trials.TrialState`: Optuna's names, plus ``INFEASIBLE``
(completed, but a constraint failed) and ``SKIPPED`` (the memory prescreen predicted a start-up
failure, so the trial never ran).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel

from chunktune.core.flags import flags_line
from chunktune.core.progress import TwinPhase
from chunktune.core.study_records import StudySummary, TrialRecord
from chunktune.core.trials import TrialState

Phase = Literal["Pending", "Running", "Succeeded", "Failed", "Suspended"]
PHASES: tuple[str, ...] = ("Pending", "Running", "Succeeded", "Failed", "Suspended")
#: The states a listed trial can be in (queued trials are not listed), as the CRD enumerates them.
LISTED_STATES: tuple[TrialState, ...] = tuple(s for s in TrialState if s is not TrialState.WAITING)
#: The CRD's bounds on status lists and strings (:data:`chunktune.api.crd.STATUS_BOUNDS`): the
#: renderer stays within them, or the API server would refuse the status patch.
MAX_LISTED = 1000
MAX_TEXT = 4096
#: Re-tunes kept in ``status.retune.history``.
MAX_HISTORY = 20

_COUNT_FIELD = {TrialState.COMPLETE: "completed", TrialState.PRUNED: "pruned",
                TrialState.INFEASIBLE: "infeasible", TrialState.FAIL: "failed",
                TrialState.RUNNING: "running", TrialState.SKIPPED: "skipped"}


# ---- output: the status shape -----------------------------------------------------------------


#: A searched flag's value: a number, or true / false for a switch (``async-scheduling``). The
#: schema leaves its type open (a structural schema has no number-or-boolean type); the
#: operator alone writes the status.
FlagValue = Annotated[bool | int | float,
                      WithJsonSchema({"x-kubernetes-preserve-unknown-fields": True})]


class _StatusModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, validate_by_name=True,
                              serialize_by_alias=True, extra="ignore",
                              use_attribute_docstrings=True)


class Condition(_StatusModel):
    """A Kubernetes condition."""

    type: str
    """Condition type (``Ready``, ``Running``, ``Complete``, ``Failed``, ``SpecValid``)."""
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    """CamelCase reason."""
    message: str = ""
    last_transition_time: str
    """When ``status`` last changed (RFC 3339)."""
    observed_generation: int | None = None


class TrialCounts(_StatusModel):
    """Trials by state, over the whole study."""

    completed: int = 0
    pruned: int = 0
    infeasible: int = 0
    failed: int = 0
    running: int = 0
    skipped: int = 0


class TrialPoint(_StatusModel):
    """A notable trial: the baseline, the best, or a Pareto point."""

    trial: int
    """Trial number."""
    parameters: dict[str, FlagValue] = Field(default_factory=dict)
    """Searched flag values: numbers, and true or false for a switch (`async-scheduling`)."""
    metrics: dict[str, float] = Field(default_factory=dict)
    """Measured metrics by key."""
    flags: str = ""
    """The engine flags to paste (``--max-num-batched-tokens 4096 ...``)."""
    improvement: str | None = None
    """Change of the first objective against the baseline (``-34%``)."""
    repeats: list[int] | None = None
    """Trials that measured this configuration, when more than one (``metrics`` is then their
    mean, leaving out those in ``noisy``)."""
    noisy: list[int] | None = None
    """Of ``repeats``, the measurements the host disturbed (clients' ITL p99 over twice the
    engine's own), left out of the mean."""


class TwinStatus(_StatusModel):
    """A twin-first study (``spec.strategy.name: twin``): where it is and how far the twin's
    predictions were from the measurements."""

    phase: Annotated[TwinPhase, WithJsonSchema({"type": "string",
                                                "enum": [p.value for p in TwinPhase]})]
    """calibrate (real trials that record the step log), search (simulated trials in the
    calibrated twin), confirm (the twin's best run for real), fallback (ordinary real trials
    after the twin erred too much), recheck (the best measured configurations measured once
    more before the answer), done."""
    round: int = 0
    """Search round (1 the first search; each refine round adds one)."""
    real_trials: int = 0
    """Real trials that ended (what ``budget.maxTrials`` counts)."""
    simulated_trials: int = 0
    """Simulated trials over all search rounds."""
    twin_error: dict[str, float] = Field(default_factory=dict)
    """Median relative error |predicted / measured - 1| of the confirmed trials, per
    metric."""
    goal_error: dict[str, float] = Field(default_factory=dict)
    """What ``spec.strategy.maxTwinError`` is compared with, per goal metric: an objective's
    median relative error; a constraint metric's median miss measured against its bound while
    the measurement is inside it (|predicted - measured| / max(measured, bound)), since the
    twin only has to tell on which side of the bound a configuration lands."""
    trusted: bool | None = None
    """False when the twin's error on a goal (``goalError``) exceeded
    ``spec.strategy.maxTwinError``."""
    message: str | None = None


class LengthFigures(_StatusModel):
    """Token-length percentiles read from a histogram (exact to its bucket), and the mean."""

    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    mean: float | None = None


class WorkloadFigures(_StatusModel):
    """What a workload derived from a deployment's metrics is."""

    rate: float
    """Mean requests per second over the window."""
    peak_rate: float | None = None
    """The highest rate over ``peakWindow``-long stretches of the window."""
    requests: float = 0.0
    """Requests that finished in the window."""
    long_share: float = 0.0
    """Share of requests whose prompt is above ``longThreshold`` tokens."""
    long_threshold: float = 0.0
    """The bucket bound between the ``short`` and ``long`` classes, tokens."""
    prompt_tokens: LengthFigures = Field(default_factory=LengthFigures)
    output_tokens: LengthFigures = Field(default_factory=LengthFigures)
    prefix_cache_hit_rate: float | None = None
    """Share of the new requests' prompt tokens vLLM found in its prefix cache (absent where
    it counted no lookup). The derived prompts share no prefix: trials prefill more than
    production did when this is high."""


class WorkloadStatus(WorkloadFigures):
    """The workload ``spec.workload.fromPrometheus`` derived when the study started, and from
    which window."""

    url: str
    selector: str
    window: float
    """Seconds, ending at ``at``."""
    at: str
    """The window's end (RFC 3339)."""
    peak_window: float | None = None
    rate_from: Literal["mean", "peak"] = "mean"
    """Which rate the trials replay."""


class RetuneCheck(_StatusModel):
    """One check of the deployment's workload (``spec.retune``)."""

    time: str
    """When (RFC 3339)."""
    workload: WorkloadFigures | None = None
    """What the window showed."""
    drift: list[str] = Field(default_factory=list, max_length=32)
    """Why it counts as drift (empty: it does not)."""
    message: str | None = None
    """Why the check could not judge (Prometheus unreachable, too few requests)."""


class RetuneRecord(_StatusModel):
    """One re-tune: when, why, what changed and what it measured."""

    round: int
    study: str
    """The re-tune's study in the storage."""
    started: str
    finished: str | None = None
    reasons: list[str] = Field(default_factory=list, max_length=32)
    """The drift (or the missed SLO) that started it."""
    outcome: Literal["Running", "Applied", "Recommended", "Kept", "Failed"] = "Running"
    """Applied (written to spec.output), Recommended (better, but spec.output has no
    Deployment or ConfigMap to write), Kept (the running configuration stays), Failed."""
    running: dict[str, FlagValue] = Field(default_factory=dict)
    """The configuration that ran before (the Deployment's flags)."""
    best: dict[str, FlagValue] | None = None
    """The re-tune's best configuration."""
    metric: str | None = None
    """The first objective's key, which ``before``, ``after`` and ``gain`` compare."""
    before: float | None = None
    """The running configuration, measured under the new workload."""
    after: float | None = None
    """The best, measured under the new workload (the mean with its confirmation)."""
    gain: str | None = None
    """The change from ``before`` to ``after`` (``-23%``)."""
    confirmed_by: list[int] | None = None
    """The trials that measured the best (its confirmation among them)."""
    message: str | None = None


class RetuneStatus(_StatusModel):
    """``spec.retune``: the watch on the deployment's workload and every re-tune so far."""

    state: Literal["Watching", "Retuning"] = "Watching"
    round: int = 0
    """Re-tunes started."""
    checks: int = 0
    """Checks of the workload so far."""
    drifting: int = 0
    """Checks in a row that found drift."""
    study: str | None = None
    """The study the status shows (the latest re-tune's, or the first)."""
    reference: WorkloadFigures | None = None
    """The workload the running configuration was tuned for."""
    last_check: RetuneCheck | None = None
    history: list[RetuneRecord] = Field(default_factory=list, max_length=MAX_HISTORY)
    """The latest re-tunes, oldest first."""


class TrialStatus(_StatusModel):
    """One listed trial."""

    number: int
    parameters: dict[str, FlagValue] = Field(default_factory=dict)
    state: Annotated[TrialState, WithJsonSchema({"type": "string",
                                                 "enum": [s.value for s in LISTED_STATES]})]
    reason: str | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    """The objective and constraint metrics."""
    phase: str | None = None
    """Twin-first studies: the phase that ran the trial."""
    predicted: dict[str, float] | None = None
    """Twin-first studies: the twin's prediction of the same metrics (confirmed trials)."""


class Status(_StatusModel):
    """What the operator reports about a study."""

    phase: Phase = "Pending"
    """Pending, Running, Succeeded, Failed or Suspended."""
    message: str | None = None
    """A human-readable line about the phase."""
    observed_generation: int | None = None
    """The spec generation this status describes."""
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra={
        "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]})
    """Kubernetes conditions."""
    trials_completed: int = 0
    """Finished trials in any state (completed, pruned, infeasible or failed)."""
    trials_summary: str = ""
    """Finished trials out of the budget (``12/30``)."""
    counts: TrialCounts = Field(default_factory=TrialCounts)
    """Trials by state."""
    baseline: TrialPoint | None = None
    """The trial with the engine's default flags."""
    best: TrialPoint | None = None
    """The best feasible trial."""
    pareto_front: list[TrialPoint] | None = None
    """The Pareto-optimal trials, for several objectives."""
    trials: list[TrialStatus] = Field(default_factory=list)
    """The latest trials (bounded; ``counts`` covers all)."""
    twin: TwinStatus | None = None
    """Twin-first studies: phase, round, trial counts and the twin's measured error."""
    workload: WorkloadStatus | None = None
    """The workload ``spec.workload.fromPrometheus`` derived for this study."""
    retune: RetuneStatus | None = None
    """``spec.retune``: the watch on the deployment's workload and the re-tunes."""
    cost_model: str | None = None
    """Simulated and twin-first studies: what the simulator's step-time model for the study's
    GPU was fitted on: that GPU's own measured kernels, or borrowed from the nearest measured
    GPU with the error borrowing makes; then its end-to-end error against real vLLM serving
    runs of the study's model on that GPU, or that there are none and whose figures it shows
    instead (docs/simulator.md, "Per-GPU cost models")."""
    start_time: str | None = None
    completion_time: str | None = None


# ---- rendering --------------------------------------------------------------------------------


def render_status(summary: StudySummary) -> dict[str, Any]:
    """The ``status`` mapping for ``summary`` (camelCase, no empty fields)."""
    by_number = {t.number: t for t in summary.trials}
    shown = {**by_number, **summary.merged}
    counts = TrialCounts()
    for t in summary.trials:
        name = _COUNT_FIELD.get(t.state)
        if name:
            setattr(counts, name, getattr(counts, name) + 1)
    finished = counts.completed + counts.pruned + counts.infeasible + counts.failed
    keys = [k for k, _ in summary.objectives]
    keep = list(dict.fromkeys([*keys, *summary.key_metrics]))
    baseline = shown.get(summary.baseline) if summary.baseline is not None else None
    best = shown.get(summary.best) if summary.best is not None else None
    limit = min(summary.trials_limit, MAX_LISTED)
    listed = sorted(summary.trials, key=lambda t: t.number)[-limit:] if limit > 0 else []
    status = Status(
        phase=summary.phase,  # type: ignore[arg-type]
        message=_cut(summary.message),
        observed_generation=summary.observed_generation,
        conditions=[Condition.model_validate({**c, "message": _cut(c.get("message")) or ""})
                    for c in summary.conditions],
        trials_completed=finished,
        trials_summary=f"{finished}/{summary.max_trials}" if summary.max_trials else str(finished),
        counts=counts,
        baseline=_point(baseline) if baseline else None,
        best=_point(best, baseline, summary.objectives) if best else None,
        pareto_front=[_point(shown[n], baseline, summary.objectives)
                      for n in summary.pareto if n in shown][:MAX_LISTED] or None,
        trials=[TrialStatus(number=t.number, parameters=dict(t.params),
                            state=t.state,
                            reason=_cut(t.reason),
                            metrics={k: v for k, v in _finite(t.metrics).items()
                                     if not keep or k in keep},
                            phase=t.phase,
                            predicted={k: v for k, v in _finite(t.predicted).items()
                                       if not keep or k in keep} or None)
                for t in listed],
        twin=TwinStatus.model_validate({**summary.twin,
                                        "message": _cut(summary.twin.get("message"))})
        if summary.twin else None,
        workload=WorkloadStatus.model_validate(summary.workload) if summary.workload else None,
        retune=RetuneStatus.model_validate(summary.retune) if summary.retune else None,
        cost_model=_cut(summary.cost_model),
        start_time=_time(summary.start_time),
        completion_time=_time(summary.completion_time),
    )
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


def _cut(text: str | None, limit: int = MAX_TEXT) -> str | None:
    """``text`` within the CRD's bound on status strings."""
    if text is None or len(text) <= limit:
        return text
    return text[:limit - 20] + " ... (cut)"


def improvement(value: float, baseline: float) -> str | None:
    """The relative change ``value`` vs ``baseline`` as ``-34%`` / ``+12%``."""
    if not (math.isfinite(value) and math.isfinite(baseline)) or baseline == 0:
        return None
    pct = round((value - baseline) / abs(baseline) * 100)
    return "0%" if pct == 0 else f"{pct:+d}%"


def _point(t: TrialRecord, baseline: TrialRecord | None = None,
           objectives: Sequence[tuple[str, str]] = ()) -> TrialPoint:
    change = None  # the baseline's own point reads 0% (results.improvement says the same)
    if baseline is not None and objectives:
        key = objectives[0][0]
        if key in t.metrics and key in baseline.metrics:
            change = improvement(t.metrics[key], baseline.metrics[key])
    return TrialPoint(trial=t.number, parameters=dict(t.params), metrics=_finite(t.metrics),
                      flags=flags_line(t.params), improvement=change,
                      repeats=list(t.repeats) or None, noisy=list(t.noisy) or None)


def _finite(metrics: Mapping[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if math.isfinite(v)}


def _time(t: datetime | str | None) -> str | None:
    if t is None or isinstance(t, str):
        return t
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(conditions: Sequence[Mapping[str, Any]], type: str, status: bool | str,
                  reason: str, message: str, generation: int | None,
                  now: datetime | str) -> list[dict[str, Any]]:
    """A copy of ``conditions`` with condition ``type`` set. ``lastTransitionTime`` changes only
    when the status flips (or the condition is new); reason, message and observedGeneration
    are always updated."""
    value = ("True" if status else "False") if isinstance(status, bool) else status
    if value not in ("True", "False", "Unknown"):
        raise ValueError(f"condition status must be True, False or Unknown (got {status!r})")
    out: list[dict[str, Any]] = []
    found = False
    for c in conditions:
        c = dict(c)
        if c.get("type") == type:
            found = True
            if c.get("status") != value or "lastTransitionTime" not in c:
                c["lastTransitionTime"] = _time(now)
            c.update(status=value, reason=reason, message=message)
            if generation is not None:
                c["observedGeneration"] = generation
        out.append(c)
    if not found:
        new: dict[str, Any] = {"type": type, "status": value, "reason": reason, "message": message,
                               "lastTransitionTime": _time(now)}
        if generation is not None:
            new["observedGeneration"] = generation
        out.append(new)
    return out
