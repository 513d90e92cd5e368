"""Request traces: a request log read once, replayed at its own arrival times.

A trace is a file (or text) with one request per row: when it arrived, its prompt tokens and its
output tokens, optionally a class and a priority. Formats (``format``; ``auto``, the default,
tells them apart by the CSV header or the keys of the first JSON object):

* ``azure``: the Azure LLM inference traces, CSV, with the published header
  ``TIMESTAMP,ContextTokens,GeneratedTokens`` (``TIMESTAMP`` a date and time such as
  ``2023-11-16 18:15:46.6805900``; arrivals count from the first row) or the processed header
  ``arrived_at,num_prefill_tokens,num_decode_tokens`` (seconds) of the copies Splitwise and
  Vidur distribute;
* ``mooncake``: Mooncake's JSONL, one object a line with ``timestamp`` (milliseconds),
  ``input_length`` and ``output_length`` (``hash_ids`` and other keys are ignored);
* ``generic``: CSV with a header, or JSONL, with ``arrival`` (seconds), ``prompt_tokens``,
  ``output_tokens`` and, optionally, ``class`` and ``priority``; other columns are ignored
  unless ``split: column`` names one.

Options (:class:`TraceSpec`): a window of trace time ``[start, end)``, a ``speedup`` that
divides the arrival times (the same requests, ``speedup`` times the rate), a ``rate_scale``
that keeps the span and scales the number of requests (applied by
:func:`chunktune.core.workload.generate` from the profile's seed), and how rows become traffic
classes (``split``: ``none``, ``prompt_tokens`` with ``max_prompt_tokens`` per class, or
``column``). A chat-API class cannot send a prompt shorter than the chat template's minimum
(:func:`chunktune.core.tokens.min_chat_tokens`): such rows are raised to it and
:attr:`Trace.notes` says how many.

Reading is all or nothing: a malformed row, arrivals out of order, a file over
:data:`MAX_TRACE_BYTES` or a window holding more than ``max_requests`` requests is a
:class:`~chunktune.core.errors.SpecError` naming the line; no partial trace is ever replayed.
The file is read through :func:`chunktune.core.infile.lines` (a regular file, UTF-8, lines of at
most a MiB) as its rows are parsed, and reading stops at the end of the window; a row is
refused as soon as it is one too many (:mod:`chunktune.core.trace_formats` bounds every
value), so a refusal costs what the window holds, never the whole file.
:meth:`Trace.to_dict` gives the trace as it is replayed (the requests of the window, arrival
times after the speed-up, one class name and one priority per row) in the generic CSV form,
inline, so a profile carries its requests to every tool that replays it.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, field_validator, model_validator

from chunktune.core import infile
from chunktune.core.bounds import MAX_DURATION_S, MAX_REQUESTS
from chunktune.core.distributions import (
    NAME_PATTERN,
    Api,
    Positive,
    StrictModel,
    duration_value,
)
from chunktune.core.errors import SpecError
from chunktune.core.tokens import min_chat_tokens
from chunktune.core.trace_formats import (
    PRIORITY,
    PRIORITY_BOUND,
    RowReader,
    Rows,
)
from chunktune.core.validation import problems_from

__all__ = [
    "DEFAULT_MAX_REQUESTS",
    "MAX_TRACE_BYTES",
    "MAX_TRACE_CLASSES",
    "Trace",
    "TraceClass",
    "TraceSpec",
    "read_trace",
]

#: A trace file larger than this is refused before it is read.
MAX_TRACE_BYTES = 256 * 2**20
#: Requests a trace's window may hold unless ``max_requests`` says otherwise (at most
#: :data:`~chunktune.core.bounds.MAX_REQUESTS`).
DEFAULT_MAX_REQUESTS = 200_000
#: Traffic classes a trace may be split into.
MAX_TRACE_CLASSES = 32
#: The class of a trace that is not split.
DEFAULT_CLASS = "trace"

class TraceClassSpec(StrictModel):
    """A traffic class of a trace: its API and priority, and which rows it takes."""

    name: str
    api: Api = "completions"
    priority: int = Field(default=0, ge=-PRIORITY_BOUND, le=PRIORITY_BOUND)
    """vLLM's ``priority`` request field (lower is served first under
    ``--scheduling-policy priority``); a row's own ``priority`` column wins."""
    max_prompt_tokens: int | None = Field(default=None, gt=0)
    """``split: prompt_tokens``: the class takes rows with at most this many prompt tokens
    (classes are tried in order; the last may leave it out and take the rest)."""
    values: list[str] | None = Field(default=None, min_length=1, max_length=64)
    """``split: column``: the column values this class takes (default: its name)."""

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, v: Any) -> Any:
        if not isinstance(v, str) or not re.fullmatch(NAME_PATTERN, v) or len(v) > 63:
            raise ValueError(f"must be a name of letters, digits, '-', '_' or '.' (got {v!r})")
        return v


Seconds = Annotated[float, BeforeValidator(duration_value)]


class TraceSpec(StrictModel):
    """A trace and how to replay it (the ``trace:`` mapping of a profile)."""

    file: str | None = None
    """The trace file; a relative path is taken from the folder of the file that names it."""
    data: str | None = None
    """The trace itself, inline (what :meth:`Trace.to_dict` writes)."""
    format: Literal["auto", "azure", "mooncake", "generic"] = "auto"
    start: Seconds = 0.0
    """Replay from this trace time on (seconds, or ``"10m"``)."""
    end: Seconds | None = None
    """Replay trace time before this (default: to the last request)."""
    speedup: float = Field(default=1.0, ge=1e-3, le=1e6)
    """Arrival times are divided by this: the same requests at this multiple of the rate."""
    rate_scale: Positive = Field(default=1.0, le=100)
    """Requests are scaled by this over the same span (below 1: a seeded subset; above 1: the
    trace overlaid on copies of itself shifted in time, then a seeded subset)."""
    split: Literal["none", "prompt_tokens", "column"] | None = None
    """How rows become classes (default: see :meth:`effective_split`)."""
    column: str = Field(default="class", min_length=1, max_length=128)
    """The column (or JSON key) ``split: column`` reads."""
    classes: list[TraceClassSpec] = Field(default_factory=list, max_length=MAX_TRACE_CLASSES)
    max_requests: int = Field(default=DEFAULT_MAX_REQUESTS, ge=1, le=MAX_REQUESTS)
    """The most requests the window may hold; a trace with more is refused."""
    source: str | None = Field(default=None, max_length=1024)
    """Where an inline trace came from (informational)."""

    @model_validator(mode="after")
    def _consistent(self) -> TraceSpec:
        if (self.file is None) == (self.data is None):
            raise ValueError("give exactly one of file (a trace file) or data (the trace "
                             "inline)")
        if self.end is not None and self.end <= self.start:
            raise ValueError(f"end must be after start (got {self.end:g}s <= {self.start:g}s)")
        names = [c.name for c in self.classes]
        if dup := next((n for i, n in enumerate(names) if n in names[:i]), None):
            raise ValueError(f"classes: duplicate class name {dup!r}")
        split = self.effective_split(None)
        if split == "none" and len(self.classes) > 1:
            raise ValueError("classes: an unsplit trace has one class; give split "
                             "(prompt_tokens or column) to have several")
        if split == "prompt_tokens":
            bounds = [c.max_prompt_tokens for c in self.classes]
            if not bounds or any(b is None for b in bounds[:-1]):
                raise ValueError("split prompt_tokens: every class but the last needs "
                                 "max_prompt_tokens")
            given = [b for b in bounds if b is not None]
            if given != sorted(set(given)):
                raise ValueError("split prompt_tokens: max_prompt_tokens must increase from "
                                 f"class to class (got {given})")
        if split != "column" and any(c.values is not None for c in self.classes):
            raise ValueError("classes[].values is for split column")
        return self

    def effective_split(self, has_column: bool | None) -> str:
        """The split in effect: ``split`` if given; else ``prompt_tokens`` when a class gives
        ``max_prompt_tokens``, ``column`` when a class gives ``values``, there are several
        classes or the trace has :attr:`column` (``has_column``; None before it is read),
        else ``none``."""
        if self.split is not None:
            return self.split
        if any(c.max_prompt_tokens is not None for c in self.classes):
            return "prompt_tokens"
        if has_column or len(self.classes) > 1 or any(c.values for c in self.classes):
            return "column"
        return "none"


@dataclass(frozen=True)
class TraceClass:
    name: str
    api: str = "completions"
    priority: int = 0


@dataclass(frozen=True, eq=False, repr=False)
class Trace:
    """The requests of a trace as they are replayed (see the module docstring): arrival times
    in seconds from the start of the replay, in order."""

    classes: tuple[TraceClass, ...]
    arrival: tuple[float, ...]
    prompt_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]
    cls: tuple[int, ...]
    priority: tuple[int, ...]
    span: float
    """The replay's length: the window's (``end - start``) over the speed-up, or the last
    arrival rounded up to the next whole second."""
    rate_scale: float = 1.0
    max_requests: int = DEFAULT_MAX_REQUESTS
    source: str = ""
    """What was read: the file, its format and the options."""
    notes: tuple[str, ...] = ()
    """What reading changed (chat prompts raised to the template's minimum)."""

    def __len__(self) -> int:
        return len(self.arrival)

    def to_csv(self) -> str:
        """The requests as a generic CSV (arrival times exact: ``repr`` of the floats)."""
        names = [c.name for c in self.classes]
        lines = [f"arrival,prompt_tokens,output_tokens,class,{PRIORITY}"]
        lines += [f"{a!r},{p},{o},{names[c]},{q}" for a, p, o, c, q in zip(
            self.arrival, self.prompt_tokens, self.output_tokens, self.cls, self.priority,
            strict=True)]
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        """The ``trace:`` mapping that reads back as this trace (the requests inline)."""
        out: dict[str, Any] = {"source": self.source[:1024], "format": "generic",
                               "split": "column", "column": "class",
                               "classes": [{"name": c.name, "api": c.api, "priority": c.priority}
                                           for c in self.classes]}
        if self.rate_scale != 1.0:
            out["rate_scale"] = self.rate_scale
        if self.max_requests != DEFAULT_MAX_REQUESTS:
            out["max_requests"] = self.max_requests
        out["data"] = self.to_csv()
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        return self.digest == other.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:
        return f"Trace({self.source!r}, {len(self)} requests, {self.digest})"

    @functools.cached_property
    def digest(self) -> str:
        """A hash of what is replayed (requests, classes, rate scale): equal traces replay
        the same requests."""
        h = hashlib.sha256(self.to_csv().encode())
        h.update(repr((self.classes, self.rate_scale)).encode())
        return h.hexdigest()[:16]


def parse_trace_spec(raw: Any, field: str) -> TraceSpec:
    """The ``trace:`` mapping validated; every problem under ``field``."""
    if not isinstance(raw, dict):
        raise SpecError(f"must be a mapping with file (or data) and options (got "
                        f"{type(raw).__name__})", field=field)
    try:
        return TraceSpec.model_validate(raw)
    except ValidationError as e:
        raise SpecError(problems_from(e, TraceSpec, (field,))) from e


def read_trace(spec: TraceSpec, *, base_dir: Path | None = None, field: str = "trace") -> Trace:
    """Read and check the whole trace, then apply the window, speed-up and split. Raises
    :class:`SpecError` under ``field`` (``field.file`` or ``field.data``) naming the line."""
    lines: Iterable[tuple[int, str]]
    if spec.file is not None:
        where, name = f"{field}.file", Path(spec.file).name
        path = Path(spec.file)
        if base_dir is not None and not path.is_absolute():
            path = base_dir / path
        lines = infile.lines(path, field=where, max_bytes=MAX_TRACE_BYTES, name=name)
    else:
        assert spec.data is not None
        where, name = f"{field}.data", "the inline trace"
        if len(spec.data) > MAX_TRACE_BYTES or len(spec.data.encode()) > MAX_TRACE_BYTES:
            raise SpecError(f"is over the {MAX_TRACE_BYTES / 2**20:.3f} MiB a trace may have; "
                            "give a shorter trace", field=where)
        lines = infile.text_lines(spec.data, field=where, name=name)
    return _Reader(spec, where, name).read(lines)


class _Reader:
    """Reads a trace's rows (:class:`~chunktune.core.trace_formats.RowReader`) and turns them
    into the replay: window, speed-up, classes, the chat minimum."""

    def __init__(self, spec: TraceSpec, where: str, name: str) -> None:
        self.spec = spec
        self.where = where
        self.name = name
        self.has_column = False

    def fail(self, line: int, message: str) -> SpecError:
        return SpecError(f"{self.name} line {line}: {message}", field=self.where)

    def read(self, lines: Iterable[tuple[int, str]]) -> Trace:
        spec = self.spec
        reader = RowReader(spec.format, spec.column, self.where, self.name, start=spec.start,
                           end=math.inf if spec.end is None else spec.end,
                           limit=spec.max_requests)
        rows, fmt = reader.read(lines)
        self.has_column = reader.has_column
        return self._replay(rows, fmt)

    # ---- the replay -------------------------------------------------------------------------

    def _replay(self, rows: Rows, fmt: str) -> Trace:
        spec = self.spec
        end = math.inf if spec.end is None else spec.end
        keep = list(range(len(rows.time)))  # the reader kept the window's rows only
        if not keep:
            extent = (f"{rows.first:g}s to {rows.last:g}s" if rows.first is not None
                      and rows.last is not None else "no requests at all")
            raise SpecError(f"{self.name}: no request in the window [{spec.start:g}s, "
                            f"{'end' if spec.end is None else f'{end:g}s'}) (the trace's "
                            f"arrivals run {extent})", field=self.where)
        limit = spec.max_requests
        if round(len(keep) * spec.rate_scale) > limit:
            raise SpecError(f"rate_scale {spec.rate_scale:g} makes "
                            f"{round(len(keep) * spec.rate_scale):,} requests, over "
                            f"max_requests ({limit:,})", field=self.where)
        classes, cls = self._classes(rows, keep)
        arrival = tuple((rows.time[i] - spec.start) / spec.speedup for i in keep)
        chat_min = min_chat_tokens()
        prompts = [rows.prompt[i] for i in keep]
        raised = [0] * len(classes)
        for j, c in enumerate(cls):
            if classes[c].api == "chat" and prompts[j] < chat_min:
                prompts[j] = chat_min
                raised[c] += 1
        notes = tuple(f"class {classes[c].name}: {n} prompt(s) under {chat_min} tokens raised "
                      f"to {chat_min}, the shortest chat prompt" for c, n in enumerate(raised)
                      if n)
        span = ((end - spec.start) / spec.speedup if spec.end is not None
                else math.floor(arrival[-1]) + 1.0)
        if span > MAX_DURATION_S:
            raise SpecError(f"speedup {spec.speedup:g} makes the replay {span:.3g}s long, past "
                            f"the {MAX_DURATION_S / 86400:g} days a replay may last; raise "
                            "speedup or narrow the window", field=self.where)
        window = (f"{spec.start:g}s-{'end' if spec.end is None else f'{end:g}s'}"
                  if spec.start or spec.end is not None else "whole")
        source = spec.source or (f"{self.name} ({fmt}, {window}, speed-up {spec.speedup:g}, "
                                 f"{len(keep)} requests)")
        return Trace(
            classes=tuple(classes), arrival=arrival, prompt_tokens=tuple(prompts),
            output_tokens=tuple(rows.output[i] for i in keep), cls=tuple(cls),
            priority=tuple(p if (p := rows.priority[i]) is not None else classes[c].priority
                           for i, c in zip(keep, cls, strict=True)),
            span=span, rate_scale=spec.rate_scale, max_requests=spec.max_requests,
            source=source, notes=notes)

    def _classes(self, rows: Rows, keep: list[int]) -> tuple[list[TraceClass], list[int]]:
        spec = self.spec
        declared = [TraceClass(c.name, c.api, c.priority) for c in spec.classes]
        split = spec.effective_split(self.has_column)
        if split == "none":
            return declared or [TraceClass(DEFAULT_CLASS)], [0] * len(keep)
        if split == "prompt_tokens":
            bounds = [c.max_prompt_tokens for c in spec.classes]
            out = []
            for i in keep:
                n = rows.prompt[i]
                c = next((k for k, b in enumerate(bounds) if b is None or n <= b), None)
                if c is None:
                    raise self.fail(rows.line[i], f"a prompt of {n} tokens is above every "
                                    f"class's max_prompt_tokens (the largest is "
                                    f"{bounds[-1]}); give the last class no max_prompt_tokens "
                                    "to take the rest")
                out.append(c)
            return declared, out
        if not self.has_column:
            raise self.fail(1, f"split column: the trace has no column {spec.column!r}")
        index = {v: k for k, c in enumerate(spec.classes) for v in (c.values or [c.name])}
        out = []
        for i in keep:
            v = rows.value[i] or ""
            k = index.get(v)
            if k is None:
                if declared:  # the value is the file's: not quoted
                    raise self.fail(rows.line[i], f"the {spec.column} here matches no class "
                                    f"(the classes take: {', '.join(sorted(index))})")
                if not re.fullmatch(NAME_PATTERN, v) or len(v) > 63:
                    raise self.fail(rows.line[i], f"the {spec.column} here cannot be a class "
                                    "name (letters, digits, '-', '_' or '.', at most 63)")
                if len(index) == MAX_TRACE_CLASSES:
                    raise self.fail(rows.line[i], f"more than {MAX_TRACE_CLASSES} distinct "
                                    f"values of {spec.column}; list the classes with their "
                                    "values")
                k = index[v] = len(index)
            out.append(k)
        classes = declared or [TraceClass(v) for v in index]
        return classes, out
