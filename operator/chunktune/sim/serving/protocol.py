"""vLLM's OpenAI protocol as the simulator speaks it: request parsing and validation, error and
response shapes. Pure (no I/O, no aiohttp): :mod:`chunktune.sim.serving.server` is the HTTP
application that reads the bytes, calls these functions and writes what they return.

Token counting (:mod:`chunktune.sim.serving.tokenizer`): with the model's tokenizer when ``serve``
was given one (``--tokenizer``, or a model directory holding ``tokenizer.json``) — text prompts as
vLLM tokenizes them, chat prompts through the chat template — so counts, ``usage``,
``/tokenize`` and ``/detokenize`` agree with a real vLLM serving that model. Without one, the
word rule: a text prompt counts :func:`chunktune.core.tokens.count_tokens` tokens (one per
word, one per punctuation character), a chat prompt
:func:`~chunktune.core.tokens.count_chat_tokens` (contents + 4 per message + 3), and
``/detokenize`` answers 400. A prompt given as token ids counts exactly ``len(ids)`` either
way. A batch (a list of several prompts) is refused
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
  including their ``(parameter=..., value=...)`` suffix), sampling parameters out of vLLM's
  bounds (``SamplingParams._verify_args``: temperature, top_p, top_k, min_p, the penalties;
  :class:`Sampling`), ``n != 1``, batch prompts;
- 400 ``Bad Request``: what vLLM's FastAPI layer rejects before the handler — malformed JSON,
  a body that is not an object, wrong field types, missing ``messages``/``prompt``, a
  non-JSON content type; the message is the pydantic-style error list. Also a body nested
  more than :data:`MAX_JSON_DEPTH` levels deep (refused before any field is read);
- 404 ``NotFoundError`` (``param: model``): ``The model `x` does not exist.`` A request without
  ``model`` is served by the first served name, as vLLM does.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import re
import zlib
from dataclasses import dataclass
from typing import Any

from chunktune.core.errors import ChunktuneError
from chunktune.sim.engine.kv_cache import block_keys
from chunktune.sim.serving.tokenizer import HFTokenizer, WordCounter

#: vLLM's ``CompletionRequest.max_tokens`` default.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
#: The simulator's cap on chat's default ``max_tokens`` (vLLM: ``max_model_len - prompt``).
DEFAULT_MAX_TOKENS_CAP = 256
#: The text of every generated token.
FILLER = " tok"

#: vLLM's (pydantic's / Starlette's) compact JSON.
dumps = functools.partial(json.dumps, separators=(",", ":"))


@dataclass(frozen=True)
class ServerConfig:
    """What the HTTP layer needs besides the engine."""

    served_model_names: tuple[str, ...]
    #: The model as given to ``serve`` (``root`` in ``/v1/models``).
    model_root: str
    max_model_len: int
    vocab_size: int = 32000
    #: How prompts are counted (None: the word rule over ``vocab_size``).
    tokenizer: HFTokenizer | WordCounter | None = None
    api_keys: tuple[str, ...] = ()
    default_max_tokens: int = DEFAULT_MAX_TOKENS_CAP
    seed: int = 0
    #: The KV block size where the engine models prefix caching: each prompt's tokens are
    #: then read (not only counted) and keyed by block (None: prefix caching off).
    prefix_block_size: int | None = None


class ApiError(ChunktuneError):
    """An error response in vLLM's shape (:meth:`body`, with HTTP ``status``)."""

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


def validation_error(errors: list[dict[str, Any]]) -> ApiError:
    """What vLLM's ``RequestValidationError`` handler answers: 400, type ``Bad Request``."""
    return ApiError(str(errors), err_type="Bad Request")


def vllm_validation_error(message: str, parameter: str, value: Any) -> ApiError:
    """A ``VLLMValidationError`` as vLLM's ``create_error_response`` renders it."""
    return ApiError(f"{message} (parameter={parameter}, value={value})", param=parameter)


def model_not_found(model: str) -> ApiError:
    return ApiError(f"The model `{model}` does not exist.", status=404,
                    err_type="NotFoundError", param="model")


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


def _float(obj: dict[str, Any], name: str, errors: list[dict[str, Any]]) -> float | None:
    """pydantic's lax float: numbers (booleans included), numeric strings; NaN passes."""
    v = obj.get(name)
    if v is None:
        return None
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v.strip())
        except ValueError:
            errors.append({"type": "float_parsing", "loc": ("body", name),
                           "msg": "Input should be a valid number, unable to parse string as a "
                                  "number", "input": v})
            return None
    errors.append({"type": "float_type", "loc": ("body", name),
                   "msg": "Input should be a valid number", "input": v})
    return None


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class Sampling:
    """The sampling parameters vLLM validates (``None``: not given, vLLM's default applies).

    The simulator generates filler tokens, so none of them changes its output; they are
    validated so that a request vLLM refuses is refused here too. ``best_of`` is not among them:
    the supported vLLM's (:data:`~chunktune.core.vllm_release.VLLM_VERSION`) completions and
    chat requests have no such field (it went with the V0 engine), so like any unknown field it
    is accepted and ignored, one sequence is generated.
    """

    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None


def _sampling(body: dict[str, Any], errors: list[dict[str, Any]]) -> Sampling:
    """The sampling fields, type-checked as vLLM's pydantic models do (errors appended)."""
    seed = _int(body, "seed", errors)
    if seed is not None and not _INT64_MIN <= seed <= _INT64_MAX:
        bound, kind = (_INT64_MAX, "less_than_equal") if seed > 0 else \
            (_INT64_MIN, "greater_than_equal")
        relation = "less than or equal to" if seed > 0 else "greater than or equal to"
        errors.append({"type": kind, "loc": ("body", "seed"),
                       "msg": f"Input should be {relation} {bound}", "input": seed,
                       "ctx": {"le" if seed > 0 else "ge": bound}})
        seed = None
    return Sampling(
        presence_penalty=_float(body, "presence_penalty", errors),
        frequency_penalty=_float(body, "frequency_penalty", errors),
        repetition_penalty=_float(body, "repetition_penalty", errors),
        temperature=_float(body, "temperature", errors),
        top_p=_float(body, "top_p", errors),
        top_k=_int(body, "top_k", errors),
        min_p=_float(body, "min_p", errors),
        seed=seed)


def _verify_sampling(s: Sampling) -> None:
    """vLLM's ``SamplingParams._verify_args`` checks, in its order and with its messages
    (those that name a ``parameter`` carry the ``(parameter=..., value=...)`` suffix)."""
    if s.presence_penalty is not None and not -2.0 <= s.presence_penalty <= 2.0:
        raise ApiError(f"presence_penalty must be in [-2, 2], got {s.presence_penalty}.")
    if s.frequency_penalty is not None and not -2.0 <= s.frequency_penalty <= 2.0:
        raise ApiError(f"frequency_penalty must be in [-2, 2], got {s.frequency_penalty}.")
    if (r := s.repetition_penalty) is not None:
        if not math.isfinite(r):
            raise ApiError(f"repetition_penalty must be a finite number, got {r}.")
        if r <= 0.0:
            raise ApiError(f"repetition_penalty must be greater than zero, got {r}.")
    if (t := s.temperature) is not None:
        if not math.isfinite(t):
            raise vllm_validation_error(f"temperature must be a finite number, got {t}.",
                                        "temperature", t)
        if t < 0.0:
            raise vllm_validation_error(f"temperature must be non-negative, got {t}.",
                                        "temperature", t)
        if t > 2.0:
            raise vllm_validation_error(f"temperature must be in [0, 2], got {t}.",
                                        "temperature", t)
    if s.top_p is not None and not 0.0 < s.top_p <= 1.0:
        raise vllm_validation_error(f"top_p must be in (0, 1], got {s.top_p}.", "top_p", s.top_p)
    if s.top_k is not None and s.top_k < -1:
        raise ApiError(f"top_k must be 0 (disable), or at least 1, got {s.top_k}.")
    if s.min_p is not None and not 0.0 <= s.min_p <= 1.0:
        raise ApiError(f"min_p must be in [0, 1], got {s.min_p}.")


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


def check_content_type(content_type: str) -> None:
    """vLLM's FastAPI layer accepts only ``application/json`` bodies (parameters ignored)."""
    ctype = content_type.split(";", 1)[0].strip().lower()
    if ctype != "application/json":
        raise validation_error([{"loc": ["header", "content-type"],
                                 "msg": "Unsupported Media Type: Only 'application/json' is "
                                        "allowed", "type": "value_error"}])


#: The deepest JSON nesting a request body may have (vLLM's requests nest about 6 levels; a
#: tool's JSON schema a few more). Deeper bodies are refused with a 400 before any field is
#: read, instead of exhausting the parser's or a handler's stack.
MAX_JSON_DEPTH = 100


def json_depth(value: Any, limit: int) -> int:
    """The nesting depth of a decoded JSON value (a scalar is 0, ``[]`` 1), counted without
    recursion; stops counting once past ``limit`` (returns ``limit + 1``)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            children: Any = v.values()
        elif isinstance(v, list):
            children = v
        else:
            continue
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                return limit + 1
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return deepest


def _too_deep() -> ApiError:
    return validation_error([{
        "type": "json_invalid", "loc": ("body",), "msg": "JSON decode error", "input": {},
        "ctx": {"error": f"the JSON body is nested more than {MAX_JSON_DEPTH} levels deep "
                         f"(at most {MAX_JSON_DEPTH} are accepted); send a flatter body"}}])


def parse_body(raw: bytes, fast_ids: bool = False) -> dict[str, Any]:
    """The request body as a JSON object (a large token-id ``prompt`` is counted, not decoded,
    when ``fast_ids``: see :func:`_split_token_ids`). Raises :class:`ApiError`."""
    split = _split_token_ids(raw) if fast_ids else None
    if split is not None:
        with contextlib.suppress(json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            body = json.loads(split[0])
            if isinstance(body, dict) and body.get("prompt") == _IDS_PLACEHOLDER:
                if json_depth(body, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
                    raise _too_deep()
                body["prompt"] = TokenIds(split[1])
                return body
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        pos = getattr(e, "pos", 0)
        msg = getattr(e, "msg", str(e))
        raise validation_error([{"type": "json_invalid", "loc": ("body", pos),
                                 "msg": "JSON decode error", "input": {},
                                 "ctx": {"error": msg}}]) from e
    except RecursionError:  # nested deeper than the interpreter's stack
        raise _too_deep() from None  # (its traceback is the parser's thousand frames)
    # Fewer brackets than the limit cannot nest past it (the count is C-fast; the walk not).
    if (raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH
            and json_depth(body, MAX_JSON_DEPTH) > MAX_JSON_DEPTH):
        raise _too_deep()
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
    block_keys: list[int] | None = None
    """Its prompt's full blocks, keyed for the prefix cache (with ``prefix_block_size``)."""


def _is_ids(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in v)


def _counter(cfg: ServerConfig) -> HFTokenizer | WordCounter:
    return cfg.tokenizer if cfg.tokenizer is not None else WordCounter(cfg.vocab_size)


def _prompt_tokens(prompt: Any, counter: HFTokenizer | WordCounter,
                   read: bool = False) -> tuple[int, list[int] | None]:
    """Tokens of a completions ``prompt`` (text, token ids, or a batch of one), and with
    ``read`` its token ids (a text is then encoded once, not counted and encoded; a
    token-id prompt is never left uncounted when read: see ``fast_ids``)."""
    if isinstance(prompt, TokenIds):
        return int(prompt), None
    if isinstance(prompt, str):
        if read:
            ids = counter.encode(prompt)
            return len(ids), ids
        return counter.count(prompt), None
    if _is_ids(prompt):
        return len(prompt), [int(t) for t in prompt] if read else None
    if isinstance(prompt, list) and all(isinstance(p, str) or _is_ids(p) for p in prompt):
        if len(prompt) > 1:
            raise ApiError(f"batched prompts are not supported by the chunktune simulator "
                           f"(got {len(prompt)} prompts); send one prompt per request",
                           param="prompt")
        return _prompt_tokens(prompt[0], counter, read)
    raise validation_error([{"type": "value_error", "loc": ("body", "prompt"),
                             "msg": "Input should be a valid string, a list of token ids, or a "
                                    "list of one of those"}])


def _messages_tokens(messages: Any, counter: HFTokenizer | WordCounter,
                     read: bool = False) -> tuple[int, list[int] | None]:
    """Tokens of a chat prompt, and with ``read`` its token ids (encoded once)."""
    _check_messages(messages)
    if read:
        ids = counter.encode_chat(messages)
        return len(ids), ids
    return counter.count_chat(messages), None


def _check_messages(messages: Any) -> None:
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
    sampling = _sampling(body, errors)
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
        raise model_not_found(model)
    name = model or cfg.served_model_names[0]

    counter = _counter(cfg)
    # with prefix caching the prompt's tokens are read (keyed by block below), not only counted
    read = bool(cfg.prefix_block_size)
    tokens, ids = (_messages_tokens(body["messages"], counter, read) if chat
                   else _prompt_tokens(body.get("prompt"), counter, read))
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
    _verify_sampling(sampling)
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
    keys = block_keys(ids, cfg.prefix_block_size) \
        if cfg.prefix_block_size and ids is not None else None
    return Parsed(name, tokens, requested, stream, include_usage, priority, keys)


# ---- response shapes -----------------------------------------------------------------------


def model_list(cfg: ServerConfig, created: int) -> dict[str, Any]:
    """``GET /v1/models``: one card per served name."""
    cards = [{
        "id": name, "object": "model", "created": created, "owned_by": "vllm",
        "root": cfg.model_root, "parent": None,
        "max_model_len": cfg.max_model_len,
        "permission": [{
            "id": f"modelperm-{zlib.crc32(name.encode()):08x}",
            "object": "model_permission", "created": created,
            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
            "organization": "*", "group": None, "is_blocking": False,
        }],
    } for name in cfg.served_model_names]
    return {"object": "list", "data": cards}


def tokenize(body: dict[str, Any], cfg: ServerConfig) -> dict[str, Any]:
    """``POST /tokenize``: the token ids prompts are counted with (the model's tokenizer, or
    one stable id per word-rule piece)."""
    model = body.get("model")
    if model and model not in cfg.served_model_names:
        raise model_not_found(model)
    counter = _counter(cfg)
    if "messages" in body:
        _check_messages(body["messages"])
        tokens = counter.encode_chat(body["messages"])
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and not _is_ids(prompt):
            prompt = prompt[0]
        if isinstance(prompt, list) and _is_ids(prompt):
            tokens = [int(t) for t in prompt]
        elif isinstance(prompt, str):
            tokens = counter.encode(prompt)
        else:
            raise validation_error([{"type": "value_error", "loc": ("body", "prompt"),
                                     "msg": "Input should be a valid string or a list of "
                                            "token ids"}])
    return {"count": len(tokens), "max_model_len": cfg.max_model_len,
            "tokens": tokens, "token_strs": None}


def detokenize(body: dict[str, Any], cfg: ServerConfig) -> dict[str, Any]:
    """``POST /detokenize``: ``{"prompt": text}`` of the token ids (needs a tokenizer)."""
    model = body.get("model")
    if model and model not in cfg.served_model_names:
        raise model_not_found(model)
    tokens = body.get("tokens")
    if not _is_ids(tokens):
        raise validation_error([{"type": "list_type", "loc": ("body", "tokens"),
                                 "msg": "Input should be a valid list of integers"}])
    counter = _counter(cfg)
    if not counter.can_decode:
        raise ApiError("this chunktune simulator counts tokens by words and cannot "
                       "detokenize; start it with --tokenizer DIR|tokenizer.json (or a model "
                       "directory holding tokenizer.json)", param="tokens")
    assert tokens is not None  # _is_ids above
    return {"prompt": counter.decode(tokens)}


def usage(p: Parsed, completion: int) -> dict[str, Any]:
    return {"prompt_tokens": p.prompt_tokens, "total_tokens": p.prompt_tokens + completion,
            "completion_tokens": completion, "prompt_tokens_details": None,
            "completion_tokens_details": None}


def completion(p: Parsed, produced: int, request_id: str, created: int,
               chat: bool) -> dict[str, Any]:
    """The non-streaming response: ``produced`` filler tokens, ``finish_reason: length``."""
    text = FILLER * produced
    if chat:
        return {
            "id": request_id, "object": "chat.completion",
            "created": created, "model": p.model,
            "choices": [{"index": 0,
                         "message": {"role": "assistant", "content": text,
                                     "refusal": None, "annotations": None, "audio": None,
                                     "function_call": None, "tool_calls": [],
                                     "reasoning_content": None},
                         "logprobs": None, "finish_reason": "length", "stop_reason": None}],
            "service_tier": None, "system_fingerprint": None,
            "usage": usage(p, produced), "prompt_logprobs": None,
            "kv_transfer_params": None,
        }
    return {
        "id": request_id, "object": "text_completion",
        "created": created, "model": p.model,
        "choices": [{"index": 0, "text": text, "logprobs": None,
                     "finish_reason": "length", "stop_reason": None,
                     "prompt_logprobs": None}],
        "service_tier": None, "system_fingerprint": None,
        "usage": usage(p, produced), "kv_transfer_params": None,
    }


@dataclass(frozen=True)
class StreamEvents:
    """The SSE events of one streamed response, encoded once: ``role`` (chat's first event;
    empty for completions), one per token (``token``), the last token's (``last``, with
    ``finish_reason``), and :meth:`tail` (usage when asked for, then ``[DONE]``)."""

    head: dict[str, Any]
    role: bytes
    token: bytes
    last: bytes

    @classmethod
    def build(cls, p: Parsed, request_id: str, created: int, chat: bool) -> StreamEvents:
        head = {"id": request_id, "object": "chat.completion.chunk" if chat else
                "text_completion", "created": created, "model": p.model}
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
        return cls(head, f"data: {role}\n\n".encode() if role else b"",
                   f"data: {tok}\n\n".encode(), f"data: {last}\n\n".encode())

    def tail(self, p: Parsed, sent: int) -> bytes:
        out = b""
        if p.include_usage:
            u = dumps({**self.head, "choices": [], "usage": usage(p, sent)})
            out = f"data: {u}\n\n".encode()
        return out + b"data: [DONE]\n\n"
