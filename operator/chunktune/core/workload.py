"""Workload profiles: traffic classes with length distributions and an arrival process, or a
request trace replayed at its own arrival times.

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
        priority: 0                         # vLLM's request priority (lower first)
        prompt_tokens: {dist: uniform, min: 8192, max: 32768}
        output_tokens: {dist: constant, value: 128}
      - name: chat
        weight: 0.85
        api: chat
        prompt_tokens: {dist: lognormal, mean: 500, sigma: 0.5, min: 200, max: 1000}
        output_tokens: {dist: lognormal, mean: 200, sigma: 0.6, min: 16, max: 512}
        shared_prefix: {tokens: 150, groups: 4}   # the first 150 tokens are one of 4 openings

or, instead of ``arrival`` and ``classes``, a trace (:mod:`chunktune.core.trace`)::

    name: azure-conv
    warmup: 30s
    trace:
      file: azure-conv.csv                  # relative to this file
      format: azure                         # auto | azure | mooncake | generic
      start: 0s
      end: 10m
      speedup: 1
      classes:
        - {name: chat, api: chat, max_prompt_tokens: 2048}
        - {name: long, api: completions, priority: 1}

Distributions are in :mod:`chunktune.core.distributions`. Draws are made from a seeded
generator, so one seed gives one request sequence whichever tool replays it: :func:`generate`
is a pure function of the profile (its trace included) and its seed.

A profile is validated by pydantic models (:class:`ProfileSpec`), the mechanism the manifest
uses, so every problem comes back at once with its field path
(:mod:`chunktune.core.validation`); :func:`parse_profile` then builds the runtime types
(:class:`Profile`).
"""

from __future__ import annotations

import math
import os
import random
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BeforeValidator, Field, ValidationError, ValidationInfo, field_validator

from chunktune.core import yamlsafe
from chunktune.core.bounds import (
    MAX_CONCURRENCY,
    MAX_DURATION_S,
    MAX_RATE,
    MAX_REQUESTS,
    MAX_TOKENS,
    rate_bound,
)
from chunktune.core.distributions import (
    APIS,
    NAME_PATTERN,
    Api,
    Constant,
    Distribution,
    DistributionSpec,
    Positive,
    StrictModel,
    duration_value,
    parse_duration,
)
from chunktune.core.errors import SpecError
from chunktune.core.trace import Trace, parse_trace_spec, read_trace
from chunktune.core.trace_formats import PRIORITY_BOUND
from chunktune.core.validation import problems_from

__all__ = ["APIS", "ARRIVAL_MODES", "PROFILE_DIR", "Arrival", "Profile", "ProfileSpec",
           "RequestSpec", "SharedPrefix", "TrafficClass", "generate", "load_profile",
           "openings_note", "parse_duration", "parse_profile", "trace_profile"]


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



ArrivalMode = Literal["poisson", "constant", "concurrency"]
#: The arrival modes a profile may name (the CRD's enum); a trace profile's mode is ``trace``.
ARRIVAL_MODES: tuple[str, ...] = get_args(ArrivalMode)
#: The arrival mode of a profile that replays a trace.
TRACE_MODE = "trace"


class SharedPrefixSpec(StrictModel):
    tokens: int = Field(gt=0, le=MAX_TOKENS)
    """Tokens every prompt of the class opens with (all of a shorter prompt)."""
    groups: int = Field(default=1, gt=0, le=1_000_000)
    """How many different openings: each request takes one at random (a system prompt per
    application, a document many questions are asked about)."""


class TrafficClassSpec(StrictModel):
    name: str
    weight: Positive = Field(default=1.0, le=1e9)
    api: Api = "completions"
    priority: int = Field(default=0, ge=-PRIORITY_BOUND, le=PRIORITY_BOUND)
    """vLLM's ``priority`` request field: lower is served first under
    ``--scheduling-policy priority``."""
    prompt_tokens: DistributionSpec
    output_tokens: DistributionSpec
    shared_prefix: SharedPrefixSpec | None = None
    """Prompts that open alike, as vLLM's prefix cache meets them; default none (every prompt
    its own from its first token)."""
    spec_acceptance: float | None = Field(default=None, ge=0.0, le=1.0)
    """Speculative decoding: the chance that a draft token of this class's requests is
    accepted, given the drafts before it were (a number from 0 to 1; what
    ``chunktune workload from-prometheus`` derives from vLLM's spec-decode counters). Needed
    to simulate ``--speculative-config``; none: the class was not measured."""

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, v: Any) -> Any:
        if not isinstance(v, str) or not re.fullmatch(NAME_PATTERN, v):
            raise ValueError(f"must be a name of letters, digits, '-', '_' or '.' (got {v!r})")
        return v


class ArrivalSpec(StrictModel):
    mode: ArrivalMode = "poisson"
    rate: Positive | None = Field(default=None, le=MAX_RATE, validate_default=True)
    """Requests per second, for the open-loop modes."""
    concurrency: int | None = Field(default=None, gt=0, le=MAX_CONCURRENCY,
                                    validate_default=True)
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


class ProfileSpec(StrictModel):
    name: str | None = None
    description: str = ""
    arrival: ArrivalSpec | None = None
    duration: Annotated[float, BeforeValidator(duration_value),
                        Field(gt=0, le=MAX_DURATION_S)] | None = None
    """Default: 60 s, or a trace's span."""
    warmup: Annotated[float, BeforeValidator(duration_value), Field(le=MAX_DURATION_S)] = 0.0
    seed: int = Field(default=0, ge=-(2**63), lt=2**63)
    classes: list[TrafficClassSpec] | None = None
    trace: dict[str, Any] | None = None
    """A trace to replay instead of ``arrival`` and ``classes`` (checked by
    :func:`chunktune.core.trace.parse_trace_spec`)."""


@dataclass(frozen=True)
class SharedPrefix:
    """A class's shared openings: each prompt's first ``tokens`` tokens (all of a shorter
    prompt) are one of ``groups`` openings."""

    tokens: int
    groups: int = 1


@dataclass(frozen=True)
class TrafficClass:
    name: str
    weight: float
    prompt_tokens: Distribution
    output_tokens: Distribution
    api: str = "completions"
    priority: int = 0
    shared_prefix: SharedPrefix | None = None
    spec_acceptance: float | None = None


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
    trace: Trace | None = None
    """The requests to replay, when the profile is a trace (``arrival.mode`` ``trace``)."""

    def with_overrides(self, *, duration: float | None = None, warmup: float | None = None,
                       rate: float | None = None, concurrency: int | None = None,
                       seed: int | None = None) -> Profile:
        """The profile with these values in place. A trace's arrivals are its own: ``rate``
        and ``concurrency`` are refused for one (SpecError naming ``rate``/``concurrency``);
        ``duration`` cuts it (requests arriving later are not sent)."""
        arrival = self.arrival
        if self.trace is not None and (rate is not None or concurrency is not None):
            raise SpecError("a trace replays its own arrival times; change its rate with the "
                            "trace's speedup or rate_scale",
                            field="rate" if rate is not None else "concurrency")
        if rate is not None:
            arrival = Arrival("poisson" if arrival.mode == "concurrency" else arrival.mode,
                              rate=rate)
        if concurrency is not None:
            arrival = Arrival("concurrency", concurrency=concurrency)
        duration = self.duration if duration is None else duration
        if self.trace is not None:
            arrival = Arrival(TRACE_MODE, rate=_trace_rate(self.trace, duration))
        elif arrival.mode != "concurrency" and arrival.rate is not None:
            rate_bound(arrival.rate, duration, "rate" if rate is not None else "duration")
        return replace(
            self,
            arrival=arrival,
            duration=duration,
            warmup=self.warmup if warmup is None else warmup,
            seed=self.seed if seed is None else seed,
        )

    def class_names(self) -> list[str]:
        return [c.name for c in self.classes]

    def to_dict(self) -> dict[str, Any]:
        head: dict[str, Any] = {"name": self.name, "description": self.description}
        tail = {"duration": self.duration, "warmup": self.warmup, "seed": self.seed}
        if self.trace is not None:
            return {**head, **tail, "trace": self.trace.to_dict()}
        arrival: dict[str, Any] = {"mode": self.arrival.mode}
        if self.arrival.rate is not None:
            arrival["rate"] = self.arrival.rate
        if self.arrival.concurrency is not None:
            arrival["concurrency"] = self.arrival.concurrency
        return {
            **head,
            "arrival": arrival,
            **tail,
            "classes": [
                {"name": c.name, "weight": c.weight, "api": c.api,
                 **({"priority": c.priority} if c.priority else {}),
                 "prompt_tokens": c.prompt_tokens.to_dict(),
                 "output_tokens": c.output_tokens.to_dict(),
                 **({"shared_prefix": {"tokens": c.shared_prefix.tokens,
                                       "groups": c.shared_prefix.groups}}
                    if c.shared_prefix else {}),
                 **({"spec_acceptance": c.spec_acceptance}
                    if c.spec_acceptance is not None else {})}
                for c in self.classes
            ],
        }


def openings_note(profile: Profile, prefix_caching: bool) -> str | None:
    """A warning for a simulated engine that replays shared openings with its prefix cache
    off (the simulator's default; vLLM's is on), or None."""
    shared = [c.name for c in profile.classes if c.shared_prefix is not None]
    if not shared or prefix_caching:
        return None
    return (f"the workload's class{'es' if len(shared) > 1 else ''} {', '.join(shared)} "
            f"share{'' if len(shared) > 1 else 's'} openings, but the simulator runs with "
            f"prefix caching off (vLLM's default is on) and prefills every prompt whole: give "
            f"--enable-prefix-caching to model the cache")


def parse_profile(raw: Any, source: str = "profile", base_dir: Path | None = None) -> Profile:
    """Validate a profile mapping; every problem is reported with its field path. A trace's
    relative ``file`` is taken from ``base_dir`` (else the working directory)."""
    if not isinstance(raw, dict):
        raise SpecError(f"must be a mapping with classes, arrival and duration (got "
                        f"{type(raw).__name__})", field=source)
    try:
        spec = ProfileSpec.model_validate(raw)
    except ValidationError as e:
        problems = problems_from(e, ProfileSpec, (source,))
        spec = None
    else:
        problems = []
    if "trace" in raw:
        problems += [(f"{source}.{k}", f"a trace profile takes its {k} from the trace; leave "
                      f"{k} out") for k in ("arrival", "classes") if k in raw]
    elif not isinstance(raw.get("classes"), list) or not raw["classes"]:
        problems.append((f"{source}.classes", "must be a non-empty list of traffic classes"))
    classes = raw.get("classes")
    names = [c.get("name") for c in classes if isinstance(c, dict)] \
        if isinstance(classes, list) else []
    for i, name in enumerate(names):
        if isinstance(name, str) and re.fullmatch(NAME_PATTERN, name) and name in names[:i]:
            problems.append((f"{source}.classes[{i}].name", f"duplicate class name {name!r}"))
    trace = None
    if spec is not None and spec.trace is not None and not problems:
        try:
            trace = read_trace(parse_trace_spec(spec.trace, f"{source}.trace"),
                               base_dir=base_dir, field=f"{source}.trace")
        except SpecError as e:
            problems += e.problems
    if spec is not None and not problems:
        duration = spec.duration if spec.duration is not None else \
            trace.span if trace is not None else 60.0
        if spec.warmup >= duration:
            problems.append((f"{source}.warmup", f"must be shorter than duration "
                             f"({spec.warmup:g}s >= {duration:g}s)"))
        if spec.arrival is not None and spec.arrival.rate is not None \
                and spec.arrival.mode != "concurrency":
            try:
                rate_bound(spec.arrival.rate, duration, f"{source}.arrival.rate")
            except SpecError as e:
                problems += e.problems
    if problems:
        raise SpecError(problems)
    assert spec is not None
    name = spec.name or source
    if trace is not None:
        duration = spec.duration if spec.duration is not None else trace.span
        return Profile(name, _trace_classes(trace),
                       Arrival(TRACE_MODE, rate=_trace_rate(trace, duration)), duration,
                       spec.warmup, spec.seed, spec.description, trace=trace)
    assert spec.classes is not None
    a = spec.arrival or ArrivalSpec(mode="poisson", rate=1.0)
    return Profile(
        name,
        tuple(TrafficClass(c.name, c.weight, c.prompt_tokens.build(), c.output_tokens.build(),
                           c.api, c.priority,
                           SharedPrefix(c.shared_prefix.tokens, c.shared_prefix.groups)
                           if c.shared_prefix else None, c.spec_acceptance)
              for c in spec.classes),
        Arrival(a.mode, rate=a.rate, concurrency=a.concurrency),
        spec.duration if spec.duration is not None else 60.0,
        spec.warmup, spec.seed, spec.description)


def _trace_rate(trace: Trace, duration: float) -> float:
    """The mean rate of what is replayed in ``duration`` (the requests arriving before it,
    scaled)."""
    n = sum(1 for a in trace.arrival if a < duration)
    return n * trace.rate_scale / duration if duration > 0 else 0.0


def _trace_classes(trace: Trace) -> tuple[TrafficClass, ...]:
    """A trace's classes as traffic classes: weight the share of its requests; the length
    "distributions" are the class's mean clipped to its range (informational: the requests
    come from the trace)."""
    out = []
    n = max(len(trace), 1)
    for k, c in enumerate(trace.classes):
        idx = [i for i, x in enumerate(trace.cls) if x == k]
        prompts = [trace.prompt_tokens[i] for i in idx] or [1]
        outputs = [trace.output_tokens[i] for i in idx] or [1]
        out.append(TrafficClass(
            c.name, max(len(idx), 1) / n,
            Constant(value=sum(prompts) / len(prompts), min=min(prompts), max=max(prompts)),
            Constant(value=sum(outputs) / len(outputs), min=min(outputs), max=max(outputs)),
            c.api, c.priority))
    return tuple(out)


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
        raw = yamlsafe.read(p)
    except SpecError as e:
        raise SpecError("; ".join(f"{f}: {m}" if f else m for f, m in e.problems),
                        field="--workload") from e
    return parse_profile(raw, source=p.stem, base_dir=p.parent)


def trace_profile(path: str | Path, field: str = "--trace") -> Profile:
    """A profile replaying the trace file ``path`` whole, its format told by its content (a
    profile file with a ``trace:`` mapping gives every option)."""
    p = Path(path)
    try:
        return parse_profile({"name": p.stem, "trace": {"file": str(p)}}, source=field)
    except SpecError as e:
        raise SpecError([(field if f == f"{field}.trace.file" else f, m)
                         for f, m in e.problems]) from e


@dataclass(frozen=True)
class RequestSpec:
    """One request to replay: when it arrives (seconds from the start; ``None`` in closed-loop
    mode, where it is sent as soon as a slot frees), its token counts, its priority, and the
    opening it shares with other requests of its class (:class:`SharedPrefix`)."""

    rid: int
    arrival: float | None
    prompt_tokens: int
    output_tokens: int
    cls: int
    priority: int = 0
    prefix_group: int = -1
    """Which of its class's openings the prompt starts with; -1: none."""
    prefix_tokens: int = 0
    """How many of its first tokens are that opening's."""

    @property
    def prefix_key(self) -> str | None:
        """The opening's identity across the run (class and group), or None."""
        return f"{self.cls}/{self.prefix_group}" if self.prefix_group >= 0 else None


def generate(profile: Profile, limit: int | None = None) -> list[RequestSpec]:
    """The request sequence of a profile, deterministic for its seed.

    Open-loop modes get arrival times up to ``profile.duration``. Concurrency mode gets a
    sequence with ``arrival=None``, long enough for any run (the engine takes what it needs);
    ``limit`` caps the count. A trace gives its requests that arrive before the duration,
    scaled by its ``rate_scale`` (:func:`_scaled`).
    """
    if profile.trace is not None:
        out = _trace_requests(profile.trace, profile.duration, profile.seed)
        return out if limit is None else out[:limit]
    rng = random.Random(profile.seed)
    # the openings are drawn apart, so a class without them gives the sequence it always did
    prefix_rng = random.Random(f"chunktune-prefix:{profile.seed}")
    weights = [c.weight for c in profile.classes]
    out = []
    t = 0.0
    mode = profile.arrival.mode
    rate = profile.arrival.rate or 1.0
    cap = limit if limit is not None else (MAX_REQUESTS if mode != "concurrency"
                                           else 200_000)
    while len(out) < cap:
        if mode == "poisson":
            t += rng.expovariate(rate)
        elif mode == "constant":
            t = len(out) / rate
        if mode != "concurrency" and t >= profile.duration:
            break
        ci = rng.choices(range(len(weights)), weights=weights)[0]
        c = profile.classes[ci]
        prompt = c.prompt_tokens.sample(rng)
        group, shared = -1, 0
        if c.shared_prefix is not None:
            group = prefix_rng.randrange(c.shared_prefix.groups)
            shared = min(c.shared_prefix.tokens, prompt)
        out.append(RequestSpec(len(out), None if mode == "concurrency" else t, prompt,
                               c.output_tokens.sample(rng), ci, c.priority, group, shared))
    return out


def _trace_requests(trace: Trace, duration: float, seed: int) -> list[RequestSpec]:
    rows = [(a, i) for i, a in enumerate(trace.arrival) if a < duration]
    if trace.rate_scale != 1.0:
        rows = _scaled(rows, trace.rate_scale, duration, seed)
    return [RequestSpec(rid, a, trace.prompt_tokens[i], trace.output_tokens[i], trace.cls[i],
                        trace.priority[i]) for rid, (a, i) in enumerate(rows)]


def _scaled(rows: list[tuple[float, int]], scale: float, span: float, seed: int
            ) -> list[tuple[float, int]]:
    """``round(scale * len(rows))`` requests over the same span: ``ceil(scale)`` copies of the
    rows, copy ``j`` shifted by ``j * span / ceil(scale)`` (wrapping around the span), of which
    a subset drawn from ``seed`` is kept, in arrival order."""
    m = math.ceil(scale)
    pool = sorted(((a + j * span / m) % span if j else a, j, i)
                  for j in range(m) for a, i in rows)
    k = round(scale * len(rows))
    keep = sorted(random.Random(f"chunktune-trace:{seed}").sample(range(len(pool)), k))
    return [(pool[x][0], pool[x][2]) for x in keep]
