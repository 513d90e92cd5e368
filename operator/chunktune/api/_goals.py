"""Objectives and constraints (SLOs) of a ChunkedPrefillTuning, including the compact
constraint strings (``"chat.itl_p99 <= 50ms"``); re-exported by :mod:`chunktune.api.v1alpha1`."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from chunktune.api import metrics as _metrics
from chunktune.api._types import Model
from chunktune.core.errors import SpecError

MetricName = Literal[_metrics.METRIC_NAMES]  # type: ignore[valid-type]

#: Validation context key: the spec is one a study stored (a latency bound written without a
#: unit, as stored before units were required, is seconds).
STORED_SPEC = "stored_spec"

_CLASS_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def _check_metric(v: Any) -> Any:
    if isinstance(v, str) and v not in _metrics.METRICS:
        raise PydanticCustomError("unknown_metric", _metrics.unknown_metric_message(v))
    return v


def _check_class(v: Any) -> Any:
    if isinstance(v, str) and not _CLASS_RE.fullmatch(v):
        raise ValueError(f"must be a traffic class name (got {v!r})")
    return v


class Objective(Model):
    """A metric to optimize."""

    metric: MetricName
    """A metric of :mod:`chunktune.api.metrics` (``ttft_p99``, ``goodput``, ...)."""
    direction: Literal["minimize", "maximize"] | None = None
    """Default: the metric's own (latencies and error rate minimize, throughput and goodput
    maximize)."""
    class_: str | None = Field(default=None, alias="class", max_length=253,
                               json_schema_extra={"pattern": "^" + _CLASS_RE.pattern + "$"})
    """Only the requests of this traffic class of the workload (``chat``)."""

    _metric = field_validator("metric", mode="before")(_check_metric)
    _class = field_validator("class_", mode="before")(_check_class)

    @model_validator(mode="after")
    def _default_direction(self) -> Objective:
        if self.direction is None:
            self.direction = _metrics.METRICS[self.metric].direction
        return self

    @property
    def key(self) -> str:
        """``ttft_p99`` or ``chat.ttft_p99``."""
        return _metrics.metric_key(self.metric, self.class_)


_CONSTRAINT_RE = re.compile(
    r"\s*(?:(?P<cls>[A-Za-z0-9][A-Za-z0-9_.-]*)\.)?(?P<metric>[A-Za-z0-9_]+)\s*"
    r"(?P<op><=|>=|<|>|==|=)\s*(?P<value>\S.*?)\s*"
)
_NUMBER = r"[0-9]{1,9}(\.[0-9]{1,9})?([eE][-+]?[0-9]{1,2})?"
_DURATION = r"([0-9]{1,7}(\.[0-9]{1,6})?(h|m|s|ms)){1,4}"
_FRACTION = r"(0(\.[0-9]{1,9})?|1(\.0{1,9})?|\.[0-9]{1,9})"
_PERCENT_VALUE = r"(100(\.0{1,9})?|[0-9]{1,2}(\.[0-9]{1,9})?)%"


def _names(unit: str | None) -> str:
    """The metric names of ``unit`` (None: every unit but seconds and fractions), longest
    first."""
    names = [n for n, m in _metrics.METRICS.items()
             if m.unit == unit or (unit is None and m.unit not in ("s", "fraction"))]
    return "|".join(sorted(names, key=len, reverse=True))


#: The compact constraint grammar, for the CRD: ``[CLASS.]METRIC <= VALUE`` or ``>=``, METRIC one
#: of the known metrics; VALUE a duration for latencies (50ms, 4s), a number in [0, 1] or a
#: percentage up to 100% for fractions, a number for the rest.
CONSTRAINT_PATTERN = (
    r"^ *([A-Za-z0-9][A-Za-z0-9_.-]{0,62}\.)?("
    rf"({_names('s')}) *(<=|>=) *{_DURATION}|"
    rf"({_names('fraction')}) *(<=|>=) *({_FRACTION}|{_PERCENT_VALUE})|"
    rf"({_names(None)}) *(<=|>=) *{_NUMBER}"
    r") *$"
)
_CONSTRAINT_FULL = re.compile(CONSTRAINT_PATTERN)
_CONSTRAINT_FORM = ("'[CLASS.]METRIC <= VALUE' or '... >= VALUE', e.g. 'chat.itl_p99 <= 50ms' "
                    "or 'error_rate <= 1%'")


def parse_constraint_string(text: str, bare_seconds: bool = False) -> dict[str, Any]:
    """``"chat.itl_p99 <= 50ms"`` -> ``{"metric": "itl_p99", "class": "chat", "max": 0.05}``.
    A latency bound needs its unit (``60`` could be milliseconds or seconds; it is refused with
    the ``60ms`` spelling suggested), unless ``bare_seconds``: a spec a study stored before
    units were required. Raises ``ValueError`` with the expected form."""
    m = _CONSTRAINT_RE.fullmatch(text)
    if not m:
        raise ValueError(f"must look like {_CONSTRAINT_FORM} (got {text!r})")
    if m["op"] not in ("<=", ">="):
        raise ValueError(f"use <= or >= (got {m['op']!r} in {text!r})")
    metric = m["metric"]
    if metric not in _metrics.METRICS:
        raise ValueError(f"{_metrics.unknown_metric_message(metric)} (in {text!r})")
    raw: Any = m["value"]
    if re.fullmatch(r"[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?", raw):
        if _metrics.METRICS[metric].unit == "s" and not bare_seconds:
            raise ValueError(f"{metric} is a latency: give its unit, e.g. '{raw}ms' or "
                             f"'{raw}s' (got {raw!r} in {text!r})")
        raw = float(raw)
    try:
        value = _metrics.parse_value(metric, raw)
    except SpecError as e:
        raise ValueError(f"{e.problems[0][1]} (in {text!r})") from e
    if len(text) > 256 or not (bare_seconds or _CONSTRAINT_FULL.fullmatch(text)):
        raise ValueError(f"must look like {_CONSTRAINT_FORM}: a class of at most 63 "
                         f"characters, a number, percentage or duration such as 50ms, and no "
                         f"other characters (got {text[:80]!r})")
    out: dict[str, Any] = {"metric": metric, "max" if m["op"] == "<=" else "min": value}
    if m["cls"]:
        out["class"] = m["cls"]
    return out


class Constraint(Model):
    """A service-level objective a trial must meet to count as feasible: a bound on one
    metric. Also written as a string: ``"chat.itl_p99 <= 50ms"``, ``"error_rate <= 1%"``."""

    metric: MetricName
    """The bounded metric."""
    class_: str | None = Field(default=None, alias="class", max_length=253)
    """Only the requests of this traffic class."""
    max: float | None = None
    """Upper bound, in the metric's unit: latencies take seconds or ``"50ms"`` (the string
    form ``"chat.itl_p99 <= 50ms"`` needs the unit), fractions take
    ``0.01`` or ``"1%"``."""
    min: float | None = None
    """Lower bound (same units)."""

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, str):
            return parse_constraint_string(v, bare_seconds=bool(
                (info.context or {}).get(STORED_SPEC)))
        if not isinstance(v, dict):
            raise ValueError(f"must be a mapping {{metric, class, max|min}} or a string such as "
                             f"'chat.itl_p99 <= 50ms' (got {v!r})")
        return v

    _metric = field_validator("metric", mode="before")(_check_metric)
    _class = field_validator("class_", mode="before")(_check_class)

    @field_validator("max", "min", mode="before")
    @classmethod
    def _bound(cls, v: Any, info: Any) -> Any:
        if v is None:
            return v
        metric = info.data.get("metric")
        if metric is None:  # the metric is wrong; its own error says so
            return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0
        try:
            return _metrics.parse_value(metric, v)
        except SpecError as e:
            raise ValueError(e.problems[0][1]) from e

    @property
    def key(self) -> str:
        return _metrics.metric_key(self.metric, self.class_)

    def text(self) -> str:
        """The compact form (``chat.itl_p99 <= 50ms``)."""
        op, v = ("<=", self.max) if self.max is not None else (">=", self.min)
        return f"{self.key} {op} {_metrics.format_value(self.metric, float(v or 0))}"

    def manifest_text(self) -> str:
        """The compact form without rounding (``chat.itl_p99 <= 50ms``), as written back
        into a manifest: a latency in milliseconds (seconds above 10^6 ms), a fraction as a
        number, the others in their unit."""
        op, v = ("<=", self.max) if self.max is not None else (">=", self.min)
        unit = _metrics.METRICS[self.metric].unit
        x = float(v or 0)
        if unit == "fraction":
            text = f"{x:.9f}".rstrip("0").rstrip(".")
        elif unit == "s":
            ms = x * 1000 < 1e6
            text = f"{x * 1000 if ms else x:.6f}".rstrip("0").rstrip(".") + ("ms" if ms else "s")
        else:
            text = f"{x:.9g}"
        return f"{self.key} {op} {text}"

    def ok(self, value: float) -> bool:
        """Whether ``value`` meets the bound."""
        if self.max is not None and value > self.max:
            return False
        return not (self.min is not None and value < self.min)


#: In the CRD a constraint item is the compact string, checked against the grammar. (A
#: structural schema cannot type "a string or a mapping"; leaving the item untyped would let
#: any value in, so the cluster takes the string form, the one every example uses. The mapping
#: form stays available to the Python API and local runs.)
CONSTRAINT_ITEM_SCHEMA: dict[str, Any] = {
    "type": "string",
    "description": "An SLO: '[CLASS.]METRIC <= VALUE' or '... >= VALUE' (e.g. "
                   "'chat.itl_p99 <= 50ms', 'error_rate <= 1%'). Latency bounds take a duration "
                   "with its unit ('50ms', '4s'); fractions take 0.01 or '1%'.",
    "minLength": 1,
    "maxLength": 256,
    "pattern": CONSTRAINT_PATTERN,
}
