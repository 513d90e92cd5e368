"""The resource's status says why a study ended without any result (the real operator against
the emulator)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.k8s.conftest import (
    operator_settings,
    running_operator,
    trial_objects,
    tuning,
    wait_phase,
)
from tests.kube.emulator import KubeEmulator
from tests.kube.kubelet import FakeKubelet

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


async def test_a_study_where_no_trial_can_start_fails_and_says_why(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path) -> None:
    """A 70B model on one L4: every point predicted out of memory, no pod started. The status
    used to read "no trial met every constraint after 0 trials"."""
    kube.create("cpt", tuning("big", engine={"kind": "sim", "model": "llama-3.1-70b",
                                             "gpu": {"type": "l4"}}), "default")
    async with running_operator(kube, operator_settings(tmp_path)):
        status = await wait_phase(kube, "big", ("Succeeded", "Failed"), timeout=120)
    assert status["phase"] == "Failed"
    assert status["message"].startswith("no trial produced a result: ")
    assert "SKIPPED PredictedEngineOOM" in status["message"]
    assert "weights alone" in status["message"]
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Failed"]["status"] == "True" and conds["Failed"]["reason"] == "NoTrialResult"
    assert trial_objects(kube, "big") == []
