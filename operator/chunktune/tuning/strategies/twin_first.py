"""Twin-first tuning (``spec.strategy.name: twin``): search in a simulator calibrated on the
engine's own step log, spend real engine time only on confirming the twin's best.

Phases, each a state the study storage records (so a restarted process resumes where it was
and runs nothing twice):

1. **calibrate**: ``calibrationTrials`` real trials (the engine's defaults, then points spread
   over the search space by a Latin hypercube), queued in the study and run like any trial;
   each keeps vLLM's per-step log (``--enable-logging-iteration-details``).
2. **search** (round ``r``): the step-time model is fitted to every real step log so far
   (:mod:`chunktune.sim.calibration.profile`), the wall time between steps and the time before the
   first token to the measured latencies (:func:`fit_latency_terms`); the profile is stored in the
   study. Then a second Optuna study in the same storage (``<study>#twin-search-<r>``) runs
   ``simulatedTrials`` trials of the same space, objectives and constraints in that twin.
3. **confirm**: the twin's ``confirmTrials`` best configurations not yet measured (its Pareto
   front for several objectives) are queued in the real study with the twin's prediction, and
   run for real.
4. **refine**: ``refineRounds`` more rounds of 2-3, each recalibrating on every real trial so
   far; the study stops early when a round does not improve the measured best.
5. **recheck** (``recheckTrials`` > 0, kept out of ``budget.maxTrials`` until now): the best
   measured configurations run once more each, and the answer is the best by the mean of each
   configuration's measurements (:func:`chunktune.tuning.results.merge`): one measurement of a
   noisy objective can rank a configuration first by luck.

After each confirmation the twin's error on the goals (over the confirmed trials: an
objective's median ``|predicted / measured - 1|``, a constraint metric's median miss measured
against its bound while inside it, :func:`~chunktune.tuning.results.trust_errors`) is
compared with ``maxTwinError``: above it the twin is not trusted, and the rest of
``budget.maxTrials`` goes to ordinary real trials (phase **fallback**, the spec's sampler on
the real study). The answer is always the best *measured* trial.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import optuna

from chunktune.api.status import TrialRecord
from chunktune.api.v1alpha1 import ChunkedPrefillTuning, PrunerSpec, StrategySpec
from chunktune.backends.simulated import SimulatedBackend, same_draw
from chunktune.core.errors import SpecError
from chunktune.core.flags import argv, parse_argv
from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import ModelConfig
from chunktune.core.steps import outside_engine
from chunktune.core.trials import RESULT_STATES, EngineTarget, TrialState
from chunktune.sim.calibration import profile as profiles
from chunktune.sim.cost.step_time import StepCostModel
from chunktune.tuning import space
from chunktune.tuning import study as st
from chunktune.tuning.objectives import ConstraintDef, ObjectiveDef
from chunktune.tuning.results import (
    collect,
    measured_by,
    prediction_errors,
    record,
    trust_errors,
)

if TYPE_CHECKING:
    from chunktune.tuning.runner import Tuner

log = logging.getLogger(__name__)

#: Study user attributes of a twin-first study (the real one).
ATTR_CALIBRATION = "twin_calibration"  # the calibration points, once queued
ATTR_ROUND_PROFILE = "twin_round_{}_profile"  # the profile fitted for round r
ATTR_ROUND_CONFIRM = "twin_round_{}_confirm"  # the points queued for confirmation in round r
ATTR_ROUND_DONE = "twin_round_{}_done"  # {"best": value or None} when round r is confirmed
ATTR_UNTRUSTED = "twin_untrusted"  # the message, once the twin's error passed the threshold
#: The wall time between steps tried when fitting it to measured latencies (seconds).
STEP_GAPS = (0.0, 0.00025, 0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.006)
#: The measured latencies the step gap and the time before the first token are fitted to.
GAP_FIT_KEYS = ("e2e_p50", "e2e_p99", "itl_p50")
#: Delivery stalls tried when fitting the clients' share of the time between tokens: the
#: probability that a token reaches its client late, and the mean delay.
STALL_PROBS = (0.005, 0.01, 0.02, 0.04)
STALL_MEANS = (0.001, 0.002, 0.004, 0.008)
#: The measured ITL percentiles that fit is judged on (over all requests).
STALL_FIT_KEYS = ("itl_p50", "itl_p90", "itl_p95", "itl_p99")
#: Standard latency metrics whose twin error is reported besides the goals'.
REPORTED = tuple(f"{m}_p{p}" for m in ("ttft", "itl", "e2e") for p in (50, 99))


class TwinError(Exception):
    """The twin cannot be built or fitted (too few step logs, an unknown model): the study
    falls back to real trials and says why."""


# ---- the twin's engine ------------------------------------------------------------------------


def twin_model(target: EngineTarget) -> ModelConfig:
    """The model the twin simulates (:func:`chunktune.tuning.space.engine_model`)."""
    try:
        model = space.engine_model(target)
    except SpecError as e:
        raise TwinError(f"the simulator does not know the model {target.model!r}: {e}") from None
    if model is None:
        raise TwinError(f"the simulator does not know the model {target.model!r}: give its "
                        "config.json as spec.engine.modelConfig, or a catalogued name")
    return model


def twin_target(target: EngineTarget, profile: dict[str, Any] | None) -> EngineTarget:
    """The real engine as the simulator runs it: the same model, device and the fixed flags the
    simulator models (others, such as ``--load-format``, do not change the schedule and are
    dropped), costed with the calibration ``profile``."""
    if target.kind == "sim":
        return dataclasses.replace(target, calibration=profile, calibration_ref=None)
    model = twin_model(target)
    gpu = "cpu" if target.cpu is not None else target.gpu
    if gpu is None:
        raise TwinError("spec.engine.gpu.type is not set: the twin cannot know the device")
    resolve_gpu(gpu, field="spec.engine.gpu.type")
    parsed = parse_argv(list(target.fixed_args), engine="sim")
    kept = {k: v for k, v in parsed.values.items() if k != "tensor-parallel-size"}
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
        from chunktune.modelgen.tiny import TINY

        return dict(TINY.config())
    from chunktune.core.models import CATALOG_HF, catalog_key

    return dict(CATALOG_HF[catalog_key(m)])


# ---- calibration ------------------------------------------------------------------------------


@dataclass(frozen=True)
class MeasuredRun:
    """A real trial the twin learns from: its point, its measured metrics and its step log."""

    number: int
    point: dict[str, Any]
    metrics: dict[str, float]
    steps_file: str


def measured_runs(tuner: Tuner) -> list[MeasuredRun]:
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


def fit_profile(target: EngineTarget, runs: Sequence[MeasuredRun], simulate: Any,
                ) -> profiles.CalibrationProfile:
    """The twin's profile from ``runs``: the step-time model fitted to their step logs, then
    the wall time between steps and the time before the first token to their measured
    latencies (:func:`fit_latency_terms`). ``simulate(point, profile) -> metrics``."""
    if not runs:
        raise TwinError("no completed real trial kept a step log: nothing to calibrate on")
    model = twin_model(target)
    gpu = resolve_gpu("cpu" if target.cpu is not None else (target.gpu or "h100-sxm"))
    paths = [r.steps_file for r in runs]
    try:
        logs = profiles.load_logs(paths, model, target.model if target.kind != "sim"
                                  else model.name)
        budget = max(max((s.tokens for s in log.steps), default=16) for log in logs)
        cost = StepCostModel(model, gpu, target.tensor_parallel_size,
                             max_tokens=max(budget, 16))
        fit = profiles.fit_logs(logs, cost)
    except SpecError as e:
        raise TwinError(f"the step logs cannot calibrate the twin: {e}") from None
    base = profiles.build_profile(paths, logs, fit, cost, model, gpu.name,
                                  target.tensor_parallel_size, 0.0, 0.0)
    return fit_latency_terms(base, runs, simulate)


def fit_latency_terms(base: profiles.CalibrationProfile, runs: Sequence[MeasuredRun],
                      simulate: Any) -> profiles.CalibrationProfile:
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
                        simulate: Any) -> tuple[tuple[float, float],
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


def study_profile(tuner: Tuner, runs: Sequence[MeasuredRun] | None = None,
                  ) -> profiles.CalibrationProfile:
    """The twin's profile for ``tuner``'s study from ``runs`` (default: every completed real
    trial with a step log), simulating with the same backend the search uses. Raises
    :class:`TwinError`."""
    runs = measured_runs(tuner) if runs is None else runs
    try:
        return fit_profile(tuner.target, runs, replayer(tuner))
    except SpecError as e:
        raise TwinError(str(e)) from None


def replayer(tuner: Tuner, backend: SimulatedBackend | None = None,
             ) -> Callable[[dict[str, Any], profiles.CalibrationProfile], dict[str, float]]:
    """``simulate(point, profile) -> metrics`` for :func:`fit_profile`: ``tuner``'s trial at
    ``point`` replayed by the simulated backend on the twin of its engine under ``profile``,
    over the whole workload; no figures for a run that did not complete."""
    backend = backend or SimulatedBackend()
    plan0 = tuner.plan(0, {})

    def simulate(point: dict[str, Any], prof: profiles.CalibrationProfile) -> dict[str, float]:
        tgt = twin_target(tuner.target, prof.to_dict())
        plan = dataclasses.replace(plan0, params=point, target=tgt, window_seconds=None)
        res = backend.run_sync(plan)
        return res.metrics if res.state == TrialState.COMPLETE else {}

    return simulate


def calibration_points(tuner: Tuner, k: int, context: space.EngineContext,
                       seed: int) -> list[dict[str, Any]]:
    """The engine's defaults, then ``k - 1`` points spread over the space (a Latin hypercube:
    each parameter's range cut into ``k - 1`` strata, one point per stratum, strata shuffled
    per parameter), skipping points the twin's engine rules refuse."""
    params = tuner.params
    points = [tuner.context.default_point(params)]
    rng = np.random.default_rng(seed)
    n = k - 1
    tries = 0
    while len(points) < k and tries < 50:
        tries += 1
        perms = {p.name: rng.permutation(n) for p in params}
        for i in range(n):
            if len(points) >= k:
                break
            pt = {p.name: _stratum_value(p, (perms[p.name][i] + rng.random()) / n)
                  for p in params}
            if pt in points or context.feasibility(pt, True) is not None:
                continue
            points.append(pt)
    return points


def space_size(params: Sequence[Any]) -> int | None:
    """How many points a finite search space has (None: a continuous range)."""
    n = 1
    for p in params:
        if not p.is_finite:
            return None
        n *= len(p.grid_values())
    return n


def _stratum_value(p: Any, u: float) -> Any:
    """The value of parameter ``p`` at quantile ``u`` of its range (choices in order; int
    ranges on their step, log ranges in log space)."""
    u = min(max(u, 0.0), 1.0 - 1e-9)
    d = space.distribution(p)
    if isinstance(d, optuna.distributions.CategoricalDistribution):
        return d.choices[int(u * len(d.choices))]
    assert isinstance(d, optuna.distributions.IntDistribution
                      | optuna.distributions.FloatDistribution)
    lo, hi = float(d.low), float(d.high)
    v = math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo))) if d.log and lo > 0 \
        else lo + u * (hi - lo)
    if d.step:
        v = min(max(lo + round((v - lo) / d.step) * d.step, lo), hi)
    if isinstance(d, optuna.distributions.IntDistribution):
        return round(v)
    return v


# ---- the driver -------------------------------------------------------------------------------


@dataclass
class RoundState:
    number: int
    simulated: int = 0
    confirmed: list[int] = dataclasses.field(default_factory=list)
    best: float | None = None


class TwinDriver:
    """Runs a twin-first study's phases on the real :class:`Tuner` (whose study holds every
    real trial) and a simulated tuner per search round."""

    def __init__(self, real: Tuner) -> None:
        self.real = real
        self.strategy: StrategySpec = real.spec.strategy
        self.phase = "calibrate"
        self.round = 0
        self.simulated = 0
        """Simulated trials of the rounds confirmed so far."""
        self.searched = 0
        """Counted trials of the current round's search study before its tuner is opened."""
        self.message: str | None = None
        self.search: Tuner | None = None
        self.started = time.monotonic()
        self._resume()

    def _resume(self) -> None:
        """Where the storage says the study is (a restarted process reports its phase, round
        and counts from the start, before :meth:`run` gets there): the first round not
        confirmed, and the phase that round is in."""
        attrs = self.real.study.user_attrs
        self.real.reserved = self._reserve()
        if ATTR_CALIBRATION not in attrs or self._calibrating():
            return
        if st.ATTR_RECHECK in attrs:
            self.round = self._rounds_done()
            self.phase = "recheck" if self.real.pending(st.PHASE_RECHECK) else "done"
            return
        r, stop = 1, None
        while (done := attrs.get(ATTR_ROUND_DONE.format(r))) is not None:
            self.simulated += int(done.get("simulated", 0))
            stop = stop or done.get("stop")
            r += 1
        last = 1 + self.strategy.refine_rounds
        self.round = min(r, last)
        if stop or r > last:
            self.phase = "done"
        elif attrs.get(ATTR_UNTRUSTED):
            self.phase = "fallback"
        else:
            self.phase = "confirm" if ATTR_ROUND_CONFIRM.format(r) in attrs else "search"
            self.searched = _counted_in(self.real, self.search_name(r))

    def _calibrating(self) -> bool:
        """Calibration trials are queued or in flight."""
        return self.real.pending("calibrate")

    def _rounds_done(self) -> int:
        r = 0
        while ATTR_ROUND_DONE.format(r + 1) in self.real.study.user_attrs:
            r += 1
        return r

    def _reserve(self) -> int:
        """Real trials the rounds leave for the recheck (none once it is queued)."""
        if st.ATTR_RECHECK in self.real.study.user_attrs:
            return 0
        return self.strategy.recheck_trials

    def _limit(self) -> int:
        """The real trials the rounds (and the fallback) may spend."""
        return self.real.spec.budget.max_trials - self.real.reserved

    # ---- reporting -------------------------------------------------------------------------

    def _enter(self, phase: str, message: str) -> None:
        from chunktune.tuning.runner import TrialEvent

        self.phase = phase
        self.message = message
        log.info("%s: phase %s: %s", self.real.tuning.metadata.name, phase, message)
        self.real.on_event(TrialEvent("phase", -1, {}, message=message, reason=phase))
        self.real.on_update(self.real)

    def status(self) -> dict[str, Any]:
        """The :class:`~chunktune.api.status.TwinStatus` fields."""
        err = twin_error(self.real.study)
        keys = self.goal_keys()
        untrusted = self.real.study.user_attrs.get(ATTR_UNTRUSTED)
        return {"phase": self.phase, "round": self.round,
                "realTrials": self.real.counted(), "simulatedTrials": self.simulated_total(),
                "twinError": {k: v for k, v in err.items() if k in keys or k in REPORTED},
                "goalError": goal_errors(self.real.study, *self.goals()),
                "trusted": None if not err else untrusted is None,
                "message": untrusted or self.message}

    def goals(self) -> tuple[list[ObjectiveDef], list[ConstraintDef]]:
        return list(self.real.objectives), list(self.real.constraints)

    def goal_keys(self) -> list[str]:
        return list(dict.fromkeys([o.key for o in self.real.objectives]
                                  + [c.key for c in self.real.constraints]))

    def simulated_total(self) -> int:
        return self.simulated + (self.search.counted() if self.search is not None
                                 else self.searched)

    # ---- phases ----------------------------------------------------------------------------

    async def run(self) -> str:
        study = self.real.study
        if st.ATTR_RECHECK not in study.user_attrs:
            self.real.reserved = self._reserve()
            why = await self._rounds()
            if why in ("stopped", "duration", "failures") or self.strategy.recheck_trials <= 0 \
                    or not self.real.queue_recheck(why):
                return why
        if self.real.pending(st.PHASE_RECHECK):
            n = len(study.user_attrs[st.ATTR_RECHECK]["points"])
            self._enter(st.PHASE_RECHECK, f"the {n} best measured configuration"
                        f"{'s' if n > 1 else ''} run once more: the answer is the best by the "
                        "mean of each one's measurements")
        why = await self.real.recheck()
        if why in ("stopped", "duration", "failures"):
            return why
        res = collect(study, self.real.objectives, self.real.constraints)
        best = res.best_trial
        self._enter("done", "recheck done: " + (
            f"the best is trial {best.number}"
            + (f", {measured_by(best, res.trials)}" if best.repeats else "")
            if best is not None else "no measured configuration is feasible"))
        return why

    async def _rounds(self) -> str:
        """Calibrate, then search-and-confirm rounds (or the fallback) until the rounds end;
        returns why."""
        real, s = self.real, self.strategy
        study = real.study
        if ATTR_CALIBRATION not in study.user_attrs:
            ctx = self._twin_context()
            points = calibration_points(real, s.calibration_trials, ctx, real.spec.sampler.seed)
            for i, pt in enumerate(points):
                self._enqueue(pt, {st.ATTR_PHASE: "calibrate", **({st.ATTR_BASELINE: True}
                                                                   if i == 0 else {})})
            study.set_user_attr(ATTR_CALIBRATION, points)
        # NOTE: a restarted process whose calibration is done does not announce it again
        # (its queued trials, if any, are re-runs of the phase it resumes in).
        if self._calibrating():
            n_cal = len(study.user_attrs[ATTR_CALIBRATION])
            self._enter("calibrate", f"{n_cal} real trials record the engine's step log "
                                     f"(the engine's defaults and {n_cal - 1} points spread "
                                     "over the space)")
            why = await real.loop(queued_only=True)
            if why != "queued":
                return why
        best_before: float | None = None
        for r in range(1, 2 + s.refine_rounds):
            self.round = r
            done = study.user_attrs.get(ATTR_ROUND_DONE.format(r))
            if done is not None:  # this round was confirmed already (counted by _resume)
                best_before = self._improved(best_before, done.get("best"))
                if done.get("stop"):
                    return str(done["stop"])
                continue
            if study.user_attrs.get(ATTR_UNTRUSTED):
                break
            if real.counted() >= self._limit():
                return "budget"
            try:
                profile = await self._profile(r)
            except TwinError as e:
                self._untrusted(f"the twin could not be calibrated: {e}")
                break
            if ATTR_ROUND_CONFIRM.format(r) in study.user_attrs:
                # a restarted process: the search ended and its best were queued already
                self.search = await asyncio.to_thread(self.search_tuner, r, profile)
            else:
                why = await self._search(r, profile)
                if why in ("stopped", "duration", "failures"):
                    return why
            queued = self._queue_confirmations(r)
            if queued == 0:
                # nothing the twin ranks near the measured best is left unmeasured
                self.simulated += self.search.counted() if self.search else 0
                study.set_user_attr(ATTR_ROUND_DONE.format(r), {
                    "best": best_value(real), "error": overall_error(real.study,
                                                                     *self.goals()),
                    "simulated": self.search.counted() if self.search else 0,
                    "stop": "converged"})
                self.search, self.searched = None, 0
                self._enter("done", f"round {r}: the twin predicts no unmeasured configuration "
                                    "within maxTwinError of the measured best, nor one that "
                                    "behaves differently from those measured: converged")
                return "converged"
            self._enter("confirm", f"round {r}: {queued} of the twin's best configurations "
                                   "run for real")
            why = await real.loop(queued_only=True)
            if why != "queued" and not (why == "budget" and not real.waiting()):
                return why
            # every confirmation ran (the last may have spent the budget): close the round
            best = best_value(real)
            goal = goal_errors(real.study, *self.goals())
            err = max(goal.values()) if goal else None
            stop = None
            if err is not None and err > s.max_twin_error:
                worst = max(goal.items(), key=lambda kv: kv[1])[0]
                bound = next((c for c in real.constraints if c.key == worst
                              and worst not in {o.key for o in real.objectives}), None)
                self._untrusted(f"the twin's median error on the confirmed trials is "
                                f"{err:.0%} for {worst}"
                                + (f" (its miss against the bound {bound.text()})"
                                   if bound is not None else "")
                                + ", above maxTwinError "
                                f"{s.max_twin_error:.0%}: it is not trusted here; the rest of "
                                "the budget runs real trials")
            elif r > 1 and best_before is not None and self._improved(best_before, best) \
                    == best_before:
                stop = "converged"
            study.set_user_attr(ATTR_ROUND_DONE.format(r), {
                "best": best, "error": err, "simulated": self.search.counted()
                if self.search else 0, "stop": stop})
            self.simulated += self.search.counted() if self.search else 0
            self.search, self.searched = None, 0
            best_before = self._improved(best_before, best)
            if stop:
                self._enter("done", f"round {r} did not improve the measured best: converged")
                return stop
            if why == "budget":
                self._enter("done", "the real-trial budget is spent")
                return why
        if study.user_attrs.get(ATTR_UNTRUSTED) and real.counted() < self._limit():
            self._enter("fallback", f"{self._limit() - real.counted()} ordinary "
                                    "real trials (the twin is not trusted)")
            why = await real.loop()
            self._enter("done", f"fallback ended: {why}")
            return why
        self._enter("done", "every search round was confirmed for real")
        return "rounds"

    def _improved(self, before: float | None, now: float | None) -> float | None:
        """The better of two best values (None: none measured), by the first objective's
        direction and ``budget.minImprovement``."""
        if now is None:
            return before
        if before is None:
            return now
        sign = 1.0 if self.real.objectives[0].direction == "minimize" else -1.0
        gain = self.real.spec.budget.min_improvement
        return now if sign * now < sign * before - abs(before) * gain else before

    def _untrusted(self, message: str) -> None:
        log.warning("%s: %s", self.real.tuning.metadata.name, message)
        self.real.study.set_user_attr(ATTR_UNTRUSTED, message)
        self.message = message
        from chunktune.tuning.runner import TrialEvent

        self.real.on_event(TrialEvent("phase", -1, {}, message=message, reason="untrusted"))

    def _enqueue(self, point: dict[str, Any], attrs: dict[str, Any]) -> None:
        self.real.enqueue(point, attrs)

    def _twin_context(self) -> space.EngineContext:
        try:
            return space.EngineContext.build(twin_target(self.real.target, None))
        except (TwinError, SpecError):
            return self.real.context

    async def _profile(self, r: int) -> profiles.CalibrationProfile:
        """Round ``r``'s profile: the stored one, else fitted now (in a worker thread: the fit
        simulates every measured run at several step gaps, seconds of CPU that must not stall
        the caller's event loop, such as the operator's)."""
        key = ATTR_ROUND_PROFILE.format(r)
        stored = self.real.study.user_attrs.get(key)
        if stored is not None:
            return profiles.parse_profile(stored, f"round {r}'s stored profile")
        runs = measured_runs(self.real)
        self._enter("search", f"round {r}: calibrating the twin on the step logs of "
                              f"{len(runs)} real trials")
        import asyncio

        t0 = time.monotonic()
        profile = await asyncio.to_thread(study_profile, self.real, runs)
        log.info("%s: round %d profile fitted in %.1f s (step median error %.1f%%, gap %.2f ms, "
                 "overhead %.1f ms)", self.real.tuning.metadata.name, r, time.monotonic() - t0,
                 100 * profile.fit["median_rel_err"], 1e3 * profile.step_gap_s,
                 1e3 * (profile.server_overhead_s or 0.0))
        self.real.study.set_user_attr(key, profile.to_dict())
        self._write_profile(r, profile)
        return profile

    def _write_profile(self, r: int, profile: profiles.CalibrationProfile) -> None:
        """Keep the round's profile beside a journal storage (``<storage>.twin/``), a file
        ``chunktune sim run --calibration`` reads."""
        url = self.real.storage_url
        if "://" in url and not url.startswith(("journal://", "file://")):
            return
        path = Path((url.split("://", 1)[1] if "://" in url else url) + ".twin")
        try:
            path.mkdir(parents=True, exist_ok=True)
            profiles.write_profile(path / f"round-{r}.profile.json", profile)
        except OSError as e:
            log.warning("could not keep round %d's profile in %s: %s", r, path, e)

    def search_name(self, r: int) -> str:
        return f"{self.real.study.study_name}#twin-search-{r}"

    def search_tuner(self, r: int, profile: profiles.CalibrationProfile) -> Tuner:
        from chunktune.tuning.runner import Tuner

        real = self.real
        tuning: ChunkedPrefillTuning = real.tuning.model_copy(deep=True)
        spec = tuning.spec
        spec.budget = real.spec.budget.model_copy(update={
            "max_trials": self.strategy.simulated_trials, "parallelism": 1,
            "max_failed_trials": max(5, self.strategy.simulated_trials // 10),
            "max_duration": None, "patience": None})
        spec.pruner = PrunerSpec(name="none")
        spec.strategy = StrategySpec()
        seed = (spec.sampler.seed + r) % 2**32
        size = space_size(real.params)
        if size is not None and size <= self.strategy.simulated_trials:
            # the whole space fits the round's budget: simulate all of it, once each
            spec.sampler = spec.sampler.model_copy(update={"name": "grid", "seed": seed})
        else:
            spec.sampler = spec.sampler.model_copy(update={"seed": seed})
        target = twin_target(real.target, profile.to_dict())
        return Tuner(tuning, SimulatedBackend(loads=self.strategy.simulated_loads),
                     real.storage_url, target=target,
                     study_name=self.search_name(r),
                     stop_requested=lambda: real.stop_requested() or self._out_of_time(),
                     on_update=lambda _: self.real.on_update(self.real))

    def _out_of_time(self) -> bool:
        d = self.real.spec.budget.max_duration
        return bool(d) and time.monotonic() - self.real.started >= d  # type: ignore[operator]

    async def _search(self, r: int, profile: profiles.CalibrationProfile) -> str:
        n = self.strategy.simulated_trials
        self._enter("search", f"round {r}: {n} simulated trials in the twin")
        self.search = await asyncio.to_thread(self.search_tuner, r, profile)
        t0 = time.monotonic()
        why = await self.search.run()
        log.info("%s: round %d search: %d simulated trials in %.1f s (%s)",
                 self.real.tuning.metadata.name, r, self.search.counted(),
                 time.monotonic() - t0, why)
        return why

    def _queue_confirmations(self, r: int) -> int:
        """Queue the twin's best unmeasured configurations (once per round); returns how many
        round ``r`` queued."""
        key = ATTR_ROUND_CONFIRM.format(r)
        study = self.real.study
        if key in study.user_attrs:
            return len(study.user_attrs[key])
        assert self.search is not None
        left = self._limit() - self.real.counted()
        m = max(0, min(self.strategy.confirm_trials, left))
        measured = [st.point_of(t) for t in self.real.trials()
                    if t.state != optuna.trial.TrialState.WAITING]
        best = collect(study, self.real.objectives, self.real.constraints).best_trial
        picks = candidates(collect(self.search.study, self.real.objectives,
                                   self.real.constraints), measured, m,
                           incumbent=dict(best.params) if best is not None else None,
                           tolerance=self.strategy.max_twin_error)
        for c in picks:
            self._enqueue(dict(c.params), {st.ATTR_PHASE: "confirm", st.ATTR_ROUND: r,
                                           st.ATTR_PREDICTED: same_draw(dict(c.metrics))})
        study.set_user_attr(key, [dict(c.params) for c in picks])
        return len(picks)


def _counted_in(real: Tuner, name: str) -> int:
    """Counted trials of study ``name`` in ``real``'s storage (0 when there is none)."""
    try:
        trials = optuna.load_study(study_name=name, storage=real._storage).get_trials(
            deepcopy=False)
    except KeyError:
        return 0
    return sum(1 for t in trials if st.trial_state(t) in RESULT_STATES)


def outcome(t: TrialRecord) -> tuple[tuple[str, float], ...]:
    """What the twin says a configuration does: every simulated metric (to 9 significant
    digits). Two configurations with the same outcome ran the same schedule in the twin (a flag
    that never binds under this workload, such as a ``max-num-seqs`` above the concurrency the
    load reaches), so measuring both spends a real trial on one behaviour twice."""
    return tuple(sorted((k, float(f"{v:.9g}")) for k, v in t.metrics.items()))


def candidates(results: Any, measured: list[dict[str, Any]], m: int,
               incumbent: dict[str, Any] | None = None, tolerance: float = math.inf,
               ) -> list[TrialRecord]:
    """The twin's ``m`` best distinct configurations not in ``measured``: feasible ones by the
    first objective (for several objectives the Pareto front first, spread along it), then, if
    the twin found too few feasible ones, the rest by the first objective. A configuration
    whose simulated :func:`outcome` equals one already measured or picked is left out (the
    twin says it behaves the same), so fewer than ``m`` may come back.

    ``incumbent`` (one objective): the best measured configuration. Only configurations the
    twin predicts feasible and no worse than its prediction for the incumbent by more than
    ``tolerance`` (its error allowance, relative) come back: a real trial on one the twin ranks
    clearly worse than what is measured already buys nothing."""
    o = results.objectives[0]
    sign = 1.0 if o.direction == "minimize" else -1.0

    def key(t: TrialRecord) -> float:
        return sign * t.metrics.get(o.key, math.inf * sign)

    bound = math.inf
    if incumbent is not None and len(results.objectives) == 1:
        inc = next((t for t in results.trials if t.state == TrialState.COMPLETE
                    and dict(t.params) == incumbent and o.key in t.metrics), None)
        if inc is not None:
            bound = key(inc) + abs(inc.metrics[o.key]) * tolerance

    seen = [dict(p) for p in measured]
    done = [t for t in results.trials if t.state == TrialState.COMPLETE and o.key in t.metrics]
    behaviours = {outcome(t) for t in done if dict(t.params) in seen}
    first: dict[tuple[tuple[str, float], ...], TrialRecord] = {}
    for t in sorted(done, key=lambda t: t.number):
        first.setdefault(outcome(t), t)
    done = [t for b, t in first.items() if b not in behaviours]
    if bound < math.inf:
        done = [t for t in done if t.constraints_ok and key(t) <= bound]
    feasible = sorted((t for t in done if t.constraints_ok), key=key)
    front = [t for t in feasible if t.number in results.pareto]
    if len(front) > m > 0:
        idx = sorted({round(i * (len(front) - 1) / max(1, m - 1)) for i in range(m)})
        front = [front[i] for i in idx]
    order = front + [t for t in feasible if t not in front] + \
        sorted((t for t in done if not t.constraints_ok), key=key)
    return order[:m] if m > 0 else []


# ---- predicted against measured -----------------------------------------------------------------


def confirmed(study: optuna.Study) -> list[TrialRecord]:
    """The real trials that carry a twin prediction and were measured."""
    return [r for r in (record(t) for t in study.get_trials(deepcopy=False)
                        if t.user_attrs.get(st.ATTR_PREDICTED))
            if r.state == TrialState.COMPLETE]


def twin_error(study: optuna.Study) -> dict[str, float]:
    """Median ``|predicted / measured - 1|`` per metric over the confirmed trials."""
    errs = prediction_errors(confirmed(study))
    return {k: statistics.median(abs(x) for x in v) for k, v in errs.items()}


def goal_errors(study: optuna.Study, objectives: Sequence[ObjectiveDef],
                constraints: Sequence[ConstraintDef]) -> dict[str, float]:
    """The twin's error per goal metric as the trust check judges it
    (:func:`~chunktune.tuning.results.trust_errors`: an objective's relative error, a
    constraint's miss measured against its bound)."""
    return trust_errors(confirmed(study), objectives, constraints)


def overall_error(study: optuna.Study, objectives: Sequence[ObjectiveDef],
                  constraints: Sequence[ConstraintDef]) -> float | None:
    """The twin's error on the goals: the largest of :func:`goal_errors` (None before any
    confirmation). The largest, not a median over metrics: a twin that predicts the
    constraints well but misses the objective cannot rank configurations."""
    errs = goal_errors(study, objectives, constraints)
    return max(errs.values()) if errs else None


def best_value(tuner: Tuner) -> float | None:
    """The first objective's value of the best measured feasible trial."""
    res = collect(tuner.study, tuner.objectives, tuner.constraints)
    b = res.best_trial
    return b.metrics.get(tuner.objectives[0].key) if b is not None else None


def twin_report(study: optuna.Study, objectives: Sequence[ObjectiveDef],
                constraints: Sequence[ConstraintDef], max_twin_error: float,
                ) -> dict[str, Any]:
    """What ``result.json`` keeps of a twin-first study: per round the profile's fit and what
    was confirmed, per confirmed trial the prediction beside the measurement, and the twin's
    error (per metric, and per goal metric as the trust decision judges it: ``goal_error``)."""
    rounds = []
    r = 1
    while (prof := study.user_attrs.get(ATTR_ROUND_PROFILE.format(r))) is not None:
        done = study.user_attrs.get(ATTR_ROUND_DONE.format(r)) or {}
        rounds.append({"round": r, "fit": prof.get("fit"), "step_gap_s": prof.get("step_gap_s"),
                       "server_overhead_s": prof.get("server_overhead_s"),
                       "simulated_trials": done.get("simulated"),
                       "confirmed": study.user_attrs.get(ATTR_ROUND_CONFIRM.format(r)),
                       "best": done.get("best"), "error": done.get("error")})
        r += 1
    rows = []
    for rec in confirmed(study):
        row = {"trial": rec.number, "params": dict(rec.params),
               "predicted": dict(rec.predicted),
               "measured": {k: rec.metrics[k] for k in rec.predicted if k in rec.metrics}}
        host = outside_engine(rec.metrics)
        if host:
            row["outside_engine"] = host  # not counted in twin_error
        rows.append(row)
    real = [t for t in study.get_trials(deepcopy=False)
            if st.trial_state(t) in (TrialState.COMPLETE, TrialState.INFEASIBLE,
                                     TrialState.PRUNED, TrialState.FAIL)
            and t.user_attrs.get(st.ATTR_REASON) != "Interrupted"]
    goal = goal_errors(study, objectives, constraints)
    return {"strategy": "twin", "rounds": rounds, "confirmed": rows,
            "twin_error": twin_error(study), "goal_error": goal,
            "overall_error": max(goal.values()) if goal else None,
            "untrusted": study.user_attrs.get(ATTR_UNTRUSTED),
            "max_twin_error": max_twin_error, "real_trials": len(real),
            "simulated_trials": sum(int(r["simulated_trials"] or 0) for r in rounds)}


__all__ = ["MeasuredRun", "TwinDriver", "TwinError", "candidates", "fit_latency_terms",
           "fit_profile", "twin_error", "twin_report", "twin_target"]
