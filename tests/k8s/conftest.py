"""Fixtures of the operator tests: the Kubernetes emulator, the fake kubelet running trial pods
as local processes (``chunktune sim serve``, ``chunktune load run``), the operator's API
wrapper, and owners (``ChunkedPrefillTuning`` objects) for trial objects."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chunktune.api.crd import build_crd
from chunktune.backends.manifests import Owner
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
