"""Operator high availability end to end: two replicas (``--leader-elect``, one Lease), the
leader SIGKILLed while trial 1 is under load; the standby takes the Lease, adopts the trial in
flight and finishes the study. Every trial has exactly one engine pod, one load Job and one
result: nothing lost, nothing run twice (scenario: ``tests/k8s/ha.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chunktune.tuning.study import ATTR_REASON, trial_state
from tests.k8s.conftest import journal_of, study_in
from tests.k8s.ha import BUSY_HOST_LEASE, failover
from tests.kube.emulator import KubeEmulator
from tests.kube.kubelet import FakeKubelet

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


async def test_the_standby_adopts_the_trial_of_a_killed_leader(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path) -> None:
    seen = await failover(kube, tmp_path, "ha", trials=3, lease=BUSY_HOST_LEASE)
    assert seen.standby_said == "ok standby\n" and seen.standby_leader_gauge == 0
    assert seen.status["phase"] == "Succeeded", seen.status.get("message")
    study = study_in(journal_of(kube, tmp_path, "ha"), "ha")
    launched = [t for t in study.trials if trial_state(t) != "SKIPPED"]
    numbers = [t.number for t in launched]
    assert seen.trial_in_flight in numbers and len(launched) == 3
    # one result each, none interrupted (the adopted trial was not re-queued) ...
    assert [(trial_state(t), t.user_attrs.get(ATTR_REASON)) for t in launched] == \
        [("COMPLETE", None)] * 3
    # ... from one engine pod and one load Job each: the adopted trial's were not re-created
    assert dict(seen.engine_pods) == dict.fromkeys(numbers, 1)
    assert dict(seen.load_jobs) == dict.fromkeys(numbers, 1)
    assert seen.new_leader_gauge == 1 and seen.new_leader_transitions == 1
    assert seen.exit_code == 0 and seen.holder_after is None  # a clean stop releases it
    lease = kube.get("leases", "default", "chunktune-operator")
    assert lease["spec"]["leaseTransitions"] == 1
