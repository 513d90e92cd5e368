"""Leader election over a Lease (:mod:`chunktune.k8s.leader`) against the emulator: one holder at
a time, races decided by the API server, a released Lease passes at once, an abandoned one only
after its duration as the standby observed it, and a leader that cannot renew gives up within
its renew deadline."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from chunktune.k8s.kube import KubeApi
from chunktune.k8s.leader import LeaderElector
from chunktune.k8s.settings import LeaderSettings
from tests.k8s.conftest import operator_settings
from tests.kube.emulator import KubeEmulator

pytestmark = pytest.mark.asyncio
#: short, yet each Lease request may take 0.5 s (``LeaderElector._timeout``): a request that
#: times out counts as "not leader", which a busy machine must not decide
FAST = LeaderSettings(enabled=True, lease_name="op", lease_namespace="default",
                      lease_duration=3.0, renew_deadline=2.0, retry_period=0.5)


@pytest_asyncio.fixture()
async def api(kube: KubeEmulator) -> AsyncIterator[KubeApi]:
    api = KubeApi(kube.api_client(), retry_seconds=0.0)
    yield api
    await api.close()


def elector(api: KubeApi, identity: str) -> LeaderElector:
    return LeaderElector(api, LeaderSettings(**{**FAST.__dict__, "identity": identity}))


def holder(kube: KubeEmulator) -> str | None:
    return ((kube.get("leases", "default", "op") or {}).get("spec") or {}).get("holderIdentity")


async def test_one_holder_and_a_released_lease_passes_at_once(kube: KubeEmulator,
                                                             api: KubeApi) -> None:
    a, b = elector(api, "a"), elector(api, "b")
    # a race on a Lease nobody created: the API server lets exactly one create it
    won = await asyncio.gather(a.try_acquire_or_renew(), b.try_acquire_or_renew())
    assert sorted(won) == [False, True]
    first, second = (a, b) if won[0] else (b, a)
    assert holder(kube) == first.identity
    assert await first.try_acquire_or_renew()  # a renewal
    assert not await second.try_acquire_or_renew()  # held, and just renewed
    first.leading = True
    await first.release()
    assert holder(kube) is None
    # at once: well within the lease duration it would wait for an abandoned Lease
    assert await asyncio.wait_for(second.acquire(asyncio.Event()), FAST.lease_duration - 0.5)
    lease = kube.get("leases", "default", "op")
    assert lease["spec"]["holderIdentity"] == second.identity
    assert lease["spec"]["leaseTransitions"] == 1


async def test_an_abandoned_lease_passes_after_its_duration(kube: KubeEmulator,
                                                            api: KubeApi) -> None:
    a, b = elector(api, "a"), elector(api, "b")
    assert await a.try_acquire_or_renew()  # then a dies: no more renewals
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await b.acquire(asyncio.Event())
    assert loop.time() - t0 >= FAST.lease_duration  # b waited out the whole duration
    assert holder(kube) == "b"


async def test_a_leader_that_cannot_renew_gives_up_within_its_deadline(
        kube: KubeEmulator, api: KubeApi) -> None:
    changes: list[bool] = []
    a = LeaderElector(api, LeaderSettings(**{**FAST.__dict__, "identity": "a"}),
                      on_change=changes.append)
    assert await a.acquire(asyncio.Event())
    kube.add_fault(status=0, resource="leases")  # the API server stops answering for leases
    assert await asyncio.wait_for(a.hold(asyncio.Event()), 10) is False
    assert changes == [True, False]
    kube.clear_faults()
    # a leader whose Lease another replica took (it was partitioned) gives up too
    assert await a.try_acquire_or_renew()
    a.leading = True
    lease = kube.get("leases", "default", "op")
    kube.patch("leases", "default", "op", {"spec": {"holderIdentity": "b"}})
    assert lease["spec"]["holderIdentity"] == "a"
    assert await asyncio.wait_for(a.hold(asyncio.Event()), 10) is False
    assert holder(kube) == "b"


async def test_the_operator_runs_kopf_only_while_it_leads(kube: KubeEmulator,
                                                          tmp_path: Path) -> None:
    """``runtime.run`` with leader election: a standby while another replica's Lease is
    fresh; kopf once it holds the Lease; kopf stopped (after ``on_lost``, which the command
    line makes an exit) once it cannot renew."""
    import kopf

    from chunktune.k8s import runtime

    kube.create("leases", {"metadata": {"name": "op"}, "spec": {
        "holderIdentity": "other", "leaseDurationSeconds": 2}}, "default")
    settings = operator_settings(tmp_path).with_overrides(leader={
        **FAST.__dict__, "identity": "me"})
    built = runtime.build(settings, kube.api_client(), lambda **_: kopf.ConnectionInfo(
        server=kube.url, token=kube.token))
    op = built[1]

    def leading() -> float | None:
        return op.metrics.registry.get_sample_value("chunktune_leader")

    stop, ready, lost = asyncio.Event(), asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(runtime.run(settings, built=built, stop_flag=stop,
                                           ready_flag=ready, on_lost=lost.set))
    try:
        await asyncio.wait_for(ready.wait(), 60)  # "other" never renewed: taken over
        assert holder(kube) == "me" and leading() == 1
        kube.add_fault(status=0, resource="leases")
        await asyncio.wait_for(task, 60)  # kopf stopped
        assert lost.is_set() and leading() == 0
    finally:
        stop.set()
        kube.clear_faults()
        if not task.done():
            await asyncio.wait_for(task, 60)


async def test_a_release_that_conflicts_with_a_late_renewal_reads_the_lease_again(
        kube: KubeEmulator, api: KubeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    """A clean stop cancels the renewal loop, but a renewal already sent can land between the
    release's read and its write: the write then conflicts (409, the Lease's version moved)
    and the release reads again and gives the Lease up (it used to log a warning and leave
    the standby to wait out the duration)."""
    a = elector(api, "a")
    assert await a.try_acquire_or_renew()
    a.leading = True
    real_get = api.get_lease
    renewed: list[str] = []

    async def read_then_renewed(*args: object) -> object:
        lease = await real_get(*args)  # type: ignore[arg-type]
        if not renewed:  # the late renewal, as the API server applies it after this read
            renewed.append(kube.patch("leases", "default", "op", {"spec": {
                "leaseDurationSeconds": 4}})["metadata"]["resourceVersion"])
        return lease

    monkeypatch.setattr(api, "get_lease", read_then_renewed)
    await a.release()
    assert len(renewed) == 1 and holder(kube) is None
    assert kube.get("leases", "default", "op")["spec"]["leaseDurationSeconds"] == 1
