"""Reading a request trace's rows: the CSV and JSONL formats, their values, line by line.

:class:`RowReader` reads the Azure, Mooncake and generic formats
(:mod:`chunktune.core.trace` documents them) into :class:`Rows`: one arrival time (seconds of
trace time), prompt and output tokens, split value and priority per request, with the line each
came from. Every problem is a :class:`~chunktune.core.errors.SpecError` naming the line.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from chunktune.core.errors import SpecError

__all__ = ["PRIORITY", "PRIORITY_BOUND", "RowReader", "Rows", "timestamp"]

_AZURE = (("arrived_at", "num_prefill_tokens", "num_decode_tokens"),
          ("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
_MOONCAKE = ("timestamp", "input_length", "output_length")
_GENERIC = ("arrival", "prompt_tokens", "output_tokens")
#: The generic format's priority column.
PRIORITY = "priority"
#: The largest priority (either sign) a request may carry.
PRIORITY_BOUND = 2**31 - 1


@dataclass
class Rows:
    """Rows as read: line numbers, trace times (s), tokens, split values, priorities."""

    line: list[int]
    time: list[float]
    prompt: list[int]
    output: list[int]
    value: list[str | None]
    priority: list[int | None]


class RowReader:
    """Reads one trace's text: ``fmt`` is ``auto`` or the format it must be, ``column`` the
    split column to keep; errors name ``name`` (the file) and the field ``where``."""

    def __init__(self, fmt: str, column: str, where: str, name: str) -> None:
        self.format = fmt
        self.column = column
        self.where = where
        self.name = name
        self.has_column = False

    def fail(self, line: int, message: str) -> SpecError:
        return SpecError(f"{self.name} line {line}: {message}", field=self.where)

    def read(self, text: str) -> tuple[Rows, str]:
        """Every row of ``text`` and the format it was in (``has_column`` then says whether
        the trace has the split column)."""
        first = next((ln for ln in text.splitlines() if ln.strip()), None)
        if first is None:
            raise SpecError(f"{self.name} is empty: a trace needs a header and one request a "
                            "line", field=self.where)
        rows = Rows([], [], [], [], [], [])
        fmt = self._jsonl(text, rows) if first.lstrip().startswith("{") else self._csv(text, rows)
        return rows, fmt

    # ---- formats ----------------------------------------------------------------------------

    def _want(self, fmt: str, found: str) -> None:
        if self.format not in ("auto", fmt):
            raise self.fail(1, f"this is a {found}, not the {self.format} format; set "
                               f"format to {fmt} or auto")

    def _csv(self, text: str, rows: Rows) -> str:
        reader = csv.reader(io.StringIO(text))
        header: list[str] | None = None
        for record in reader:
            if not record or not any(f.strip() for f in record):
                continue
            header = [h.strip() for h in record]
            break
        assert header is not None
        at = {h: i for i, h in enumerate(header)}
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
                                      f"{len(header)} ({', '.join(header)})")
            if raw_ts:
                t = timestamp(record[ti])
                if t is None:
                    raise self.fail(line, f"{cols[0]} must be a date and time such as "
                                          f"2023-11-16 18:15:46.6805900 (got {record[ti]!r})")
                t0 = t if t0 is None else t0
                t -= t0
            else:
                t = self._time(record[ti], cols[0], line, 1.0)
            self._add(rows, line, t, record[pi], record[oi], cols,
                      None if split_col is None else record[split_col].strip(),
                      None if prio_col is None else record[prio_col])
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
        if self.format in expected:
            raise self.fail(line, f"a {self.format} trace needs the columns "
                                  f"{expected[self.format]} (got {','.join(header)})")
        if self.format == "mooncake":
            raise self.fail(line, "a mooncake trace is JSONL (one JSON object a line), "
                                  "not CSV")
        raise self.fail(line, f"the header {','.join(header)!r} is none of the trace formats: "
                              f"azure ({expected['azure']}) or generic ({expected['generic']}); "
                              "JSONL traces are mooncake (timestamp,input_length,output_length) "
                              "or generic")

    def _jsonl(self, text: str, rows: Rows) -> str:
        fmt: str | None = None
        cols: tuple[str, str, str] = _GENERIC
        scale = 1.0
        for line, raw in enumerate(text.splitlines(), 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except ValueError as e:
                raise self.fail(line, f"not a JSON object ({e})") from e
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
        raise self.fail(line, f"keys {', '.join(sorted(obj)) or '(none)'} are none of the JSONL "
                              f"trace formats: mooncake ({', '.join(_MOONCAKE)}, timestamp in "
                              f"ms) or generic ({', '.join(_GENERIC)}, arrival in s)")

    # ---- values -----------------------------------------------------------------------------

    def _time(self, raw: Any, col: str, line: int, scale: float) -> float:
        try:
            t = float(raw) * scale if not isinstance(raw, bool) else math.nan
        except (TypeError, ValueError):
            t = math.nan
        if not math.isfinite(t) or t < 0:
            unit = "milliseconds" if scale != 1.0 else "seconds"
            raise self.fail(line, f"{col} must be a number of {unit} >= 0 (got {raw!r})")
        return t

    def _tokens(self, raw: Any, col: str, line: int) -> int:
        n: int | None = None
        if isinstance(raw, int) and not isinstance(raw, bool):
            n = raw
        elif isinstance(raw, float) and raw.is_integer():
            n = int(raw)
        elif isinstance(raw, str):
            s = raw.strip()
            if re.fullmatch(r"\d+", s):
                n = int(s)
            elif re.fullmatch(r"\d+\.0*", s):
                n = int(float(s))
        if n is None or n < 1:
            raise self.fail(line, f"{col} must be a whole number of tokens >= 1 (got {raw!r})")
        return n

    def _add(self, rows: Rows, line: int, t: float, prompt: Any, output: Any,
             cols: tuple[str, str, str], value: str | None, prio: Any) -> None:
        if rows.time and t < rows.time[-1]:
            raise self.fail(line, f"{cols[0]} {t:g}s is before the previous request's "
                                  f"({rows.time[-1]:g}s, line {rows.line[-1]}); a trace must "
                                  "be in arrival order (sort it by that column)")
        priority: int | None = None
        if prio is not None and prio != "":
            try:
                priority = int(prio) if not isinstance(prio, bool) else None
            except (TypeError, ValueError):
                priority = None
            if priority is None or abs(priority) > PRIORITY_BOUND:
                raise self.fail(line, f"priority must be a whole number (lower is served "
                                      f"first) within +-{PRIORITY_BOUND} (got {prio!r})")
        rows.line.append(line)
        rows.time.append(t)
        rows.prompt.append(self._tokens(prompt, cols[1], line))
        rows.output.append(self._tokens(output, cols[2], line))
        rows.value.append(value)
        rows.priority.append(priority)


def timestamp(raw: str) -> float | None:
    """Seconds since the epoch of ``2023-11-16 18:15:46.6805900`` (any number of fractional
    digits, an optional ``T`` and ``Z`` or offset)."""
    m = re.fullmatch(r"\s*(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)(?:\.(\d+))?\s*"
                     r"(Z|[+-]\d\d:?\d\d)?\s*", raw)
    if m is None:
        return None
    day, clock, frac, zone = m.groups()
    try:
        t = dt.datetime.fromisoformat(f"{day}T{clock}{'' if zone in (None, 'Z') else zone}")
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return t.timestamp() + (float(f"0.{frac}") if frac else 0.0)
