"""What a twin-first study reports of its twin: the confirmed trials' predictions beside their
measurements, the twin's error per metric and per goal, and the rounds (``result.json``'s
``twin``; ``status.twin``'s errors).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import optuna

from chunktune.core.steps import outside_engine
from chunktune.core.study_records import TrialRecord
from chunktune.core.trials import TrialState
from chunktune.tuning import study as st
from chunktune.tuning.objectives import ConstraintDef, ObjectiveDef
from chunktune.tuning.results.model import record
from chunktune.tuning.results.trust import prediction_errors, trust_errors
from chunktune.tuning.strategies.twin_state import TwinState

#: Standard latency metrics whose twin error is reported besides the goals'.
REPORTED = tuple(f"{m}_p{p}" for m in ("ttft", "itl", "e2e") for p in (50, 99))


def confirmed(study: optuna.Study) -> list[TrialRecord]:
    """The real trials that carry a twin prediction and were measured."""
    return [r for r in (record(t) for t in study.get_trials(deepcopy=False)
                        if t.user_attrs.get(st.ATTR_PREDICTED))
            if r.state == TrialState.COMPLETE]


def twin_error(study: optuna.Study) -> dict[str, float]:
    """Median ``|predicted / measured - 1|`` per metric over the confirmed trials."""
    errs = prediction_errors(confirmed(study))
    return {k: statistics.median(abs(x) for x in v) for k, v in errs.items()}


def goal_errors(study: optuna.Study, objectives: Sequence[ObjectiveDef],
                constraints: Sequence[ConstraintDef]) -> dict[str, float]:
    """The twin's error per goal metric as the trust check judges it
    (:func:`~chunktune.tuning.results.trust.trust_errors`: an objective's relative error, a
    constraint's miss measured against its bound)."""
    return trust_errors(confirmed(study), objectives, constraints)


def overall_error(study: optuna.Study, objectives: Sequence[ObjectiveDef],
                  constraints: Sequence[ConstraintDef]) -> float | None:
    """The twin's error on the goals: the largest of :func:`goal_errors` (None before any
    confirmation). The largest, not a median over metrics: a twin that predicts the
    constraints well but misses the objective cannot rank configurations."""
    errs = goal_errors(study, objectives, constraints)
    return max(errs.values()) if errs else None



def twin_report(study: optuna.Study, objectives: Sequence[ObjectiveDef],
                constraints: Sequence[ConstraintDef], max_twin_error: float,
                ) -> dict[str, Any]:
    """What ``result.json`` keeps of a twin-first study: per round the profile's fit and what
    was confirmed, per confirmed trial the prediction beside the measurement, and the twin's
    error (per metric, and per goal metric as the trust decision judges it: ``goal_error``)."""
    state = TwinState.read(study)
    rounds: list[dict[str, Any]] = []
    for r in sorted(state.rounds):
        rnd = state.rounds[r]
        if rnd.profile is None:
            break
        prof, end = rnd.profile, rnd.end
        rounds.append({"round": r, "fit": prof.get("fit"), "step_gap_s": prof.get("step_gap_s"),
                       "server_overhead_s": prof.get("server_overhead_s"),
                       "simulated_trials": end.simulated if end is not None else None,
                       "confirmed": rnd.confirm,
                       "best": end.best if end is not None else None,
                       "error": end.error if end is not None else None})
    rows = []
    for rec in confirmed(study):
        row = {"trial": rec.number, "params": dict(rec.params),
               "predicted": dict(rec.predicted),
               "measured": {k: rec.metrics[k] for k in rec.predicted if k in rec.metrics}}
        host = outside_engine(rec.metrics)
        if host:
            row["outside_engine"] = host  # not counted in twin_error
        rows.append(row)
    real = [t for t in study.get_trials(deepcopy=False)
            if st.trial_state(t) in (TrialState.COMPLETE, TrialState.INFEASIBLE,
                                     TrialState.PRUNED, TrialState.FAIL)
            and t.user_attrs.get(st.ATTR_REASON) != "Interrupted"]
    goal = goal_errors(study, objectives, constraints)
    return {"strategy": "twin", "rounds": rounds, "confirmed": rows,
            "twin_error": twin_error(study), "goal_error": goal,
            "overall_error": max(goal.values()) if goal else None,
            "untrusted": state.untrusted,
            "max_twin_error": max_twin_error, "real_trials": len(real),
            "simulated_trials": sum(int(r["simulated_trials"] or 0) for r in rounds)}
