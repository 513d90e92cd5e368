"""``sim serve`` against hostile or broken clients (issue 12, finding 10): deeply nested JSON,
slow request heads and bodies, sampling parameters vLLM refuses, and 500 clients at once.

Each test failed on the server before the hardening: a 500 with a RecursionError, a connection
held open forever, a 200 for ``temperature: -1``, memory growing with every concurrent body.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import requests
from bench.serve_overhead import ServerProc, start_server

from chunktune.sim.serving.protocol import MAX_JSON_DEPTH, json_depth
from tests.sim.serving.conftest import MODEL, post

pytestmark = pytest.mark.slow  # real sim serve processes

#: The short limits of the strict server below (seconds).
HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 1.0


@pytest.fixture(scope="module")
def strict() -> Iterator[ServerProc]:
    """A server of its own with short timeouts (the shared one keeps the defaults)."""
    with start_server("llama-3.1-8b", ["--max-model-len", "4096"], extra=[
            "--served-model-name", MODEL, "--header-timeout", str(HEADER_TIMEOUT),
            "--body-timeout", str(BODY_TIMEOUT)]) as srv:
        yield srv


def _error(r: requests.Response, status: int, err_type: str, param: str | None) -> str:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert (err["type"], err["param"], err["code"]) == (err_type, param, status), err
    return str(err["message"])


def _still_serving(srv: ServerProc) -> None:
    r = post(srv, "/v1/completions", {"model": MODEL, "prompt": "ok", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


# ---- nested JSON ---------------------------------------------------------------------------

def test_json_depth_counts_without_recursion() -> None:
    deep: list[object] = []
    for _ in range(50_000):  # far past the interpreter's recursion limit
        deep = [deep]
    assert json_depth(deep, 100) == 101
    assert json_depth({"a": [1, {"b": []}], "c": 2}, 100) == 4
    assert json_depth("x", 100) == 0


@pytest.mark.parametrize("body", [
    b"[" * 5000 + b"]" * 5000,  # deeper than the parser's stack: RecursionError before
    b'{"model": "sim-llama", "prompt": "hi", "x": ' + b"[" * (MAX_JSON_DEPTH + 5)
    + b"]" * (MAX_JSON_DEPTH + 5) + b"}",
    b'{"prompt": [' + b"1000," * 5000 + b'1], "x": ' + b'{"a":' * 150 + b"1"
    + b"}" * 150 + b"}",  # the fast token-id path
], ids=["5000-levels", "past-the-limit", "token-id-fast-path"])
def test_deeply_nested_json_is_a_400(sim: ServerProc, body: bytes) -> None:
    r = requests.post(sim.url + "/v1/completions", data=body,
                      headers={"Content-Type": "application/json"}, timeout=30)
    msg = _error(r, 400, "Bad Request", None)
    assert f"nested more than {MAX_JSON_DEPTH} levels deep" in msg
    assert "RecursionError" not in sim.output
    _still_serving(sim)


def test_nesting_within_the_limit_is_served(sim: ServerProc) -> None:
    nested: object = 1
    for _ in range(MAX_JSON_DEPTH - 2):
        nested = {"a": nested}
    r = post(sim, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 1,
                                      "extra": nested})
    assert r.status_code == 200, r.text


# ---- slow clients --------------------------------------------------------------------------

def _host_port(srv: ServerProc) -> tuple[str, int]:
    host, port = srv.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def _drip_until_closed(srv: ServerProc, first: bytes, drip: bytes | None,
                       deadline: float = 15.0) -> tuple[bytes, float]:
    """Send ``first``, then ``drip`` every 0.2 s (or nothing), until the server closes the
    connection; returns what it answered and when it closed (s after connecting). Fails when
    it is still open after ``deadline`` s."""
    with socket.create_connection(_host_port(srv), timeout=5) as s:
        t0 = time.monotonic()
        s.sendall(first)
        s.settimeout(0.2)
        answer = b""
        while time.monotonic() - t0 < deadline:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                if drip is not None:
                    try:
                        s.sendall(drip)
                    except OSError:
                        return answer, time.monotonic() - t0
                continue
            except ConnectionResetError:
                return answer, time.monotonic() - t0
            if not chunk:
                return answer, time.monotonic() - t0
            answer += chunk
    pytest.fail(f"the server still held the connection after {deadline} s (got {answer!r})")


def test_slow_request_head_is_timed_out(strict: ServerProc) -> None:
    answer, closed_after = _drip_until_closed(
        strict, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n", b"X-Slow: 1\r\n")
    assert closed_after >= HEADER_TIMEOUT * 0.9
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"no complete request head within" in answer
    _still_serving(strict)


def test_idle_connection_is_timed_out(strict: ServerProc) -> None:
    answer, closed_after = _drip_until_closed(strict, b"", None)
    assert closed_after >= HEADER_TIMEOUT * 0.9 and answer.startswith(b"HTTP/1.1 408")


def test_slow_request_body_is_timed_out(strict: ServerProc) -> None:
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n")
    answer, _ = _drip_until_closed(strict, head + b'{"prompt": "', b" ")
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"RequestTimeout" in answer and b"not received within" in answer
    _still_serving(strict)


# ---- sampling parameters, as vLLM 0.32 validates them --------------------------------------

# Messages from vLLM 0.32 ``SamplingParams._verify_args`` (vllm/sampling_params.py); those
# raised with a ``parameter`` carry it in ``param`` and the ``(parameter=..., value=...)`` suffix.
@pytest.mark.parametrize(("field", "value", "message", "param"), [
    ("temperature", -1, "temperature must be non-negative, got -1.0. "
                        "(parameter=temperature, value=-1.0)", "temperature"),
    ("temperature", 2.5, "temperature must be in [0, 2], got 2.5. "
                         "(parameter=temperature, value=2.5)", "temperature"),
    ("top_p", 0, "top_p must be in (0, 1], got 0.0. (parameter=top_p, value=0.0)", "top_p"),
    ("top_p", 1.5, "top_p must be in (0, 1], got 1.5. (parameter=top_p, value=1.5)", "top_p"),
    ("top_k", -2, "top_k must be 0 (disable), or at least 1, got -2.", None),
    ("min_p", 1.5, "min_p must be in [0, 1], got 1.5.", None),
    ("presence_penalty", 3, "presence_penalty must be in [-2, 2], got 3.0.", None),
    ("frequency_penalty", -2.5, "frequency_penalty must be in [-2, 2], got -2.5.", None),
    ("repetition_penalty", 0, "repetition_penalty must be greater than zero, got 0.0.", None),
])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_sampling_parameters_vllm_refuses(sim: ServerProc, path: str, field: str,
                                          value: float, message: str,
                                          param: str | None) -> None:
    body: dict[str, object] = {"model": MODEL, "max_tokens": 2, field: value}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    r = post(sim, path, body)
    assert _error(r, 400, "BadRequestError", param) == message


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("temperature", "hot", "Input should be a valid number, unable to parse string"),
    ("top_p", [1], "Input should be a valid number"),
    ("top_k", 1.5, "Input should be a valid integer, got a number with a fractional part"),
    ("seed", 2**64, "Input should be less than or equal to 9223372036854775807"),
])
def test_sampling_parameter_types(sim: ServerProc, field: str, value: object,
                                  needle: str) -> None:
    r = post(sim, "/v1/completions", {"model": MODEL, "prompt": "hi", field: value})
    assert needle in _error(r, 400, "Bad Request", None)


def test_valid_sampling_parameters_are_served(sim: ServerProc) -> None:
    r = post(sim, "/v1/completions", {
        "model": MODEL, "prompt": "hi", "max_tokens": 2, "temperature": 0, "top_p": 1,
        "top_k": -1, "min_p": 0, "presence_penalty": -2, "frequency_penalty": 2,
        "repetition_penalty": 1.2, "seed": -(2**63)})
    assert r.status_code == 200, r.text


def test_best_of_is_ignored_as_vllm_0_32_does(sim: ServerProc) -> None:
    # vLLM 0.32's requests have no best_of field (it went with the V0 engine): like any unknown
    # field it is ignored, and one sequence is generated — not a million.
    r = post(sim, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2,
                                      "best_of": 1_000_000})
    assert r.status_code == 200 and len(r.json()["choices"]) == 1
    assert r.json()["usage"]["completion_tokens"] == 2
    r = post(sim, "/v1/completions", {"model": MODEL, "prompt": "hi", "n": 1_000_000})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"


# ---- 500 clients at once -------------------------------------------------------------------

CLIENTS = 500
BODY_MIB = 2


def _rss_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


async def _storm(url: str, body: bytes, clients: int) -> list[int]:
    """``clients`` concurrent POSTs of ``body``; their statuses (0: no answer)."""
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        async def one() -> int:
            try:
                async with session.post(url + "/v1/completions", data=body,
                                        headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    return r.status
            except (aiohttp.ClientError, TimeoutError):
                return 0

        return list(await asyncio.gather(*(one() for _ in range(clients))))


def test_memory_stays_bounded_under_500_concurrent_clients() -> None:
    # A server of its own, so that its peak RSS (VmHWM) is this test's.
    # Long timeouts: this test is about memory, and its own 500 clients are slow to send on a
    # busy machine.
    with start_server("llama-3.1-8b", ["--max-model-len", "4096"], extra=[
            "--served-model-name", MODEL, "--header-timeout", "120",
            "--body-timeout", "120"]) as srv:
        pid = srv.proc.pid
        for _ in range(3):
            _still_serving(srv)
        baseline = _rss_kib(pid, "VmRSS")
        # Token-id prompts of ~2 MiB each: far too long, so each is a quick 400 once read.
        ids = b"1000," * (BODY_MIB * 2**20 // 5)
        body = b'{"model": "' + MODEL.encode() + b'", "prompt": [' + ids + b'1]}'
        health: list[float] = []
        stop = threading.Event()

        def poll_health() -> None:
            while not stop.is_set():
                t = time.monotonic()
                r = requests.get(srv.url + "/health", timeout=30)
                assert r.status_code == 200
                health.append(time.monotonic() - t)
                stop.wait(0.2)

        poller = threading.Thread(target=poll_health, daemon=True)
        poller.start()
        try:
            statuses = asyncio.run(_storm(srv.url, body, CLIENTS))
        finally:
            stop.set()
            poller.join(60)
        peak = _rss_kib(pid, "VmHWM")
        _still_serving(srv)
    assert statuses.count(400) == CLIENTS, {s: statuses.count(s) for s in set(statuses)}
    assert health and not poller.is_alive()
    # All bodies together are CLIENTS x BODY_MIB = 1000 MiB. Before, every kept-alive
    # connection pinned its last body (the growth was about that, 1.1 GiB); now what is held at
    # once is the body budget (64 MiB) plus aiohttp's buffer of each connection (measured:
    # about 80 MiB in all). The bound: three times the server's own baseline (~70 MiB).
    growth = peak - baseline
    assert growth < 3 * baseline, (growth // 1024, baseline // 1024)
