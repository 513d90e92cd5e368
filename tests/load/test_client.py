"""The streaming client on its own: SSE parsing, token-bearing chunks, error bodies."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator

import pytest
import requests

from chunktune.core.records import RequestRecord
from chunktune.load.client import _Stream, build_body, error_message, stream_request
from tests.timing import retry_timing, timing


def record(max_tokens: int = 3) -> RequestRecord:
    return RequestRecord(rid=1, cls="c", arrival=None, start=0.0, prompt_tokens=5,
                         max_tokens=max_tokens)


def ev(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode()


def test_build_body() -> None:
    b = build_body("completions", "m", [1, 2, 3], 7)
    assert b["prompt"] == [1, 2, 3] and b["max_tokens"] == b["min_tokens"] == 7
    assert b["ignore_eos"] is True and b["stream"] is True
    assert b["stream_options"] == {"include_usage": True}
    c = build_body("chat", "m", [{"role": "user", "content": "hi"}], 2)
    assert c["messages"][0]["content"] == "hi" and "prompt" not in c
    # vLLM's priority field only when the request has one (any server takes the body then)
    assert "priority" not in b and "priority" not in c
    assert build_body("chat", "m", [], 2, priority=-3)["priority"] == -3


def test_chat_role_and_finish_chunks_carry_no_token() -> None:
    r = record()
    s = _Stream(r, "chat", t_send=0.0)
    s.event(ev({"choices": [{"delta": {"role": "assistant", "content": ""}}]}), 0.5)
    assert r.ttft is None
    s.event(ev({"choices": [{"delta": {"content": " a"}, "finish_reason": None}]}), 1.0)
    s.event(ev({"choices": [{"delta": {"content": ""}, "finish_reason": None}]}), 1.25)
    s.event(ev({"choices": [{"delta": {"reasoning_content": "x"}}]}), 1.5)
    s.event(ev({"choices": [{"delta": {}, "finish_reason": "length"}]}), 1.75)
    s.event(ev({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}}), 2.0)
    s.event(b"data: [DONE]", 2.0)
    assert r.ttft == 1.0 and r.itl == [0.25, 0.25] and s.chunks == 3 and s.done


def test_completion_chunks_and_errors() -> None:
    r = record()
    s = _Stream(r, "completions", t_send=0.0)
    s.event(b": keep-alive comment", 0.1)
    s.event(ev({"choices": [{"text": " a", "finish_reason": None}]}), 0.2)
    s.event(ev({"choices": [{"text": "", "finish_reason": "length"}]}), 0.3)
    assert s.chunks == 1 and s.finish == "length"
    s.event(ev({"error": {"message": "engine died", "code": 500}}), 0.4)
    assert s.error == "engine died"
    s2 = _Stream(record(), "completions", 0.0)
    s2.event(b"data: {not json", 0.1)
    assert s2.error is not None and s2.error.startswith("not JSON")


@pytest.mark.parametrize(("body", "msg"), [
    (b'{"error": {"message": "too long", "type": "BadRequestError", "code": 400}}', "too long"),
    (b'{"object": "error", "message": "old vllm", "code": 400}', "old vllm"),
    (b'{"detail": "Not Found"}', "Not Found"),
    (b"plain text failure", "plain text failure"),
    (b"", "(empty body)"),
])
def test_error_message(body: bytes, msg: str) -> None:
    assert error_message(body) == msg


class _SSEHandler(http.server.BaseHTTPRequestHandler):
    """Streams 5 completion tokens 20 ms apart *without* chunked encoding (until close)."""

    protocol_version = "HTTP/1.0"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(5):
            time.sleep(0.02)
            self.wfile.write(ev({"choices": [{"text": f" t{i}"}]}) + b"\r\n\r\n")
            self.wfile.flush()
        usage = {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 5}}
        self.wfile.write(ev(usage) + b"\r\n\r\ndata: [DONE]\r\n\r\n")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def plain_server() -> Iterator[str]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SSEHandler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_unchunked_stream_is_not_buffered(plain_server: str) -> None:
    """The server flushes its five events 20 ms apart: each is recorded when it arrives, not all
    at the end (a buffered stream gives a TTFT of 0.1 s or more and gaps of about 0). The
    bounds on time are timing bounds: a client stalled by a busy machine reads two events at
    once, which is not buffering."""
    def run() -> None:
        r = record(max_tokens=5)
        body = build_body("completions", "m", "hello there", 5)
        stream_request(requests.Session(), plain_server + "/v1/completions", body, r,
                       api="completions", clock0=time.perf_counter())
        assert r.ok, r.error
        assert r.output_tokens == 5 and r.prompt_tokens == 4
        assert r.ttft is not None and r.ttft > 0.015 and len(r.itl) == 4, (r.ttft, r.itl)
        timing(r.ttft < 0.1, "ttft", r.ttft)
        timing(sum(r.itl) > 0.06 and sum(g > 0.01 for g in r.itl) >= 3, "itl", r.itl)

    retry_timing(run)


def test_connection_refused() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = record()
    stream_request(requests.Session(), f"http://127.0.0.1:{port}/v1/completions",
                   build_body("completions", "m", "x", 3), r, api="completions",
                   clock0=time.perf_counter())
    assert not r.ok and r.reason == "connection_error"
    assert r.error is not None and r.error.startswith("before the response")
