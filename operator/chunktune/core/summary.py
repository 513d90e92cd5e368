"""The load-run summary: a versioned JSON document the tuner and the operator's load Job read.

Schema ``chunktune.dev/load-summary/v1`` (:data:`SCHEMA_ID`; :data:`SUMMARY_JSON_SCHEMA` is its
JSON Schema). All times are seconds; rates are per second. Top level::

    schema      "chunktune.dev/load-summary/v1"
    tool        {name, version}              the chunktune that wrote it
    target      base URL, model              served model name that was asked for
    profile     profile name; arrival {mode, rate, concurrency}; seed
    started, ended                           ISO 8601 UTC wall-clock times of the run
    duration    {configured, warmup, measured, elapsed, drain}
                configured: the arrival window D; warmup: W; measured: D - W (shorter when the
                run was stopped early); elapsed: wall time including the drain; drain: time
                spent after D waiting for requests still in flight
    complete    false when the run was stopped before D
    overall     a ClassSummary over every class; classes {name: ClassSummary}
    windows     [Window]: intermediate summaries every --windows seconds (empty without)
    goodput     null, or {slos, request_rate, fraction, classes} when SLOs were given
    schedule    how closely the client kept to its schedule: {send_lag}, each request's send
                time minus its scheduled arrival (open loop, warm-up requests included; null
                in concurrency mode)
    raw         null, or every RequestRecord (with --raw), warm-up ones included

A ClassSummary::

    requests    {sent, ok, failed}           requests that arrived after warm-up
    failures    {reason: {count, example}}   reason: http_<status> or a FAILURE_REASONS key
    ttft, itl, e2e, tpot                     {count, mean, min, p50, p90, p95, p99, max} or null,
                                             over the ok requests (itl: over all their gaps)
    tokens      {prompt, output}             totals over the ok requests
    throughput  {request_rate, sent_rate, output_tokens_per_s, total_tokens_per_s}

Which requests count where (the same rule for the whole run and for each window):

* counts, failures and latencies cover the requests that *arrived* after warm-up (in
  concurrency mode: were sent after warm-up), including those finishing during the drain; a
  window covers the requests that *ended* inside it;
* throughput is the work *completed* inside the measurement interval ``[W, D)`` (or the window),
  whoever sent it, divided by its length: ``request_rate`` is ok requests per second,
  ``output_tokens_per_s`` their output tokens, ``total_tokens_per_s`` prompt plus output;
  ``sent_rate`` is the requests sent per second in the interval (the offered load actually
  achieved by the client).

Versioning: fields may be added within v1; renaming, removing or changing the meaning of a field
bumps the version. Readers should ignore fields they do not know.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from chunktune.core.records import RequestRecord
from chunktune.core.stats import MetricStats

__all__ = [
    "SCHEMA_ID",
    "SUMMARY_JSON_SCHEMA",
    "ArrivalInfo",
    "ClassSummary",
    "Durations",
    "FailureStat",
    "Goodput",
    "GoodputClass",
    "LoadSummary",
    "RequestCounts",
    "ScheduleLag",
    "Slo",
    "Throughput",
    "TokenCounts",
    "Window",
]

SCHEMA_ID = "chunktune.dev/load-summary/v1"


@dataclass(frozen=True)
class FailureStat:
    count: int
    example: str
    """The first failure's message."""


@dataclass(frozen=True)
class RequestCounts:
    sent: int
    ok: int
    failed: int


@dataclass(frozen=True)
class TokenCounts:
    prompt: int
    output: int


@dataclass(frozen=True)
class Throughput:
    request_rate: float
    sent_rate: float
    output_tokens_per_s: float
    total_tokens_per_s: float


def _metric(d: Any) -> MetricStats | None:
    return None if d is None else MetricStats.from_dict(d)


@dataclass(frozen=True)
class ClassSummary:
    requests: RequestCounts
    failures: dict[str, FailureStat]
    ttft: MetricStats | None
    itl: MetricStats | None
    e2e: MetricStats | None
    tpot: MetricStats | None
    tokens: TokenCounts
    throughput: Throughput

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClassSummary:
        return cls(
            requests=RequestCounts(**d["requests"]),
            failures={k: FailureStat(**v) for k, v in d["failures"].items()},
            ttft=_metric(d["ttft"]), itl=_metric(d["itl"]), e2e=_metric(d["e2e"]),
            tpot=_metric(d["tpot"]),
            tokens=TokenCounts(**d["tokens"]),
            throughput=Throughput(**d["throughput"]),
        )


@dataclass(frozen=True)
class Window:
    """The requests that ended in ``[start, end)`` (offsets from the run's start)."""

    index: int
    start: float
    end: float
    warmup: bool
    """The window begins before the end of warm-up."""
    overall: ClassSummary
    classes: dict[str, ClassSummary]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Window:
        return cls(index=int(d["index"]), start=float(d["start"]), end=float(d["end"]),
                   warmup=bool(d["warmup"]), overall=ClassSummary.from_dict(d["overall"]),
                   classes={k: ClassSummary.from_dict(v) for k, v in d["classes"].items()})


@dataclass(frozen=True)
class Slo:
    """Per-request objectives, seconds; ``None`` leaves a metric unconstrained (DistServe's
    goodput definition, as ``vllm bench serve --goodput``)."""

    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None

    def met_by(self, r: RequestRecord) -> bool:
        if not r.ok:
            return False
        checks = ((self.ttft, r.ttft), (self.tpot, r.tpot), (self.e2e, r.e2e))
        return all(limit is None or (v is not None and v <= limit) for limit, v in checks)


@dataclass(frozen=True)
class GoodputClass:
    request_rate: float
    """Requests meeting their SLO completed per second of the measurement interval."""
    fraction: float
    """Share of the measured requests (failed ones included) that met their SLO."""


@dataclass(frozen=True)
class Goodput:
    slos: dict[str, Slo]
    """Class name to SLO; ``"*"`` applies to classes not named."""
    request_rate: float
    fraction: float
    classes: dict[str, GoodputClass]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Goodput:
        return cls(slos={k: Slo(**v) for k, v in d["slos"].items()},
                   request_rate=float(d["request_rate"]), fraction=float(d["fraction"]),
                   classes={k: GoodputClass(**v) for k, v in d["classes"].items()})


@dataclass(frozen=True)
class ArrivalInfo:
    mode: str
    rate: float | None = None
    concurrency: int | None = None


@dataclass(frozen=True)
class Durations:
    configured: float
    warmup: float
    measured: float
    elapsed: float
    drain: float


@dataclass(frozen=True)
class ScheduleLag:
    """How closely the client kept to its schedule (see the module docstring)."""

    send_lag: MetricStats | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ScheduleLag:
        return cls(send_lag=_metric(d.get("send_lag")))


@dataclass(frozen=True)
class LoadSummary:
    target: str
    model: str
    profile: str
    arrival: ArrivalInfo
    seed: int
    started: str
    ended: str
    duration: Durations
    complete: bool
    overall: ClassSummary
    classes: dict[str, ClassSummary]
    windows: list[Window] = field(default_factory=list)
    goodput: Goodput | None = None
    raw: list[RequestRecord] | None = None
    tool: dict[str, str] = field(default_factory=dict)
    schedule: ScheduleLag | None = None
    schema: str = SCHEMA_ID

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"schema": self.schema, "tool": dict(self.tool)}
        for name in ("target", "model", "profile"):
            d[name] = getattr(self, name)
        d["arrival"] = asdict(self.arrival)
        d["seed"] = self.seed
        d["started"], d["ended"] = self.started, self.ended
        d["duration"] = asdict(self.duration)
        d["complete"] = self.complete
        d["overall"] = self.overall.to_dict()
        d["classes"] = {k: v.to_dict() for k, v in self.classes.items()}
        d["windows"] = [w.to_dict() for w in self.windows]
        d["goodput"] = None if self.goodput is None else self.goodput.to_dict()
        d["schedule"] = None if self.schedule is None else self.schedule.to_dict()
        d["raw"] = None if self.raw is None else [r.to_dict() for r in self.raw]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LoadSummary:
        schema = d.get("schema")
        if schema != SCHEMA_ID:
            raise ValueError(f"not a {SCHEMA_ID} document (schema: {schema!r})")
        return cls(
            schema=schema, tool=dict(d.get("tool") or {}),
            target=d["target"], model=d["model"], profile=d["profile"],
            arrival=ArrivalInfo(**d["arrival"]), seed=int(d["seed"]),
            started=d["started"], ended=d["ended"], duration=Durations(**d["duration"]),
            complete=bool(d["complete"]),
            overall=ClassSummary.from_dict(d["overall"]),
            classes={k: ClassSummary.from_dict(v) for k, v in d["classes"].items()},
            windows=[Window.from_dict(w) for w in d.get("windows") or ()],
            goodput=None if d.get("goodput") is None else Goodput.from_dict(d["goodput"]),
            schedule=None if d.get("schedule") is None else ScheduleLag.from_dict(
                d["schedule"]),
            raw=None if d.get("raw") is None else [RequestRecord.from_dict(r) for r in d["raw"]],
        )


# --- JSON Schema -------------------------------------------------------------------------------

_NUM = {"type": "number"}
_NN = {"type": "number", "minimum": 0}
_COUNT = {"type": "integer", "minimum": 0}


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": props,
            "required": list(props) if required is None else required}


def _nullable(ref: str) -> dict[str, Any]:
    return {"oneOf": [{"type": "null"}, {"$ref": ref}]}


_METRIC = _obj({k: _COUNT if k == "count" else _NN
                for k in ("count", "mean", "min", "p50", "p90", "p95", "p99", "max")})
_CLASS = _obj({
    "requests": _obj({"sent": _COUNT, "ok": _COUNT, "failed": _COUNT}),
    "failures": {"type": "object", "additionalProperties": _obj(
        {"count": _COUNT, "example": {"type": "string"}})},
    "ttft": _nullable("#/$defs/metric"), "itl": _nullable("#/$defs/metric"),
    "e2e": _nullable("#/$defs/metric"), "tpot": _nullable("#/$defs/metric"),
    "tokens": _obj({"prompt": _COUNT, "output": _COUNT}),
    "throughput": _obj({"request_rate": _NN, "sent_rate": _NN, "output_tokens_per_s": _NN,
                        "total_tokens_per_s": _NN}),
})
_OPT_NUM = {"type": ["number", "null"]}
_RECORD = _obj({
    "rid": _COUNT, "cls": {"type": "string"}, "arrival": _OPT_NUM, "start": _NUM,
    "prompt_tokens": _COUNT, "max_tokens": _COUNT, "warmup": {"type": "boolean"},
    "ok": {"type": "boolean"}, "reason": {"type": ["string", "null"]},
    "error": {"type": ["string", "null"]}, "status": {"type": ["integer", "null"]},
    "ttft": _OPT_NUM, "e2e": _OPT_NUM, "output_tokens": _COUNT,
    "itl": {"type": "array", "items": _NUM},
}, required=["rid", "cls", "start", "prompt_tokens", "max_tokens", "ok"])
_SLO = _obj({"ttft": _OPT_NUM, "tpot": _OPT_NUM, "e2e": _OPT_NUM}, required=[])

#: JSON Schema (draft 2020-12) of a ``chunktune.dev/load-summary/v1`` document.
SUMMARY_JSON_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://chunktune.dev/schemas/load-summary/v1.json",
    "title": "chunktune load-run summary",
    "type": "object",
    "required": ["schema", "target", "model", "profile", "arrival", "seed", "started", "ended",
                 "duration", "complete", "overall", "classes", "windows", "goodput", "raw"],
    "properties": {
        "schema": {"const": SCHEMA_ID},
        "tool": {"type": "object", "additionalProperties": {"type": "string"}},
        "target": {"type": "string"},
        "model": {"type": "string"},
        "profile": {"type": "string"},
        "arrival": _obj({"mode": {"enum": ["poisson", "constant", "concurrency", "trace"]},
                         "rate": {"type": ["number", "null"], "exclusiveMinimum": 0},
                         "concurrency": {"type": ["integer", "null"], "minimum": 1}},
                        required=["mode"]),
        "seed": {"type": "integer"},
        "started": {"type": "string", "format": "date-time"},
        "ended": {"type": "string", "format": "date-time"},
        "duration": _obj({k: _NN for k in
                          ("configured", "warmup", "measured", "elapsed", "drain")}),
        "complete": {"type": "boolean"},
        "overall": {"$ref": "#/$defs/class"},
        "classes": {"type": "object", "additionalProperties": {"$ref": "#/$defs/class"}},
        "windows": {"type": "array", "items": _obj({
            "index": _COUNT, "start": _NN, "end": _NN, "warmup": {"type": "boolean"},
            "overall": {"$ref": "#/$defs/class"},
            "classes": {"type": "object", "additionalProperties": {"$ref": "#/$defs/class"}},
        })},
        "goodput": {"oneOf": [{"type": "null"}, _obj({
            "slos": {"type": "object", "additionalProperties": _SLO},
            "request_rate": _NN, "fraction": {"type": "number", "minimum": 0, "maximum": 1},
            "classes": {"type": "object", "additionalProperties": _obj(
                {"request_rate": _NN, "fraction": {"type": "number", "minimum": 0,
                                                   "maximum": 1}})},
        })]},
        "schedule": {"oneOf": [{"type": "null"}, _obj(
            {"send_lag": _nullable("#/$defs/metric")}, required=[])]},
        "raw": {"oneOf": [{"type": "null"}, {"type": "array", "items": _RECORD}]},
    },
    "$defs": {"metric": _METRIC, "class": _CLASS},
}
