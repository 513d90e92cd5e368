"""Fixtures of the operator tests: the Kubernetes emulator, the fake kubelet running trial pods
as local processes (``chunktune sim serve``, ``chunktune load run``), the operator's API
wrapper, and owners (``ChunkedPrefillTuning`` objects) for trial objects."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from chunktune.api.crd import build_crd
from chunktune.backends.manifests import TRIAL, TUNING, Owner
from tests.kube.emulator import KubeEmulator
from tests.kube.kubelet import FakeKubelet

#: The venv's scripts first on PATH, so pods find ``chunktune``.
BIN = str(Path(sys.executable).parent)
POD_ENV = {"PATH": os.pathsep.join([BIN, os.environ.get("PATH", "")])}

logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


@pytest.fixture()
def kube() -> Iterator[KubeEmulator]:
    with KubeEmulator() as emulator:
        emulator.create("crd", build_crd())
        yield emulator
        assert emulator.server_errors == []


@pytest.fixture()
def kubelet(kube: KubeEmulator) -> Iterator[FakeKubelet]:
    with FakeKubelet(kube, extra_env=POD_ENV, kill_timeout=2.0) as instance:
        yield instance
        assert instance.errors == []


def make_owner(kube: KubeEmulator, name: str = "owner", namespace: str = "default",
               spec: dict[str, Any] | None = None) -> Owner:
    """A ChunkedPrefillTuning object in the emulator (so that garbage collection by owner
    reference keeps its trial objects), as an :class:`Owner`."""
    body = kube.create("cpt", {"apiVersion": "chunktune.dev/v1alpha1",
                               "kind": "ChunkedPrefillTuning", "metadata": {"name": name},
                               "spec": spec or {}}, namespace)
    return Owner(name=name, namespace=namespace, uid=body["metadata"]["uid"])


# ---- the operator, in process ---------------------------------------------------------------


def operator_settings(state_dir: Path, **trials: Any) -> Any:
    """Fast settings for tests: short polls, no model-load delay, the chunktune image."""
    from chunktune.k8s.settings import Settings

    return Settings.from_env({}, state_dir=state_dir, standalone=True, trials={
        "image": "ghcr.io/chunktune/chunktune:test", "sim_load_time": 0.1,
        "poll_interval": 0.1, "kv_sample_interval": 0.5, **trials})


def api_client_at(kube: KubeEmulator, url: str) -> Any:
    """A ``kubernetes`` client of the emulator's kubeconfig, with the server at ``url``."""
    import tempfile

    import kubernetes
    import yaml

    config = yaml.safe_load(kube.kubeconfig_path.read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = url
    with tempfile.NamedTemporaryFile("w", suffix=".kubeconfig", delete=False) as f:
        yaml.safe_dump(config, f)
    try:
        return kubernetes.config.new_client_from_config(config_file=f.name)
    finally:
        os.unlink(f.name)


@contextlib.asynccontextmanager
async def running_operator(kube: KubeEmulator, settings: Any,
                           server: str | None = None) -> AsyncIterator[Any]:
    """The real operator (kopf + the official client) against the emulator, until the
    block ends; yields the shared :class:`~chunktune.k8s.controller.Operator` state. ``server``:
    reach the emulator at this URL instead (a fault-injecting proxy)."""
    import kopf

    from chunktune.k8s import runtime

    url = server or kube.url

    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=url, token=kube.token)

    stop = asyncio.Event()
    ready = asyncio.Event()
    client = api_client_at(kube, url) if server else kube.api_client()
    built = runtime.build(settings, client, login)
    op = built[1]
    task = asyncio.create_task(runtime.run(settings, built=built, stop_flag=stop,
                                           ready_flag=ready))
    try:
        await asyncio.wait_for(ready.wait(), 20)
        yield op
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 90)
        await op.api.close()


def tuning(name: str, **spec: Any) -> dict[str, Any]:
    """A small ChunkedPrefillTuning of a simulated engine (4 s trials of the smoke profile)."""
    base: dict[str, Any] = {
        "engine": {"kind": "sim", "model": "llama-3.1-8b", "gpu": {"type": "h100-sxm"},
                   "args": ["--max-model-len", "16384"]},
        "searchSpace": [{"name": "max-num-batched-tokens", "choices": [1024, 2048, 4096]}],
        "workload": {"profile": "smoke", "duration": "4s", "warmup": "1s"},
        "budget": {"maxTrials": 2, "parallelism": 1},
        "sampler": {"name": "random", "seed": 1},
    }
    base.update(spec)
    return {"apiVersion": "chunktune.dev/v1alpha1", "kind": "ChunkedPrefillTuning",
            "metadata": {"name": name}, "spec": base}


def status_of(kube: KubeEmulator, name: str, namespace: str = "default") -> dict[str, Any]:
    return dict((kube.get("cpt", namespace, name) or {}).get("status") or {})


async def wait_phase(kube: KubeEmulator, name: str, phases: tuple[str, ...],
                     timeout: float = 60.0) -> dict[str, Any]:
    return await kube.until(lambda: (s := status_of(kube, name)).get("phase") in phases and s,
                            timeout=timeout, interval=0.1,
                            message=f"{name} reaching {'/'.join(phases)}")


def journal_of(kube: KubeEmulator, state_dir: Path, name: str,
               namespace: str = "default") -> Path:
    """The default journal of tuning ``name``: named by its uid."""
    uid = (kube.get("cpt", namespace, name) or {})["metadata"]["uid"]
    return state_dir / f"{uid}.journal"


def study_in(journal: Path, name: str, namespace: str = "default") -> Any:
    """The Optuna study of tuning ``namespace/name`` in a journal file."""
    import optuna

    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(journal)))
    return optuna.load_study(study_name=f"{namespace}/{name}", storage=storage)


def trial_objects(kube: KubeEmulator, name: str) -> list[str]:
    """``kind/name`` of every trial object (pods, jobs, configmaps, services) of ``name``."""
    out = []
    for res in ("pods", "jobs", "configmaps", "services"):
        out += [f"{res}/{o['metadata']['name']}" for o in
                kube.objects(res, "default", label_selector=f"{TUNING}={name},{TRIAL}")]
    return out
