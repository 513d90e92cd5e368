"""Study plumbing: a trial left RUNNING by another process can be closed through public
Optuna API, on both storage kinds chunktune opens."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from chunktune.tuning import study as st


@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_live_trial_closes_a_trial_another_process_left_running(tmp_path: Path,
                                                                kind: str) -> None:
    url = str(tmp_path / "s.journal") if kind == "journal" else f"sqlite:///{tmp_path}/s.db"
    first = optuna.create_study(study_name="ns/t", storage=st.open_storage(url))
    first.tell(first.ask(), 1.0)
    left = first.ask()  # its process "dies" here: the trial stays RUNNING

    storage = st.open_storage(url)  # a new process opens the same storage
    study = optuna.load_study(study_name="ns/t", storage=storage)
    trial = st.live_trial(study, storage, left.number)
    trial.set_user_attr(st.ATTR_REASON, "Interrupted")
    study.tell(trial, state=optuna.trial.TrialState.FAIL)

    t = optuna.load_study(study_name="ns/t", storage=st.open_storage(url)).trials[left.number]
    assert (t.number, t.state, t.user_attrs) == (
        1, optuna.trial.TrialState.FAIL, {st.ATTR_REASON: "Interrupted"})


def test_a_simulated_engine_keeps_the_fingerprint_it_had(make_tuning) -> None:
    """A simulated engine's spec no longer names a default image (none is published), yet a
    study stored before keeps resuming: the fingerprint is the one such a study recorded."""
    tuning = make_tuning()
    assert tuning.spec.engine.image is None
    assert st.fingerprint(tuning) == "2f824cbb67524c61"
    # fields added since count once they are set
    engine = {"kind": "sim", "model": "llama-3.1-8b", "gpu": {"type": "h100-sxm"},
              "args": ["--max-model-len", "32768"], "vllmVersion": "0.12.0"}
    assert st.fingerprint(make_tuning(engine=engine)) != "2f824cbb67524c61"
    # a field added inside another (spec.engine.gpu.peerToPeer) too
    engine = {"kind": "sim", "model": "llama-3.1-8b", "gpu": {"type": "l40s"},
              "args": ["--max-model-len", "32768"]}
    unstated = st.fingerprint(make_tuning(engine=engine))
    stated = st.fingerprint(make_tuning(engine=dict(engine, gpu={"type": "l40s",
                                                                 "peerToPeer": False})))
    assert stated != unstated
