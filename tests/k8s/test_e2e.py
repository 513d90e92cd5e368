"""End to end: the real operator (kopf, the official ``kubernetes`` client) over HTTP against
the emulator, trials run by the fake kubelet as ``chunktune sim serve`` pods and ``chunktune
load run`` Jobs on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from chunktune.core.steps import read_steps
from chunktune.tuning.study import point_of, trial_state
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
from tests.kube.emulator import KubeEmulator
from tests.kube.kubelet import FakeKubelet
from tests.kube.objects import WatchEvent

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


def events(kube: KubeEmulator, name: str) -> list[dict[str, Any]]:
    return [e for e in kube.objects("v1/events", "default")
            if (e.get("involvedObject") or {}).get("name") == name]


async def test_study_succeeds_with_best_baseline_and_pareto_front(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path) -> None:
    kube.create("deployments", {"metadata": {"name": "vllm", "annotations": {
        "chunktune.dev/allow-patch": "pareto"}}, "spec": {
        "replicas": 0, "selector": {"matchLabels": {"app": "vllm"}}, "template": {
            "metadata": {"labels": {"app": "vllm"}}, "spec": {"containers": [
                {"name": "sidecar", "image": "busybox", "args": ["sleep", "1d"]},
                {"name": "engine", "image": "vllm/vllm-openai:v0.11.0", "args": [
                    "serve", "meta-llama/Llama-3.1-8B-Instruct",
                    "--max-num-batched-tokens=512", "--max-model-len", "16384"]}]}}}},
                "default")
    kube.create("cpt", tuning(
        "pareto",
        objectives=[{"metric": "ttft_p99", "direction": "minimize"},
                    {"metric": "throughput_tokens_per_s", "direction": "maximize"}],
        budget={"maxTrials": 3, "parallelism": 2},
        output={"configMap": "pareto-best",
                "patchDeployment": {"name": "vllm", "container": "engine"}}), "default")
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
    containers = kube.get("deployments", "default", "vllm")["spec"]["template"]["spec"][
        "containers"]
    assert containers[0]["args"] == ["sleep", "1d"]
    assert containers[1]["args"] == [
        "serve", "meta-llama/Llama-3.1-8B-Instruct",
        f"--max-num-batched-tokens={best['parameters']['max-num-batched-tokens']}",
        "--max-model-len", "16384"]
    assert conds["OutputWritten"]["status"] == "True"
    reasons = [e["reason"] for e in events(kube, "pareto")]
    assert reasons.count("TrialStarted") == 3 and reasons.count("TrialComplete") == 3
    assert "Succeeded" in reasons
    await kube.until(lambda: not trial_objects(kube, "pareto"), message="trial objects gone")
    # the study storage: three measured trials, each point once
    study = study_in(journal_of(kube, tmp_path, "pareto"), "pareto")
    assert [trial_state(t) for t in study.trials] == ["COMPLETE"] * 3
    points = [json.dumps(point_of(t), sort_keys=True) for t in study.trials]
    assert len(set(points)) == 3
    assert status_of(kube, "pareto")["phase"] == "Succeeded"
    # each trial's engine step log, beside the journal (storage.steps_dir)
    journal = journal_of(kube, tmp_path, "pareto")
    kept = sorted(journal.with_name(journal.name + ".steps").glob("*.steps.jsonl"))
    assert [p.name for p in kept] == [f"pareto-t{n}-{n}.steps.jsonl" for n in range(3)]
    assert all(read_steps(p) for p in kept)



async def test_engine_that_cannot_start_is_infeasible_and_the_study_goes_on(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path) -> None:
    # An L4 cannot profile a 65536-token step for an 8B model next to a KV cache: the engine
    # exits at start-up with vLLM's message; the point is infeasible, not a failed trial.
    kube.create("cpt", tuning(
        "small-gpu",
        engine={"kind": "sim", "model": "llama-3.1-8b", "gpu": {"type": "l4"},
                "args": ["--max-model-len", "8192"]},
        searchSpace=[{"name": "max-num-batched-tokens", "choices": [4096, 65536]}],
        budget={"maxTrials": 3, "parallelism": 2, "prescreen": False},
        sampler={"name": "random", "seed": 0}), "default")
    async with running_operator(kube, operator_settings(tmp_path)):
        status = await wait_phase(kube, "small-gpu", ("Succeeded", "Failed"), timeout=90)
    assert status["phase"] == "Succeeded", status.get("message")
    by_budget = {t["parameters"]["max-num-batched-tokens"]: t for t in status["trials"]}
    bad = by_budget[65536]
    assert bad["state"] == "INFEASIBLE"
    assert bad["reason"] in ("KVCacheTooSmall", "EngineOOM", "MaxModelLenTooLarge")
    assert by_budget[4096]["state"] == "COMPLETE"
    assert status["counts"]["infeasible"] == 1 and status["counts"]["completed"] == 2
    assert status["best"]["parameters"]["max-num-batched-tokens"] != 65536
    warned = [e for e in events(kube, "small-gpu") if e["reason"] == "TrialInfeasible"]
    assert warned and warned[0]["type"] == "Warning"
    assert "65536" in warned[0]["message"] and bad["reason"] in warned[0]["message"]


async def test_invalid_spec_is_refused_with_the_field_named(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path) -> None:
    bad = tuning("bad", searchSpace=[
        {"name": "max-num-batched-tokens", "type": "int", "low": 8192, "high": 4096}])
    kube.create("cpt", bad, "default")
    async with running_operator(kube, operator_settings(tmp_path)):
        status = await wait_phase(kube, "bad", ("Failed",))
        conds = {c["type"]: c for c in status["conditions"]}
        assert conds["SpecValid"]["status"] == "False"
        assert conds["SpecValid"]["reason"] == "InvalidSpec"
        assert "spec.searchSpace[0].low must be <= high (got 8192 > 4096)" in \
            conds["SpecValid"]["message"]
        assert "spec.searchSpace[0].low" in status["message"]
        await kube.until(lambda: any(e["reason"] == "InvalidSpec"
                                     for e in events(kube, "bad")), message="event")
        assert not trial_objects(kube, "bad")
        # fixed: the study starts
        kube.patch("cpt", "default", "bad", {"spec": {"searchSpace": [
            {"name": "max-num-batched-tokens", "type": "int", "low": 2048, "high": 4096,
             "step": 2048}]}})
        status = await wait_phase(kube, "bad", ("Running",))
        assert {c["type"]: c for c in status["conditions"]}["SpecValid"]["status"] == "True"
        assert status["observedGeneration"] == 2


async def test_a_distributed_load_runs_a_worker_job_that_reaches_its_master_by_service(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path) -> None:
    """``workload.loadWorkers: 2`` in the cluster: the load Job's pod is Locust's master, the
    Service ``<trial>-lm`` leads to it, and the worker Job runs both ``chunktune load worker``
    pods at once; the trial completes on their requests, and every object goes with it."""
    seen: dict[str, str] = {}  # worker pod -> the last phase seen
    services: set[str] = set()
    # every pod's phases with the second they were first seen, and its log's last lines: what
    # a timeout reports (this test once waited 120 s on a busy machine where it takes ~22 s)
    t0 = time.monotonic()
    history: list[str] = []
    phases: set[tuple[str, str]] = set()
    logs: dict[str, str] = {}

    def on_change(event: WatchEvent) -> None:
        # every committed change: a worker pod is Succeeded for a fraction of a second before
        # the operator deletes it, shorter than a poll on a busy machine
        if event.resource.plural == "services":
            services.add(event.name)
        if event.resource.plural != "pods" or event.type == "DELETED":
            return
        labels = event.object["metadata"].get("labels") or {}
        phase = (event.object.get("status") or {}).get("phase", "")
        if str(labels.get("job-name", "")).endswith("-lw"):
            seen[event.name] = phase
        if (event.name, phase) not in phases:
            phases.add((event.name, phase))
            history.append(f"{time.monotonic() - t0:5.1f}s {event.name} {phase}")

    async def watch() -> None:  # the pods' logs, for a timeout's report
        while True:
            for pod in await asyncio.to_thread(kube.objects, "pods", "default"):
                name = pod["metadata"]["name"]
                with contextlib.suppress(Exception):
                    logs[name] = (await asyncio.to_thread(kube.pod_log, "default", name))[-800:]
            await asyncio.sleep(0.1)

    kube.server.add_listener(on_change)
    kube.create("cpt", tuning("dist", workload={"profile": "smoke", "duration": "4s",
                                                "warmup": "1s", "loadWorkers": 2},
                              budget={"maxTrials": 1, "parallelism": 1}), "default")
    watcher = asyncio.create_task(watch())
    try:
        async with running_operator(kube, operator_settings(tmp_path)):
            try:
                status = await wait_phase(kube, "dist", ("Succeeded", "Failed"), timeout=120)
            except TimeoutError as e:
                raise AssertionError(
                    f"{e}\nstatus: {status_of(kube, 'dist')}\nevents: "
                    f"{[ev['message'] for ev in events(kube, 'dist')]}\npods: {history}\n"
                    + "\n".join(f"--- {k}:\n{v}" for k, v in logs.items())) from e
    finally:
        kube.server.remove_listener(on_change)
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    assert status["phase"] == "Succeeded", (status.get("message"), [
        (t.get("reason"), t.get("message")) for t in status.get("trials") or []], seen)
    assert status["counts"]["completed"] == 1, status
    assert len(seen) == 2 and set(seen.values()) == {"Succeeded"}, seen
    assert any(name.endswith("-lm") for name in services), services
    (trial,) = study_in(journal_of(kube, tmp_path, "dist"), "dist").trials
    assert trial_state(trial) == "COMPLETE"
    metrics = trial.user_attrs["metrics"]
    assert metrics["error_rate"] == 0.0 and metrics["request_rate"] > 0, metrics
    assert not trial_objects(kube, "dist")
    assert not [s for s in kube.objects("services", "default")
                if s["metadata"]["name"].endswith("-lm")]
