"""Build the operator (registry, API client) and run kopf, as the leader when there are several
replicas.

:func:`run` is what ``chunktune operator run`` calls; tests call it in-process with their own
``login`` (the emulator's URL and token) and ``stop_flag``. Without ``login``, kopf logs in
the way the ``kubernetes`` client does (in-cluster service account, else the kubeconfig).

With ``settings.metrics_address`` the replica serves ``/metrics`` and ``/healthz`` from the
start (a standby too). With ``settings.leader.enabled`` it first campaigns for the Lease
(:mod:`chunktune.k8s.leader`) and runs kopf only once it holds it; a leader that cannot renew
it in time exits at once with status :data:`LOST_EXIT` (its pod restarts as a standby) rather
than go on beside the new leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import kopf

from chunktune.k8s import handlers, operator_metrics
from chunktune.k8s.controller import Operator
from chunktune.k8s.kube import KubeApi, make_api_client
from chunktune.k8s.leader import LeaderElector
from chunktune.k8s.settings import Settings

log = logging.getLogger(__name__)
#: Exit status of a leader that lost its Lease.
LOST_EXIT = 3


def build(settings: Settings, api_client: Any | None = None,
          login: Callable[..., Any] | None = None) -> tuple[kopf.OperatorRegistry, Operator]:
    """A registry with every handler, and the shared operator state."""
    client = api_client if api_client is not None else make_api_client(
        pool_size=settings.api_threads)
    op = Operator(settings, KubeApi(client, settings.api_threads,
                                    retry_seconds=settings.api_retry_seconds,
                                    request_timeout=settings.api_timeout))
    op.api.on_retry = op.metrics.api_retry
    registry = kopf.OperatorRegistry()
    handlers.register(registry, op)
    kopf.on.login(registry=registry)(login or kopf.login_via_client)
    return registry, op


def exit_lost() -> None:
    """Stop acting at once: the process ends (no clean-up that could write anything)."""
    log.critical("leadership lost: exiting (status %d) so that the new leader runs the studies "
                 "alone", LOST_EXIT)
    logging.shutdown()
    os._exit(LOST_EXIT)


async def run(settings: Settings, *, api_client: Any | None = None,
              login: Callable[..., Any] | None = None, stop_flag: asyncio.Event | None = None,
              ready_flag: Any = None, on_lost: Callable[[], None] | None = None,
              built: tuple[kopf.OperatorRegistry, Operator] | None = None) -> None:
    """Run the operator until ``stop_flag`` is set (or a signal arrives). ``on_lost``: what a
    leader that lost its Lease does (default :func:`exit_lost`; kopf is stopped after it
    returns); ``built``: the :func:`build` to run (tests read its state)."""
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    registry, op = built or build(settings, api_client, login)
    stop = stop_flag or _signalled()
    elector = LeaderElector(op.api, settings.leader, on_change=op.metrics.leading) \
        if settings.leader.enabled else None
    server = None
    try:
        if settings.metrics_address:
            server = await operator_metrics.serve(settings.metrics_address, op.metrics, lambda: (
                "standby" if elector is not None and not elector.leading else "leader"))
        if elector is None:
            op.metrics.leading(True)
            await _kopf(settings, registry, stop, ready_flag)
        elif await elector.acquire(stop):
            await _lead(settings, registry, elector, stop, ready_flag, on_lost or exit_lost)
    finally:
        if server is not None:
            await server.cleanup()
        await op.api.close()


async def _kopf(settings: Settings, registry: kopf.OperatorRegistry, stop: asyncio.Event,
                ready_flag: Any) -> None:
    await kopf.operator(
        registry=registry, clusterwide=settings.clusterwide,
        namespaces=list(settings.namespaces), standalone=settings.standalone,
        liveness_endpoint=settings.liveness, stop_flag=stop, ready_flag=ready_flag)


async def _lead(settings: Settings, registry: kopf.OperatorRegistry, elector: LeaderElector,
                stop: asyncio.Event, ready_flag: Any, on_lost: Callable[[], None]) -> None:
    """Run kopf while this replica holds the Lease; release it after a clean stop."""
    kopf_stop = asyncio.Event()
    lost = False

    async def keep() -> None:
        nonlocal lost
        if not await elector.hold(stop):
            lost = True
            on_lost()
        kopf_stop.set()

    keeper = asyncio.create_task(keep())
    try:
        await _kopf(settings, registry, kopf_stop, ready_flag)
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
        if not lost:
            await elector.release()


def _signalled() -> asyncio.Event:
    """An event set by SIGINT/SIGTERM (kopf installs its own handlers while it runs)."""
    stop = asyncio.Event()
    if threading.current_thread() is threading.main_thread():
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
    return stop


__all__ = ["LOST_EXIT", "build", "exit_lost", "run"]
