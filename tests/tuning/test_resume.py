"""Resume after a kill: the process dies mid-trial; rerunning the same file with the same
storage continues the study, losing and repeating nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml

from chunktune.tuning import study as st
from tests.tuning.conftest import manifest

pytestmark = pytest.mark.slow  # real chunktune tune processes, killed and resumed


def _load(storage):
    return optuna.load_study(study_name="test/t", storage=st.open_storage(str(storage)))


def _kill_mid_trial(cmd: list[str], env: dict[str, str], storage: Path) -> optuna.Study:
    """Run ``cmd``, SIGKILL it once two trials are done and a third has its point chosen (one
    killed between its creation and its point has nothing to run again), and return the study
    as the kill left it: read after the process is gone, as the trial may have ended between
    the look and the kill."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            # the journal file is written before the study is in it
            if storage.exists() and "test/t" in optuna.get_all_study_names(
                    st.open_storage(str(storage))):
                trials = _load(storage).trials
                done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
                running = [t for t in trials if t.state == optuna.trial.TrialState.RUNNING
                           and st.ATTR_OWNER in t.user_attrs and st.point_of(t)]
                if len(done) >= 2 and running:
                    proc.send_signal(signal.SIGKILL)
                    break
            time.sleep(0.02)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    return _load(storage)


def test_kill_mid_trial_then_resume(tmp_path):
    m = manifest(budget={"maxTrials": 6}, workload={"profile": "mixed", "duration": "120s",
                                                    "warmup": "5s"})
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(m))
    storage = tmp_path / "s.journal"
    cmd = [sys.executable, "-m", "chunktune", "tune", str(path), "--storage", str(storage)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    left, killed_trial = None, None
    for _ in range(3):  # a kill that lands between two trials leaves none to resume: again
        storage.unlink(missing_ok=True)
        left = _kill_mid_trial(cmd, env, storage)
        running = [t for t in left.trials if t.state == optuna.trial.TrialState.RUNNING
                   and st.point_of(t)]
        if running:
            (trial,) = running
            killed_trial = trial.number
            break
    assert left is not None and killed_trial is not None, "never killed a running trial"
    interrupted_point = st.point_of(left.trials[killed_trial])

    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "resuming" in out.stdout
    final = _load(storage)
    trials = final.trials
    # the interrupted trial is closed, not counted, and its point ran again afterwards
    t = trials[killed_trial]
    assert t.state == optuna.trial.TrialState.FAIL
    assert t.user_attrs[st.ATTR_REASON] == "Interrupted"
    later = [x for x in trials[killed_trial + 1:] if st.point_of(x) == interrupted_point
             and st.trial_state(x) in ("COMPLETE", "INFEASIBLE", "PRUNED")]
    assert len(later) == 1
    # nothing lost: every trial has ended, and maxTrials were counted
    assert all(x.state != optuna.trial.TrialState.RUNNING for x in trials)
    counted = [x for x in trials if st.trial_state(x) in ("COMPLETE", "INFEASIBLE", "PRUNED")
               or (st.trial_state(x) == "FAIL" and x.user_attrs.get(st.ATTR_REASON)
                   != "Interrupted")]
    assert len(counted) == 6
    # nothing repeated: no launched point was measured twice
    launched = [tuple(sorted(st.point_of(x).items())) for x in counted]
    assert len(launched) == len(set(launched))
    assert sum(bool(x.user_attrs.get(st.ATTR_BASELINE)) for x in counted) == 1
