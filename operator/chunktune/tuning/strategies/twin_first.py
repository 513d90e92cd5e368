"""Twin-first tuning (``spec.strategy.name: twin``): search in a simulator calibrated on the
engine's own step log, spend real engine time only on confirming the twin's best.

Phases (:class:`~chunktune.core.progress.TwinPhase`), each a state the study storage records
(:class:`~.twin_state.TwinState`), so a restarted process resumes where it was and runs
nothing twice:

1. **calibrate**: ``calibrationTrials`` real trials (the engine's defaults, then points spread
   over the search space by a Latin hypercube, :func:`~.twin_points.calibration_points`),
   queued in the study and run like any trial; each keeps vLLM's per-step log
   (``--enable-logging-iteration-details``).
2. **search** (round ``r``): the step-time model is fitted to every real step log so far
   (:mod:`chunktune.sim.calibration.profile`), the wall time between steps and the time before
   the first token to the measured latencies (:func:`~.twin_fit.fit_latency_terms`); the
   profile is stored in the study. Then a second Optuna study in the same storage
   (``<study>#twin-search-<r>``) runs ``simulatedTrials`` trials of the same space, objectives
   and constraints in that twin.
3. **confirm**: the twin's ``confirmTrials`` best configurations not yet measured (its Pareto
   front for several objectives, :func:`~.twin_points.candidates`) are queued in the real
   study with the twin's prediction, and run for real.
4. **refine**: ``refineRounds`` more rounds of 2-3, each recalibrating on every real trial so
   far; the study stops early when a round does not improve the measured best.
5. **recheck**: the recheck every strategy ends with (:class:`~.base.Strategy`).

After each confirmation the twin's error on the goals (over the confirmed trials: an
objective's median ``|predicted / measured - 1|``, a constraint metric's median miss measured
against its bound while inside it, :func:`~chunktune.tuning.results.trust.trust_errors`) is
compared with ``maxTwinError``: above it the twin is not trusted, and the rest of
``budget.maxTrials`` goes to ordinary real trials (phase **fallback**, the spec's sampler on
the real study). The answer is always the best *measured* trial.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import optuna

from chunktune.api.v1alpha1 import ChunkedPrefillTuning, PrunerSpec, StrategySpec
from chunktune.backends.simulated import SimulatedBackend, same_draw
from chunktune.core.errors import SpecError
from chunktune.core.progress import (
    TWIN_UNTRUSTED,
    EventKind,
    StopReason,
    StopRequest,
    TrialEvent,
    TwinPhase,
)
from chunktune.sim.calibration import profile as profiles
from chunktune.tuning import space
from chunktune.tuning import study as st
from chunktune.tuning.objectives import ConstraintDef, ObjectiveDef
from chunktune.tuning.results.merge import measured_by
from chunktune.tuning.results.model import collect
from chunktune.tuning.runner import TrialRunner
from chunktune.tuning.strategies.all_real import AllReal
from chunktune.tuning.strategies.base import Strategy
from chunktune.tuning.strategies.twin_fit import (
    TwinError,
    measured_runs,
    study_profile,
    twin_target,
)
from chunktune.tuning.strategies.twin_points import calibration_points, candidates, space_size
from chunktune.tuning.strategies.twin_report import (
    REPORTED,
    goal_errors,
    overall_error,
    twin_error,
)
from chunktune.tuning.strategies.twin_state import RoundEnd, TwinState

log = logging.getLogger(__name__)


def best_value(runner: TrialRunner) -> float | None:
    """The first objective's value of the best measured feasible trial."""
    res = collect(runner.study, runner.objectives, runner.constraints)
    b = res.best_trial
    return b.metrics.get(runner.objectives[0].key) if b is not None else None


class TwinFirst(Strategy):
    """Runs a twin-first study's phases on the real study's runner (whose study holds every
    real trial) and a simulated runner per search round."""

    def __init__(self, real: TrialRunner) -> None:
        super().__init__(real)
        self.real = real
        self.strategy: StrategySpec = real.spec.strategy
        self.state = TwinState.read(real.study)
        self._phase = TwinPhase.CALIBRATE
        self.round = 0
        self.simulated = 0
        """Simulated trials of the rounds confirmed so far."""
        self.searched = 0
        """Counted trials of the current round's search study before its runner is opened."""
        self.message: str | None = None
        self.search_runner: TrialRunner | None = None
        self.hold_back = 0 if self.recheck_queued() else self.strategy.recheck_trials
        """Real trials the rounds leave for the recheck (none once it is queued)."""
        self._resume()

    @property
    def phase(self) -> TwinPhase:
        return self._phase

    def _resume(self) -> None:
        """Where the storage says the study is (a restarted process reports its phase, round
        and counts from the start, before :meth:`run` gets there): the first round not
        confirmed, and the phase that round is in."""
        state = self.state
        if state.calibration is None or self._calibrating():
            return
        closed = state.rounds_closed()
        if self.recheck_queued():
            self.round = len(closed)
            self._phase = (TwinPhase.RECHECK if self.real.pending(TwinPhase.RECHECK)
                           else TwinPhase.DONE)
            return
        self.simulated = sum(end.simulated for end in closed)
        stop = next((end.stop for end in closed if end.stop), None)
        r = len(closed) + 1
        last = 1 + self.strategy.refine_rounds
        self.round = min(r, last)
        if stop or r > last:
            self._phase = TwinPhase.DONE
        elif state.untrusted:
            self._phase = TwinPhase.FALLBACK
        else:
            self._phase = (TwinPhase.CONFIRM if state.round(r).confirm is not None
                           else TwinPhase.SEARCH)
            self.searched = self.real.counted_in(self.search_name(r))

    def _calibrating(self) -> bool:
        """Calibration trials are queued or in flight."""
        return self.real.pending(TwinPhase.CALIBRATE)

    def _limit(self) -> int:
        """The real trials the rounds (and the fallback) may spend."""
        return self.real.spec.budget.max_trials - self.hold_back

    # ---- reporting -------------------------------------------------------------------------

    def _enter(self, phase: TwinPhase, message: str) -> None:
        self._phase = phase
        self.message = message
        log.info("%s: phase %s: %s", self.real.tuning.metadata.name, phase, message)
        self.real.emit(TrialEvent(EventKind.PHASE, -1, message=message, phase=phase))
        self.real.changed()

    def status(self) -> dict[str, Any]:
        """The :class:`~chunktune.api.status.TwinStatus` fields."""
        err = twin_error(self.real.study)
        keys = self.goal_keys()
        untrusted = self.state.untrusted
        return {"phase": self._phase.value, "round": self.round,
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
        return self.simulated + (self.search_runner.counted() if self.search_runner is not None
                                 else self.searched)

    # ---- phases ----------------------------------------------------------------------------

    def recheck_started(self, n: int) -> None:
        self._enter(TwinPhase.RECHECK, f"the {n} best measured configuration"
                    f"{'s' if n > 1 else ''} run once more: the answer is the best by the "
                    "mean of each one's measurements")

    def recheck_done(self) -> None:
        res = collect(self.real.study, self.real.objectives, self.real.constraints)
        best = res.best_trial
        self._enter(TwinPhase.DONE, "recheck done: " + (
            f"the best is trial {best.number}"
            + (f", {measured_by(best, res.trials)}" if best.repeats else "")
            if best is not None else "no measured configuration is feasible"))

    async def search(self, hold_back: int) -> StopReason:
        """Calibrate, then search-and-confirm rounds (or the fallback) until the rounds end;
        returns why."""
        self.hold_back = hold_back
        real, s, state = self.real, self.strategy, self.state
        study = real.study
        if state.calibration is None:
            ctx = self._twin_context()
            points = calibration_points(real, s.calibration_trials, ctx, real.spec.sampler.seed)
            for i, pt in enumerate(points):
                real.enqueue(pt, {st.ATTR_PHASE: TwinPhase.CALIBRATE.value,
                                  **({st.ATTR_BASELINE: True} if i == 0 else {})})
            state.set_calibration(study, points)
        # NOTE: a restarted process whose calibration is done does not announce it again
        # (its queued trials, if any, are re-runs of the phase it resumes in).
        if self._calibrating():
            n_cal = len(state.calibration or ())
            self._enter(TwinPhase.CALIBRATE,
                        f"{n_cal} real trials record the engine's step log (the engine's "
                        f"defaults and {n_cal - 1} points spread over the space)")
            why = await real.run_trials(queued_only=True, hold_back=hold_back)
            if why != StopReason.QUEUED:
                return why
        best_before: float | None = None
        for r in range(1, 2 + s.refine_rounds):
            self.round = r
            end = state.round(r).end
            if end is not None:  # this round was confirmed already (counted by _resume)
                best_before = self._improved(best_before, end.best)
                if end.stop:
                    return end.stop
                continue
            if state.untrusted:
                break
            if real.counted() >= self._limit():
                return StopReason.BUDGET
            try:
                profile = await self._profile(r)
            except TwinError as e:
                self._untrusted(f"the twin could not be calibrated: {e}")
                break
            if state.round(r).confirm is not None:
                # a restarted process: the search ended and its best were queued already
                self.search_runner = await asyncio.to_thread(self.search_tuner, r, profile)
            else:
                why = await self._search(r, profile)
                if why.interrupts:
                    return why
            queued = self._queue_confirmations(r)
            simulated = self.search_runner.counted() if self.search_runner else 0
            if queued == 0:
                # nothing the twin ranks near the measured best is left unmeasured
                self.simulated += simulated
                state.set_end(study, r, RoundEnd(
                    best=best_value(real), error=overall_error(real.study, *self.goals()),
                    simulated=simulated, stop=StopReason.CONVERGED))
                self.search_runner, self.searched = None, 0
                self._enter(TwinPhase.DONE,
                            f"round {r}: the twin predicts no unmeasured configuration within "
                            "maxTwinError of the measured best, nor one that behaves "
                            "differently from those measured: converged")
                return StopReason.CONVERGED
            self._enter(TwinPhase.CONFIRM,
                        f"round {r}: {queued} of the twin's best configurations run for real")
            why = await real.run_trials(queued_only=True, hold_back=hold_back)
            if why != StopReason.QUEUED and not (why == StopReason.BUDGET
                                                 and not real.waiting()):
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
                stop = StopReason.CONVERGED
            state.set_end(study, r, RoundEnd(best=best, error=err, simulated=simulated,
                                             stop=stop))
            self.simulated += simulated
            self.search_runner, self.searched = None, 0
            best_before = self._improved(best_before, best)
            if stop:
                self._enter(TwinPhase.DONE,
                            f"round {r} did not improve the measured best: converged")
                return stop
            if why == StopReason.BUDGET:
                self._enter(TwinPhase.DONE, "the real-trial budget is spent")
                return why
        if state.untrusted and real.counted() < self._limit():
            self._enter(TwinPhase.FALLBACK, f"{self._limit() - real.counted()} ordinary real "
                                            "trials (the twin is not trusted)")
            why = await real.run_trials(hold_back=hold_back)
            self._enter(TwinPhase.DONE, f"fallback ended: {why}")
            return why
        self._enter(TwinPhase.DONE, "every search round was confirmed for real")
        return StopReason.ROUNDS

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
        self.state.set_untrusted(self.real.study, message)
        self.message = message
        self.real.emit(TrialEvent(EventKind.WARNING, -1, reason=TWIN_UNTRUSTED,
                                  message=message))

    def _twin_context(self) -> space.EngineContext:
        try:
            return space.EngineContext.build(twin_target(self.real.target, None))
        except (TwinError, SpecError):
            return self.real.context

    async def _profile(self, r: int) -> profiles.CalibrationProfile:
        """Round ``r``'s profile: the stored one, else fitted now (in a worker thread: the fit
        simulates every measured run at several step gaps, seconds of CPU that must not stall
        the caller's event loop, such as the operator's)."""
        stored = self.state.round(r).profile
        if stored is not None:
            return profiles.parse_profile(stored, f"round {r}'s stored profile")
        runs = measured_runs(self.real)
        self._enter(TwinPhase.SEARCH, f"round {r}: calibrating the twin on the step logs of "
                                      f"{len(runs)} real trials")
        t0 = time.monotonic()
        profile = await asyncio.to_thread(study_profile, self.real, runs)
        log.info("%s: round %d profile fitted in %.1f s (step median error %.1f%%, gap %.2f ms, "
                 "overhead %.1f ms)", self.real.tuning.metadata.name, r, time.monotonic() - t0,
                 100 * profile.fit["median_rel_err"], 1e3 * profile.step_gap_s,
                 1e3 * (profile.server_overhead_s or 0.0))
        self.state.set_profile(self.real.study, r, profile.to_dict())
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

    def _search_stop(self) -> StopRequest | None:
        """The search stops when the real study is asked to, or runs out of time."""
        asked = self.real.stop_requested()
        if asked:
            return asked
        return StopRequest.CANCEL if self.real.out_of_time() else None

    def search_tuner(self, r: int, profile: profiles.CalibrationProfile) -> TrialRunner:
        """Round ``r``'s simulated study: the real one's space, objectives and constraints in
        the twin under ``profile``, ``simulatedTrials`` trials, in the same storage."""
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
        return TrialRunner(tuning, SimulatedBackend(loads=self.strategy.simulated_loads),
                           real.storage_url, target=target, study_name=self.search_name(r),
                           stop_requested=self._search_stop,
                           on_update=lambda _: self.real.changed())

    async def _search(self, r: int, profile: profiles.CalibrationProfile) -> StopReason:
        n = self.strategy.simulated_trials
        self._enter(TwinPhase.SEARCH, f"round {r}: {n} simulated trials in the twin")
        self.search_runner = await asyncio.to_thread(self.search_tuner, r, profile)
        t0 = time.monotonic()
        why = await AllReal(self.search_runner).run()
        log.info("%s: round %d search: %d simulated trials in %.1f s (%s)",
                 self.real.tuning.metadata.name, r, self.search_runner.counted(),
                 time.monotonic() - t0, why)
        return why

    def _queue_confirmations(self, r: int) -> int:
        """Queue the twin's best unmeasured configurations (once per round); returns how many
        round ``r`` queued."""
        queued = self.state.round(r).confirm
        if queued is not None:
            return len(queued)
        assert self.search_runner is not None
        study = self.real.study
        left = self._limit() - self.real.counted()
        m = max(0, min(self.strategy.confirm_trials, left))
        measured = [st.point_of(t) for t in self.real.trials()
                    if t.state != optuna.trial.TrialState.WAITING]
        best = collect(study, self.real.objectives, self.real.constraints).best_trial
        picks = candidates(collect(self.search_runner.study, self.real.objectives,
                                   self.real.constraints), measured, m,
                           incumbent=dict(best.params) if best is not None else None,
                           tolerance=self.strategy.max_twin_error)
        for c in picks:
            self.real.enqueue(dict(c.params), {st.ATTR_PHASE: TwinPhase.CONFIRM.value,
                                               st.ATTR_ROUND: r,
                                               st.ATTR_PREDICTED: same_draw(dict(c.metrics))})
        self.state.set_confirm(study, r, [dict(c.params) for c in picks])
        return len(picks)


__all__ = ["TwinFirst", "best_value"]
