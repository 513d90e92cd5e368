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

    def test_sim_engine_step_log_is_kept(self, tmp_path):
        """A sim serve engine runs with --enable-logging-iteration-details, as vLLM does: the
        trial's result carries its steps and steps_dir keeps them."""
        from dataclasses import replace

        from chunktune.core.steps import read_step_log
        from tests.contract.backends import PROFILE, plan

        b = LocalBackend(workdir=tmp_path / "w", load_time=0.2, steps_dir=tmp_path / "steps")
        p = replace(plan(21), profile=PROFILE.with_overrides(duration=3, warmup=1, rate=6))
        assert "--enable-logging-iteration-details" in b.engine_command(p, 9999)
        try:
            r = self.run(b, p)
        finally:
            asyncio.run(b.close())
        assert r.state == "COMPLETE", (r.reason, r.message)
        assert len(r.steps) > 10 and [s.iteration for s in r.steps] == list(range(len(r.steps)))
        assert r.steps_file == str(tmp_path / "steps" / "contract-21-21.steps.jsonl")
        records, meta = read_step_log(r.steps_file)
        assert records == r.steps and meta.model == "llama-3.1-8b"
