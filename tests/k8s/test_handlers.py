"""The kopf side of the daemon: its stop flag, and the operator's own ``exiting`` flag that stops
a daemon kopf spawned while it was already stopping (kopf's daemon killer has run by then and
never signals it; before this flag such a daemon slept until kopf cancelled it, and the timer
task of ``stopped.wait(n)`` made ``kopf.operator`` raise TimeoutError)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import kopf
import pytest
from kopf._cogs.aiokits import aioenums  # kopf's own flag behind ``stopped``

from chunktune.k8s.handlers import KopfLive
from tests.k8s.conftest import operator_settings, running_operator, tuning
from tests.kube.emulator import KubeEmulator


def kopf_flag() -> tuple[aioenums.FlagSetter[kopf.DaemonStoppingReason],
                         kopf.DaemonStopped]:
    setter: aioenums.FlagSetter[kopf.DaemonStoppingReason] = aioenums.FlagSetter()
    return setter, aioenums.AsyncFlagWaiter(setter)


async def within_kopfs_instant_exit() -> None:
    """The loop cycles kopf gives a signalled daemon before it waits its cancellation backoff
    (``settings.background.instant_exit_zero_time_cycles``, 10)."""
    for _ in range(10):
        await asyncio.sleep(0)


def kopf_timer_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks()
            if t.get_name().startswith("time-limited waiting for the daemon stopper")]


@pytest.mark.asyncio
async def test_a_daemon_kopf_never_signals_stops_on_the_operators_exit() -> None:
    _, stopped = kopf_flag()
    exiting = asyncio.Event()
    live = KopfLive({}, stopped, exiting)
    assert live.stopping() is None
    sleeper = asyncio.create_task(live.sleep(60))
    await asyncio.sleep(0.05)
    exiting.set()
    await within_kopfs_instant_exit()
    assert sleeper.done()  # at once, not after the 60 s
    assert live.stopping() == "exiting"


@pytest.mark.asyncio
async def test_kopfs_stop_flag_ends_a_sleep_and_says_why() -> None:
    setter, stopped = kopf_flag()
    live = KopfLive({}, stopped, asyncio.Event())
    sleeper = asyncio.create_task(live.sleep(60))
    await asyncio.sleep(0.05)
    setter.set(reason=kopf.DaemonStoppingReason.RESOURCE_DELETED)
    await within_kopfs_instant_exit()  # else kopf keeps the finalizer its backoff long
    assert sleeper.done()
    assert live.stopping() == "deleted"
    setter2, stopped2 = kopf_flag()
    setter2.set(reason=kopf.DaemonStoppingReason.OPERATOR_EXITING)
    assert KopfLive({}, stopped2).stopping() == "exiting"


@pytest.mark.asyncio
async def test_a_daemon_cancelled_while_it_sleeps_leaves_no_timer_task() -> None:
    _, stopped = kopf_flag()
    live = KopfLive({}, stopped, asyncio.Event())
    sleeper = asyncio.create_task(live.sleep(0.5))
    await asyncio.sleep(0.05)
    sleeper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sleeper
    assert kopf_timer_tasks() == []
    await live.sleep(0.01)  # a short sleep ends by itself
    assert live.stopping() is None


@pytest.mark.slow
@pytest.mark.asyncio
async def test_kopfs_cleanup_sets_the_operators_exiting_flag(kube: KubeEmulator,
                                                              tmp_path: Path) -> None:
    kube.create("cpt", tuning("t"), "default")
    async with running_operator(kube, operator_settings(tmp_path)) as op:
        assert not op.exiting.is_set()
    assert op.exiting.is_set()
