"""The operator under injected faults (issue 12, findings 1-4 and 9), against the emulator.

Each scenario (:mod:`tests.k8s.faults`, shared with ``bench/faults.py``) asserts the same four
things: nothing lost (every trial the fault hit is measured), nothing measured twice, no
budget consumed by the fault, and nothing left behind. Fast unit tests come first; the end to
end ones (real kopf + client over HTTP, trials as local processes) are marked ``slow``.
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any, ClassVar

import optuna
import pytest

from chunktune.backends.cluster import ApiUnavailable, ClusterApiError
from chunktune.backends.manifests import Owner
from chunktune.core.errors import SpecError
from chunktune.core.progress import TrialEvent
from chunktune.k8s import locations
from chunktune.k8s.controller import StudyController, delete_study
from chunktune.k8s.kube import KubeApi
from chunktune.k8s.reporting import failure_lines
from chunktune.k8s.state import Operator, StatusWriter
from chunktune.tuning.study import ATTR_SERVER, trial_state
from tests.k8s import faults
from tests.k8s.conftest import (
    BIN,
    api_client_at,
    journal_of,
    operator_settings,
    running_operator,
    status_of,
    study_in,
    trial_objects,
    wait_phase,
)
from tests.kube.emulator import KubeEmulator
from tests.kube.kubelet import FakeKubelet

OWNER = Owner("t", "default", "uid-1")


def assert_clean(out: faults.Outcome) -> None:
    """Nothing lost, nothing measured twice, no budget spent by the fault, nothing left."""
    assert out.phase == "Succeeded", (out.detail.get("status") or {}).get("message")
    assert (out.lost, out.duplicated, out.budget, out.left) == (0, 0, 0, []), out.rows
    assert all(state == "COMPLETE" for _, state, _ in out.rows), out.rows


# ---- the API wrapper: retries, then ApiUnavailable ------------------------------------------


def test_api_calls_ride_out_a_short_outage_and_report_a_long_one(kube: KubeEmulator) -> None:
    async def main() -> None:
        with faults.ApiProxy("127.0.0.1", kube.port) as proxy:
            api = KubeApi(api_client_at(kube, proxy.url), retry_seconds=6.0,
                          request_timeout=5.0)
            try:
                proxy.cut()
                loop = asyncio.get_running_loop()
                loop.call_later(1.0, proxy.restore)
                assert await api.get("configmaps", "default", "none") is None  # retried
                proxy.cut()
                api.retry_seconds = 1.0
                t0 = loop.time()
                with pytest.raises(ApiUnavailable) as e:
                    await api.list("pods", "default")
                assert e.value.transient and e.value.status == 0
                assert "still failing after" in e.value.message
                assert loop.time() - t0 < 5.0  # bounded
            finally:
                await api.close()

    asyncio.run(main())


def test_refusals_are_not_retried(kube: KubeEmulator) -> None:
    async def main() -> None:
        api = KubeApi(kube.api_client(), retry_seconds=30.0)
        try:
            faults.error_storm(kube, "post", [422])
            t0 = asyncio.get_running_loop().time()
            with pytest.raises(ClusterApiError) as e:
                await api.create("configmaps", "default", {"metadata": {"name": "c"}})
            assert e.value.status == 422 and not e.value.transient
            assert asyncio.get_running_loop().time() - t0 < 2.0
        finally:
            await api.close()

    asyncio.run(main())


class NoObjectsApi:
    """Enough of the API for the finalizer's work when no trial object exists."""

    async def list(self, kind: str, namespace: str, selector: str | None = None) -> list[Any]:
        return []

    async def delete(self, *args: Any, **kwargs: Any) -> bool:
        return False


class FlakyDeletes(NoObjectsApi):
    """Deletions fail with a 503 the first ``failures`` times."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.deleted: list[tuple[str, str]] = []

    async def delete(self, kind: str, namespace: str, name: str,
                     grace_seconds: int | None = None) -> bool:
        if self.failures:
            self.failures -= 1
            raise ApiUnavailable(503, "injected")
        self.deleted.append((kind, name))
        return True


def test_a_cleanup_the_api_refused_is_retried() -> None:
    from chunktune.backends.kubernetes import BackendSettings, KubernetesBackend
    from tests.k8s.test_manifests import OPTIONS

    api = FlakyDeletes(1)
    backend = KubernetesBackend(api, OWNER, BackendSettings(options=OPTIONS))  # type: ignore[arg-type]
    assert asyncio.run(backend.cleanup(3)) is False
    asyncio.run(backend.close())  # retried on close (and before the next trial)
    assert {kind for kind, _ in api.deleted} == {"configmaps", "jobs", "pods"}
    assert backend._unclean == set()


# ---- finding 4: status patches retry in place on conflict ----------------------------------


class ConflictingApi:
    """A status endpoint that answers 409 ``conflicts`` times, then takes the patch."""

    def __init__(self, conflicts: int, status: dict[str, Any]) -> None:
        self.conflicts = conflicts
        self.status = status
        self.patches: list[dict[str, Any]] = []
        self.reads = 0

    async def patch_tuning_status(self, namespace: str, name: str,
                                  patch: dict[str, Any]) -> dict[str, Any]:
        self.patches.append(patch)
        if self.conflicts:
            self.conflicts -= 1
            raise ClusterApiError(409, "the object has been modified")
        self.status = {k: v for k, v in {**self.status, **patch}.items() if v is not None}
        return {"status": self.status}

    async def get_tuning(self, namespace: str, name: str) -> dict[str, Any]:
        self.reads += 1
        return {"status": dict(self.status)}


def test_status_conflicts_are_retried_in_place_after_a_fresh_read() -> None:
    api = ConflictingApi(5, {"phase": "Pending", "stale": "x"})
    writer = StatusWriter(api, OWNER, {"phase": "Pending"})  # type: ignore[arg-type]
    writer.set("Running", 1, "running")
    asyncio.run(writer.write(None))
    assert api.reads == 5 and len(api.patches) == 6 and not writer.pending
    assert api.status["phase"] == "Running"
    assert "stale" not in api.status  # the fresh read showed it: the patch dropped it
    endless = ConflictingApi(100, {})
    writer = StatusWriter(endless, OWNER, {})  # type: ignore[arg-type]
    writer.set("Running", 1)
    with pytest.raises(ClusterApiError):
        asyncio.run(writer.write(None))
    assert writer.pending and len(endless.patches) == 8  # bounded


# ---- finding 2: study identity by uid ------------------------------------------------------


def test_default_journal_is_named_by_the_uid(tmp_path: Path) -> None:
    a = locations.resolve(None, tmp_path, "uid-a", allow_database_urls=False)
    b = locations.resolve(None, tmp_path, "uid-b", allow_database_urls=False)
    assert a == str(tmp_path / "uid-a.journal") and a != b
    with pytest.raises(SpecError):
        locations.journal_path(tmp_path, "../x")


def _journal_with(path: Path, *names: str) -> None:
    st = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path)))
    for n in names:
        optuna.create_study(study_name=n, storage=st)


def test_an_old_named_journal_is_adopted_once(tmp_path: Path) -> None:
    _journal_with(tmp_path / "ns-t.journal", "ns/t")
    new = locations.adopt_legacy(tmp_path, "ns", "t", "u1")
    assert new == tmp_path / "u1.journal" and new.exists()
    assert not (tmp_path / "ns-t.journal").exists()  # its own: moved
    assert locations.adopt_legacy(tmp_path, "ns", "t", "u1") is None
    # a journal two tunings shared (a-b/c and a/b-c): copied, the other keeps the original
    _journal_with(tmp_path / "a-b-c.journal", "a-b/c", "a/b-c")
    assert locations.adopt_legacy(tmp_path, "a", "b-c", "u2") == tmp_path / "u2.journal"
    assert (tmp_path / "a-b-c.journal").exists()
    assert locations.adopt_legacy(tmp_path, "a-b", "c", "u3") == tmp_path / "u3.journal"
    # another tuning's journal is never taken
    _journal_with(tmp_path / "x-y.journal", "x-y/other")
    assert locations.adopt_legacy(tmp_path, "x", "y", "u4") is None


def test_deleting_a_tuning_removes_its_own_journal_only(tmp_path: Path) -> None:
    op = Operator(operator_settings(tmp_path), NoObjectsApi())  # type: ignore[arg-type]
    one = {"metadata": {"name": "c", "namespace": "a-b", "uid": "u-one"}, "spec": {}}
    two = {"metadata": {"name": "b-c", "namespace": "a", "uid": "u-two"}, "spec": {}}
    for body in (one, two):
        uid = body["metadata"]["uid"]
        (tmp_path / f"{uid}.journal").write_text("{}\n")
        for steps in (tmp_path / f"{uid}.journal.steps", tmp_path / f"{uid}.steps"):
            steps.mkdir()
            (steps / "x-t1-1.steps.jsonl").write_text("")
    assert asyncio.run(delete_study(op, one)) == []
    assert not (tmp_path / "u-one.journal").exists()
    assert (tmp_path / "u-two.journal").exists()
    # its engines' step logs go with it (locations.steps_dir: beside its journal, or by uid)
    assert not (tmp_path / "u-one.journal.steps").exists()
    assert not (tmp_path / "u-one.steps").exists()
    assert (tmp_path / "u-two.journal.steps").is_dir() and (tmp_path / "u-two.steps").is_dir()


# ---- finding 3: spec.storage confined to the state directory -------------------------------


@pytest.mark.parametrize("raw", [
    "../../escape.journal", "journal://../x.journal", "/etc/chunktune.journal",
    "file:///tmp/elsewhere.journal", "sub/../../x.journal", ".", "",
])
def test_journal_paths_outside_the_state_directory_are_refused(tmp_path: Path,
                                                               raw: str) -> None:
    with pytest.raises(SpecError) as e:
        locations.resolve(raw, tmp_path / "state", "u", allow_database_urls=True)
    assert e.value.problems[0][0] == "spec.storage"


def test_symlinks_out_of_the_state_directory_are_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "out").symlink_to(tmp_path)
    with pytest.raises(SpecError, match="inside the operator's state directory"):
        locations.resolve("out/x.journal", state, "u", allow_database_urls=False)


def test_journal_paths_inside_the_state_directory_are_kept(tmp_path: Path) -> None:
    for raw in ("mine.journal", "journal://team/mine.journal", str(tmp_path / "x.journal")):
        path = Path(locations.resolve(raw, tmp_path, "u", allow_database_urls=False))
        assert path.is_relative_to(tmp_path.resolve())


def test_database_urls_need_the_operator_setting_and_no_inline_password(
        tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"storage\.allowDatabaseURLs"):
        locations.resolve("postgresql://db/optuna", tmp_path, "u", allow_database_urls=False)
    assert locations.resolve("postgresql://db/optuna", tmp_path, "u",
                           allow_database_urls=True) == "postgresql://db/optuna"
    with pytest.raises(SpecError, match=r"spec\.storageFrom\.secretKeyRef"):
        locations.resolve("postgresql://u:secret@db/optuna", tmp_path, "u",
                        allow_database_urls=True)
    assert locations.resolve("sqlite:///s.db", tmp_path, "u", allow_database_urls=True) == \
        f"sqlite:///{tmp_path.resolve() / 's.db'}"
    with pytest.raises(SpecError):
        locations.resolve("sqlite:////etc/s.db", tmp_path, "u", allow_database_urls=True)
    url = "postgresql://u:secret@db/optuna"
    assert locations.resolve(None, tmp_path, "u", allow_database_urls=True,
                           from_secret=url) == url


class SecretApi(NoObjectsApi):
    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        if (kind, namespace, name) == ("secrets", "default", "db"):
            return {"data": {"url": base64.b64encode(b"postgresql://u:p@db/o").decode()}}
        return None


def test_storage_from_a_secret(tmp_path: Path) -> None:
    from chunktune.api.reader import parse_manifest
    from tests.k8s.conftest import tuning

    model = parse_manifest(tuning("t", storageFrom={"secretKeyRef": {"name": "db",
                                                                     "key": "url"}}))
    allowed = Operator(operator_settings(tmp_path).with_overrides(allow_database_urls=True),
                       SecretApi())  # type: ignore[arg-type]
    assert asyncio.run(allowed.storage(model, OWNER)) == "postgresql://u:p@db/o"
    refused = Operator(operator_settings(tmp_path), SecretApi())  # type: ignore[arg-type]
    with pytest.raises(SpecError, match=r"storage\.allowDatabaseURLs"):
        asyncio.run(refused.storage(model, OWNER))
    missing = parse_manifest(tuning("t", storageFrom={"secretKeyRef": {"name": "nope",
                                                                       "key": "url"}}))
    with pytest.raises(SpecError, match="does not exist"):
        asyncio.run(allowed.storage(missing, OWNER))


# ---- finding 9: failures carry their cause -------------------------------------------------


CRASH = ("exit code 1: INFO engine.py:112 Loading weights took 2.1 s\n"
         "Traceback (most recent call last):\n  File \"/app/engine.py\", line 88, in step\n"
         "RuntimeError: CUDA error: an illegal memory access was encountered\n"
         "INFO shutdown.py:12 releasing the KV cache\nINFO shutdown.py:20 bye")


def test_engine_failure_events_carry_the_cause_and_its_lines(tmp_path: Path) -> None:
    events: list[tuple[str, str, str]] = []
    op = Operator(operator_settings(tmp_path), NoObjectsApi())  # type: ignore[arg-type]
    ctrl = StudyController(op, {"metadata": {"name": "t", "namespace": "default",
                                             "uid": "u"}}, lambda *e: events.append(e))
    ctrl.report.event(TrialEvent("finished", 3, {"max-num-batched-tokens": 2048}, "FAIL",
                            "EngineCrashed", CRASH))
    ((kind, reason, message),) = events
    assert (kind, reason) == ("Warning", "TrialFail")
    assert "EngineCrashed" in message
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in message
    assert "bye" in message  # and the last lines
    assert len(failure_lines("x\n" * 5000)) <= 700


def test_a_session_wires_every_backend_hook_and_detaches_them(tmp_path: Path) -> None:
    """open_session is the one place a study's (or a re-tune's) backend is built: Prometheus
    degraded and recovered reach the condition and events, capacity waits the metrics, and
    on exit the hooks are detached and the backend forgotten."""
    from chunktune.k8s.reporting import PROMETHEUS_CONDITION, Reporting
    from chunktune.k8s.session import open_session
    from chunktune.k8s.state import parse
    from tests.k8s.conftest import tuning

    class StatusApi(NoObjectsApi):
        patches: ClassVar[list[dict[str, Any]]] = []

        async def patch_tuning_status(self, namespace: str, name: str,
                                      patch: dict[str, Any]) -> None:
            self.patches.append(patch)

    events: list[tuple[str, str, str]] = []
    op = Operator(operator_settings(tmp_path), StatusApi())  # type: ignore[arg-type]
    body = {**tuning("hooks"), "metadata": {"name": "hooks", "namespace": "default",
                                            "uid": "u-hooks", "generation": 1}}
    tuned, problems = parse(body)
    assert tuned is not None, problems
    report = Reporting(op, OWNER, op.writer(body), lambda *e: events.append(e), 1)

    async def main() -> None:
        async with open_session(op, tuned, report) as session:
            backend = session.backend
            assert op.backends == [backend] and report.backend is backend
            backend.on_warning("PrometheusUnreachable", "no answer (fallback: direct scrape)")
            backend.on_warning("PrometheusUnreachable", "no answer again")
            assert report.writer.condition_status(PROMETHEUS_CONDITION) == "False"
            backend.on_recovered("PrometheusUnreachable")
            backend.capacity.on_change(4, "0/1 nodes: Insufficient nvidia.com/gpu", 0.0, False)
            assert report.writer.condition_status("CapacityAvailable") == "False"
            await report.drain()
        assert op.backends == [] and report.backend is None and report.tuner is None
        seen = len(events)
        backend.on_warning("PrometheusUnreachable", "after the session")
        backend.capacity.on_change(5, "waiting", 0.0, False)
        assert len(events) == seen  # detached

    asyncio.run(main())
    assert [r for _, r, _ in events] == ["PrometheusUnreachable", "PrometheusUnreachable",
                                         "PrometheusReachable", "TrialWaitingForCapacity"]
    assert report.writer.condition_status(PROMETHEUS_CONDITION) == "True"
    assert StatusApi.patches  # the changes were written


# ---- end to end ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.parametrize("retry_seconds", [30.0, 2.0], ids=["retried", "re-adopted"])
async def test_api_outage_mid_load_spends_no_budget(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path, retry_seconds: float) -> None:
    """Finding 1: 12 s without the API while trial 0's load runs and ends. Retried in place
    (bound 30 s), or past the bound (2 s) re-adopted when the API is back: either way trial 0
    keeps its measurement and the study completes 3/3."""
    out = await faults.api_outage(kube, tmp_path, retry_seconds)
    assert_clean(out)
    status = out.detail["status"]
    assert status["trialsSummary"] == "3/3" and status["counts"]["completed"] == 3
    assert out.detail["study"].trials[0].user_attrs[ATTR_SERVER]["source"] == "scrape"
    if retry_seconds < 12:
        reasons = [e["reason"] for e in faults.events_of(kube, "outage")]
        assert "TrialReadopted" in reasons, reasons


@pytest.mark.slow
@pytest.mark.asyncio
async def test_status_conflict_and_error_storm_does_not_stall_the_study(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path) -> None:
    """Finding 4: eight 409/500 answers in a row on status patches."""
    out = await faults.status_storm(kube, tmp_path)
    assert_clean(out)
    assert out.detail["answered"] == [409] * 4 + [500] * 4
    assert out.recover_s is not None and out.recover_s < 30  # main: 15 s per error, 120 s


@pytest.mark.slow
@pytest.mark.asyncio
async def test_prometheus_down_is_a_warning_and_a_condition(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path) -> None:
    """Finding 9: the fallback (a direct /metrics scrape) is named in an event and a
    condition, and the figures it gave are kept."""
    out = await faults.prometheus_down(kube, tmp_path)
    assert_clean(out)
    warned = [e for e in out.detail["events"] if e["reason"] == "PrometheusUnreachable"]
    assert warned and warned[0]["type"] == "Warning"
    assert "direct /metrics scrape" in warned[0]["message"]
    conds = {c["type"]: c for c in out.detail["status"]["conditions"]}
    assert conds["PrometheusReachable"]["status"] == "False"
    assert "direct /metrics scrape" in conds["PrometheusReachable"]["message"]
    for t in out.detail["study"].trials:
        server = t.user_attrs[ATTR_SERVER]
        assert server["source"] == "scrape" and server["prompt_tokens"] > 0


@pytest.mark.slow
@pytest.mark.asyncio
async def test_three_operator_restarts_lose_and_repeat_nothing(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path) -> None:
    out = await faults.operator_restarts(kube, tmp_path)
    assert_clean(out)
    assert len(out.rows) == 4


@pytest.mark.slow
@pytest.mark.asyncio
async def test_deleted_mid_trial_during_an_outage_leaves_nothing(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path) -> None:
    out = await faults.deleted_during_outage(kube, tmp_path)
    assert out.left == [] and out.detail["journal_left"] is False


@pytest.mark.slow
@pytest.mark.asyncio
async def test_two_tunings_whose_names_collided_keep_their_own_journals(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path) -> None:
    """Finding 2: ``a-b/c`` and ``a/b-c`` were both ``a-b-c.journal``; deleting one deleted
    the other's study."""
    for ns, name in (("a-b", "c"), ("a", "b-c")):
        body = faults.small_tuning(name, trials=1, duration="3s")
        kube.create("cpt", body, ns)
    async with running_operator(kube, operator_settings(tmp_path)):
        for ns, name in (("a-b", "c"), ("a", "b-c")):
            await kube.until(lambda ns=ns, name=name: status_of(kube, name, ns).get("phase")
                             == "Succeeded", timeout=90, message=f"{ns}/{name} done")
        journals = {ns: journal_of(kube, tmp_path, name, ns)
                    for ns, name in (("a-b", "c"), ("a", "b-c"))}
        assert journals["a-b"] != journals["a"]
        kube.delete("cpt", "a-b", "c")
        await kube.until(lambda: kube.get("cpt", "a-b", "c") is None, timeout=30,
                         message="a-b/c deleted")
    assert not journals["a-b"].exists()
    (trial,) = study_in(journals["a"], "b-c", "a").trials  # the other study is intact
    assert trial_state(trial) == "COMPLETE"


@pytest.mark.slow
@pytest.mark.asyncio
async def test_storage_outside_the_state_directory_is_refused_with_the_field(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path) -> None:
    """Finding 3: ``../`` paths and database URLs (not allowed by default) never reach the
    disk; the resource is Failed with SpecValid=False naming spec.storage."""
    state = tmp_path / "state"
    cases = {"up": "../../escaped-by-up/x.journal",
             "abs": str(tmp_path / "escaped-abs" / "x.journal"),
             "db": f"sqlite:///{tmp_path / 'escaped.db'}"}
    for name, raw in cases.items():
        kube.create("cpt", faults.small_tuning(name, trials=1, storage=raw), "default")
    async with running_operator(kube, operator_settings(state)):
        for name in cases:
            status = await wait_phase(kube, name, ("Failed",), timeout=30)
            conds = {c["type"]: c for c in status["conditions"]}
            assert conds["SpecValid"]["status"] == "False"
            assert "spec.storage" in conds["SpecValid"]["message"]
    assert not (tmp_path.parent / "escaped-by-up").exists()
    assert not (tmp_path / "escaped-abs").exists() and not (tmp_path / "escaped.db").exists()
    assert all(not trial_objects(kube, name) for name in cases)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_engine_crash_is_recorded_with_its_cause_and_the_study_goes_on(
        kube: KubeEmulator, tmp_path: Path) -> None:
    env = faults.fault_path(tmp_path / "bin", BIN, crash=("crash-t1",))
    async with FakeKubelet(kube, extra_env=env, kill_timeout=2.0) as kubelet:
        out = await faults.engine_crash(kube, tmp_path / "state")
        assert kubelet.errors == []
    assert out.phase == "Succeeded" and (out.lost, out.duplicated, out.budget, out.left) == (
        0, 0, 0, []), out.rows
    assert dict((n, (s, r)) for n, s, r in out.rows)[1] == ("FAIL", "EngineCrashed")
    (event,) = [e for e in out.detail["events"] if e["reason"] == "TrialFail"]
    assert "EngineCrashed" in event["message"]
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in \
        event["message"]  # the cause, not only the last log line


@pytest.mark.slow
@pytest.mark.asyncio
async def test_failed_load_is_recorded_and_the_study_goes_on(
        kube: KubeEmulator, tmp_path: Path) -> None:
    env = faults.fault_path(tmp_path / "bin", BIN, fail_jobs=("loadfail-t1-load",))
    async with FakeKubelet(kube, extra_env=env, kill_timeout=2.0) as kubelet:
        out = await faults.load_failure(kube, tmp_path / "state")
        assert kubelet.errors == []
    assert out.phase == "Succeeded" and (out.lost, out.duplicated, out.budget, out.left) == (
        0, 0, 0, []), out.rows
    assert dict((n, (s, r)) for n, s, r in out.rows)[1] == ("FAIL", "LoadFailed")
    (event,) = [e for e in out.detail["events"] if e["reason"] == "TrialFail"]
    assert "injected load failure" in event["message"]


def test_kopf_retries_its_own_requests_through_an_outage() -> None:
    from chunktune.k8s.handlers import kopf_backoffs

    delays = kopf_backoffs(600)
    assert sum(delays) >= 600 * 0.9 and max(delays) <= 30 and len(delays) < 40
    assert len(kopf_backoffs(0)) == 8  # kopf's own default steps
