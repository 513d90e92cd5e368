"""The all-real strategy (``spec.strategy.name: real``, the default): every trial starts the
engine; the spec's sampler proposes them after the baseline (trial 0, the engine's defaults),
until the budget is spent or the study converges; then the recheck, if asked for.
"""

from __future__ import annotations

from chunktune.core.progress import StopReason
from chunktune.tuning.strategies.base import Strategy


class AllReal(Strategy):
    """Real trials proposed by the spec's sampler."""

    async def search(self, hold_back: int) -> StopReason:
        self.runner.enqueue_baseline()
        return await self.runner.run_trials(hold_back=hold_back)


__all__ = ["AllReal"]
