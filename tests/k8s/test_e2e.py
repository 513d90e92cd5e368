"""End to end: the real operator (kopf, the official ``kubernetes`` client) over HTTP against
the emulator, trials run by the fake kubelet as ``chunktune sim serve`` pods and ``chunktune
load run`` Jobs on loopback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest

from chunktune.backends.manifests import TRIAL, TUNING
from chunktune.tuning.study import point_of, trial_state
from tests.k8s.conftest import operator_settings, running_operator, status_of, tuning, wait_phase
from tests.kube.emulator import KubeEmulator
from tests.kube.kubelet import FakeKubelet

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


def trial_objects(kube: KubeEmulator, name: str) -> list[str]:
    out = []
    for res in ("pods", "jobs", "configmaps"):
        out += [f"{res}/{o['metadata']['name']}" for o in
                kube.objects(res, "default", label_selector=f"{TUNING}={name},{TRIAL}")]
    return out


def events(kube: KubeEmulator, name: str) -> list[dict[str, Any]]:
    return [e for e in kube.objects("v1/events", "default")
            if (e.get("involvedObject") or {}).get("name") == name]


async def test_study_succeeds_with_best_baseline_and_pareto_front(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path) -> None:
    kube.create("cpt", tuning(
        "pareto",
        objectives=[{"metric": "ttft_p99", "direction": "minimize"},
                    {"metric": "throughput_tokens_per_s", "direction": "maximize"}],
        budget={"maxTrials": 3, "parallelism": 2},
        output={"configMap": "pareto-best"}), "default")
    async with running_operator(kube, operator_settings(tmp_path)):
        status = await wait_phase(kube, "pareto", ("Succeeded", "Failed"), timeout=90)
        assert status["phase"] == "Succeeded", status.get("message")
    assert status["trialsSummary"] == "3/3"
    assert status["counts"]["completed"] == 3
    assert status["baseline"]["trial"] == 0
    best = status["best"]
    assert best["flags"].startswith("--max-num-batched-tokens ")
    assert "ttft_p99" in best["metrics"] and "throughput_tokens_per_s" in best["metrics"]
    assert status["paretoFront"] and all(p["flags"] for p in status["paretoFront"])
    # the printer columns read these
    assert status["best"]["parameters"]["max-num-batched-tokens"] in (1024, 2048, 4096, 8192)
    assert status["startTime"] and status["completionTime"]
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Complete"]["status"] == "True" and conds["SpecValid"]["status"] == "True"
    assert all(c["observedGeneration"] == 1 for c in conds.values())
    assert status["observedGeneration"] == 1
    cm = kube.get("configmaps", "default", "pareto-best")
    assert cm is not None and cm["data"]["flags"] == best["flags"]
    assert json.loads(cm["data"]["best.json"])["number"] == best["trial"]
    assert len(json.loads(cm["data"]["pareto.json"])) == len(status["paretoFront"])
    reasons = [e["reason"] for e in events(kube, "pareto")]
    assert reasons.count("TrialStarted") == 3 and reasons.count("TrialComplete") == 3
    assert "Succeeded" in reasons
    await kube.until(lambda: not trial_objects(kube, "pareto"), message="trial objects gone")
    # the study storage: three measured trials, each point once
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(
        str(tmp_path / "default-pareto.journal")))
    study = optuna.load_study(study_name="default/pareto", storage=storage)
    assert [trial_state(t) for t in study.trials] == ["COMPLETE"] * 3
    points = [json.dumps(point_of(t), sort_keys=True) for t in study.trials]
    assert len(set(points)) == 3
    assert status_of(kube, "pareto")["phase"] == "Succeeded"

