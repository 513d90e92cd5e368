"""The trial runner: ask Optuna, check, launch, measure, tell, until a stop condition holds.

:class:`TrialRunner` runs the trials of one Optuna study; a strategy
(:mod:`chunktune.tuning.strategies`) decides which (the spec's sampler, queued points, a
recheck), through its public methods. Shared by ``chunktune tune`` and the operator; only the
backend differs. Trial 0 is the engine's default configuration. Points vLLM would refuse, or
that the memory model predicts to fail (``budget.prescreen``), are recorded without launching
(``SKIPPED``) and do not count against ``maxTrials``; start-up failures of launched engines are
``INFEASIBLE``. Both are told to Optuna as complete trials whose ``engine_starts`` constraint is
violated, so constrained samplers learn where the engine does not start
(:mod:`chunktune.tuning.telling`). SLOs are further constraints.

Stopping: a :data:`~chunktune.core.progress.StopRequest.DRAIN` request asks no new trial and
lets the trials in flight finish (each is recorded); a
:data:`~chunktune.core.progress.StopRequest.CANCEL` request cancels them, and so do
``maxDuration`` and ``maxFailedTrials``: a cancelled trial stays in flight in the storage.

Restart safety: every trial's state lives in the study storage. A trial found RUNNING when the
runner starts was left by a process that died or was cancelled: the backend may re-attach to it
(:meth:`TrialBackend.recover`); if it cannot, the trial is closed as FAIL with reason
``Interrupted`` (not counted) and its point is queued again, so nothing is lost or repeated
(:mod:`chunktune.tuning.recovery`).

Several writers (two ``chunktune tune`` runs, the CLI beside the operator) may share one study
in a database: a trial is its writer's from its ask (``st.ATTR_OWNER``) and carries a heartbeat
while it runs; a trial whose writer stopped (:func:`~chunktune.tuning.study.abandoned`) is
taken over under the study's lock, at the start and every ``st.HEARTBEAT_SECONDS`` after. The
budget counts every writer's running trials, a point another live writer runs is skipped as
``Duplicate``, and the baseline is queued once.

Faults are not results: a backend that raises :class:`~chunktune.core.errors.InfrastructureFault`
(the cluster API unreachable past its retries) leaves the trial in flight — not told to
Optuna, not counted against ``maxTrials`` or ``maxFailedTrials`` — and the trial is re-adopted
once the backend answers again (:func:`chunktune.tuning.recovery.readopt`).

What a result becomes in the study (user attributes, constraints, Optuna state) is
:mod:`chunktune.tuning.telling`'s; this module keeps the loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import TrialState as OptunaState

from chunktune.api.v1alpha1 import ChunkedPrefillTuning
from chunktune.backends.base import TrialBackend, within
from chunktune.core import vllm_release
from chunktune.core.errors import InfrastructureFault, SpecError
from chunktune.core.gpus import resolve_gpu, with_peer_to_peer
from chunktune.core.models import ModelConfig
from chunktune.core.progress import EventKind, StopReason, StopRequest, TrialEvent, TwinPhase
from chunktune.core.trials import (
    RESULT_STATES,
    CpuTarget,
    EngineTarget,
    TrialPlan,
    TrialResult,
    TrialState,
)
from chunktune.sim.calibration import profile as profiles
from chunktune.sim.cost.provenance import provenance
from chunktune.tuning import recovery, space, telling, workload_source
from chunktune.tuning import storage as storages
from chunktune.tuning import study as st
from chunktune.tuning.objectives import (
    ConstraintDef,
    ObjectiveDef,
    slos_for_goodput,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)
log = logging.getLogger(__name__)

#: How many points may be skipped (refused or predicted to fail) per counted trial before the
#: loop gives up on finding launchable points.
MAX_SKIPS_PER_TRIAL = 5
#: The :meth:`TrialRunner.counts` key of FAILs whose process stopped before the trial ended.
INTERRUPTED = "INTERRUPTED"
#: Asked before each trial and while trials run: how to stop (None: go on).
StopRequested = Callable[[], StopRequest | None]


def calibration_of(tuning: ChunkedPrefillTuning) -> dict[str, Any] | None:
    """The profile ``spec.engine.calibration.file`` names, read and checked (SpecError naming
    that field otherwise)."""
    c = tuning.spec.engine.calibration
    if c is None or c.file is None:
        return None
    return profiles.read_profile(c.file, "spec.engine.calibration.file").to_dict()


def cost_model(tuning: ChunkedPrefillTuning, model: ModelConfig | None) -> str | None:
    """What the simulator's step-time model for the study's GPU was fitted on, and its
    end-to-end error on the study's ``model`` (the tuner's ``context.model``, resolved once;
    None: not known, the line names no model), for a study whose trials (engine kind ``sim``)
    or twin (``strategy: twin``) run in the simulator; None for the others (and a twin on a
    CPU engine, which only a calibration profile describes)."""
    spec = tuning.spec
    gpu = spec.engine.gpu.type
    if gpu is None or (spec.engine.kind != "sim" and spec.strategy.name != "twin"):
        return None
    return provenance(with_peer_to_peer(resolve_gpu(gpu), spec.engine.gpu.peer_to_peer), model)


def target_from_spec(tuning: ChunkedPrefillTuning) -> EngineTarget:
    e = tuning.spec.engine
    ref = e.calibration.config_map_key_ref if e.calibration else None
    return EngineTarget(
        kind=e.kind, model=e.model, served_model_name=e.served_model_name or e.model,
        gpu=e.gpu.type, gpu_count=e.gpu.count or e.tensor_parallel_size,
        gpu_peer_to_peer=e.gpu.peer_to_peer,
        tensor_parallel_size=e.tensor_parallel_size, image=e.image,
        fixed_args=tuple(tuning.spec.engine_fixed_args()),
        env=tuple(v.model_dump(mode="json", by_alias=True, exclude_none=True) for v in e.env),
        hf_config=e.hf_config, port=e.port, startup_timeout=e.startup_timeout,
        cpu=(CpuTarget(kv_cache_bytes=e.cpu.kv_cache_bytes,
                       omp_threads_bind=e.cpu.omp_threads_bind) if e.cpu else None),
        calibration=calibration_of(tuning),
        calibration_ref=(ref.name, ref.key) if ref is not None else None,
        vllm_version=(None if (v := e.effective_vllm_version()) is None
                      else vllm_release.text(v)),
    )


def _counted_state(t: optuna.trial.FrozenTrial) -> str:
    """The trial's :class:`TrialState`, or ``INTERRUPTED`` for a FAIL whose process did not
    live to finish it (not counted against the budget; its point runs again)."""
    s: str = st.trial_state(t)
    if s == TrialState.FAIL and t.user_attrs.get(st.ATTR_REASON) == recovery.INTERRUPTED_REASON:
        return INTERRUPTED
    return s


class TrialRunner:
    """The trials of one study: ``on_event`` sees every trial start and end; ``on_update`` is
    called after each tell (to print progress or patch a status).

    What a strategy uses: :meth:`recover`, :meth:`run_trials`, :meth:`enqueue`,
    :meth:`enqueue_baseline`, :meth:`pending`, :meth:`waiting`, :meth:`counted`, :meth:`trials`,
    :meth:`plan`, :meth:`out_of_time`, :meth:`emit`, :meth:`changed`, :meth:`counted_in`, and
    the study, spec, goals and target it holds."""

    def __init__(self, tuning: ChunkedPrefillTuning, backend: TrialBackend, storage: str,
                 on_event: Callable[[TrialEvent], None] | None = None,
                 on_update: Callable[[TrialRunner], None] | None = None,
                 window_seconds: float | None = None,
                 stop_requested: StopRequested | None = None,
                 on_fault: Callable[[int, str | None], None] | None = None,
                 target: EngineTarget | None = None, study_name: str | None = None) -> None:
        """``target`` and ``study_name`` override the spec's engine and the study's name: a
        twin-first study runs its simulated search as such a second runner in the same
        storage."""
        self.tuning = tuning
        self.spec = tuning.spec
        self.backend = backend
        self.storage_url = storage
        self.on_event = on_event or (lambda e: None)
        self.on_update = on_update or (lambda t: None)
        self.stop_requested: StopRequested = stop_requested or (lambda: None)
        self.on_fault = on_fault or (lambda number, message: None)
        """Told ``(trial, message)`` when a trial waits out an infrastructure fault, and
        ``(trial, None)`` when it was re-adopted."""
        self.faults = 0
        """Infrastructure faults waited out (none of them spent budget)."""
        self.params = list(self.spec.search_space or [])
        self.objectives = [ObjectiveDef.from_spec(o) for o in self.spec.objectives]
        self.constraints = [ConstraintDef.from_spec(c) for c in self.spec.constraints]
        self.target = target or target_from_spec(tuning)
        self.context = space.EngineContext.build(self.target)
        self.slos = slos_for_goodput(self.constraints)
        directions = [o.direction for o in self.objectives]
        sampler = st.make_sampler(tuning, len(directions), bool(self.constraints))
        pruner = st.make_pruner(tuning, len(directions))
        self.storage: BaseStorage = st.open_storage(storage)
        self.study = st.open_study(tuning, self.storage, directions, sampler, pruner,
                                   name=study_name)
        self.profile, self.derived = workload_source.resolve(tuning, self.study)
        """The profile every trial replays; ``derived``: what ``fromPrometheus`` derived for
        it (kept in the study), else None."""
        self.window_seconds = window_seconds or _default_window(self.profile.duration,
                                                                self.profile.warmup)
        self.owner = st.owner_id()
        self.started = time.monotonic()
        self.stop_reason: StopReason | None = None

    # ---- counts ----------------------------------------------------------------------------

    def trials(self) -> list[optuna.trial.FrozenTrial]:
        return self.study.get_trials(deepcopy=False)

    def counts(self) -> dict[str, int]:
        """Trials by :class:`TrialState`, and ``INTERRUPTED``: the FAILs whose process did not
        live to finish them (not counted as failures; their points run again)."""
        out: dict[str, int] = {**{s: 0 for s in TrialState}, INTERRUPTED: 0}
        for t in self.trials():
            out[_counted_state(t)] += 1
        return out

    def counted(self) -> int:
        """Trials that count against ``maxTrials``: every launched trial that ended."""
        c = self.counts()
        return sum(c[s] for s in RESULT_STATES)

    def counted_in(self, study_name: str) -> int:
        """Counted trials of another study in the same storage (0 when there is none)."""
        return st.counted_in(self.storage, study_name)

    def out_of_time(self) -> bool:
        """``budget.maxDuration`` has passed since this runner started."""
        d = self.spec.budget.max_duration
        return bool(d) and time.monotonic() - self.started >= d  # type: ignore[operator]

    # ---- what the runner tells -------------------------------------------------------------

    def emit(self, event: TrialEvent) -> None:
        """Tell ``on_event`` (a trial's start or end, a phase, a warning)."""
        self.on_event(event)

    def changed(self) -> None:
        """Tell ``on_update`` that the study changed (a status to write)."""
        self.on_update(self)

    # ---- the queue -------------------------------------------------------------------------

    def enqueue(self, point: dict[str, Any], attrs: dict[str, Any]) -> None:
        """Queue ``point`` to run as it is (``st.ATTR_POINT``), with ``attrs``; only its values
        the search space can record become the trial's params."""
        dists = space.distributions(self.params)
        self.study.enqueue_trial(
            {k: v for k, v in point.items() if k in dists and space.contains(dists[k], v)},
            user_attrs={st.ATTR_POINT: point, **attrs}, skip_if_exists=False)

    def enqueue_baseline(self) -> None:
        """Trial 0: vLLM's defaults for this GPU class, queued once per study (once among
        several writers too)."""
        with storages.study_lock(self.storage, self.study.study_name):
            if any(t.user_attrs.get(st.ATTR_BASELINE) for t in self.trials()):
                return
            point = self.context.default_point(self.params)
            dists = space.distributions(self.params)
            representable = {k: v for k, v in point.items() if space.contains(dists[k], v)}
            self.study.enqueue_trial(representable,
                                     user_attrs={st.ATTR_BASELINE: True, st.ATTR_POINT: point})

    def pending(self, phase: str) -> bool:
        """Trials of ``phase`` (``st.ATTR_PHASE``) are queued or in flight."""
        return any(t.user_attrs.get(st.ATTR_PHASE) == phase
                   and t.state in (OptunaState.WAITING, OptunaState.RUNNING)
                   for t in self.trials())

    def waiting(self) -> int:
        """Queued trials not started yet."""
        return sum(1 for t in self.trials() if t.state == OptunaState.WAITING)

    # ---- the loop --------------------------------------------------------------------------

    async def run_trials(self, queued_only: bool = False, hold_back: int = 0) -> StopReason:
        """Ask, launch, tell until a stop condition holds; returns why it stopped.
        ``queued_only``: run only the trials already queued in the study (a phase's chosen
        points), then stop with ``queued``. ``hold_back``: real trials of ``budget.maxTrials``
        kept for a later phase (the recheck): the loop stops with ``budget`` that many early."""
        budget = self.spec.budget
        parallel = max(1, min(budget.parallelism, self.backend.max_parallel))
        running: set[asyncio.Task[None]] = set()
        skips = 0
        self.stop_reason = None
        sweep = time.monotonic() + st.HEARTBEAT_SECONDS
        while True:
            if time.monotonic() >= sweep and not self.stop_requested():
                # trials another writer left since the start (none taken while stopping)
                sweep = time.monotonic() + st.HEARTBEAT_SECONDS
                for t in self.trials():
                    left = self._claim_left(t)
                    if left is not None:
                        running.add(asyncio.create_task(self._adopt(t, left)))
            reason = self._should_stop(len(running), queued_only, hold_back)
            drained = queued_only and not self.waiting()
            if reason:
                if not running:
                    self.stop_reason = reason
                    break
                if reason in (StopReason.DURATION, StopReason.FAILURES) or (
                        reason == StopReason.STOPPED
                        and self.stop_requested() == StopRequest.CANCEL):
                    # left in flight in the storage: the next run re-adopts them or records
                    # each as Interrupted and queues it again
                    for task in running:
                        task.cancel()
                    await asyncio.gather(*running, return_exceptions=True)
                    running.clear()
                    self.stop_reason = reason
                    break
                # otherwise the trials in flight finish (a drain): no new one is asked
            elif drained and not running:
                self.stop_reason = StopReason.QUEUED
                break
            elif len(running) < parallel and not drained:
                if skips > MAX_SKIPS_PER_TRIAL * budget.max_trials:
                    self.stop_reason = StopReason.EXHAUSTED
                    break
                trial = self.study.ask()
                trial.set_user_attr(st.ATTR_OWNER, self.owner)  # ours from the start
                if self._over_budget(trial, hold_back):
                    skips += 1
                    self._withdraw(trial)
                    continue
                point = self._point(trial)
                if self._reuse_duplicate(trial, point):
                    skips += 1
                    continue
                problem = self.context.feasibility(point, budget.prescreen)
                if problem is not None:
                    skips += 1
                    self._tell_startup_failure(trial, point, TrialState.SKIPPED, problem.reason,
                                               problem.describe())
                    continue
                running.add(asyncio.create_task(self._run_one(trial, point)))
                continue
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED,
                                         timeout=1.0)
            for task in done:
                running.discard(task)
                if task.exception() is not None and running:
                    # a fault below the trials (the study's storage): stop the others, which
                    # stay RUNNING in the study for the next start to adopt
                    for other in running:
                        other.cancel()
                    await asyncio.gather(*running, return_exceptions=True)
                task.result()
        self.changed()
        return self.stop_reason or StopReason.BUDGET

    def _should_stop(self, in_flight: int, queued_only: bool = False,
                     hold_back: int = 0) -> StopReason | None:
        """Why the loop stops now, if it does. Running queued points only (a twin-first
        phase), ``budget.patience`` and an exhausted grid do not stop it: those points were
        chosen already, and left queued they would be run by nobody."""
        budget = self.spec.budget
        if self.stop_requested():
            return StopReason.STOPPED
        c = self.counts()
        if c[TrialState.FAIL] and c[TrialState.FAIL] >= budget.max_failed_trials:
            return StopReason.FAILURES
        if self.out_of_time():
            return StopReason.DURATION
        # NOTE: every trial running in the study, another writer's too (several writers
        # share one budget)
        if self.counted() + max(in_flight, c[TrialState.RUNNING]) >= \
                budget.max_trials - hold_back:
            return StopReason.BUDGET
        if queued_only:
            return None
        if self._converged():
            return StopReason.CONVERGED
        sampler = self.study.sampler
        if isinstance(sampler, optuna.samplers.GridSampler) and sampler.is_exhausted(self.study):
            return StopReason.EXHAUSTED
        return None

    def _converged(self) -> bool:
        """``budget.patience`` counted trials in a row without improving the first objective's
        best feasible value by ``minImprovement`` (relative)."""
        patience = self.spec.budget.patience
        if not patience:
            return False
        obj = self.objectives[0]
        sign = 1.0 if obj.direction == "minimize" else -1.0
        best = math.inf
        since = 0
        for t in self.trials():
            state = st.trial_state(t)
            if state not in RESULT_STATES:
                continue
            v = t.user_attrs.get(st.ATTR_METRICS, {}).get(obj.key)
            ok = state == TrialState.COMPLETE and self._feasible(t) and v is not None
            gain = self.spec.budget.min_improvement
            if ok and (not math.isfinite(best) or sign * v < best - abs(best) * gain):
                best = sign * v
                since = 0
            else:
                since += 1
        return math.isfinite(best) and since >= patience

    def _over_budget(self, trial: optuna.Trial, hold_back: int = 0) -> bool:
        """Whether ``trial``, just asked, is one more than ``budget.maxTrials`` allows: the
        trials that count or run, numbered up to it, exceed the budget. Two writers that
        both saw room for one more trial (:meth:`_should_stop` reads, then :meth:`run_trials`
        asks) both ask; the storage numbers their trials in order, so the later one, which
        counts the earlier, steps back and the budget holds (PostgreSQL, two ``chunktune
        tune`` processes: 13 trials of 12 before)."""
        held = RESULT_STATES | {TrialState.RUNNING}
        n = sum(1 for t in self.trials()
                if t.number <= trial.number and _counted_state(t) in held)
        return n > self.spec.budget.max_trials - hold_back

    def _withdraw(self, trial: optuna.Trial) -> None:
        """Ends a trial asked past the budget before it runs: SKIPPED ``Budget`` (not counted),
        told to Optuna as failed so the sampler learns nothing from it. The budget is full, so
        nobody would run it (a queued point included)."""
        self._end_skipped(trial, {}, "Budget", "another writer took the budget's last trial")

    def _reuse_duplicate(self, trial: optuna.Trial, point: dict[str, Any]) -> bool:
        """A point already measured is not launched again: the trial is recorded as SKIPPED
        (reason ``Duplicate``) with the earlier trial's values and constraints, so the sampler
        still learns from it. Does not count against ``maxTrials``. The baseline and a
        ``recheck`` (a configuration measured again on purpose) always run. A point a trial
        runs now (this writer's, with ``parallelism`` above 1, or another live writer's) is
        SKIPPED too, and a point another writer
        proposed reseeds this writer's sampler (two writers with one seed would otherwise
        propose the same points)."""
        if trial.user_attrs.get(st.ATTR_BASELINE) or \
                trial.user_attrs.get(st.ATTR_PHASE) == TwinPhase.RECHECK:
            return False
        for t in self.trials():
            if t.number == trial.number or st.point_of(t) != point:
                continue
            elsewhere = st.runs_elsewhere(t, self.owner)
            if elsewhere:
                # another writer with the same seed proposes what this one does: diverge
                self.study.sampler.reseed_rng()
            if st.trial_state(t) == TrialState.RUNNING:
                # this writer's own trial in flight too (parallelism > 1): never two at once
                self._end_skipped(trial, point, "Duplicate", f"trial {t.number} runs the same "
                                  "configuration" + (" (another writer)" if elsewhere
                                                     else " now"))
                return True
            if st.trial_state(t) not in (TrialState.COMPLETE, TrialState.INFEASIBLE) or \
                    t.values is None:
                continue
            trial.set_user_attr(st.ATTR_METRICS, t.user_attrs.get(st.ATTR_METRICS) or {})
            for key, value in (t.constraints or {}).items():
                trial.set_constraint(key, value)
            self._end_skipped(trial, point, "Duplicate", f"same configuration as trial "
                              f"{t.number}", list(t.values))
            return True
        return False

    def _end_skipped(self, trial: optuna.Trial, point: dict[str, Any], reason: str,
                     message: str, values: list[float] | None = None) -> None:
        """Ends a trial that will not run: SKIPPED with ``reason`` and ``message``, told to
        Optuna with ``values`` (a duplicate's, so the sampler learns from them) or as failed
        (it learns nothing), and said like any other end (a trial number missing from the
        progress was all a user saw)."""
        trial.set_user_attr(st.ATTR_STATE, TrialState.SKIPPED.value)
        trial.set_user_attr(st.ATTR_REASON, reason)
        trial.set_user_attr(st.ATTR_MESSAGE, message)
        if values is None:
            self.study.tell(trial, state=OptunaState.FAIL)
        else:
            self.study.tell(trial, values)
        self.emit(TrialEvent(EventKind.FINISHED, trial.number, point, TrialState.SKIPPED,
                             reason, message))
        self.changed()

    def _feasible(self, t: optuna.trial.FrozenTrial) -> bool:
        return all(v <= 0 for v in t.constraints.values())

    def _point(self, trial: optuna.Trial) -> dict[str, Any]:
        """The trial's configuration. A queued point (the baseline, a re-run) is taken as it
        is; only its values Optuna can record under the search space become trial params, so
        the sampler never learns a value the trial did not run."""
        fixed = trial.user_attrs.get(st.ATTR_POINT)
        if fixed:
            dists = space.distributions(self.params)
            recordable = [p for p in self.params
                          if p.name in fixed and space.contains(dists[p.name], fixed[p.name])]
            if len(recordable) < len(self.params):
                trial.set_user_attr(st.ATTR_HIDDEN, True)
            point = {**space.suggest(trial, recordable), **fixed}
        else:
            point = space.suggest(trial, self.params)
        trial.set_user_attr(st.ATTR_POINT, point)
        return point

    async def recover(self) -> None:
        """The trials a stopped writer left in flight (a previous run, or another writer of
        the study whose heartbeat stopped): re-adopted by the backend where it can, else
        recorded as FAIL ``Interrupted`` (not counted) and queued again. A trial another live
        writer runs is left alone."""
        for t in self.trials():
            trial = self._claim_left(t)
            if trial is not None:
                await self._adopt(t, trial)

    def _claim_left(self, t: optuna.trial.FrozenTrial) -> optuna.Trial | None:
        return recovery.claim_left(self.study, self.storage, t, self.owner)

    async def _adopt(self, t: optuna.trial.FrozenTrial, trial: optuna.Trial) -> None:
        await recovery.adopt(self.study, self.backend, self.owner, t, trial, self.plan,
                             self._tell, self.enqueue)

    def plan(self, number: int, point: dict[str, Any]) -> TrialPlan:
        return TrialPlan(number=number, params=point, target=self.target, profile=self.profile,
                         name=f"{self.tuning.metadata.name}-t{number}",
                         window_seconds=self.window_seconds if self._prunable() else None,
                         slos=self.slos, load_workers=self.spec.workload.load_workers)

    def _prunable(self) -> bool:
        return len(self.objectives) == 1 and self.spec.pruner.name != "none"

    async def _run_one(self, trial: optuna.Trial, point: dict[str, Any]) -> None:
        baseline = bool(trial.user_attrs.get(st.ATTR_BASELINE))
        async with st.heartbeat(trial, self.owner):
            await self._measure(trial, point, baseline)

    async def _measure(self, trial: optuna.Trial, point: dict[str, Any], baseline: bool) -> None:
        self.emit(TrialEvent(EventKind.STARTED, trial.number, point, baseline=baseline))
        plan = self.plan(trial.number, point)
        obj = self.objectives[0]

        reported: set[int] = set()

        def report(index: int, metrics: dict[str, float]) -> bool:
            v = metrics.get(obj.key)
            if v is None or not math.isfinite(v) or baseline:
                return False
            if index not in reported:  # a re-adopted trial's log repeats its windows
                reported.add(index)
                trial.report(v, index)
            return trial.should_prune()

        t0 = time.monotonic()
        reporter = report if self._prunable() else None
        try:
            try:
                result = await self._bounded(plan, reporter)
            except InfrastructureFault as fault:
                result = await recovery.readopt(
                    self.backend, plan, reporter, fault,
                    lambda: self._bounded(plan, reporter), self._faulted)
        except TimeoutError:
            result = TrialResult(TrialState.FAIL, reason="TrialTimeout",
                                 message=f"the trial did not end within "
                                         f"{self.spec.budget.trial_timeout:g} s (trialTimeout)")
        except (asyncio.CancelledError, storages.StorageFault):
            raise  # the study's storage failed: never the trial's result
        except Exception as e:  # a broken trial, not a broken study
            log.exception("trial %d broke", trial.number)
            result = TrialResult(TrialState.FAIL, reason="BackendError",
                                 message=f"{type(e).__name__}: {e}")
        trial.set_user_attr(st.ATTR_TIMES, {"wall": time.monotonic() - t0,
                                            "startup": result.startup_seconds,
                                            "load": result.load_seconds})
        self._tell(trial, point, result)

    async def _bounded(self, plan: TrialPlan,
                       report: Callable[[int, dict[str, float]], bool] | None) -> TrialResult:
        """The backend's run of ``plan`` within ``budget.trialTimeout``, the time its engine
        waited for capacity left out (:meth:`TrialBackend.paused_seconds`)."""
        return await within(self.backend.run_trial(plan, report), self.spec.budget.trial_timeout,
                            lambda: self.backend.paused_seconds(plan.number))

    def _faulted(self, number: int, message: str | None) -> None:
        """A trial waits out an infrastructure fault (counted in :attr:`faults`), or was
        re-adopted (``message`` None): told to ``on_fault``."""
        if message is not None:
            self.faults += 1
        self.on_fault(number, message)

    # ---- telling Optuna (chunktune.tuning.telling) -----------------------------------------

    def _tell(self, trial: optuna.Trial, point: dict[str, Any], result: TrialResult) -> None:
        self.emit(telling.tell(self.study, trial, point, result, self.objectives,
                               self.constraints))
        self.changed()

    def _tell_startup_failure(self, trial: optuna.Trial, point: dict[str, Any], state: TrialState,
                              reason: str, message: str) -> None:
        self.emit(telling.tell_startup_failure(self.study, trial, point, state, reason, message,
                                               self.objectives, self.constraints))
        self.changed()


def _default_window(duration: float, warmup: float) -> float:
    """About ten pruning windows per trial, at least 5 s each."""
    return max(5.0, (duration - warmup) / 10)


__all__ = ["SpecError", "TrialRunner", "target_from_spec"]
