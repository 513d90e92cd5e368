"""The operator's restart safety, deletion and suspension, end to end against the emulator.

* an operator stopped gracefully mid-trial leaves the trial's objects; one killed with SIGKILL
  mid-load leaves them too; each successor adopts the trial it finds (no trial lost, none
  repeated, no point measured twice);
* deleting the resource removes every trial object (the finalizer) and the study journal;
* ``spec.suspend`` stops the trial in flight (its objects deleted) and starts nothing; resuming
  continues the same study and re-runs the stopped trial's point exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest

from chunktune.backends.manifests import TRIAL, TUNING
from chunktune.tuning.study import ATTR_REASON, point_of, trial_state
from tests.k8s.conftest import (
    POD_ENV,
    journal_of,
    operator_settings,
    running_operator,
    status_of,
    study_in,
    trial_objects,
    tuning,
    wait_phase,
)
from tests.kube.emulator import KubeEmulator, WatchEvent
from tests.kube.kubelet import FakeKubelet

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


def load_running(kube: KubeEmulator, job: str) -> bool:
    """The Job's pod runs and the load driver has started (its first log line is out)."""
    pods = kube.objects("pods", "default", label_selector=f"job-name={job}")
    return any((p.get("status") or {}).get("phase") == "Running" and
               "chunktune load run" in kube.pod_log("default", p["metadata"]["name"])
               for p in pods)


def trial_under_load(kube: KubeEmulator, name: str, after: int) -> int | None:
    """The number of a trial later than ``after`` whose load is under way (trial numbers
    skip points the tuner did not launch, such as duplicates)."""
    jobs = kube.objects("jobs", "default", label_selector=f"{TUNING}={name},{TRIAL}")
    for job in jobs:
        number = int(job["metadata"]["labels"][TRIAL])
        if number > after and load_running(kube, job["metadata"]["name"]):
            return number
    return None


def study_of(kube: KubeEmulator, state_dir: Path, name: str) -> optuna.Study:
    return study_in(journal_of(kube, state_dir, name), name)  # type: ignore[no-any-return]


def operator_process(kube: KubeEmulator, state_dir: Path) -> subprocess.Popen[bytes]:
    """``chunktune operator run`` as its own process, configured through the environment."""
    env = {**os.environ, **POD_ENV, "KUBECONFIG": str(kube.kubeconfig_path),
           "CHUNKTUNE_IMAGE": "ghcr.io/chunktune/chunktune:test",
           "CHUNKTUNE_SIM_LOAD_TIME": "0.1", "CHUNKTUNE_POLL_INTERVAL": "0.1",
           "CHUNKTUNE_KV_SAMPLE_INTERVAL": "0.5", "CHUNKTUNE_LOG_LEVEL": "WARNING"}
    return subprocess.Popen(
        [sys.executable, "-m", "chunktune", "operator", "run", "--standalone",
         "--all-namespaces", "--state-dir", str(state_dir)],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


async def test_stopped_and_killed_operators_lose_and_repeat_nothing(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path) -> None:
    kube.create("cpt", tuning("restart", budget={"maxTrials": 3},
                              workload={"profile": "smoke", "duration": "5s",
                                        "warmup": "1s"},
                              pruner={"name": "none"}), "default")
    settings = operator_settings(tmp_path)
    # 1. a graceful stop while trial 1 loads: its objects stay for the successor
    async with running_operator(kube, settings):
        await kube.until(lambda: load_running(kube, "restart-t1-load"), timeout=60,
                         message="trial 1 under load")
        engine_uid = kube.get("pods", "default", "restart-t1")["metadata"]["uid"]
    assert kube.get("pods", "default", "restart-t1")["metadata"]["uid"] == engine_uid
    assert kube.get("jobs", "default", "restart-t1-load") is not None
    # 2. a separate operator process adopts trial 1, and is SIGKILLed while the next loads
    proc = operator_process(kube, tmp_path)
    try:
        second = await kube.until(lambda: trial_under_load(kube, "restart", 1), timeout=90,
                                  message="the next trial under load")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert kube.get("pods", "default", f"restart-t{second}") is not None
    # a stray object of a trial the study does not know (e.g. left by a lost journal)
    uid = kube.get("cpt", "default", "restart")["metadata"]["uid"]
    kube.create("configmaps", {"metadata": {"name": "restart-t42-workload", "labels": {
        "app.kubernetes.io/managed-by": "chunktune", "chunktune.dev/tuning": "restart",
        "chunktune.dev/tuning-uid": uid, TRIAL: "42"}}}, "default")
    # 3. a third operator sweeps the stray object, adopts that trial and finishes the study
    async with running_operator(kube, settings):
        await kube.until(lambda: kube.get("configmaps", "default", "restart-t42-workload")
                         is None, message="the stray object swept")
        status = await wait_phase(kube, "restart", ("Succeeded", "Failed"), timeout=90)
    assert status["phase"] == "Succeeded", status.get("message")
    study = study_of(kube, tmp_path, "restart")
    measured = [t for t in study.trials if trial_state(t) != "SKIPPED"]
    states = [(t.number, trial_state(t), t.user_attrs.get(ATTR_REASON)) for t in measured]
    assert [n for n, _, _ in states][:2] == [0, 1] and second in [n for n, _, _ in states]
    assert all(s == "COMPLETE" and r is None for _, s, r in states), states  # nothing lost
    assert all(t.user_attrs.get(ATTR_REASON) == "Duplicate" for t in study.trials
               if trial_state(t) == "SKIPPED")
    points = [json.dumps(point_of(t), sort_keys=True) for t in measured]
    assert len(set(points)) == len(points) == 3  # nothing repeated
    assert status["counts"]["completed"] == 3 and status["trialsSummary"] == "3/3"
    await kube.until(lambda: not trial_objects(kube, "restart"), message="objects deleted")


async def test_deleting_the_tuning_removes_every_trial_object(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path) -> None:
    kube.create("cpt", tuning("doomed", workload={"profile": "smoke", "duration": "30s",
                                                  "warmup": "1s"}), "default")
    async with running_operator(kube, operator_settings(tmp_path)):
        await kube.until(lambda: load_running(kube, "doomed-t0-load"), timeout=60,
                         message="trial 0 under load")
        assert len(trial_objects(kube, "doomed")) == 4  # pod, job, job's pod, configmap
        journal = journal_of(kube, tmp_path, "doomed")
        assert journal.exists()
        kube.delete("cpt", "default", "doomed")
        await kube.until(lambda: kube.get("cpt", "default", "doomed") is None, timeout=30,
                         message="the finalizer let the resource go")
        assert trial_objects(kube, "doomed") == []
    assert not journal.exists()


async def test_suspend_stops_the_trial_and_resume_continues_the_study(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path) -> None:
    # The resourceVersion of every trial object ever created (not just of those still there
    # when we look): none may predate the patch that resumes the study.
    created: list[int] = []

    def on_change(event: WatchEvent) -> None:
        labels = event.object.get("metadata", {}).get("labels") or {}
        if event.type == "ADDED" and labels.get(TUNING) == "pausable" and TRIAL in labels:
            created.append(event.rv)

    kube.server.add_listener(on_change)
    kube.create("cpt", tuning("pausable", suspend=True, workload={
        "profile": "smoke", "duration": "6s", "warmup": "1s"}), "default")
    async with running_operator(kube, operator_settings(tmp_path)):
        status = await wait_phase(kube, "pausable", ("Suspended",))
        conds = {c["type"]: c for c in status["conditions"]}
        assert conds["Suspended"]["status"] == "True"
        assert created == [] and trial_objects(kube, "pausable") == []
        resumed = kube.patch("cpt", "default", "pausable", {"spec": {"suspend": False}})
        await kube.until(lambda: load_running(kube, "pausable-t0-load"), timeout=60,
                         message="trial 0 under load")
        assert created and min(created) > int(resumed["metadata"]["resourceVersion"])
        kube.patch("cpt", "default", "pausable", {"spec": {"suspend": True}})
        await wait_phase(kube, "pausable", ("Suspended",), timeout=30)
        await kube.until(lambda: not trial_objects(kube, "pausable"), timeout=30,
                         message="the stopped trial's objects deleted")
        kube.patch("cpt", "default", "pausable", {"spec": {"suspend": False}})
        status = await wait_phase(kube, "pausable", ("Succeeded", "Failed"), timeout=120)
    assert status["phase"] == "Succeeded", status.get("message")
    study = study_of(kube, tmp_path, "pausable")
    rows: list[tuple[str, Any]] = [(trial_state(t), t.user_attrs.get(ATTR_REASON))
                                   for t in study.trials]
    assert rows == [("FAIL", "Interrupted"), ("COMPLETE", None), ("COMPLETE", None)]
    first, rerun = point_of(study.trials[0]), point_of(study.trials[1])
    assert first == rerun  # the stopped trial's point ran again, once
    assert point_of(study.trials[2]) != first
    assert status_of(kube, "pausable")["counts"]["completed"] == 2
