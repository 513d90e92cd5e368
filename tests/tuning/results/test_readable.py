"""Output a user can read: trials that break a constraint marked on their lines, skips and
prunes explained once, importances only when enough trials back them and with their spread,
plots in the command line's units, Pareto labels apart."""

from __future__ import annotations

import optuna
import pytest

from chunktune.core.study_records import TrialRecord
from chunktune.tuning import study as st
from chunktune.tuning.objectives import ConstraintDef, ObjectiveDef
from chunktune.tuning.results import plots
from chunktune.tuning.results.model import Results
from chunktune.tuning.results.text import trial_counts

OBJ = ObjectiveDef("ttft_p99", "chat", "minimize")
ITL = ConstraintDef("itl_p99", "chat", 0.06, None)


def _study(n: int, noise: float = 0.0) -> tuple[optuna.Study, Results]:
    """``n`` measured trials whose chat TTFT the threshold decides (the budget not at all,
    beside the noise)."""
    import random

    rng = random.Random(1)
    study = optuna.create_study()
    dists = {"budget": optuna.distributions.IntDistribution(512, 16384),
             "threshold": optuna.distributions.CategoricalDistribution([0, 256, 512, 2048])}
    records = []
    for i in range(n):
        p = {"budget": rng.randint(512, 16384), "threshold": rng.choice([0, 256, 512, 2048])}
        ttft = (1.0 if p["threshold"] == 0 else 0.15) \
            + rng.random() * noise
        study.add_trial(optuna.trial.create_trial(
            params=p, distributions=dists, value=ttft,
            user_attrs={st.ATTR_METRICS: {"chat.ttft_p99": ttft, "chat.itl_p99": 0.03},
                        st.ATTR_STATE: "COMPLETE"}))
        records.append(TrialRecord(number=i, params=p, state="COMPLETE", reason=None,
                                   metrics={"chat.ttft_p99": ttft, "chat.itl_p99": 0.03},
                                   constraints_ok=True))
    return study, Results(records, [OBJ], [ITL], 0, 0, [])


def test_importances_need_enough_trials_and_say_so():
    study, res = _study(plots.MIN_IMPORTANCE_TRIALS - 1)
    imp = plots.importances(study, res)
    assert imp.spread == {}
    assert imp.text() == (f"parameter importances for chat.ttft_p99: not computed: "
                          f"{plots.MIN_IMPORTANCE_TRIALS - 1} measured feasible trials, a "
                          f"ranking needs {plots.MIN_IMPORTANCE_TRIALS}")
    assert imp.to_dict()["params"] == {}


def test_importances_come_with_their_spread_over_resamples():
    study, res = _study(24, noise=0.05)
    imp = plots.importances(study, res, resamples=8)
    assert imp.resamples == 8 and imp.trials == 24
    assert next(iter(imp.spread)) == "threshold"  # what decides the TTFT ranks first
    for median, lo, hi in imp.spread.values():
        assert 0 <= lo <= median <= hi <= 1
    assert "threshold" in imp.text() and "over 8 resamples of 24" in imp.text()
    # seeded: the same study gives the same figures
    assert plots.importances(study, res, resamples=8) == imp


def test_trial_counts_explain_each_state():
    rec = [TrialRecord(number=0, params={}, state="COMPLETE", reason=None, metrics={},
                       constraints_ok=True),
           TrialRecord(number=1, params={}, state="COMPLETE", reason="SLOViolated",
                       metrics={}, constraints_ok=False),
           TrialRecord(number=2, params={}, state="PRUNED", reason="Pruned", metrics={},
                       constraints_ok=False),
           TrialRecord(number=3, params={}, state="SKIPPED", reason="Duplicate", metrics={},
                       constraints_ok=False)]
    res = Results(rec, [OBJ], [ITL], 0, 0, [])
    assert trial_counts(res) == ("2 complete (1 violating a constraint), 1 pruned (stopped "
                                 "early, no result), 1 skipped (1 Duplicate)")


def test_plots_use_the_command_lines_units(tmp_path):
    study, res = _study(4)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seen = {}
    real = plt.subplots

    def spy(*a, **kw):
        f, ax = real(*a, **kw)
        seen.setdefault("ax", ax)
        return f, ax

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plt, "subplots", spy)
        plots.write(tmp_path, study, res)
    ax = seen["ax"]
    assert ax.get_ylabel() == "chat.ttft_p99 (ms)"
    ys = [y for c in ax.collections for _, y in c.get_offsets()]
    assert min(ys) > 100  # 0.15 s drawn as 150 ms, as the command line prints it


def test_pareto_labels_do_not_overlap(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    f, ax = plt.subplots(figsize=(6, 4.5))
    pts = [(100 + i * 0.01, 2000 + i * 0.01, f"#{i}") for i in range(6)]  # all on one spot
    pts += [(100.0, 2000.0, "#6"), (100.0, 2000.0, "#7")]  # two at exactly #0's place
    ax.scatter([p[0] for p in pts], [p[1] for p in pts])
    plots._labels(ax, pts)
    r = f.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer=r) for t in ax.texts]
    assert len(boxes) >= 4
    assert "#0, #6, #7" in [t.get_text() for t in ax.texts]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    plt.close(f)
