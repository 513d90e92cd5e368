"""Twin-first with ``budget.parallelism: 2`` runs its real phases' trials side by side: the
calibration trials, and the twin's candidates it confirms for real, two at a time (as the
operator runs them: one engine pod each, waiting for capacity where GPUs are short)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from chunktune.api.reader import parse_manifest
from chunktune.backends.simulated import SimulatedBackend
from chunktune.core.progress import StopReason
from chunktune.core.trials import Reporter, TrialPlan, TrialResult
from chunktune.tuning import study as st
from chunktune.tuning.tuner import Tuner
from tests.tuning.conftest import manifest


class Overlapping(SimulatedBackend):
    """The simulated engine, counting the trials of each phase in flight at once."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.tuner: Tuner | None = None
        self.in_flight = 0
        self.most: dict[str, int] = {}

    async def run_trial(self, plan: TrialPlan, report: Reporter | None = None) -> TrialResult:
        assert self.tuner is not None
        phase = str(self.tuner.study.trials[plan.number].user_attrs.get(st.ATTR_PHASE))
        self.in_flight += 1
        self.most[phase] = max(self.most.get(phase, 0), self.in_flight)
        try:
            return await super().run_trial(plan, report)
        finally:
            self.in_flight -= 1


def test_calibration_and_confirmation_run_two_at_a_time(tmp_path: Path) -> None:
    m = manifest(strategy={"name": "twin", "calibrationTrials": 2, "simulatedTrials": 8,
                           "simulatedLoads": 1, "confirmTrials": 2, "refineRounds": 0},
                 workload={"profile": "mixed", "duration": "10s", "warmup": "2s"},
                 budget={"maxTrials": 4, "parallelism": 2})
    backend = Overlapping(max_parallel=2, keep_steps=True, steps_dir=tmp_path / "steps")
    tuner = Tuner(parse_manifest(m), backend, str(tmp_path / "s.journal"))
    backend.tuner = tuner
    assert asyncio.run(tuner.run()) in (StopReason.ROUNDS, StopReason.CONVERGED,
                                     StopReason.BUDGET)
    assert backend.most == {"calibrate": 2, "confirm": 2}
