"""Waiting for capacity in the Kubernetes backend, with the pod's status written by hand (no
kubelet, so the timing is the test's): a pod ``Unschedulable`` for ``Insufficient
nvidia.com/gpu`` waits past its ``startupTimeout`` and is not failed; its start-up clock starts
when it is scheduled; an unschedulable pod for another reason (a taint) still times out. The
engine pod requesting GPUs is accepted by the ``kubernetes`` client (quantities as strings)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from chunktune.backends import manifests as mf
from chunktune.backends.capacity import capacity_wait, scheduling_wait
from chunktune.backends.kubernetes import BackendSettings, KubernetesBackend
from chunktune.core.trials import TrialResult
from chunktune.k8s.kube import KubeApi
from tests.k8s.conftest import make_owner
from tests.k8s.test_manifests import OPTIONS, SIM, VLLM, plan
from tests.kube.emulator import KubeEmulator

pytestmark = pytest.mark.asyncio
GPU_MESSAGE = ("0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes "
               "are available: 3 No preemption victims found for incoming pod.")
TAINT_MESSAGE = ("0/3 nodes are available: 3 node(s) had untolerated taint "
                 "{dedicated: ops}. preemption: not eligible.")
#: long enough for the test to see the pod scheduled and mark it ready on a busy machine
STARTUP_TIMEOUT = 2.0


@pytest_asyncio.fixture()
async def backend(kube: KubeEmulator) -> AsyncIterator[KubernetesBackend]:
    api = KubeApi(kube.api_client())
    owner = make_owner(kube, "cap")
    b = KubernetesBackend(api, owner, BackendSettings(
        options=dataclasses.replace(OPTIONS, sim_requests_gpus=True), poll_interval=0.05))
    yield b
    await b.close()
    await api.close()


def pod_status(scheduled: str | None, ready: bool = False) -> dict[str, Any]:
    """``scheduled``: the scheduler's message while unschedulable; None once placed."""
    if scheduled is not None:
        return {"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": scheduled}]}
    return {"phase": "Running", "podIP": "127.0.9.9", "conditions": [
        {"type": "PodScheduled", "status": "True"},
        {"type": "Ready", "status": "True" if ready else "False"}]}


def set_status(kube: KubeEmulator, name: str, status: dict[str, Any]) -> None:
    kube.patch("pods", "default", name, {"status": status}, subresource="status")


async def test_a_pod_waiting_for_gpus_outlasts_its_startup_timeout(
        kube: KubeEmulator, backend: KubernetesBackend) -> None:
    told: list[tuple[int, str | None, float, bool]] = []
    backend.capacity.on_change = lambda n, m, w, s: told.append((n, m, w, s))
    p = plan(dataclasses.replace(SIM, startup_timeout=STARTUP_TIMEOUT), number=3)
    await backend._create_objects(p)
    pod = kube.get("pods", "default", "cap-t3")
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    set_status(kube, "cap-t3", pod_status(GPU_MESSAGE))
    loop = asyncio.get_running_loop()
    waiting = loop.create_task(backend._wait_ready(p, "cap-t3", loop.time()))
    await kube.until(lambda: told, message="the wait reported")
    assert told == [(3, GPU_MESSAGE, 0.0, False)] and backend.capacity.waiting() == [3]
    # unschedulable for three start-up timeouts: still waiting, not failed
    await kube.until(lambda: backend.paused_seconds(3) > 3 * STARTUP_TIMEOUT, timeout=30)
    assert not waiting.done()
    set_status(kube, "cap-t3", pod_status(None))  # scheduled: the start-up clock starts
    await kube.until(lambda: len(told) == 2, message="scheduling reported")
    assert told[1][:2] == (3, None) and told[1][2] > 3 * STARTUP_TIMEOUT and told[1][3]
    set_status(kube, "cap-t3", pod_status(None, ready=True))
    ready = await asyncio.wait_for(waiting, 30)
    assert not isinstance(ready, TrialResult), ready.message
    assert backend.capacity.waiting() == []
    # the same pod, not scheduled for lack of a toleration: that is no capacity, it times out
    set_status(kube, "cap-t3", pod_status(TAINT_MESSAGE))
    backend.capacity.start(3)  # as a fresh run of the trial does
    t0 = loop.time()
    failed = await asyncio.wait_for(backend._wait_ready(p, "cap-t3", t0), 20)
    assert isinstance(failed, TrialResult) and failed.reason == "StartupTimeout"
    assert "untolerated taint" in (failed.message or "")
    assert len(told) == 2


async def test_only_insufficient_resources_are_capacity() -> None:
    assert capacity_wait({"status": pod_status(GPU_MESSAGE)}) == GPU_MESSAGE
    assert capacity_wait({"status": pod_status(
        "0/2 nodes are available: 2 Insufficient memory.")}) is not None
    assert capacity_wait({"status": pod_status(TAINT_MESSAGE)}) is None
    assert capacity_wait({"status": pod_status(None)}) is None
    assert capacity_wait({"status": {"phase": "Pending"}}) is None


async def test_the_client_accepts_gpu_engine_pods(kube: KubeEmulator) -> None:
    """The ``kubernetes`` client validates bodies and refuses a number where the API takes a
    quantity: every quantity of an engine pod is a string."""
    api = KubeApi(kube.api_client())
    try:
        for target in (VLLM, SIM):
            body = mf.engine_pod(plan(target), mf.Owner("q", "default", "uid-q"),
                                 dataclasses.replace(OPTIONS, sim_requests_gpus=True),
                                 {"requests": {"cpu": 4, "memory": "8Gi"}})
            created = await api.create("pods", "default", body)
            limits = created["spec"]["containers"][0]["resources"]["limits"]
            assert limits == {"nvidia.com/gpu": str(target.gpu_count)}
            await api.delete("pods", "default", body["metadata"]["name"])
    finally:
        await api.close()


async def test_an_adopted_pod_keeps_the_wait_it_had() -> None:
    """A trial adopted by another operator process: the wait before it came is read from the
    pod's timestamps."""
    meta = {"creationTimestamp": "2026-01-01T00:00:00Z"}
    waiting = {"metadata": meta, "status": pod_status(GPU_MESSAGE)}
    t = 1767225600.0  # 2026-01-01T00:00:00Z
    assert scheduling_wait(waiting, now=t + 90) == 90
    scheduled = {"metadata": meta, "status": {"phase": "Running", "conditions": [
        {"type": "PodScheduled", "status": "True",
         "lastTransitionTime": "2026-01-01T00:02:05Z"}]}}
    assert scheduling_wait(scheduled, now=t + 600) == 125
    assert scheduling_wait({"metadata": {}, "status": pod_status(GPU_MESSAGE)}) == 0
