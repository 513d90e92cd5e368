"""The Kubernetes backend passes the same contract as the simulated and local backends
(``tests/contract/backends.py``), over real HTTP against the emulator, with the fake kubelet
running the engine pod and the load Job's pod as local processes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from chunktune.backends.kubernetes import BackendSettings, KubernetesBackend
from chunktune.backends.manifests import TrialOptions
from chunktune.k8s.kube import KubeApi
from tests.contract.backends import BackendContract
from tests.k8s.conftest import make_owner
from tests.kube.emulator import KubeEmulator
from tests.kube.kubelet import FakeKubelet

pytestmark = pytest.mark.slow


class TestKubernetes(BackendContract):
    @pytest.fixture
    def backend(self, kube: KubeEmulator,
                kubelet: FakeKubelet) -> Iterator[KubernetesBackend]:
        api = KubeApi(kube.api_client())
        owner = make_owner(kube)
        b = KubernetesBackend(api, owner, BackendSettings(
            options=TrialOptions(load_image="chunktune", sim_load_time=0.2),
            poll_interval=0.1, kv_sample_interval=0.5))
        yield b
        asyncio.run(b.close())
        assert asyncio.run(b.remaining()) == []
        asyncio.run(api.close())
