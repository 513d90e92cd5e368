"""The operator keeps a study in a real PostgreSQL server (:mod:`tests.postgres`): the URL in
``spec.storage``, the password in the Secret ``spec.storageFrom`` names."""

from __future__ import annotations

import base64
from pathlib import Path

import optuna
import pytest

from chunktune.k8s import controller
from chunktune.tuning import storage as storages
from chunktune.tuning.study import trial_state
from tests.k8s import faults
from tests.k8s.conftest import (
    operator_settings,
    running_operator,
    status_of,
    trial_objects,
    wait_phase,
)
from tests.kube.emulator import KubeEmulator
from tests.kube.kubelet import FakeKubelet
from tests.postgres import PostgresServer

pytestmark = pytest.mark.slow  # a PostgreSQL server and the operator


def _secret(password: str) -> dict[str, object]:
    return {"metadata": {"name": "db"},
            "data": {"password": base64.b64encode(password.encode()).decode()}}


@pytest.mark.asyncio
async def test_wrong_password_is_a_condition_until_the_secret_is_fixed(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong password in the Secret: ``StorageReachable=False`` with reason
    ``DatabaseAuthFailed`` naming spec.storageFrom and the fix, nothing run; the Secret fixed
    the moment that condition is written (before the operator starts waiting: CI once lost
    that race), the database is tried again at once, not when the backoff ends, and the study
    runs in it and succeeds."""
    # a backoff of 15-30 s from the first failure: far longer than a fix takes to be seen
    monkeypatch.setattr(controller, "FAULT_BACKOFF_FIRST", 30.0)
    written: list[dict[str, object]] = []
    failed = controller.StudyController._storage_failed

    async def fixed_at_once(self: controller.StudyController, *args: object) -> None:
        await failed(self, *args)  # type: ignore[arg-type]
        if not written:  # what the user sees, then the fix, before the operator waits
            conds = {c["type"]: c for c in status_of(kube, "db").get("conditions") or []}
            written.append(conds["StorageReachable"])
            assert not trial_objects(kube, "db")
            kube.patch("secrets", "default", "db", {"data": _secret(pg.password)["data"]})

    monkeypatch.setattr(controller.StudyController, "_storage_failed", fixed_at_once)
    with PostgresServer() as pg:
        url = pg.create_database("operator")
        kube.create("secrets", _secret("wrong-password"), "default")
        kube.create("cpt", faults.small_tuning(
            "db", trials=2, storage=pg.url("operator", with_password=False),
            storageFrom={"secretKeyRef": {"name": "db", "key": "password"}}), "default")
        settings = operator_settings(tmp_path / "state").with_overrides(
            allow_database_urls=True)
        async with running_operator(kube, settings):
            await kube.until(lambda: written, timeout=60, interval=0.1,
                             message="StorageReachable=False")
            cond = written[0]
            assert cond["status"] == "False" and cond["reason"] == "DatabaseAuthFailed"
            text = str(cond["message"])
            assert "spec.storageFrom" in text and "password was refused" in text
            assert "wrong-password" not in text and pg.password not in text
            assert "next try in" in text

            def reachable() -> bool:
                conds = {c["type"]: c for c in status_of(kube, "db").get("conditions") or []}
                return conds.get("StorageReachable", {}).get("status") == "True"

            await kube.until(reachable, timeout=12, interval=0.1,
                             message="StorageReachable=True within 12 s of the fix (the "
                                     "backoff is 15-30 s)")
            status = await wait_phase(kube, "db", ("Succeeded", "Failed"), timeout=180)
        assert status["phase"] == "Succeeded", status
        conds = {c["type"]: c for c in status["conditions"]}
        assert conds["StorageReachable"]["status"] == "True"
        study = optuna.load_study(study_name="default/db", storage=storages.open_storage(url))
        assert [trial_state(t) for t in study.trials] == ["COMPLETE", "COMPLETE"]
