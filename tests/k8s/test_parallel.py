"""GPU-aware parallel trials, and the operator's ``/metrics``, end to end against the emulator.

Eight trials at once (``budget.parallelism: 8``) of simulated engines that request a GPU each
(``CHUNKTUNE_SIM_REQUEST_GPUS``), on a node with four: four run, four wait ``Unschedulable``
for ``Insufficient nvidia.com/gpu``. The waiting ones are shown (the ``CapacityAvailable``
condition, ``TrialWaitingForCapacity`` events, the waiting gauge), their start-up clock starts
when they are scheduled (each waited a whole trial's load, and its recorded start-up is shorter
than that wait), and none fails: all eight complete. The operator's ``/metrics`` is scraped
over HTTP while they wait and once the study is done. (``test_capacity.py`` holds a pod
unschedulable past a short ``startupTimeout`` deterministically.)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from chunktune.backends.manifests import COMPONENT, TUNING
from chunktune.k8s import operator_metrics
from chunktune.tuning.study import ATTR_REASON, ATTR_TIMES, trial_state
from tests.k8s.conftest import (
    POD_ENV,
    journal_of,
    operator_settings,
    running_operator,
    status_of,
    study_in,
    tuning,
    wait_phase,
)
from tests.kube.emulator import KubeEmulator
from tests.kube.kubelet import FakeKubelet

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]
NAME = "gpus"
#: Seconds of load per trial: each waiting pod waits at least this long (the first four hold
#: the GPUs through their load).
LOAD_SECONDS = 5


@contextlib.asynccontextmanager
async def serving(op: Any) -> AsyncIterator[str]:
    """The operator's ``/metrics`` endpoint on a free port; yields its URL."""
    runner = await operator_metrics.serve("127.0.0.1:0", op.metrics)
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"
    finally:
        await runner.cleanup()


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(url: str) -> Samples:
    """``(sample name, sorted labels) -> value`` of one scrape (the text format parsed)."""
    async with aiohttp.ClientSession() as http, http.get(url) as rsp:
        assert rsp.status == 200
        assert rsp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await rsp.text()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def scrape_until(url: str, name: str, value: float, timeout: float,
                       **labels: str) -> Samples:
    """Scrape until ``name`` (summed over ``labels``) reads ``value``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        samples = await scrape(url)
        if total(samples, name, **labels) == value:
            return samples
        assert asyncio.get_running_loop().time() < deadline, \
            f"{name}{labels} never read {value}: {total(samples, name, **labels)}"
        await asyncio.sleep(0.2)


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items()
               if n == name and labels.items() <= dict(ls).items())


def engine_pods(kube: KubeEmulator) -> list[dict[str, Any]]:
    return kube.objects("pods", "default", label_selector=f"{TUNING}={NAME},{COMPONENT}=engine")


def unschedulable(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
               and "Insufficient nvidia.com/gpu" in c.get("message", "")
               for c in (pod.get("status") or {}).get("conditions") or [])


def four_and_four(kube: KubeEmulator) -> list[dict[str, Any]] | None:
    pods = engine_pods(kube)
    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
    waiting = [p for p in pods if unschedulable(p)]
    return pods if len(pods) == 8 and len(running) == 4 and len(waiting) == 4 else None


def capacity_condition(kube: KubeEmulator) -> dict[str, Any] | None:
    return next((c for c in status_of(kube, NAME).get("conditions") or []
                 if c["type"] == "CapacityAvailable"), None)


async def test_eight_at_once_on_four_gpus_none_fails_for_waiting(
        kube: KubeEmulator, tmp_path: Path) -> None:
    kube.create("cpt", tuning(
        NAME, budget={"maxTrials": 8, "parallelism": 8},
        engine={"kind": "sim", "model": "llama-3.1-8b", "gpu": {"type": "h100-sxm"},
                "args": ["--max-model-len", "16384"]},
        searchSpace=[{"name": "max-num-batched-tokens",
                      "choices": [1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288]}],
        workload={"profile": "smoke", "duration": f"{LOAD_SECONDS}s", "warmup": "1s"},
        # eight different points at once (a point in flight is never launched twice)
        sampler={"name": "grid", "seed": 1},
        pruner={"name": "none"}), "default")
    settings = operator_settings(tmp_path, sim_requests_gpus=True, poll_interval=0.3,
                                 kv_sample_interval=2.0)
    with FakeKubelet(kube, extra_env=POD_ENV, capacity={"nvidia.com/gpu": 4}) as kubelet:
        async with running_operator(kube, settings) as op, serving(op) as url:
            pods = await kube.until(lambda: four_and_four(kube), timeout=90,
                                    message="4 engines running, 4 unschedulable")
            assert all(p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
                       == "1" for p in pods)
            cond = await kube.until(
                lambda: (c := capacity_condition(kube)) and c["status"] == "False"
                and c["message"].startswith("4 trials") and c, timeout=30,
                message="the CapacityAvailable condition naming 4 waiting trials")
            assert cond["reason"] == "WaitingForCapacity"
            assert "Insufficient nvidia.com/gpu" in cond["message"]
            waiting = await scrape_until(url, "chunktune_trials_waiting_for_capacity", 4, 30,
                                         tuning=NAME)
            assert total(waiting, "chunktune_study_trials", tuning=NAME, state="running") == 8
            status = await wait_phase(kube, NAME, ("Succeeded", "Failed"), timeout=240)
            done = await scrape(url)
        assert kubelet.errors == []
    study = study_in(journal_of(kube, tmp_path, NAME), NAME)
    assert status["phase"] == "Succeeded", "\n".join(
        f"{t.number} {t.user_attrs.get('chunktune_state')} {t.user_attrs.get('message')} "
        f"{t.user_attrs.get('times')}" for t in study.trials)
    assert status["counts"]["completed"] == 8 and status["counts"].get("failed", 0) == 0
    assert capacity_condition(kube)["status"] == "True"
    study = study_in(journal_of(kube, tmp_path, NAME), NAME)
    # eight measured; the grid's proposal of the baseline's point while it ran was skipped
    assert [trial_state(t) for t in study.trials].count("COMPLETE") == 8
    assert all(trial_state(t) == "COMPLETE" or t.user_attrs.get(ATTR_REASON) == "Duplicate"
               for t in study.trials)
    events = [e for e in kube.objects("v1/events", "default")
              if (e.get("involvedObject") or {}).get("name") == NAME]
    waited = {e["message"].split(":")[0] for e in events
              if e["reason"] == "TrialWaitingForCapacity"}
    scheduled = [e["message"] for e in events if e["reason"] == "TrialScheduled"]
    assert len(waited) == 4 and len(scheduled) == 4
    # each waited at least a whole load, and its start-up clock started when it was scheduled
    seconds = {int(m.split(":")[0].split()[1]): float(m.split(" after ")[1].split(" s ")[0])
               for m in scheduled}
    assert min(seconds.values()) >= LOAD_SECONDS, seconds
    startups = {t.number: t.user_attrs[ATTR_TIMES]["startup"] for t in study.trials
                if trial_state(t) == "COMPLETE"}
    assert all(startups[n] < seconds[n] for n in seconds), (startups, seconds)
    # the final scrape: every trial, its start-up and the waits, the best objective, the leader
    assert total(done, "chunktune_trials_total", tuning=NAME, state="COMPLETE") == 8
    assert total(done, "chunktune_study_trials", tuning=NAME, state="completed") == 8
    assert total(done, "chunktune_trials_waiting_for_capacity", tuning=NAME) == 0
    assert total(done, "chunktune_trial_capacity_wait_seconds_count", tuning=NAME) == 4
    assert total(done, "chunktune_trial_capacity_wait_seconds_sum", tuning=NAME) == \
        pytest.approx(sum(seconds.values()), abs=2.0)  # the events round to seconds
    assert total(done, "chunktune_trial_startup_seconds_count", tuning=NAME) == 8
    assert total(done, "chunktune_trial_duration_seconds_count", tuning=NAME) == 8
    best = status["best"]["metrics"]["ttft_p99"]
    assert total(done, "chunktune_best_objective", tuning=NAME,
                 objective="ttft_p99") == pytest.approx(best)
    assert total(done, "chunktune_tuning_phase", tuning=NAME, phase="Succeeded") == 1
    assert total(done, "chunktune_leader") == 1
    assert {n for n, _ in done} <= operator_metrics.METRIC_NAMES
