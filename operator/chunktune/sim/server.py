"""The simulator behind vLLM's HTTP interface (aiohttp): the OpenAI endpoints, ``/health``,
``/tokenize`` and ``/metrics``, with vLLM's response and error shapes. Request parsing,
validation and the response bodies are :mod:`chunktune.sim.openai_protocol` (pure); this module
reads requests, drives the real-time engine and writes responses.

Endpoints:

- ``GET /health`` — 200, empty body (the port only opens once the engine is ready).
- ``GET /v1/models`` — the OpenAI model list, one card per ``--served-model-name``, with
  ``max_model_len``; ``GET /version``.
- ``POST /v1/completions``, ``POST /v1/chat/completions`` — streaming (SSE: one
  ``data: {json}\\n\\n`` event per token, ``data: [DONE]`` at the end) or not.
- ``POST /tokenize`` — ``{"count", "max_model_len", "tokens", "token_strs"}`` like vLLM's.
- ``GET /metrics`` — vLLM's families (:mod:`chunktune.sim.metrics`), text format 0.0.4 always.
- ``GET /sim/stats`` (simulator only) — the engine loop's per-step Python overhead, simulated
  step time and wake-up lateness (:meth:`~chunktune.sim.realtime.LoopStats.summary`), JSON.

Besides the protocol's errors: 401 ``{"error": "Unauthorized"}`` for ``/v1/*`` without the
``--api-key`` bearer token (vLLM's ``AuthenticationMiddleware``); unknown paths give FastAPI's
``{"detail": "Not Found"}``.

A client that disconnects (or times out) has its request aborted in the scheduler, freeing its
KV blocks; the server keeps serving the others.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from chunktune import __version__
from chunktune.sim import openai_protocol as proto
from chunktune.sim.metrics import CONTENT_TYPE, VllmMetrics
from chunktune.sim.openai_protocol import (
    DEFAULT_MAX_TOKENS_CAP,
    ApiError,
    Parsed,
    ServerConfig,
    dumps,
)
from chunktune.sim.realtime import RealtimeEngine, Stream

__all__ = ["DEFAULT_MAX_TOKENS_CAP", "ENGINE_KEY", "ServerConfig", "SimServer", "create_app"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ENGINE_KEY = web.AppKey("engine", RealtimeEngine)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=dumps)


def error_response(e: ApiError) -> web.Response:
    return _json(e.body(), status=e.status)


async def _json_body(request: web.Request, fast_ids: bool = False) -> dict[str, Any]:
    proto.check_content_type(request.headers.get("Content-Type", ""))
    return proto.parse_body(await request.read(), fast_ids)


class SimServer:
    """The handlers of one served engine."""

    def __init__(self, rt: RealtimeEngine, cfg: ServerConfig, metrics: VllmMetrics) -> None:
        self.rt = rt
        self.cfg = cfg
        self.metrics = metrics
        self.created = int(time.time())
        self._rng = random.Random(cfg.seed)

    def _request_id(self, prefix: str) -> str:
        return f"{prefix}-{self._rng.getrandbits(128):032x}"

    # -- simple endpoints --

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, _: web.Request) -> web.Response:
        return _json({"version": f"{__version__}+chunktune.sim"})

    async def models(self, _: web.Request) -> web.Response:
        return _json(proto.model_list(self.cfg, self.created))

    async def metrics_page(self, _: web.Request) -> web.Response:
        # Always text format 0.0.4, whatever Accept says (see chunktune.sim.metrics).
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def sim_stats(self, _: web.Request) -> web.Response:
        return _json(self.rt.stats.summary())

    async def tokenize(self, request: web.Request) -> web.Response:
        return _json(proto.tokenize(await _json_body(request), self.cfg))

    # -- generation --

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        arrival = asyncio.get_running_loop().time()
        body = await _json_body(request, fast_ids=not chat)
        p = proto.parse_generation(body, self.cfg, chat)
        stream = self.rt.submit(p.prompt_tokens, p.max_tokens, arrival)
        try:
            if p.stream:
                return await self._stream(request, stream, p, chat)
            return await self._complete(stream, p, chat)
        finally:
            if not stream.finished:
                self.rt.abort(stream)  # the client went away (or the handler was cancelled)

    async def _complete(self, stream: Stream, p: Parsed, chat: bool) -> web.Response:
        while await stream.wait():
            pass
        if stream.aborted:
            raise ApiError("The engine is shutting down; the request was aborted", status=503,
                           err_type="ServiceUnavailableError")
        rid = self._request_id("chatcmpl" if chat else "cmpl")
        return _json(proto.completion(p, stream.produced, rid, int(time.time()), chat))

    async def _stream(self, request: web.Request, stream: Stream, p: Parsed,
                      chat: bool) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={
            "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        rid = self._request_id("chatcmpl" if chat else "cmpl")
        ev = proto.StreamEvents.build(p, rid, int(time.time()), chat)
        sent = 0
        total = p.max_tokens
        try:
            while n := await stream.wait():
                parts: list[bytes] = []
                if sent == 0 and ev.role:
                    parts.append(ev.role)
                sent += n
                if sent >= total:
                    parts.append(ev.token * (n - 1) + ev.last)
                else:
                    parts.append(ev.token * n)
                await resp.write(b"".join(parts))
            if stream.aborted:
                return resp  # shutting down: end the stream without [DONE]
            await resp.write(ev.tail(p, sent))
            await resp.write_eof()
        except ConnectionResetError:
            pass  # the client went away; the caller aborts the request
        return resp


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as e:
        return error_response(e)
    except web.HTTPNotFound:
        return _json({"detail": "Not Found"}, status=404)
    except web.HTTPMethodNotAllowed:
        return _json({"detail": "Method Not Allowed"}, status=405)


def _auth(keys: tuple[str, ...]) -> Callable[..., Awaitable[web.StreamResponse]]:
    expected = {f"Bearer {k}" for k in keys}

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/v1") and request.method != "OPTIONS" \
                and request.headers.get("Authorization") not in expected:
            return _json({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return auth


def create_app(rt: RealtimeEngine, cfg: ServerConfig, metrics: VllmMetrics) -> web.Application:
    """The aiohttp application; starting it starts the engine loop, shutting it down aborts
    the requests still in flight (so streaming handlers end) and stops the loop."""
    middlewares: list[Any] = [_errors]
    if cfg.api_keys:
        middlewares.insert(0, _auth(cfg.api_keys))
    app = web.Application(middlewares=middlewares, client_max_size=64 * 2**20)
    app[ENGINE_KEY] = rt
    srv = SimServer(rt, cfg, metrics)
    app.router.add_get("/health", srv.health)
    app.router.add_get("/version", srv.version)
    app.router.add_get("/v1/models", srv.models)
    app.router.add_get("/metrics", srv.metrics_page)
    app.router.add_get("/sim/stats", srv.sim_stats)
    app.router.add_post("/tokenize", srv.tokenize)
    app.router.add_post("/v1/completions", srv.completions)
    app.router.add_post("/v1/chat/completions", srv.chat_completions)

    async def on_startup(_: web.Application) -> None:
        rt.start()

    async def on_shutdown(_: web.Application) -> None:
        await rt.stop()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    return app
