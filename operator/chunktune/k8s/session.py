"""One study's storage and trial backend, open for as long as the study (or a re-tune) runs.

:func:`open_session` is the one place both are built: the storage URL
(:meth:`~chunktune.k8s.state.Operator.storage`), the :class:`~chunktune.backends.kubernetes.
KubernetesBackend` with every hook wired to :class:`~chunktune.k8s.reporting.Reporting`
(``on_warning``/``on_recovered``: the ``PrometheusReachable`` condition and its events;
``capacity.on_change``: ``CapacityAvailable``), registered with the operator while open; on
exit the hooks are detached and the backend closed. :meth:`Session.tuner` opens a study's
tuner with the tuner's hooks wired the same way, so the study and the re-tune report alike.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from chunktune.api.v1alpha1 import ChunkedPrefillTuning
from chunktune.backends.kubernetes import KubernetesBackend
from chunktune.k8s import locations
from chunktune.k8s.live import Live, StopCause
from chunktune.k8s.reporting import Reporting
from chunktune.k8s.state import Operator
from chunktune.tuning.runner import StopRequested
from chunktune.tuning.tuner import Tuner


@dataclass
class Session:
    """An open study storage and trial backend, reporting through :attr:`report`."""

    url: str
    """The study storage."""
    backend: KubernetesBackend
    report: Reporting

    async def tuner(self, tuning: ChunkedPrefillTuning, stop_requested: StopRequested,
                    study_name: str | None = None) -> Tuner:
        """A tuner of study ``study_name`` (default: the tuning's) in this storage, its events,
        faults and progress reported; the status renders its study from now on."""
        report = self.report
        tuner = await asyncio.to_thread(
            Tuner, tuning, self.backend, self.url, on_event=report.event,
            on_update=lambda _: report.changed(), stop_requested=stop_requested,
            on_fault=report.fault, study_name=study_name)
        report.tuner = tuner
        return tuner

    def stopping(self, live: Live) -> StopCause | None:
        """Why the daemon stops (None: it does not); when the operator exits the trials in
        flight are left for the next operator (the backend detached)."""
        why = live.stopping()
        if why == StopCause.EXITING:
            self.backend.detached = True
        return why


@contextlib.asynccontextmanager
async def open_session(op: Operator, tuning: ChunkedPrefillTuning,
                       report: Reporting) -> AsyncIterator[Session]:
    """The study's storage and backend, hooks wired, until the block ends."""
    owner = report.owner
    url = await op.storage(tuning, owner)
    backend = op.backend(tuning, owner, locations.steps_dir(url, op.settings.state_dir, owner.uid))
    backend.on_warning = report.degraded
    backend.on_recovered = report.recovered
    backend.capacity.on_change = report.capacity
    op.backends.append(backend)
    report.backend = backend
    try:
        yield Session(url, backend, report)
    finally:
        op.backends.remove(backend)
        backend.on_warning = lambda reason, message: None
        backend.on_recovered = lambda reason: None
        backend.capacity.on_change = lambda number, message, waited, scheduled: None
        try:
            await backend.close()
        finally:
            report.tuner = report.backend = None


__all__ = ["Session", "open_session"]
