"""Every backend passes the same contract (tests/contract/backends.py)."""

from __future__ import annotations

import asyncio

import pytest

from chunktune.backends.local import LocalBackend
from chunktune.backends.simulated import SimulatedBackend
from tests.contract.backends import BackendContract


class TestSimulated(BackendContract):
    @pytest.fixture
    def backend(self):
        return SimulatedBackend()


@pytest.mark.slow  # real sim serve processes
class TestLocal(BackendContract):
    @pytest.fixture
    def backend(self, tmp_path):
        b = LocalBackend(workdir=tmp_path, load_time=0.2)
        yield b
        asyncio.run(b.close())
