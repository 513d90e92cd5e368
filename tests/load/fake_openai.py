"""A fake OpenAI-compatible streaming server with known timing, for testing the load driver.

Streams ``/v1/completions`` and ``/v1/chat/completions`` as vLLM does (SSE chunks of one token,
the chat role chunk with the first token, a final ``usage`` chunk when asked for, ``[DONE]``):
the first token ``ttft`` seconds after the request arrives, then one every ``itl`` seconds
(scheduled on absolute times, so no drift). It records, per request, what it received and when
it wrote each token, and can misbehave on purpose, chosen by the request id the client sends in
``X-Request-Id`` (``chunktune-<run>-<rid>``): every ``fail_every``-th request answers HTTP
``fail_status`` with an OpenAI error body; every ``close_every``-th has its connection closed
after ``close_after`` tokens; every ``hang_every``-th streams one token per ``hang_itl`` seconds;
every ``short_every``-th stops one token short of ``max_tokens``.

Control and inspection (JSON): ``POST /_control`` sets any of :data:`DEFAULTS`;
``POST /_reset`` clears the records; ``GET /_stats`` returns ``{"requests": [...],
"max_inflight": n}``, times in ``time.perf_counter()`` seconds (CLOCK_MONOTONIC, shared by the
processes of one machine). ``GET /metrics`` serves ``vllm:time_to_first_token_seconds`` sum and
count in the Prometheus text format.

Run ``python tests/load/fake_openai.py --port 0``: it prints ``READY <port>`` once listening.
:class:`FakeServer` does that in a child process (loopback only) for tests and benchmarks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

DEFAULTS: dict[str, Any] = {
    "model": "fake-model",
    "ttft": 0.02,
    "itl": 0.005,
    "fail_every": None,
    "fail_status": 400,
    "close_every": None,
    "close_after": 2,
    "hang_every": None,
    "hang_itl": 30.0,
    "short_every": None,
    "usage": True,
}

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


def _count_tokens(text: str) -> int:
    return len(_TOKEN_RE.findall(text))


def prompt_tokens(body: dict[str, Any], chat: bool) -> int:
    """Prompt tokens under chunktune's rule (kept here too, so the fake needs no chunktune)."""
    if chat:
        msgs = body.get("messages") or []
        return sum(_count_tokens(str(m.get("content") or "")) for m in msgs) + 4 * len(msgs) + 3
    p = body.get("prompt")
    if isinstance(p, list):
        return len(p)
    return _count_tokens(str(p or ""))


class App:
    def __init__(self) -> None:
        self.cfg = dict(DEFAULTS)
        self.records: list[dict[str, Any]] = []
        self.inflight = 0
        self.max_inflight = 0
        self.counter = 0
        self.ttft_sum = 0.0
        self.ttft_count = 0

    def _rid(self, request: Any) -> int:
        self.counter += 1
        m = re.fullmatch(r"chunktune-(?:[0-9a-f]+-)?(\d+)",
                         request.headers.get("X-Request-Id", ""))
        return int(m.group(1)) if m else self.counter

    @staticmethod
    def _every(n: Any, rid: int) -> bool:
        return bool(n) and rid % int(n) == 0

    async def completions(self, request: Any) -> Any:
        return await self._stream(request, chat=False)

    async def chat(self, request: Any) -> Any:
        return await self._stream(request, chat=True)

    async def _stream(self, request: Any, chat: bool) -> Any:
        from aiohttp import web

        t_recv = time.perf_counter()
        cfg = self.cfg
        rid = self._rid(request)
        body = await request.json()
        n = int(body.get("max_tokens") or 16)
        if self._every(cfg["short_every"], rid):
            n = max(0, n - 1)
        rec: dict[str, Any] = {
            "rid": rid, "path": request.path, "arrival": t_recv,
            "prompt_tokens": prompt_tokens(body, chat),
            "max_tokens": body.get("max_tokens"),
            "min_tokens": body.get("min_tokens"), "ignore_eos": body.get("ignore_eos"),
            "stream": body.get("stream"), "stream_options": body.get("stream_options"),
            "model": body.get("model"), "priority": body.get("priority"), "status": 200,
            "ttft": None, "token_times": [],
            "end": None, "outcome": "ok",
        }
        self.records.append(rec)
        if self._every(cfg["fail_every"], rid):
            rec["status"] = cfg["fail_status"]
            rec["outcome"] = "error"
            rec["end"] = time.perf_counter()
            err = {"error": {"message": f"fake failure for request {rid}", "type":
                             "BadRequestError", "param": None, "code": cfg["fail_status"]}}
            return web.json_response(err, status=cfg["fail_status"])
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        resp.enable_chunked_encoding()
        try:
            await resp.prepare(request)
            itl = cfg["hang_itl"] if self._every(cfg["hang_every"], rid) else cfg["itl"]
            close_at = cfg["close_after"] if self._every(cfg["close_every"], rid) else None
            first = t_recv + cfg["ttft"]
            ident = f"cmpl-{rid}"
            obj = "chat.completion.chunk" if chat else "text_completion"
            for i in range(n):
                if close_at is not None and i >= close_at:
                    rec["outcome"] = "closed"
                    assert request.transport is not None
                    request.transport.close()
                    return resp
                delay = first + i * itl - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                finish = "length" if i == n - 1 else None
                if chat:
                    choice: dict[str, Any] = {"index": 0, "delta": {"content": f" t{i}"},
                                              "logprobs": None, "finish_reason": finish}
                else:
                    choice = {"index": 0, "text": f" t{i}", "logprobs": None,
                              "finish_reason": finish, "stop_reason": None}
                chunk = {"id": ident, "object": obj, "created": int(time.time()),
                         "model": body.get("model"), "choices": [choice]}
                data = b""
                if chat and i == 0:
                    role = dict(chunk, choices=[{"index": 0, "delta": {
                        "role": "assistant", "content": ""}, "logprobs": None,
                        "finish_reason": None}])
                    data += b"data: " + json.dumps(role).encode() + b"\n\n"
                data += b"data: " + json.dumps(chunk).encode() + b"\n\n"
                await resp.write(data)
                now = time.perf_counter()
                rec["token_times"].append(now)
                if i == 0:
                    rec["ttft"] = now - t_recv
                    self.ttft_sum += rec["ttft"]
                    self.ttft_count += 1
            tail = b""
            if cfg["usage"] and (body.get("stream_options") or {}).get("include_usage"):
                pt = rec["prompt_tokens"]
                usage = {"id": ident, "object": obj, "created": int(time.time()),
                         "model": body.get("model"), "choices": [],
                         "usage": {"prompt_tokens": pt, "total_tokens": pt + n,
                                   "completion_tokens": n}}
                tail += b"data: " + json.dumps(usage).encode() + b"\n\n"
            tail += b"data: [DONE]\n\n"
            await resp.write(tail)
            await resp.write_eof()
            return resp
        except (ConnectionResetError, asyncio.CancelledError):
            rec["outcome"] = "client_gone"
            raise
        finally:
            rec["end"] = time.perf_counter()
            self.inflight -= 1

    async def models(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"object": "list", "data": [
            {"id": self.cfg["model"], "object": "model", "owned_by": "fake"}]})

    async def control(self, request: Any) -> Any:
        from aiohttp import web

        changes = await request.json()
        unknown = set(changes) - set(DEFAULTS)
        if unknown:
            return web.json_response({"error": f"unknown settings {sorted(unknown)}"},
                                     status=400)
        self.cfg.update(changes)
        return web.json_response(self.cfg)

    async def reset(self, request: Any) -> Any:
        from aiohttp import web

        self.records = []
        self.max_inflight = self.inflight
        self.counter = 0
        return web.json_response({"ok": True})

    async def stats(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"requests": self.records, "max_inflight": self.max_inflight,
                                  "inflight": self.inflight})

    async def metrics(self, request: Any) -> Any:
        from aiohttp import web

        m = "vllm:time_to_first_token_seconds"
        text = (f"# TYPE {m} histogram\n"
                f'{m}_sum{{model_name="{self.cfg["model"]}"}} {self.ttft_sum}\n'
                f'{m}_count{{model_name="{self.cfg["model"]}"}} {self.ttft_count}\n')
        return web.Response(text=text, content_type="text/plain")


async def serve(host: str, port: int, settings: dict[str, Any]) -> None:
    from aiohttp import web

    app = App()
    app.cfg.update(settings)
    web_app = web.Application(client_max_size=64 * 1024 * 1024)
    web_app.add_routes([
        web.post("/v1/completions", app.completions),
        web.post("/v1/chat/completions", app.chat),
        web.get("/v1/models", app.models),
        web.post("/_control", app.control),
        web.post("/_reset", app.reset),
        web.get("/_stats", app.stats),
        web.get("/metrics", app.metrics),
    ])
    runner = web.AppRunner(web_app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    await site.start()
    server = site._server
    assert server is not None
    real_port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"READY {real_port}", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    for k, v in DEFAULTS.items():
        if isinstance(v, bool):
            continue
        ap.add_argument(f"--{k.replace('_', '-')}", dest=k,
                        type=type(v) if v is not None else int, default=v)
    args = ap.parse_args(argv)
    settings = {k: getattr(args, k) for k in DEFAULTS if hasattr(args, k)}
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.host, args.port, settings))
    return 0


class FakeServer:
    """The fake server in a child process: ``with FakeServer(ttft=0.05) as s: s.url``."""

    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def __enter__(self) -> FakeServer:
        args = [sys.executable, str(Path(__file__).resolve()), "--port", "0"]
        for k, v in self.settings.items():
            args += [f"--{k.replace('_', '-')}", str(v)]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("READY "):
            self.proc.kill()
            raise RuntimeError(f"fake server did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def _call(self, path: str, payload: dict[str, Any] | None = None) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(self.url + path, data=data,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.load(resp)

    def control(self, **settings: Any) -> dict[str, Any]:
        """Change settings (any of :data:`DEFAULTS`); returns them all."""
        return dict(self._call("/_control", settings))

    def reset(self, **settings: Any) -> None:
        """Clear the records and restore the defaults (plus ``settings``)."""
        self._call("/_reset", {})
        self.control(**{**DEFAULTS, **self.settings, **settings})

    def stats(self) -> dict[str, Any]:
        return dict(self._call("/_stats"))


if __name__ == "__main__":
    sys.exit(main())
