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
``exponential`` (mean), ``choice`` (values, optional weights). Every one takes optional ``min`` and
``max`` to clip. Draws are made from a seeded generator, so one seed gives one request sequence
whichever tool replays it.
"""

from __future__ import annotations

import math
import os
import random
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from chunktune.core.errors import Problems, SpecError

ARRIVAL_MODES = ("poisson", "constant", "concurrency")
APIS = ("completions", "chat")
DISTS = ("constant", "uniform", "normal", "lognormal", "exponential", "choice")

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
        except (TypeError, ValueError):
            raise SpecError(f"must be a duration such as 60, '90s' or '10m' (got {value!r})",
                            field=field_name) from None
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


#: A token-count distribution, told apart by its ``dist`` tag.
Distribution = Constant | Uniform | Normal | LogNormal | Exponential | Choice


_REQUIRED = {
    "constant": ("value",),
    "uniform": ("min", "max"),
    "normal": ("mean", "std"),
    "lognormal": ("mean", "sigma"),
    "exponential": ("mean",),
    "choice": ("values",),
}


def parse_distribution(raw: Any, path: str) -> Distribution:
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        raw = {"dist": "constant", "value": raw}
    if not isinstance(raw, dict):
        raise SpecError(f"must be a number or a mapping such as {{dist: uniform, min: 100, "
                        f"max: 500}} (got {raw!r})", field=path)
    d = raw.get("dist")
    if d not in DISTS:
        raise SpecError(f"must be one of {', '.join(DISTS)} (got {d!r})", field=path + ".dist")
    problems: list[tuple[str, str]] = []
    for key in _REQUIRED[d]:
        if key not in raw:
            problems.append((f"{path}.{key}", f"is required for dist {d}"))
    allowed = set(_REQUIRED[d]) | {"dist", "min", "max"}
    if d == "choice":
        allowed.add("weights")
    for key in raw:
        if key not in allowed:
            problems.append((f"{path}.{key}", f"is not a field of dist {d}; "
                             f"allowed: {', '.join(sorted(allowed - {'dist'}))}"))
    for key, v in raw.items():
        if key == "dist":
            continue
        if key in ("values", "weights"):
            if not isinstance(v, list) or not v or not all(
                    isinstance(x, int | float) and not isinstance(x, bool) and x >= 0 for x in v):
                problems.append((f"{path}.{key}", f"must be a non-empty list of numbers >= 0 "
                                 f"(got {v!r})"))
        elif isinstance(v, bool) or not isinstance(v, int | float):
            problems.append((f"{path}.{key}", f"must be a number (got {v!r})"))
        elif v < 0 or (v == 0 and key in ("value", "mean", "max")):
            problems.append((f"{path}.{key}", f"must be > 0 (got {v!r})"))
    if problems:
        raise SpecError(problems)
    if "weights" in raw and len(raw["weights"]) != len(raw["values"]):
        raise SpecError(f"must have as many entries as values ({len(raw['values'])})",
                        field=f"{path}.weights")
    if d == "uniform":
        if raw["min"] > raw["max"]:
            raise SpecError(f"min must be <= max (got {raw['min']} > {raw['max']})", field=path)
        return Uniform(low=int(raw["min"]), high=int(raw["max"]))
    # For the others min and max clip the draw.
    lo, hi = raw.get("min"), raw.get("max")
    if lo is not None and hi is not None and lo > hi:
        raise SpecError(f"min must be <= max (got {lo} > {hi})", field=path)
    cmin = None if lo is None else float(lo)
    cmax = None if hi is None else float(hi)
    if d == "constant":
        return Constant(value=float(raw["value"]), min=cmin, max=cmax)
    if d == "normal":
        return Normal(mean_=float(raw["mean"]), std=float(raw["std"]), min=cmin, max=cmax)
    if d == "lognormal":
        return LogNormal(mean_=float(raw["mean"]), sigma=float(raw["sigma"]), min=cmin, max=cmax)
    if d == "exponential":
        return Exponential(mean_=float(raw["mean"]), min=cmin, max=cmax)
    weights = raw.get("weights")
    return Choice(values=tuple(float(v) for v in raw["values"]),
                  weights=None if weights is None else tuple(float(w) for w in weights),
                  min=cmin, max=cmax)


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
    problems = Problems()
    attempt = problems.attempt
    known = {"name", "description", "arrival", "duration", "warmup", "seed", "classes"}
    for key in raw:
        if key not in known:
            problems.append((f"{source}.{key}", f"unknown field; allowed: "
                             f"{', '.join(sorted(known))}"))
    classes_raw = raw.get("classes")
    classes: list[TrafficClass] = []
    if not isinstance(classes_raw, list) or not classes_raw:
        problems.append((f"{source}.classes", "must be a non-empty list of traffic classes"))
        classes_raw = []
    seen: set[str] = set()
    for i, c in enumerate(classes_raw):
        path = f"{source}.classes[{i}]"
        if not isinstance(c, dict):
            problems.append((path, "must be a mapping with name, weight, prompt_tokens and "
                             "output_tokens"))
            continue
        for key in c:
            if key not in ("name", "weight", "api", "prompt_tokens", "output_tokens"):
                problems.append((f"{path}.{key}", "unknown field; allowed: api, name, "
                                 "output_tokens, prompt_tokens, weight"))
        name = c.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
            problems.append((f"{path}.name", f"must be a name of letters, digits, '-', '_' or "
                             f"'.' (got {name!r})"))
            name = f"class{i}"
        elif name in seen:
            problems.append((f"{path}.name", f"duplicate class name {name!r}"))
        seen.add(name)
        weight = c.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
            problems.append((f"{path}.weight", f"must be a number > 0 (got {weight!r})"))
            weight = 1.0
        api = c.get("api", "completions")
        if api not in APIS:
            problems.append((f"{path}.api", f"must be one of {', '.join(APIS)} (got {api!r})"))
        pt = attempt(parse_distribution, c.get("prompt_tokens"), f"{path}.prompt_tokens")
        ot = attempt(parse_distribution, c.get("output_tokens"), f"{path}.output_tokens")
        if pt and ot:
            classes.append(TrafficClass(name, float(weight), pt, ot, api))
    arr = raw.get("arrival", {"mode": "poisson", "rate": 1.0})
    arrival = Arrival()
    if not isinstance(arr, dict):
        problems.append((f"{source}.arrival",
                         "must be a mapping such as {mode: poisson, rate: 4}"))
    else:
        mode = arr.get("mode", "poisson")
        for key in arr:
            if key not in ("mode", "rate", "concurrency"):
                problems.append((f"{source}.arrival.{key}", "unknown field; allowed: "
                                 "concurrency, mode, rate"))
        if mode not in ARRIVAL_MODES:
            problems.append((f"{source}.arrival.mode",
                             f"must be one of {', '.join(ARRIVAL_MODES)} (got {mode!r})"))
        elif mode == "concurrency":
            n = arr.get("concurrency")
            if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
                problems.append((f"{source}.arrival.concurrency",
                                 f"must be an integer > 0 for mode concurrency (got {n!r})"))
            else:
                arrival = Arrival(mode, concurrency=n)
        else:
            r = arr.get("rate")
            if isinstance(r, bool) or not isinstance(r, int | float) or r <= 0:
                problems.append((f"{source}.arrival.rate",
                                 f"must be a number > 0 (requests per second) for mode {mode} "
                                 f"(got {r!r})"))
            else:
                arrival = Arrival(mode, rate=float(r))
    duration = attempt(parse_duration, raw.get("duration", 60), f"{source}.duration")
    warmup = attempt(parse_duration, raw.get("warmup", 0), f"{source}.warmup")
    if duration is not None and duration <= 0:
        problems.append((f"{source}.duration", "must be > 0"))
    if duration and warmup is not None and warmup >= duration:
        problems.append((f"{source}.warmup",
                         f"must be shorter than duration ({warmup:g}s >= {duration:g}s)"))
    seed = raw.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        problems.append((f"{source}.seed", f"must be an integer (got {seed!r})"))
    problems.check()
    return Profile(
        name=str(raw.get("name") or source),
        description=str(raw.get("description") or ""),
        classes=tuple(classes),
        arrival=arrival,
        duration=float(duration),  # type: ignore[arg-type]
        warmup=float(warmup),  # type: ignore[arg-type]
        seed=int(seed),
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
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise SpecError(f"{p.name} is not valid YAML: {e}", field="--workload") from None
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
