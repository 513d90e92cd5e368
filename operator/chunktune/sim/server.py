"""The simulator behind vLLM's HTTP interface (aiohttp): the OpenAI endpoints, ``/health``,
``/tokenize`` and ``/metrics``, with vLLM's response and error shapes.

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

Token counting (there is no tokenizer): a text prompt counts
:func:`chunktune.load.prompts.count_tokens` tokens (one per word, one per punctuation
character); a chat prompt :func:`~chunktune.load.prompts.count_chat_tokens` (contents + 4 per
message + 3); a prompt given as token ids counts exactly ``len(ids)``. Use token ids when the
count has to be exact on a real vLLM too. A batch (a list of several prompts) is refused
(400), as is ``n`` other than 1: the simulator runs one sequence per request.

Generation: there is no model, so no EOS — every request generates exactly its ``max_tokens``
tokens (``ignore_eos`` and ``min_tokens`` are accepted and change nothing; ``finish_reason`` is
``length``). The text is the filler ``" tok"`` per token, which counts as one token under the
rule above. ``max_tokens`` when absent: 16 for completions (vLLM's ``CompletionRequest``
default); for chat (and an explicit ``null``) vLLM's rule ``max_model_len - prompt tokens``,
capped at the server's ``default_max_tokens`` (``--default-max-tokens``, default 256) because a
real model would stop at EOS long before. Chat's ``max_completion_tokens`` wins over
``max_tokens``. ``stream_options.continuous_usage_stats`` is not supported (ignored).

Errors have vLLM's JSON shape ``{"error": {"message", "type", "param", "code"}}`` and status:

- 400 ``BadRequestError``: prompt too long (``param: input_tokens``), ``max_tokens`` too large
  for the context or < 1 (``param: max_tokens``; vLLM's ``VLLMValidationError`` messages,
  including their ``(parameter=..., value=...)`` suffix), ``n != 1``, batch prompts;
- 400 ``Bad Request``: what vLLM's FastAPI layer rejects before the handler — malformed JSON,
  a body that is not an object, wrong field types, missing ``messages``/``prompt``, a
  non-JSON content type; the message is the pydantic-style error list;
- 404 ``NotFoundError`` (``param: model``): ``The model `x` does not exist.`` A request without
  ``model`` is served by the first served name, as vLLM does;
- 401 ``{"error": "Unauthorized"}`` for ``/v1/*`` without the ``--api-key`` bearer token (vLLM's
  ``AuthenticationMiddleware``); unknown paths give FastAPI's ``{"detail": "Not Found"}``.

A client that disconnects (or times out) has its request aborted in the scheduler, freeing its
KV blocks; the server keeps serving the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import random
import re
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from chunktune import __version__
from chunktune.core.tokens import count_chat_tokens, count_tokens
from chunktune.sim.metrics import CONTENT_TYPE, VllmMetrics
from chunktune.sim.realtime import RealtimeEngine, Stream

#: vLLM's ``CompletionRequest.max_tokens`` default.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
#: The simulator's cap on chat's default ``max_tokens`` (vLLM: ``max_model_len - prompt``).
DEFAULT_MAX_TOKENS_CAP = 256
#: The text of every generated token.
FILLER = " tok"

#: vLLM's (pydantic's / Starlette's) compact JSON.
dumps = functools.partial(json.dumps, separators=(",", ":"))

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ENGINE_KEY = web.AppKey("engine", RealtimeEngine)


@dataclass(frozen=True)
class ServerConfig:
    """What the HTTP layer needs besides the engine."""

    served_model_names: tuple[str, ...]
    #: The model as given to ``serve`` (``root`` in ``/v1/models``).
    model_root: str
    max_model_len: int
    vocab_size: int = 32000
    api_keys: tuple[str, ...] = ()
    default_max_tokens: int = DEFAULT_MAX_TOKENS_CAP
    seed: int = 0


class ApiError(Exception):
    """An error response in vLLM's shape."""

    def __init__(self, message: str, *, status: int = 400, err_type: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.err_type = err_type
        self.param = param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.err_type, "param": self.param,
                          "code": self.status}}

    def response(self) -> web.Response:
        return _json(self.body(), status=self.status)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=dumps)


def validation_error(errors: list[dict[str, Any]]) -> ApiError:
    """What vLLM's ``RequestValidationError`` handler answers: 400, type ``Bad Request``."""
    return ApiError(str(errors), err_type="Bad Request")


def vllm_validation_error(message: str, parameter: str, value: Any) -> ApiError:
    """A ``VLLMValidationError`` as vLLM's ``create_error_response`` renders it."""
    return ApiError(f"{message} (parameter={parameter}, value={value})", param=parameter)


# ---- request parsing -----------------------------------------------------------------------


def _int(body: dict[str, Any], name: str, errors: list[dict[str, Any]]) -> int | None:
    """pydantic's lax int: ints, integral floats, digit strings."""
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, float):
        errors.append({"type": "int_from_float", "loc": ("body", name),
                       "msg": "Input should be a valid integer, got a number with a fractional "
                              "part", "input": v})
    elif isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            errors.append({"type": "int_parsing", "loc": ("body", name),
                           "msg": "Input should be a valid integer, unable to parse string as "
                                  "an integer", "input": v})
    else:
        errors.append({"type": "int_type", "loc": ("body", name),
                       "msg": "Input should be a valid integer", "input": v})
    return None


_TRUE = ("true", "1", "yes", "on", "t", "y")
_FALSE = ("false", "0", "no", "off", "f", "n")


def _bool(obj: dict[str, Any], name: str, errors: list[dict[str, Any]],
          loc: tuple[str, ...] = ("body",)) -> bool | None:
    v = obj.get(name)
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in _TRUE + _FALSE:
        return v.strip().lower() in _TRUE
    errors.append({"type": "bool_parsing" if isinstance(v, str) else "bool_type",
                   "loc": (*loc, name), "msg": "Input should be a valid boolean", "input": v})
    return None


class TokenIds(int):
    """A token-id prompt counted without being decoded (see :func:`_split_token_ids`)."""


#: A JSON string no client sends, standing in for a token-id array while the rest is parsed.
_IDS_PLACEHOLDER = "\u0000chunktune:token-ids"
_PROMPT_IDS = re.compile(rb'"prompt"\s*:\s*\[(?=\s*\d)')
_FAST_IDS_MIN_BYTES = 16384


def _split_token_ids(raw: bytes) -> tuple[bytes, int] | None:
    """Count a large token-id ``prompt`` at C speed instead of decoding it into a list.

    ``json.loads`` takes ~7 ms for a 32k-id prompt, during which the event loop — and so the
    engine's step clock — stands still; counting the commas takes ~0.1 ms. Returns the body
    with the array replaced by a placeholder string, and the id count; None when the body does
    not have that shape (it is then parsed in full).
    """
    if len(raw) < _FAST_IDS_MIN_BYTES:
        return None
    m = _PROMPT_IDS.search(raw)
    if m is None:
        return None
    end = raw.find(b"]", m.end())
    if end < 0:
        return None
    inner = raw[m.end():end].translate(None, b" \t\r\n")
    if (not inner or inner.translate(None, b"0123456789,") or inner[:1] == b","
            or inner[-1:] == b"," or b",," in inner):
        return None
    placeholder = json.dumps(_IDS_PLACEHOLDER).encode()
    return raw[:m.start()] + b'"prompt":' + placeholder + raw[end + 1:], inner.count(b",") + 1


async def _json_body(request: web.Request, fast_ids: bool = False) -> dict[str, Any]:
    ctype = request.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
    if ctype != "application/json":
        raise validation_error([{"loc": ["header", "content-type"],
                                 "msg": "Unsupported Media Type: Only 'application/json' is "
                                        "allowed", "type": "value_error"}])
    raw = await request.read()
    split = _split_token_ids(raw) if fast_ids else None
    if split is not None:
        with contextlib.suppress(json.JSONDecodeError, UnicodeDecodeError):
            body = json.loads(split[0])
            if isinstance(body, dict) and body.get("prompt") == _IDS_PLACEHOLDER:
                body["prompt"] = TokenIds(split[1])
                return body
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        pos = getattr(e, "pos", 0)
        msg = getattr(e, "msg", str(e))
        raise validation_error([{"type": "json_invalid", "loc": ("body", pos),
                                 "msg": "JSON decode error", "input": {},
                                 "ctx": {"error": msg}}]) from None
    if not isinstance(body, dict):
        raise validation_error([{"type": "model_attributes_type", "loc": ("body",),
                                 "msg": "Input should be a valid dictionary or object to extract "
                                        "fields from", "input": body}])
    return body


@dataclass
class Parsed:
    """A validated generation request."""

    model: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    priority: int = 0
    """The request's ``priority`` (lower first under ``--scheduling-policy priority``)."""


def _is_ids(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in v)


def _prompt_tokens(prompt: Any) -> int:
    """Tokens of a completions ``prompt`` (text, token ids, or a batch of one)."""
    if isinstance(prompt, TokenIds):
        return int(prompt)
    if isinstance(prompt, str):
        return count_tokens(prompt)
    if _is_ids(prompt):
        return len(prompt)
    if isinstance(prompt, list) and all(isinstance(p, str) or _is_ids(p) for p in prompt):
        if len(prompt) > 1:
            raise ApiError(f"batched prompts are not supported by the chunktune simulator "
                           f"(got {len(prompt)} prompts); send one prompt per request",
                           param="prompt")
        return _prompt_tokens(prompt[0])
    raise validation_error([{"type": "value_error", "loc": ("body", "prompt"),
                             "msg": "Input should be a valid string, a list of token ids, or a "
                                    "list of one of those"}])


def _messages_tokens(messages: Any) -> int:
    if not isinstance(messages, list):
        raise validation_error([{"type": "list_type", "loc": ("body", "messages"),
                                 "msg": "Input should be a valid list"}])
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise validation_error([{"type": "value_error", "loc": ("body", "messages", i),
                                     "msg": "Input should be a message object with a string "
                                            "'role'"}])
        c = m.get("content")
        if c is not None and not isinstance(c, str | list):
            raise validation_error([{"type": "value_error",
                                     "loc": ("body", "messages", i, "content"),
                                     "msg": "Input should be a valid string or a list of "
                                            "content parts"}])
    return count_chat_tokens(messages)


def parse_generation(body: dict[str, Any], cfg: ServerConfig, chat: bool) -> Parsed:
    """Validate a completions/chat body as vLLM does, in vLLM's order: fields (FastAPI layer),
    model, context length, then sampling parameters. Raises :class:`ApiError`."""
    errors: list[dict[str, Any]] = []
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        errors.append({"type": "string_type", "loc": ("body", "model"),
                       "msg": "Input should be a valid string", "input": model})
    stream = _bool(body, "stream", errors) or False
    _bool(body, "ignore_eos", errors)
    n = _int(body, "n", errors)
    max_tokens = _int(body, "max_tokens", errors)
    max_completion = _int(body, "max_completion_tokens", errors) if chat else None
    min_tokens = _int(body, "min_tokens", errors)
    priority = _int(body, "priority", errors) or 0
    for bound, ok, kind, words in ((-2**63, priority >= -2**63, "greater_than_equal",
                                    "greater than or equal to"),
                                   (2**63 - 1, priority <= 2**63 - 1, "less_than_equal",
                                    "less than or equal to")):
        if not ok:
            errors.append({"type": kind, "loc": ("body", "priority"),
                           "msg": f"Input should be {words} {bound}", "input": priority})
    opts = body.get("stream_options")
    include_usage = False
    if opts is not None:
        if not isinstance(opts, dict):
            errors.append({"type": "model_type", "loc": ("body", "stream_options"),
                           "msg": "Input should be a valid dictionary or instance of "
                                  "StreamOptions", "input": opts})
        else:
            include_usage = bool(_bool(opts, "include_usage", errors,
                                       ("body", "stream_options")))
    if chat and "messages" not in body:
        errors.append({"type": "missing", "loc": ("body", "messages"), "msg": "Field required"})
    if errors:
        raise validation_error(errors)
    if opts and not stream:
        raise validation_error([{"type": "value_error", "loc": ("body",),
                                 "msg": "Value error, Stream options can only be defined when "
                                        "`stream=True`."}])
    if not chat:
        prompt = body.get("prompt")
        if prompt is None or prompt == []:
            raise validation_error([{"type": "value_error", "loc": ("body",),
                                     "msg": "Value error, Either prompt or prompt_embeds must be "
                                            "provided and non-empty."}])

    if model and model not in cfg.served_model_names:
        raise ApiError(f"The model `{model}` does not exist.", status=404,
                       err_type="NotFoundError", param="model")
    name = model or cfg.served_model_names[0]

    tokens = _messages_tokens(body["messages"]) if chat else _prompt_tokens(body.get("prompt"))
    if tokens == 0:
        raise ApiError("The decoder prompt cannot be empty", param="prompt")
    limit = cfg.max_model_len
    if tokens >= limit:
        raise vllm_validation_error(
            f"This model's maximum context length is {limit} tokens. However, your request has "
            f"{tokens} input tokens. Please reduce the length of the input messages.",
            "input_tokens", tokens)
    requested = (max_completion if max_completion is not None else max_tokens) if chat \
        else (max_tokens if "max_tokens" in body else COMPLETIONS_DEFAULT_MAX_TOKENS)
    if requested is not None and tokens + requested > limit:
        raise vllm_validation_error(
            f"'max_tokens' or 'max_completion_tokens' is too large: {requested}. This model's "
            f"maximum context length is {limit} tokens and your request has {tokens} input "
            f"tokens ({requested} > {limit} - {tokens}).", "max_tokens", requested)
    if requested is None:
        requested = min(limit - tokens, cfg.default_max_tokens)
    if requested < 1:
        raise vllm_validation_error(f"max_tokens must be at least 1, got {requested}.",
                                    "max_tokens", requested)
    if min_tokens is not None:
        if min_tokens < 0:
            raise vllm_validation_error(
                f"min_tokens must be greater than or equal to 0, got {min_tokens}.",
                "min_tokens", min_tokens)
        if min_tokens > requested:
            raise vllm_validation_error(
                f"min_tokens must be less than or equal to max_tokens={requested}, got "
                f"{min_tokens}.", "min_tokens", min_tokens)
    if n is not None and n != 1:
        if n < 1:
            raise vllm_validation_error(f"n must be at least 1, got {n}.", "n", n)
        raise ApiError(f"n={n} is not supported by the chunktune simulator: it generates one "
                       "sequence per request (n must be 1)", param="n")
    return Parsed(name, tokens, requested, stream, include_usage, priority)


# ---- the application -----------------------------------------------------------------------


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
        cards = [{
            "id": name, "object": "model", "created": self.created, "owned_by": "vllm",
            "root": self.cfg.model_root, "parent": None,
            "max_model_len": self.cfg.max_model_len,
            "permission": [{
                "id": f"modelperm-{zlib.crc32(name.encode()):08x}",
                "object": "model_permission", "created": self.created,
                "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                "organization": "*", "group": None, "is_blocking": False,
            }],
        } for name in self.cfg.served_model_names]
        return _json({"object": "list", "data": cards})

    async def metrics_page(self, _: web.Request) -> web.Response:
        # Always text format 0.0.4, whatever Accept says (see chunktune.sim.metrics).
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def sim_stats(self, _: web.Request) -> web.Response:
        return _json(self.rt.stats.summary())

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        model = body.get("model")
        if model and model not in self.cfg.served_model_names:
            raise ApiError(f"The model `{model}` does not exist.", status=404,
                           err_type="NotFoundError", param="model")
        vocab = max(self.cfg.vocab_size, 2000)
        if "messages" in body:
            n = _messages_tokens(body["messages"])
            pieces: list[str] = []
            for m in body["messages"]:
                c = m.get("content")
                text = c if isinstance(c, str) else " ".join(
                    str(p.get("text", "")) for p in (c or []) if isinstance(p, dict))
                pieces += ["<|msg|>"] * 4 + _pieces(text)
            pieces += ["<|assistant|>"] * (n - len(pieces))
            tokens = [_piece_id(p, vocab) for p in pieces]
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and not _is_ids(prompt):
                prompt = prompt[0]
            if isinstance(prompt, list) and _is_ids(prompt):
                tokens = [int(t) for t in prompt]
            elif isinstance(prompt, str):
                tokens = [_piece_id(p, vocab) for p in _pieces(prompt)]
            else:
                raise validation_error([{"type": "value_error", "loc": ("body", "prompt"),
                                         "msg": "Input should be a valid string or a list of "
                                                "token ids"}])
        return _json({"count": len(tokens), "max_model_len": self.cfg.max_model_len,
                                  "tokens": tokens, "token_strs": None})

    # -- generation --

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        arrival = asyncio.get_running_loop().time()
        body = await _json_body(request, fast_ids=not chat)
        p = parse_generation(body, self.cfg, chat)
        stream = self.rt.submit(p.prompt_tokens, p.max_tokens, arrival, priority=p.priority)
        try:
            if p.stream:
                return await self._stream(request, stream, p, chat)
            return await self._complete(stream, p, chat)
        finally:
            if not stream.finished:
                self.rt.abort(stream)  # the client went away (or the handler was cancelled)

    def _usage(self, p: Parsed, completion: int) -> dict[str, Any]:
        return {"prompt_tokens": p.prompt_tokens, "total_tokens": p.prompt_tokens + completion,
                "completion_tokens": completion, "prompt_tokens_details": None}

    async def _complete(self, stream: Stream, p: Parsed, chat: bool) -> web.Response:
        while await stream.wait():
            pass
        if stream.aborted:
            raise ApiError("The engine is shutting down; the request was aborted", status=503,
                           err_type="ServiceUnavailableError")
        n = stream.produced
        text = FILLER * n
        if chat:
            body: dict[str, Any] = {
                "id": self._request_id("chatcmpl"), "object": "chat.completion",
                "created": int(time.time()), "model": p.model,
                "choices": [{"index": 0,
                             "message": {"role": "assistant", "content": text,
                                         "refusal": None, "annotations": None, "audio": None,
                                         "function_call": None, "tool_calls": [],
                                         "reasoning_content": None},
                             "logprobs": None, "finish_reason": "length", "stop_reason": None}],
                "service_tier": None, "system_fingerprint": None,
                "usage": self._usage(p, n), "prompt_logprobs": None,
                "kv_transfer_params": None,
            }
        else:
            body = {
                "id": self._request_id("cmpl"), "object": "text_completion",
                "created": int(time.time()), "model": p.model,
                "choices": [{"index": 0, "text": text, "logprobs": None,
                             "finish_reason": "length", "stop_reason": None,
                             "prompt_logprobs": None}],
                "service_tier": None, "system_fingerprint": None,
                "usage": self._usage(p, n), "kv_transfer_params": None,
            }
        return _json(body)

    async def _stream(self, request: web.Request, stream: Stream, p: Parsed,
                      chat: bool) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={
            "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        rid = self._request_id("chatcmpl" if chat else "cmpl")
        created = int(time.time())
        head = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": created, "model": p.model}
        if chat:
            role = dumps({**head, "choices": [{
                "index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                "finish_reason": None}], "usage": None})
            tok = dumps({**head, "choices": [{
                "index": 0, "delta": {"content": FILLER}, "logprobs": None,
                "finish_reason": None}], "usage": None})
            last = dumps({**head, "choices": [{
                "index": 0, "delta": {"content": FILLER}, "logprobs": None,
                "finish_reason": "length", "stop_reason": None}], "usage": None})
        else:
            role = ""
            tok = dumps({**head, "choices": [{
                "index": 0, "text": FILLER, "logprobs": None, "finish_reason": None,
                "stop_reason": None}], "usage": None})
            last = dumps({**head, "choices": [{
                "index": 0, "text": FILLER, "logprobs": None, "finish_reason": "length",
                "stop_reason": None}], "usage": None})
        tok_event = f"data: {tok}\n\n".encode()
        last_event = f"data: {last}\n\n".encode()
        sent = 0
        total = p.max_tokens
        try:
            while n := await stream.wait():
                parts: list[bytes] = []
                if sent == 0 and role:
                    parts.append(f"data: {role}\n\n".encode())
                sent += n
                if sent >= total:
                    parts.append(tok_event * (n - 1) + last_event)
                else:
                    parts.append(tok_event * n)
                await resp.write(b"".join(parts))
            if stream.aborted:
                return resp  # shutting down: end the stream without [DONE]
            tail = b""
            if p.include_usage:
                usage = dumps({**head, "choices": [], "usage": self._usage(p, sent)})
                tail = f"data: {usage}\n\n".encode()
            await resp.write(tail + b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionResetError:
            pass  # the client went away; the caller aborts the request
        return resp


_PIECE_RE = re.compile(r"\w+|[^\w\s]")


def _pieces(text: str) -> list[str]:
    """The pieces :func:`count_tokens` counts (one token each)."""
    return _PIECE_RE.findall(text)


def _piece_id(piece: str, vocab: int) -> int:
    return 1000 + zlib.crc32(piece.encode()) % (vocab - 1000)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as e:
        return e.response()
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
