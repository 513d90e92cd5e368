"""Field types shared by the manifest models: the base model (camelCase aliases, unknown fields
forbidden, no type coercion), durations, numbers and Kubernetes quantities.

Strictness matters: the API server checks the same manifest against the CRD schema, which
coerces nothing, so a value this model accepts must also pass there (``"5"`` is not an
integer, ``32768`` is not a string).
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, PlainSerializer, PlainValidator, WithJsonSchema
from pydantic.alias_generators import to_camel

from chunktune.core.errors import SpecError
from chunktune.core.workload import parse_duration


class Model(BaseModel):
    """Base of every manifest model."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_alias=True,
        validate_by_name=True,
        serialize_by_alias=True,
        extra="forbid",
        strict=True,
        use_attribute_docstrings=True,
    )


#: The string form of a duration in a manifest: up to four parts, hours, minutes, seconds and
#: milliseconds in that order (``"90s"``, ``"10m"``, ``"1h30m"``, ``"250ms"``, ``"1.5s"``), each
#: a number of at most seven digits. No spaces, no other units: the API server checks the same
#: pattern, and CEL's ``duration()`` (Go's syntax) reads every string it accepts.
DURATION_PATTERN = (r"^([0-9]{1,7}(\.[0-9]{1,6})?h)?([0-9]{1,7}(\.[0-9]{1,6})?m)?"
                    r"([0-9]{1,7}(\.[0-9]{1,6})?s)?([0-9]{1,7}(\.[0-9]{1,6})?ms)?$")
_DURATION_RE = re.compile(DURATION_PATTERN)
#: The longest duration any field takes unless it says otherwise: one week.
DURATION_CEILING = 7 * 24 * 3600


def _duration_text(seconds: float) -> str:
    return f"{seconds / 3600:g}h" if seconds >= 3600 else f"{seconds:g}s"


def duration_rule(ceiling: int, positive: bool) -> dict[str, Any]:
    """The CEL rule bounding the string form of a duration (the integer form has
    ``minimum``/``maximum``); CEL reads it as a Go duration."""
    low = "duration(self) > duration('0s')" if positive else "true"
    return {"rule": f"type(self) != string || ({low} && duration(self) <= "
                    f"duration('{ceiling}s'))",
            "message": ("must be > 0 and " if positive else "must be ")
            + f"at most {_duration_text(ceiling)}"}


def _duration_validator(ceiling: int, positive: bool) -> Any:
    def check(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, int | str):
            raise ValueError(f"must be a duration such as 60, '90s' or '10m' (got {v!r})")
        if isinstance(v, str) and not (len(v) <= 40 and len(v) >= 2 and _DURATION_RE.fullmatch(v)):
            raise ValueError(f"must be a duration such as '90s', '10m', '1h30m' or '250ms': "
                             f"numbers with a unit h, m, s or ms, no spaces (got {v!r})")
        try:
            seconds = parse_duration(v, "")
        except SpecError as e:
            raise ValueError(e.problems[0][1]) from e
        if positive and seconds <= 0:
            raise ValueError(f"must be > 0 (got {v!r})")
        if seconds > ceiling:
            raise ValueError(f"must be at most {_duration_text(ceiling)} (got {v!r})")
        return seconds
    return check


def _duration_out(v: float) -> int | str:
    return int(v) if float(v).is_integer() else f"{v:g}s"


def duration_type(ceiling: int = DURATION_CEILING, positive: bool = True) -> Any:
    """A duration field: seconds as an integer (``60``) or a string (``"90s"``), at most
    ``ceiling`` seconds, and > 0 when ``positive``. The schema carries the same bounds: the
    string pattern, ``minimum``/``maximum`` for integers, and a CEL rule for strings."""
    return Annotated[
        float,
        PlainValidator(_duration_validator(ceiling, positive)),
        PlainSerializer(_duration_out),
        WithJsonSchema({"x-kubernetes-int-or-string": True, "pattern": DURATION_PATTERN,
                        "maxLength": 40, "minimum": 1 if positive else 0, "maximum": ceiling,
                        "x-kubernetes-validations": [duration_rule(ceiling, positive)]}),
    ]


#: Seconds, written as an integer (``60``) or a string (``"90s"``, ``"10m"``, ``"1h30m"``,
#: ``"250ms"``), > 0 and at most a week. Fractional seconds need the string form (``"1.5s"``):
#: the CRD types durations as int-or-string.
Duration = duration_type()
#: A duration that may be 0 (a warm-up).
DurationOrZero = duration_type(positive=False)


def _number(v: Any) -> int | float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValueError(f"must be a number (got {v!r})")
    return v


#: An int or a float, kept as given (``512`` stays an int).
Number = Annotated[int | float, PlainValidator(_number), WithJsonSchema({"type": "number"})]

#: Kubernetes' quantity syntax (``500m``, ``16Gi``, ``2``).
#: Negative amounts are refused (a resource amount is never negative), and so are more than 12
#: digits (nothing a pod asks for is that large).
QUANTITY_RE = re.compile(
    r"^(([0-9]{1,12}(\.[0-9]{0,9})?)|(\.[0-9]{1,9}))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?[0-9]{1,2}))?$"
)


QUANTITY_MAX = 10**12


def _quantity(v: Any) -> int | str:
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= QUANTITY_MAX:
        return v
    if isinstance(v, str) and len(v) <= 32 and QUANTITY_RE.fullmatch(v):
        return v
    raise ValueError(f"must be a Kubernetes quantity such as 2, '500m' or '16Gi' (got {v!r})")


Quantity = Annotated[
    int | str,
    PlainValidator(_quantity),
    WithJsonSchema({"x-kubernetes-int-or-string": True, "pattern": QUANTITY_RE.pattern,
                    "maxLength": 32, "minimum": 0, "maximum": QUANTITY_MAX}),
]

_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def check_object_name(v: str, what: str = "name") -> str:
    """Kubernetes object names: DNS-1123 subdomains (lower case, digits, '-', '.')."""
    if len(v) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(v):
        raise ValueError(f"must be a valid Kubernetes {what}: lower-case letters, digits, '-' "
                         f"and '.', starting and ending with a letter or digit (got {v!r})")
    return v


def check_label_name(v: str, what: str = "name") -> str:
    """DNS-1123 labels (namespaces, container names): at most 63 characters, no dots."""
    if len(v) > 63 or not _DNS1123_LABEL.fullmatch(v):
        raise ValueError(f"must be a valid Kubernetes {what}: at most 63 lower-case letters, "
                         f"digits and '-', starting and ending with a letter or digit "
                         f"(got {v!r})")
    return v


#: The patterns of :func:`check_object_name` and :func:`check_label_name`, for the schema.
DNS1123_SUBDOMAIN = _DNS1123_SUBDOMAIN.pattern
DNS1123_LABEL = _DNS1123_LABEL.pattern


def short_repr(v: Any, limit: int = 80) -> str:
    """``repr(v)``, cut to ``limit`` characters (a 1 MB string must not fill the message)."""
    text = repr(v)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def pattern_str(pattern: str, max_length: int, what: str, min_length: int = 1) -> Any:
    """A string field checked against ``pattern`` (anchored) and a length, by the model and by
    the schema alike; the model's message says ``must be {what}``."""
    rx = re.compile(pattern)

    def check(v: Any) -> str:
        if not isinstance(v, str):
            quote = "; quote it" if isinstance(v, int | float) and not isinstance(v, bool) \
                else ""
            raise ValueError(f"must be a string (got {short_repr(v)}{quote})")
        if len(v) > max_length:
            raise ValueError(f"must be at most {max_length} characters (got {len(v)})")
        if len(v) < min_length or not rx.fullmatch(v):
            raise ValueError(f"must be {what} (got {short_repr(v)})")
        return v

    return Annotated[str, PlainValidator(check), WithJsonSchema(
        {"type": "string", "minLength": min_length, "maxLength": max_length,
         "pattern": pattern})]


#: Printable text without control characters (no newline, tab or NUL): what ends up on an
#: engine's command line or in a log line.
PRINTABLE = r"^[^\x00-\x1f\x7f]*$"
#: A model name or a path inside the engine's container (Hugging Face ``org/name``,
#: ``/models/llama``), and the name clients send: no spaces, quotes or control characters.
MODEL_NAME = r"^[A-Za-z0-9_./@:+-]+$"
#: A container image reference (``[registry[:port]/]path[:tag][@sha256:digest]``).
IMAGE_REF = (r"^([A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?/)?"
             r"[a-z0-9]+([._-]+[a-z0-9]+)*(/[a-z0-9]+([._-]+[a-z0-9]+)*)*"
             r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$")
#: A relative path of names that start with a letter, digit or '_' (so no ``..``, no hidden
#: files, no absolute paths).
RELATIVE_PATH = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*$"
#: An http(s) URL of a host (name, IPv4 or [IPv6]), optional port and path; no credentials.
HTTP_URL = (r"^https?://([A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])"
            r"(:[0-9]{1,5})?(/[!-~]*)?$")
