"""The twin of a study's engine, and its calibration: the simulator running the same model,
device and fixed flags (:func:`twin_target`), costed with a profile fitted to the step logs and
measured latencies of the study's real trials (:func:`fit_profile`, :func:`study_profile`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chunktune.backends.simulated import (
    SimulatedBackend,
    target_engine_args,
    target_vllm_env,
)
from chunktune.core.engine_args import EngineStartupError, resolve
from chunktune.core.errors import ChunktuneError, SpecError
from chunktune.core.flags import FLAGS, argv, parse_argv
from chunktune.core.gpus import GPU, resolve_gpu
from chunktune.core.models import CATALOG_HF, ModelConfig, catalog_key
from chunktune.core.steps import outside_engine
from chunktune.core.trials import EngineTarget, TrialState
from chunktune.core.vllm_release import parse_version
from chunktune.modelgen.tiny import TINY
from chunktune.sim.calibration import profile as profiles
from chunktune.sim.calibration.step_fit import StepLog
from chunktune.sim.cost.step_time import StepCostModel
from chunktune.sim.engine.virtual import engine_cost
from chunktune.tuning import space
from chunktune.tuning import study as st
from chunktune.tuning.runner import TrialRunner

#: ``simulate(point, profile) -> metrics``: a trial at ``point`` replayed in the twin.
Simulate = Callable[[dict[str, Any], profiles.CalibrationProfile], dict[str, float]]
#: The wall time between steps tried when fitting it to measured latencies (seconds).
STEP_GAPS = (0.0, 0.00025, 0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.006)
#: The measured latencies the step gap and the time before the first token are fitted to.
GAP_FIT_KEYS = ("e2e_p50", "e2e_p99", "itl_p50")
#: Delivery stalls tried when fitting the clients' share of the time between tokens: the
#: probability that a token reaches its client late, and the mean delay.
STALL_PROBS = (0.005, 0.01, 0.02, 0.04)
STALL_MEANS = (0.001, 0.002, 0.004, 0.008)
#: Replays the fit keeps (one per calibration run, with room to spare).
REUSED_REPLAYS = 16
#: The measured ITL percentiles that fit is judged on (over all requests).
STALL_FIT_KEYS = ("itl_p50", "itl_p90", "itl_p95", "itl_p99")
#: Standard latency metrics whose twin error is reported besides the goals'.


class TwinError(ChunktuneError):
    """The twin cannot be built or fitted (too few step logs, an unknown model): the study
    falls back to real trials and says why."""


def twin_model(target: EngineTarget) -> ModelConfig:
    """The model the twin simulates (:func:`chunktune.tuning.space.engine_model`)."""
    try:
        model = space.engine_model(target)
    except SpecError as e:
        raise TwinError(f"the simulator does not know the model {target.model!r}: {e}") from e
    if model is None:
        raise TwinError(f"the simulator does not know the model {target.model!r}: give its "
                        "config.json as spec.engine.modelConfig, or a catalogued name")
    return model


def twin_target(target: EngineTarget, profile: dict[str, Any] | None) -> EngineTarget:
    """The real engine as the simulator runs it: the same model, device and the fixed flags the
    simulator models (others, such as ``--load-format``, do not change the schedule and are
    dropped), costed with the calibration ``profile``. Prefix caching as the engine has it:
    vLLM's default is on, the simulator's off, so the twin of a vLLM engine is given it unless
    the engine's flags turn it off."""
    if target.kind == "sim":
        return dataclasses.replace(target, calibration=profile, calibration_ref=None)
    model = twin_model(target)
    gpu = "cpu" if target.cpu is not None else target.gpu
    if gpu is None:
        raise TwinError("spec.engine.gpu.type is not set: the twin cannot know the device")
    resolve_gpu(gpu, field="spec.engine.gpu.type")
    parsed = parse_argv(list(target.fixed_args), engine="sim")
    kept = {k: v for k, v in parsed.values.items() if k != "tensor-parallel-size"}
    if target.kind == "vllm":
        kept.setdefault("enable-prefix-caching", FLAGS["enable-prefix-caching"].default)
    return dataclasses.replace(
        target, kind="sim", model=model.name, hf_config=_config_of(model, target), gpu=gpu,
        fixed_args=tuple(argv(kept)), image=None, calibration=profile, calibration_ref=None)


def _config_of(model: ModelConfig, target: EngineTarget) -> dict[str, Any]:
    """The Hugging Face config the twin target carries (so the simulated backend builds the
    same model without reading files again)."""
    if target.hf_config:
        return dict(target.hf_config)
    m = target.model
    path = space.model_dir(m)
    if (path / "config.json").is_file():
        return dict(json.loads((path / "config.json").read_text()))
    if m.startswith(space.TINY_PREFIX):
        return dict(TINY.config())
    return dict(CATALOG_HF[catalog_key(m)])


# ---- calibration ------------------------------------------------------------------------------


@dataclass(frozen=True)
class MeasuredRun:
    """A real trial the twin learns from: its point, its measured metrics and its step log."""

    number: int
    point: dict[str, Any]
    metrics: dict[str, float]
    steps_file: str


def measured_runs(tuner: TrialRunner) -> list[MeasuredRun]:
    """Every completed real trial with a step log on disk."""
    out = []
    for t in tuner.trials():
        if st.trial_state(t) != TrialState.COMPLETE:
            continue
        steps = t.user_attrs.get(st.ATTR_STEPS) or {}
        f = steps.get("file")
        if f and Path(f).is_file():
            out.append(MeasuredRun(t.number, st.point_of(t),
                                   dict(t.user_attrs.get(st.ATTR_METRICS) or {}), f))
    return out


def fit_profile(target: EngineTarget, runs: Sequence[MeasuredRun], simulate: Simulate,
                ) -> profiles.CalibrationProfile:
    """The twin's profile from ``runs``: the step-time model fitted to their step logs, then
    the wall time between steps and the time before the first token to their measured
    latencies (:func:`fit_latency_terms`). ``simulate(point, profile) -> metrics``."""
    if not runs:
        raise TwinError("no completed real trial kept a step log: nothing to calibrate on")
    model = twin_model(target)
    gpu = resolve_gpu("cpu") if target.cpu is not None else target.node_gpu()
    paths = [r.steps_file for r in runs]
    try:
        logs = profiles.load_logs(paths, model, target.model if target.kind != "sim"
                                  else model.name)
        budget = max(max((s.tokens for s in log.steps), default=16) for log in logs)
        costs = run_costs(target, runs, logs, model, gpu, max(budget, 16))
        fit = profiles.fit_logs(logs, costs)
    except SpecError as e:
        raise TwinError(f"the step logs cannot calibrate the twin: {e}") from e
    base = profiles.build_profile(paths, logs, fit, costs[0], model, gpu.name,
                                  target.tensor_parallel_size, 0.0, 0.0)
    return fit_latency_terms(base, runs, simulate)


def run_costs(target: EngineTarget, runs: Sequence[MeasuredRun], logs: Sequence[StepLog],
              model: ModelConfig, gpu: GPU, max_tokens: int) -> list[StepCostModel]:
    """Per run, the step-time model of the engine the twin runs at its point
    (:func:`chunktune.sim.engine.virtual.engine_cost` of the configuration the simulated
    backend resolves from the twin's fixed flags and the point: its KV cache dtype, graphs or
    not, expert split, the vLLM environment the manifest gives, and the release the target
    names or else the one the logs name), so
    the scales the fit finds are of the terms the calibrated twin prices. Runs whose
    configurations price alike share one model."""
    tgt = twin_target(target, None)
    version = (parse_version(target.vllm_version, "spec.engine.vllmVersion")
               if target.vllm_version else profiles.logs_version(logs))
    env = target_vllm_env(tgt, version)
    built: dict[tuple[Any, ...], StepCostModel] = {}
    out = []
    for run in runs:
        try:
            cfg = resolve(target_engine_args(tgt, run.point), model, gpu, version)
        except EngineStartupError as e:
            raise SpecError(f"trial {run.number}'s configuration does not start in the "
                            f"simulator ({e.reason}): {e.message}") from e
        key = (cfg.model.name, cfg.model.weight_dtype, cfg.tensor_parallel_size,
               cfg.kv_cache_dtype_bytes, cfg.enforce_eager, cfg.async_scheduling,
               cfg.enable_expert_parallel, cfg.data_parallel_size, cfg.vllm_version)
        if key not in built:
            built[key] = engine_cost(cfg, max_tokens, vllm_env=env)
        out.append(built[key])
    return out


def fit_latency_terms(base: profiles.CalibrationProfile, runs: Sequence[MeasuredRun],
                      simulate: Simulate) -> profiles.CalibrationProfile:
    """``base`` with the per-run terms a step log does not show, fitted to the runs'
    measured request latencies: the wall time between steps (output processing, scheduling)
    and the time before the first token beyond the prefill steps (HTTP, tokenization, first
    chunk), together: for each gap of :data:`STEP_GAPS` the time before the first token is
    the median of measured less simulated TTFT p50 (at least 0), and the pair whose simulated
    :data:`GAP_FIT_KEYS` come closest (median ``|log(sim / measured)|``) is kept; then the
    clients' stalls between tokens (:func:`fit_delivery_stalls`). Runs the host disturbed
    (:func:`~chunktune.core.steps.outside_engine`) are left out while a clean one is left.
    (Fitted one after the other, the gap absorbed the time before the first token and came
    out twice what the clients' ITL p50 says on the CPU example: 1 ms against 0.5.)"""
    # runs whose latencies the host set (tokens in bursts, clients' ITL far beyond the
    # engine's) would teach the twin the host's load: left out while any run is clean
    runs = [r for r in runs if not outside_engine(r.metrics)] or list(runs)

    def overhead_for(gap: float) -> float:
        prof = dataclasses.replace(base, step_gap_s=gap, server_overhead_s=0.0)
        gaps = [r.metrics["ttft_p50"] - sim["ttft_p50"] for r in runs
                if "ttft_p50" in r.metrics and "ttft_p50" in (sim := simulate(r.point, prof))]
        return max(0.0, statistics.median(gaps)) if gaps else 0.0

    def miss(profile: profiles.CalibrationProfile) -> float:
        out = []
        for r in runs:
            sim = simulate(r.point, profile)
            for k in GAP_FIT_KEYS:
                if sim.get(k, 0) > 0 and r.metrics.get(k, 0) > 0:
                    out.append(abs(math.log(sim[k] / r.metrics[k])))
        return statistics.median(out) if out else math.inf

    overheads = {g: overhead_for(g) for g in STEP_GAPS}
    tried = {g: miss(dataclasses.replace(base, step_gap_s=g, server_overhead_s=overheads[g]))
             for g in STEP_GAPS}
    gap = min(tried, key=lambda g: tried[g])
    overhead = overheads[gap]
    fitted = dataclasses.replace(base, step_gap_s=gap, server_overhead_s=overhead)
    stall, stall_miss = fit_delivery_stalls(fitted, runs, simulate)
    extra = {**base.extra, "latency_fit": {
        "step_gap_miss": {f"{g * 1e3:g}ms": round(v, 4) for g, v in tried.items()},
        "delivery_stall_miss": {f"{p:g}x{m * 1e3:g}ms": round(v, 4)
                                for (p, m), v in stall_miss.items()},
        "runs": [r.number for r in runs]}}
    return dataclasses.replace(fitted, delivery_stall_prob=stall[0], delivery_stall_s=stall[1],
                               extra=extra)


def fit_delivery_stalls(profile: profiles.CalibrationProfile, runs: Sequence[MeasuredRun],
                        simulate: Simulate) -> tuple[tuple[float, float],
                                                dict[tuple[float, float], float]]:
    """The delivery stalls (probability, mean seconds:
    :func:`chunktune.sim.calibration.profile.deliver`) of :data:`STALL_PROBS` x
    :data:`STALL_MEANS`, or none, whose simulated ITL percentiles (:data:`STALL_FIT_KEYS`) come
    closest to the measured ones: per run the mean ``|log(sim / measured)|`` over those, then the
    median over the runs. Runs whose clients' ITL the host set
    (:func:`~chunktune.core.steps.outside_engine`) are left out: a stall of seconds is the host's,
    not the server's. Returns the pick and every candidate's miss."""
    use = [r for r in runs if not outside_engine(r.metrics)]

    def miss(p: float, m: float) -> float:
        prof = dataclasses.replace(profile, delivery_stall_prob=p, delivery_stall_s=m)
        per_run = []
        for r in use:
            sim = simulate(r.point, prof)
            logs = [abs(math.log(sim[k] / r.metrics[k])) for k in STALL_FIT_KEYS
                    if sim.get(k, 0) > 0 and r.metrics.get(k, 0) > 0]
            if logs:
                per_run.append(statistics.fmean(logs))
        return statistics.median(per_run) if per_run else math.inf

    tried = {(0.0, 0.0): miss(0.0, 0.0)}
    if math.isfinite(tried[(0.0, 0.0)]):
        tried |= {(p, m): miss(p, m) for p in STALL_PROBS for m in STALL_MEANS}
    return min(tried, key=lambda k: tried[k]), tried


def study_profile(tuner: TrialRunner, runs: Sequence[MeasuredRun] | None = None,
                  ) -> profiles.CalibrationProfile:
    """The twin's profile for ``tuner``'s study from ``runs`` (default: every completed real
    trial with a step log), simulating with the same backend the search uses. Raises
    :class:`TwinError`."""
    runs = measured_runs(tuner) if runs is None else runs
    try:
        return fit_profile(tuner.target, runs, replayer(tuner))
    except SpecError as e:
        raise TwinError(str(e)) from e


def replayer(tuner: TrialRunner, backend: SimulatedBackend | None = None) -> Simulate:
    """``simulate(point, profile) -> metrics`` for :func:`fit_profile`: ``tuner``'s trial at
    ``point`` replayed by the simulated backend on the twin of its engine under ``profile``,
    over the whole workload; no figures for a run that did not complete."""
    # the fit summarizes each run's replay under many delivery stalls: kept, not replayed
    backend = backend or SimulatedBackend(reuse_replays=REUSED_REPLAYS)
    plan0 = tuner.plan(0, {})

    def simulate(point: dict[str, Any], prof: profiles.CalibrationProfile) -> dict[str, float]:
        tgt = twin_target(tuner.target, prof.to_dict())
        plan = dataclasses.replace(plan0, params=point, target=tgt, window_seconds=None)
        res = backend.run_sync(plan)
        return res.metrics if res.state == TrialState.COMPLETE else {}

    return simulate
