"""A twin-first study (``spec.strategy.name: twin``) in the operator, end to end against the
emulator: real calibration and confirmation trials run by the fake kubelet as ``chunktune sim
serve`` pods (which log vLLM's ``Iteration`` lines, so the twin calibrates on their step logs),
the search simulated in process, and operators stopped between the phases:

* gracefully once the calibration trials are done and the simulated search is under way (or
  over: the study in confirm), then a second operator process (which resumes the search where
  it was) SIGKILLed while a confirmation trial runs, then a third adopts that trial and
  finishes;
* no calibration trial runs twice, the search study holds at most ``simulatedTrials`` counted
  trials, the confirmed trials carry the twin's prediction, the best measured configuration is
  rechecked by a trial pod of its own (``recheckTrials``), ``status.twin`` ends ``done`` with
  the twin's error, ``TwinPhase`` events are posted, the best is measured, and no trial object
  is left behind.
"""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path
from typing import Any

import optuna
import pytest

from chunktune.backends.manifests import TRIAL, TUNING
from chunktune.core.trials import TrialState
from chunktune.tuning import study as st
from tests.k8s.conftest import (
    journal_of,
    operator_settings,
    running_operator,
    status_of,
    study_in,
    trial_objects,
    tuning,
    wait_phase,
)
from tests.k8s.test_lifecycle import operator_process
from tests.kube.emulator import KubeEmulator, WatchEvent
from tests.kube.kubelet import FakeKubelet

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

NAME = "twin"
STRATEGY = {"name": "twin", "calibrationTrials": 2, "simulatedTrials": 40, "simulatedLoads": 1,
            "confirmTrials": 2, "refineRounds": 0, "maxTwinError": 10, "recheckTrials": 1}
MAX_TRIALS = 5
COUNTED = (TrialState.COMPLETE, TrialState.INFEASIBLE, TrialState.PRUNED, TrialState.FAIL)


def twin_tuning() -> dict[str, Any]:
    return tuning(NAME, strategy=STRATEGY, budget={"maxTrials": MAX_TRIALS, "parallelism": 1},
                  searchSpace=[{"name": "max-num-batched-tokens", "type": "int", "low": 512,
                                "high": 8192, "step": 256},
                               {"name": "long-prefill-token-threshold",
                                "choices": [0, 256, 1024]}],
                  workload={"profile": "smoke", "duration": "4s", "warmup": "1s"},
                  sampler={"name": "tpe", "seed": 3}, pruner={"name": "none"})


def twin_phase(kube: KubeEmulator) -> str | None:
    return (status_of(kube, NAME).get("twin") or {}).get("phase")


def events(kube: KubeEmulator) -> list[dict[str, Any]]:
    return [e for e in kube.objects("v1/events", "default")
            if (e.get("involvedObject") or {}).get("name") == NAME]


def real_trials(kube: KubeEmulator, state_dir: Path) -> list[optuna.trial.FrozenTrial]:
    study = study_in(journal_of(kube, state_dir, NAME), NAME)
    return [t for t in study.trials if st.trial_state(t) != TrialState.WAITING]


def searched(kube: KubeEmulator, state_dir: Path) -> int:
    """Counted trials of the twin's search study (0 before it exists)."""
    storage = st.open_storage(str(journal_of(kube, state_dir, NAME)))
    try:
        search = optuna.load_study(study_name=f"default/{NAME}#twin-search-1", storage=storage)
    except KeyError:
        return 0
    return sum(1 for t in search.trials if st.trial_state(t) in COUNTED)


def mid_search(kube: KubeEmulator, state_dir: Path) -> str | None:
    """``search`` once the search has counted trials, ``confirm`` if it ended already."""
    phase = twin_phase(kube)
    if (phase == "search" and searched(kube, state_dir) > 0) or phase == "confirm":
        return phase
    return None


def confirm_running(kube: KubeEmulator, state_dir: Path) -> int | None:
    """The number of a confirmation trial whose engine pod runs."""
    if twin_phase(kube) != "confirm":
        return None
    for t in real_trials(kube, state_dir):
        if t.user_attrs.get(st.ATTR_PHASE) == "confirm" and \
                st.trial_state(t) == TrialState.RUNNING:
            pod = kube.get("pods", "default", f"{NAME}-t{t.number}") or {}
            if (pod.get("status") or {}).get("phase") == "Running":
                return t.number
    return None


async def test_twin_study_survives_operator_restarts_between_phases(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path) -> None:
    engine_pods: Counter[int] = Counter()  # engine pod creations per trial number

    def on_change(event: WatchEvent) -> None:
        meta = event.object.get("metadata", {})
        labels = meta.get("labels") or {}
        if event.type == "ADDED" and event.object.get("kind") == "Pod" and \
                labels.get(TUNING) == NAME and TRIAL in labels and "job-name" not in labels:
            engine_pods[int(labels[TRIAL])] += 1

    # status.twin.phase as each status write left it (None: no status.twin)
    seen: list[str | None] = []

    def on_status(event: WatchEvent) -> None:
        obj = event.object
        if obj.get("kind") == "ChunkedPrefillTuning" and obj["metadata"]["name"] == NAME and \
                "status" in obj:
            phase = (obj["status"].get("twin") or {}).get("phase")
            if not seen or seen[-1] != phase:
                seen.append(phase)

    kube.server.add_listener(on_change)
    kube.server.add_listener(on_status)
    kube.create("cpt", twin_tuning(), "default")
    settings = operator_settings(tmp_path)

    # 1. calibration runs for real; the operator stops gracefully once the search is under way
    async with running_operator(kube, settings):
        stopped_in = await kube.until(lambda: mid_search(kube, tmp_path), timeout=120,
                                      interval=0.1, message="the twin's search under way")
    searched_before = searched(kube, tmp_path)
    assert stopped_in == "confirm" or searched_before < STRATEGY["simulatedTrials"]
    calibrated = {t.number: t.datetime_start for t in real_trials(kube, tmp_path)
                  if t.user_attrs.get(st.ATTR_PHASE) == "calibrate"}
    assert len(calibrated) == STRATEGY["calibrationTrials"]
    assert all(st.trial_state(t) == TrialState.COMPLETE for t in real_trials(kube, tmp_path)
               if t.number in calibrated)
    assert status_of(kube, NAME)["twin"]["realTrials"] == STRATEGY["calibrationTrials"]

    # 2. a second operator process resumes in that phase (the search study continued, not
    # restarted) and is SIGKILLed while a confirmation trial runs (its objects stay)
    proc = operator_process(kube, tmp_path)
    try:
        killed_in = await kube.until(lambda: confirm_running(kube, tmp_path), timeout=120,
                                     interval=0.1, message="a confirmation trial running")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert kube.get("pods", "default", f"{NAME}-t{killed_in}") is not None

    # 3. a third operator adopts the confirmation trial and finishes the study
    async with running_operator(kube, settings):
        status = await wait_phase(kube, NAME, ("Succeeded", "Failed"), timeout=150)
    assert status["phase"] == "Succeeded", status.get("message")

    trials = real_trials(kube, tmp_path)
    by_phase: dict[str, list[int]] = {}
    for t in trials:
        by_phase.setdefault(t.user_attrs.get(st.ATTR_PHASE), []).append(t.number)
    # no calibration trial ran twice: the same trials, started once, one engine pod each
    assert sorted(by_phase["calibrate"]) == sorted(calibrated)
    for t in trials:
        if t.number in calibrated:
            assert t.datetime_start == calibrated[t.number]
    assert all(engine_pods[n] == 1 for n in calibrated), engine_pods
    # the confirmation trial in flight at the kill was adopted, not run again
    assert engine_pods[killed_in] == 1, engine_pods
    assert all(n == 1 for n in engine_pods.values()), engine_pods
    assert {st.trial_state(t) for t in trials} == {TrialState.COMPLETE}
    assert set(by_phase) == {"calibrate", "confirm", "recheck"}
    assert 1 <= len(by_phase["confirm"]) <= STRATEGY["confirmTrials"]
    # the recheck: the best configuration measured before it, measured again by a trial (and an
    # engine pod) of its own, last
    [rechecked] = by_phase["recheck"]
    assert rechecked == max(t.number for t in trials) and engine_pods[rechecked] == 1
    point = st.point_of(next(t for t in trials if t.number == rechecked))
    twice = [t.number for t in trials if st.point_of(t) == point]
    assert len(twice) == 2 and rechecked in twice

    # the search study in the storage was continued, never restarted past its budget
    storage = st.open_storage(str(journal_of(kube, tmp_path, NAME)))
    names = optuna.get_all_study_names(storage)
    assert sorted(n for n in names if "#twin-search-" in n) == [f"default/{NAME}#twin-search-1"]
    search = optuna.load_study(study_name=f"default/{NAME}#twin-search-1", storage=storage)
    counted = [t for t in search.trials if st.trial_state(t) in COUNTED]
    assert 0 < searched_before <= len(counted) <= STRATEGY["simulatedTrials"]

    # the status: the twin's phase, counts and error; confirmed trials with predictions
    twin = status["twin"]
    assert twin["phase"] == "done" and twin["round"] == 1
    assert twin["realTrials"] == len(trials) <= MAX_TRIALS
    assert twin["simulatedTrials"] == len(counted)
    assert twin["twinError"] and all(v >= 0 for v in twin["twinError"].values())
    assert twin["trusted"] is True
    listed = {t["number"]: t for t in status["trials"]}
    for n in by_phase["confirm"]:
        assert listed[n]["phase"] == "confirm" and listed[n]["predicted"], listed[n]
    for n in by_phase["calibrate"]:
        assert listed[n]["phase"] == "calibrate" and "predicted" not in listed[n]
    assert status["best"]["trial"] in {t.number for t in trials}  # a measured trial
    if status["best"]["trial"] in twice:  # shown as the mean of its two measurements
        assert status["best"]["repeats"] == twice
    assert status["counts"]["completed"] == len(trials)

    # the status never lost status.twin (a restarted operator reports the phase from its first
    # write) and never went back to an earlier phase
    first = next(i for i, x in enumerate(seen) if x is not None)
    assert None not in seen[first:], seen
    order = ["calibrate", "search", "confirm", "recheck", "done"]
    assert seen[first:] == sorted(seen[first:], key=order.index), seen
    assert seen[-1] == "done"

    # events: the phases as they were entered, the calibration announced once
    phases = [e["message"].split(":", 1)[0] for e in events(kube) if e["reason"] == "TwinPhase"]
    assert phases.count("calibrate") == 1, phases
    assert "search" in phases and "confirm" in phases and phases[-1] == "done", phases
    assert phases[-2] == "recheck", phases
    assert not [e for e in events(kube) if e["reason"] == "TwinUntrusted"]
    await kube.until(lambda: not trial_objects(kube, NAME), message="trial objects deleted")
