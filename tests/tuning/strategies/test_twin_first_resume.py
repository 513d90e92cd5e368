"""A twin-first study resumed by a new process (what the operator does after a restart): it
reports where it is from the start, announces only the phases it really enters, and fits the
twin's profile off the event loop."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import optuna
import pytest

from chunktune.core.progress import StopRequest, TrialEvent
from chunktune.core.trials import RESULT_STATES
from chunktune.tuning import study as st
from chunktune.tuning.strategies import twin_fit
from chunktune.tuning.tuner import Tuner
from tests.tuning.strategies.test_twin_first import make_tuner, twin_manifest


def stopped_at(tmp_path: Path, m: dict[str, Any], phase: str) -> Tuner:
    """Run ``m`` until the first ``phase`` event, then stop (as an exiting process does)."""
    stop = {"now": False}

    def on_event(e: TrialEvent) -> None:
        if e.kind == "phase" and e.phase == phase:
            stop["now"] = True

    tuner = make_tuner(tmp_path, m, stop=lambda: StopRequest.CANCEL if stop["now"] else None)
    tuner.on_event = on_event
    assert asyncio.run(tuner.run()) == "stopped"
    return tuner


def searched(tmp_path: Path) -> int:
    search = optuna.load_study(study_name="test/t#twin-search-1",
                               storage=st.open_storage(str(tmp_path / "s.journal")))
    return sum(1 for t in search.trials if st.trial_state(t) in RESULT_STATES)


def test_a_study_resumed_in_confirm_neither_recalibrates_nor_searches_again(
        tmp_path: Path) -> None:
    m = twin_manifest(refineRounds=0)
    stopped_at(tmp_path, m, "confirm")
    n = searched(tmp_path)
    assert n > 0
    events: list[TrialEvent] = []
    again = make_tuner(tmp_path, m, events)
    # before run(): the phase, round and counts the storage holds (the operator's first
    # status write comes before run())
    status = again.strategy.status()
    assert (status["phase"], status["round"], status["simulatedTrials"]) == ("confirm", 1, n)
    assert status["realTrials"] == 3
    assert asyncio.run(again.run()) == "rounds"
    assert [e.phase for e in events if e.kind == "phase"] == ["confirm", "done"]
    assert searched(tmp_path) == n  # the search was not continued
    assert again.strategy.status()["simulatedTrials"] == n
    started = [e.number for e in events if e.kind == "started"]
    assert started and all(again.study.trials[i].user_attrs[st.ATTR_PHASE] == "confirm"
                           for i in started)


def test_a_study_resumed_in_search_reports_search_from_the_start(tmp_path: Path) -> None:
    m = twin_manifest(refineRounds=0)
    stopped_at(tmp_path, m, "search")
    events: list[TrialEvent] = []
    again = make_tuner(tmp_path, m, events)
    assert again.strategy.status()["phase"] == "search" and again.strategy.round == 1
    asyncio.run(again.run())
    phases = [e.phase for e in events if e.kind == "phase"]
    assert "calibrate" not in phases and phases[0] == "search" and phases[-1] == "done"


def test_a_done_study_reports_done_and_its_simulated_trials(tmp_path: Path) -> None:
    m = twin_manifest(refineRounds=0)
    first = make_tuner(tmp_path, m)
    asyncio.run(first.run())
    total = first.strategy.status()["simulatedTrials"]
    again = make_tuner(tmp_path, m)
    status = again.strategy.status()
    assert status["phase"] == "done" and status["simulatedTrials"] == total > 0


def test_the_profile_is_fitted_off_the_event_loop(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The fit simulates every measured run at several step gaps (seconds of CPU): in the
    operator it must not stall the event loop (kopf's watches, heartbeats, other studies)."""
    threads: list[bool] = []
    fit = twin_fit.fit_profile

    def spy(*args: Any) -> Any:
        threads.append(threading.current_thread() is threading.main_thread())
        return fit(*args)

    monkeypatch.setattr(twin_fit, "fit_profile", spy)
    stopped_at(tmp_path, twin_manifest(refineRounds=0), "confirm")
    assert threads == [False]
