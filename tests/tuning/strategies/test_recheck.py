"""The ``recheck`` every strategy ends with (:class:`chunktune.tuning.strategies.base.Strategy`):
the best measured configurations measured once more before the answer, and the answer taken from
the mean of each configuration's measurements (:func:`chunktune.tuning.results.merge.merge`)."""

from __future__ import annotations

import asyncio
import json
import statistics
from pathlib import Path
from typing import Any

import optuna
import pytest

from chunktune.api.reader import validate
from chunktune.api.status import render_status
from chunktune.core.progress import TrialEvent
from chunktune.core.trials import TrialState
from chunktune.tuning import study as st
from chunktune.tuning.objectives import ConstraintDef, ObjectiveDef
from chunktune.tuning.results.files import to_json
from chunktune.tuning.results.model import collect, recheck_order, summary
from chunktune.tuning.results.noise import engine_estimate
from chunktune.tuning.results.text import format_results
from tests.tuning.strategies.test_twin_first import make_tuner, real_trials, twin_manifest
from tests.tuning.strategies.test_twin_first_resume import stopped_at

ITL = ObjectiveDef("itl_p99", "chat", "minimize")
KEY = "chat.itl_p99"


def study_of(rows: list[tuple[int, float, float]]) -> optuna.Study:
    """A study of completed trials ``(max-num-batched-tokens, chat ITL p99, TTFT p99)``, a
    TTFT p99 above 1 s violating the constraint."""
    study = optuna.create_study()
    dist = {"max-num-batched-tokens": optuna.distributions.IntDistribution(256, 8192)}
    for budget, itl, ttft in rows:
        study.add_trial(optuna.trial.create_trial(
            params={"max-num-batched-tokens": budget}, distributions=dist, values=[itl],
            constraints={"chat.ttft_p99": ttft - 1.0},
            user_attrs={st.ATTR_METRICS: {KEY: itl, "chat.ttft_p99": ttft}}))
    return study


def test_a_configuration_measured_again_competes_with_its_mean() -> None:
    # 2048 measured once at 10 ms (lucky) and again at 30 ms: its mean, 20 ms, loses to
    # 4096's 15 ms
    study = study_of([(2048, 0.010, 0.5), (4096, 0.015, 0.5), (2048, 0.030, 0.5)])
    res = collect(study, [ITL], [])
    best = res.best_trial
    assert best is not None and best.params == {"max-num-batched-tokens": 4096}
    assert best.repeats == ()
    # with one more good measurement of 2048 its mean (12.5 ms) wins, and is what is shown
    study = study_of([(2048, 0.010, 0.5), (4096, 0.015, 0.5), (2048, 0.015, 0.5)])
    res = collect(study, [ITL], [])
    best = res.best_trial
    assert best is not None and best.number == 0 and best.repeats == (0, 2)
    assert best.metrics[KEY] == pytest.approx(0.0125)
    assert res.trial(2) is not None and res.trial(2).metrics[KEY] == 0.015  # rows stay single
    text = format_results(res)
    assert "best configuration: trial 0 (the mean of its 2 measurements: trials 0, 2)" in text
    row = next(line for line in text.splitlines() if line.strip().startswith(KEY))
    assert row.split()[1] == "12ms"  # the mean, not trial 0's 10 ms
    out = to_json(res)
    assert out["best"]["repeats"] == [0, 2] and out["best"]["metrics"][KEY] == \
        pytest.approx(0.0125)
    assert "repeats" not in out["trials"][0]
    status = render_status(summary(res, "Succeeded"))
    assert status["best"]["repeats"] == [0, 2]
    assert status["best"]["metrics"][KEY] == pytest.approx(0.0125)
    assert status["trials"][0]["metrics"][KEY] == 0.010


def test_a_constraint_missed_in_one_measurement_makes_the_configuration_infeasible() -> None:
    slo = ConstraintDef("ttft_p99", "chat", 1.0, None)
    study = study_of([(2048, 0.010, 0.5), (4096, 0.015, 0.5), (2048, 0.011, 1.5)])
    res = collect(study, [ITL], [slo])
    assert res.best_trial is not None
    assert res.best_trial.params == {"max-num-batched-tokens": 4096}
    merged = res.configuration(0)
    assert merged is not None and not merged.constraints_ok and merged.reason == "SLOViolated"


def test_recheck_order_ranks_configurations_by_their_mean() -> None:
    study = study_of([(2048, 0.010, 0.5), (4096, 0.015, 0.5), (2048, 0.030, 0.5),
                      (1024, 0.012, 2.0), (512, 0.018, 0.5)])
    order = recheck_order(collect(study, [ITL], [ConstraintDef("ttft_p99", "chat", 1.0,
                                                                    None)]))
    # 1024 misses the SLO; 2048's mean is 20 ms
    assert [c.params["max-num-batched-tokens"] for c in order] == [4096, 512, 2048]


def test_recheck_measures_the_best_again_within_the_real_budget(tmp_path: Path) -> None:
    events: list[TrialEvent] = []
    tuner = make_tuner(tmp_path, twin_manifest(recheckTrials=2), events)
    why = asyncio.run(tuner.run())
    assert why in ("rounds", "converged", "budget")
    trials = real_trials(tuner)
    assert len(trials) <= 8
    phases = [t.user_attrs.get(st.ATTR_PHASE) for t in trials]
    assert phases[-2:] == ["recheck", "recheck"] and phases.count("recheck") == 2
    before = [t for t in trials if t.user_attrs.get(st.ATTR_PHASE) != "recheck"]
    assert len(before) <= 6  # the rounds left two real trials for the recheck
    # the two best configurations measured before the recheck are the ones measured again,
    # for real (not reused as duplicates)
    res_before = collect(tuner.study, tuner.objectives, tuner.constraints)
    key = tuner.objectives[0].key
    single = sorted((t for t in res_before.trials if t.number in {b.number for b in before}
                     and t.state == TrialState.COMPLETE and t.constraints_ok),
                    key=lambda t: t.metrics[key])
    rechecked = [t for t in trials if t.user_attrs.get(st.ATTR_PHASE) == "recheck"]
    # runs of one behaviour (limits no run reached) count once, under their most permissive
    # configuration (results.merge): two confirmations that differ only there are one
    expected: list[dict[str, object]] = []
    for t in single:
        conf = res_before.configuration(t.number)
        assert conf is not None
        if dict(conf.params) not in expected:
            expected.append(dict(conf.params))
    assert [st.point_of(t) for t in rechecked] == expected[:2]
    assert all(st.trial_state(t) == TrialState.COMPLETE for t in rechecked)
    assert all(t.user_attrs.get(st.ATTR_REASON) != "Duplicate" for t in rechecked)
    # the answer is one of them, shown as the mean of its two measurements
    best = res_before.best_trial
    # (and of runs of the same behaviour)
    assert best is not None and len(best.repeats) >= 2
    assert best.repeats[-1] in {t.number for t in rechecked}
    assert len({t.number for t in rechecked} & set(best.repeats)) == 1
    shown = [e.phase for e in events if e.kind == "phase"]
    assert shown[-2:] == ["recheck", "done"]
    assert tuner.strategy.status()["phase"] == "done"
    stored = tuner.study.user_attrs[st.ATTR_RECHECK]
    assert stored["points"] == [st.point_of(t) for t in rechecked] and stored["after"] == why


def test_without_recheck_no_configuration_is_measured_twice(tmp_path: Path) -> None:
    tuner = make_tuner(tmp_path, twin_manifest())
    asyncio.run(tuner.run())
    points = [json.dumps(st.point_of(t), sort_keys=True) for t in real_trials(tuner)]
    assert len(points) == len(set(points))
    assert st.ATTR_RECHECK not in tuner.study.user_attrs


def test_a_study_stopped_in_recheck_resumes_there_and_queues_nothing_again(
        tmp_path: Path) -> None:
    m = twin_manifest(recheckTrials=2)
    stopped_at(tmp_path, m, "recheck")
    events: list[TrialEvent] = []
    again = make_tuner(tmp_path, m, events)
    assert again.strategy.status()["phase"] == "recheck"  # before run(), from storage
    asyncio.run(again.run())
    assert [e.phase for e in events if e.kind == "phase"] == ["recheck", "done"]
    trials = real_trials(again)
    assert [t.user_attrs.get(st.ATTR_PHASE) for t in trials].count("recheck") == 2
    assert len(trials) <= 8
    started = [e.number for e in events if e.kind == "started"]
    assert started and all(again.study.trials[i].user_attrs[st.ATTR_PHASE] == "recheck"
                           for i in started)
    # and a third process finds it done, running nothing
    events3: list[TrialEvent] = []
    third = make_tuner(tmp_path, m, events3)
    assert third.strategy.status()["phase"] == "done"
    asyncio.run(third.run())
    assert not [e for e in events3 if e.kind == "started"]


@pytest.mark.parametrize(("strategy", "ok"), [
    ({"recheckTrials": 2}, True),
    ({"recheckTrials": 3}, False),
    ({"recheckTrials": 17}, False),
])
def test_recheck_must_fit_the_real_budget(strategy: dict[str, Any], ok: bool) -> None:
    m = twin_manifest(calibrationTrials=4, confirmTrials=2, **strategy)
    problems = [p for p in validate(m) if p[0] == "spec.strategy.recheckTrials"]
    assert (not problems) == ok, problems
    if strategy["recheckTrials"] == 3:
        assert "calibrationTrials (4) + confirmTrials (2) + recheckTrials (3) must be <= " \
               "budget.maxTrials (8)" in problems[0][1]


def test_patience_does_not_leave_a_phases_queued_trials_unrun(tmp_path: Path) -> None:
    """``budget.patience`` ends the sampler's search, not a twin phase's queued points: with a
    patience of 1, the calibration trials, the confirmations and the recheck still all run
    (the calibration stopped after its second trial and left the rest queued)."""
    m = twin_manifest(recheckTrials=2)
    m["spec"]["budget"]["patience"] = 1
    tuner = make_tuner(tmp_path, m)
    asyncio.run(tuner.run())
    phases = [t.user_attrs.get(st.ATTR_PHASE) for t in real_trials(tuner)]
    assert phases.count("calibrate") == 3 and phases.count("recheck") == 2
    assert "confirm" in phases
    assert not tuner.waiting()


def test_an_all_real_study_rechecks_its_best_too(tmp_path: Path) -> None:
    from tests.tuning.conftest import manifest

    m = manifest(strategy={"name": "real", "recheckTrials": 2}, budget={"maxTrials": 6},
                 workload={"profile": "mixed", "duration": "15s", "warmup": "3s"},
                 constraints=["error_rate <= 0.01"])
    tuner = make_tuner(tmp_path, m)
    why = asyncio.run(tuner.run())
    assert why == "budget"
    trials = real_trials(tuner)
    assert len(trials) == 6
    phases = [t.user_attrs.get(st.ATTR_PHASE) for t in trials]
    assert phases == [None] * 4 + ["recheck"] * 2
    stored = tuner.study.user_attrs[st.ATTR_RECHECK]
    assert stored["after"] == "budget" and len(stored["points"]) == 2
    best = collect(tuner.study, tuner.objectives, tuner.constraints).best_trial
    assert best is not None and len(best.repeats) == 2
    # a second process finds the recheck done and runs nothing
    again = make_tuner(tmp_path, m)
    assert asyncio.run(again.run()) == "budget"
    assert len(real_trials(again)) == 6


def test_an_all_real_recheck_must_leave_trials_to_recheck() -> None:
    from tests.tuning.conftest import manifest

    problems = validate(manifest(strategy={"name": "real", "recheckTrials": 4},
                                 budget={"maxTrials": 4}))
    assert any(p == "spec.strategy.recheckTrials" and "must be below budget.maxTrials (4)" in m
               for p, m in problems), problems


def noisy_study(rows: list[tuple[int, float, float, dict[str, float] | None]]) -> optuna.Study:
    """Completed trials ``(max-num-batched-tokens, chat ITL p99, engine ITL p99, predicted)``;
    a trial whose clients' ITL p99 is over twice the engine's is flagged as host noise."""
    study = optuna.create_study()
    dist = {"max-num-batched-tokens": optuna.distributions.IntDistribution(256, 8192)}
    for budget, itl, engine, predicted in rows:
        attrs: dict[str, Any] = {st.ATTR_METRICS: {KEY: itl, "itl_p99": itl,
                                                   "engine_itl_p99": engine}}
        if predicted:
            attrs[st.ATTR_PREDICTED] = predicted
        study.add_trial(optuna.trial.create_trial(
            params={"max-num-batched-tokens": budget}, distributions=dist, values=[itl],
            user_attrs=attrs))
    return study


def test_a_measurement_the_host_disturbed_is_left_out_of_the_mean() -> None:
    # 4096: 56 ms where the engine's own steps gave 18 (host noise), then 17 ms clean;
    # 2048: 20 and 22 ms clean
    study = noisy_study([(4096, 0.056, 0.018, None), (2048, 0.020, 0.015, None),
                         (4096, 0.017, 0.015, None), (2048, 0.022, 0.016, None)])
    res = collect(study, [ITL], [])
    best = res.best_trial
    assert best is not None and best.params == {"max-num-batched-tokens": 4096}
    assert best.metrics[KEY] == pytest.approx(0.017)  # not (56 + 17) / 2
    assert best.repeats == (0, 2) and best.noisy == (0,)
    text = format_results(res)
    assert "best configuration: trial 0 (the mean of trial 2; trial 0 left out as noisy)" in text
    assert to_json(res)["best"]["noisy"] == [0]
    assert render_status(summary(res, "Succeeded"))["best"]["noisy"] == [0]
    # every measurement noisy: the mean of them all, none left out
    study = noisy_study([(4096, 0.056, 0.018, None), (4096, 0.050, 0.016, None)])
    merged = collect(study, [ITL], []).best_trial
    assert merged is not None and merged.noisy == () and merged.metrics[KEY] == \
        pytest.approx(0.053)


def test_recheck_ranks_a_configuration_measured_only_noisily_by_its_engines_figure() -> None:
    """Seed 1 of the fifth session's second bench run: 4096/0/128 measured 40.7 ms of chat ITL
    p99 while its engine's own steps gave 10.9 ms (host noise), vLLM's defaults 18.4 ms
    (engine 15.9) and 1024/0/16 32.0 ms (engine 30.1), clean: the recheck measured the
    defaults and 1024/0/16 again, never 4096/0/128, and answered the defaults. Its engine's
    figure at the study's clean clients/engine ratio (1.06-1.16) ranks it first."""
    study = noisy_study([(2048, 0.0184, 0.0159, None), (1024, 0.0320, 0.0301, None),
                         (4096, 0.0407, 0.0109, {KEY: 0.0344})])
    res = collect(study, [ITL], [])
    order = recheck_order(res)
    assert [c.params["max-num-batched-tokens"] for c in order] == [4096, 2048, 1024]
    est = engine_estimate(res.trials, [res.trial(2)], KEY)
    assert est == pytest.approx(0.0109 * statistics.median([0.0184 / 0.0159, 0.0320 / 0.0301]))
    assert engine_estimate(res.trials, [res.trial(2)], "chat.ttft_p99") is None  # not an ITL p99


def test_recheck_falls_back_on_the_twins_prediction_without_a_clean_ratio() -> None:
    # seed 1 of the fourth session's bench, every trial disturbed: 4096/0/128 measured 56 ms
    # (engine 18 ms), predicted 26 ms; 1024 measured 44 ms (engine 12), predicted 32 ms
    study = noisy_study([(4096, 0.056, 0.018, {KEY: 0.026}), (1024, 0.044, 0.012, {KEY: 0.032})])
    order = recheck_order(collect(study, [ITL], []))
    assert [c.params["max-num-batched-tokens"] for c in order] == [4096, 1024]
    # without a prediction either, its measured figure is all there is
    study = noisy_study([(4096, 0.056, 0.018, None), (1024, 0.044, 0.012, None)])
    order = recheck_order(collect(study, [ITL], []))
    assert [c.params["max-num-batched-tokens"] for c in order] == [1024, 4096]


def test_a_p99_on_a_cliff_is_the_configurations_own_and_stays_in_the_mean() -> None:
    """Seed 2 of the fourth session's second bench run: vLLM's defaults measured 17.8 ms, then
    30.4 ms with the clients' ITL p99 (all classes) at 51.9 ms against the engine's 22.6 ms,
    flagged noisy; but the engine's own ITL ran from 16.6 ms at p98.5 to 212 ms at p99.5 (on a
    cliff), so 51.9 ms is the engine's and the measurement stays. 4096/0/16 (18.8, 18.1 ms)
    then wins; left out, the defaults' 17.8 ms alone won."""
    from chunktune.core.study_records import TrialRecord
    from chunktune.tuning.results.merge import merge
    from chunktune.tuning.results.model import Results

    def rec(n: int, budget: int, chat: float, client: float, engine: float,
            band: tuple[float, float]) -> TrialRecord:
        return TrialRecord(number=n, params={"max-num-batched-tokens": budget},
                           state=TrialState.COMPLETE,
                           metrics={KEY: chat, "itl_p99": client, "engine_itl_p99": engine},
                           itl_band=band)

    trials = [rec(0, 2048, 0.0178, 0.0206, 0.0176, (0.01427, 0.12554)),
              rec(4, 4096, 0.0188, 0.0213, 0.0151, (0.01339, 0.02427)),
              rec(6, 2048, 0.0304, 0.0519, 0.0226, (0.01661, 0.21205)),
              rec(7, 4096, 0.0181, 0.0214, 0.0176, (0.01405, 0.02207))]
    merged = merge(trials)
    assert merged[0].noisy == () and merged[0].metrics[KEY] == pytest.approx(0.0241)
    res = Results(trials, [ITL], [], 0, None, [], merged)
    assert [c.params["max-num-batched-tokens"] for c in recheck_order(res)] == [4096, 2048]
    # the same clients' figure above the band's top is the host's: left out
    trials[2] = rec(6, 2048, 0.0304, 0.250, 0.0226, (0.01661, 0.21205))
    assert merge(trials)[0].noisy == (6,)
