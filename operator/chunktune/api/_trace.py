"""A request trace replayed as the workload (``spec.workload.trace``, docs/traffic.md): the
trace file or ConfigMap key, the window, speed-up and rate scaling, and how rows become traffic
classes; re-exported by :mod:`chunktune.api.v1alpha1`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from chunktune.api._engine import KeyRef
from chunktune.api._types import (
    RELATIVE_PATH,
    Duration,
    DurationOrZero,
    Model,
    pattern_str,
)
from chunktune.core.bounds import MAX_REQUESTS
from chunktune.core.distributions import NAME_PATTERN
from chunktune.core.flags import MAX_TOKENS
from chunktune.core.trace import MAX_TRACE_CLASSES
from chunktune.core.trace_formats import PRIORITY_BOUND


class TraceClassItem(Model):
    """A traffic class of a trace: its API and priority, and which rows it takes."""

    name: pattern_str(NAME_PATTERN, 63,  # type: ignore[valid-type]
                      "a class name of letters, digits, '-', '_' or '.'")
    """Class name (objectives and constraints name it)."""
    api: Literal["completions", "chat"] = "completions"
    """The OpenAI API its requests use."""
    priority: int | None = Field(default=None, ge=-PRIORITY_BOUND, le=PRIORITY_BOUND)
    """vLLM's request priority (lower first under ``--scheduling-policy priority``); a row's
    own priority wins."""
    max_prompt_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    """Split by prompt length: the class takes rows with at most this many prompt tokens
    (classes are tried in order; the last may leave it out and take the rest)."""
    values: list[pattern_str(r"^.*$", 253,  # type: ignore[valid-type]
                             "a column value")] | None = Field(
        default=None, min_length=1, max_length=64)
    """Split by column: the column values this class takes (default: its name)."""


class TraceWorkload(Model):
    """A request trace replayed at its own arrival times (docs/traffic.md): a file, or a
    ConfigMap key the operator reads, in the Azure, Mooncake or generic format."""

    model_config = Model.model_config | {"json_schema_extra": {"x-kubernetes-validations": [
        {"rule": "has(self.file) != has(self.configMapKeyRef)",
         "message": "give exactly one of file or configMapKeyRef"},
        {"rule": "!has(self.configMapKeyRef) || !has(self.configMapKeyRef.optional) || "
                 "!self.configMapKeyRef.optional",
         "message": "configMapKeyRef.optional: a trace is not optional"},
    ]}}

    file: pattern_str(  # type: ignore[valid-type]
        RELATIVE_PATH, 1024, "a relative path to a trace file: names of letters, digits, "
        "'_', '-' and '.', no '..' and no absolute path") | None = None
    """A trace file, relative to the manifest (``chunktune tune``)."""
    config_map_key_ref: KeyRef | None = None
    """A ConfigMap key in the study's namespace holding the trace (the operator reads it when
    the study starts)."""
    format: Literal["auto", "azure", "mooncake", "generic"] | None = None
    """``auto`` (default: told by the header or the JSON keys), ``azure``, ``mooncake`` or
    ``generic``."""
    start: DurationOrZero | None = None
    """Replay from this trace time on."""
    end: Duration | None = None
    """Replay trace time before this (default: to the last request)."""
    speedup: float | None = Field(default=None, ge=1e-3, le=1_000_000)
    """Arrival times are divided by this (the same requests at this multiple of the rate)."""
    rate_scale: float | None = Field(default=None, gt=0, le=100)
    """Requests are scaled by this over the same span (a seeded subset, or the trace overlaid
    on shifted copies of itself)."""
    split: Literal["none", "prompt_tokens", "column"] | None = None
    """How rows become classes (default: ``prompt_tokens`` when a class gives
    ``maxPromptTokens``, ``column`` when several classes are listed or the trace has the
    column, else one class)."""
    column: pattern_str(r"^[A-Za-z0-9_.-]+$", 128,  # type: ignore[valid-type]
                        "a column name") | None = None
    """The column split column reads (default ``class``)."""
    classes: list[TraceClassItem] = Field(default_factory=list, max_length=MAX_TRACE_CLASSES)
    """The classes rows are split into, in order."""
    max_requests: int | None = Field(default=None, ge=1, le=MAX_REQUESTS)
    """The most requests the window may hold (default 200000)."""

    def core(self, data: str | None = None) -> dict[str, Any]:
        """The ``trace:`` mapping of a profile (:class:`chunktune.core.trace.TraceSpec`):
        the file, or ``data`` read from the ConfigMap."""
        out: dict[str, Any] = {"data": data} if data is not None else {"file": self.file}
        for name in ("format", "start", "end", "speedup", "rate_scale", "split", "column",
                     "max_requests"):
            if (v := getattr(self, name)) is not None:
                out[name] = v
        if self.classes:
            out["classes"] = [
                {"name": c.name, "api": c.api,
                 **({"priority": c.priority} if c.priority is not None else {}),
                 **({"max_prompt_tokens": c.max_prompt_tokens}
                    if c.max_prompt_tokens is not None else {}),
                 **({"values": list(c.values)} if c.values is not None else {})}
                for c in self.classes]
        return out


__all__ = ["TraceClassItem", "TraceWorkload"]
