"""The simulator behind vLLM's HTTP interface (aiohttp): the OpenAI endpoints, ``/health``,
``/tokenize`` and ``/metrics``, with vLLM's response and error shapes. Request parsing,
validation and the response bodies are :mod:`chunktune.sim.serving.protocol` (pure); this module
reads requests, drives the real-time engine and writes responses.

Endpoints:

- ``GET /health`` — 200, empty body (the port only opens once the engine is ready).
- ``GET /v1/models`` — the OpenAI model list, one card per ``--served-model-name``, with
  ``max_model_len``; ``GET /version``.
- ``POST /v1/completions``, ``POST /v1/chat/completions`` — streaming (SSE: one
  ``data: {json}\\n\\n`` event per token, ``data: [DONE]`` at the end) or not.
- ``POST /tokenize`` — ``{"count", "max_model_len", "tokens", "token_strs"}`` like vLLM's;
  ``POST /detokenize`` — ``{"prompt": text}`` (needs a tokenizer).
- ``GET /metrics`` — vLLM's families (:mod:`chunktune.sim.serving.metrics`), text format 1.0.0
always. - ``GET /sim/stats`` (simulator only) — the engine loop's per-step Python overhead,
simulated
  step time and wake-up lateness (:meth:`~chunktune.sim.serving.realtime.LoopStats.summary`), JSON.

Besides the protocol's errors: 401 ``{"error": "Unauthorized"}`` for ``/v1/*`` without the
``--api-key`` bearer token (vLLM's ``AuthenticationMiddleware``); unknown paths give FastAPI's
``{"detail": "Not Found"}``.

A client that disconnects (or times out) has its request aborted in the scheduler, freeing its
KV blocks; the server keeps serving the others.

Limits (:class:`HttpLimits`), so that slow or hostile clients cannot hold the server: a
connection whose first request head is not complete within ``header_timeout`` gets a 408 and is
closed (later requests on a kept-alive connection fall under aiohttp's keep-alive timeout); a
body not received within ``body_timeout`` gets a 408 and the connection closes; a
body over ``max_body`` bytes is a 413; and the bodies being read and parsed at once hold at most
``bodies_in_flight`` bytes — further requests wait for room (a 503 after ``room_timeout``) while
the kernel's socket buffers, not the server's memory, hold their data.
"""

from __future__ import annotations

import asyncio
import collections
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from chunktune import __version__
from chunktune.sim.serving import protocol as proto
from chunktune.sim.serving.metrics import CONTENT_TYPE, VllmMetrics
from chunktune.sim.serving.protocol import (
    DEFAULT_MAX_TOKENS_CAP,
    ApiError,
    Parsed,
    ServerConfig,
    dumps,
)
from chunktune.sim.serving.realtime import RealtimeEngine, Stream

__all__ = ["DEFAULT_MAX_TOKENS_CAP", "ENGINE_KEY", "HttpLimits", "ServerConfig", "SimServer",
           "create_app", "guard_request_heads"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ENGINE_KEY = web.AppKey("engine", RealtimeEngine)

MiB = 2**20


@dataclass(frozen=True)
class HttpLimits:
    """Timeouts and memory bounds of the HTTP layer (see the module doc)."""

    #: Seconds from connecting to a complete first request head.
    header_timeout: float = 10.0
    #: Seconds to receive a whole request body, once there is room to read it.
    body_timeout: float = 30.0
    #: Seconds a request may wait for room in ``bodies_in_flight`` before a 503.
    room_timeout: float = 120.0
    #: The largest request body (bytes).
    max_body: int = 64 * MiB
    #: Bytes of request bodies read and parsed at once, all connections together (each body
    #: counts :data:`BODY_COPIES` times: its chunks, the joined bytes, the parser's copy).
    bodies_in_flight: int = 64 * MiB
    #: What aiohttp buffers per connection before pausing the socket is twice this (bytes).
    read_bufsize: int = 32 * 1024

    def runner_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :class:`aiohttp.web.AppRunner` for these limits."""
        return {"read_bufsize": self.read_bufsize}


LIMITS_KEY = web.AppKey("limits", HttpLimits)
#: How many times a body's size it takes to read and parse it.
BODY_COPIES = 3


class ByteBudget:
    """A first-come-first-served semaphore counted in bytes: :meth:`acquire` waits until ``n``
    bytes are free (at most ``total``: a larger request takes the whole budget), and
    :meth:`release` gives them back."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.free = total
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    async def acquire(self, n: int) -> int:
        """Take ``n`` bytes (capped at ``total``); returns what was taken, for release."""
        n = min(n, self.total)
        if not self._waiters and self.free >= n:
            self.free -= n
            return n
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((n, fut))
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release(n)  # granted just as the wait was cancelled
            else:
                fut.cancel()
                self._grant()  # it may have been first in line
            raise
        return n

    def release(self, n: int) -> None:
        self.free += n
        self._grant()

    def _grant(self) -> None:
        while self._waiters:
            n, fut = self._waiters[0]
            if fut.done():  # cancelled while waiting
                self._waiters.popleft()
                continue
            if n > self.free:
                return
            self._waiters.popleft()
            self.free -= n
            fut.set_result(None)


BUDGET_KEY = web.AppKey("body_budget", ByteBudget)


_HEAD_TIMEOUT = (b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
                 b"Connection: close\r\nContent-Length: %d\r\n\r\n%s")


def guard_request_heads(server: web.Server, timeout: float) -> None:
    """Close a connection that has not sent a complete first request head ``timeout`` seconds
    after connecting (aiohttp itself waits for it as long as its keep-alive timeout allows),
    with a 408. Call it after ``AppRunner.setup()`` and before the site starts."""
    loop = asyncio.get_running_loop()
    timers: dict[Any, asyncio.TimerHandle] = {}
    made, lost, make_request = server.connection_made, server.connection_lost, \
        server.request_factory
    body = dumps(ApiError(f"no complete request head within {timeout:g} s", status=408,
                          err_type="RequestTimeout").body()).encode()

    def expire(handler: Any, transport: asyncio.Transport) -> None:
        timers.pop(handler, None)
        # A head already parsed (aiohttp counts parsed messages) waits for the handler task,
        # which a busy loop may start late: that client is not slow.
        if getattr(handler, "_request_count", 0) > 0:
            return
        if not transport.is_closing():
            transport.write(_HEAD_TIMEOUT % (len(body), body))
            transport.close()

    def connection_made(handler: Any, transport: asyncio.Transport) -> None:
        made(handler, transport)
        timers[handler] = loop.call_later(timeout, expire, handler, transport)

    def connection_lost(handler: Any, exc: BaseException | None = None) -> None:
        if (t := timers.pop(handler, None)) is not None:
            t.cancel()
        lost(handler, exc)

    def request_factory(message: Any, payload: Any, protocol: Any, writer: Any, task: Any,
                        *args: Any, **kwargs: Any) -> web.BaseRequest:
        if (t := timers.pop(protocol, None)) is not None:
            t.cancel()
        return make_request(message, payload, protocol, writer, task, *args, **kwargs)

    server.connection_made = connection_made  # type: ignore[method-assign]
    server.connection_lost = connection_lost  # type: ignore[method-assign]
    server.request_factory = request_factory


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=dumps)


def error_response(e: ApiError) -> web.Response:
    return _json(e.body(), status=e.status)


async def _json_body(request: web.Request, fast_ids: bool = False) -> dict[str, Any]:
    """Read and parse a JSON body within the limits: room in the byte budget, the body
    timeout, the size limit."""
    proto.check_content_type(request.headers.get("Content-Type", ""))
    limits, budget = request.app[LIMITS_KEY], request.app[BUDGET_KEY]
    length = request.content_length
    if length is not None and length > limits.max_body:
        raise _too_large(length, limits)
    need = BODY_COPIES * (length if length is not None else limits.max_body)
    try:
        async with asyncio.timeout(limits.room_timeout):
            held = await budget.acquire(need)
    except TimeoutError as e:
        raise ApiError(f"the server is reading too many request bodies at once; no room for "
                       f"this one within {limits.room_timeout:g} s, retry later", status=503,
                       err_type="ServiceUnavailableError") from e
    try:
        try:
            async with asyncio.timeout(limits.body_timeout):
                raw = await _read_body(request, limits)
        except TimeoutError as e:
            raise ApiError(f"the request body was not received within "
                           f"{limits.body_timeout:g} s", status=408,
                           err_type="RequestTimeout") from e
        return proto.parse_body(raw, fast_ids)
    finally:
        budget.release(held)


async def _read_body(request: web.Request, limits: HttpLimits) -> bytes:
    """The body, read from the stream. Not ``request.read()``, which caches the bytes on the
    request object: with it, the server's memory grew by every body of every connection still
    open (500 kept-alive clients sending 2 MiB each: +1.1 GiB; read like this: +75 MiB)."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.readany():
        size += len(chunk)
        if size > limits.max_body:
            raise _too_large(None, limits)
        chunks.append(chunk)
    raw = b"".join(chunks)
    del chunks
    return raw


def _too_large(length: int | None, limits: HttpLimits) -> ApiError:
    got = "" if length is None else f" (got {length} bytes)"
    return ApiError(f"the request body is larger than {limits.max_body} bytes{got}",
                    status=413, err_type="RequestEntityTooLarge")


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
        # Always text format 1.0.0, whatever Accept says (see chunktune.sim.serving.metrics).
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def sim_stats(self, _: web.Request) -> web.Response:
        return _json(self.rt.stats.summary())

    async def tokenize(self, request: web.Request) -> web.Response:
        return _json(proto.tokenize(await _json_body(request), self.cfg))

    async def detokenize(self, request: web.Request) -> web.Response:
        return _json(proto.detokenize(await _json_body(request), self.cfg))

    # -- generation --

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        arrival = asyncio.get_running_loop().time()
        # a token-id prompt is counted, not decoded, unless the prefix cache must read it
        body = await _json_body(request, fast_ids=not chat and not self.cfg.prefix_block_size)
        p = proto.parse_generation(body, self.cfg, chat)
        del body  # a long prompt need not live as long as its stream
        full = self.rt.queue_full()
        if full is not None:  # --max-num-queued-reqs: vLLM's QueueOverflowError
            raise ApiError(full, status=503, err_type="Service Unavailable")
        stream = self.rt.submit(p.prompt_tokens, p.max_tokens, arrival, priority=p.priority,
                                block_keys=p.block_keys)
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
        resp = error_response(e)
        if e.status in (408, 413):  # the rest of the body is not worth reading
            resp.force_close()
        return resp
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


def create_app(rt: RealtimeEngine, cfg: ServerConfig, metrics: VllmMetrics,
               limits: HttpLimits | None = None) -> web.Application:
    """The aiohttp application; starting it starts the engine loop, shutting it down aborts
    the requests still in flight (so streaming handlers end) and stops the loop. Run it with
    ``AppRunner(app, **limits.runner_kwargs())`` and :func:`guard_request_heads`."""
    limits = limits or HttpLimits()
    middlewares: list[Any] = [_errors]
    if cfg.api_keys:
        middlewares.insert(0, _auth(cfg.api_keys))
    app = web.Application(middlewares=middlewares, client_max_size=limits.max_body)
    app[ENGINE_KEY] = rt
    app[LIMITS_KEY] = limits
    app[BUDGET_KEY] = ByteBudget(limits.bodies_in_flight)
    srv = SimServer(rt, cfg, metrics)
    app.router.add_get("/health", srv.health)
    app.router.add_get("/version", srv.version)
    app.router.add_get("/v1/models", srv.models)
    app.router.add_get("/metrics", srv.metrics_page)
    app.router.add_get("/sim/stats", srv.sim_stats)
    app.router.add_post("/tokenize", srv.tokenize)
    app.router.add_post("/detokenize", srv.detokenize)
    app.router.add_post("/v1/completions", srv.completions)
    app.router.add_post("/v1/chat/completions", srv.chat_completions)

    async def on_startup(_: web.Application) -> None:
        rt.start()

    async def on_shutdown(_: web.Application) -> None:
        await rt.stop()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    return app
