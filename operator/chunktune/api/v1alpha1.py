"""``ChunkedPrefillTuning`` (``chunktune.dev/v1alpha1``): the manifest a user writes, as
pydantic models. ``chunktune tune FILE`` runs it locally; the operator runs the same object in a
cluster, and :mod:`chunktune.api.crd` generates the CRD schema from these models.

The models check shapes (types, enums, bounds, unknown fields); the checks between fields live in
:mod:`chunktune.api.validation`, whose :func:`~chunktune.api.validation.parse_manifest` is the
entry point. Field names are camelCase in YAML and snake_case in Python; every field's docstring
becomes its description in the CRD.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, WithJsonSchema, field_validator, model_validator
from pydantic_core import PydanticCustomError

from chunktune.api._engine import (
    DEFAULT_SIM_IMAGE,
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
    Constraint,
    MetricName,
    Objective,
    parse_constraint_string,
)
from chunktune.api._types import Duration, Model, Number, check_label_name, check_object_name
from chunktune.api.flags import DEFAULT_SEARCH_SPACE
from chunktune.core.errors import SpecError
from chunktune.core.flags import TUNABLE
from chunktune.core.suggest import closest
from chunktune.core.workload import Profile, load_profile, parse_profile

API_GROUP = "chunktune.dev"
API_VERSION = "v1alpha1"
KIND = "ChunkedPrefillTuning"

__all__ = [
    "API_GROUP", "API_VERSION", "DEFAULT_SIM_IMAGE", "KIND", "Budget", "CPUSpec",
    "ChunkedPrefillTuning",
    "Constraint", "EngineKind", "EngineSpec", "EnvVar", "EnvVarSource", "GPUSpec", "KeyRef",
    "MetricName", "MetricsSpec", "ObjectMeta", "Objective", "OutputSpec", "Parameter",
    "PatchDeployment", "PrunerSpec", "ResourceList", "Resources", "SamplerSpec", "Spec",
    "StorageSource", "WorkloadSpec", "parse_constraint_string",
]

SamplerName = Literal["tpe", "gp", "nsga2", "random", "grid", "cmaes"]
PrunerName = Literal["none", "median", "percentile", "hyperband"]


def _immutable(what: str) -> dict[str, Any]:
    return {"x-kubernetes-validations": [{
        "rule": "self == oldSelf",
        "message": f"{what} is immutable: changing it would invalidate the running study; "
                   "create a new ChunkedPrefillTuning instead",
    }]}


# ---- search space -----------------------------------------------------------------------------


class Parameter(Model):
    """One searched engine flag: an int or float range (``type``, ``low``, ``high``), or a
    list of ``choices``."""

    model_config = Model.model_config | {"json_schema_extra": {"x-kubernetes-validations": [
        {"rule": "has(self.choices) ? !has(self.type) && !has(self.low) && !has(self.high) "
                 "&& !has(self.step) : has(self.type) && has(self.low) && has(self.high)",
         "message": "give either choices, or type with low and high"},
        {"rule": "!has(self.low) || !has(self.high) || self.low <= self.high",
         "message": "low must be <= high"},
        {"rule": "!has(self.log) || !self.log || !has(self.step) || self.step == 1.0",
         "message": "log: true needs step 1 (Optuna cannot sample a stepped log scale)"},
    ]}}

    name: str = Field(json_schema_extra={"enum": list(TUNABLE)})
    """The engine flag without its leading dashes (``max-num-batched-tokens``)."""
    type: Literal["int", "float"] | None = None
    """Range type."""
    low: Number | None = None
    """Smallest value (inclusive)."""
    high: Number | None = None
    """Largest value (inclusive)."""
    step: Number | None = Field(
        default=None, json_schema_extra={"minimum": 0, "exclusiveMinimum": True})
    """Spacing of the values. Default: 1 for int, continuous for float."""
    log: bool = False
    """Sample on a log scale (needs ``low > 0`` and step 1)."""
    choices: list[Number] | None = Field(
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
    def is_finite(self) -> bool:
        """Whether the parameter has finitely many values (choices, int or stepped float)."""
        return self.choices is not None or self.effective_step is not None

    def grid_values(self) -> list[int | float]:
        """Every value, for a grid search (choices, or low..high by step)."""
        if self.choices is not None:
            return list(self.choices)
        step = self.effective_step
        if step is None or self.low is None or self.high is None:
            raise ValueError(f"{self.name} is a continuous range: it has no grid")
        n = int((self.high - self.low) // step + 1e-9) + 1
        values = [self.low + i * step for i in range(n)]
        return [int(v) for v in values] if self.type == "int" else values


# ---- workload ---------------------------------------------------------------------------------


class WorkloadSpec(Model):
    """The traffic each trial replays: a profile (``loadtest/profiles`` format), plus
    overrides."""

    model_config = Model.model_config | {"json_schema_extra": {"x-kubernetes-validations": [
        {"rule": "has(self.profile) != has(self.inline)",
         "message": "give exactly one of profile or inline"},
        {"rule": "!(has(self.rate) && has(self.concurrency))",
         "message": "give rate or concurrency, not both"},
    ]}}

    profile: str | None = Field(default=None, min_length=1, max_length=1024)
    """A shipped profile name (``mixed``, ``chat``, ``long-context``, ``smoke``) or a path to a
    profile YAML file."""
    inline: dict[str, Any] | None = None
    """A profile mapping inline (``classes``, ``arrival``, ``duration``, ...)."""
    duration: Duration | None = None
    """Override: how long each trial sends traffic."""
    warmup: Duration | None = None
    """Override: requests arriving before this are not measured."""
    rate: float | None = Field(default=None, gt=0)
    """Override: open-loop arrival rate, requests per second."""
    concurrency: int | None = Field(default=None, ge=1)
    """Override: closed-loop mode with this many requests in flight."""
    seed: int | None = None
    """Override: the profile's random seed."""

    _base_dir: Path | None = PrivateAttr(None)

    def resolve(self) -> Profile:
        """The profile with the overrides applied. Raises :class:`SpecError` with paths under
        ``spec.workload``."""
        if self.inline is not None:
            profile = parse_profile(self.inline, source="spec.workload.inline")
        else:
            profile = _load_profile(str(self.profile), self._base_dir)
        return profile.with_overrides(duration=self.duration, warmup=self.warmup,
                                      rate=self.rate, concurrency=self.concurrency,
                                      seed=self.seed)


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
                         for p, m in e.problems]) from None


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
    max_failed_trials: int = Field(default=5, ge=0)
    """Stop after this many crashed trials (infeasible or pruned trials do not count)."""
    trial_timeout: Duration = 1200.0
    """Wall-clock limit of one trial, engine start-up included. Default: 20m."""
    max_duration: Duration | None = None
    """Wall-clock limit of the whole study."""
    prescreen: bool = True
    """Skip points the simulator's memory model predicts to fail at start-up."""
    patience: int | None = Field(default=None, ge=1)
    """Stop when this many trials in a row improve the best by less than ``minImprovement``."""
    min_improvement: float = Field(default=0.01, ge=0, lt=1)
    """Relative improvement that resets ``patience`` (0.01 = 1%)."""


class SamplerSpec(Model):
    """The Optuna sampler that proposes trials."""

    name: SamplerName = "tpe"
    """``tpe`` (default), ``gp``, ``nsga2``, ``random``, ``grid`` or ``cmaes``."""
    seed: int = 0
    """Sampler seed, so a study reproduces."""


class PrunerSpec(Model):
    """Stops unpromising trials early, from their intermediate measurements."""

    name: PrunerName = "median"
    """``none``, ``median`` (default; ``none`` for several objectives, which Optuna cannot
    prune), ``percentile`` or ``hyperband``."""
    warmup_windows: int = Field(default=2, ge=0)
    """Measurement windows a trial reports before it may be pruned."""


class StorageSource(Model):
    """Where the operator reads a study's storage URL from."""

    secret_key_ref: KeyRef
    """A key of a Secret in the tuning's namespace holding the URL (e.g.
    ``postgresql://user:password@host/db``)."""


class MetricsSpec(Model):
    """Where engine metrics are read from."""

    prometheus_url: str | None = Field(default=None, alias="prometheusURL", max_length=1024)
    """A Prometheus server to query; default: scrape each trial's ``/metrics`` directly."""
    scrape_interval: Duration | None = None
    """How often engine metrics are sampled."""


class PatchDeployment(Model):
    """A Deployment to update with the best flags when the study succeeds."""

    name: str = Field(min_length=1, max_length=253)
    """Deployment name (same namespace)."""
    container: str | None = Field(default=None, min_length=1, max_length=63)
    """Container whose args to patch. Default: the first."""

    _name = field_validator("name")(lambda v: check_object_name(v, "Deployment name"))
    _container = field_validator("container")(
        lambda v: v if v is None else check_label_name(v, "container name"))


class OutputSpec(Model):
    """Where the result goes besides the status."""

    config_map: str | None = Field(default=None, min_length=1, max_length=253)
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
        {"rule": f"has(self.{f}) == has(oldSelf.{f})",
         "message": f"{f} cannot be added or removed after creation: it would invalidate the "
                    "running study"}
        for f in ("searchSpace", "objectives")
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
                           **_immutable("searchSpace")},
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
    pruner: PrunerSpec = Field(default_factory=PrunerSpec)
    """How trials are stopped early."""
    storage: str | None = Field(default=None, min_length=1, max_length=1024)
    """Optuna storage: an RDB URL (``sqlite:///study.db``, ``postgresql://...``) or a journal
    file path. Default: chosen by the runner. In the operator, journal paths are confined to
    its state directory and RDB URLs need its ``storage.allowDatabaseURLs`` and no inline
    password."""
    storage_from: StorageSource | None = None
    """Operator only: the Optuna storage URL from a Secret's key (a database URL with
    credentials), instead of ``storage``."""
    metrics: MetricsSpec = Field(default_factory=MetricsSpec)
    """Where engine metrics come from."""
    output: OutputSpec = Field(default_factory=OutputSpec)
    """Where the result goes besides the status."""
    suspend: bool = False
    """Pause the study: no new trials start."""

    @model_validator(mode="after")
    def _defaults(self) -> Spec:
        if self.search_space is None:
            self.search_space = [Parameter.model_validate(p)
                                 for p in DEFAULT_SEARCH_SPACE[self.engine.kind]]
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
