"""The result model of a study: every trial as a
:class:`~chunktune.core.study_records.TrialRecord`, the baseline, the best configuration and the
Pareto front, read back from the study's trials; and the
:class:`~chunktune.core.study_records.StudySummary` the status is rendered from.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna

from chunktune.api.status import improvement
from chunktune.core.steps import LIMIT_USE
from chunktune.core.study_records import StudySummary, TrialRecord
from chunktune.core.trials import TrialState
from chunktune.tuning import study as st
from chunktune.tuning.objectives import ConstraintDef, ObjectiveDef
from chunktune.tuning.results.merge import config_key, merge
from chunktune.tuning.results.noise import engine_estimate, host_disturbed


@dataclass(frozen=True)
class Results:
    trials: list[TrialRecord]
    objectives: list[ObjectiveDef]
    constraints: list[ConstraintDef]
    baseline: int | None
    best: int | None
    pareto: list[int]
    merged: dict[int, TrialRecord] = field(default_factory=dict)
    """Configurations measured more than once, by each measuring trial's number: one record
    of their mean (:func:`merge`). The baseline, the best and the Pareto front are these."""
    no_result: str | None = None
    """Why no trial produced a result, when none did (:func:`no_result`); None otherwise."""

    def trial(self, number: int | None) -> TrialRecord | None:
        """Trial ``number`` as measured (one measurement)."""
        for t in self.trials:
            if t.number == number:
                return t
        return None

    def configuration(self, number: int | None) -> TrialRecord | None:
        """Trial ``number``'s configuration: the mean of its measurements when it was measured
        more than once, else the trial itself."""
        if number is not None and number in self.merged:
            return self.merged[number]
        return self.trial(number)

    @property
    def best_trial(self) -> TrialRecord | None:
        return self.configuration(self.best)

    @property
    def baseline_trial(self) -> TrialRecord | None:
        """The engine's defaults as measured: the mean of their measurements, under their own
        flags and number (a :func:`merge` group shows its most permissive configuration, which
        may not be the defaults)."""
        rec, own = self.configuration(self.baseline), self.trial(self.baseline)
        if rec is not None and own is not None and rec.params != own.params:
            rec = dataclasses.replace(rec, number=own.number, params=own.params)
        return rec

    def improvement(self) -> str | None:
        """The first objective's change from the baseline to the best (``-34%``)."""
        b, base = self.best_trial, self.baseline_trial
        if b is None or base is None:
            return None
        k = self.objectives[0].key
        if k not in b.metrics or k not in base.metrics:
            return None
        return improvement(b.metrics[k], base.metrics[k])


def record(t: optuna.trial.FrozenTrial) -> TrialRecord:
    state = st.trial_state(t)
    metrics = {k: float(v) for k, v in (t.user_attrs.get(st.ATTR_METRICS) or {}).items()
               if isinstance(v, int | float) and math.isfinite(v)}
    ok = (all(v <= 0 for v in t.constraints.values()) if t.constraints
          else state == TrialState.COMPLETE)
    reason = t.user_attrs.get(st.ATTR_REASON)
    if state == TrialState.COMPLETE and not ok and not reason:
        reason = "SLOViolated"
    predicted = {k: float(v) for k, v in (t.user_attrs.get(st.ATTR_PREDICTED) or {}).items()
                 if isinstance(v, int | float) and math.isfinite(v)}
    steps = t.user_attrs.get(st.ATTR_STEPS) or {}
    band = steps.get("itl_band_s")
    # studies from before max_running was kept have only the tokens' peak
    peak = {flag: int(steps[f]) for flag, f in LIMIT_USE.items()
            if isinstance(steps.get(f), int) and steps[f] > 0}
    return TrialRecord(number=t.number, params=st.point_of(t), state=state, reason=reason,
                       metrics=metrics, constraints_ok=ok, phase=t.user_attrs.get(st.ATTR_PHASE),
                       predicted=predicted,
                       itl_band=(float(band[0]), float(band[1])) if band else None, peak=peak)


def collect(study: optuna.Study, objectives: Sequence[ObjectiveDef],
            constraints: Sequence[ConstraintDef]) -> Results:
    return collect_trials(study.get_trials(deepcopy=False), objectives, constraints)


def collect_trials(study_trials: Sequence[optuna.trial.FrozenTrial],
                   objectives: Sequence[ObjectiveDef],
                   constraints: Sequence[ConstraintDef]) -> Results:
    """:func:`collect` over a study's trials as given (a bench re-reading stored studies
    passes them with what today's step-log summary adds)."""
    frozen = [t for t in study_trials if t.state != optuna.trial.TrialState.WAITING]
    trials = [record(t) for t in frozen]
    baseline = next((t.number for t in frozen if t.user_attrs.get(st.ATTR_BASELINE)
                     and st.trial_state(t) != TrialState.FAIL), None)
    merged = merge(trials)
    # one candidate per configuration: a configuration measured several times competes with
    # the mean of its measurements (a single lucky run of it does not)
    firsts = {m.repeats[0] for m in merged.values()}
    feasible = [merged.get(t.number, t) for t in trials
                if (t.number not in merged or t.number in firsts)
                and t.state == TrialState.COMPLETE]
    feasible = [t for t in feasible if t.constraints_ok
                and all(o.key in t.metrics for o in objectives)]
    best = None
    pareto: list[int] = []
    if feasible:
        if len(objectives) == 1:
            o = objectives[0]
            pick = min if o.direction == "minimize" else max
            best = pick(feasible, key=lambda t: t.metrics[o.key]).number
        else:
            pareto = _pareto(feasible, objectives)
            # the best single point of a front: the first objective's best on the front
            o = objectives[0]
            front = [t for t in feasible if t.number in pareto]
            pick = min if o.direction == "minimize" else max
            best = pick(front, key=lambda t: t.metrics[o.key]).number
    return Results(trials, list(objectives), list(constraints), baseline, best, pareto, merged,
                   no_result(frozen))


#: A recorded start-up failure's hint (:meth:`EngineStartupError.describe`).
_HINT = re.compile(r"\(hint: (.*)\)\s*$", re.S)


def no_result(trials: Sequence[optuna.trial.FrozenTrial]) -> str | None:
    """Why none of ``trials`` produced a result (measured metrics; a duplicate's copied ones
    do not count), or None when one did or none ended: each state and reason with its count,
    most frequent first, and the most frequent one's hint (``no trial produced a result: 31
    SKIPPED PredictedEngineOOM: the model's weights alone ... do not fit ...``)."""
    ended = [t for t in trials if st.trial_state(t) not in (TrialState.RUNNING,
                                                               TrialState.WAITING)]
    if not ended or any(st.trial_state(t) != TrialState.SKIPPED
                        and t.user_attrs.get(st.ATTR_METRICS) for t in ended):
        return None
    counts = Counter(f"{st.trial_state(t)} {t.user_attrs.get(st.ATTR_REASON) or ''}".strip()
                     for t in ended)
    top = counts.most_common(1)[0][0]
    hint = next((m.group(1) for t in ended
                 if f"{st.trial_state(t)} {t.user_attrs.get(st.ATTR_REASON) or ''}".strip()
                 == top and (m := _HINT.search(str(t.user_attrs.get(st.ATTR_MESSAGE) or "")))),
                None)
    return ("no trial produced a result: "
            + ", ".join(f"{n} {what}" for what, n in counts.most_common())
            + (f" ({hint})" if hint else ""))



def recheck_order(results: Results) -> list[TrialRecord]:
    """The measured feasible configurations, best first by the first objective (each once, as
    the mean of its measurements; for several objectives the Pareto front first): what a
    recheck measures again. A configuration whose every measurement the host disturbed
    (:func:`host_disturbed`) has no usable figure of its own: for a clients' ITL p99 it is
    ranked by what its engine's own ITL p99 (``engine_itl_p99``, from its step log, which the
    host does not touch) gives at the ratio of the two in the study's undisturbed trials
    (:func:`engine_estimate`); otherwise, where the twin predicted it, by that prediction."""
    o = results.objectives[0]
    sign = 1.0 if o.direction == "minimize" else -1.0
    seen: set[str] = set()
    out = []
    for t in results.trials:
        c = results.configuration(t.number)
        if c is None or c.state != TrialState.COMPLETE or not c.constraints_ok \
                or o.key not in c.metrics:
            continue
        k = config_key(c)
        if k not in seen:
            seen.add(k)
            out.append(c)

    def value(c: TrialRecord) -> float:
        members = [results.trial(n) for n in c.repeats] if c.repeats else [c]
        if all(m is not None and host_disturbed(m) for m in members):
            est = engine_estimate(results.trials, [m for m in members if m is not None], o.key)
            if est is not None:
                return est
            if o.key in c.predicted:
                return c.predicted[o.key]
        return c.metrics[o.key]

    return sorted(out, key=lambda c: (bool(results.pareto) and c.number not in results.pareto,
                                      sign * value(c)))


def _pareto(trials: list[TrialRecord], objectives: Sequence[ObjectiveDef]) -> list[int]:
    def vec(t: TrialRecord) -> list[float]:
        return [t.metrics[o.key] * (1 if o.direction == "minimize" else -1) for o in objectives]

    vs = {t.number: vec(t) for t in trials}
    front = []
    for n, v in vs.items():
        dominated = any(all(a <= b for a, b in zip(w, v, strict=True)) and w != v
                        for m, w in vs.items() if m != n)
        if not dominated:
            front.append(n)
    return sorted(front)


def summary(results: Results, phase: str, max_trials: int | None = None,
            **kw: Any) -> StudySummary:
    """The input of :func:`chunktune.api.status.render_status`."""
    return StudySummary(
        phase=phase, trials=results.trials,
        objectives=[(o.key, o.direction) for o in results.objectives],
        baseline=results.baseline, best=results.best, pareto=results.pareto,
        max_trials=max_trials, key_metrics=[c.key for c in results.constraints],
        merged=results.merged, **kw)

