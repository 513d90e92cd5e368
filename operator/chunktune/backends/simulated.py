"""The ``simulated`` backend: the simulator in process, in virtual time, no HTTP.

A trial is: resolve the flags as ``vllm serve`` would (start-up failures come back
``INFEASIBLE`` with vLLM's message), replay the profile's requests — the same seeded sequence
for every trial, so trials differ only by their flags — and summarize them with the same code
and population rules as the Locust driver (:mod:`chunktune.sim.report`, which ``chunktune sim
run`` uses too). Requests still running ``drain_timeout`` after the arrival window count as
``timeout`` failures, as they would for the load driver. A trial costs well under a second of CPU.

With ``keep_steps`` the trial also returns the engine's step log as vLLM's
``--enable-logging-iteration-details`` would give it (:class:`~chunktune.core.steps.StepRecord`,
simulated step times), kept as a file in ``steps_dir``: the simulated engine can then stand in
for a real one wherever a step log is needed (a twin-first study's calibration).
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from chunktune.backends.base import TrialBackend, take_kv_peak_from_steps
from chunktune.core.engine_args import EngineArgs, EngineStartupError
from chunktune.core.errors import SpecError
from chunktune.core.flags import FLAGS, parse_argv
from chunktune.core.flatten import flatten
from chunktune.core.models import from_hf_config, resolve_model
from chunktune.core.stats import hit_rate, weighted_percentile
from chunktune.core.steps import StepLogMeta, write_steps
from chunktune.core.summary import LoadSummary, Slo
from chunktune.core.trials import EngineTarget, Reporter, TrialPlan, TrialResult, TrialState
from chunktune.core.vllm_release import Version, parse_version
from chunktune.core.workload import Profile, RequestSpec, generate
from chunktune.sim.calibration import profile as profiles
from chunktune.sim.cost.step_time import check_vllm_env, env_read_by
from chunktune.sim.engine.request import FINISHED, REJECTED, Request
from chunktune.sim.engine.virtual import (
    Engine,
    ReplayResult,
    build_engine,
    iteration_records,
    server_cost,
)
from chunktune.sim.report import load_summary

#: With :attr:`SimulatedBackend.loads` above 1, the first draw's metrics are kept beside the
#: mean under this prefix (``draw0:chat.itl_p99``): that draw is the workload a real trial of
#: the same profile runs, so it is what the twin's prediction of that trial is judged on.
SAME_DRAW = "draw0:"


def same_draw(metrics: dict[str, float]) -> dict[str, float]:
    """The metrics of the profile's own draw: each ``draw0:`` value in place of the mean
    (metrics without them, from a single draw, as they are)."""
    return {k: metrics.get(SAME_DRAW + k, v) for k, v in metrics.items()
            if not k.startswith(SAME_DRAW)}


class SimulatedBackend(TrialBackend):
    name = "simulated"

    def __init__(self, max_parallel: int = 1, keep_steps: bool = False,
                 steps_dir: str | Path | None = None, loads: int = 1,
                 reuse_replays: int = 0) -> None:
        self.max_parallel = max_parallel
        self.keep_steps = keep_steps
        self.steps_dir = Path(steps_dir) if steps_dir is not None else None
        self.loads = loads
        """Draws of the workload each trial replays (the profile's seed and the next ones):
        the metrics are their mean (:meth:`run_sync`)."""
        self.reuse_replays = reuse_replays
        """Replays kept (the latest ones) for trials that differ from them only by what the
        clients see after the engine (a calibration profile's delivery stalls): such a trial
        is summarized again from the kept replay, with the same figures a new replay gives,
        in a fraction of its time (the twin's fit tries many stalls on the same runs)."""
        self._specs: dict[str, list[RequestSpec]] = {}
        self._replays: dict[str, tuple[Engine, ReplayResult, float]] = {}

    def _requests(self, profile: Profile) -> list[RequestSpec]:
        key = repr(profile)
        if key not in self._specs:
            self._specs[key] = generate(profile)
        return self._specs[key]

    async def run_trial(self, plan: TrialPlan, report: Reporter | None = None) -> TrialResult:
        return await asyncio.to_thread(self.run_sync, plan, report)

    def run_sync(self, plan: TrialPlan, report: Reporter | None = None) -> TrialResult:
        """One trial; with :attr:`loads` above 1, replayed on that many draws of the workload
        (seeds ``seed``, ``seed + 1``, ...), the metrics being the mean over the draws, and the
        first draw's also kept under :data:`SAME_DRAW` (with its summary, step log and pruning
        reports)."""
        first = self._run_one(plan, report)
        if self.loads <= 1 or first.state != TrialState.COMPLETE:
            return first
        runs = [first] + [self._run_one(dataclasses.replace(
            plan, profile=dataclasses.replace(plan.profile, seed=plan.profile.seed + i)), None,
            keep=False) for i in range(1, self.loads)]
        bad = next((r for r in runs if r.state != TrialState.COMPLETE), None)
        if bad is not None:
            return bad
        keys = set.intersection(*(set(r.metrics) for r in runs))
        draw0 = {SAME_DRAW + k: v for k, v in first.metrics.items()}
        first.metrics = {k: statistics.fmean(r.metrics[k] for r in runs)
                         for k in first.metrics if k in keys}
        first.metrics.update(draw0)
        first.load_seconds = sum(r.load_seconds or 0.0 for r in runs)
        return first

    def _replay_key(self, plan: TrialPlan) -> str | None:
        """What decides a replay, the delivery stalls left out; None when a replay is not to
        be kept (reuse is off, or the trial reports windows or keeps its steps)."""
        if not self.reuse_replays or self.keep_steps or plan.window_seconds is not None:
            return None
        calib = {k: v for k, v in (plan.target.calibration or {}).items()
                 if k not in profiles.AFTER_ENGINE}
        return repr((sorted(plan.params.items()), dataclasses.replace(
            plan.target, calibration=calib or None), plan.profile, plan.drain_timeout))

    def _run_one(self, plan: TrialPlan, report: Reporter | None = None,
                 keep: bool = True) -> TrialResult:
        key = self._replay_key(plan) if report is None else None
        if key is not None and key in self._replays:
            return self._resummarize(plan, *self._replays[key])
        t0 = time.perf_counter()
        target = plan.target
        try:
            args = engine_args(plan)
            model = (from_hf_config(target.hf_config, name=target.model) if target.hf_config
                     else resolve_model(target.model, field="spec.engine.model"))
            gpu = target.node_gpu()
            calib = calibration(target)
            if calib is not None:
                args = profiles.engine_args(args, calib)
            version = (None if target.vllm_version is None
                       else parse_version(target.vllm_version, "spec.engine.vllmVersion"))
            if version is None and calib is not None:
                version = profiles.fitted_version(calib)
            engine = build_engine(args, model, gpu, version,
                                  target_vllm_env(target, version))
            engine.use_acceptance(plan.profile)
            if calib is not None:
                profiles.apply(engine, calib, "spec.engine.calibration")
        except EngineStartupError as e:
            return TrialResult(TrialState.INFEASIBLE, reason=e.reason, message=e.message,
                               startup_seconds=time.perf_counter() - t0)
        except SpecError as e:
            return TrialResult(TrialState.INFEASIBLE, reason="ConfigRejected", message=str(e))
        startup = time.perf_counter() - t0
        profile = plan.profile
        specs = self._requests(profile)
        pruned_at: list[int] = []
        window = plan.window_seconds

        def on_tick(now: float, reqs: list[Request]) -> bool:
            if report is None or window is None:
                return False
            index = round(now / window) - 1
            if now <= profile.warmup or now > profile.duration:
                return False
            done = [r for r in reqs if r.status in (FINISHED, REJECTED)]
            partial = self._summary(plan, engine, done, now, now, complete=False, calib=calib)
            if report(index, flatten(partial, _server(engine, None, now))):
                pruned_at.append(index)
                return True
            return False

        t1 = time.perf_counter()
        before = server_cost(calib.server_overhead_s if calib is not None else None)
        result = engine.replay_profile(
            specs, profile, plan.drain_timeout,
            tick=plan.window_seconds if report else None, on_tick=on_tick,
            server_overhead_s=before.fixed_s, server_per_token_s=before.per_prompt_token_s,
            log_iterations=self.keep_steps)
        if pruned_at:  # cut short: what had finished by then, as the pruner saw it
            done = [r for r in result.requests if r.status in (FINISHED, REJECTED)]
            summary = self._summary(plan, engine, done, result.end_time, result.end_time,
                                    complete=False, calib=calib)
        else:
            summary = self._summary(plan, engine, result.requests, profile.duration,
                                    result.end_time, complete=True, calib=calib)
        if key is not None and not pruned_at:
            self._replays[key] = (engine, result, startup)
            while len(self._replays) > self.reuse_replays:
                del self._replays[next(iter(self._replays))]  # the oldest
        out = self._result(engine, result, summary, calib, startup, time.perf_counter() - t1,
                           pruned_at[0] if pruned_at else None)
        if self.keep_steps and keep:
            self._keep_steps(plan, engine, result, out)
        return out

    def _resummarize(self, plan: TrialPlan, engine: Engine, result: ReplayResult,
                     startup: float) -> TrialResult:
        """A kept replay summarized under ``plan``'s calibration (its delivery stalls)."""
        t1 = time.perf_counter()
        calib = calibration(plan.target)
        summary = self._summary(plan, engine, result.requests, plan.profile.duration,
                                result.end_time, complete=True, calib=calib)
        return self._result(engine, result, summary, calib, startup, time.perf_counter() - t1,
                            None)

    @staticmethod
    def _result(engine: Engine, result: ReplayResult, summary: LoadSummary,
                calib: profiles.CalibrationProfile | None, startup: float, seconds: float,
                pruned_at: int | None) -> TrialResult:
        server = _server(engine, result, result.end_time)
        metrics = flatten(summary, server)
        # What vLLM's step log would give: its elapsed time leaves out the wall time between
        # steps that a calibration profile adds to every step.
        gap = calib.step_gap_s if calib is not None else 0.0
        engine_itl = weighted_percentile([d - gap for d in result.steps.duration],
                                         result.steps.decodes, 99.0)
        if engine_itl is not None:
            metrics["engine_itl_p99"] = engine_itl
        state = TrialState.PRUNED if pruned_at is not None else TrialState.COMPLETE
        return TrialResult(state, metrics=metrics, summary=summary, server=server,
                           reason="Pruned" if pruned_at is not None else None,
                           startup_seconds=startup, load_seconds=seconds, pruned_at=pruned_at)

    def _keep_steps(self, plan: TrialPlan, engine: Engine, replay: ReplayResult,
                    out: TrialResult) -> None:
        """The replay's steps as vLLM's iteration log records (and a file in steps_dir)."""
        pool = engine.scheduler.pool
        out.steps = iteration_records(engine, replay)
        take_kv_peak_from_steps(out)
        if self.steps_dir is None:
            return
        self.steps_dir.mkdir(parents=True, exist_ok=True)
        cfg = engine.cfg
        meta = StepLogMeta(model=cfg.model.name, kv_cache_tokens=pool.total * cfg.block_size,
                           device="CPU" if cfg.gpu.name == "cpu" else "GPU")
        path = write_steps(self.steps_dir / f"{plan.name or plan.number}.steps.jsonl",
                           out.steps, meta)
        out.steps_file = str(path)

    def _summary(self, plan: TrialPlan, engine: Engine, reqs: list[Request], dispatch_end: float,
                 now: float, complete: bool,
                 calib: profiles.CalibrationProfile | None = None) -> LoadSummary:
        profile = plan.profile
        deliver = profiles.delivery(calib, profile.seed)
        slos = {k: Slo(**v) for k, v in plan.slos.items()} or None
        return load_summary(profile, engine, reqs, dispatch_end=dispatch_end, now=now,
                            complete=complete, target=f"sim://{plan.name or plan.number}",
                            model=plan.target.served_model_name, slos=slos, deliver=deliver)


def engine_args(plan: TrialPlan) -> EngineArgs:
    """The trial's engine arguments (:func:`target_engine_args` of its target and point)."""
    return target_engine_args(plan.target, plan.params)


def target_vllm_env(target: EngineTarget, version: Version | None = None) -> dict[str, str]:
    """The vLLM environment variables ``target``'s engine runs with, where the manifest gives
    their value (``spec.engine.env[].value``; a Secret's or ConfigMap's is not known here), as
    vLLM ``version`` (None: the current) acts on them (:func:`env_read_by`): those that pick a
    kernel the step time prices and the memory plan holds (gpt-oss's MXFP4 backend, the FP8
    MoE kernel), checked as vLLM reads them."""
    env = target.literal_env()
    where = {v.get("name"): i for i, v in enumerate(target.env)}
    check_vllm_env(env, lambda name: f"spec.engine.env[{where[name]}].value")
    return env_read_by(env, version)


def target_engine_args(target: EngineTarget, params: Mapping[str, Any]) -> EngineArgs:
    """The engine arguments of ``target`` at the point ``params``: the fixed ``engine.args``
    (the manifest's strings, read once), the tensor-parallel size, then the searched values."""
    fixed = parse_argv(list(target.fixed_args), engine="sim")
    problems = [("engine.args", msg) for _, msg in fixed.problems]
    problems += [("engine.args", f"the simulator does not model {name}")
                 for _, name in fixed.unknown]
    for name in params:
        if name not in FLAGS or "sim" not in FLAGS[name].engines:
            problems.append((name, "the simulator does not take this flag"))
    if problems:
        raise SpecError(problems)
    base = EngineArgs.from_point(fixed.values)
    if target.tensor_parallel_size > 1 and "tensor-parallel-size" not in fixed.values:
        base.tensor_parallel_size = target.tensor_parallel_size
    return EngineArgs.from_point(dict(params), base=base)


def _server(engine: Engine, result: ReplayResult | None, now: float) -> dict[str, Any]:
    """What a scrape of the engine's /metrics would give: preemptions, KV usage, queue time."""
    sched = engine.scheduler
    pool = sched.pool
    queue = [r.first_scheduled - r.arrival for r in (result.requests if result else [])
             if r.first_scheduled >= 0]
    out: dict[str, Any] = {
        "preemptions": sched.num_preemptions,
        "preemptions_per_minute": sched.num_preemptions / (now / 60) if now > 0 else 0.0,
        "kv_cache_usage_peak": pool.peak_used / pool.total,
        "num_gpu_blocks": pool.total,
        "kv_cache_tokens": engine.memory.kv_cache_tokens,
    }
    if queue:
        out["queue_time_p99"] = float(np.percentile(queue, 99))
    rate = hit_rate(sched.cache.queries, sched.cache.hits) if sched.cache is not None else None
    if rate is not None:
        out["prefix_cache_hit_rate"] = rate
    if result is not None:
        out["steps"] = len(result.steps)
        out["simulated_seconds"] = result.end_time
    return out


def calibration(target: EngineTarget) -> profiles.CalibrationProfile | None:
    """The target's calibration profile; :class:`SpecError` for a ConfigMap reference, which
    only the kubernetes backend can read."""
    if target.calibration_ref is not None:
        raise SpecError(f"the ConfigMap {target.calibration_ref[0]!r} is read by the kubernetes "
                        "backend only; give the profile as a file for this backend",
                        field="spec.engine.calibration.configMapKeyRef")
    if target.calibration is None:
        return None
    return profiles.parse_profile(target.calibration, "the profile", "spec.engine.calibration")
