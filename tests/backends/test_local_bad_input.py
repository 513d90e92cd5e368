"""Bad input to the local backend's real-vLLM path, without real vLLM: vLLM missing, a model
directory missing or broken, a port in use, an engine that never becomes healthy. Each gives
a clear error or a failed trial with its reason; no engine is left running.

The engine is a stand-in ``vllm`` package (``tests/backends/fake_vllm``) seen by a wrapper
interpreter (``CHUNKTUNE_VLLM_PYTHON``), so the backend probes and starts it exactly as it
does vLLM's CPU build: ``python -m vllm.entrypoints.openai.api_server``."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import sys
from pathlib import Path

import pytest
import yaml

from chunktune.backends.local import LocalBackend
from chunktune.backends.vllm import PYTHON_ENV
from chunktune.cli import main
from chunktune.core.trials import CpuTarget, EngineTarget, TrialPlan
from chunktune.core.workload import load_profile
from chunktune.modelgen.tiny import write_tiny_model

FAKE = Path(__file__).parent / "fake_vllm"
REPO = Path(__file__).resolve().parents[2]


def wrapper(tmp_path: Path, *, site: bool = True, path: Path | None = FAKE) -> str:
    """An interpreter script: this Python, with the fake vllm first on its path (or, with
    ``site=False`` and no ``path``, without site-packages: no vLLM at all)."""
    exe = tmp_path / "bin" / "python"
    exe.parent.mkdir(parents=True, exist_ok=True)
    pp = os.pathsep.join(str(p) for p in (path, REPO / "operator") if p is not None)
    exe.write_text(f"#!/bin/sh\nPYTHONPATH={pp} exec {sys.executable} "
                   f"{'' if site else '-S '}\"$@\"\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return str(exe)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("m") / "tiny")


def plan(model: str, timeout: float = 60.0) -> TrialPlan:
    target = EngineTarget(kind="vllm", model=model, served_model_name="tiny",
                          fixed_args=("--load-format", "dummy"), startup_timeout=timeout,
                          cpu=CpuTarget())
    return TrialPlan(number=3, params={"max-num-batched-tokens": 512}, target=target,
                     profile=load_profile("smoke").with_overrides(duration=2, warmup=0),
                     name="bad")


def alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


class RecordingBackend(LocalBackend):
    """Remembers every engine it started and every port it chose."""

    def __init__(self, ports: list[int] | None = None, **kw) -> None:
        super().__init__(**kw)
        self.ports = list(ports or [])
        self.chosen: list[int] = []
        self.pids: list[int] = []

    def choose_port(self) -> int:
        port = self.ports.pop(0) if self.ports else super().choose_port()
        self.chosen.append(port)
        return port

    async def _stop(self, proc) -> None:  # type: ignore[no-untyped-def]
        self.pids.append(proc.pid)
        await super()._stop(proc)


def run(backend: LocalBackend, p: TrialPlan):  # type: ignore[no-untyped-def]
    async def go():  # type: ignore[no-untyped-def]
        try:
            return await backend.run_trial(p)
        finally:
            await backend.close()
    return asyncio.run(go())


def test_vllm_not_installed_is_a_clear_failed_trial(tmp_path, tiny):
    b = LocalBackend(workdir=tmp_path / "w", vllm_python=wrapper(tmp_path, site=False,
                                                                 path=None))
    r = run(b, plan(str(tiny)))
    assert (r.state, r.reason) == ("FAIL", "EngineUnavailable")
    assert "not installed" in r.message and "chunktune[cpu]" in r.message


def test_missing_and_broken_model_directory(tmp_path, tiny):
    b = LocalBackend(workdir=tmp_path / "w", vllm_python=wrapper(tmp_path))
    r = run(b, plan(str(tmp_path / "nowhere")))
    assert (r.state, r.reason) == ("FAIL", "EngineUnavailable")
    assert "spec.engine.model" in r.message and "does not exist" in r.message
    assert "chunktune model tiny" in r.message
    broken = tmp_path / "broken"
    write_tiny_model(broken)
    (broken / "config.json").write_text("{not json")
    r = run(LocalBackend(workdir=tmp_path / "w2", vllm_python=wrapper(tmp_path)),
            plan(str(broken)))
    assert r.reason == "EngineUnavailable" and "not valid JSON" in r.message


def test_engine_never_healthy_times_out_and_is_killed(tmp_path, tiny, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_MODE", "hang")
    b = RecordingBackend(workdir=tmp_path / "w", vllm_python=wrapper(tmp_path))
    # 10 s, not less: on a busy 2-core CI runner the stand-in's interpreter took over 3 s to
    # print its first line, and the log lines are what this test is about
    r = run(b, plan(str(tiny), timeout=10))
    assert (r.state, r.reason) == ("FAIL", "StartupTimeout")
    assert "did not answer /health within 10 s" in r.message
    assert "fake vllm: args" in r.message  # the last log lines say what ran
    assert "--enable-logging-iteration-details" in r.message
    assert b.pids and not any(alive(p) for p in b.pids)


def test_port_in_use_is_retried_then_reported(tmp_path, tiny, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_MODE", "hang")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # taken every time: three attempts, then a failed trial naming the port
        b = RecordingBackend(ports=[port] * 3, workdir=tmp_path / "w",
                             vllm_python=wrapper(tmp_path))
        r = run(b, plan(str(tiny), timeout=20))
        assert (r.state, r.reason) == ("FAIL", "PortInUse")
        assert f"port {port}" in r.message and "Address already in use" in r.message
        assert b.chosen == [port] * 3
        # each engine's exit is seen when it happens, not after a /health probe that the
        # port's holder accepts and never answers has timed out (10 s, three times: over
        # 30 s); three interpreter starts take ~0.3 s here, over 9 s on a busy CI runner
        assert r.startup_seconds is not None and r.startup_seconds < 25, r.startup_seconds
        # taken once: the next attempt gets another port and the engine starts there
        b = RecordingBackend(ports=[port], workdir=tmp_path / "w2",
                             vllm_python=wrapper(tmp_path))
        r = run(b, plan(str(tiny), timeout=10))  # room for the first, refused, start
        assert r.reason == "StartupTimeout"  # the stand-in never serves: it got that far
        assert b.chosen[0] == port and b.chosen[1] != port and len(b.chosen) == 2
    assert not any(alive(p) for p in b.pids)


def _manifest(tmp_path: Path, model: str) -> Path:
    m = {"apiVersion": "chunktune.dev/v1alpha1", "kind": "ChunkedPrefillTuning",
         "metadata": {"name": "bad"},
         "spec": {"engine": {"kind": "vllm", "image": "x", "model": model, "cpu": {}},
                  "searchSpace": [{"name": "max-num-seqs", "choices": [8, 16]}],
                  "workload": {"profile": "smoke", "duration": "2s", "warmup": "0s"},
                  "objectives": [{"metric": "ttft_p99"}], "budget": {"maxTrials": 2}}}
    p = tmp_path / "m.yaml"
    p.write_text(yaml.safe_dump(m))
    return p


def test_tune_refuses_before_any_trial(tmp_path, tiny, monkeypatch, capsys):
    storage = tmp_path / "s.journal"
    monkeypatch.setenv(PYTHON_ENV, wrapper(tmp_path / "none", site=False, path=None))
    rc = main(["tune", str(_manifest(tmp_path, str(tiny))), "--storage", str(storage)])
    err = capsys.readouterr().err
    assert rc == 1 and "error: engine.kind vllm needs vLLM" in err
    monkeypatch.setenv(PYTHON_ENV, wrapper(tmp_path / "fake"))
    rc = main(["tune", str(_manifest(tmp_path, str(tmp_path / "gone"))), "--storage",
               str(tmp_path / "s2.journal")])
    err = capsys.readouterr().err
    assert rc == 1 and "spec.engine.model: model directory" in err and "gone" in err


def test_engine_command_and_environment(tmp_path, monkeypatch):
    """What a CPU trial runs: the module entry point (no working console command), the tiny
    model written on first use with --load-format dummy, the KV flag for a sub-GiB space with
    the variable unset, the step log; offline; a GPU hub model is left online."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "7")  # from the user's shell: must not win
    py = wrapper(tmp_path)
    b = LocalBackend(workdir=tmp_path / "w", vllm_python=py)
    target = EngineTarget(kind="vllm", model="tiny:m/tiny", served_model_name="tiny",
                          cpu=CpuTarget(kv_cache_bytes=512 * 2**20, omp_threads_bind="0-1"))
    p = TrialPlan(number=0, params={"max-num-seqs": 8}, target=target,
                  profile=load_profile("smoke"), name="e")
    cmd = b.engine_command(p, 9999)
    assert cmd[:4] == [py, "-m", "vllm.entrypoints.openai.api_server", "--model"]
    assert cmd[4] == "m/tiny" and (tmp_path / "m" / "tiny" / "config.json").is_file()
    joined = " ".join(cmd)
    for part in ("--port 9999", "--served-model-name tiny", "--load-format dummy",
                 f"--kv-cache-memory-bytes {512 * 2**20}", "--max-num-seqs 8"):
        assert part in joined
    assert cmd[-1] == "--enable-logging-iteration-details"
    env = b._env(p)
    assert "VLLM_CPU_KVCACHE_SPACE" not in env
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and env["HF_HUB_OFFLINE"] == "1"
    whole = TrialPlan(number=0, params={}, target=EngineTarget(
        kind="vllm", model="tiny:m/tiny", served_model_name="t", cpu=CpuTarget()),
        profile=load_profile("smoke"))
    assert b._env(whole)["VLLM_CPU_KVCACHE_SPACE"] == "1"
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    gpu = TrialPlan(number=0, params={}, target=EngineTarget(
        kind="vllm", model="org/some-model", served_model_name="t"),
        profile=load_profile("smoke"))
    assert "HF_HUB_OFFLINE" not in b._env(gpu)
