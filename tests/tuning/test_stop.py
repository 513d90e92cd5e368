"""Stopping a study (Ctrl-C in ``chunktune tune``): a first request lets the trials in flight
finish and asks no new one; a second cancels them, and each runs again when the study resumes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from optuna.trial import TrialState as OptunaState

from chunktune.backends.simulated import SimulatedBackend
from chunktune.core.progress import EventKind, StopRequest, TrialEvent
from chunktune.core.trials import TrialPlan, TrialResult, TrialState
from chunktune.tuning import study as st
from chunktune.tuning.cli import StopOnSignal
from chunktune.tuning.tuner import Tuner
from tests.tuning.conftest import manifest


class Held(SimulatedBackend):
    """The simulated backend, each trial held until the test lets it go, so that the trials in
    flight when a stop is asked are known."""

    def __init__(self) -> None:
        super().__init__(max_parallel=2)
        self.gate: asyncio.Event | None = None

    async def run_trial(self, plan: TrialPlan, report: Any = None) -> TrialResult:
        if self.gate is None:
            self.gate = asyncio.Event()
        await self.gate.wait()
        return await super().run_trial(plan, report)

    def release(self) -> None:
        if self.gate is None:
            self.gate = asyncio.Event()
        self.gate.set()


def held_study(make_tuning: Any, storage: Path, when_two: Any) -> tuple[Tuner, Held]:
    """A study with two trials in flight at once; ``when_two(tuner, backend, request)`` runs
    when the second has started (``request`` holds the stop request)."""
    backend = Held()
    request: dict[str, StopRequest | None] = {"now": None}
    started: list[int] = []
    tuner = Tuner(make_tuning(budget={"maxTrials": 6, "parallelism": 2}), backend,
                  str(storage), stop_requested=lambda: request["now"])

    def on_event(e: TrialEvent) -> None:
        if e.kind == EventKind.STARTED:
            started.append(e.number)
            if len(started) == 2:
                when_two(tuner, backend, request)

    tuner.on_event = on_event
    return tuner, backend


def by_state(tuner: Tuner) -> dict[int, str]:
    return {t.number: st.trial_state(t) for t in tuner.trials()
            if t.state != OptunaState.WAITING}


def test_a_first_stop_lets_the_trials_in_flight_finish(make_tuning, tmp_path):
    def drain(tuner: Tuner, backend: Held, request: dict[str, Any]) -> None:
        request["now"] = StopRequest.DRAIN
        backend.release()  # the two trials in flight may end now

    tuner, _ = held_study(make_tuning, tmp_path / "s.journal", drain)
    assert asyncio.run(tuner.run()) == "stopped"
    # both trials in flight were measured and recorded; no third one was asked
    assert by_state(tuner) == {0: TrialState.COMPLETE, 1: TrialState.COMPLETE}
    assert tuner.counted() == 2


def test_a_second_stop_cancels_them_and_they_run_again_on_resume(make_tuning, tmp_path):
    def drain_then_cancel(tuner: Tuner, backend: Held, request: dict[str, Any]) -> None:
        request["now"] = StopRequest.DRAIN
        # the trials stay held: only the cancel can end them
        asyncio.get_running_loop().call_later(0.1, request.update, {"now": StopRequest.CANCEL})

    storage = tmp_path / "s.journal"
    tuner, _ = held_study(make_tuning, storage, drain_then_cancel)
    assert asyncio.run(tuner.run()) == "stopped"
    assert by_state(tuner) == {0: TrialState.RUNNING, 1: TrialState.RUNNING}
    points = {t.number: st.point_of(t) for t in tuner.trials() if t.number < 2}

    again = Tuner(make_tuning(budget={"maxTrials": 3, "parallelism": 2}),
                  SimulatedBackend(max_parallel=2), str(storage))
    assert asyncio.run(again.run()) == "budget"
    trials = [t for t in again.trials() if t.state != OptunaState.WAITING]
    for t in trials[:2]:
        assert st.trial_state(t) == TrialState.FAIL
        assert t.user_attrs[st.ATTR_REASON] == "Interrupted"
    rerun = [st.point_of(t) for t in trials[2:] if st.trial_state(t) == TrialState.COMPLETE]
    assert points[0] in rerun and points[1] in rerun
    assert again.counts()["INTERRUPTED"] == 2 and again.counted() == 3


def test_ctrl_c_asks_drain_then_cancel_then_aborts(capsys: pytest.CaptureFixture[str]) -> None:
    stop = StopOnSignal()
    old = signal.getsignal(signal.SIGINT)
    try:
        assert stop() is None
        stop.on_signal(signal.SIGINT, None)
        assert stop() == StopRequest.DRAIN
        assert "stopping after the trials in flight" in capsys.readouterr().err
        stop.on_signal(signal.SIGINT, None)
        assert stop() == StopRequest.CANCEL
        assert "cancelling the trials in flight" in capsys.readouterr().err
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, old)


def test_ctrl_c_in_chunktune_tune_finishes_the_trial_in_flight(tmp_path):
    """The command itself: one SIGINT while a trial runs ends the study with ``stopped``, that
    trial measured and recorded, and none left in flight."""
    m = manifest(budget={"maxTrials": 40}, sampler={"name": "random", "seed": 3})
    m["spec"]["workload"]["duration"] = "120s"
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(m))
    storage = tmp_path / "s.journal"
    proc = subprocess.Popen([sys.executable, "-m", "chunktune", "tune", str(path), "--storage",
                             str(storage), "--backend", "simulated"],
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    in_flight = None
    deadline = time.monotonic() + 300
    try:
        while in_flight is None and time.monotonic() < deadline and proc.poll() is None:
            if storage.exists() and "test/t" in optuna.get_all_study_names(
                    st.open_storage(str(storage))):
                trials = load(storage).trials
                running = [t.number for t in trials if t.state == OptunaState.RUNNING
                           and st.ATTR_OWNER in t.user_attrs]
                if running and any(t.state == OptunaState.COMPLETE for t in trials):
                    in_flight = running[0]
                    proc.send_signal(signal.SIGINT)
            time.sleep(0.05)
        out, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert in_flight is not None, "never caught a trial in flight"
    assert proc.returncode == 0, err
    assert "stopping after the trials in flight" in err
    assert "study stopped: stopped" in out
    trials = load(storage).trials
    assert st.trial_state(trials[in_flight]) in (TrialState.COMPLETE, TrialState.INFEASIBLE)
    assert OptunaState.RUNNING not in [t.state for t in trials] and len(trials) < 40


def load(storage: Path) -> optuna.Study:
    return optuna.load_study(study_name="test/t", storage=st.open_storage(str(storage)))
