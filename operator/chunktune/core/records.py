"""One measured request: the raw sample every statistic is computed from.

The Locust side fills a :class:`RequestRecord` while the response streams and hands it over once
the request ends (ok or not); summaries, windows and goodput are pure functions of lists of them.
Times are seconds; ``arrival`` and ``start`` are offsets from the start of the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["FAILURE_REASONS", "RequestRecord"]

#: Failure reasons, besides ``http_<status>`` (e.g. ``http_400``, ``http_503``).
FAILURE_REASONS = {
    "connection_error": "could not connect, or the connection was closed or reset (before or "
                        "during the stream)",
    "timeout": "no data within the read timeout, or still running when the drain timeout after "
               "the end of the run expired",
    "stream_error": "the stream carried an error object or an event that is not valid JSON",
    "short_response": "fewer output tokens than max_tokens (usage, or content chunks when the "
                      "server sends no usage)",
    "cancelled": "still in flight when the run was stopped early",
    "client_error": "an unexpected exception in the load generator itself",
}


@dataclass
class RequestRecord:
    """A request as the client saw it.

    ``ttft`` is from sending the request to the first token-bearing chunk; ``itl`` holds the gap
    before every later token-bearing chunk (one sample per chunk, as ``vllm bench serve``
    records it); ``e2e`` is from sending to the end of the stream. ``prompt_tokens`` and
    ``output_tokens`` come from the server's ``usage`` when it sends one, else from what was
    asked for / the chunks received.
    """

    rid: int
    cls: str
    arrival: float | None
    """Scheduled arrival (open-loop modes); ``None`` in concurrency mode."""
    start: float
    """When the request was sent."""
    prompt_tokens: int
    max_tokens: int
    warmup: bool = False
    """Arrived (open loop) or started (closed loop) during warm-up: not in the results."""
    ok: bool = False
    reason: str | None = None
    """Why it failed: ``http_<status>`` or a key of :data:`FAILURE_REASONS`."""
    error: str | None = None
    """The failure's message (the OpenAI error message, the exception, ...)."""
    status: int | None = None
    ttft: float | None = None
    e2e: float | None = None
    output_tokens: int = 0
    itl: list[float] = field(default_factory=list)

    @property
    def end(self) -> float:
        """When the request ended (its start while it is still in flight)."""
        return self.start + (self.e2e or 0.0)

    @property
    def tpot(self) -> float | None:
        """``(e2e - ttft) / (output_tokens - 1)``, as ``vllm bench serve``; ``None`` without a
        second token."""
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def fail(self, reason: str, error: str, status: int | None = None) -> None:
        self.ok = False
        self.reason = reason
        self.error = error
        if status is not None:
            self.status = status

    def to_dict(self) -> dict[str, Any]:
        return {
            "rid": self.rid, "cls": self.cls, "arrival": self.arrival, "start": self.start,
            "prompt_tokens": self.prompt_tokens, "max_tokens": self.max_tokens,
            "warmup": self.warmup, "ok": self.ok, "reason": self.reason, "error": self.error,
            "status": self.status, "ttft": self.ttft, "e2e": self.e2e,
            "output_tokens": self.output_tokens, "itl": self.itl,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestRecord:
        return cls(
            rid=int(d["rid"]), cls=str(d["cls"]),
            arrival=None if d.get("arrival") is None else float(d["arrival"]),
            start=float(d["start"]), prompt_tokens=int(d["prompt_tokens"]),
            max_tokens=int(d["max_tokens"]), warmup=bool(d.get("warmup", False)),
            ok=bool(d.get("ok", False)), reason=d.get("reason"), error=d.get("error"),
            status=d.get("status"),
            ttft=None if d.get("ttft") is None else float(d["ttft"]),
            e2e=None if d.get("e2e") is None else float(d["e2e"]),
            output_tokens=int(d.get("output_tokens", 0)),
            itl=[float(x) for x in d.get("itl") or ()],
        )
