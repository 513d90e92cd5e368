"""Plots of a study: optimization history, parameter importances and the Pareto front, each as
an interactive HTML page (plotly) and a PNG (matplotlib, no browser needed).

Drawn from :class:`~chunktune.tuning.results.model.Results` rather than Optuna's stock plots,
because infeasible trials carry placeholder objective values that must not be drawn as
measurements: here they appear as markers on the axis, labelled with their reason.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import optuna

from chunktune.api.status import TrialRecord
from chunktune.core.trials import TrialState
from chunktune.tuning import study as st
from chunktune.tuning.results.model import Results


def importances(study: optuna.Study, results: Results) -> dict[str, float]:
    """fANOVA importances of the parameters for the first objective, over the measured,
    feasible trials only (needs at least 3)."""
    o = results.objectives[0]
    keep = {t.number for t in results.trials
            if t.state == TrialState.COMPLETE and t.constraints_ok and o.key in t.metrics}
    frozen = [t for t in study.get_trials(deepcopy=False) if t.number in keep and t.params]
    if len(frozen) < 3:
        return {}
    copy = optuna.create_study(directions=study.directions)
    copy.add_trials(frozen)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return dict(optuna.importance.get_param_importances(
                copy, target=lambda t: t.user_attrs[st.ATTR_METRICS][o.key]))
        except (RuntimeError, ValueError, ZeroDivisionError):
            return {}


def write(out: Path, study: optuna.Study, results: Results) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import plotly.graph_objects as go

    written: list[Path] = []
    o = results.objectives[0]
    measured = [t for t in results.trials if o.key in t.metrics and t.state == TrialState.COMPLETE]
    feasible = [t for t in measured if t.constraints_ok]
    others = [t for t in results.trials if t not in feasible]

    # -- history -------------------------------------------------------------------------
    xs = [t.number for t in feasible]
    ys = [t.metrics[o.key] for t in feasible]
    best, run = [], math.inf if o.direction == "minimize" else -math.inf
    for y in ys:
        run = min(run, y) if o.direction == "minimize" else max(run, y)
        best.append(run)
    fig = go.Figure()
    fig.add_scatter(x=xs, y=ys, mode="markers", name="feasible trials",
                    text=[str(dict(t.params)) for t in feasible])
    fig.add_scatter(x=xs, y=best, mode="lines", name="best so far", line={"shape": "hv"})
    viol = [t for t in measured if not t.constraints_ok]
    fig.add_scatter(x=[t.number for t in viol], y=[t.metrics[o.key] for t in viol],
                    mode="markers", marker={"symbol": "x"}, name="SLO violated")
    pruned = [t for t in others if t.state == TrialState.PRUNED and o.key in t.metrics]
    if pruned:
        fig.add_scatter(x=[t.number for t in pruned], y=[t.metrics[o.key] for t in pruned],
                        mode="markers", marker={"symbol": "circle-open"},
                        name="pruned (value when stopped)")
    failed = [t for t in others if o.key not in t.metrics]
    if failed:
        floor = min(ys) if ys else 0
        fig.add_scatter(x=[t.number for t in failed], y=[floor] * len(failed), mode="markers",
                        marker={"symbol": "triangle-down"}, name="did not start / failed",
                        text=[f"{t.state} {t.reason}" for t in failed])
    fig.update_layout(title=f"Optimization history ({o.label()})", xaxis_title="trial",
                      yaxis_title=o.key)
    written.append(_html(fig, out / "history.html"))
    f, ax = plt.subplots(figsize=(7, 4))
    ax.scatter(xs, ys, label="feasible trials")
    ax.step(xs, best, where="post", label="best so far")
    if viol:
        ax.scatter([t.number for t in viol], [t.metrics[o.key] for t in viol], marker="x",
                   label="SLO violated")
    if pruned:
        ax.scatter([t.number for t in pruned], [t.metrics[o.key] for t in pruned],
                   facecolors="none", edgecolors="gray", label="pruned (value when stopped)")
    if failed:
        floor = min(ys) if ys else 0
        ax.scatter([t.number for t in failed], [floor] * len(failed), marker="v",
                   label="did not start / failed")
    ax.set_xlabel("trial")
    ax.set_ylabel(o.key)
    ax.set_title(f"Optimization history ({o.label()})")
    ax.legend(fontsize=8)
    written.append(_png(f, out / "history.png"))

    # -- importances ---------------------------------------------------------------------
    imp = importances(study, results)
    if imp:
        names, vals = list(imp), list(imp.values())
        fig = go.Figure(go.Bar(x=vals, y=names, orientation="h"))
        fig.update_layout(title=f"Parameter importances for {o.key} (fANOVA)")
        written.append(_html(fig, out / "importances.html"))
        f, ax = plt.subplots(figsize=(7, 3))
        ax.barh(names, vals)
        ax.set_title(f"Parameter importances for {o.key} (fANOVA)")
        written.append(_png(f, out / "importances.png"))

    # -- Pareto front --------------------------------------------------------------------
    if len(results.objectives) >= 2:
        o2 = results.objectives[1]
        pts = [t for t in feasible if o2.key in t.metrics]
        front = [t for t in pts if t.number in results.pareto]
        front.sort(key=lambda t: t.metrics[o.key])
        fig = go.Figure()
        fig.add_scatter(x=[t.metrics[o.key] for t in pts], y=[t.metrics[o2.key] for t in pts],
                        mode="markers", name="feasible trials",
                        text=[f"#{t.number} {dict(t.params)}" for t in pts])
        fig.add_scatter(x=[t.metrics[o.key] for t in front],
                        y=[t.metrics[o2.key] for t in front], mode="lines+markers",
                        name="Pareto front", text=[f"#{t.number}" for t in front])
        fig.update_layout(title="Pareto front", xaxis_title=o.label(), yaxis_title=o2.label())
        written.append(_html(fig, out / "pareto.html"))
        f, ax = plt.subplots(figsize=(6, 4.5))
        ax.scatter([t.metrics[o.key] for t in pts], [t.metrics[o2.key] for t in pts],
                   label="feasible trials", alpha=0.6)
        ax.plot([t.metrics[o.key] for t in front], [t.metrics[o2.key] for t in front], "o-",
                color="C3", label="Pareto front")
        for t in front:
            ax.annotate(f"#{t.number}", (t.metrics[o.key], t.metrics[o2.key]), fontsize=7)
        ax.set_xlabel(o.label())
        ax.set_ylabel(o2.label())
        ax.set_title("Pareto front")
        ax.legend(fontsize=8)
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
        xs, ys = [t.metrics[k] for t in pts], [t.predicted[k] for t in pts]
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
        for t, x, y in zip(pts, xs, ys, strict=True):
            ax.annotate(f"#{t.number}", (x, y), fontsize=7)
        ax.set_xlabel(f"measured {k}")
        ax.set_ylabel(f"twin's prediction of {k}")
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
