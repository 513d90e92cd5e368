"""The results as text: the table ``chunktune tune`` and ``chunktune results`` print (best
configuration against the baseline, Pareto front, a twin-first study's predictions beside the
measurements, and what the host's noise and unreached limits mean for them).
"""

from __future__ import annotations

import math
import statistics

from chunktune.api.metrics import format_value
from chunktune.api.status import improvement
from chunktune.core.flags import flags_line
from chunktune.core.steps import BAND_WIDTH, LIMIT_USE, on_cliff, outside_engine
from chunktune.core.trials import TrialState
from chunktune.tuning.results.merge import measured_by, unbound
from chunktune.tuning.results.model import Results
from chunktune.tuning.results.noise import host_disturbed
from chunktune.tuning.results.trust import bound_of, prediction_errors, trust_errors


def _fmt(key: str, v: float | None) -> str:
    return "-" if v is None else format_value(key, v)


def format_results(results: Results) -> str:
    lines: list[str] = []
    keys = [o.key for o in results.objectives] + [c.key for c in results.constraints
                                                  if c.key not in
                                                  [o.key for o in results.objectives]]
    best, base = results.best_trial, results.baseline_trial
    lines.append("trials: " + trial_counts(results))
    if best is None:
        lines.append(results.no_result or
                     "no trial met every constraint: no best configuration")
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


def trial_counts(results: Results) -> str:
    """``12 complete (2 violating a constraint), 8 pruned (stopped early), 1 skipped (1
    Duplicate)``: each state counted, what it holds said once."""
    counts: dict[str, int] = {}
    reasons: dict[str, dict[str, int]] = {}
    for t in results.trials:
        counts[t.state] = counts.get(t.state, 0) + 1
        if t.state not in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING):
            r = reasons.setdefault(t.state, {})
            r[t.reason or "?"] = r.get(t.reason or "?", 0) + 1
    violating = sum(1 for t in results.trials
                    if t.state == TrialState.COMPLETE and not t.constraints_ok)
    parts = []
    for state, n in sorted(counts.items()):
        detail = ", ".join(f"{k} {r}" for r, k in sorted(reasons.get(state, {}).items(),
                                                         key=lambda x: -x[1]))
        if state == TrialState.COMPLETE and violating:
            detail = f"{violating} violating a constraint"
        elif state == TrialState.PRUNED:
            detail = "stopped early, no result"
        parts.append(f"{n} {state.lower()}" + (f" ({detail})" if detail else ""))
    return ", ".join(parts)


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

