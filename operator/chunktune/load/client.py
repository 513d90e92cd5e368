"""One streaming OpenAI request, timed chunk by chunk (requests-based; no Locust, no gevent).

:func:`build_body` makes the ``/v1/completions`` or ``/v1/chat/completions`` body the load driver
sends (``stream``, ``stream_options.include_usage``, ``max_tokens = min_tokens``,
``ignore_eos``, and vLLM's ``priority`` when the request has one); :func:`stream_request`
sends it and fills a :class:`RequestRecord` as the stream arrives.

Timing (the definitions of ``vllm bench serve``):

* the clock starts just before the request is handed to the HTTP client (the body is already
  encoded), so TTFT includes connecting and the server's queueing and prefill;
* a chunk is *token-bearing* when it has a choice that carries text (``text`` /
  ``delta.content``), or a choice with neither text nor ``finish_reason`` (a token that
  decodes to nothing yet); the chat stream's opening role-only chunk and a bare
  ``finish_reason`` chunk carry no token, and neither does the final ``usage`` chunk;
* TTFT is the time to the first token-bearing chunk, ITL the gap before each later one (one
  sample per chunk: vLLM sends one token per chunk), E2E the time to the end of the stream.

Reads use ``iter_content(None)``: urllib3 then yields each HTTP chunk as it arrives instead of
waiting for a byte count, which would delay and bunch the samples. A response that is not
chunked is read with ``read1`` for the same reason. Several SSE events that arrive in one read
share its timestamp.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import requests
from urllib3.exceptions import ProtocolError, ReadTimeoutError

from chunktune.core.records import RequestRecord

__all__ = ["API_PATHS", "build_body", "error_message", "prepare_request", "stream_request"]

API_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}

_MSG_CHARS = 500


def build_body(api: str, model: str, prompt: str | list[int] | list[dict[str, str]],
               max_tokens: int, priority: int = 0) -> dict[str, Any]:
    """The request body: ``prompt`` is text or token ids (completions) or messages (chat);
    ``priority`` (vLLM's field, lower first under ``--scheduling-policy priority``) is sent
    when it is not 0."""
    body: dict[str, Any] = {"model": model}
    if api == "chat":
        body["messages"] = prompt
    else:
        body["prompt"] = prompt
    body.update({
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    })
    if priority:
        body["priority"] = priority
    return body


def error_message(body: bytes) -> str:
    """The message of an OpenAI-style error body (``{"error": {"message": ...}}``, vLLM's
    ``{"object": "error", "message": ...}``, FastAPI's ``{"detail": ...}``), else the text."""
    text = body.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(text)
    except ValueError:
        return text[:_MSG_CHARS] or "(empty body)"
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            msg = err.get("message") or err.get("detail")
            if msg is not None:
                return str(msg)[:_MSG_CHARS]
        elif isinstance(err, str):
            return err[:_MSG_CHARS]
    return text[:_MSG_CHARS]


def _chunks(resp: requests.Response) -> Iterator[bytes]:
    if resp.raw.chunked:
        yield from resp.iter_content(None)
        return
    while True:  # not chunked: read what has arrived, never wait for a byte count
        data = resp.raw.read1(65536)
        if not data:
            return
        yield data


class _Stream:
    """Parses SSE events into the record as they arrive."""

    def __init__(self, record: RequestRecord, api: str, t_send: float) -> None:
        self.r = record
        self.chat = api == "chat"
        self.t_send = t_send
        self.last = 0.0
        self.chunks = 0
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.error: str | None = None
        self.finish: str | None = None

    def event(self, raw: bytes, now: float) -> None:
        data = [ln[5:].strip() for ln in raw.split(b"\n") if ln.startswith(b"data:")]
        if not data:
            return
        payload = b"\n".join(data)
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            obj = json.loads(payload)
        except ValueError:
            self.error = self.error or f"not JSON: {payload[:200]!r}"
            return
        if not isinstance(obj, dict):
            self.error = self.error or f"not a JSON object: {payload[:200]!r}"
            return
        if obj.get("error") or obj.get("object") == "error":
            self.error = self.error or error_message(payload)
            return
        if usage := obj.get("usage"):
            self.usage = usage
        choices = obj.get("choices")
        if not choices:
            return
        c = choices[0]
        finish = c.get("finish_reason")
        if finish:
            self.finish = finish
        if self.chat:
            delta = c.get("delta") or {}
            text = delta.get("content")
            other = any(v not in (None, "", []) for k, v in delta.items()
                        if k not in ("role", "content"))  # reasoning_content, tool_calls
            bare = not text and not other and ("role" in delta or finish is not None)
        else:
            text = c.get("text")
            bare = finish is not None and not text
        if bare:
            return
        if self.r.ttft is None:
            self.r.ttft = now - self.t_send
        else:
            self.r.itl.append(now - self.last)
        self.last = now
        self.chunks += 1


def prepare_request(session: requests.Session, url: str, body: dict[str, Any],
                    headers: dict[str, str] | None = None) -> requests.PreparedRequest:
    """``body`` encoded and prepared as a streaming POST to ``url``: all the client's work
    before the request goes out (~0.5 ms with requests, more for a long prompt)."""
    data = json.dumps(body, separators=(",", ":")).encode()
    hdrs = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    hdrs.update(headers or {})
    return session.prepare_request(requests.Request("POST", url, data=data, headers=hdrs))


def stream_request(session: requests.Session, url: str, body: dict[str, Any],
                   record: RequestRecord, *, api: str, clock0: float,
                   timeout: tuple[float, float] = (10.0, 300.0),
                   headers: dict[str, str] | None = None,
                   prepared: requests.PreparedRequest | None = None) -> RequestRecord:
    """Send ``body`` to ``url`` through ``session`` (a ``requests.Session``, e.g. a Locust
    ``HttpSession``: it is used as a plain session, so Locust logs nothing for it) and fill
    ``record``: start (relative to ``clock0``, a ``time.perf_counter()`` value), ttft, itl,
    e2e, tokens, and ok or a failure reason.

    The request is encoded and prepared before the clock starts (or was, ``prepared``: see
    :func:`prepare_request`), so TTFT carries none of the client's own bookkeeping.
    ``Session.send`` is called directly: environment proxies and ``.netrc`` are not
    consulted. Never raises for a failed request: the failure is in the record.
    """
    if prepared is None:
        prepared = prepare_request(session, url, body, headers)
    t_send = time.perf_counter()
    record.start = t_send - clock0
    st = _Stream(record, api, t_send)
    resp: requests.Response | None = None
    try:
        resp = session.send(prepared, stream=True, timeout=timeout, allow_redirects=False)
        record.status = resp.status_code
        if resp.status_code != 200:
            record.e2e = time.perf_counter() - t_send
            record.fail(f"http_{resp.status_code}", error_message(resp.content),
                        resp.status_code)
            return record
        buf = b""
        for piece in _chunks(resp):
            now = time.perf_counter()
            buf += piece
            if b"\r" in buf:
                buf = buf.replace(b"\r\n", b"\n")
            while (i := buf.find(b"\n\n")) >= 0:
                st.event(buf[:i], now)
                buf = buf[i + 2:]
        if buf.strip():
            st.event(buf, time.perf_counter())
        record.e2e = time.perf_counter() - t_send
    except (requests.exceptions.Timeout, ReadTimeoutError) as e:
        record.e2e = time.perf_counter() - t_send
        record.fail("timeout", f"{_where(st)}: {e}")
        return record
    except (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError,
            ProtocolError, OSError) as e:
        record.e2e = time.perf_counter() - t_send
        inner = e.args[0] if e.args else None
        reason = "timeout" if isinstance(inner, ReadTimeoutError) else "connection_error"
        record.fail(reason, f"{_where(st)}: {e}")
        return record
    except Exception as e:  # a bug here must not kill the run; record it
        record.e2e = time.perf_counter() - t_send
        record.fail("client_error", f"{type(e).__name__}: {e}")
        return record
    finally:
        if resp is not None:
            resp.close()
    return _finish(st)


def _where(st: _Stream) -> str:
    if st.r.status is None:
        return "before the response"
    return f"mid-stream after {st.chunks} token chunks"


def _finish(st: _Stream) -> RequestRecord:
    r = st.r
    usage = st.usage or {}
    if usage.get("prompt_tokens") is not None:
        r.prompt_tokens = int(usage["prompt_tokens"])
    r.output_tokens = int(usage["completion_tokens"]) if usage.get(
        "completion_tokens") is not None else st.chunks
    if st.error is not None:
        r.fail("stream_error", st.error)
    elif r.output_tokens < r.max_tokens or (st.chunks == 0 and r.max_tokens > 0):
        src = "usage" if st.usage else "token chunks (no usage sent)"
        r.fail("short_response", f"{r.output_tokens} of {r.max_tokens} tokens ({src}; "
               f"finish_reason={st.finish}, [DONE] {'seen' if st.done else 'missing'})")
    else:
        r.ok = True
    return r
