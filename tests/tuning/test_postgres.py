"""Studies in a real PostgreSQL server (:mod:`tests.postgres`): two writers on one study, the
database restarted mid-study, a wrong password."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import yaml

from chunktune.api.reader import parse_manifest
from chunktune.backends.simulated import SimulatedBackend
from chunktune.core.trials import RESULT_STATES, Reporter, TrialPlan, TrialResult, TrialState
from chunktune.tuning import storage as storages
from chunktune.tuning import study as st
from chunktune.tuning.tuner import Tuner
from tests.postgres import PostgresServer
from tests.tuning.conftest import manifest


# NOTE: the tests with a server are slow (a PostgreSQL server, chunktune tune processes)
@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    with PostgresServer() as server:
        yield server


def _trials(url: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name="test/t", storage=storages.open_storage(url)).trials


def _check_complete(trials: list[optuna.trial.FrozenTrial], max_trials: int) -> None:
    """Numbers 0..n-1 once each; every trial ended with a result (none RUNNING, none failed
    by a fault); exactly ``max_trials`` counted; no configuration measured twice."""
    assert sorted(t.number for t in trials) == list(range(len(trials)))
    states = [st.trial_state(t) for t in trials]
    assert TrialState.RUNNING not in states and TrialState.WAITING not in states
    assert TrialState.FAIL not in states, [(t.number, t.user_attrs.get(st.ATTR_REASON))
                                           for t in trials]
    counted = [t for t in trials if st.trial_state(t) in RESULT_STATES]
    assert len(counted) == max_trials
    points = [tuple(sorted(st.point_of(t).items())) for t in counted]
    assert len(points) == len(set(points))
    assert sum(bool(t.user_attrs.get(st.ATTR_BASELINE)) for t in counted) == 1


@pytest.mark.slow
def test_two_writers_share_one_study(pg: PostgresServer, tmp_path: Path) -> None:
    """Two ``chunktune tune`` processes on one study in PostgreSQL (the password from
    PGPASSWORD, not the URL): one budget, no duplicate trial number, nothing lost."""
    url = pg.create_database("two_writers")
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(manifest(
        budget={"maxTrials": 12}, sampler={"name": "random", "seed": 3},
        workload={"profile": "mixed", "duration": "30s", "warmup": "2s"})))
    shown = pg.url("two_writers", with_password=False)
    cmd = [sys.executable, "-m", "chunktune", "tune", str(path), "--storage", shown, "-q"]
    env = {**os.environ, "PGPASSWORD": pg.password}
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=280)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert all(pg.password not in out for out in outs)
    trials = _trials(url)
    _check_complete(trials, 12)
    owners = {str(t.user_attrs.get(st.ATTR_OWNER)).split(":")[1] for t in trials
              if st.trial_state(t) in RESULT_STATES}
    assert owners == {str(p.pid) for p in procs}, owners  # both wrote trials


class _Retried(logging.Handler):
    """Sets ``event`` when the storage logs that it waits for the database."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "retrying" in record.getMessage():
            self.event.set()


class _HeldFromThird(SimulatedBackend):
    """Trials from the third on wait until the database is down: the outage lands mid-study
    however fast the first trials ran."""

    def __init__(self, stopped: threading.Event) -> None:
        super().__init__()
        self.stopped = stopped

    async def run_trial(self, plan: TrialPlan, report: Reporter | None = None) -> TrialResult:
        if plan.number >= 2:
            await asyncio.to_thread(self.stopped.wait, 120)
        return await super().run_trial(plan, report)


@pytest.mark.slow
def test_database_restart_mid_study_loses_nothing(pg: PostgresServer) -> None:
    """The server stops mid-study and comes back: the storage calls wait for it, the study
    goes on, every trial has its result and no budget went to the fault."""
    url = pg.create_database("restart")
    tuning = parse_manifest(manifest(budget={"maxTrials": 8},
                                     workload={"profile": "mixed", "duration": "30s",
                                               "warmup": "2s"}))
    stopped = threading.Event()
    tuner = Tuner(tuning, _HeldFromThird(stopped), url)
    handler = _Retried()
    logging.getLogger(storages.__name__).addHandler(handler)
    restarted = threading.Event()

    def restart() -> None:
        study = optuna.load_study(study_name="test/t", storage=storages.open_storage(url))
        while sum(1 for t in study.trials if st.trial_state(t) in RESULT_STATES) < 2:
            restarted.wait(0.05)
        pg.stop()
        stopped.set()
        handler.event.wait(120)  # the tuner met the outage
        pg.start()
        restarted.set()

    thread = threading.Thread(target=restart, daemon=True)
    thread.start()
    try:
        why = asyncio.run(tuner.run())
    finally:
        logging.getLogger(storages.__name__).removeHandler(handler)
        thread.join(180)
    assert restarted.is_set() and handler.event.is_set()
    assert why == "budget"
    _check_complete(_trials(url), 8)


@pytest.mark.slow
def test_wrong_password_is_a_clear_error(pg: PostgresServer, tmp_path: Path) -> None:
    """``chunktune tune`` with a wrong password fails at once (no retries), naming the
    database without its password, spec.storage and the fix."""
    pg.create_database("wrong")
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(manifest(storage=pg.url("wrong", with_password=False))))
    out = subprocess.run([sys.executable, "-m", "chunktune", "tune", str(path)],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PGPASSWORD": "not-the-password",
                              "CHUNKTUNE_STORAGE_RETRY_SECONDS": "600"})
    assert out.returncode == 1, out.stdout + out.stderr
    assert "the password was refused" in out.stderr
    assert "spec.storage" in out.stderr and "PGPASSWORD" in out.stderr
    assert f"127.0.0.1:{pg.port}/wrong" in out.stderr
    assert "not-the-password" not in out.stderr + out.stdout


def _running(owner: str | None, beat: float | None = None,
             started: float | None = None) -> optuna.trial.FrozenTrial:
    import datetime

    attrs: dict[str, object] = {}
    if owner is not None:
        attrs[st.ATTR_OWNER] = owner
    if beat is not None:
        attrs[st.ATTR_HEARTBEAT] = beat
    return optuna.trial.FrozenTrial(
        number=0, state=optuna.trial.TrialState.RUNNING, value=None,
        datetime_start=datetime.datetime.fromtimestamp(started or 0.0), datetime_complete=None,
        params={}, distributions={}, user_attrs=attrs, system_attrs={}, intermediate_values={},
        trial_id=0)


@pytest.mark.parametrize(("who", "left"), [
    ("me", False),                  # this writer's own trial
    ("dead-pid", True),             # a process of this host that is gone
    ("earlier-life", True),         # this pid, an earlier start (a restarted container)
    ("live-pid", False),            # another live process of this host
    ("other-host-fresh", False),    # another host, heartbeat within the grace
    ("other-host-stale", True),     # another host, no heartbeat for longer than the grace
    ("no-owner-new", False),        # asked a moment ago, its owner not written yet
    ("no-owner-old", True),         # asked long ago and never started
])
def test_which_running_trials_another_writer_left(who: str, left: bool) -> None:
    import socket
    import time

    now = time.time()
    host = socket.gethostname()
    me = f"{host}:{os.getpid()}:{now:.6f}"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    trial = {
        "me": _running(me, now),
        "dead-pid": _running(f"{host}:{dead.pid}:1.0", now),
        "earlier-life": _running(f"{host}:{os.getpid()}:1.0", now),
        "live-pid": _running(f"{host}:{os.getppid()}:1.0", now),
        "other-host-fresh": _running("elsewhere:1:1.0", now - 5),
        "other-host-stale": _running("elsewhere:1:1.0", now - st.HEARTBEAT_GRACE - 1),
        "no-owner-new": _running(None, started=now - 1),
        "no-owner-old": _running(None, started=now - st.HEARTBEAT_GRACE - 1),
    }[who]
    assert st.abandoned(trial, me, now) is left
