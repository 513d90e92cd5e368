"""The search space in Optuna's terms, the engine's default point, and the checks that keep
configurations vLLM refuses from ever being launched.

A point is a dict ``{flag: value}`` keyed by the flag without dashes
(``max-num-batched-tokens``). :func:`feasibility` runs, before any launch, the rules vLLM applies
at start-up (``core.engine_args.check_scheduler_rules``), and — with ``prescreen`` and a model the
simulator knows — the start-up memory model, so a point predicted to run out of memory is
recorded as such instead of costing a GPU start-up.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from chunktune.api.v1alpha1 import Parameter
from chunktune.core.engine_args import (
    EngineArgs,
    EngineStartupError,
    check_scheduler_rules,
    resolve,
)
from chunktune.core.errors import SpecError
from chunktune.core.flags import FLAGS, engine_defaults, parse_argv
from chunktune.core.gpus import GPU
from chunktune.core.models import ModelConfig, from_hf_config, resolve_model
from chunktune.core.trials import EngineTarget
from chunktune.core.vllm_release import Version, parse_version
from chunktune.sim.engine.memory import plan_memory


def sim_part(point: dict[str, Any]) -> dict[str, Any]:
    """The flags of a point the simulator's engine arguments take (SGLang's are left out)."""
    return {k: v for k, v in point.items() if "sim" in FLAGS[k].engines}


def distribution(p: Parameter) -> BaseDistribution:
    if p.is_switch or p.choices is not None:
        return CategoricalDistribution(p.grid_values())
    assert p.low is not None and p.high is not None
    if p.type == "int":
        return IntDistribution(int(p.low), int(p.high), log=p.log,
                               step=int(p.effective_step or 1))
    return FloatDistribution(float(p.low), float(p.high), log=p.log,
                             step=None if p.step is None else float(p.step))


def distributions(params: Sequence[Parameter]) -> dict[str, BaseDistribution]:
    return {p.name: distribution(p) for p in params}


def contains(dist: BaseDistribution, value: Any) -> bool:
    """Whether Optuna can record ``value`` under ``dist`` (ranges may be left, with a warning;
    categorical choices may not)."""
    if isinstance(dist, CategoricalDistribution):
        return value in dist.choices
    return True


def suggest(trial: optuna.Trial, params: Sequence[Parameter]) -> dict[str, Any]:
    """The trial's point, one ``suggest_*`` per parameter (fixed values from
    ``enqueue_trial`` come back as they were given)."""
    out: dict[str, Any] = {}
    with warnings.catch_warnings():
        # A baseline outside an int range is recorded as it is, on purpose.
        warnings.filterwarnings("ignore", message="Fixed parameter .* is out of range")
        for p in params:
            d = distribution(p)
            if isinstance(d, CategoricalDistribution):
                out[p.name] = trial.suggest_categorical(p.name, d.choices)
            elif isinstance(d, IntDistribution):
                out[p.name] = trial.suggest_int(p.name, d.low, d.high, step=d.step, log=d.log)
            else:
                assert isinstance(d, FloatDistribution)
                out[p.name] = trial.suggest_float(p.name, d.low, d.high, step=d.step, log=d.log)
    return out


def grid(params: Sequence[Parameter]) -> dict[str, list[Any]]:
    return {p.name: p.grid_values() for p in params}


# ---- the engine's own configuration ----------------------------------------------------------

#: ``spec.engine.model: tiny:DIR``: the random-weight model ``chunktune model tiny DIR`` writes.
TINY_PREFIX = "tiny:"


def model_dir(model: str) -> Path:
    """Where a model given as files would be: the tiny model's directory, or the path."""
    if model.startswith(TINY_PREFIX):
        return Path(model[len(TINY_PREFIX):] or ".chunktune/models/tiny")
    return Path(model).expanduser()


def engine_model(target: EngineTarget) -> ModelConfig | None:
    """The model the engine serves, as far as it is known without starting it: the target's
    ``modelConfig``, the tiny model's ``config.json`` (its built-in config when the directory
    is not on this machine: a trial pod writes the same), a local directory's ``config.json``,
    or a catalogued model; None for another model (raises :class:`SpecError` for a config
    that does not parse)."""
    if target.hf_config:
        return from_hf_config(target.hf_config, name=target.model)
    m = target.model
    where = model_dir(m)
    if (where / "config.json").is_file():
        return resolve_model(None, where / "config.json")
    if m.startswith(TINY_PREFIX):
        from chunktune.modelgen.tiny import TINY

        return from_hf_config(TINY.config(), name=where.name or "tiny")
    try:
        return resolve_model(m, field="spec.engine.model")
    except SpecError:
        return None


@dataclass(frozen=True)
class EngineContext:
    """What the tuner knows about the engine without starting it."""

    target: EngineTarget
    fixed: EngineArgs
    model: ModelConfig | None
    """None when the simulator does not know the model (a vLLM engine with an uncatalogued
    model and no ``modelConfig``): rules needing it are left to the engine."""
    gpu: GPU | None
    version: Version | None
    """The vLLM release the target names (``vllmVersion`` or its image's tag), None for the
    current one."""

    @classmethod
    def build(cls, target: EngineTarget) -> EngineContext:
        parsed = parse_argv(list(target.fixed_args), engine="sim")
        fixed = EngineArgs.from_point(parsed.values)
        if target.tensor_parallel_size > 1:
            fixed.tensor_parallel_size = target.tensor_parallel_size
        model: ModelConfig | None
        try:
            model = engine_model(target)
        except (SpecError, OSError):  # a config that does not parse or cannot be read
            model = None
        try:
            gpu = target.node_gpu() if target.gpu else None
        except SpecError:
            gpu = None
        version = (parse_version(target.vllm_version, "spec.engine.vllmVersion")
                   if target.vllm_version else None)
        return cls(target, fixed, model, gpu, version)

    def engine_args(self, point: dict[str, Any]) -> EngineArgs:
        """The fixed arguments with the point's flags set."""
        return EngineArgs.from_point(sim_part(point), base=self.fixed)

    def defaults(self, point: dict[str, Any] | None = None) -> dict[str, Any]:
        """Every flag's value when the engine starts with the fixed args and ``point``
        (:func:`chunktune.core.flags.engine_defaults`), as the release the target names
        defaults them (the current one when it names none)."""
        engine = "sglang" if self.target.kind == "sglang" else "vllm"
        given = {**parse_argv(list(self.target.fixed_args), engine=engine).values,
                 **(point or {})}
        return engine_defaults(given, self.gpu, self.model.max_position_embeddings
                               if self.model else None, engine=engine,
                               cpu=self.target.cpu is not None, version=self.version)

    def default_point(self, params: Sequence[Parameter]) -> dict[str, Any]:
        """The engine's defaults for the searched flags on this GPU class: trial 0
        (docs/vllm-behaviour.md §2).

        Flags fixed in ``engine.args`` keep their fixed value. A flag whose default cannot be
        known here (``max-model-len`` of an unknown model) is left out: the engine decides.
        """
        values = self.defaults()
        return {p.name: values[p.name] for p in params if values.get(p.name) is not None}

    def feasibility(self, point: dict[str, Any], prescreen: bool) -> EngineStartupError | None:
        """Why the engine would refuse this point, or None. Always applies vLLM's scheduler
        rules; with ``prescreen`` and a known model and GPU, also the start-up memory model
        (reason prefixed ``Predicted``)."""
        try:
            args = self.engine_args(point)
            args.check()
        except SpecError as e:
            return EngineStartupError("ConfigRejected", str(e))
        if self.model is not None and self.gpu is not None:
            try:
                cfg = resolve(args, self.model, self.gpu)
            except EngineStartupError as e:
                return e
            if prescreen:
                try:
                    plan_memory(cfg)
                except EngineStartupError as e:
                    return EngineStartupError("Predicted" + e.reason, e.message, e.hint)
            return None
        values = self.defaults(sim_part(point))
        budget, seqs = values["max-num-batched-tokens"], values["max-num-seqs"]
        # the model's context length where --max-model-len is not given (vLLM's default)
        max_len = args.max_model_len or values.get("max-model-len")
        try:
            check_scheduler_rules(budget, seqs, max_len, args.enable_chunked_prefill,
                                  args.max_num_partial_prefills, args.max_long_partial_prefills,
                                  values.get("long-prefill-token-threshold") or 0)
        except EngineStartupError as e:
            return e
        return None
