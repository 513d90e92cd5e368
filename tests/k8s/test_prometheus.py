"""With ``spec.metrics.prometheusURL`` the trial's engine figures come from a real Prometheus
(the Debian ``prometheus`` binary on loopback, which CI installs) instead of the pod's
``/metrics``. Prometheus discovers the trial pods from a ``file_sd`` file this test keeps up to
date (a stand-in for a PodMonitor: targets labelled ``namespace`` and ``pod``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import yaml

from chunktune.tuning.study import ATTR_SERVER, trial_state
from tests.k8s.conftest import (
    journal_of,
    operator_settings,
    running_operator,
    study_in,
    tuning,
    wait_phase,
)
from tests.kube.emulator import KubeEmulator
from tests.kube.kubelet import FakeKubelet

pytestmark = [pytest.mark.asyncio, pytest.mark.slow,
              pytest.mark.skipif(shutil.which("prometheus") is None,
                                 reason="no prometheus binary (apt-get install prometheus)")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def prometheus(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    targets = tmp_path / "targets.json"
    targets.write_text("[]")
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "vllm", "file_sd_configs": [
            {"files": [str(targets)], "refresh_interval": "1s"}]}]}))
    port = _free_port()
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        # listening before the operator first asks it (else it scrapes the engine itself)
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, "prometheus not ready"
            time.sleep(0.2)
        yield url, targets
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _discover(kube: KubeEmulator, targets: Path) -> None:
    """Keep the file_sd targets equal to the running engine pods."""
    while True:
        pods = await asyncio.to_thread(kube.objects, "pods", "default",
                                       label_selector="app.kubernetes.io/component=engine")
        items = [{"targets": [f"{p['status']['podIP']}:8000"],
                  "labels": {"namespace": "default", "pod": p["metadata"]["name"]}}
                 for p in pods if (p.get("status") or {}).get("podIP")]
        text = json.dumps(items)
        if targets.read_text() != text:
            tmp = targets.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(targets)
        await asyncio.sleep(0.2)


async def test_server_metrics_come_from_prometheus(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path,
        prometheus: tuple[str, Path]) -> None:
    url, targets = prometheus
    kube.create("cpt", tuning("prom", budget={"maxTrials": 1},
                              workload={"profile": "smoke", "duration": "6s", "warmup": "1s"},
                              metrics={"prometheusURL": url, "scrapeInterval": "2s"}),
                "default")
    discovery = asyncio.create_task(_discover(kube, targets))
    try:
        async with running_operator(kube, operator_settings(tmp_path / "state")):
            status = await wait_phase(kube, "prom", ("Succeeded", "Failed"), timeout=90)
    finally:
        discovery.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await discovery
    assert status["phase"] == "Succeeded", status.get("message")
    (trial,) = study_in(journal_of(kube, tmp_path / "state", "prom"), "prom").trials
    assert trial_state(trial) == "COMPLETE"
    server = trial.user_attrs[ATTR_SERVER]
    assert server["source"] == "prometheus"
    assert server["prompt_tokens"] > 0 and server["generation_tokens"] > 0
    assert 0 < server["kv_cache_usage_peak"] <= 1
    assert server["preemptions"] >= 0 and "server_ttft_p99" in server
    assert "kv_cache_usage_peak" in status["baseline"]["metrics"]
