"""What one resource's study tells the cluster: events, conditions and status writes.

:class:`Reporting` is the only way the study (:mod:`.controller`) and the re-tune
(:mod:`.retuner`) report: an event (:meth:`~Reporting.emit`), a condition that says whether it
changed (:meth:`~Reporting.condition`: the event goes out once per change), a status write
now (:meth:`~Reporting.write`) or soon (:meth:`~Reporting.changed`, coalesced and retried
with backoff, awaited by :meth:`~Reporting.drain`), and the hooks the tuner and the trial
backend call (:meth:`~Reporting.event`, :meth:`~Reporting.fault`, :meth:`~Reporting.capacity`,
:meth:`~Reporting.degraded`, :meth:`~Reporting.recovered`), which :func:`.session.open_session`
wires. Cluster API keeps its conditions in one utility the same way.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
from collections.abc import Callable

from chunktune.backends import manifests as mf
from chunktune.backends.kubernetes import KubernetesBackend
from chunktune.core.flags import flags_line
from chunktune.core.progress import EventKind, TrialEvent
from chunktune.core.trials import TrialState
from chunktune.k8s.state import Operator, StatusWriter
from chunktune.tuning import study as st
from chunktune.tuning.tuner import Tuner

log = logging.getLogger(__name__)
#: Backoff of status writes that failed: first delay, cap (seconds).
WRITE_BACKOFF_FIRST = 1.0
WRITE_BACKOFF_CAP = 30.0
#: A log line that names a failure's cause (an exception, a fatal signal, an OOM).
CAUSE_LINE = re.compile(r"(\b\w*(Error|Exception)\b|Traceback|Segmentation fault|core dumped|"
                        r"Killed|OOM|out of memory|FATAL|fatal|panic|Aborted|exit code \d+)")
#: The condition that says whether the Prometheus of ``spec.metrics.prometheusURL`` answers.
PROMETHEUS_CONDITION = "PrometheusReachable"
#: ``emit(type, reason, message)``: post a Kubernetes Event on the resource.
Emit = Callable[[str, str, str], None]


def failure_lines(message: str, limit: int = 700) -> str:
    """What an event shows of a failed trial's message: the classified cause's own line
    first (vLLM's message, or the exception line of a traceback), then the last lines, up to
    ``limit`` characters (events are capped at 1000)."""
    lines = [x.rstrip() for x in message.strip().splitlines() if x.strip()]
    cause = [x for x in lines if CAUSE_LINE.search(x)]
    keep: list[str] = []
    for x in cause[-2:] + lines[-4:]:
        if x not in keep:
            keep.append(x)
    text = " | ".join(x.strip() for x in keep)
    return text if len(text) <= limit else text[:limit - 3] + "..."


class Reporting:
    """Events, conditions and status writes of one resource's study (or re-tune)."""

    def __init__(self, op: Operator, owner: mf.Owner, writer: StatusWriter, emit: Emit,
                 gen: int) -> None:
        self.op = op
        self.owner = owner
        self.writer = writer
        self.emit: Emit = emit
        """Post an event on the resource."""
        self.gen = gen
        """The generation conditions and phases are written for."""
        self.tuner: Tuner | None = None
        """The tuner whose study the status renders (None: the status without a study)."""
        self.backend: KubernetesBackend | None = None
        """The trial backend of the session open now (:func:`.session.open_session`)."""
        self.faulted: set[int] = set()
        """Trials waiting out an API fault."""
        self.unschedulable: dict[int, str] = {}
        """Trials waiting for capacity, with the scheduler's message."""
        self._flush: asyncio.Task[None] | None = None
        self._dirty = False

    # ---- conditions and writes ----------------------------------------------------------------

    def condition(self, kind: str, ok: bool, reason: str, message: str, *,
                  by_message: bool = False) -> bool:
        """Set condition ``kind`` for :attr:`gen`; whether it changed
        (:meth:`StatusWriter.condition`)."""
        return self.writer.condition(kind, ok, reason, message, self.gen, by_message=by_message)

    async def write(self) -> None:
        """Write the status now (rendered from :attr:`tuner`'s study, when there is one)."""
        await self.writer.write(self.tuner)

    def changed(self) -> None:
        """The status changed: write it soon (writes coalesce; a failed one is retried)."""
        self._dirty = True
        if self._flush is None or self._flush.done():
            self._flush = asyncio.get_running_loop().create_task(self._flusher())

    async def _flusher(self) -> None:
        delay = WRITE_BACKOFF_FIRST
        while self._dirty:
            self._dirty = False
            try:
                await self.writer.write(self.tuner)
                delay = WRITE_BACKOFF_FIRST
            except Exception as e:
                # NOTE: the status is rendered from the study storage, so nothing is lost:
                # the next write (this retry, or the next trial's) carries everything.
                log.warning("cannot write the status of %s/%s (%s); retrying in %.1f s",
                            self.owner.namespace, self.owner.name, e, delay)
                self._dirty = True
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(WRITE_BACKOFF_CAP, delay * 2)

    async def drain(self, timeout: float = 60.0) -> None:
        """Wait for the writes :meth:`changed` asked for (at most ``timeout`` seconds)."""
        if self._flush is not None and not self._flush.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._flush), timeout)
            except TimeoutError:
                self._flush.cancel()
                log.warning("%s/%s: the status could not be written within %g s",
                            self.owner.namespace, self.owner.name, timeout)
            except Exception:
                log.exception("status flush of %s/%s", self.owner.namespace, self.owner.name)

    # ---- the trial backend's hooks -------------------------------------------------------------

    def fault(self, number: int, message: str | None) -> None:
        """A trial waits out an API fault (``message``), or was re-adopted (None)."""
        if message is not None:
            if number not in self.faulted:
                self.faulted.add(number)
                self.op.metrics.fault(self.owner.namespace, self.owner.name, "trial")
                self.emit("Warning", "ApiUnavailable",
                          f"trial {number}: the Kubernetes API failed ({message}); the trial "
                          f"stays in flight and is re-adopted when the API answers (not a "
                          f"failure, no budget spent)")
        elif number in self.faulted:
            self.faulted.discard(number)
            self.emit("Normal", "TrialReadopted",
                      f"trial {number}: re-adopted after the Kubernetes API came back")

    def capacity(self, number: int, message: str | None, waited: float,
                 scheduled: bool) -> None:
        """Trial ``number``'s engine pod waits for capacity (``message``: the scheduler's), or
        stopped waiting after ``waited`` seconds (``scheduled``, or the trial ended): events,
        the ``CapacityAvailable`` condition while any trial waits, the metrics."""
        if message is not None:
            self.unschedulable[number] = message
            self.emit("Normal", "TrialWaitingForCapacity", (
                f"trial {number}: waiting for capacity ({message}); the wait counts against "
                f"neither engine.startupTimeout nor budget.trialTimeout and is not a failure"))
        elif self.unschedulable.pop(number, None) is not None and scheduled:
            self.emit("Normal", "TrialScheduled",
                      f"trial {number}: scheduled after {waited:.0f} s waiting for capacity")
        self.op.metrics.capacity(self.owner.namespace, self.owner.name,
                                 len(self.unschedulable), waited if message is None else None)
        if self.unschedulable:
            numbers = sorted(self.unschedulable)
            self.condition(
                "CapacityAvailable", False, "WaitingForCapacity",
                f"{len(numbers)} trial{'s' if len(numbers) > 1 else ''} "
                f"({', '.join(map(str, numbers))}) wait for capacity: "
                f"{self.unschedulable[numbers[-1]]}")
        elif self.writer.condition_status("CapacityAvailable") == "False":
            self.condition("CapacityAvailable", True, "Scheduled", "no trial waits for capacity")
        self.changed()

    def degraded(self, reason: str, message: str) -> None:
        """The study goes on without something (Prometheus): a Warning event each time, and
        a condition while it lasts."""
        self.emit("Warning", reason, message)
        if reason == "PrometheusUnreachable":
            self.condition(PROMETHEUS_CONDITION, False, reason, message)
            self.changed()

    def recovered(self, reason: str) -> None:
        """What :meth:`degraded` said is over."""
        if reason == "PrometheusUnreachable" and \
                self.writer.condition_status(PROMETHEUS_CONDITION) == "False":
            self.condition(PROMETHEUS_CONDITION, True, "Reachable",
                           "Prometheus answers; the figures come from it")
            self.emit("Normal", "PrometheusReachable", "Prometheus answers again")
            self.changed()

    # ---- the tuner's hooks ---------------------------------------------------------------------

    def _ended(self, e: TrialEvent) -> None:
        """The metrics of a trial that ended."""
        times = None
        if self.tuner is not None:
            t = next((t for t in self.tuner.trials() if t.number == e.number), None)
            times = t.user_attrs.get(st.ATTR_TIMES) if t is not None else None
        waited = self.backend.paused_seconds(e.number) if self.backend is not None else 0.0
        self.op.metrics.trial_ended(self.owner.namespace, self.owner.name, e.state, e.reason,
                                    times, waited)

    def event(self, e: TrialEvent) -> None:
        """A trial started or ended, a warning, a twin-first phase: an event (and the
        metrics of a trial that ended)."""
        if e.kind == EventKind.FINISHED:
            self._ended(e)
        if e.kind == EventKind.WARNING:  # the twin is not trusted
            self.emit("Warning", e.reason or "Warning", e.message or "")
            return
        if e.kind == EventKind.PHASE:  # a twin-first study's phase
            self.emit("Normal", "TwinPhase", f"{e.phase}: {e.message}")
            return
        tag = " (baseline)" if e.baseline else ""
        flags = flags_line(e.point)
        if e.kind == EventKind.STARTED:
            self.emit("Normal", "TrialStarted", f"trial {e.number}{tag}: {flags}")
            return
        what = e.state + (f" {e.reason}" if e.reason else "")
        detail = ""
        if self.tuner is not None and e.metrics:
            key = self.tuner.objectives[0].key
            if key in e.metrics:
                detail = f"; {key}={e.metrics[key]:.4g}"
        if e.state in (TrialState.FAIL, TrialState.INFEASIBLE) and e.message:
            detail += f": {failure_lines(e.message)}"
        kind = "Warning" if e.state in (TrialState.FAIL, TrialState.INFEASIBLE) else "Normal"
        self.emit(kind, f"Trial{e.state.title()}",
                  f"trial {e.number}{tag}: {flags} -> {what}{detail}")


__all__ = ["CAUSE_LINE", "PROMETHEUS_CONDITION", "Emit", "Reporting", "failure_lines"]
