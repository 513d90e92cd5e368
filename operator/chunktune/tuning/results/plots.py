"""Plots of a study: optimization history, parameter importances and the Pareto front, each as
an interactive HTML page (plotly) and a PNG (matplotlib, no browser needed).

Drawn from :class:`~chunktune.tuning.results.model.Results` rather than Optuna's stock plots,
because infeasible trials carry placeholder objective values that must not be drawn as
measurements: here they appear as markers on the axis, labelled with their reason.
"""

from __future__ import annotations

import math
import random
import statistics
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from chunktune.api.metrics import METRICS
from chunktune.core.study_records import TrialRecord
from chunktune.core.trials import TrialState
from chunktune.tuning import study as st
from chunktune.tuning.results.model import Results

#: Measured, feasible trials an importance ranking needs: on fewer it is noise (on the
#: quickstart's ~10 it put the batch budget first while the trial table shows the long-prefill
#: threshold decides chat TTFT).
MIN_IMPORTANCE_TRIALS = 15
#: Bootstrap resamples of the trials the importances are computed over (their spread).
IMPORTANCE_RESAMPLES = 20


@dataclass(frozen=True)
class Importances:
    """PED-ANOVA importances (Optuna's default evaluator) of the parameters for the first
    objective, over bootstrap resamples
    of the measured feasible trials: per parameter the median and the 10th-90th percentile
    range (empty when fewer than :data:`MIN_IMPORTANCE_TRIALS` trials back them)."""

    key: str
    trials: int
    resamples: int = 0
    spread: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    """Parameter -> (median, p10, p90), most important first."""

    def text(self) -> str:
        if not self.spread:
            return (f"parameter importances for {self.key}: not computed: "
                    f"{self.trials} measured feasible trials, a ranking needs "
                    f"{MIN_IMPORTANCE_TRIALS}")
        return (f"parameter importances for {self.key} (PED-ANOVA, median and 10-90% over "
                f"{self.resamples} resamples of {self.trials} measured feasible trials): "
                + ", ".join(f"{n} {m:.2f} ({lo:.2f}-{hi:.2f})"
                            for n, (m, lo, hi) in self.spread.items()))

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.key, "trials": self.trials, "needed": MIN_IMPORTANCE_TRIALS,
                "resamples": self.resamples,
                "params": {n: {"median": m, "p10": lo, "p90": hi}
                           for n, (m, lo, hi) in self.spread.items()}}


def importances(study: optuna.Study, results: Results,
                resamples: int = IMPORTANCE_RESAMPLES) -> Importances:
    """:class:`Importances` of the parameters for the first objective, over the measured,
    feasible trials only: Optuna's PED-ANOVA (``optuna.importance``) on ``resamples``
    bootstrap resamples of them (seeded: the same study gives the same figures)."""
    o = results.objectives[0]
    keep = {t.number for t in results.trials
            if t.state == TrialState.COMPLETE and t.constraints_ok and o.key in t.metrics}
    frozen = [t for t in study.get_trials(deepcopy=False) if t.number in keep and t.params]
    if len(frozen) < MIN_IMPORTANCE_TRIALS:
        return Importances(o.key, len(frozen))
    rng = random.Random(0)
    runs: list[dict[str, float]] = []
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # a line per resample's study
    try:
        runs = _resampled(study, frozen, o.key, resamples, rng)
    finally:
        optuna.logging.set_verbosity(verbosity)
    if not runs:
        return Importances(o.key, len(frozen))
    names = sorted({n for r in runs for n in r})
    spread = {}
    for n in names:
        v = sorted(r.get(n, 0.0) for r in runs)
        spread[n] = (statistics.median(v), _quantile(v, 0.1), _quantile(v, 0.9))
    ranked = dict(sorted(spread.items(), key=lambda kv: -kv[1][0]))
    return Importances(o.key, len(frozen), len(runs), ranked)


def _resampled(study: optuna.Study, frozen: list[optuna.trial.FrozenTrial], key: str,
               resamples: int, rng: random.Random) -> list[dict[str, float]]:
    """The importances of each of ``resamples`` bootstrap resamples of ``frozen``."""
    runs: list[dict[str, float]] = []
    for _ in range(resamples):
        copy = optuna.create_study(directions=study.directions)
        copy.add_trials([rng.choice(frozen) for _ in frozen])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                runs.append(dict(optuna.importance.get_param_importances(
                    copy, evaluator=optuna.importance.PedAnovaImportanceEvaluator(),
                    target=lambda t: t.user_attrs[st.ATTR_METRICS][key])))
            except (RuntimeError, ValueError, ZeroDivisionError):
                continue
    return runs


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks."""
    x = q * (len(sorted_values) - 1)
    lo = math.floor(x)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (x - lo)


def _unit(key: str) -> tuple[float, str]:
    """The scale and unit a metric is drawn in: the command line's (latencies in ms,
    fractions in %)."""
    m = METRICS.get(key.rsplit(".", 1)[-1])
    if m is None:
        return 1.0, ""
    if m.unit == "s":
        return 1000.0, "ms"
    if m.unit == "fraction":
        return 100.0, "%"
    return 1.0, m.unit


def _axis(key: str, label: str | None = None) -> str:
    unit = _unit(key)[1]
    return f"{label or key} ({unit})" if unit else (label or key)


def _labels(ax: Any, points: list[tuple[float, float, str]]) -> None:
    """Label points so that no two labels overlap: points at the same place share one label
    (``#2, #5``); each label is placed at the first of a few offsets around its point whose
    box meets no label placed before (left out when none is free)."""
    merged: dict[tuple[float, float], list[str]] = {}
    for x, y, text in points:
        merged.setdefault((x, y), []).append(text)
    fig = ax.figure
    fig.canvas.draw()
    taken: list[Any] = []
    for (x, y), texts in merged.items():
        text = ", ".join(texts)
        for dx, dy in ((4, 4), (4, -10), (-16, 4), (-16, -10), (4, 12), (-16, 12)):
            a = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points",
                            fontsize=7)
            box = a.get_window_extent(renderer=fig.canvas.get_renderer())
            if not any(box.overlaps(b) for b in taken):
                taken.append(box)
                break
            a.remove()


def write(out: Path, study: optuna.Study, results: Results,
          imp: Importances | None = None) -> list[Path]:
    """The plots, in the units the command line prints (latencies in ms). ``imp``: the
    importances computed already (else computed here); drawn only when enough trials back
    them, with their spread."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import plotly.graph_objects as go

    written: list[Path] = []
    o = results.objectives[0]
    scale = _unit(o.key)[0]
    measured = [t for t in results.trials if o.key in t.metrics and t.state == TrialState.COMPLETE]
    feasible = [t for t in measured if t.constraints_ok]
    others = [t for t in results.trials if t not in feasible]

    # -- history -------------------------------------------------------------------------
    xs = [t.number for t in feasible]
    ys = [t.metrics[o.key] * scale for t in feasible]
    best, run = [], math.inf if o.direction == "minimize" else -math.inf
    for y in ys:
        run = min(run, y) if o.direction == "minimize" else max(run, y)
        best.append(run)
    fig = go.Figure()
    fig.add_scatter(x=xs, y=ys, mode="markers", name="feasible trials",
                    text=[str(dict(t.params)) for t in feasible])
    fig.add_scatter(x=xs, y=best, mode="lines", name="best so far", line={"shape": "hv"})
    viol = [t for t in measured if not t.constraints_ok]
    fig.add_scatter(x=[t.number for t in viol], y=[t.metrics[o.key] * scale for t in viol],
                    mode="markers", marker={"symbol": "x"}, name="SLO violated")
    pruned = [t for t in others if t.state == TrialState.PRUNED and o.key in t.metrics]
    if pruned:
        fig.add_scatter(x=[t.number for t in pruned],
                        y=[t.metrics[o.key] * scale for t in pruned],
                        mode="markers", marker={"symbol": "circle-open"},
                        name="pruned (value when stopped)")
    failed = [t for t in others if o.key not in t.metrics]
    if failed:
        floor = min(ys) if ys else 0
        fig.add_scatter(x=[t.number for t in failed], y=[floor] * len(failed), mode="markers",
                        marker={"symbol": "triangle-down"}, name="did not start / failed",
                        text=[f"{t.state} {t.reason}" for t in failed])
    fig.update_layout(title=f"Optimization history ({o.label()})", xaxis_title="trial",
                      yaxis_title=_axis(o.key))
    written.append(_html(fig, out / "history.html"))
    f, ax = plt.subplots(figsize=(7, 4))
    ax.scatter(xs, ys, label="feasible trials")
    ax.step(xs, best, where="post", label="best so far")
    if viol:
        ax.scatter([t.number for t in viol], [t.metrics[o.key] * scale for t in viol],
                   marker="x", label="SLO violated")
    if pruned:
        ax.scatter([t.number for t in pruned], [t.metrics[o.key] * scale for t in pruned],
                   facecolors="none", edgecolors="gray", label="pruned (value when stopped)")
    if failed:
        floor = min(ys) if ys else 0
        ax.scatter([t.number for t in failed], [floor] * len(failed), marker="v",
                   label="did not start / failed")
    ax.set_xlabel("trial")
    ax.set_ylabel(_axis(o.key))
    ax.set_title(f"Optimization history ({o.label()})")
    ax.legend(fontsize=8)
    written.append(_png(f, out / "history.png"))

    # -- importances ---------------------------------------------------------------------
    imp = imp if imp is not None else importances(study, results)
    if imp.spread:
        names = list(imp.spread)[::-1]  # most important on top
        med = [imp.spread[n][0] for n in names]
        lo = [imp.spread[n][0] - imp.spread[n][1] for n in names]
        hi = [imp.spread[n][2] - imp.spread[n][0] for n in names]
        title = (f"Parameter importances for {o.key}<br>(PED-ANOVA; median and 10-90% over "
                 f"{imp.resamples} resamples of {imp.trials} trials)")
        fig = go.Figure(go.Bar(x=med, y=names, orientation="h",
                               error_x={"type": "data", "symmetric": False, "array": hi,
                                        "arrayminus": lo}))
        fig.update_layout(title=title)
        written.append(_html(fig, out / "importances.html"))
        f, ax = plt.subplots(figsize=(7, 3.2))
        ax.barh(names, med, xerr=[lo, hi], capsize=3)
        ax.set_xlabel("importance")
        ax.set_title(title.replace("<br>", "\n"), fontsize=9)
        written.append(_png(f, out / "importances.png"))

    # -- Pareto front --------------------------------------------------------------------
    if len(results.objectives) >= 2:
        o2 = results.objectives[1]
        s2 = _unit(o2.key)[0]
        pts = [t for t in feasible if o2.key in t.metrics]
        front = [t for t in pts if t.number in results.pareto]
        front.sort(key=lambda t: t.metrics[o.key])
        fig = go.Figure()
        fig.add_scatter(x=[t.metrics[o.key] * scale for t in pts],
                        y=[t.metrics[o2.key] * s2 for t in pts],
                        mode="markers", name="feasible trials",
                        text=[f"#{t.number} {dict(t.params)}" for t in pts])
        fig.add_scatter(x=[t.metrics[o.key] * scale for t in front],
                        y=[t.metrics[o2.key] * s2 for t in front], mode="lines+markers",
                        name="Pareto front", text=[f"#{t.number}" for t in front])
        fig.update_layout(title="Pareto front", xaxis_title=_axis(o.key, o.label()),
                          yaxis_title=_axis(o2.key, o2.label()))
        written.append(_html(fig, out / "pareto.html"))
        f, ax = plt.subplots(figsize=(6, 4.5))
        ax.scatter([t.metrics[o.key] * scale for t in pts], [t.metrics[o2.key] * s2 for t in pts],
                   label="feasible trials", alpha=0.6)
        ax.plot([t.metrics[o.key] * scale for t in front],
                [t.metrics[o2.key] * s2 for t in front], "o-", color="C3", label="Pareto front")
        ax.set_xlabel(_axis(o.key, o.label()))
        ax.set_ylabel(_axis(o2.key, o2.label()))
        ax.set_title("Pareto front")
        ax.legend(fontsize=8)
        _labels(ax, [(t.metrics[o.key] * scale, t.metrics[o2.key] * s2, f"#{t.number}")
                     for t in front])
        written.append(_png(f, out / "pareto.png"))

    # -- twin: predicted against measured --------------------------------------------------
    confirmed = [t for t in results.trials if t.predicted and t.state == TrialState.COMPLETE]
    keys = [k for k in dict.fromkeys([*(x.key for x in results.objectives),
                                      *(c.key for c in results.constraints)])
            if any(k in t.predicted and k in t.metrics for t in confirmed)]
    if keys:
        written += _twin(out, confirmed, keys)
    return written


def _twin(out: Path, confirmed: list[TrialRecord], keys: list[str]) -> list[Path]:
    """``twin.{html,png}``: per goal metric, each confirmed trial's twin prediction against its
    measurement, with the diagonal (a perfect twin) and the median error in the title."""
    import statistics

    import matplotlib.pyplot as plt
    from plotly.subplots import make_subplots

    written: list[Path] = []
    fig = make_subplots(rows=1, cols=len(keys), subplot_titles=keys)
    f, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 4), squeeze=False)
    for i, k in enumerate(keys):
        pts = [t for t in confirmed if k in t.predicted and k in t.metrics]
        scale = _unit(k)[0]
        xs = [t.metrics[k] * scale for t in pts]
        ys = [t.predicted[k] * scale for t in pts]
        err = statistics.median(abs(y / x - 1) for x, y in zip(xs, ys, strict=True) if x > 0) \
            if any(x > 0 for x in xs) else math.nan
        lo, hi = min(xs + ys), max(xs + ys)
        fig.add_scatter(x=xs, y=ys, mode="markers", name=f"{k} (median error {err:.0%})",
                        text=[f"#{t.number} {dict(t.params)}" for t in pts], row=1, col=i + 1)
        fig.add_scatter(x=[lo, hi], y=[lo, hi], mode="lines", showlegend=False,
                        line={"dash": "dot"}, row=1, col=i + 1)
        ax = axes[0][i]
        ax.scatter(xs, ys)
        ax.plot([lo, hi], [lo, hi], ":", color="gray")
        ax.set_xlabel(_axis(k, f"measured {k}"))
        ax.set_ylabel(_axis(k, f"twin's prediction of {k}"))
        _labels(ax, [(x, y, f"#{t.number}") for t, x, y in zip(pts, xs, ys, strict=True)])
        ax.set_title(f"{k}: median |error| {err:.0%}", fontsize=9)
    fig.update_layout(title="Twin: predicted against measured (confirmed trials)")
    written.append(_html(fig, out / "twin.html"))
    f.suptitle("Twin: predicted against measured (confirmed trials)")
    written.append(_png(f, out / "twin.png"))
    return written


def _html(fig: object, path: Path) -> Path:
    fig.write_html(str(path), include_plotlyjs="directory")  # type: ignore[attr-defined]
    return path


def _png(fig: object, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()  # type: ignore[attr-defined]
    fig.savefig(path, dpi=110)  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[arg-type]
    return path
