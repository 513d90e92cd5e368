"""Re-tuning a deployment whose workload drifted (``spec.retune``): the re-tune's study, how it
is warm-started from the previous one, and whether its answer replaces the running
configuration. No Kubernetes here: :mod:`chunktune.k8s.retuner` watches and applies.

Each re-tune is a study of its own in the same storage (:func:`study_name`, ``<ns>/<name>#retune-
<round>``) over the same engine, space and goals, replaying the workload derived when it started
(stored in the study before its tuner opens, :data:`~chunktune.tuning.workload_source.
ATTR_WORKLOAD`). :func:`seed` queues, once:

* the **running configuration** as the study's baseline (trial 0): what is deployed, measured
  under the new workload;
* with ``strategy: real``, the previous study's ``warmStart`` best measured configurations;
* with ``strategy: twin``, the previous study's twin calibration when it has one (the engine
  did not change, only its traffic): the running configuration is the only calibration trial
  and round 1 searches the twin with the previous profile; without one, the calibration
  trials are the running configuration and the previous best ones (points spread over the
  space fill the rest).

The study ends with ``confirmTrials`` real re-measurements of its best (a ``recheck``), and
:func:`decide` compares that configuration's mean with the running configuration's
measurement: it is applied when it meets every constraint and beats the running one by
``minGain`` on the first objective, or when the running one misses a constraint it meets.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import optuna

from chunktune.api.status import improvement
from chunktune.api.v1alpha1 import ChunkedPrefillTuning, RetuneSpec
from chunktune.core.progress import TwinPhase
from chunktune.core.study_records import TrialRecord
from chunktune.core.trials import TrialState
from chunktune.metrics.derive import DriftLimits
from chunktune.tuning import study as st
from chunktune.tuning.results.model import Results, collect, recheck_order
from chunktune.tuning.strategies.twin_first import TwinFirst
from chunktune.tuning.strategies.twin_points import calibration_points
from chunktune.tuning.strategies.twin_state import TwinState
from chunktune.tuning.tuner import Tuner

#: Study user attribute of a re-tune: ``{"round", "reasons", "running", "seeded"}``.
ATTR_RETUNE = "chunktune_retune"


def study_name(tuning: ChunkedPrefillTuning, round_: int) -> str:
    """The re-tune's study name; round 0 is the first study."""
    base = st.study_name(tuning)
    return base if round_ == 0 else f"{base}#retune-{round_}"


def limits(spec: RetuneSpec) -> DriftLimits:
    return DriftLimits(rate=spec.drift.rate, prompt=spec.drift.prompt_length,
                       long_share=spec.drift.long_share)


def twin_profile(study: optuna.Study) -> dict[str, Any] | None:
    """The last calibration profile a twin-first study fitted, if any."""
    rounds = TwinState.read(study).rounds
    return next((rounds[r].profile for r in sorted(rounds, reverse=True)
                 if rounds[r].profile is not None), None)


def retune_tuning(tuning: ChunkedPrefillTuning, spec: RetuneSpec, round_: int,
                  reuse_profile: bool) -> ChunkedPrefillTuning:
    """The spec a re-tune runs: the tuning's, with the re-tune's strategy and budget
    (``maxTrials`` plus the confirmation trials), the confirmation as a recheck, and trial
    objects named ``<name>-r<round>-t<n>``."""
    out = tuning.model_copy(deep=True)
    s = out.spec
    strategy = s.strategy.model_copy(update={
        "name": spec.strategy, "recheck_trials": spec.confirm_trials})
    if spec.strategy == "twin" and reuse_profile:
        strategy = strategy.model_copy(update={"refine_rounds": 0})
    s.strategy = strategy
    s.budget = s.budget.model_copy(update={
        "max_trials": spec.max_trials + spec.confirm_trials, "patience": None,
        "max_duration": None})
    s.retune = None
    out.metadata = out.metadata.model_copy(update={"name": f"{tuning.metadata.name}-r{round_}"})
    return out


def seed(tuner: Tuner, running: Mapping[str, Any], previous: optuna.Study | None,
         spec: RetuneSpec, reasons: list[str], round_: int) -> bool:
    """Queue the re-tune's first trials (once: a resumed study is left as it is); returns
    whether it queued them."""
    study = tuner.study
    if (study.user_attrs.get(ATTR_RETUNE) or {}).get("seeded"):
        return False
    point = dict(running)
    warm = [p for p in best_points(previous, tuner) if p != point][:spec.warm_start]
    if isinstance(tuner.strategy, TwinFirst):
        # NOTE: written through the strategy's state (read when the tuner opened), so that
        # its run finds the calibration queued and round 1's profile fitted.
        state = tuner.strategy.state
        profile = twin_profile(previous) if previous is not None else None
        if profile is not None:
            points = [point]
            state.set_profile(study, 1, profile)
        else:
            k = tuner.spec.strategy.calibration_trials
            spread = [p for p in calibration_points(tuner, k + len(warm), tuner.context,
                                                    tuner.spec.sampler.seed)[1:]
                      if p != point and p not in warm]
            points = [point, *warm, *spread][:k]
        for i, p in enumerate(points):
            tuner.enqueue(p, {st.ATTR_PHASE: TwinPhase.CALIBRATE.value,
                              **({st.ATTR_BASELINE: True} if i == 0 else {})})
        state.set_calibration(study, points)
    else:
        tuner.enqueue(point, {st.ATTR_BASELINE: True})
        for p in warm:
            tuner.enqueue(p, {})
    study.set_user_attr(ATTR_RETUNE, {"round": round_, "reasons": reasons,
                                      "running": point, "seeded": True})
    return True


def best_points(previous: optuna.Study | None, tuner: Tuner) -> list[dict[str, Any]]:
    """The previous study's measured feasible configurations, best first."""
    if previous is None:
        return []
    res = collect(previous, tuner.objectives, tuner.constraints)
    names = {p.name for p in tuner.params}
    out: list[dict[str, Any]] = []
    for t in recheck_order(res):
        p = {k: v for k, v in t.params.items() if k in names}
        if p not in out:
            out.append(p)
    return out


@dataclass(frozen=True)
class Decision:
    """What a finished re-tune concluded."""

    apply: bool
    message: str
    best: dict[str, Any] | None = None
    metric: str | None = None
    before: float | None = None
    after: float | None = None
    gain: str | None = None
    confirmed_by: tuple[int, ...] = ()


def decide(results: Results, min_gain: float) -> Decision:
    """Whether the re-tune's best replaces the running configuration (its baseline): only
    when the best was measured again (the confirmation: its mean over every measurement),
    meets every constraint, and beats the running configuration by ``min_gain`` on the first
    objective (relative), or the running one misses a constraint."""
    obj = results.objectives[0]
    key = obj.key
    base, best = results.baseline_trial, results.best_trial
    before = _value(base, key)
    if best is None:
        return Decision(False, "no configuration met every constraint under the new workload",
                        metric=key, before=before)
    after = _value(best, key)
    gain = improvement(after, before) if after is not None and before is not None else None
    found = Decision(False, "", best=dict(best.params), metric=key, before=before, after=after,
                     gain=gain, confirmed_by=best.repeats or (best.number,))

    def said(apply: bool, message: str) -> Decision:
        return dataclasses.replace(found, apply=apply, message=message)

    if base is not None and dict(best.params) == dict(base.params):
        return said(False, "the running configuration is still the best")
    if len(best.repeats) < 2:
        return said(False, f"the best (trial {best.number}) was not measured again, so it is "
                           "not confirmed")
    running_ok = base is not None and base.state == TrialState.COMPLETE and base.constraints_ok
    if not running_ok:
        why = ("the running configuration misses a constraint under the new workload"
               if base is not None and base.state == TrialState.COMPLETE
               else "the running configuration was not measured")
        return said(True, f"{why}; the best meets them")
    assert before is not None and after is not None
    sign = 1.0 if obj.direction == "minimize" else -1.0
    if sign * after < sign * before - abs(before) * min_gain:
        return said(True, f"{key} {gain} against the running configuration, confirmed by "
                          f"{len(best.repeats)} measurements")
    return said(False, f"{key} {gain or '0%'} against the running configuration: less than "
                       f"minGain {min_gain:.0%}")


def _value(t: TrialRecord | None, key: str) -> float | None:
    if t is None:
        return None
    v = t.metrics.get(key)
    return v if v is not None and math.isfinite(v) else None


__all__ = ["ATTR_RETUNE", "Decision", "best_points", "decide", "limits", "retune_tuning", "seed",
           "study_name", "twin_profile"]
