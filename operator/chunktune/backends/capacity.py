"""Trials waiting for capacity: engine pods the scheduler cannot place for lack of resources.

A pod ``Pending`` with ``PodScheduled=False``, reason ``Unschedulable`` and a message naming an
``Insufficient`` resource (``0/4 nodes are available: 4 Insufficient nvidia.com/gpu``) waits
for capacity: other trials hold the GPUs. :class:`CapacityWaits` keeps each trial's waiting
time, which the Kubernetes backend leaves out of ``engine.startupTimeout`` and the tuner out of
``budget.trialTimeout`` (:meth:`~chunktune.backends.base.TrialBackend.paused_seconds`).
Unschedulable for any other reason (a taint, a node selector nothing matches) is not capacity:
that time counts, and a start-up timeout reports the scheduler's message.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

#: What the scheduler says of a pod no node has room for.
_INSUFFICIENT = re.compile(r"\bInsufficient \S+|\bToo many pods\b")


def capacity_wait(pod: Mapping[str, Any]) -> str | None:
    """The scheduler's message when the pod is Pending because no node has the resources it
    requests (GPUs, CPU, memory) free; None otherwise."""
    status = pod.get("status") or {}
    if status.get("phase", "Pending") != "Pending":
        return None
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False" and \
                c.get("reason") == "Unschedulable" and _INSUFFICIENT.search(
                    str(c.get("message") or "")):
            return str(c["message"])
    return None


def _time(value: Any) -> float | None:
    try:
        return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def scheduling_wait(pod: Mapping[str, Any], now: float | None = None) -> float:
    """Seconds the pod waited to be scheduled, from its timestamps: creation to scheduling,
    or, while it waits for capacity, creation to ``now`` (wall clock; the rest of the wait is
    measured as it goes). For a trial adopted from another operator process."""
    created = _time((pod.get("metadata") or {}).get("creationTimestamp"))
    if created is None:
        return 0.0
    if capacity_wait(pod) is not None:
        return max(0.0, (time.time() if now is None else now) - created)
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "True":
            scheduled = _time(c.get("lastTransitionTime"))
            if scheduled is not None:
                return max(0.0, scheduled - created)
    return 0.0


class CapacityWaits:
    """Each trial's time waiting for capacity (monotonic seconds)."""

    def __init__(self) -> None:
        self.on_change: Callable[[int, str | None, float, bool], None] = \
            lambda number, message, waited, scheduled: None
        """Told ``(trial, the scheduler's message, 0, False)`` when a trial starts waiting, and
        ``(trial, None, seconds waited, scheduled)`` when it stops: its pod was scheduled, or
        (``scheduled`` False) the trial ended while it waited (stopped, deleted)."""
        self._waited: dict[int, float] = {}
        self._since: dict[int, float] = {}

    def paused(self, number: int) -> float:
        """Seconds trial ``number`` has waited, the wait in progress included."""
        since = self._since.get(number)
        return self._waited.get(number, 0.0) + (time.monotonic() - since if since else 0.0)

    def waiting(self) -> list[int]:
        """The trials waiting now."""
        return sorted(self._since)

    def start(self, number: int, before: float = 0.0) -> None:
        """A trial starts (fresh: no wait yet; adopted: ``before`` seconds waited already)."""
        self._waited[number] = before

    def update(self, number: int, message: str | None, scheduled: bool = True) -> None:
        """``message``: the trial's pod is unschedulable for capacity now; None: it is not
        (``scheduled``), or no longer matters (the trial ended)."""
        now = time.monotonic()
        since = self._since.get(number)
        if message is not None and since is None:
            self._since[number] = now
            self.on_change(number, message, 0.0, False)
        elif message is None and since is not None:
            del self._since[number]
            self._waited[number] = self._waited.get(number, 0.0) + now - since
            self.on_change(number, None, now - since, scheduled)


__all__ = ["CapacityWaits", "capacity_wait", "scheduling_wait"]
