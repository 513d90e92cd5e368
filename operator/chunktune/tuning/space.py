"""The search space in Optuna's terms, the engine's default point, and the checks that keep
configurations vLLM refuses from ever being launched.

A point is a dict ``{flag: value}`` keyed by the flag without dashes
(``max-num-batched-tokens``). :func:`feasibility` runs, before any launch, the rules vLLM applies
at start-up (``sim.config.check_scheduler_rules``), and — with ``prescreen`` and a model the
simulator knows — the start-up memory model, so a point predicted to run out of memory is
recorded as such instead of costing a GPU start-up.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from chunktune.api.v1alpha1 import Parameter
from chunktune.backends.base import EngineTarget
from chunktune.errors import SpecError
from chunktune.sim.args import parse_engine_flags
from chunktune.sim.config import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    EngineArgs,
    EngineStartupError,
    batch_defaults,
    check_scheduler_rules,
    resolve,
)
from chunktune.sim.gpus import GPU, resolve_gpu
from chunktune.sim.memory import plan_memory
from chunktune.sim.models import ModelConfig, from_hf_config, resolve_model

#: Flag name -> EngineArgs field.
FIELD = {
    "max-num-batched-tokens": "max_num_batched_tokens",
    "long-prefill-token-threshold": "long_prefill_token_threshold",
    "max-num-seqs": "max_num_seqs",
    "gpu-memory-utilization": "gpu_memory_utilization",
    "max-model-len": "max_model_len",
}


def distribution(p: Parameter) -> BaseDistribution:
    if p.choices is not None:
        return CategoricalDistribution(list(p.choices))
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


#: ``(max-num-batched-tokens, max-num-seqs)`` vLLM's CPU build defaults to in its API server.
CPU_BATCH_DEFAULTS = (2048, 128)


@dataclass(frozen=True)
class EngineContext:
    """What the tuner knows about the engine without starting it."""

    target: EngineTarget
    fixed: EngineArgs
    model: ModelConfig | None
    """None when the simulator does not know the model (a vLLM engine with an uncatalogued
    model and no ``modelConfig``): rules needing it are left to the engine."""
    gpu: GPU | None

    @classmethod
    def build(cls, target: EngineTarget) -> EngineContext:
        fixed, _, _ = parse_engine_flags(list(target.fixed_args))
        if target.tensor_parallel_size > 1:
            fixed.tensor_parallel_size = target.tensor_parallel_size
        model: ModelConfig | None
        try:
            model = (from_hf_config(target.hf_config, name=target.model)
                     if target.hf_config else resolve_model(target.model))
        except SpecError:
            model = None
        try:
            gpu = resolve_gpu(target.gpu) if target.gpu else None
        except SpecError:
            gpu = None
        return cls(target, fixed, model, gpu)

    def engine_args(self, point: dict[str, Any]) -> EngineArgs:
        args = dataclasses.replace(self.fixed)
        for flag, value in point.items():
            if flag in FIELD:
                setattr(args, FIELD[flag], value)
        return args

    def default_point(self, params: Sequence[Parameter]) -> dict[str, Any]:
        """vLLM's defaults for the searched flags on this GPU class (facts §1): trial 0.

        Flags fixed in ``engine.args`` keep their fixed value. A flag whose default cannot be
        known here (``max-model-len`` of an unknown model) is left out: the engine decides.
        """
        fixed = self.fixed
        if self.target.cpu is not None:
            # vLLM's CPU build, API server: 2048 tokens and 128 sequences per step
            # (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults, 0.32).
            budget_default, seqs_default = CPU_BATCH_DEFAULTS
        else:
            budget_default, seqs_default = batch_defaults(self.gpu) if self.gpu else (2048, 256)
        max_len = fixed.max_model_len or (self.model.max_position_embeddings
                                          if self.model else None)
        budget = fixed.max_num_batched_tokens
        if budget is None:
            budget = (budget_default if fixed.enable_chunked_prefill
                      else max(max_len or 2048, 2048))
        values: dict[str, Any] = {
            "max-num-batched-tokens": budget,
            "max-num-seqs": fixed.max_num_seqs or min(seqs_default, budget),
            "long-prefill-token-threshold": fixed.long_prefill_token_threshold,
            "gpu-memory-utilization": fixed.gpu_memory_utilization
            or DEFAULT_GPU_MEMORY_UTILIZATION,
            "max-model-len": max_len,
            # SGLang's default by GPU memory (facts §6): 8192 on 60-160 GB cards.
            "chunked-prefill-size": 8192 if (self.gpu and self.gpu.memory_gib >= 60) else 4096,
        }
        return {p.name: values[p.name] for p in params if values.get(p.name) is not None}

    def feasibility(self, point: dict[str, Any], prescreen: bool) -> EngineStartupError | None:
        """Why the engine would refuse this point, or None. Always applies vLLM's scheduler
        rules; with ``prescreen`` and a known model and GPU, also the start-up memory model
        (reason prefixed ``Predicted``)."""
        args = self.engine_args(point)
        try:
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
        budget = args.max_num_batched_tokens
        seqs = args.max_num_seqs
        if budget is None or seqs is None:
            gb, gs = batch_defaults(self.gpu) if self.gpu else (2048, 256)
            budget = budget or gb
            seqs = seqs or min(gs, budget)
        try:
            check_scheduler_rules(budget, seqs, args.max_model_len, args.enable_chunked_prefill,
                                  args.max_num_partial_prefills, args.max_long_partial_prefills)
        except EngineStartupError as e:
            return e
        return None
