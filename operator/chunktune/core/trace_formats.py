"""Reading a request trace's rows: the CSV and JSONL formats, their values, line by line.

:class:`RowReader` reads the Azure, Mooncake and generic formats
(:mod:`chunktune.core.trace` documents them) into :class:`Rows`: one arrival time (seconds of
trace time), prompt and output tokens, split value and priority per request, with the line each
came from. Every problem is a :class:`~chunktune.core.errors.SpecError` naming the line and
the column (never the line's text: :func:`chunktune.core.infile.shown`).

Lines are read as they come (:func:`chunktune.core.infile.lines`): rows before the window are
checked and dropped, reading stops at the first row past its end, and the row after
``limit`` rows in the window is refused at once, so a huge trace costs what its window holds.
Every number is bounded: token counts by :data:`MAX_TOKENS`, trace times by
:data:`MAX_DURATION_S`, priorities by :data:`PRIORITY_BOUND` (and whole).
"""

from __future__ import annotations

import csv
import datetime as dt
import itertools
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from chunktune.core import infile
from chunktune.core.bounds import MAX_DURATION_S, MAX_REQUESTS, MAX_TOKENS
from chunktune.core.errors import SpecError
from chunktune.core.infile import shown

#: A whole number of tokens written with a decimal point (``12.`` or ``12.00``).
_WHOLE_POINT = re.compile(r"\d+\.0*")

__all__ = ["PRIORITY", "PRIORITY_BOUND", "RowReader", "Rows", "timestamp"]

_AZURE = (("arrived_at", "num_prefill_tokens", "num_decode_tokens"),
          ("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
_MOONCAKE = ("timestamp", "input_length", "output_length")
_GENERIC = ("arrival", "prompt_tokens", "output_tokens")
#: The generic format's priority column.
PRIORITY = "priority"
#: The largest priority (either sign) a request may carry.
PRIORITY_BOUND = 2**31 - 1
# The limits every input shares (core.bounds): a prompt or output past MAX_TOKENS is a broken
# row, refused before any prompt is built from it; a trace's window holds at most MAX_REQUESTS
# requests (its max_requests at most); a row's time is at most MAX_DURATION_S after the start.


@dataclass
class Rows:
    """Rows as read: line numbers, trace times (s), tokens, split values, priorities."""

    line: list[int]
    time: list[float]
    prompt: list[int]
    output: list[int]
    value: list[str | None]
    priority: list[int | None]
    first: float | None = None
    """The first and last trace times read (in the window or not)."""
    last: float | None = None
    last_line: int = 0


class RowReader:
    """Reads one trace's text: ``fmt`` is ``auto`` or the format it must be, ``column`` the
    split column to keep; errors name ``name`` (the file) and the field ``where``."""

    def __init__(self, fmt: str, column: str, where: str, name: str, *, start: float = 0.0,
                 end: float = math.inf, limit: int | None = None) -> None:
        self.format = fmt
        self.column = column
        self.where = where
        self.name = name
        self.has_column = False
        self.start, self.end, self.limit = start, end, limit
        self.done = False

    def fail(self, line: int, message: str) -> SpecError:
        return SpecError(f"{self.name} line {line}: {message}", field=self.where)

    def read(self, lines: Iterable[tuple[int, str]]) -> tuple[Rows, str]:
        """The rows in the window of ``lines`` (:func:`chunktune.core.infile.lines`: numbered,
        checked) and the format they were in (``has_column`` then says whether the trace has
        the split column)."""
        it = iter(lines)
        head = []
        for n, line in it:
            head.append((n, line))
            if line.strip():
                break
        else:
            raise SpecError(f"{self.name} is empty: a trace needs a header and one request a "
                            "line", field=self.where)
        rows = Rows([], [], [], [], [], [])
        src = itertools.chain(head, it)
        fmt = self._jsonl(src, rows) if head[-1][1].lstrip().startswith("{") \
            else self._csv(src, rows)
        return rows, fmt

    # ---- formats ----------------------------------------------------------------------------

    def _want(self, fmt: str, found: str) -> None:
        if self.format not in ("auto", fmt):
            raise self.fail(1, f"this is a {found}, not the {self.format} format; set "
                               f"format to {fmt} or auto")

    def _csv(self, lines: Iterable[tuple[int, str]], rows: Rows) -> str:
        reader = csv.reader(line for _, line in lines)
        try:
            return self._csv_rows(reader, rows)
        except csv.Error as e:  # a field past the limit, a NUL: its message quotes no text
            raise self.fail(reader.line_num, f"not CSV ({e})") from e

    def _csv_rows(self, reader: Any, rows: Rows) -> str:
        header: list[str] | None = None
        for record in reader:
            if not record or not any(f.strip() for f in record):
                continue
            header = [h.strip() for h in record]
            break
        if header is None:  # every line was separators or blanks
            raise self.fail(reader.line_num, "no header: a CSV trace's first row names its "
                                             "columns (arrival, prompt_tokens, output_tokens)")
        at = {h: i for i, h in enumerate(header)}
        if len(at) < len(header):
            twice = next(h for i, h in enumerate(header) if h in header[:i])
            which = f"the column {twice!r}" if twice in _KNOWN else "a column"
            raise self.fail(reader.line_num, f"{which} appears twice in the header; a trace "
                                             "names each column once")
        fmt, cols, raw_ts = self._csv_format(header, at, reader.line_num)
        ti, pi, oi = (at[c] for c in cols)
        split_col = at.get(self.column)
        self.has_column = split_col is not None
        prio_col = at.get(PRIORITY) if fmt == "generic" else None
        t0: float | None = None
        for record in reader:
            line = reader.line_num
            if not record or not any(f.strip() for f in record):
                continue
            if len(record) != len(header):
                raise self.fail(line, f"{len(record)} fields where the header has "
                                      f"{len(header)}")
            if raw_ts:
                t = timestamp(record[ti])
                if t is None:
                    raise self.fail(line, f"{cols[0]} must be a date and time between 1970 "
                                          "and 2100 such as 2023-11-16 18:15:46.6805900 (got "
                                          f"{shown(record[ti])})")
                t0 = t if t0 is None else t0
                t = self._bounded(t - t0, cols[0], line, record[ti])
            else:
                t = self._time(record[ti], cols[0], line, 1.0)
            self._add(rows, line, t, record[pi], record[oi], cols,
                      None if split_col is None else record[split_col].strip(),
                      None if prio_col is None else record[prio_col])
            if self.done:
                break
        return fmt

    def _csv_format(self, header: list[str], at: dict[str, int], line: int
                    ) -> tuple[str, tuple[str, str, str], bool]:
        for i, cols in enumerate(_AZURE):
            if all(c in at for c in cols):
                self._want("azure", "trace in the Azure format")
                return "azure", cols, i == 1
        if all(c in at for c in _GENERIC):
            self._want("generic", "generic CSV trace")
            return "generic", _GENERIC, False
        expected = {"azure": " or ".join(",".join(c) for c in _AZURE),
                    "generic": ",".join(_GENERIC) + "[,class][,priority]"}
        known = [h for h in header if h in _KNOWN]
        got = (f"its header has {len(header)} columns, of which "
               f"{', '.join(known) if known else 'none'} known")
        if self.format in expected:
            raise self.fail(line, f"a {self.format} trace needs the columns "
                                  f"{expected[self.format]} ({got})")
        if self.format == "mooncake":
            raise self.fail(line, "a mooncake trace is JSONL (one JSON object a line), "
                                  "not CSV")
        raise self.fail(line, f"the header is none of the trace formats ({got}): "
                              f"azure ({expected['azure']}) or generic ({expected['generic']}); "
                              "JSONL traces are mooncake (timestamp,input_length,output_length) "
                              "or generic")

    def _jsonl(self, lines: Iterable[tuple[int, str]], rows: Rows) -> str:
        fmt: str | None = None
        cols: tuple[str, str, str] = _GENERIC
        scale = 1.0
        for line, raw in lines:
            if not raw.strip():
                continue
            obj = infile.json_value(raw, where=f"{self.name} line {line}", field=self.where)
            if not isinstance(obj, dict):
                raise self.fail(line, f"not a JSON object (got {type(obj).__name__})")
            if fmt is None:
                fmt, cols, scale = self._json_format(obj, line)
                self.has_column = self.column in obj
            missing = [c for c in cols if c not in obj]
            if missing:
                raise self.fail(line, f"missing {', '.join(missing)} (a {fmt} trace has "
                                      f"{', '.join(cols)} on every line)")
            value = obj.get(self.column)
            prio = obj.get(PRIORITY) if fmt == "generic" else None
            self._add(rows, line, self._time(obj[cols[0]], cols[0], line, scale),
                      obj[cols[1]], obj[cols[2]], cols,
                      None if value is None else str(value).strip(),
                      None if prio is None else prio)
            if self.done:
                break
        assert fmt is not None
        return fmt

    def _json_format(self, obj: dict[str, Any], line: int
                     ) -> tuple[str, tuple[str, str, str], float]:
        if all(c in obj for c in _MOONCAKE):
            self._want("mooncake", "trace in Mooncake's JSONL format")
            return "mooncake", _MOONCAKE, 1e-3
        if all(c in obj for c in _GENERIC):
            self._want("generic", "generic JSONL trace")
            return "generic", _GENERIC, 1.0
        if self.format == "azure":
            raise self.fail(line, "an azure trace is CSV, not JSON lines")
        known = [k for k in sorted(obj) if k in _KNOWN]
        raise self.fail(line, f"its keys ({len(obj)}, of which "
                              f"{', '.join(known) if known else 'none'} known) are none of the "
                              f"JSONL trace formats: mooncake ({', '.join(_MOONCAKE)}, timestamp "
                              f"in ms) or generic ({', '.join(_GENERIC)}, arrival in s)")

    # ---- values -----------------------------------------------------------------------------

    def _time(self, raw: Any, col: str, line: int, scale: float) -> float:
        try:
            t = float(raw) * scale if not isinstance(raw, bool) else math.nan
        except (TypeError, ValueError, OverflowError):
            t = math.nan
        if not math.isfinite(t) or t < 0:
            unit = "milliseconds" if scale != 1.0 else "seconds"
            raise self.fail(line, f"{col} must be a number of {unit} >= 0 (got {shown(raw)})")
        return self._bounded(t, col, line, raw)

    def _bounded(self, t: float, col: str, line: int, raw: Any) -> float:
        if t > MAX_DURATION_S:
            raise self.fail(line, f"{col} is {t:.3g}s into the trace, past the "
                                  f"{MAX_DURATION_S / 86400:g} days a trace may span (got "
                                  f"{shown(raw)})")
        return t

    def _tokens(self, raw: Any, col: str, line: int) -> int:
        n: int | None = None
        if isinstance(raw, str):  # a CSV field (first: a trace has two a row)
            s = raw.strip()
            if len(s) > 24:
                pass
            elif s.isdecimal():  # what ``\d+`` matches, without a regular expression a row
                n = int(s)
            elif _WHOLE_POINT.fullmatch(s):
                n = int(float(s))
        elif isinstance(raw, int) and not isinstance(raw, bool):
            n = raw
        elif isinstance(raw, float) and raw.is_integer():
            n = int(raw)
        if n is None or n < 1:
            raise self.fail(line, f"{col} must be a whole number of tokens >= 1 (got "
                                  f"{shown(raw)})")
        if n > MAX_TOKENS:
            raise self.fail(line, f"{col} is over {MAX_TOKENS:,} tokens, the longest context "
                                  "any model has")
        return n

    def _add(self, rows: Rows, line: int, t: float, prompt: Any, output: Any,
             cols: tuple[str, str, str], value: str | None, prio: Any) -> None:
        if rows.last is not None and t < rows.last:
            raise self.fail(line, f"{cols[0]} {t:g}s is before the previous request's "
                                  f"({rows.last:g}s, line {rows.last_line}); a trace must be "
                                  "in arrival order (sort it by that column)")
        priority: int | None = None
        if prio is not None and prio != "":
            priority = _whole(prio)
            if priority is None or abs(priority) > PRIORITY_BOUND:
                raise self.fail(line, f"priority must be a whole number (lower is served "
                                      f"first) within +-{PRIORITY_BOUND} (got {shown(prio)})")
        prompt_n = self._tokens(prompt, cols[1], line)
        output_n = self._tokens(output, cols[2], line)
        rows.first = t if rows.first is None else rows.first
        rows.last, rows.last_line = t, line
        if t >= self.end:
            self.done = True  # in arrival order: no later row is in the window
            return
        if t < self.start:
            return
        if self.limit is not None and len(rows.line) >= self.limit:
            raise self.fail(line, f"more than {self.limit:,} requests in the window; narrow "
                                  "it (start, end) or raise max_requests (at most "
                                  f"{MAX_REQUESTS:,})")
        rows.line.append(line)
        rows.time.append(t)
        rows.prompt.append(prompt_n)
        rows.output.append(output_n)
        rows.value.append(value)
        rows.priority.append(priority)


_KNOWN = frozenset((*_AZURE[0], *_AZURE[1], *_MOONCAKE, *_GENERIC, PRIORITY, "class"))


def _whole(raw: Any) -> int | None:
    """A priority as a whole number: an int, a float or text with nothing after the point."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float):
        return int(raw) if raw.is_integer() and abs(raw) <= PRIORITY_BOUND else None
    if isinstance(raw, str) and (m := re.fullmatch(r"\s*([+-]?\d{1,12})(?:\.0*)?\s*", raw)):
        return int(m.group(1))
    return None


def timestamp(raw: str) -> float | None:
    """Seconds since the epoch of ``2023-11-16 18:15:46.6805900`` (any number of fractional
    digits, an optional ``T`` and ``Z`` or offset)."""
    m = re.fullmatch(r"\s*(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)(?:\.(\d+))?\s*"
                     r"(Z|[+-]\d\d:?\d\d)?\s*", raw)
    if m is None:
        return None
    day, clock, frac, zone = m.groups()
    if not 1970 <= int(day[:4]) <= 2100:
        return None
    try:
        t = dt.datetime.fromisoformat(f"{day}T{clock}{'' if zone in (None, 'Z') else zone}")
        if t.tzinfo is None:
            t = t.replace(tzinfo=dt.UTC)
        return t.timestamp() + (float(f"0.{frac[:12]}") if frac else 0.0)
    except (ValueError, OverflowError):
        return None
