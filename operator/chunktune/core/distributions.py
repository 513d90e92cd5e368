"""Token-count distributions and durations: the building blocks of workload profiles.

Distributions: ``constant`` (value), ``uniform`` (min, max; integers inclusive), ``normal``
(mean, std), ``lognormal`` (mean = the arithmetic mean, sigma = the log-space deviation),
``exponential`` (mean), ``choice`` (values, optional weights), ``histogram`` (``edges``, the
bucket bounds, and ``weights``, one per bucket: a bucket is drawn by weight, then an integer
uniformly inside it, above its lower edge and up to its upper one; the form a Prometheus
histogram's buckets give, :mod:`chunktune.metrics.derive`). Every one takes optional ``min`` and
``max`` to clip. Each has a runtime type (one frozen dataclass per distribution, :meth:`sample`
drawing from a seeded generator) and a pydantic model that validates its profile form
(:data:`DistributionSpec`, a discriminated union on ``dist``).
"""

from __future__ import annotations

import itertools
import math
import random
import re
from dataclasses import dataclass
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

from chunktune.core.bounds import MAX_DURATION_S, MAX_TOKENS
from chunktune.core.errors import SpecError
from chunktune.core.validation import problems_from


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
    if not 0 <= seconds <= MAX_DURATION_S:  # NaN and inf too
        raise SpecError(f"must be >= 0 and at most a year ({MAX_DURATION_S:.0f}s) "
                        f"(got {value!r})", field=field_name)
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
        # a wide distribution's tail never asks for more than any model takes
        return max(1, min(round(x) if math.isfinite(x) else MAX_TOKENS, MAX_TOKENS))

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

NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
#: A token count of a distribution (a bound, a value, a mean, an edge): finite, at most
#: :data:`~chunktune.core.bounds.MAX_TOKENS`.
Tokens = Annotated[float, Field(ge=0, le=MAX_TOKENS, allow_inf_nan=False)]
PositiveTokens = Annotated[float, Field(gt=0, le=MAX_TOKENS, allow_inf_nan=False)]
#: A relative weight (a class's, a value's, a bucket's): finite and at most a billion, so that
#: weights always sum to a finite number.
Weight = Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)]


class StrictModel(BaseModel):
    """A profile model: unknown fields refused, values strict, frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class _ClipSpec(StrictModel):
    min: Tokens | None = None
    max: PositiveTokens | None = None

    @model_validator(mode="after")
    def _ordered(self) -> _ClipSpec:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min must be <= max (got {self.min:g} > {self.max:g})")
        return self


class ConstantSpec(_ClipSpec):
    dist: Literal["constant"]
    value: PositiveTokens

    def build(self) -> Constant:
        return Constant(value=self.value, min=self.min, max=self.max)


class UniformSpec(StrictModel):
    """For ``uniform``, ``min`` and ``max`` are the range itself (integers, inclusive)."""

    dist: Literal["uniform"]
    min: Tokens
    max: PositiveTokens

    @model_validator(mode="after")
    def _ordered(self) -> UniformSpec:
        if self.min > self.max:
            raise ValueError(f"min must be <= max (got {self.min:g} > {self.max:g})")
        return self

    def build(self) -> Uniform:
        return Uniform(low=int(self.min), high=int(self.max))


class NormalSpec(_ClipSpec):
    dist: Literal["normal"]
    mean: PositiveTokens
    std: Tokens

    def build(self) -> Normal:
        return Normal(mean_=self.mean, std=self.std, min=self.min, max=self.max)


class LogNormalSpec(_ClipSpec):
    dist: Literal["lognormal"]
    mean: PositiveTokens
    sigma: Annotated[float, Field(ge=0, le=10, allow_inf_nan=False)]
    """The deviation in log space (at most 10: a factor of e**10 either way is already
    absurd)."""

    def build(self) -> LogNormal:
        return LogNormal(mean_=self.mean, sigma=self.sigma, min=self.min, max=self.max)


class ExponentialSpec(_ClipSpec):
    dist: Literal["exponential"]
    mean: PositiveTokens

    def build(self) -> Exponential:
        return Exponential(mean_=self.mean, min=self.min, max=self.max)


class ChoiceSpec(_ClipSpec):
    dist: Literal["choice"]
    values: list[Tokens] = Field(min_length=1, max_length=4096)
    weights: list[Weight] | None = Field(default=None, min_length=1, max_length=4096)

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
    edges: list[Tokens] = Field(min_length=2, max_length=256)
    """Bucket bounds, increasing: bucket ``i`` is ``(edges[i], edges[i+1]]``."""
    weights: list[Weight] = Field(min_length=1, max_length=255)
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

#: What a class name may look like (profiles, traces, the CRD).
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


Api = Literal["completions", "chat"]
#: The request APIs a traffic class may use (the CRD's enum).
APIS: tuple[str, ...] = get_args(Api)


def duration_value(v: Any) -> float:
    """:func:`parse_duration` for a pydantic ``BeforeValidator`` (raises ValueError)."""
    try:
        return parse_duration(v, "")
    except SpecError as e:
        raise ValueError(e.problems[0][1]) from e


class _OneDistribution(StrictModel):
    dist: DistributionSpec


def parse_distribution(raw: Any, path: str) -> Distribution:
    """A distribution from its profile form (a mapping with ``dist``, or a bare number)."""
    try:
        spec = _OneDistribution.model_validate({"dist": raw})
    except ValidationError as e:
        problems = problems_from(e, _OneDistribution)
        raise SpecError([(path + p.removeprefix("dist"), m) for p, m in problems]) from e
    return spec.dist.build()
