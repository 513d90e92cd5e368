"""The trial-backend protocol.

A backend turns a :class:`~chunktune.core.trials.TrialPlan` into a
:class:`~chunktune.core.trials.TrialResult` (the plain data lives in :mod:`chunktune.core.trials`,
below both the backends and the tuner).
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from chunktune.core.steps import kv_usage_peak, parse_meta
from chunktune.core.trials import Reporter, TrialPlan, TrialResult, TrialState

T = TypeVar("T")


async def within(aw: Awaitable[T], timeout: float, paused: Callable[[], float]) -> T:
    """``await aw`` with a timeout that leaves out the time ``paused()`` reports (seconds the
    trial spent waiting for capacity, :meth:`TrialBackend.paused_seconds`): like
    :func:`asyncio.wait_for`, raising :class:`TimeoutError` once ``timeout`` seconds of
    unpaused time have passed."""
    task = asyncio.ensure_future(aw)
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        while True:
            left = start + timeout + paused() - loop.time()
            if left <= 0:
                break
            done, _ = await asyncio.wait({task}, timeout=left)
            if done:
                return task.result()
    except asyncio.CancelledError:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)  # its clean-up runs first
        raise
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise TimeoutError


def trial_tag(plan: TrialPlan) -> str:
    """A trial's name in its files (engine logs, step logs): ``<plan name>-<number>``."""
    return f"{plan.name or 'trial'}-{plan.number}"


def record_engine_startup(result: TrialResult, log: Iterable[str]) -> None:
    """Record with the trial what its engine's start-up log says it ran with (vLLM version,
    step budget, KV-cache tokens, ``--max-num-seqs`` where set): ``result.server["engine"]``,
    kept in the trial's server figures. The budget is the effective one, whatever version
    defaulted it."""
    meta = parse_meta(log).to_dict()
    if meta:
        result.server["engine"] = meta


def take_kv_peak_from_steps(result: TrialResult) -> None:
    """Raise the result's ``kv_cache_usage_peak`` (metrics and server figures) to the largest
    KV usage in its step log, and give a complete trial that has none that peak: backends
    scrape ``/metrics`` rarely or not at all during the load of an engine that logs its steps
    (a scrape stalls the API server's event loop), the gauge is only sampled (and misses the
    peak of short bursts), and the step log has every step's usage. Every backend that
    returns a step log applies this, once, where it keeps the log."""
    peak = kv_usage_peak(result.steps)
    if peak is None:
        return
    for d in (result.metrics, result.server):
        if "kv_cache_usage_peak" in d:
            d["kv_cache_usage_peak"] = max(d["kv_cache_usage_peak"], peak)
    if result.state == TrialState.COMPLETE:
        result.metrics.setdefault("kv_cache_usage_peak", peak)


class TrialBackend(abc.ABC):
    """Runs trials. Implementations: simulated, local, kubernetes."""

    name: str = "base"

    #: How many trials this backend can run at once (the runner caps parallelism at it).
    max_parallel: int = 1

    @abc.abstractmethod
    async def run_trial(self, plan: TrialPlan, report: Reporter | None = None) -> TrialResult:
        """Start the engine with the plan's flags, wait until it serves (or record why it
        could not start), drive the workload, read metrics, clean up."""

    async def recover(self, plan: TrialPlan, report: Reporter | None = None
                      ) -> TrialResult | None:
        """Re-attach to a trial a previous process left running (restart safety), or one whose
        infrastructure failed for a while (:class:`~chunktune.core.errors.InfrastructureFault`).
        The default cannot: the caller re-runs the plan. Kubernetes adopts the trial's
        objects."""
        return None

    def paused_seconds(self, number: int) -> float:
        """Seconds trial ``number`` has waited for capacity so far (its engine could not be
        scheduled: no free GPU): never counted against its timeouts. Kubernetes knows; the
        others never wait."""
        return 0.0

    async def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release anything the backend holds (processes, clients)."""
