"""The one way chunktune opens a file a user names: manifests, workload profiles, traces,
calibration profiles, step logs, stored results.

:func:`lines` opens the path once and streams its lines, and :func:`read_text` joins them; both
refuse, with a :class:`~chunktune.core.errors.SpecError` naming the field, the file and the
line (never a line's content):

* anything but a regular file: a directory, a FIFO (opened without blocking), a device, a socket,
  and whatever lies under ``/proc``, ``/sys`` or ``/dev`` (``/proc/self/environ`` is "regular"
  and reports a size of 0);
* a file past ``max_bytes`` or a line past ``max_line`` bytes, counted *while* reading: the
  refusal costs what was read up to the limit, never the whole file;
* text that is not UTF-8 (a leading byte-order mark is dropped, CRLF line ends read as LF), and
  CR-only line ends (a file saved by classic Mac OS), which would read as one line.

:func:`json_value` parses a JSON text the same strict way: duplicate keys, ``NaN``,
``Infinity``, numbers beyond a float and nesting past :data:`MAX_DEPTH` are refused.
:func:`shown` is how a reader quotes a value it refuses: a short number as written, anything
else by its kind and length, so that no error ever echoes a file's text.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from chunktune.core.errors import ChunktuneError, SpecError

__all__ = ["MAX_DEPTH", "MAX_LINE_BYTES", "head", "json_value", "lines", "read_text", "shown",
           "text_lines", "too_deep"]

#: The longest line (bytes) any input file may have unless its reader says otherwise.
MAX_LINE_BYTES = 1 * 2**20
#: The deepest nesting of a JSON value (a step record, a calibration profile, a trace row).
MAX_DEPTH = 64
#: Where no user file lives: kernel views whose "files" are not what they seem.
_SPECIAL = (Path("/proc"), Path("/sys"), Path("/dev"))
_BOM = b"\xef\xbb\xbf"
_NUMBER = re.compile(r"[+-]?(\d[\d_]*)?(\.\d*)?([eE][+-]?\d+)?|[+-]?(inf|nan|\.inf|\.nan)",
                     re.IGNORECASE)


def shown(value: Any) -> str:
    """How an error quotes a value read from a file: a number (or a short text that reads as
    one) as written, else only its kind and length. A file's text is never echoed."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int | float):
        text = repr(value)
        return text if len(text) <= 24 else f"a {len(text)}-digit number"
    if isinstance(value, str):
        s = value.strip()
        if s == "":
            return "an empty value"
        if len(s) <= 24 and _NUMBER.fullmatch(s):
            return repr(s)
        return f"a text of {len(value)} characters"
    return f"a {type(value).__name__}"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _open(path: Path, field: str, name: str) -> int:
    """A descriptor of the regular file ``path``, opened once and without blocking."""
    try:
        real = path.resolve()
    except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop (Python < 3.13)
        raise SpecError(f"{name} cannot be read: {getattr(e, 'strerror', None) or e}",
                        field=field) from e
    special = next((s for s in _SPECIAL if real == s or real.is_relative_to(s)), None)
    if special is not None:
        raise SpecError(f"{name} is under {special}, not a regular file: give a file",
                        field=field)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError as e:
        raise SpecError(f"{name} does not exist", field=field) from e
    except OSError as e:
        raise SpecError(f"{name} cannot be read: {e.strerror or e}", field=field) from e
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise SpecError(f"{name} is {_kind(mode)}, not a regular file: give a file",
                        field=field)
    return fd


def _size(n: int) -> str:
    return (f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n / 2**10:g} KiB" if n >= 2**10
            else f"{n} bytes")


def lines(path: str | Path, *, field: str, max_bytes: int, name: str | None = None,
          max_line: int = MAX_LINE_BYTES) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of every line of the file ``path``, each ending in ``\\n`` (but
    perhaps the last), read as it is consumed (see the module docstring for what is refused).
    ``name`` (default: the path as given) is how errors name the file."""
    p = Path(path)
    label = str(path) if name is None else name
    fd = _open(p, field, label)
    total = 0
    with os.fdopen(fd, "rb") as f:
        n = 0
        while raw := f.readline(max_line + 1):
            n += 1
            total += len(raw)
            if total > max_bytes:
                raise SpecError(f"{label} is over the {_size(max_bytes)} such a file may have "
                                f"(at line {n}); give a smaller file", field=field)
            yield n, _decode(raw, n, label, field, max_line)


def head(path: str | Path, n: int, *, field: str, name: str | None = None) -> bytes:
    """The first ``n`` bytes of the regular file ``path`` (a file's magic number)."""
    fd = _open(Path(path), field, str(path) if name is None else name)
    with os.fdopen(fd, "rb") as f:
        return f.read(n)


def text_lines(text: str, *, field: str, name: str,
               max_line: int = MAX_LINE_BYTES) -> Iterator[tuple[int, str]]:
    """The lines of a text already in memory (inline data), checked as :func:`lines` checks a
    file's."""
    n, start = 0, 0
    text = text.removeprefix("\ufeff")
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end + 1
        n += 1
        line = text[start:end]
        start = end
        if len(line) > max_line:
            raise _long(n, name, field, max_line, "\r" in line)
        if line.endswith("\r\n"):
            line = line[:-2] + "\n"
        if "\r" in line:
            raise _cr(n, name, field)
        yield n, line


def _long(n: int, name: str, field: str, max_line: int, cr: bool) -> SpecError:
    why = (" (its lines end in CR alone: save it with LF line ends)" if cr else "")
    return SpecError(f"{name} line {n}: longer than {_size(max_line)}{why}", field=field)


def _cr(n: int, name: str, field: str) -> SpecError:
    return SpecError(f"{name} line {n}: a carriage return (CR) without a line feed: save the "
                     "file with LF (or CRLF) line ends", field=field)


def _decode(raw: bytes, n: int, name: str, field: str, max_line: int) -> str:
    if len(raw) > max_line and not raw.endswith(b"\n"):
        raise _long(n, name, field, max_line, b"\r" in raw)
    if n == 1 and raw.startswith(_BOM):
        raw = raw[len(_BOM):]
    if raw.endswith(b"\r\n"):
        raw = raw[:-2] + b"\n"
    if b"\r" in raw:
        raise _cr(n, name, field)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(f"{name} line {n}, column {e.start + 1}: not UTF-8 text ({e.reason}); "
                        "save the file as UTF-8", field=field) from e


def read_text(path: str | Path, *, field: str, max_bytes: int, name: str | None = None,
              max_line: int = MAX_LINE_BYTES) -> str:
    """The whole text of the file ``path``, read through :func:`lines`."""
    return "".join(line for _, line in lines(path, field=field, max_bytes=max_bytes,
                                             name=name, max_line=max_line))


def too_deep(obj: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``obj`` (lists and mappings) nests deeper than ``limit``. Iterative."""
    stack: list[tuple[Any, int]] = [(obj, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(value, dict):
            stack += [(v, depth + 1) for v in value.values()]
        elif isinstance(value, list):
            stack += [(v, depth + 1) for v in value]
    return False


class _Refused(ChunktuneError, ValueError):
    """A JSON value refused while parsing (turned into a :class:`SpecError` naming the line)."""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Refused(f"the key {shown(k) if len(k) > 24 else repr(k)} appears twice in "
                           "one object")
        out[k] = v
    return out


def _constant(name: str) -> float:
    raise _Refused(f"{name} is not a number JSON allows: give a finite number")


def _float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise _Refused(f"a number past the largest float ({len(text)} characters)")
    return v


def json_value(text: str, *, where: str, field: str, limit: int = MAX_DEPTH,
               constants: bool = False) -> Any:
    """The JSON value of ``text`` (``where``: the file and line, for errors), strictly: no
    duplicate keys, only finite numbers, nesting at most ``limit`` deep. ``constants`` reads
    ``Infinity``, ``-Infinity`` and ``NaN`` as Python's JSON reader does, for files another
    tool writes that way (a Hugging Face ``config.json``: Nemotron-H's ``time_step_limit``
    ends in ``Infinity``); the reader then checks each number it uses."""
    try:
        value = json.loads(text, object_pairs_hook=_pairs,
                           parse_constant=float if constants else _constant,
                           parse_float=_float)
    except _Refused as e:
        raise SpecError(f"{where}: {e}", field=field) from e
    except RecursionError:
        raise SpecError(f"{where}: nested more than {limit} levels deep", field=field) from None
    except ValueError as e:  # JSONDecodeError; an integer of more than 4300 digits
        pos = ("" if not isinstance(e, json.JSONDecodeError) else f" (column {e.colno})"
               if "\n" not in text.rstrip("\n") else f" (line {e.lineno}, column {e.colno})")
        msg = e.msg if isinstance(e, json.JSONDecodeError) else "an integer too long to read"
        raise SpecError(f"{where}: not valid JSON: {msg}{pos}", field=field) from e
    if too_deep(value, limit):
        raise SpecError(f"{where}: nested more than {limit} levels deep", field=field)
    return value
