"""One study, as ``chunktune tune`` and the operator run it: the
:class:`~chunktune.tuning.runner.TrialRunner` of its trials, driven by the strategy
``spec.strategy.name`` names (:mod:`chunktune.tuning.strategies`).
"""

from __future__ import annotations

from typing import Any

from chunktune.api.v1alpha1 import ChunkedPrefillTuning
from chunktune.backends.base import TrialBackend
from chunktune.core.progress import StopReason
from chunktune.tuning.runner import TrialRunner
from chunktune.tuning.strategies.all_real import AllReal
from chunktune.tuning.strategies.base import Strategy
from chunktune.tuning.strategies.twin_first import TwinFirst

#: The strategy of each ``spec.strategy.name``.
STRATEGIES: dict[str, type[Strategy]] = {"real": AllReal, "twin": TwinFirst}


class Tuner(TrialRunner):
    """A study's trials and its strategy. The strategy is built from the storage at once, so
    that a restarted process reports where the study is (a twin-first study's phase and round)
    before :meth:`run` gets there."""

    def __init__(self, tuning: ChunkedPrefillTuning, backend: TrialBackend, storage: str,
                 **kw: Any) -> None:
        """Takes :class:`TrialRunner`'s arguments."""
        super().__init__(tuning, backend, storage, **kw)
        self.strategy: Strategy = STRATEGIES[self.spec.strategy.name](self)

    async def run(self) -> StopReason:
        """Run the study until its strategy ends it; returns why (:class:`StopReason`)."""
        self.stop_reason = await self.strategy.run()
        self.changed()
        return self.stop_reason


__all__ = ["STRATEGIES", "Tuner"]
