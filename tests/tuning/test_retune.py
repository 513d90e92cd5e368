"""A re-tune's study (``spec.retune``): warm-started from the previous one, the running
configuration as its baseline, and the decision to apply its best only after a confirmed gain.
The operator's watch around it is in tests/k8s/test_retune.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import optuna
import pytest

from chunktune.api.reader import parse_manifest
from chunktune.api.v1alpha1 import RetuneSpec
from chunktune.backends.simulated import SimulatedBackend
from chunktune.core.progress import TwinPhase
from chunktune.tuning import retune as rt
from chunktune.tuning import study as st
from chunktune.tuning.objectives import ConstraintDef, ObjectiveDef
from chunktune.tuning.results.model import collect
from chunktune.tuning.strategies.twin_state import TwinState
from chunktune.tuning.tuner import Tuner
from tests.tuning.conftest import manifest

TTFT = ObjectiveDef("ttft_p99", None, "minimize")
ITL = ConstraintDef("itl_p99", None, max=0.05, min=None)
BUDGET = "max-num-batched-tokens"


def study_of(rows: list[tuple[int, float, float, dict[str, Any]]]) -> optuna.Study:
    """Completed trials ``(budget, TTFT p99, ITL p99, user attributes)``; an ITL p99 above
    50 ms misses the constraint."""
    study = optuna.create_study()
    dist = {BUDGET: optuna.distributions.IntDistribution(256, 16384)}
    for budget, ttft, itl, attrs in rows:
        study.add_trial(optuna.trial.create_trial(
            params={BUDGET: budget}, distributions=dist, values=[ttft],
            constraints={"itl_p99": itl - 0.05},
            user_attrs={st.ATTR_METRICS: {"ttft_p99": ttft, "itl_p99": itl}, **attrs}))
    return study


BASE = {st.ATTR_BASELINE: True}
AGAIN = {st.ATTR_PHASE: TwinPhase.RECHECK.value}


def decide(rows: list[tuple[int, float, float, dict[str, Any]]],
           min_gain: float = 0.05) -> rt.Decision:
    return rt.decide(collect(study_of(rows), [TTFT], [ITL]), min_gain)


def test_a_confirmed_gain_replaces_the_running_configuration() -> None:
    d = decide([(8192, 1.0, 0.02, BASE), (2048, 0.7, 0.02, {}), (2048, 0.8, 0.02, AGAIN)])
    assert d.apply and d.best == {BUDGET: 2048}
    assert d.before == 1.0 and d.after == pytest.approx(0.75) and d.gain == "-25%"
    assert d.confirmed_by == (1, 2) and "confirmed by 2 measurements" in d.message


def test_a_running_configuration_that_misses_a_constraint_is_replaced() -> None:
    d = decide([(8192, 0.5, 0.09, BASE), (512, 0.9, 0.02, {}), (512, 0.9, 0.02, AGAIN)])
    assert d.apply and "misses a constraint" in d.message
    assert d.gain == "+80%"  # slower, but within the SLO the running one misses


@pytest.mark.parametrize(("rows", "why"), [
    ([(8192, 1.0, 0.02, BASE), (2048, 0.98, 0.02, {}), (2048, 0.98, 0.02, AGAIN)],
     "less than minGain 5%"),
    ([(8192, 1.0, 0.02, BASE), (2048, 0.5, 0.02, {})], "not measured again"),
    ([(8192, 0.5, 0.02, BASE), (2048, 0.9, 0.02, {}), (8192, 0.5, 0.02, AGAIN)],
     "still the best"),
    ([(8192, 0.5, 0.09, BASE), (2048, 0.4, 0.08, {})], "no configuration met every"),
])
def test_the_running_configuration_is_kept(rows: Any, why: str) -> None:
    d = decide(rows)
    assert not d.apply and why in d.message


def retune_spec(**kw: Any) -> RetuneSpec:
    return RetuneSpec.model_validate({"strategy": "real", "maxTrials": 3, "confirmTrials": 1,
                                      "warmStart": 2, **kw})


def tuner_for(tmp_path: Path, m: dict[str, Any], name: str | None = None) -> Tuner:
    return Tuner(parse_manifest(m), SimulatedBackend(), str(tmp_path / "s.journal"),
                 study_name=name)


def test_a_real_retune_measures_the_running_configuration_first_then_confirms(
        tmp_path: Path) -> None:
    space = [{"name": BUDGET, "choices": [512, 2048, 8192]}]
    m = manifest(searchSpace=space, workload={"profile": "smoke", "duration": "20s",
                                              "warmup": "2s"},
                 objectives=[{"metric": "ttft_p99"}], constraints=["itl_p99 <= 200ms"],
                 budget={"maxTrials": 3}, sampler={"name": "random", "seed": 2})
    first = tuner_for(tmp_path, m)
    asyncio.run(first.run())
    spec = retune_spec()
    tuning = rt.retune_tuning(parse_manifest(m), spec, 1, reuse_profile=False)
    assert tuning.metadata.name == "t-r1" and tuning.spec.retune is None
    assert tuning.spec.budget.max_trials == 4 and tuning.spec.strategy.recheck_trials == 1
    name = rt.study_name(parse_manifest(m), 1)
    again = Tuner(tuning, SimulatedBackend(), str(tmp_path / "s.journal"), study_name=name)
    assert name == "test/t#retune-1"
    running = {BUDGET: 512}
    assert rt.seed(again, running, first.study, spec, ["prompt length p50 +300%"], 1)
    assert not rt.seed(again, running, first.study, spec, [], 1)  # once
    queued = [t for t in again.trials() if t.state == optuna.trial.TrialState.WAITING]
    assert queued[0].user_attrs[st.ATTR_BASELINE] and st.point_of(queued[0]) == running
    previous_best = rt.best_points(first.study, again)
    assert [st.point_of(t) for t in queued[1:]] == [p for p in previous_best
                                                    if p != running][:2]
    asyncio.run(again.run())
    res = collect(again.study, again.objectives, again.constraints)
    assert res.baseline == 0 and st.point_of(again.study.trials[0]) == running
    rechecked = [t for t in again.study.trials
                 if t.user_attrs.get(st.ATTR_PHASE) == TwinPhase.RECHECK]
    assert len(rechecked) == 1
    d = rt.decide(res, spec.min_gain)
    assert d.metric == "ttft_p99" and d.before == res.baseline_trial.metrics["ttft_p99"]
    if d.apply:
        assert d.best != running and len(d.confirmed_by) >= 2


def test_a_twin_retune_reuses_the_previous_calibration(tmp_path: Path) -> None:
    m = manifest(strategy={"name": "twin", "calibrationTrials": 3})
    previous = optuna.create_study(storage=st.open_storage(str(tmp_path / "s.journal")),
                                   study_name="test/t")
    profile = {"fitted": "round 2", "step": [1, 2, 3]}
    TwinState().set_profile(previous, 1, {"fitted": "round 1"})
    TwinState().set_profile(previous, 2, profile)
    assert rt.twin_profile(previous) == profile
    spec = retune_spec(strategy="twin")
    tuning = rt.retune_tuning(parse_manifest(m), spec, 1, reuse_profile=True)
    assert tuning.spec.strategy.name == "twin" and tuning.spec.strategy.refine_rounds == 0
    tuner = Tuner(tuning, SimulatedBackend(), str(tmp_path / "s.journal"),
                  study_name=rt.study_name(tuning, 1))
    running = {BUDGET: 4096, "long-prefill-token-threshold": 512}
    rt.seed(tuner, running, previous, spec, ["drift"], 1)
    stored = TwinState.read(tuner.study)
    assert stored.round(1).profile == profile
    assert stored.calibration == [running]  # one real trial calibrates nothing new
    # the strategy the tuner holds sees what was seeded (it read the storage before)
    assert tuner.strategy.state.calibration == [running]  # type: ignore[attr-defined]
    assert tuner.strategy.state.round(1).profile == profile  # type: ignore[attr-defined]
    (queued,) = tuner.trials()
    assert queued.user_attrs[st.ATTR_PHASE] == "calibrate"
    assert queued.user_attrs[st.ATTR_BASELINE] and st.point_of(queued) == running


def test_a_twin_retune_without_a_previous_twin_calibrates_from_the_running_one(
        tmp_path: Path) -> None:
    m = manifest(strategy={"name": "twin", "calibrationTrials": 3})
    previous = optuna.create_study(storage=st.open_storage(str(tmp_path / "s.journal")),
                                   study_name="test/t")
    spec = retune_spec(strategy="twin")
    tuning = rt.retune_tuning(parse_manifest(m), spec, 2, reuse_profile=False)
    assert tuning.spec.strategy.refine_rounds == 1  # the spec's own
    tuner = Tuner(tuning, SimulatedBackend(), str(tmp_path / "s.journal"),
                  study_name=rt.study_name(tuning, 2))
    running = {BUDGET: 4096, "long-prefill-token-threshold": 512}
    rt.seed(tuner, running, previous, spec, ["drift"], 2)
    stored = TwinState.read(tuner.study)
    points = stored.calibration
    assert points is not None
    assert len(points) == 3 and points[0] == running and len({str(p) for p in points}) == 3
    assert stored.round(1).profile is None


@pytest.mark.slow  # the first study fits a twin
def test_a_twin_retune_searches_the_previous_twin_under_the_new_workload(
        tmp_path: Path) -> None:
    twin = {"name": "twin", "calibrationTrials": 2, "simulatedTrials": 6, "simulatedLoads": 1,
            "confirmTrials": 1, "refineRounds": 0}
    m = manifest(strategy=twin, workload={"profile": "smoke", "duration": "10s",
                                          "warmup": "1s"},
                 objectives=[{"metric": "ttft_p99"}], constraints=[],
                 budget={"maxTrials": 4}, sampler={"name": "tpe", "seed": 3})
    backend = SimulatedBackend(keep_steps=True, steps_dir=tmp_path / "steps")
    first = Tuner(parse_manifest(m), backend, str(tmp_path / "s.journal"))
    asyncio.run(first.run())
    assert rt.twin_profile(first.study) is not None
    # the same engine under heavier traffic
    heavier = manifest(strategy=twin, workload={"profile": "smoke", "duration": "10s",
                                                "warmup": "1s", "rate": 12},
                       objectives=[{"metric": "ttft_p99"}], constraints=[],
                       budget={"maxTrials": 4}, sampler={"name": "tpe", "seed": 3})
    spec = retune_spec(strategy="twin", maxTrials=2)
    tuning = rt.retune_tuning(parse_manifest(heavier), spec, 1, reuse_profile=True)
    again = Tuner(tuning, backend, str(tmp_path / "s.journal"),
                  study_name=rt.study_name(parse_manifest(m), 1))
    running = {k: v for k, v in st.point_of(first.study.trials[0]).items()}
    rt.seed(again, running, first.study, spec, ["arrival rate"], 1)
    why = asyncio.run(again.run())
    assert why in ("rounds", "budget"), why
    phases = [t.user_attrs.get(st.ATTR_PHASE) for t in again.study.trials
              if st.trial_state(t) != "WAITING"]
    # one real calibration trial (the running configuration), the twin's best confirmed,
    # then the confirmation of the measured best; the previous profile searched
    assert phases[0] == "calibrate" and phases.count("calibrate") == 1, phases
    assert "confirm" in phases and phases[-1] == TwinPhase.RECHECK, phases
    assert TwinState.read(again.study).round(1).profile == rt.twin_profile(first.study)
    d = rt.decide(collect(again.study, again.objectives, again.constraints), spec.min_gain)
    assert d.before is not None and d.metric == "ttft_p99"
