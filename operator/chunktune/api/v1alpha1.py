"""``ChunkedPrefillTuning`` (``chunktune.dev/v1alpha1``): the manifest a user writes, as
pydantic models. ``chunktune tune FILE`` runs it locally; the operator runs the same object in a
cluster, and :mod:`chunktune.api.crd` generates the CRD schema from these models.

The models check shapes (types, enums, bounds, unknown fields); the checks between fields live in
:mod:`chunktune.api.reader`, whose :func:`~chunktune.api.reader.parse_manifest` is the
entry point. Field names are camelCase in YAML and snake_case in Python; every field's docstring
becomes its description in the CRD.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    PlainValidator,
    PrivateAttr,
    WithJsonSchema,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict, JsonValue
from pydantic_core import PydanticCustomError

from chunktune.api._engine import (
    CPUSpec,
    EngineKind,
    EngineSpec,
    EnvVar,
    EnvVarSource,
    GPUSpec,
    KeyRef,
    ResourceList,
    Resources,
)
from chunktune.api._goals import (
    CONSTRAINT_ITEM_SCHEMA,
    STORED_SPEC,
    Constraint,
    MetricName,
    Objective,
    parse_constraint_string,
)
from chunktune.api._retune import (
    DriftSpec,
    FromPrometheus,
    RetuneSpec,
    slo_watched,
)
from chunktune.api._trace import TraceClassItem, TraceWorkload
from chunktune.api._types import (
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    HTTP_URL,
    RELATIVE_PATH,
    Duration,
    DurationOrZero,
    Model,
    Number,
    check_label_name,
    check_object_name,
    duration_type,
    pattern_str,
    short_repr,
)
from chunktune.api.default_space import default_search_space
from chunktune.core.errors import SpecError
from chunktune.core.flags import FLAGS, MAX_TOKENS, TUNABLE
from chunktune.core.suggest import closest
from chunktune.core.workload import Profile, load_profile, parse_profile

API_GROUP = "chunktune.dev"
API_VERSION = "v1alpha1"
KIND = "ChunkedPrefillTuning"

__all__ = [
    "API_GROUP", "API_VERSION", "KIND", "STORED_SPEC", "Budget", "CPUSpec",
    "ChunkedPrefillTuning", "Constraint", "DriftSpec", "EngineKind", "EngineSpec", "EnvVar",
    "EnvVarSource", "FromPrometheus", "GPUSpec", "KeyRef",
    "MetricName", "MetricsSpec", "ObjectMeta", "Objective", "OutputSpec", "Parameter",
    "PatchDeployment", "PrunerSpec", "ResourceList", "Resources", "RetuneSpec", "SamplerSpec",
    "Spec", "StorageSource", "StrategySpec", "TraceClassItem", "TraceWorkload", "WorkloadSpec",
    "parse_constraint_string", "slo_watched",
]

SamplerName = Literal["tpe", "gp", "nsga2", "random", "grid", "cmaes"]
PrunerName = Literal["none", "median", "percentile", "hyperband"]


#: The forms ``spec.storage`` takes (the CRD's pattern, and the model's): a relative journal
#: path, or an RDB URL of a known scheme with a host and database but no password (sqlite: a
#: relative file).
_RDB_SCHEMES = "postgresql|postgres|mysql|mariadb|oracle|mssql"
_REL = RELATIVE_PATH.removeprefix("^").removesuffix("$")
STORAGE_PATTERN = (
    f"^((journal://|file://)?{_REL}|sqlite:///{_REL}|"
    rf"({_RDB_SCHEMES})(\+[a-z0-9_]+)?://([A-Za-z0-9_.-]+@)?[A-Za-z0-9]([A-Za-z0-9.-]*"
    r"[A-Za-z0-9])?(:[0-9]{1,5})?/[A-Za-z0-9_.-]+(\?[A-Za-z0-9_.=&%-]*)?)$"
)
STORAGE_FORMS = ("a journal path relative to the state directory (studies/x.journal, or "
                 "journal://studies/x.journal; no '..', no absolute path), "
                 "sqlite:///relative.db, or an RDB URL such as postgresql://host:5432/db (no "
                 "password in the URL)")


_STORAGE_RE = re.compile(STORAGE_PATTERN)


def _check_storage(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f"must be a string: {STORAGE_FORMS} (got {short_repr(v)})")
    if len(v) > 1024:
        raise ValueError(f"must be at most 1024 characters (got {len(v)})")
    if _STORAGE_RE.fullmatch(v):
        return v
    scheme, sep, rest = v.partition("://")
    if sep:
        base = scheme.split("+", 1)[0]
        if base not in ("sqlite", "journal", "file", *_RDB_SCHEMES.split("|")):
            raise ValueError(f"unknown storage scheme {base!r}: give an RDB URL "
                             "(sqlite:///study.db, postgresql://host/db, mysql://host/db) or a "
                             "journal file path")
        if ":" in rest.split("@", 1)[0] and "@" in rest:
            raise ValueError("must not carry a password: the operator reads database "
                             "credentials from a Secret (got a URL with user:password@)")
    elif v.startswith("/"):
        raise ValueError(f"must be relative to the operator's state directory, not an absolute "
                         f"path (got {short_repr(v)})")
    if ".." in re.split(r"[/\\]", v):
        raise ValueError(f"must not contain '..': journals stay inside the operator's state "
                         f"directory (got {short_repr(v)})")
    raise ValueError(f"must be {STORAGE_FORMS} (got {short_repr(v)})")


#: ``spec.storage``: checked by the model and by the CRD's pattern alike.
StorageRef = Annotated[str, PlainValidator(_check_storage), WithJsonSchema(
    {"type": "string", "minLength": 1, "maxLength": 1024, "pattern": STORAGE_PATTERN})]


def _immutable(what: str) -> dict[str, Any]:
    return {"x-kubernetes-validations": [{
        "rule": "self == oldSelf",
        "message": f"{what} is immutable: changing it would invalidate the running study; "
                   "create a new ChunkedPrefillTuning instead",
    }]}


# ---- search space -----------------------------------------------------------------------------


def _cel_number(v: float) -> str:
    return repr(float(v))


def _flag_value_rule(name: str) -> JsonDict:
    """The CEL rule holding a parameter of flag ``name`` to the values the engine takes."""
    f = FLAGS[name]

    def ok(x: str) -> str:
        parts = [] if f.minimum is None else [
            f"{x} {'>' if f.minimum_exclusive else '>='} {_cel_number(f.minimum)}"]
        if f.maximum is not None:
            parts.append(f"{x} <= {_cel_number(f.maximum)}")
        parts += [f"{x} != {_cel_number(bad)}" for bad in f.forbidden]
        if f.kind == "int":
            parts.append(f"{x} == double(int({x}))")
        inside = " && ".join(parts) or "true"
        return " || ".join([f"({inside})", *(f"{x} == {_cel_number(v)}" for v in f.special)])

    rule = (f"self.name != '{name}' || ((!has(self.low) || {ok('self.low')}) && "
            f"(!has(self.high) || {ok('self.high')}) && "
            f"(!has(self.choices) || self.choices.all(c, {ok('c')})))")
    whole = "whole numbers " if f.kind == "int" else ""
    return {"rule": rule, "message": f"{name} takes {whole}values {f.range_text()}"}


def _parameter_rules() -> list[JsonValue]:
    ints = ", ".join(f"'{n}'" for n in TUNABLE if FLAGS[n].kind == "int")
    switches = ", ".join(f"'{n}'" for n in SWITCHES)
    return [
        {"rule": f"self.name in [{switches}] ? !has(self.choices) && !has(self.type) && "
                 "!has(self.low) && !has(self.high) && !has(self.step) : has(self.choices) ? "
                 "!has(self.type) && !has(self.low) && !has(self.high) && !has(self.step) : "
                 "has(self.type) && has(self.low) && has(self.high)",
         "message": "give either choices, or type with low and high; a switch "
                    f"({', '.join(SWITCHES)}) only its name (both settings are searched)"},
        {"rule": "!has(self.low) || !has(self.high) || self.low <= self.high",
         "message": "low must be <= high"},
        {"rule": "!has(self.log) || !self.log || !has(self.step) || self.step == 1.0",
         "message": "log: true needs step 1 (Optuna cannot sample a stepped log scale)"},
        {"rule": "!has(self.log) || !self.log || !has(self.low) || self.low > 0.0",
         "message": "log: true needs low > 0"},
        {"rule": f"!has(self.type) || self.type == (self.name in [{ints}] ? 'int' : 'float')",
         "message": "type must be int for a token or sequence count, float for "
                    "gpu-memory-utilization"},
        {"rule": "!has(self.step) || !has(self.low) || !has(self.high) || "
                 f"(self.high - self.low) / self.step <= {_cel_number(GRID_MAX)}",
         "message": f"a range may have at most {GRID_MAX} steps; use a larger step"},
        *(_flag_value_rule(n) for n in TUNABLE if n not in SWITCHES),
    ]


#: The most values one stepped range may have (a grid of more is a bomb, not a search).
GRID_MAX = 100_000
_VALUE_BOUNDS: JsonDict = {"minimum": -1, "maximum": MAX_TOKENS}


#: The tunable flags that are switches (``--async-scheduling`` / ``--no-async-scheduling``): a
#: parameter gives only the name, and both settings are searched.
SWITCHES: tuple[str, ...] = tuple(n for n in TUNABLE if FLAGS[n].kind == "bool")


class Parameter(Model):
    """One searched engine flag: an int or float range (``type``, ``low``, ``high``), a
    list of ``choices``, or a switch by its name alone (``async-scheduling``: on and off)."""

    model_config = Model.model_config | {"json_schema_extra": {
        "x-kubernetes-validations": _parameter_rules()}}

    name: str = Field(json_schema_extra={"enum": list(TUNABLE)})
    """The engine flag without its leading dashes (``max-num-batched-tokens``)."""
    type: Literal["int", "float"] | None = None
    """Range type."""
    low: Number | None = Field(default=None, json_schema_extra=_VALUE_BOUNDS)
    """Smallest value (inclusive)."""
    high: Number | None = Field(default=None, json_schema_extra=_VALUE_BOUNDS)
    """Largest value (inclusive)."""
    step: Number | None = Field(
        default=None, json_schema_extra={"minimum": 0, "exclusiveMinimum": True,
                                         "maximum": MAX_TOKENS})
    """Spacing of the values. Default: 1 for int, continuous for float."""
    log: bool = False
    """Sample on a log scale (needs ``low > 0`` and step 1)."""
    choices: list[Annotated[Number, Field(json_schema_extra=_VALUE_BOUNDS)]] | None = Field(
        None, min_length=1, max_length=256, json_schema_extra={"x-kubernetes-list-type": "set"}
    )
    """An explicit list of values instead of a range."""

    @field_validator("name", mode="before")
    @classmethod
    def _known_flag(cls, v: Any) -> Any:
        if isinstance(v, str) and v.startswith("-"):
            raise ValueError(f"give the flag without its leading dashes ({v.lstrip('-')!r})")
        if isinstance(v, str) and v not in TUNABLE:
            hint = closest(v, TUNABLE)
            tail = f"did you mean {hint!r}?" if hint else f"tunable: {', '.join(TUNABLE)}"
            if not hint and "chunk" in v:
                tail = ("vLLM has no prefill chunk-size flag: search max-num-batched-tokens (the "
                        "step token budget) and long-prefill-token-threshold (the per-request "
                        "cap); SGLang's is chunked-prefill-size")
            raise PydanticCustomError("unknown_flag", "unknown flag {flag}; " + tail,
                                      {"flag": repr(v)})
        return v

    @property
    def effective_step(self) -> int | float | None:
        """The step Optuna gets: 1 for an int range without one."""
        if self.step is None and self.type == "int":
            return 1
        return self.step

    @property
    def is_switch(self) -> bool:
        """Whether the flag is a switch (:data:`SWITCHES`): its values are off and on."""
        return self.name in SWITCHES

    @property
    def is_finite(self) -> bool:
        """Whether the parameter has finitely many values (choices, a switch, int or stepped
        float)."""
        return self.choices is not None or self.is_switch or self.effective_step is not None

    def grid_values(self) -> list[bool | int | float]:
        """Every value, for a grid search (choices, off and on, or low..high by step)."""
        if self.is_switch:
            return [False, True]
        if self.choices is not None:
            return list(self.choices)
        step = self.effective_step
        if step is None or self.low is None or self.high is None:
            raise ValueError(f"{self.name} is a continuous range: it has no grid")
        n = int((self.high - self.low) // step + 1e-9) + 1
        values = [self.low + i * step for i in range(n)]
        return [int(v) for v in values] if self.type == "int" else values


# ---- workload ---------------------------------------------------------------------------------


def _seconds(x: str) -> str:
    """CEL: a duration field (an integer of seconds, or a duration string) as a duration."""
    return f"(type({x}) == string ? duration({x}) : duration(string({x}) + 's'))"


class WorkloadSpec(Model):
    """The traffic each trial replays: a profile (``loadtest/profiles`` format), a request
    trace, or a profile derived from the deployment's metrics, plus overrides."""

    model_config = Model.model_config | {"json_schema_extra": {"x-kubernetes-validations": [
        {"rule": "(has(self.profile) ? 1 : 0) + (has(self.inline) ? 1 : 0) + "
                 "(has(self.trace) ? 1 : 0) + (has(self.fromPrometheus) ? 1 : 0) == 1",
         "message": "give exactly one of profile, inline, trace or fromPrometheus"},
        {"rule": "!(has(self.rate) && has(self.concurrency))",
         "message": "give rate or concurrency, not both"},
        {"rule": "!has(self.trace) || !(has(self.rate) || has(self.concurrency))",
         "message": "a trace replays its own arrival times: set trace.speedup or "
                    "trace.rateScale instead of rate or concurrency"},
        {"rule": "!has(self.warmup) || !has(self.duration) || "
                 f"{_seconds('self.warmup')} < {_seconds('self.duration')}",
         "message": "warmup must be shorter than duration"},
    ]}}

    profile: pattern_str(  # type: ignore[valid-type]
        RELATIVE_PATH, 1024, "a shipped profile name (mixed, chat, long-context, rag, smoke) or "
        "a relative path to a profile file: names of letters, digits, '_', '-' and '.', no "
        "'..' and no absolute path") | None = None
    """A shipped profile name (``mixed``, ``chat``, ``long-context``, ``rag``, ``smoke``) or a
    relative path to a profile YAML file."""
    inline: dict[str, Any] | None = Field(default=None,
                                          json_schema_extra={"x-chunktune-schema": "profile"})
    """A profile mapping inline (``classes``, ``arrival``, ``duration``, ...)."""
    trace: TraceWorkload | None = None
    """A request trace replayed at its own arrival times (docs/traffic.md)."""
    from_prometheus: FromPrometheus | None = None
    """Derive the profile from the deployment's vLLM metrics in Prometheus at study start
    (classes ``short`` and ``long``)."""
    duration: Duration | None = None
    """Override: how long each trial sends traffic (a trace: cut to this; default its
    span)."""
    warmup: DurationOrZero | None = None
    """Override: requests arriving before this are not measured."""
    rate: float | None = Field(default=None, gt=0, le=100_000)
    """Override: open-loop arrival rate, requests per second."""
    concurrency: int | None = Field(default=None, ge=1, le=100_000)
    """Override: closed-loop mode with this many requests in flight."""
    seed: int | None = Field(default=None, ge=0, le=2**32 - 1)
    """Override: the profile's random seed."""
    load_workers: int = Field(default=0, ge=0, le=64)
    """Locust workers of each trial's load: 0 (default) runs Locust in one process; N runs
    Locust's master and N workers (local processes; in a cluster a worker Job beside the load
    Job), the same arrival schedule split across them, their records merged."""

    _base_dir: Path | None = PrivateAttr(None)
    _trace_data: str | None = PrivateAttr(None)
    _derived: Profile | None = PrivateAttr(None)

    def set_trace_data(self, data: str) -> None:
        """The text of ``trace.configMapKeyRef``, read by the operator."""
        self._trace_data = data

    @property
    def trace_pending(self) -> bool:
        """The trace is in a ConfigMap not read yet: its requests (and class names) are known
        only once the operator reads it."""
        return self.trace is not None and self.trace.config_map_key_ref is not None \
            and self._trace_data is None

    @property
    def derived(self) -> Profile | None:
        """The profile ``fromPrometheus`` derived, once given (:meth:`use_derived`)."""
        return self._derived

    def use_derived(self, profile: Profile) -> None:
        """What ``fromPrometheus`` resolves to from now on: the profile derived at study
        start (kept in the study)."""
        self._derived = profile

    def resolve(self) -> Profile:
        """The profile with the overrides applied. Raises :class:`SpecError` with paths under
        ``spec.workload`` (for ``fromPrometheus``, until the derived profile is given:
        :meth:`use_derived`)."""
        if self.from_prometheus is not None:
            if self._derived is None:
                raise SpecError("is derived from Prometheus when the study starts; nothing was "
                                "derived yet", field="spec.workload.fromPrometheus")
            profile = self._derived
        elif self.inline is not None:
            profile = parse_profile(self.inline, source="spec.workload.inline",
                                    base_dir=self._base_dir)
        elif self.trace is not None:
            profile = _trace_profile(self.trace, self._trace_data, self._base_dir)
        else:
            profile = _load_profile(str(self.profile), self._base_dir)
        try:
            return profile.with_overrides(duration=self.duration, warmup=self.warmup,
                                          rate=self.rate, concurrency=self.concurrency,
                                          seed=self.seed)
        except SpecError as e:
            raise SpecError([(f"spec.workload.{p}", m) for p, m in e.problems]) from e


def _trace_profile(trace: TraceWorkload, data: str | None, base_dir: Path | None) -> Profile:
    ref = trace.config_map_key_ref
    if ref is not None and data is None:
        raise SpecError(f"the ConfigMap {ref.name!r} is read by the operator when the study "
                        "starts; give the trace as file for `chunktune tune`",
                        field="spec.workload.trace.configMapKeyRef")
    name = Path(trace.file).stem if trace.file is not None else ref.name if ref else "trace"
    where = "spec.workload.trace.configMapKeyRef" if ref is not None else \
        "spec.workload.trace.file"
    try:
        return parse_profile({"name": name, "trace": trace.core(data)}, source="spec.workload",
                             base_dir=base_dir)
    except SpecError as e:
        raise SpecError([(where if p in ("spec.workload.trace.file", "spec.workload.trace.data")
                          else p, m) for p, m in e.problems]) from e


def _load_profile(ref: str, base_dir: Path | None) -> Profile:
    path = Path(ref)
    if base_dir is not None and not path.is_absolute() and (
            "/" in ref or path.suffix in (".yaml", ".yml")):
        path = base_dir / path
    try:
        return load_profile(path if path.suffix else ref)
    except SpecError as e:
        where = "spec.workload.profile"
        raise SpecError([(where, m) if p in ("--workload", "") else (where, f"{p}: {m}")
                         for p, m in e.problems]) from e


# ---- budget, sampler, pruner, outputs ---------------------------------------------------------


class Budget(Model):
    """How many trials the study may run, and when it stops early."""

    model_config = Model.model_config | {"json_schema_extra": {"x-kubernetes-validations": [
        {"rule": "!has(self.parallelism) || self.parallelism <= "
                 "(has(self.maxTrials) ? self.maxTrials : 30)",
         "message": "parallelism must be <= maxTrials"},
    ]}}

    max_trials: int = Field(default=30, ge=1, le=10000)
    """Trials to run (the baseline trial included)."""
    parallelism: int = Field(default=1, ge=1, le=64)
    """Trials running at once (each needs its own GPUs)."""
    max_failed_trials: int = Field(default=5, ge=0, le=10000)
    """Stop after this many crashed trials (infeasible or pruned trials do not count)."""
    trial_timeout: Duration = 1200.0
    """Wall-clock limit of one trial, engine start-up included. Default: 20m."""
    max_duration: duration_type(ceiling=30 * 24 * 3600) | None = None  # type: ignore[valid-type]
    """Wall-clock limit of the whole study."""
    prescreen: bool = True
    """Skip points the simulator's memory model predicts to fail at start-up."""
    patience: int | None = Field(default=None, ge=1, le=10000)
    """Stop when this many trials in a row improve the best by less than ``minImprovement``."""
    min_improvement: float = Field(default=0.01, ge=0, lt=1)
    """Relative improvement that resets ``patience`` (0.01 = 1%)."""


StrategyName = Literal["real", "twin"]


class StrategySpec(Model):
    """How the study spends real engine time.

    ``real`` (default): every trial starts the engine. ``twin``: a few real trials calibrate a
    simulator on the engine's own step log, the full search runs in that twin, and only the
    twin's best configurations run for real (phases ``calibrate``, ``search``, ``confirm``,
    then optional ``refine`` rounds and a ``recheck`` of the best measured).
    ``budget.maxTrials`` counts real trials in both; the answer is always a measured
    configuration, never a prediction."""

    model_config = Model.model_config | {"json_schema_extra": {"x-kubernetes-validations": [
        {"rule": "(has(self.calibrationTrials) ? self.calibrationTrials : 4) >= 2",
         "message": "calibrationTrials must be >= 2 (the step-time fit needs several step "
                    "shapes)"},
    ]}}

    name: StrategyName = "real"
    """``real`` (every trial runs the engine) or ``twin`` (twin-first)."""
    calibration_trials: int = Field(default=4, ge=2, le=64)
    """Twin: real trials that calibrate the twin (the engine's defaults plus points spread
    over the search space)."""
    simulated_trials: int = Field(default=200, ge=1, le=100000)
    """Twin: simulated trials per search round."""
    simulated_loads: int = Field(default=8, ge=1, le=64)
    """Twin: each simulated trial replays this many independent draws of the workload (its
    seed, then the next ones) and scores the mean of their metrics. A tail percentile of one
    short load lands on either side of a cliff (a long prefill's step beside the decodes)
    from one draw to the next; the mean over draws is what the configuration gives, and
    what the real trials measure on average."""
    confirm_trials: int = Field(default=3, ge=1, le=64)
    """Twin: the twin's best configurations (its Pareto front for several objectives) run for
    real after each search round."""
    refine_rounds: int = Field(default=1, ge=0, le=16)
    """Twin: rounds that recalibrate on every real trial so far, search again and confirm
    again; stop early when the measured best stops improving."""
    recheck_trials: int = Field(default=0, ge=0, le=16)
    """Both strategies: real trials kept out of ``budget.maxTrials`` for the end: the best
    measured configurations (by the first objective; this many, one more measurement each) run
    once more, and the answer is the best by the mean of each one's measurements. The best of
    many single measurements of a noisy objective (a p99 on a shared node) is the luckiest;
    0 (default) answers from single measurements."""
    max_twin_error: float = Field(default=0.25, gt=0, le=10)
    """Twin: when the twin's median error on any goal over the confirmed trials is above this
    (an objective's relative error; a constraint metric's miss measured against its bound
    while the measurement is inside it: ``status.twin.goalError``), the study warns that the
    twin is not trustworthy and spends what is left of ``budget.maxTrials`` on ordinary real
    trials."""


class SamplerSpec(Model):
    """The Optuna sampler that proposes trials."""

    name: SamplerName = "tpe"
    """``tpe`` (default), ``gp``, ``nsga2``, ``random``, ``grid`` or ``cmaes``."""
    seed: int = Field(default=0, ge=0, le=2**32 - 1)
    """Sampler seed, so a study reproduces (0 to 2^32-1, numpy's range)."""


class PrunerSpec(Model):
    """Stops unpromising trials early, from their intermediate measurements."""

    name: PrunerName = "median"
    """``none``, ``median`` (default; ``none`` for several objectives, which Optuna cannot
    prune), ``percentile`` or ``hyperband``."""
    warmup_windows: int = Field(default=2, ge=0, le=10000)
    """Measurement windows a trial reports before it may be pruned."""


class StorageSource(Model):
    """Where the operator reads a study's storage URL from."""

    secret_key_ref: KeyRef
    """A key of a Secret in the tuning's namespace holding the URL (e.g.
    ``postgresql://user:password@host/db``)."""


class MetricsSpec(Model):
    """Where engine metrics are read from."""

    prometheus_url: pattern_str(  # type: ignore[valid-type]
        HTTP_URL, 1024, "an http:// or https:// URL of a host (no credentials), e.g. "
        "http://prometheus-operated.monitoring:9090") | None = Field(
        default=None, alias="prometheusURL")
    """A Prometheus server to query; default: scrape each trial's ``/metrics`` directly."""
    scrape_interval: duration_type(ceiling=3600) | None = None  # type: ignore[valid-type]
    """How often engine metrics are sampled."""


class PatchDeployment(Model):
    """A Deployment to update with the best flags when the study succeeds."""

    name: str = Field(min_length=1, max_length=253,
                      json_schema_extra={"pattern": DNS1123_SUBDOMAIN})
    """Deployment name (same namespace)."""
    container: str | None = Field(default=None, min_length=1, max_length=63,
                                  json_schema_extra={"pattern": DNS1123_LABEL})
    """Container whose args to patch. Default: the first."""

    _name = field_validator("name")(lambda v: check_object_name(v, "Deployment name"))
    _container = field_validator("container")(
        lambda v: v if v is None else check_label_name(v, "container name"))


class OutputSpec(Model):
    """Where the result goes besides the status."""

    config_map: str | None = Field(default=None, min_length=1, max_length=253,
                                   json_schema_extra={"pattern": DNS1123_SUBDOMAIN})
    """Write the best flags and metrics to this ConfigMap."""
    patch_deployment: PatchDeployment | None = None
    """Patch the best flags into this Deployment."""

    _cm = field_validator("config_map")(
        lambda v: v if v is None else check_object_name(v, "ConfigMap name"))


def _default_objectives() -> list[Objective]:
    return [Objective(metric="ttft_p99", direction="minimize")]


class Spec(Model):
    """What to tune, against which traffic, for which goal, within which budget."""

    model_config = Model.model_config | {"json_schema_extra": {"x-kubernetes-validations": [
        {"rule": "has(self.searchSpace) == has(oldSelf.searchSpace)",
         "message": "searchSpace cannot be added or removed after creation: it would "
                    "invalidate the running study"},
        {"rule": "has(self.objectives) == has(oldSelf.objectives)",
         "message": "objectives cannot be added or removed after creation: it would "
                    "invalidate the running study"},
        {"rule": "!has(self.searchSpace) || !has(self.engine.args) || self.searchSpace.all(p, "
                 "!self.engine.args.exists(a, a == '--' + p.name || "
                 "a.startsWith('--' + p.name + '=')))",
         "message": "a searched flag must not also be fixed in engine.args"},
    ]}}

    engine: EngineSpec = Field(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "self.model == oldSelf.model",
         "message": "engine.model is immutable: create a new ChunkedPrefillTuning instead"},
        {"rule": "(has(self.kind) ? self.kind : 'vllm') == "
                 "(has(oldSelf.kind) ? oldSelf.kind : 'vllm')",
         "message": "engine.kind is immutable: create a new ChunkedPrefillTuning instead"},
    ]})
    """The inference server each trial starts."""
    search_space: list[Parameter] | None = Field(
        None, min_length=1, max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                           "x-kubernetes-validations": [
                               *_immutable("searchSpace")["x-kubernetes-validations"],
                               {"rule": "self.all(p, self.exists_one(q, q.name == p.name))",
                                "message": "each flag may be searched once"}]},
    )
    """The flags to search. Default: max-num-batched-tokens 512..16384 step 512,
    long-prefill-token-threshold in [0, 256, 512, 1024, 2048, 4096], max-num-seqs in
    [64, 128, 256, 512]."""
    workload: WorkloadSpec = Field(json_schema_extra=_immutable("workload"))
    """The traffic each trial replays."""
    objectives: Annotated[list[Objective], Field(min_length=1, max_length=8)] = Field(
        default_factory=_default_objectives, json_schema_extra=_immutable("objectives"))
    """What to optimize; several objectives make a Pareto study. Default: minimize
    ttft_p99."""
    constraints: list[Annotated[Constraint, WithJsonSchema(CONSTRAINT_ITEM_SCHEMA)]] = Field(
        default_factory=list, max_length=32)
    """Service-level objectives a trial must meet to be feasible."""
    budget: Budget = Field(default_factory=Budget)
    """Trial counts and time limits."""
    sampler: SamplerSpec = Field(default_factory=SamplerSpec)
    """How trials are proposed."""
    strategy: StrategySpec = Field(default_factory=StrategySpec)
    """All-real trials (default) or twin-first: search in a calibrated simulator, confirm the
    best few for real."""
    pruner: PrunerSpec = Field(default_factory=PrunerSpec)
    """How trials are stopped early."""
    storage: StorageRef | None = None
    """Optuna storage: a journal file path relative to the state directory
    (``studies/llama.journal``), or an RDB URL (``sqlite:///study.db``,
    ``postgresql://host:5432/db``; no password: credentials come from the operator). Default:
    chosen by the runner."""
    storage_from: StorageSource | None = None
    """Operator only: a Secret's key holding the Optuna storage URL (a database URL with
    credentials) instead of ``storage``, or, with ``storage`` set to a database URL, that
    URL's password."""
    metrics: MetricsSpec = Field(default_factory=MetricsSpec)
    """Where engine metrics come from."""
    output: OutputSpec = Field(default_factory=OutputSpec)
    """Where the result goes besides the status."""
    retune: RetuneSpec | None = None
    """Keep the deployment tuned: watch its workload after the study and re-tune when it
    drifts (needs ``workload.fromPrometheus``)."""
    suspend: bool = False
    """Pause the study: no new trials start."""

    @field_serializer("constraints")
    def _constraints_out(self, constraints: list[Constraint]) -> list[str]:
        """Constraints in the compact string form, the one the CRD takes."""
        return [c.manifest_text() for c in constraints]

    @model_validator(mode="after")
    def _defaults(self) -> Spec:
        if self.search_space is None:
            self.search_space = [Parameter.model_validate(p) for p in default_search_space(
                self.engine.kind, self.engine.effective_vllm_version())]
        if len(self.objectives) > 1 and "name" not in self.pruner.model_fields_set:
            self.pruner = PrunerSpec(name="none", warmup_windows=self.pruner.warmup_windows)
        return self

    @property
    def parameters(self) -> list[Parameter]:
        """The search space (defaults filled in)."""
        return list(self.search_space or ())

    def engine_fixed_args(self) -> list[str]:
        """The engine flags every trial shares: ``--tensor-parallel-size N`` followed by
        ``engine.args``. The model, port and served model name are separate fields."""
        return ["--tensor-parallel-size", str(self.engine.tensor_parallel_size),
                *self.engine.args]


class ObjectMeta(Model):
    """The object's name and labels; other metadata (uid, resourceVersion, ...) is ignored."""

    model_config = Model.model_config | {"extra": "ignore"}

    name: str = Field(min_length=1, max_length=253)
    """Object name; also names the Optuna study."""
    namespace: str | None = Field(default=None, min_length=1, max_length=63)
    """Namespace the trials run in."""
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    generation: int | None = None

    _name = field_validator("name")(check_object_name)
    _ns = field_validator("namespace")(
        lambda v: v if v is None else check_label_name(v, "namespace"))


class ChunkedPrefillTuning(Model):
    """A study that tunes a vLLM deployment's chunked-prefill flags by measuring them."""

    api_version: Literal["chunktune.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["ChunkedPrefillTuning"]
    metadata: ObjectMeta
    spec: Spec
    status: dict[str, Any] | None = None
    """Written by the operator; ignored on input."""

    @property
    def name(self) -> str:
        return self.metadata.name

    def to_manifest(self) -> dict[str, Any]:
        """The object as a manifest mapping (camelCase, defaults filled in, no status)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True,
                               exclude={"status"})
