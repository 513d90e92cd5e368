"""The strategy seam: how a study spends its trials, driving a
:class:`~chunktune.tuning.runner.TrialRunner` through its public methods.

Every strategy runs its own trials (:meth:`Strategy.search`), then the one recheck flow of
:meth:`Strategy.run`: with ``spec.strategy.recheckTrials`` > 0 (kept out of
``budget.maxTrials`` until then), the best measured configurations run once more each, and the
answer is the best by the mean of each configuration's measurements
(:func:`chunktune.tuning.results.merge.merge`): one measurement of a noisy objective can rank a
configuration first by luck.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any

from chunktune.api.v1alpha1 import StrategySpec
from chunktune.core.progress import StopReason, TwinPhase
from chunktune.tuning import study as st
from chunktune.tuning.results.model import collect, recheck_order
from chunktune.tuning.runner import TrialRunner

log = logging.getLogger(__name__)


class Strategy(ABC):
    """How a study spends its trials (``spec.strategy.name``)."""

    def __init__(self, runner: TrialRunner) -> None:
        self.runner = runner
        self.spec: StrategySpec = runner.spec.strategy

    @property
    def phase(self) -> TwinPhase | None:
        """Where the study is, for strategies that have phases (None: no phases)."""
        return None

    def status(self) -> dict[str, Any] | None:
        """The strategy's block of the resource's status (``status.twin``), if it has one."""
        return None

    @abstractmethod
    async def search(self, hold_back: int) -> StopReason:
        """The strategy's own trials, leaving ``hold_back`` real trials of
        ``budget.maxTrials`` unspent (the recheck's); returns why they ended."""

    def recheck_started(self, n: int) -> None:  # noqa: B027 - optional hook
        """The recheck's ``n`` trials are about to run (announce it, if the strategy does)."""

    def recheck_done(self) -> None:  # noqa: B027 - optional hook
        """The recheck ended without being interrupted."""

    async def run(self) -> StopReason:
        """Adopt or re-queue what a previous run left in flight, run :meth:`search`, then the
        recheck (once); returns why the study ended: why :meth:`search` ended when the recheck
        completes, else why it stopped."""
        runner = self.runner
        await runner.recover()
        if not self.recheck_queued():
            n = self.spec.recheck_trials
            why = await self.search(hold_back=n)
            if why.interrupts or n <= 0 or not self._queue_recheck(why):
                return why
        if runner.pending(TwinPhase.RECHECK):
            self.recheck_started(len(runner.study.user_attrs[st.ATTR_RECHECK]["points"]))
            why = await runner.run_trials(queued_only=True)
            if why != StopReason.QUEUED and not (why == StopReason.BUDGET
                                                 and not runner.waiting()):
                if not why.interrupts:
                    self.recheck_done()
                return why
        self.recheck_done()
        return StopReason(runner.study.user_attrs[st.ATTR_RECHECK].get("after") or "budget")

    def recheck_queued(self) -> bool:
        """The recheck was queued (by this process or one before it)."""
        return st.ATTR_RECHECK in self.runner.study.user_attrs

    def _queue_recheck(self, after: StopReason) -> bool:
        """Queue the recheck: the best ``spec.strategy.recheckTrials`` measured feasible
        configurations (:func:`~chunktune.tuning.results.model.recheck_order`; no more than the
        real trials left), one more measurement each, and ``after``, why the trials before it
        ended. False when there is nothing to recheck (no feasible measured configuration, or no
        real trial left)."""
        runner = self.runner
        left = runner.spec.budget.max_trials - runner.counted()
        res = collect(runner.study, runner.objectives, runner.constraints)
        points = [dict(t.params) for t in recheck_order(res)][
            :max(0, min(self.spec.recheck_trials, left))]
        if not points:
            return False
        for pt in points:
            runner.enqueue(pt, {st.ATTR_PHASE: TwinPhase.RECHECK.value})
        runner.study.set_user_attr(st.ATTR_RECHECK, {"points": points, "after": str(after)})
        log.info("%s: recheck: the %d best measured configurations run once more",
                 runner.tuning.metadata.name, len(points))
        return True


__all__ = ["Strategy"]
