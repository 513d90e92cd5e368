"""``chunktune sim serve`` start-up and shutdown, as child processes: vLLM's log lines, the port
opening only once the engine is ready, start-up failures with vLLM's messages."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from bench.serve_overhead import ServerProc, start_server

from chunktune.core.models import CATALOG_HF
from tests.sim.serving.conftest import free_port, port_open

pytestmark = pytest.mark.slow  # real sim serve processes

ROOT = Path(__file__).resolve().parents[3]


def _popen(args: list[str]) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "operator"), PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "chunktune", "sim", "serve", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _run_watching_port(args: list[str], port: int, timeout: float = 30.0
                       ) -> tuple[int, str, str, bool]:
    """Run to exit, polling ``port``; returns (rc, stdout, stderr, port was ever open)."""
    proc = _popen(args)
    opened = False
    end = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < end:
        opened = opened or port_open(port)
        time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
    out, err = proc.communicate()
    return proc.returncode, out, err, opened


@pytest.mark.parametrize(("flags", "message"), [
    (["--gpu-memory-utilization", "0.2"],
     "ValueError: No available memory for the cache blocks. Try increasing "
     "`gpu_memory_utilization` when initializing the engine (this flag also controls "),
    (["--gpu", "l4"],
     "ValueError: To serve at least one request with the model's max seq len (131072)"),
])
def test_memory_failure_exits_1_with_vllms_message_and_never_opens_the_port(flags, message):
    port = free_port()
    rc, out, err, opened = _run_watching_port(
        ["llama-3.1-8b", "--host", "127.0.0.1", "--port", str(port), "--load-time", "0.5",
         *flags], port)
    assert rc == 1
    assert not opened
    assert message in err
    assert "EngineCore failed to start." in err
    assert "chunktune: engine start-up failed" in err
    assert "Application startup complete." not in out
    assert "Starting vLLM API server" not in out


def test_config_rejection_fails_before_the_model_load():
    port = free_port()
    t0 = time.monotonic()
    rc, out, err, opened = _run_watching_port(
        ["llama-3.1-8b", "--host", "127.0.0.1", "--port", str(port), "--load-time", "20",
         "--max-num-batched-tokens", "2", "--max-num-seqs", "4"], port)
    assert rc == 1 and not opened
    assert "Starting to load model" not in out  # refused before the model load began
    assert time.monotonic() - t0 < 19  # so it did not sit through the 20 s load delay
    assert "max_num_batched_tokens (2) must be greater than or equal to max_num_seqs (4)" in err


def test_a_flag_vllm_0_32_removed_is_an_unrecognized_argument():
    """vLLM 0.32 has no --max-num-partial-prefills: its parser exits 2 before anything."""
    port = free_port()
    rc, _, err, opened = _run_watching_port(
        ["llama-3.1-8b", "--host", "127.0.0.1", "--port", str(port), "--load-time", "20",
         "--max-num-partial-prefills", "2"], port)
    assert rc == 2 and not opened
    assert "error: unrecognized arguments: --max-num-partial-prefills" in err


def test_port_opens_only_when_ready_and_logs_like_vllm():
    port = free_port()
    proc = _popen(["meta-llama/Llama-3.1-8B-Instruct", "--host", "127.0.0.1", "--port",
                   str(port), "--load-time", "1.0", "--max-model-len", "8192",
                   "--dtype", "bfloat16", "--trust-remote-code"])
    try:
        t0 = time.monotonic()
        saw_closed = False
        while time.monotonic() - t0 < 0.7:
            saw_closed = saw_closed or not port_open(port)
            assert not port_open(port), "the port opened during the model load"
            time.sleep(0.05)
        assert saw_closed
        lines: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "Application startup complete." in line:
                break
        assert requests.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
        assert time.monotonic() - t0 >= 1.0
        text = "".join(lines)
        for needle in (f"Starting vLLM API server 0 on http://127.0.0.1:{port}",
                       "Available KV cache memory:", "GPU KV cache size:",
                       "Maximum concurrency for 8,192 tokens per request:",
                       "Model loading took"):
            assert needle in text, needle
        warnings = [ln for ln in lines if "does not model these vLLM flags" in ln]
        assert len(warnings) == 1
        assert "--dtype" in warnings[0] and "--trust-remote-code" in warnings[0]
        models = requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()
        assert [m["id"] for m in models["data"]] == ["meta-llama/Llama-3.1-8B-Instruct"]
        assert models["data"][0]["max_model_len"] == 8192
        r = requests.post(f"http://127.0.0.1:{port}/v1/completions", timeout=10,
                          json={"prompt": "Hello", "max_tokens": 3})
        assert r.json()["model"] == "meta-llama/Llama-3.1-8B-Instruct"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=15)
        assert proc.returncode == 0
        assert "Python overhead per step" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_near_miss_flag_is_an_error():
    proc = _popen(["llama-3.1-8b", "--max-num-batched-token", "4096", "--port", "0"])
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert "did you mean --max-num-batched-tokens?" in err


def test_port_zero_prints_the_bound_port_and_api_key_guards_v1():
    with start_server("llama-3.1-8b", ["--max-model-len", "2048"],
                      extra=["--api-key", "s3cret"]) as srv:
        assert isinstance(srv, ServerProc)
        port = int(srv.url.rsplit(":", 1)[1])
        assert port != 0
        assert f"Starting vLLM API server 0 on http://127.0.0.1:{port}" in srv.output
        body = {"model": "llama-3.1-8b", "prompt": "hi", "max_tokens": 2}
        r = requests.post(srv.url + "/v1/completions", json=body, timeout=10)
        assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}
        r = requests.post(srv.url + "/v1/completions", json=body, timeout=10,
                          headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        r = requests.post(srv.url + "/v1/completions", json=body, timeout=10,
                          headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
        # As in vLLM, only /v1 is guarded.
        assert requests.get(srv.url + "/health", timeout=5).status_code == 200
        assert requests.get(srv.url + "/metrics", timeout=5).status_code == 200


def test_model_config_json(tmp_path):
    cfg = dict(CATALOG_HF["llama-3.1-8b"], max_position_embeddings=4096)
    path = tmp_path / "my-model" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    with ServerProc(["--model-config", str(path), "--host", "127.0.0.1", "--port", "0",
                     "--load-time", "0"]) as srv:
        models = requests.get(srv.url + "/v1/models", timeout=5).json()["data"]
        assert [(m["id"], m["max_model_len"]) for m in models] == [("my-model", 4096)]
        r = requests.post(srv.url + "/v1/completions", timeout=10,
                          json={"model": "my-model", "prompt": [1] * 4000, "max_tokens": 96})
        assert r.status_code == 200
