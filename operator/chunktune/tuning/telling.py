"""Telling Optuna a trial's end: what a :class:`~chunktune.core.trials.TrialResult` becomes in
the study (its user attributes, its constraints, its Optuna state and values).

Apart from the loop that asks and launches (:mod:`chunktune.tuning.runner`), as Optuna keeps
``study/_tell.py`` apart from ``study/_optimize.py``. A result tells the study and returns the
:class:`~chunktune.core.progress.TrialEvent` that says so; the runner emits it.

Start-up failures (``INFEASIBLE``) and points recorded without launching (``SKIPPED``) are
told as complete trials whose ``engine_starts`` constraint is violated, with the worst
objective values seen so far as placeholders, so constrained samplers learn where the engine
does not start. SLOs are further constraints. A trial whose point the search space cannot
record (``st.ATTR_HIDDEN``) is told as FAIL: the sampler never learns a value it did not run.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.trial import TrialState as OptunaState

from chunktune.core.progress import EventKind, TrialEvent
from chunktune.core.steps import (
    StepSummary,
    engine_itl,
    host_added,
    on_cliff,
    outside_engine,
)
from chunktune.core.trials import TrialResult, TrialState
from chunktune.tuning import study as st
from chunktune.tuning.objectives import (
    STARTUP_CONSTRAINT,
    ConstraintDef,
    ObjectiveDef,
    objective_values,
)

log = logging.getLogger(__name__)


def tell(study: optuna.Study, trial: optuna.Trial, point: dict[str, Any], result: TrialResult,
         objectives: Sequence[ObjectiveDef], constraints: Sequence[ConstraintDef]) -> TrialEvent:
    """Record ``result`` on ``trial`` and tell ``study``; the ``finished`` event to emit."""
    baseline = bool(trial.user_attrs.get(st.ATTR_BASELINE))
    if result.steps:
        summary = StepSummary.of(result.steps)
        trial.set_user_attr(st.ATTR_STEPS, {"file": result.steps_file,
                                            **dataclasses.asdict(summary)})
        # (the step log's KV peak: the backend that kept the log took it,
        # chunktune.backends.base.take_kv_peak_from_steps)
        itl = engine_itl(result.steps)
        if itl is not None and result.state == TrialState.COMPLETE:
            # a backend that knows its engine's steps better (the simulator, which leaves a
            # calibrated gap between steps out) has set it already
            result.metrics.setdefault("engine_itl_p99", itl)
            why = host_added(result.metrics, summary.itl_band_s)
            if why:
                log.warning("trial %d: %s; its latencies are noisy, not the configuration's",
                            trial.number, why)
            cliff = on_cliff(summary.itl_band_s)
            if cliff:
                log.info("trial %d: ITL p99 on a cliff: %s%s", trial.number, cliff,
                         "; the clients' p99 landed on the long steps"
                         if outside_engine(result.metrics) and not why else "")
    if result.state == TrialState.INFEASIBLE:
        return tell_startup_failure(study, trial, point, TrialState.INFEASIBLE,
                                    result.reason or "Startup", result.message or "",
                                    objectives, constraints)
    trial.set_user_attr(st.ATTR_METRICS, result.metrics)
    if result.server:
        trial.set_user_attr(st.ATTR_SERVER, _jsonable(result.server))
    if result.reason:
        trial.set_user_attr(st.ATTR_REASON, result.reason)
    if result.message:
        trial.set_user_attr(st.ATTR_MESSAGE, result.message[-2000:])
    values = objective_values(objectives, result.metrics)
    if result.state == TrialState.COMPLETE and values is None:
        result.state = TrialState.FAIL
        trial.set_user_attr(st.ATTR_REASON, "NoMeasurements")
        trial.set_user_attr(st.ATTR_MESSAGE, "no request completed, so the objectives "
                            "could not be measured")
    trial.set_user_attr(st.ATTR_STATE, result.state.value)
    if result.state == TrialState.COMPLETE:
        trial.set_constraint(STARTUP_CONSTRAINT, -1.0)
        for c in constraints:
            trial.set_constraint(c.key, c.violation(result.metrics))
        if trial.user_attrs.get(st.ATTR_HIDDEN):
            study.tell(trial, state=OptunaState.FAIL)
        else:
            study.tell(trial, values)
    elif result.state == TrialState.PRUNED:
        study.tell(trial, state=OptunaState.PRUNED)
    else:
        study.tell(trial, state=OptunaState.FAIL)
    return TrialEvent(EventKind.FINISHED, trial.number, point, result.state, result.reason,
                      result.message, result.metrics, baseline)


def tell_startup_failure(study: optuna.Study, trial: optuna.Trial, point: dict[str, Any],
                         state: TrialState, reason: str, message: str,
                         objectives: Sequence[ObjectiveDef],
                         constraints: Sequence[ConstraintDef]) -> TrialEvent:
    """A point the engine cannot start at: feasible = False through the constraint, with
    the worst objective values seen so far as placeholders (what the samplers compare); the
    ``finished`` event to emit."""
    baseline = bool(trial.user_attrs.get(st.ATTR_BASELINE))
    trial.set_user_attr(st.ATTR_STATE, state.value)
    trial.set_user_attr(st.ATTR_REASON, reason)
    trial.set_user_attr(st.ATTR_MESSAGE, message[-2000:])
    trial.set_constraint(STARTUP_CONSTRAINT, 1.0)
    for c in constraints:
        trial.set_constraint(c.key, 1.0)
    if trial.user_attrs.get(st.ATTR_HIDDEN):
        study.tell(trial, state=OptunaState.FAIL)
    else:
        study.tell(trial, placeholder_values(study, objectives))
    return TrialEvent(EventKind.FINISHED, trial.number, point, state, reason, message,
                      baseline=baseline)


def placeholder_values(study: optuna.Study, objectives: Sequence[ObjectiveDef]) -> list[float]:
    """Per objective, twice as bad as the worst COMPLETE value seen (a fixed bad value before
    any): what a trial whose engine did not start is told."""
    trials = study.get_trials(deepcopy=False)
    out = []
    for i, o in enumerate(objectives):
        seen = [t.values[i] for t in trials
                if t.state == OptunaState.COMPLETE and t.values is not None
                and st.trial_state(t) == TrialState.COMPLETE]
        if seen:
            worst = max(seen) if o.direction == "minimize" else min(seen)
            out.append(worst * 2 if o.direction == "minimize" else worst / 2)
        else:
            out.append(1e4 if o.direction == "minimize" else 0.0)
    return out


def _plain(v: Any) -> tuple[bool, Any]:
    """``(True, v)`` for a JSON value (scalars, and lists and string-keyed dicts of them, the
    unplain entries of a dict left out); ``(False, None)`` for anything else."""
    if isinstance(v, int | float | str | bool) or v is None:
        return True, v
    if isinstance(v, dict):
        return True, _jsonable(v)
    if isinstance(v, list | tuple):
        items = [_plain(x) for x in v]
        return (True, [x for _, x in items]) if all(ok for ok, _ in items) else (False, None)
    return False, None


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``d`` a study attribute can keep (:func:`_plain`), nested ones too (the
    engine's start-up figures, ``server["engine"]``)."""
    out = {}
    for k, v in d.items():
        ok, plain = _plain(v)
        if ok and isinstance(k, str):
            out[k] = plain
    return out
