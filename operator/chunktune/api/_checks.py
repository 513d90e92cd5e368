"""The rules between fields of a ChunkedPrefillTuning spec, run on the parts that parsed.

Each check adds ``(path, message)`` problems; a part that failed to parse is ``None`` (or left
out of its list) and the checks that need it are skipped, so one mistake is reported once.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from chunktune.api import metrics as _metrics
from chunktune.api._engine import GPU_TYPES
from chunktune.api._retune import slo_watched
from chunktune.api._types import RELATIVE_PATH
from chunktune.api.default_space import MANAGED_FLAGS
from chunktune.api.v1alpha1 import (
    GRID_MAX,
    Budget,
    Constraint,
    EngineSpec,
    Objective,
    Parameter,
    PrunerSpec,
    RetuneSpec,
    SamplerSpec,
    StrategySpec,
    WorkloadSpec,
)
from chunktune.core.distributions import Constant
from chunktune.core.engine_args import EngineArgs, check_windowed_admission
from chunktune.core.errors import SpecError
from chunktune.core.flags import FLAGS, parse_argv
from chunktune.core.gpus import gpu_names, resolve_gpu, with_peer_to_peer
from chunktune.core.models import ModelConfig, catalog_names, from_hf_config, resolve_model
from chunktune.core.suggest import closest
from chunktune.core.validation import Problem
from chunktune.core.workload import (
    DERIVED_CLASSES,
    DERIVED_DURATION,
    Arrival,
    Profile,
    TrafficClass,
    derived_warmup,
)

_IMAGES = {"vllm": "vllm/vllm-openai:v0.11.0", "sglang": "lmsysorg/sglang:latest"}
#: The most traffic classes an inline profile may have (the CRD's maxItems).
MAX_CLASSES = 32
#: The most points a grid search may enumerate.
GRID_POINTS_MAX = 100_000


@dataclass
class Parts:
    """The sections of a spec that parsed on their own (``None`` or absent when not)."""

    kind: str | None
    engine: EngineSpec | None
    params: list[tuple[int, Parameter]]
    params_default: bool
    workload: WorkloadSpec | None
    objectives: list[tuple[int, Objective]]
    n_objectives: int
    constraints: list[tuple[int, Constraint]]
    n_constraints: int
    budget: Budget | None
    sampler: SamplerSpec | None
    pruner: PrunerSpec | None
    pruner_explicit: bool
    storage: str | None
    prometheus_url: Any
    model: ModelConfig | None = None
    profile: Profile | None = None
    strategy: StrategySpec | None = None
    retune: bool = False
    """Whether the spec has ``retune``."""
    retune_spec: RetuneSpec | None = None
    """``retune`` when it parsed."""
    problems: list[Problem] = field(default_factory=list)

    def add(self, path: str, message: str) -> None:
        self.problems.append((path, message))


def check(p: Parts) -> list[Problem]:
    """Every cross-field problem of ``p``."""
    if p.engine is not None:
        _engine(p, p.engine)
    _params(p)
    if p.workload is not None:
        _workload(p, p.workload)
    _retune(p)
    _objectives(p)
    _constraints(p)
    if p.budget is not None:
        _budget(p, p.budget)
    if p.sampler is not None:
        _sampler(p, p.sampler)
    if p.strategy is not None and p.strategy.name == "twin":
        _twin(p, p.strategy)
    elif p.strategy is not None and p.budget is not None and \
            p.strategy.recheck_trials >= p.budget.max_trials:
        p.add("spec.strategy.recheckTrials",
              f"recheckTrials ({p.strategy.recheck_trials}) must be below budget.maxTrials "
              f"({p.budget.max_trials}): the recheck measures again what the study before it "
              "measured, out of the same budget; lower it or raise maxTrials")
    if p.pruner is not None and p.pruner_explicit and p.n_objectives > 1 \
            and p.pruner.name != "none":
        p.add("spec.pruner.name", f"Optuna cannot prune a study with several objectives "
              f"(got {p.n_objectives}); set it to none")
    # NOTE: spec.storage and spec.metrics.prometheusURL are checked by their models (the same
    # patterns as the CRD's).
    return p.problems


# ---- engine -----------------------------------------------------------------------------------


def _engine(p: Parts, e: EngineSpec) -> None:
    if e.kind in _IMAGES and e.image is None:
        p.add("spec.engine.image", f"is required for engine kind {e.kind} (the server image, "
              f"e.g. {_IMAGES[e.kind]})")
    if e.hf_config is not None and e.kind != "sim":
        p.add("spec.engine.modelConfig", "is only used by engine kind sim (a real engine reads "
              "the model's own config.json)")
    if e.kind == "sim":
        _sim_model(p, e)
        if e.gpu.type is None:
            p.add("spec.engine.gpu.type", f"is required for engine kind sim: the simulated GPU, "
                  f"one of {', '.join(gpu_names())}")
    if e.gpu.type is not None:
        try:
            gpu = resolve_gpu(e.gpu.type)
        except SpecError:
            hint = closest(e.gpu.type.lower(), gpu_names())
            tail = f"did you mean {hint!r}?" if hint else f"use one of {', '.join(gpu_names())}"
            p.add("spec.engine.gpu.type", f"unknown GPU {e.gpu.type!r}; {tail}")
        else:
            if e.gpu.type not in GPU_TYPES:  # an alias in another spelling: the CRD's enum
                p.add("spec.engine.gpu.type", f"write the GPU as {gpu.name!r} (names are "
                      f"lower-case, as listed: {', '.join(gpu_names())}; got {e.gpu.type!r})")
            try:
                with_peer_to_peer(gpu, e.gpu.peer_to_peer)
            except SpecError as err:
                for _, msg in err.problems:
                    p.add("spec.engine.gpu.peerToPeer", msg)
    sc = e.security_context
    if sc is not None:
        if e.kind == "sim":
            p.add("spec.engine.securityContext", "applies to vllm and sglang engines; simulated "
                  "engines always run with the restricted profile (remove it)")
        if sc.run_as_non_root and sc.run_as_user == 0:
            p.add("spec.engine.securityContext", "runAsNonRoot: true cannot run as user 0; "
                  "give another runAsUser (e.g. 1000)")
    count, tp = e.gpu.count or 0, e.tensor_parallel_size
    if count < tp:
        p.add("spec.engine.gpu.count", f"must be >= tensorParallelSize (got {count} < {tp})")
    if e.startup_timeout <= 0:
        p.add("spec.engine.startupTimeout", "must be > 0")
    if e.calibration is not None:
        c = e.calibration
        if e.kind != "sim":
            p.add("spec.engine.calibration", f"is only used by engine kind sim (the profile "
                  f"makes the simulator cost steps like a measured engine); remove it for "
                  f"engine kind {e.kind}")
        if (c.file is None) == (c.config_map_key_ref is None):
            p.add("spec.engine.calibration", "give exactly one of file (a profile JSON from "
                  "`chunktune calibrate`) or configMapKeyRef (a ConfigMap key holding one)")
    if e.cpu is not None:
        if e.kind != "vllm":
            p.add("spec.engine.cpu", f"is only used by engine kind vllm (vLLM's CPU build); "
                  f"remove it for engine kind {e.kind}")
        if e.gpu.type is not None:
            p.add("spec.engine.cpu", f"runs vLLM's CPU build, which uses no GPU; remove "
                  f"spec.engine.gpu.type ({e.gpu.type!r}) or spec.engine.cpu")
    _env(p, e)
    _args(p, e)


def _sim_model(p: Parts, e: EngineSpec) -> None:
    if e.hf_config is not None:
        try:
            p.model = from_hf_config(e.hf_config, name=e.model)
        except SpecError as err:
            for path, msg in err.problems:
                key = path.split(": ", 1)[-1]
                p.add(f"spec.engine.modelConfig.{key}", msg)
    else:
        try:
            p.model = resolve_model(e.model)
        except SpecError:
            hint = closest(e.model.lower(), catalog_names())
            tail = f"did you mean {hint!r}?" if hint else \
                f"use one of {', '.join(catalog_names())}"
            p.add("spec.engine.model", f"unknown model {e.model!r} for engine kind sim; {tail} "
                  "(or give its config.json as spec.engine.modelConfig)")
    if p.model is not None and p.model.num_attention_heads % e.tensor_parallel_size:
        p.add("spec.engine.tensorParallelSize",
              f"must divide the model's {p.model.num_attention_heads} attention heads "
              f"(got {e.tensor_parallel_size})")


def _env(p: Parts, e: EngineSpec) -> None:
    seen: dict[str, int] = {}
    for i, v in enumerate(e.env):
        path = f"spec.engine.env[{i}]"
        if (v.value is None) == (v.value_from is None):
            p.add(path, "give exactly one of value or valueFrom")
        if v.value_from is not None and (v.value_from.secret_key_ref is None) == (
                v.value_from.config_map_key_ref is None):
            p.add(f"{path}.valueFrom", "give exactly one of secretKeyRef or configMapKeyRef")
        if v.name in seen:
            p.add(f"{path}.name", f"duplicate variable {v.name!r} (also spec.engine.env"
                  f"[{seen[v.name]}])")
        seen.setdefault(v.name, i)


def _args(p: Parts, e: EngineSpec) -> None:
    """``engine.args``: no flag the manifest sets elsewhere; registry flags with values their
    engine takes (read by the registry's parsers: ``8k`` is 8000 as for vLLM); for the
    simulator, only what it models."""
    engine = e.kind if e.kind in ("vllm", "sim", "sglang") else None
    parsed = parse_argv(e.args, engine=engine)
    named = [(i, s.lstrip("-").replace("_", "-")) for i, s in parsed.unknown]
    named += [(i, n) for n, i in parsed.index.items()]
    for i, name in sorted(named):
        if name in MANAGED_FLAGS:
            p.add(f"spec.engine.args[{i}]", f"--{name} is set by {MANAGED_FLAGS[name]}; remove "
                  "it from args")
    for i, msg in parsed.problems:
        p.add(f"spec.engine.args[{i}]", msg)
    for name in ("max-num-partial-prefills", "max-long-partial-prefills"):
        if parsed.values.get(name, 1) != 1:
            p.add(f"spec.engine.args[{parsed.index[name]}]", f"--{name} other than 1 makes "
                  "vLLM's V1 engine refuse to start (Concurrent Partial Prefill is not supported)")
    if e.kind != "sim":
        return
    for i in parsed.stray:
        p.add(f"spec.engine.args[{i}]", f"expected a --flag (got {e.args[i]!r})")
    known = ", ".join(sorted(f.option for f in FLAGS.values() if "sim" in f.engines))
    for i, spelling in parsed.unknown:
        if spelling.lstrip("-").replace("_", "-") not in MANAGED_FLAGS:
            p.add(f"spec.engine.args[{i}]", f"the simulator does not model {spelling}; it takes "
                  f"{known}")
    try:
        EngineArgs.from_point(parsed.values).check_simulated()
    except SpecError as err:
        for path, msg in err.problems:
            name = path.removeprefix("--")
            where = f"spec.engine.args[{parsed.index[name]}]" if name in parsed.index \
                else "spec.engine.args"
            p.add(where, f"{path} {msg}")
    if p.model is not None:
        _windowed_gate(p, e, p.model, parsed.values, "")


def _windowed_gate(p: Parts, e: EngineSpec, model: ModelConfig, values: dict[str, Any],
                   prefix: str) -> None:
    """The simulator does not schedule ``model`` under the release ``e`` names when vLLM
    0.19's whole-sequence gate would hold its windowed layers back
    (:func:`check_windowed_admission`); the problem is at the field that named the release."""
    try:
        version = e.effective_vllm_version()
    except SpecError:  # reported with vllmVersion
        return
    try:
        check_windowed_admission(model, version, EngineArgs.from_point(
            values).scheduler_reserve_full_isl)
    except SpecError as err:
        where = "spec.engine.image" if e.vllm_version is None else "spec.engine.vllmVersion"
        searched = [i for i, prm in p.params if prm.name == "scheduler-reserve-full-isl"]
        for _, msg in err.problems:
            if searched:  # its off setting alone is modelled: searching it cannot be
                p.add(f"spec.searchSpace[{searched[0]}].name", prefix + msg.replace(
                    "or pass --no-scheduler-reserve-full-isl", "or stop searching "
                    "scheduler-reserve-full-isl and pass --no-scheduler-reserve-full-isl"))
            else:
                p.add(where, prefix + msg)


# ---- search space -----------------------------------------------------------------------------


def _params(p: Parts) -> None:
    fixed = parse_argv(p.engine.args).index if p.engine else {}
    try:
        version = p.engine.effective_vllm_version() if p.engine is not None else None
    except SpecError:  # reported with the engine
        version = None
    seen: dict[str, int] = {}
    for i, prm in p.params:
        path = f"spec.searchSpace[{i}]"
        if p.params_default:
            if prm.name in fixed:
                j = fixed[prm.name]
                p.add(f"spec.engine.args[{j}]", f"--{prm.name} is fixed here but the default "
                      "search space searches it; remove it or give spec.searchSpace")
            continue
        flag = FLAGS[prm.name]
        if p.kind is not None and p.kind not in flag.engines:
            if p.kind == "sglang":
                p.add(f"{path}.name", f"{prm.name} is a vLLM flag; for SGLang search "
                      "chunked-prefill-size")
            else:
                p.add(f"{path}.name", f"{prm.name} is an SGLang flag (engine kind sglang); vLLM "
                      "has no prefill chunk size: search max-num-batched-tokens (the step token "
                      "budget) and long-prefill-token-threshold (the per-request cap)")
        if prm.name in seen:
            p.add(f"{path}.name", f"duplicate parameter {prm.name!r} (also spec.searchSpace"
                  f"[{seen[prm.name]}])")
        seen.setdefault(prm.name, i)
        if prm.name in fixed and p.engine is not None:
            j = fixed[prm.name]
            p.add(f"{path}.name", f"{prm.name} is searched but also fixed in "
                  f"spec.engine.args[{j}] ({p.engine.args[j]!r}); remove one of them")
        if flag.within and flag.within not in fixed and p.engine is not None:
            p.add(f"{path}.name", f"{prm.name} sets {flag.attr} inside --{flag.within}: give "
                  f"--{flag.within} (its method) in spec.engine.args, e.g. --{flag.within} "
                  "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'")
        if version is not None and (why := flag.absent_from(version)) is not None:
            p.add(f"{path}.name", why)
        if prm.is_switch:
            _switch(p, path, prm)
        elif prm.choices is not None:
            _choices(p, path, prm)
        else:
            _range(p, path, prm)


def _switch(p: Parts, path: str, prm: Parameter) -> None:
    given = sorted({"choices", "type", "low", "high", "step"} & prm.model_fields_set
                   | ({"log"} if prm.log else set()))
    if given:
        p.add(path, f"{prm.name} is a switch: give its name alone and both --{prm.name} and "
              f"--no-{prm.name} are searched (remove {', '.join(given)})")


def _choices(p: Parts, path: str, prm: Parameter) -> None:
    mixed = sorted({"type", "low", "high", "step"} & prm.model_fields_set)
    if mixed:
        p.add(path, f"give either choices or type with low and high, not both (remove "
              f"{', '.join(mixed)})")
    if prm.log:
        p.add(f"{path}.log", "applies to ranges, not choices")
    assert prm.choices is not None
    first: dict[float, int] = {}
    for k, v in enumerate(prm.choices):
        if v in first:
            p.add(f"{path}.choices[{k}]", f"must be distinct ({_text(prm.name, v)} is also "
                  f"choices[{first[v]}])")
        first.setdefault(v, k)
        why = _value_problem(prm.name, v)
        if why is None:
            why = _model_limit(p, prm.name, v)
        if why:
            p.add(f"{path}.choices[{k}]", why)


def _range(p: Parts, path: str, prm: Parameter) -> None:
    flag = FLAGS[prm.name]
    if prm.type is None:
        p.add(path, "needs either type (int or float) with low and high, or choices")
        return
    if prm.type != flag.kind:  # the CRD's enum holds only int and float flags
        why = "the engine takes an integer" if flag.kind == "int" else "it is a fraction"
        p.add(f"{path}.type", f"must be {flag.kind} for --{prm.name} ({why})")
    low, high, step = prm.low, prm.high, prm.step
    if step is not None and step <= 0:
        p.add(f"{path}.step", f"must be > 0 (got {_text(prm.name, step)})")
        step = None
    for key, v in (("low", low), ("high", high)):
        if v is None:
            p.add(f"{path}.{key}", f"is required for a {prm.type} range")
    if prm.type == "int":
        for key, v in (("low", low), ("high", high), ("step", step)):
            if isinstance(v, float):
                p.add(f"{path}.{key}", f"must be an integer for type int (got {v!r})")
    if prm.log:
        if step is not None and (prm.type == "float" or step != 1):
            p.add(f"{path}.log", f"cannot be combined with step {_text(prm.name, step)}: "
                  "Optuna "
                  "samples a log scale only with step 1 (int) or no step (float); drop step or "
                  "log")
        if low is not None and low <= 0:
            p.add(f"{path}.low", f"must be > 0 on a log scale (got {_text(prm.name, low)})")
            return
    if low is None or high is None:
        return
    if low > high:
        p.add(f"{path}.low", f"must be <= high (got {_text(prm.name, low)} > "
              f"{_text(prm.name, high)})")
        return
    for key, v in (("low", low), ("high", high)):
        problem = _value_problem(prm.name, v) or _model_limit(p, prm.name, v)
        if problem:
            p.add(f"{path}.{key}", problem)
    eff = prm.effective_step
    if eff is not None and eff > 0 and (high - low) / eff > GRID_MAX:
        p.add(f"{path}.step", f"gives {(high - low) / eff:.3g} values from {_text(prm.name, low)} "
              f"to {_text(prm.name, high)}; at most {GRID_MAX}: use a larger step")
        return
    if eff is not None and eff > 0 and not prm.log:
        n = (high - low) / eff
        if abs(n - round(n)) > 1e-9:
            top = low + math.floor(n + 1e-9) * eff
            p.add(f"{path}.high", f"is not reachable from low {_text(prm.name, low)} in steps of "
                  f"{_text(prm.name, eff)}; use high {_text(prm.name, top)}")


def _value_problem(name: str, v: float) -> str | None:
    flag = FLAGS[name]
    if flag.kind == "int" and isinstance(v, float):
        return f"must be an integer for {flag.option} (got {v!r})"
    problem = flag.problem(v)
    if problem is None:
        return None
    return f"is not a valid {flag.option} value ({problem}; got {flag.text(v)})"


def _text(name: str, v: float) -> str:
    return FLAGS[name].text(v)


def _model_limit(p: Parts, name: str, v: float) -> str | None:
    if name == "max-model-len" and p.model is not None and v > p.model.max_position_embeddings:
        return (f"exceeds the model's max_position_embeddings ({p.model.max_position_embeddings})"
                f"; the engine refuses to start (got {_text(name, v)})")
    return None


# ---- workload, objectives, constraints --------------------------------------------------------


def _workload(p: Parts, w: WorkloadSpec) -> None:
    given = [k for k, v in (("profile", w.profile), ("inline", w.inline), ("trace", w.trace),
                            ("fromPrometheus", w.from_prometheus)) if v is not None]
    if len(given) > 1:
        p.add("spec.workload", f"give one of profile, inline, trace or fromPrometheus, not "
              f"{' and '.join(given)}")
        return
    if not given:
        p.add("spec.workload", "needs profile (a shipped profile name or a file path), inline "
              "(a profile mapping), trace (a request trace) or fromPrometheus (derived from "
              "the deployment's metrics)")
        return
    if w.from_prometheus is not None:
        # derived at study start: its shape is known (the classes), its figures are not yet
        w = w.model_copy()
        w.use_derived(derived_shape(w.duration or DERIVED_DURATION))
    classes = (w.inline or {}).get("classes")
    if isinstance(classes, list) and len(classes) > MAX_CLASSES:
        p.add("spec.workload.inline.classes", f"must have at most {MAX_CLASSES} traffic classes "
              f"(got {len(classes)})")
        return
    inline_trace = (w.inline or {}).get("trace")
    ref = inline_trace.get("file") if isinstance(inline_trace, dict) else None
    if ref is not None and (not isinstance(ref, str) or len(ref) > 1024
                            or not re.fullmatch(RELATIVE_PATH, ref)):
        # the rule of spec.workload.trace.file and spec.workload.profile: a file next to the
        # manifest, never one elsewhere on the machine (or the operator's pod)
        p.add("spec.workload.inline.trace.file", "must be a relative path to a trace file "
              "next to the manifest: names of letters, digits, '_', '-' and '.', no '..' and "
              "no absolute path")
        return
    if w.trace is not None and (w.trace.file is None) == (w.trace.config_map_key_ref is None):
        p.add("spec.workload.trace", "give exactly one of file (a trace file next to the "
              "manifest) or configMapKeyRef (a ConfigMap key the operator reads)")
        return
    if w.trace is not None and (w.rate is not None or w.concurrency is not None):
        p.add(f"spec.workload.{'rate' if w.rate is not None else 'concurrency'}",
              "a trace replays its own arrival times: set trace.speedup or trace.rateScale")
        return
    if w.trace_pending:  # read (and checked with the classes it names) when the study starts
        return
    if w.rate is not None and w.concurrency is not None:
        p.add("spec.workload.concurrency", "cannot be combined with rate; give one of them")
    try:
        p.profile = w.resolve()
    except SpecError as e:
        p.problems += e.problems
        return
    if p.profile.duration <= 0:
        p.add("spec.workload.duration", "must be > 0")
    elif p.profile.warmup >= p.profile.duration:
        d, wu = f"{p.profile.duration:g}s", f"{p.profile.warmup:g}s"
        if w.warmup is not None:
            p.add("spec.workload.warmup", f"must be shorter than the duration ({wu} >= {d})")
        else:
            p.add("spec.workload.duration", f"must be longer than the profile's warmup "
                  f"({d} <= {wu})")


def derived_shape(duration: float) -> Profile:
    """What a workload derived from Prometheus looks like before it is derived: its classes
    (``short``, ``long``), its duration and the warm-up
    :func:`chunktune.metrics.derive.derive` gives it."""
    one = Constant(value=1.0)
    return Profile(name="fromPrometheus",
                   classes=tuple(TrafficClass(c, 1.0, one, one) for c in DERIVED_CLASSES),
                   arrival=Arrival("poisson", rate=1.0), duration=duration,
                   warmup=derived_warmup(duration))


def _retune(p: Parts) -> None:
    if p.retune and p.workload is not None and p.workload.from_prometheus is None:
        p.add("spec.retune", "needs spec.workload.fromPrometheus: the operator watches the "
              "deployment's workload in the Prometheus it names")
    r = p.retune_spec
    if r is None:
        return
    d = r.drift
    if d.rate is None and d.prompt_length is None and d.long_share is None and \
            p.n_constraints == len(p.constraints) and \
            not (r.slo and any(slo_watched(c) for _, c in p.constraints)):
        why = ("slo is false" if not r.slo else "no constraint is an upper bound on the TTFT, "
               "ITL or end-to-end latency of all requests (e.g. 'ttft_p99 <= 2s')")
        p.add("spec.retune.drift", f"sets no limit and {why}, so a re-tune can never start; "
              "set a drift limit (e.g. rate: 0.3) or let slo watch a latency bound")
    prom = p.workload.from_prometheus if p.workload is not None else None
    window = r.window if r.window is not None else prom.window if prom is not None else None
    if window is not None and r.interval > window:
        p.add("spec.retune.interval", f"({r.interval:g}s) is longer than the window each check "
              f"reads ({window:g}s), so traffic between windows is never seen; shorten it or "
              "lengthen spec.retune.window")


def _class(p: Parts, path: str, metric: str, cls: str | None) -> None:
    if cls is None:
        return
    if not _metrics.METRICS[metric].per_class:
        p.add(path, f"{metric} is engine-wide; it has no per-class value")
    elif p.profile is not None and cls not in p.profile.class_names():
        names = p.profile.class_names()
        hint = closest(cls, names)
        tail = f"; did you mean {hint!r}?" if hint else ""
        p.add(path, f"unknown class {cls!r}; the workload's classes are {', '.join(names)}{tail}")


def _step_log_metric(p: Parts, path: str, metric: str) -> None:
    if metric == "engine_itl_p99" and p.kind == "sglang":
        p.add(path, "engine_itl_p99 comes from vLLM's step log "
              "(--enable-logging-iteration-details), which engine kind sglang does not write; "
              "use itl_p99")


def _objectives(p: Parts) -> None:
    seen: dict[str, int] = {}
    for i, o in p.objectives:
        path = f"spec.objectives[{i}]"
        _class(p, f"{path}.class", o.metric, o.class_)
        _step_log_metric(p, f"{path}.metric", o.metric)
        if o.key in seen:
            p.add(path, f"duplicate objective {o.key} (also spec.objectives[{seen[o.key]}])")
        seen.setdefault(o.key, i)
        if o.metric == "goodput" and not any(
                _metrics.METRICS[c.metric].is_latency and c.class_ in (None, o.class_)
                for _, c in p.constraints) and p.n_constraints == len(p.constraints):
            p.add(f"{path}.metric", "goodput counts requests that meet every latency bound of "
                  "their class, but spec.constraints sets none; add one (e.g. "
                  "'chat.ttft_p99 <= 2s') or use request_rate")


def _constraints(p: Parts) -> None:
    seen: dict[tuple[str, str], int] = {}
    for i, c in p.constraints:
        path = f"spec.constraints[{i}]"
        if (c.max is None) == (c.min is None):
            p.add(path, "give exactly one of max or min" + (" (got both)" if c.max is not None
                                                           else ""))
            continue
        _class(p, f"{path}.class", c.metric, c.class_)
        _step_log_metric(p, f"{path}.metric", c.metric)
        side = "max" if c.max is not None else "min"
        if (c.key, side) in seen:
            p.add(path, f"duplicate constraint on {c.key} {side} (also spec.constraints"
                  f"[{seen[c.key, side]}])")
        seen.setdefault((c.key, side), i)


# ---- budget and sampler -----------------------------------------------------------------------


def _budget(p: Parts, b: Budget) -> None:
    if b.parallelism > b.max_trials:
        p.add("spec.budget.parallelism",
              f"must be <= maxTrials (got {b.parallelism} > {b.max_trials})")
    if b.trial_timeout <= 0:
        p.add("spec.budget.trialTimeout", "must be > 0")
    elif p.kind not in ("sim", None) and p.profile is not None and \
            b.trial_timeout <= p.profile.duration:
        p.add("spec.budget.trialTimeout", f"must be longer than the workload's duration "
              f"({p.profile.duration:g}s), or every trial times out (got {b.trial_timeout:g}s)")
    if b.max_duration is not None and b.max_duration <= 0:
        p.add("spec.budget.maxDuration", "must be > 0")


def _sampler(p: Parts, s: SamplerSpec) -> None:
    where = "spec.sampler.name"
    if s.name == "cmaes":
        if p.n_objectives > 1:
            p.add(where, f"cmaes optimizes a single objective (got {p.n_objectives}); use tpe, gp "
                  "or nsga2 for several")
        if p.n_constraints:
            p.add(where, "cmaes ignores constraints (Optuna warns and optimizes without them); "
                  "use tpe, gp or nsga2, which model them")
        if p.params and all(prm.choices is not None or prm.is_switch for _, prm in p.params):
            p.add(where, "cmaes searches int and float ranges, but every parameter here is a "
                  "list of choices, which it samples at random; use tpe")
    if s.name == "grid":
        points = 1.0
        for i, prm in p.params:
            if not prm.is_finite:
                p.add(where, f"grid needs finitely many values, but spec.searchSpace[{i}] "
                      f"({prm.name}) is a float range without step; add step or use choices")
            elif prm.is_switch:
                points *= 2
            elif prm.choices is not None:
                points *= len(prm.choices)
            elif prm.low is not None and prm.high is not None and prm.effective_step:
                points *= max(1.0, (prm.high - prm.low) / prm.effective_step + 1)
        if points > GRID_POINTS_MAX:
            p.add(where, f"grid would enumerate {points:.3g} points (at most "
                  f"{GRID_POINTS_MAX}); use larger steps, fewer choices or another sampler")


# ---- strategy -----------------------------------------------------------------------------------

#: ``spec.engine.model`` prefix of the tiny model ``chunktune model tiny DIR`` writes.
TINY_PREFIX = "tiny:"


def _twin(p: Parts, s: StrategySpec) -> None:
    """A twin-first study: the engine must write vLLM's step log, the simulator must know the
    model and the device, and the real-trial budget must hold calibration and confirmation."""
    where = "spec.strategy"
    if p.budget is not None and s.calibration_trials + s.confirm_trials > p.budget.max_trials:
        p.add(f"{where}.confirmTrials",
              f"calibrationTrials ({s.calibration_trials}) + confirmTrials ({s.confirm_trials}) "
              f"must be <= budget.maxTrials ({p.budget.max_trials}), the real-trial budget of a "
              "twin study; lower them or raise maxTrials")
    if p.budget is not None and s.recheck_trials and \
            s.calibration_trials + s.confirm_trials <= p.budget.max_trials < \
            s.calibration_trials + s.confirm_trials + s.recheck_trials:
        p.add(f"{where}.recheckTrials",
              f"calibrationTrials ({s.calibration_trials}) + confirmTrials ({s.confirm_trials}) "
              f"+ recheckTrials ({s.recheck_trials}) must be <= budget.maxTrials "
              f"({p.budget.max_trials}): the recheck is kept out of the real-trial budget; "
              "lower them or raise maxTrials")
    e = p.engine
    if e is None:
        return
    if e.kind == "sglang":
        p.add(f"{where}.name", "twin calibrates the simulator on vLLM's step log "
              "(--enable-logging-iteration-details), which engine kind sglang does not write; "
              "use strategy real")
        return
    if e.kind != "vllm":
        return
    if e.cpu is None and e.gpu.type is None:
        p.add("spec.engine.gpu.type", "is required for strategy twin: the twin simulates the "
              f"engine on this GPU (one of {', '.join(gpu_names())}), or give spec.engine.cpu "
              "for vLLM's CPU build")
    m = e.model
    if m.startswith(TINY_PREFIX) or m.startswith(("/", "./", "../", "~")):
        return  # the model's own config.json is read when the study runs
    try:
        model = resolve_model(m)
    except SpecError:
        p.add("spec.engine.model", f"strategy twin needs the model's architecture, and the "
              f"simulator does not know {m!r}: give a local model directory (./path with its "
              f"config.json) or a catalogued model ({', '.join(catalog_names())})")
        return
    _windowed_gate(p, e, model, parse_argv(e.args, engine="vllm").values,
                   "strategy twin simulates this engine: ")
