"""Workload profiles: traffic classes with length distributions, and how requests arrive.

One format serves the simulator, the Locust driver and the tuner's manifests
(``loadtest/profiles/*.yaml``)::

    name: mixed
    arrival: {mode: poisson, rate: 8}      # poisson | constant (req/s) | concurrency (in flight)
    duration: 10m                           # seconds, or "90s", "10m", "1h"
    warmup: 30s                             # requests arriving before this are not measured
    seed: 0
    classes:
      - name: long-context
        weight: 0.15
        api: completions                    # completions | chat
        prompt_tokens: {dist: uniform, min: 8192, max: 32768}
        output_tokens: {dist: constant, value: 128}
      - name: chat
        weight: 0.85
        api: chat
        prompt_tokens: {dist: lognormal, mean: 500, sigma: 0.5, min: 200, max: 1000}
        output_tokens: {dist: lognormal, mean: 200, sigma: 0.6, min: 16, max: 512}

Distributions: ``constant`` (value), ``uniform`` (min, max; integers inclusive), ``normal``
(mean, std), ``lognormal`` (mean = the arithmetic mean, sigma = the log-space deviation),
``exponential`` (mean), ``choice`` (values, optional weights), ``histogram`` (``edges``, the
bucket bounds, and ``weights``, one per bucket: a bucket is drawn by weight, then an integer
uniformly inside it, above its lower edge and up to its upper one; the form a Prometheus
histogram's buckets give, :mod:`chunktune.metrics.derive`). Every one takes optional ``min`` and
``max`` to clip. Draws are made from a seeded generator, so one seed gives one request sequence
whichever tool replays it.

A profile is validated by pydantic models (:class:`ProfileSpec`, a discriminated union on
``dist`` for the distributions), the mechanism the manifest uses, so every problem comes back at
once with its field path (:mod:`chunktune.core.validation`); :func:`parse_profile` then builds
the runtime types (:class:`Profile`, one dataclass per distribution).
"""

from __future__ import annotations

import itertools
import math
import os
import random
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from chunktune.core import yamlsafe
from chunktune.core.errors import SpecError
from chunktune.core.validation import problems_from


def _profile_dir() -> Path:
    """Where the shipped profiles live: ``$CHUNKTUNE_PROFILES``, else the package's
    ``chunktune/profiles`` (a link to the repository's ``loadtest/profiles``, copied into
    wheels)."""
    env = os.environ.get("CHUNKTUNE_PROFILES")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1] / "profiles"


#: Where the shipped profiles live.
PROFILE_DIR = _profile_dir()
#: The classes of a profile derived from a deployment's metrics (:mod:`chunktune.metrics.derive`):
#: prompts at most, and above, a length threshold.
DERIVED_CLASSES = ("short", "long")
#: A derived profile's duration unless the manifest or the command says otherwise.
DERIVED_DURATION = 300.0


def derived_warmup(duration: float) -> float:
    """A derived profile's warm-up unless one is given: 30 s, or a tenth of a shorter
    duration."""
    return min(30.0, duration / 10)


def parse_duration(value: Any, field_name: str) -> float:
    """Seconds from ``90``, ``90.5``, ``"90s"``, ``"10m"``, ``"1h30m"`` or ``"250ms"``."""
    if isinstance(value, bool):
        raise SpecError(f"must be a duration such as 60, '90s' or '10m' (got {value!r})",
                        field=field_name)
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (parts := re.fullmatch(
            r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m(?!s))?\s*(?:(\d+(?:\.\d+)?)s)?"
            r"\s*(?:(\d+(?:\.\d+)?)ms)?\s*", value)) and any(parts.groups()):
        h, m, s, ms = (float(g) if g else 0.0 for g in parts.groups())
        seconds = h * 3600 + m * 60 + s + ms / 1000
    else:
        try:
            seconds = float(value)
        except (TypeError, ValueError) as e:
            raise SpecError(f"must be a duration such as 60, '90s' or '10m' (got {value!r})",
                            field=field_name) from e
    if seconds < 0 or math.isnan(seconds):
        raise SpecError(f"must be >= 0 (got {value!r})", field=field_name)
    return seconds


@dataclass(frozen=True, kw_only=True)
class _Clipped:
    """A token-count distribution: :meth:`sample` draws, clips to ``[min, max]`` (when given)
    and rounds to an integer >= 1."""

    min: float | None = None
    max: float | None = None

    def _draw(self, rng: random.Random) -> float:
        raise NotImplementedError

    def _params(self) -> dict[str, Any]:
        raise NotImplementedError

    def mean(self) -> float:
        """The mean before clipping (for capacity estimates and docs)."""
        raise NotImplementedError

    def sample(self, rng: random.Random) -> int:
        x = self._draw(rng)
        if self.min is not None:
            x = max(x, self.min)
        if self.max is not None:
            x = min(x, self.max)
        return max(1, round(x))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = self._params()
        if self.min is not None:
            out["min"] = self.min
        if self.max is not None:
            out["max"] = self.max
        return out


@dataclass(frozen=True, kw_only=True)
class Constant(_Clipped):
    value: float
    dist: Literal["constant"] = "constant"

    def _draw(self, rng: random.Random) -> float:
        return self.value

    def _params(self) -> dict[str, Any]:
        return {"dist": self.dist, "value": self.value}

    def mean(self) -> float:
        return self.value


@dataclass(frozen=True, kw_only=True)
class Uniform(_Clipped):
    """Integers from ``low`` to ``high`` inclusive (the profile's ``min`` and ``max``, which
    for ``uniform`` are the range itself rather than a clip)."""

    low: int
    high: int
    dist: Literal["uniform"] = "uniform"

    def _draw(self, rng: random.Random) -> float:
        return rng.randint(self.low, self.high)

    def _params(self) -> dict[str, Any]:
        return {"dist": self.dist, "min": self.low, "max": self.high}

    def mean(self) -> float:
        return (self.low + self.high) / 2


@dataclass(frozen=True, kw_only=True)
class Normal(_Clipped):
    mean_: float
    std: float
    dist: Literal["normal"] = "normal"

    def _draw(self, rng: random.Random) -> float:
        return rng.gauss(self.mean_, self.std)

    def _params(self) -> dict[str, Any]:
        return {"dist": self.dist, "mean": self.mean_, "std": self.std}

    def mean(self) -> float:
        return self.mean_


@dataclass(frozen=True, kw_only=True)
class LogNormal(_Clipped):
    """``mean`` is the arithmetic mean; ``sigma`` the deviation in log space."""

    mean_: float
    sigma: float
    dist: Literal["lognormal"] = "lognormal"

    def _draw(self, rng: random.Random) -> float:
        mu = math.log(self.mean_) - self.sigma * self.sigma / 2
        return rng.lognormvariate(mu, self.sigma)

    def _params(self) -> dict[str, Any]:
        return {"dist": self.dist, "mean": self.mean_, "sigma": self.sigma}

    def mean(self) -> float:
        return self.mean_


@dataclass(frozen=True, kw_only=True)
class Exponential(_Clipped):
    mean_: float
    dist: Literal["exponential"] = "exponential"

    def _draw(self, rng: random.Random) -> float:
        return rng.expovariate(1.0 / self.mean_)

    def _params(self) -> dict[str, Any]:
        return {"dist": self.dist, "mean": self.mean_}

    def mean(self) -> float:
        return self.mean_


@dataclass(frozen=True, kw_only=True)
class Choice(_Clipped):
    values: tuple[float, ...]
    weights: tuple[float, ...] | None = None
    dist: Literal["choice"] = "choice"

    def _draw(self, rng: random.Random) -> float:
        return float(rng.choices(self.values, weights=self.weights)[0])

    def _params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dist": self.dist, "values": list(self.values)}
        if self.weights is not None:
            out["weights"] = list(self.weights)
        return out

    def mean(self) -> float:
        w = self.weights or (1.0,) * len(self.values)
        return sum(a * b for a, b in zip(self.values, w, strict=True)) / sum(w)


@dataclass(frozen=True, kw_only=True)
class Histogram(_Clipped):
    """Buckets ``(edges[i], edges[i+1]]`` drawn by ``weights[i]``, then an integer uniformly
    inside the bucket (a bucket narrower than one integer gives its upper edge)."""

    edges: tuple[float, ...]
    weights: tuple[float, ...]
    dist: Literal["histogram"] = "histogram"

    def _draw(self, rng: random.Random) -> float:
        i = rng.choices(range(len(self.weights)), weights=self.weights)[0]
        lo, hi = math.floor(self.edges[i]) + 1, math.floor(self.edges[i + 1])
        return float(rng.randint(lo, hi)) if hi > lo else float(max(hi, 1))

    def _params(self) -> dict[str, Any]:
        return {"dist": self.dist, "edges": list(self.edges), "weights": list(self.weights)}

    def mean(self) -> float:
        mids = [(a + b) / 2 for a, b in itertools.pairwise(self.edges)]
        return sum(m * w for m, w in zip(mids, self.weights, strict=True)) / sum(self.weights)


#: A token-count distribution, told apart by its ``dist`` tag.
Distribution = Constant | Uniform | Normal | LogNormal | Exponential | Choice | Histogram


# ---- validation: the profile as pydantic models (the manifest's mechanism) ------------------
#
# The models below check a raw profile mapping; core.validation turns their errors into
# (field path, message) problems. parse_profile then builds the runtime types above from it.

NonNegative = Annotated[float, Field(ge=0)]
Positive = Annotated[float, Field(gt=0)]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class _ClipSpec(_Spec):
    min: NonNegative | None = None
    max: Positive | None = None

    @model_validator(mode="after")
    def _ordered(self) -> _ClipSpec:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min must be <= max (got {self.min:g} > {self.max:g})")
        return self


class ConstantSpec(_ClipSpec):
    dist: Literal["constant"]
    value: Positive

    def build(self) -> Constant:
        return Constant(value=self.value, min=self.min, max=self.max)


class UniformSpec(_Spec):
    """For ``uniform``, ``min`` and ``max`` are the range itself (integers, inclusive)."""

    dist: Literal["uniform"]
    min: NonNegative
    max: Positive

    @model_validator(mode="after")
    def _ordered(self) -> UniformSpec:
        if self.min > self.max:
            raise ValueError(f"min must be <= max (got {self.min:g} > {self.max:g})")
        return self

    def build(self) -> Uniform:
        return Uniform(low=int(self.min), high=int(self.max))


class NormalSpec(_ClipSpec):
    dist: Literal["normal"]
    mean: Positive
    std: NonNegative

    def build(self) -> Normal:
        return Normal(mean_=self.mean, std=self.std, min=self.min, max=self.max)


class LogNormalSpec(_ClipSpec):
    dist: Literal["lognormal"]
    mean: Positive
    sigma: NonNegative

    def build(self) -> LogNormal:
        return LogNormal(mean_=self.mean, sigma=self.sigma, min=self.min, max=self.max)


class ExponentialSpec(_ClipSpec):
    dist: Literal["exponential"]
    mean: Positive

    def build(self) -> Exponential:
        return Exponential(mean_=self.mean, min=self.min, max=self.max)


class ChoiceSpec(_ClipSpec):
    dist: Literal["choice"]
    values: list[NonNegative] = Field(min_length=1)
    weights: list[NonNegative] | None = Field(default=None, min_length=1)

    @field_validator("weights")
    @classmethod
    def _one_per_value(cls, w: list[float] | None, info: ValidationInfo) -> list[float] | None:
        values = info.data.get("values")
        if w is not None and values is not None and len(w) != len(values):
            raise ValueError(f"must have as many entries as values ({len(values)})")
        return w

    def build(self) -> Choice:
        return Choice(values=tuple(self.values),
                      weights=None if self.weights is None else tuple(self.weights),
                      min=self.min, max=self.max)


class HistogramSpec(_ClipSpec):
    dist: Literal["histogram"]
    edges: list[NonNegative] = Field(min_length=2, max_length=256)
    """Bucket bounds, increasing: bucket ``i`` is ``(edges[i], edges[i+1]]``."""
    weights: list[NonNegative] = Field(min_length=1, max_length=255)
    """One weight per bucket (counts or shares), not all zero."""

    @field_validator("edges")
    @classmethod
    def _increasing(cls, v: list[float]) -> list[float]:
        for a, b in itertools.pairwise(v):
            if b <= a:
                raise ValueError(f"must increase (got {a:g} then {b:g})")
        return v

    @field_validator("weights")
    @classmethod
    def _one_per_bucket(cls, w: list[float], info: ValidationInfo) -> list[float]:
        edges = info.data.get("edges")
        if edges is not None and len(w) != len(edges) - 1:
            raise ValueError(f"must have one entry per bucket: len(edges) - 1 = "
                             f"{len(edges) - 1} (got {len(w)})")
        if not any(x > 0 for x in w):
            raise ValueError("must not all be 0")
        return w

    def build(self) -> Histogram:
        return Histogram(edges=tuple(self.edges), weights=tuple(self.weights), min=self.min,
                         max=self.max)


def _bare_number(raw: Any) -> Any:
    """``prompt_tokens: 128`` is ``{dist: constant, value: 128}``."""
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return {"dist": "constant", "value": raw}
    if not isinstance(raw, dict):
        raise ValueError(f"must be a number or a mapping such as {{dist: uniform, min: 100, "
                         f"max: 500}} (got {raw!r})")
    return raw


DistributionSpec = Annotated[
    ConstantSpec | UniformSpec | NormalSpec | LogNormalSpec | ExponentialSpec | ChoiceSpec
    | HistogramSpec, Field(discriminator="dist"), BeforeValidator(_bare_number)]

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


Api = Literal["completions", "chat"]
ArrivalMode = Literal["poisson", "constant", "concurrency"]
#: The request APIs and arrival modes a profile may name (the CRD's enums).
APIS: tuple[str, ...] = get_args(Api)
ARRIVAL_MODES: tuple[str, ...] = get_args(ArrivalMode)


class TrafficClassSpec(_Spec):
    name: str
    weight: Positive = 1.0
    api: Api = "completions"
    prompt_tokens: DistributionSpec
    output_tokens: DistributionSpec

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, v: Any) -> Any:
        if not isinstance(v, str) or not re.fullmatch(_NAME, v):
            raise ValueError(f"must be a name of letters, digits, '-', '_' or '.' (got {v!r})")
        return v


class ArrivalSpec(_Spec):
    mode: ArrivalMode = "poisson"
    rate: Positive | None = Field(default=None, validate_default=True)
    """Requests per second, for the open-loop modes."""
    concurrency: int | None = Field(default=None, gt=0, validate_default=True)
    """Requests kept in flight, for mode concurrency."""

    @field_validator("rate")
    @classmethod
    def _rate(cls, v: float | None, info: ValidationInfo) -> float | None:
        mode = info.data.get("mode")
        if v is None and mode in ("poisson", "constant"):
            raise ValueError(f"must be a number > 0 (requests per second) for mode {mode} "
                             f"(got None)")
        return v

    @field_validator("concurrency")
    @classmethod
    def _concurrency(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is None and info.data.get("mode") == "concurrency":
            raise ValueError("must be an integer > 0 for mode concurrency (got None)")
        return v


def _duration(v: Any) -> float:
    try:
        return parse_duration(v, "")
    except SpecError as e:
        raise ValueError(e.problems[0][1]) from e


class ProfileSpec(_Spec):
    name: str | None = None
    description: str = ""
    arrival: ArrivalSpec = Field(default_factory=lambda: ArrivalSpec(mode="poisson", rate=1.0))
    duration: Annotated[float, BeforeValidator(_duration), Field(gt=0)] = 60.0
    warmup: Annotated[float, BeforeValidator(_duration)] = 0.0
    seed: int = 0
    classes: list[TrafficClassSpec] = Field(default_factory=list, validate_default=True)

    @field_validator("warmup")
    @classmethod
    def _warmup(cls, v: float, info: ValidationInfo) -> float:
        duration = info.data.get("duration")
        if duration is not None and v >= duration:
            raise ValueError(f"must be shorter than duration ({v:g}s >= {duration:g}s)")
        return v

    @field_validator("classes")
    @classmethod
    def _classes(cls, v: list[TrafficClassSpec]) -> list[TrafficClassSpec]:
        if not v:
            raise ValueError("must be a non-empty list of traffic classes")
        return v


class _OneDistribution(_Spec):
    dist: DistributionSpec


def parse_distribution(raw: Any, path: str) -> Distribution:
    """A distribution from its profile form (a mapping with ``dist``, or a bare number)."""
    try:
        spec = _OneDistribution.model_validate({"dist": raw})
    except ValidationError as e:
        problems = problems_from(e, _OneDistribution)
        raise SpecError([(path + p.removeprefix("dist"), m) for p, m in problems]) from e
    return spec.dist.build()


@dataclass(frozen=True)
class TrafficClass:
    name: str
    weight: float
    prompt_tokens: Distribution
    output_tokens: Distribution
    api: str = "completions"


@dataclass(frozen=True)
class Arrival:
    mode: str = "poisson"
    rate: float | None = None
    concurrency: int | None = None


@dataclass(frozen=True)
class Profile:
    name: str
    classes: tuple[TrafficClass, ...]
    arrival: Arrival
    duration: float
    warmup: float = 0.0
    seed: int = 0
    description: str = ""

    def with_overrides(self, *, duration: float | None = None, warmup: float | None = None,
                       rate: float | None = None, concurrency: int | None = None,
                       seed: int | None = None) -> Profile:
        arrival = self.arrival
        if rate is not None:
            arrival = Arrival("poisson" if arrival.mode == "concurrency" else arrival.mode,
                              rate=rate)
        if concurrency is not None:
            arrival = Arrival("concurrency", concurrency=concurrency)
        return replace(
            self,
            arrival=arrival,
            duration=self.duration if duration is None else duration,
            warmup=self.warmup if warmup is None else warmup,
            seed=self.seed if seed is None else seed,
        )

    def class_names(self) -> list[str]:
        return [c.name for c in self.classes]

    def to_dict(self) -> dict[str, Any]:
        arrival: dict[str, Any] = {"mode": self.arrival.mode}
        if self.arrival.rate is not None:
            arrival["rate"] = self.arrival.rate
        if self.arrival.concurrency is not None:
            arrival["concurrency"] = self.arrival.concurrency
        return {
            "name": self.name,
            "description": self.description,
            "arrival": arrival,
            "duration": self.duration,
            "warmup": self.warmup,
            "seed": self.seed,
            "classes": [
                {"name": c.name, "weight": c.weight, "api": c.api,
                 "prompt_tokens": c.prompt_tokens.to_dict(),
                 "output_tokens": c.output_tokens.to_dict()}
                for c in self.classes
            ],
        }


def parse_profile(raw: Any, source: str = "profile") -> Profile:
    """Validate a profile mapping; every problem is reported with its field path."""
    if not isinstance(raw, dict):
        raise SpecError(f"must be a mapping with classes, arrival and duration (got "
                        f"{type(raw).__name__})", field=source)
    try:
        spec = ProfileSpec.model_validate(raw)
    except ValidationError as e:
        problems = problems_from(e, ProfileSpec, (source,))
    else:
        problems = []
    classes = raw.get("classes")
    names = [c.get("name") for c in classes if isinstance(c, dict)] \
        if isinstance(classes, list) else []
    for i, name in enumerate(names):
        if isinstance(name, str) and re.fullmatch(_NAME, name) and name in names[:i]:
            problems.append((f"{source}.classes[{i}].name", f"duplicate class name {name!r}"))
    if problems:
        raise SpecError(problems)
    return Profile(
        name=spec.name or source,
        description=spec.description,
        classes=tuple(TrafficClass(c.name, c.weight, c.prompt_tokens.build(),
                                   c.output_tokens.build(), c.api) for c in spec.classes),
        arrival=Arrival(spec.arrival.mode, rate=spec.arrival.rate,
                        concurrency=spec.arrival.concurrency),
        duration=spec.duration,
        warmup=spec.warmup,
        seed=spec.seed,
    )


def load_profile(ref: str | Path) -> Profile:
    """A profile from a YAML file path, or the name of a shipped one (``mixed``)."""
    p = Path(ref)
    if not p.exists() and not p.suffix:
        p = PROFILE_DIR / f"{ref}.yaml"
    if not p.exists():
        shipped = ", ".join(sorted(x.stem for x in PROFILE_DIR.glob("*.yaml")))
        raise SpecError(f"no profile file {str(ref)!r}; give a path or one of: {shipped}",
                        field="--workload")
    try:
        text = p.read_text()
    except OSError as e:
        raise SpecError(f"cannot read {p.name}: {e.strerror or e}", field="--workload") from e
    try:
        raw = yamlsafe.load(text, p.name)
    except SpecError as e:
        raise SpecError("; ".join(f"{f}: {m}" for f, m in e.problems),
                        field="--workload") from e
    return parse_profile(raw, source=p.stem)


@dataclass(frozen=True)
class RequestSpec:
    """One request to replay: when it arrives (seconds from the start; ``None`` in closed-loop
    mode, where it is sent as soon as a slot frees) and its token counts."""

    rid: int
    arrival: float | None
    prompt_tokens: int
    output_tokens: int
    cls: int


def generate(profile: Profile, limit: int | None = None) -> list[RequestSpec]:
    """The request sequence of a profile, deterministic for its seed.

    Open-loop modes get arrival times up to ``profile.duration``. Concurrency mode gets a
    sequence with ``arrival=None``, long enough for any run (the engine takes what it needs);
    ``limit`` caps the count.
    """
    rng = random.Random(profile.seed)
    weights = [c.weight for c in profile.classes]
    out: list[RequestSpec] = []
    t = 0.0
    mode = profile.arrival.mode
    rate = profile.arrival.rate or 1.0
    cap = limit if limit is not None else (10**9 if mode != "concurrency" else 200_000)
    while len(out) < cap:
        if mode == "poisson":
            t += rng.expovariate(rate)
        elif mode == "constant":
            t = len(out) / rate
        if mode != "concurrency" and t >= profile.duration:
            break
        ci = rng.choices(range(len(weights)), weights=weights)[0]
        c = profile.classes[ci]
        out.append(RequestSpec(len(out), None if mode == "concurrency" else t,
                               c.prompt_tokens.sample(rng), c.output_tokens.sample(rng), ci))
    return out
