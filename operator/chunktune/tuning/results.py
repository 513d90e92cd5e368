"""What a study found: baseline, best configuration, Pareto front, every trial — as tables,
``result.json``, plots, and the :class:`~chunktune.api.status.StudySummary` the status is
rendered from. Pure functions of the study's trials (read back from storage), so
``chunktune results`` prints the same table from storage alone.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from chunktune.api.metrics import format_value
from chunktune.api.status import StudySummary, TrialRecord, improvement
from chunktune.core.flags import flags_line
from chunktune.core.steps import BAND_WIDTH, LIMIT_USE, host_added, on_cliff, outside_engine
from chunktune.core.trials import TrialState
from chunktune.tuning import study as st
from chunktune.tuning.objectives import ConstraintDef, ObjectiveDef


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
    return Results(trials, list(objectives), list(constraints), baseline, best, pareto, merged)


def _config_key(t: TrialRecord) -> str:
    """What tells one configuration from another (its parameters, in a fixed order)."""
    return json.dumps(sorted(t.params.items()))


def host_disturbed(t: TrialRecord) -> bool:
    """The trial's latencies were set outside the engine and its own ITL does not explain
    them (:func:`~chunktune.core.steps.host_added`)."""
    return host_added(t.metrics, t.itl_band) is not None


#: Runs of configurations that differ in limits none of them reached count as runs of one
#: behaviour only while the KV cache stayed below this share (``kv_cache_usage_peak``): the
#: limits also size the engine's start-up reservations, and so its KV capacity, which matters
#: only once the cache fills.
KV_HEADROOM = 0.95


def unbound(t: TrialRecord) -> dict[str, int]:
    """The limit flags of ``t``'s configuration its run never reached: flag -> the most the
    busiest step used (below the flag's value). With any value above that use the run would
    have been the same."""
    out = {}
    for flag, used in t.peak.items():
        v = t.params.get(flag)
        if isinstance(v, int | float) and not isinstance(v, bool) and used < v:
            out[flag] = used
    return out


def runs_as(t: TrialRecord, other: TrialRecord) -> bool:
    """``t``'s run is a run of ``other``'s configuration too: the same configuration, or one
    that differs only in limits ``t``'s run stayed below ``other``'s value of (and its own),
    with the KV cache never near full (:data:`KV_HEADROOM`)."""
    if t.params == other.params:
        return True
    if set(t.params) != set(other.params):
        return False
    kv = t.metrics.get("kv_cache_usage_peak")
    if kv is None or kv >= KV_HEADROOM:
        return False
    free = unbound(t)
    for flag, v in t.params.items():
        w = other.params[flag]
        if v == w:
            continue
        if flag not in free or not isinstance(w, int | float) or not free[flag] < w:
            return False
    return True


def merge(trials: Sequence[TrialRecord]) -> dict[int, TrialRecord]:
    """The configurations measured by more than one completed trial (a ``recheck`` measures
    the best ones again), each with the runs of configurations that behaved the same: ones
    that differ only in limits (``max-num-seqs``, ``max-num-batched-tokens``) no run reached
    (:func:`unbound`, from the step log), such a run being a run of either configuration.
    Per group one record with the parameters of its most permissive configuration (the largest
    limits: every run in the group is a run of it), numbered as that configuration's first
    measurement, with the mean of each metric every measurement has, feasible only when every
    measurement was (an SLO missed once is missed), and :attr:`TrialRecord.repeats` the
    measuring trials; keyed by each of those trials' numbers. A measurement the host disturbed
    (:func:`host_disturbed`) is left out (:attr:`TrialRecord.noisy`) when another one was not:
    its latencies say more about the host than about the configuration."""
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    parent = list(range(len(done)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, a in enumerate(done):
        for j in range(i):
            b = done[j]
            if a.params == b.params or (runs_as(a, b) and runs_as(b, a)):
                parent[root(i)] = root(j)
    groups: dict[int, list[TrialRecord]] = {}
    for i, t in enumerate(done):
        groups.setdefault(root(i), []).append(t)
    out: dict[int, TrialRecord] = {}
    for g in groups.values():
        # the most permissive configuration; the runs that are not runs of it (a run that
        # reached a smaller limit, linked through its configuration's other runs) drop out
        # (members differ only in numeric limits: the flags runs_as lets differ)
        top = {f: max(float(m.params[f]) for m in g) for f in g[0].params
               if len({m.params[f] for m in g}) > 1}
        rep = max(g, key=lambda t: (sum(float(t.params[f]) == v for f, v in top.items()),
                                    -t.number))
        g = [t for t in g if runs_as(t, rep)]
        if len(g) < 2:
            continue
        noisy = [t for t in g if host_disturbed(t)]
        kept = [t for t in g if t not in noisy] or g
        keys = set.intersection(*(set(t.metrics) for t in kept))
        first = min((t for t in g if t.params == rep.params), key=lambda t: t.number)
        rec = dataclasses.replace(
            first, metrics={k: statistics.fmean(t.metrics[k] for t in kept)
                            for k in kept[0].metrics if k in keys},
            constraints_ok=all(t.constraints_ok for t in kept),
            reason=next((t.reason for t in kept if not t.constraints_ok), kept[0].reason),
            predicted=next((t.predicted for t in g if t.predicted), first.predicted),
            repeats=tuple(t.number for t in g),
            noisy=tuple(t.number for t in noisy) if len(kept) < len(g) else ())
        for t in g:
            out[t.number] = rec
    return out


def measured_by(rec: TrialRecord, members: Sequence[TrialRecord] = ()) -> str:
    """``the mean of its 2 measurements: trials 4, 9`` (or which were left out as noisy), and,
    given the measuring trials (``members``), which of them ran another value of a limit that
    no run reached (:func:`merge`)."""
    if not rec.noisy:
        text = (f"the mean of its {len(rec.repeats)} measurements: trials "
                f"{', '.join(map(str, rec.repeats))}")
    else:
        kept = [n for n in rec.repeats if n not in rec.noisy]
        text = (f"the mean of trial{'s' if len(kept) > 1 else ''} {', '.join(map(str, kept))}; "
                f"trial{'s' if len(rec.noisy) > 1 else ''} {', '.join(map(str, rec.noisy))} "
                "left out as noisy")
    return text + same_behaviour(rec, members)


def same_behaviour(rec: TrialRecord, members: Sequence[TrialRecord]) -> str:
    """``; trial 26 ran max-num-seqs 16, a limit no run reached (at most 8 in a step)``: the
    measurements of ``rec`` (a :func:`merge` record) that ran other values of its limits."""
    others = [m for m in members if m.number in rec.repeats and m.params != rec.params]
    if not others:
        return ""
    parts = []
    for m in others:
        diff = [f for f, v in m.params.items() if v != rec.params.get(f)]
        parts.append(f"trial {m.number} ran " + ", ".join(f"{f} {m.params[f]}" for f in diff))
    flags = sorted({f for m in others for f, v in m.params.items() if v != rec.params.get(f)})
    used = [f"{f} {max(m.peak.get(f, 0) for m in members if m.number in rec.repeats)}"
            for f in flags]
    return (f"; {'; '.join(parts)}: limit{'s' if len(flags) > 1 else ''} no run reached "
            f"(the busiest step used {', '.join(used)}), so the same behaviour")


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
        k = _config_key(c)
        if k not in seen:
            seen.add(k)
            out.append(c)

    def value(c: TrialRecord) -> float:
        members = [results.trial(n) for n in c.repeats] if c.repeats else [c]
        if all(m is not None and host_disturbed(m) for m in members):
            est = engine_estimate(results, [m for m in members if m is not None], o.key)
            if est is not None:
                return est
            if o.key in c.predicted:
                return c.predicted[o.key]
        return c.metrics[o.key]

    return sorted(out, key=lambda c: (bool(results.pareto) and c.number not in results.pareto,
                                      sign * value(c)))


def engine_estimate(results: Results, runs: Sequence[TrialRecord], key: str) -> float | None:
    """What clients would have seen of ``key`` (a clients' ITL p99: ``itl_p99`` or a class's)
    in ``runs`` without the host's share: the mean of their ``engine_itl_p99`` times the median
    ratio of ``key`` to ``engine_itl_p99`` over the study's completed trials the host did not
    disturb (None for another metric, or with no such trial). On the CPU example that ratio is
    1.05-1.2 (the API server's and the client's share of an undisturbed run)."""
    if not key.endswith("itl_p99") or key.endswith("engine_itl_p99"):
        return None
    engine = [r.metrics["engine_itl_p99"] for r in runs if "engine_itl_p99" in r.metrics]
    ratios = [t.metrics[key] / t.metrics["engine_itl_p99"] for t in results.trials
              if t.state == TrialState.COMPLETE and not host_disturbed(t)
              and key in t.metrics and t.metrics.get("engine_itl_p99", 0.0) > 0]
    if not engine or not ratios:
        return None
    return statistics.fmean(engine) * statistics.median(ratios)


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


# ---- text --------------------------------------------------------------------------------------


def _fmt(key: str, v: float | None) -> str:
    return "-" if v is None else format_value(key, v)


def format_results(results: Results) -> str:
    lines: list[str] = []
    keys = [o.key for o in results.objectives] + [c.key for c in results.constraints
                                                  if c.key not in
                                                  [o.key for o in results.objectives]]
    best, base = results.best_trial, results.baseline_trial
    counts: dict[str, int] = {}
    for t in results.trials:
        counts[t.state] = counts.get(t.state, 0) + 1
    lines.append("trials: " + ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items())))
    if best is None:
        lines.append("no trial met every constraint: no best configuration")
        if base is not None:
            lines.append(f"baseline (trial {base.number}): {base.state} {base.reason or ''}")
        return "\n".join(lines)
    lines.append("")
    lines.append(f"best configuration: trial {best.number}" + (
        f" ({measured_by(best, results.trials)})" if best.repeats else ""))
    lines.append(f"  flags: {flags_line(dict(best.params))}")
    lines.append("")
    w = max(len(k) for k in keys) + 2
    lines.append(f"  {'metric':{w}} {'best':>12} {'baseline':>12} {'change':>8}")
    for k in keys:
        bv = best.metrics.get(k)
        basev = base.metrics.get(k) if base else None
        change = improvement(bv, basev) if (bv is not None and basev) else None
        lines.append(f"  {k:{w}} {_fmt(k, bv):>12} {_fmt(k, basev):>12} {change or '-':>8}")
    for c in results.constraints:
        met = c.violation(best.metrics) <= 0
        lines.append(f"  constraint {c.text()}: {'met' if met else 'VIOLATED'}")
    if base is not None:
        lines.append(f"  baseline = trial {base.number} (the engine's defaults: "
                     f"{flags_line(dict(base.params))}); state {base.state}"
                     + (f", {base.reason}" if base.reason else ""))
    if results.pareto:
        lines.append("")
        lines.append(f"Pareto front ({len(results.pareto)} trials):")
        head = "  trial  " + "  ".join(f"{o.key:>16}" for o in results.objectives) + "  flags"
        lines.append(head)
        for n in results.pareto:
            front = results.configuration(n)
            assert front is not None
            vals = "  ".join(f"{_fmt(o.key, front.metrics.get(o.key)):>16}"
                             for o in results.objectives)
            lines.append(f"  {n:>5}  {vals}  {flags_line(dict(front.params))}")
    lines += _twin_lines(results, keys)
    lines += _noise_lines(results)
    lines += _limit_lines(results)
    return "\n".join(lines)


def _limit_lines(results: Results) -> list[str]:
    """The searched limits no measured trial reached: on this workload their value did not
    matter (above what the busiest step used), and configurations that differ only there were
    measured as one (:func:`merge`)."""
    out = []
    for flag in LIMIT_USE:
        runs = [t for t in results.trials
                if t.state == TrialState.COMPLETE and flag in t.peak and flag in t.params]
        values = sorted({t.params[flag] for t in runs}, key=float)
        if len(values) < 2 or any(flag not in unbound(t) for t in runs):
            continue
        used = max(t.peak[flag] for t in runs)
        out += ["", f"unbound: no measured trial reached {flag} (the busiest step of "
                    f"{len(runs)} used {used}; values tried {', '.join(map(str, values))}): on "
                    f"this workload any value above {used} behaves the same, and "
                    "configurations differing only there count as one"]
    return out


def _twin_lines(results: Results, keys: list[str]) -> list[str]:
    """A twin-first study's confirmed trials: the twin's prediction beside the measurement,
    per goal metric, and the median error per metric."""
    rows = [t for t in results.trials if t.predicted and t.state == TrialState.COMPLETE]
    if not rows:
        return []
    keys = [k for k in keys if any(k in t.predicted for t in rows)]
    out = ["", f"twin: predicted vs measured ({len(rows)} confirmed trials; error = "
               "predicted / measured - 1)"]
    w = max(len(k) for k in keys) + 2 if keys else 8
    out.append(f"  {'trial':>5}  {'metric':{w}} {'predicted':>10} {'measured':>10} {'error':>7}")
    host, cliffs = [], []
    for t in rows:
        noisy = host_disturbed(t)
        if noisy:
            host.append(t.number)
        elif outside_engine(t.metrics):
            cliffs.append(t.number)
        for k in keys:
            p, m = t.predicted.get(k), t.metrics.get(k)
            if p is None or m is None:
                continue
            # a relative error needs a measurement above 0 (an error rate of 0 has none)
            e = f"{p / m - 1:+.0%}" if m > 0 and math.isfinite(p) else "-"
            # an ITL p99 on a cliff does not repeat: its error says little about the twin
            cliff = k.endswith("itl_p99") and on_cliff(t.itl_band) is not None
            out.append(f"  {t.number:>5}  {k:{w}} {_fmt(k, p):>10} {_fmt(k, m):>10} "
                       f"{e:>7}" + ("  (host)" if noisy else "") + ("  (cliff)" if cliff else ""))
    errs = prediction_errors(rows)
    med = {k: statistics.median(abs(x) for x in errs[k]) for k in keys if errs.get(k)}
    out.append("  median |error|: " + (", ".join(f"{k} {v:.0%}" for k, v in med.items())
                                       or "-"))
    trust = trust_errors(rows, results.objectives, results.constraints)
    goals = {o.key for o in results.objectives}
    bounds = {c.key: bound_of(c) for c in results.constraints
              if c.key not in goals and c.key in trust and c.key in keys}
    if bounds:
        out.append("  against the bound (what maxTwinError judges for a constraint): "
                   + ", ".join(f"{k} {trust[k]:.0%} (bound {_fmt(k, b)})"
                               for k, b in bounds.items()))
    if host:
        out.append(f"  (host): trial{'s' if len(host) > 1 else ''} "
                   f"{', '.join(map(str, host))} measured latencies set outside the engine "
                   "(clients' ITL p99 over twice the engine's own steps'): not counted in the "
                   "twin's error")
    if cliffs:
        out.append(f"  (cliff): trial{'s' if len(cliffs) > 1 else ''} "
                   f"{', '.join(map(str, cliffs))} clients' ITL p99 on the engine's long steps "
                   "(over twice its p99 over all tokens, inside its own band): not counted in "
                   "the twin's error either, since it does not repeat")
    return out


def prediction_errors(records: Sequence[TrialRecord]) -> dict[str, list[float]]:
    """``predicted / measured - 1`` per metric over ``records``, leaving out the trials whose
    measured latencies were set outside the engine (:func:`outside_engine`: the twin models
    the engine, not other work on the host; reports list them instead)."""
    out: dict[str, list[float]] = {}
    for r in records:
        if outside_engine(r.metrics):
            continue
        for k, pred in r.predicted.items():
            meas = r.metrics.get(k)
            if meas is None or not meas > 0 or not math.isfinite(pred):
                continue
            out.setdefault(k, []).append(pred / meas - 1.0)
    return out


def bound_of(c: ConstraintDef) -> float:
    """A constraint's bound (its ``max``, else its ``min``)."""
    b = c.max if c.max is not None else c.min
    assert b is not None
    return b


def trust_errors(records: Sequence[TrialRecord], objectives: Sequence[ObjectiveDef],
                 constraints: Sequence[ConstraintDef]) -> dict[str, float]:
    """The twin's error on each goal metric as the trust check (``maxTwinError``) judges it,
    over ``records`` (the confirmed trials, those set outside the engine left out as in
    :func:`prediction_errors`).

    - An objective: the median ``|predicted / measured - 1|``: the twin ranks by it, so any
      relative error counts.
    - A constraint metric (not also an objective): the median ``|predicted - measured| /
      max(|measured|, |bound|)``. The twin only has to tell on which side of the bound a
      configuration lands, so a miss is measured against the bound while the measurement is
      inside it (chat TTFT p99 predicted 91 ms, measured 196 ms, bound 3 s: 3.5%, not 54%), and
      against the measurement beyond it. An error rate predicted 0% and measured 2% against a
      bound of 1% is 100%: a wrong verdict counts in full.
    """
    out: dict[str, float] = {}
    rel = prediction_errors(records)
    for o in objectives:
        if rel.get(o.key):
            out[o.key] = statistics.median(abs(x) for x in rel[o.key])
    for c in constraints:
        if c.key in out:
            continue
        b = abs(bound_of(c))
        errs = []
        for r in records:
            if outside_engine(r.metrics):
                continue
            p, m = r.predicted.get(c.key), r.metrics.get(c.key)
            if p is None or m is None or not (math.isfinite(p) and math.isfinite(m)):
                continue
            scale = max(abs(m), b)
            if scale > 0:
                errs.append(abs(p - m) / scale)
        if errs:
            out[c.key] = max(out.get(c.key, 0.0), statistics.median(errs))
    return out


def _noise_lines(results: Results) -> list[str]:
    """Trials whose measured latencies the host set rather than the engine (see
    :func:`~chunktune.core.steps.host_added`), and trials whose ITL p99 is on a cliff, with
    what to do about them."""
    done = sum(1 for t in results.trials if t.state == TrialState.COMPLETE)
    out = []
    host = [t.number for t in results.trials
            if t.state == TrialState.COMPLETE and host_disturbed(t)]
    if host:
        out += ["", f"noisy: {len(host)} of {done} measured trials "
                    f"({', '.join(map(str, host))}) saw clients' ITL p99 over twice what the "
                    "engine's own steps gave (engine_itl_p99): the gap was added outside the "
                    "engine (API server, network, load client or other work on the host), so "
                    "their latencies say little about their configurations; measure on a quiet "
                    "node, or compare engine_itl_p99"]
    goals = [o.metric for o in results.objectives] + [c.metric for c in results.constraints]
    cliff = [t for t in results.trials
             if t.state == TrialState.COMPLETE and on_cliff(t.itl_band)]
    if cliff and any(g in ("itl_p99", "engine_itl_p99") for g in goals):
        t = max(cliff, key=lambda t: t.itl_band[1] / t.itl_band[0] if t.itl_band else 0.0)
        assert t.itl_band is not None
        out += ["", f"cliff: {len(cliff)} of {done} measured trials "
                    f"({', '.join(str(t.number) for t in cliff)}) have an ITL p99 on a cliff: "
                    "about 1% of their tokens waited on long steps (prefill chunks beside the "
                    "decodes), so the p99 of a load this long falls on a decode step or on a "
                    f"long step from one run to the next (trial {t.number}: the engine's "
                    f"{t.itl_band[0] * 1e3:.1f} ms at p{99 - BAND_WIDTH:g}, "
                    f"{t.itl_band[1] * 1e3:.1f} ms at p{99 + BAND_WIDTH:g}); their ranking on "
                    "it does not repeat, and a clients' p99 on the long steps can be over "
                    "twice the engine's over all its tokens without any host noise; a longer "
                    "load or a lower percentile (p95) ranks them more stably"]
    return out


def to_json(results: Results, **extra: Any) -> dict[str, Any]:
    def tr(t: TrialRecord | None) -> dict[str, Any] | None:
        if t is None:
            return None
        out = {"number": t.number, "params": dict(t.params), "state": t.state,
               "reason": t.reason, "metrics": dict(t.metrics),
               "constraints_ok": t.constraints_ok, "flags": flags_line(dict(t.params))}
        if t.peak:
            out["peak"] = dict(t.peak)  # the busiest step's use of each limit flag
        if t.repeats:
            out["repeats"] = list(t.repeats)  # metrics: the mean of these trials' (not noisy's)
            if t.noisy:
                out["noisy"] = list(t.noisy)
        return out

    return {
        "objectives": [{"key": o.key, "direction": o.direction} for o in results.objectives],
        "constraints": [c.text() for c in results.constraints],
        "baseline": tr(results.baseline_trial),
        "best": tr(results.best_trial),
        "improvement": results.improvement(),
        "pareto_front": [tr(results.configuration(n)) for n in results.pareto],
        "trials": [tr(t) for t in results.trials],
        **extra,
    }


def write_outputs(out: Path, results: Results, study: optuna.Study,
                  **extra: Any) -> list[Path]:
    """``result.json`` and the plots (HTML with plotly, PNG with matplotlib)."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "result.json"]
    written[0].write_text(json.dumps(to_json(results, **extra), indent=2) + "\n")
    from chunktune.tuning import plots

    written += plots.write(out, study, results)
    return written
