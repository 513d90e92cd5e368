"""Leader election over a ``coordination.k8s.io/v1`` Lease: one active operator replica.

With ``replicaCount: 2`` every replica campaigns for one Lease; the holder runs kopf (and so
every study), the others wait. The rules are client-go's leader election:

* a standby takes the Lease only when its holder has not renewed it for ``lease_duration``
  seconds **as the standby observed it** (the time it first saw the current record, on its own
  monotonic clock: no comparison of clocks across machines), or when the holder released it;
* every write is a PUT carrying the ``resourceVersion`` it read, so two standbys racing for
  an expired Lease cannot both win (the loser gets a 409);
* the leader renews every ``retry_period``; when it has not managed to for ``renew_deadline``
  (< ``lease_duration``) it has lost, and must stop acting before any standby may take over.
  :func:`chunktune.k8s.runtime.run` then exits the process at once, as client-go's users do:
  a dead leader is what the studies already survive (its trial objects stay in the cluster,
  the next leader adopts them), whereas a leader that goes on writing would not be;
* a leader that stops cleanly releases the Lease (no holder, one-second duration), so a
  standby takes over within a retry period instead of a lease duration.

Takeover after the leader dies (SIGKILL, node loss): at most ``lease_duration`` plus one
``retry_period`` after its last renewal, then kopf's start-up and the adoption of the trial in
flight (``bench/operator_failover.py`` measures it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import secrets
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from chunktune.backends.cluster import ClusterApiError
from chunktune.k8s.settings import LeaderSettings

log = logging.getLogger(__name__)
Body = dict[str, Any]
#: Tries at giving the Lease up on a clean stop when a write conflicts (409).
RELEASE_ATTEMPTS = 3
#: Where a pod finds its own namespace.
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class LeaseApi(Protocol):
    """The Lease calls (one try each, bounded by ``timeout``)."""

    async def get_lease(self, namespace: str, name: str, timeout: float) -> Body | None: ...

    async def create_lease(self, namespace: str, body: Body, timeout: float) -> Body: ...

    async def replace_lease(self, namespace: str, name: str, body: Body,
                            timeout: float) -> Body: ...


def default_identity() -> str:
    """The pod's name (``POD_NAME``, else the host name) and a random suffix: a restarted
    replica is a new candidate, never mistaken for the holder it replaced."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{secrets.token_hex(4)}"


def default_namespace() -> str:
    """The operator pod's namespace, else ``default``."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def _micro_time(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Campaigns for one Lease (:meth:`acquire`), keeps it (:meth:`hold`), gives it back
    (:meth:`release`)."""

    def __init__(self, api: LeaseApi, settings: LeaderSettings,
                 on_change: Callable[[bool], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.settings = settings
        self.name = settings.lease_name
        self.namespace = settings.lease_namespace or default_namespace()
        self.identity = settings.identity or default_identity()
        self.on_change = on_change or (lambda leading: None)
        """Told True when this replica becomes the leader, False when it stops being one."""
        self.clock = clock
        self.leading = False
        self.holder: str | None = None
        """The holder of the Lease as last read ("" or None: nobody)."""
        self.transitions = 0
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._renewed_at = 0.0

    @property
    def _timeout(self) -> float:
        """One request's bound: a leader that misses its renew deadline finds out (and stops)
        within it, still before a standby may take over."""
        s = self.settings
        return max(0.1, min(s.retry_period, (s.lease_duration - s.renew_deadline) / 2))

    def _spec(self, old: Body, now: datetime) -> Body:
        ours = old.get("holderIdentity") == self.identity
        transitions = int(old.get("leaseTransitions") or 0) + (0 if ours or not old else 1)
        return {"holderIdentity": self.identity,
                "leaseDurationSeconds": max(1, round(self.settings.lease_duration)),
                "renewTime": _micro_time(now),
                "acquireTime": (old.get("acquireTime") if ours else None) or _micro_time(now),
                "leaseTransitions": transitions}

    def _observe(self, spec: Body) -> None:
        record = (spec.get("holderIdentity"), spec.get("renewTime"),
                  spec.get("leaseDurationSeconds"), spec.get("leaseTransitions"))
        if record != self._observed:
            self._observed, self._observed_at = record, self.clock()
        self.holder = spec.get("holderIdentity") or None
        self.transitions = int(spec.get("leaseTransitions") or 0)

    def _set_leading(self, leading: bool) -> None:
        if leading != self.leading:
            self.leading = leading
            log.info("%s %s the lease %s/%s", self.identity, "holds" if leading else "lost",
                     self.namespace, self.name)
            self.on_change(leading)

    async def try_acquire_or_renew(self) -> bool:
        """One round: True when this replica holds the Lease afterwards."""
        now = datetime.now(tz=UTC)
        # NOTE: the renewal counts from before the request: the standbys saw it no earlier.
        started = self.clock()
        try:
            lease = await self.api.get_lease(self.namespace, self.name, self._timeout)
            if lease is None:
                spec = self._spec({}, now)
                body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": self.name, "namespace": self.namespace},
                        "spec": spec}
                created = await self.api.create_lease(self.namespace, body, self._timeout)
                self._observe(created.get("spec") or spec)
                self._renewed_at = started
                return True
            spec = dict(lease.get("spec") or {})
            self._observe(spec)
            holder = spec.get("holderIdentity") or ""
            duration = float(spec.get("leaseDurationSeconds") or self.settings.lease_duration)
            if holder and holder != self.identity and \
                    self.clock() < self._observed_at + duration:
                return False  # held, and renewed within its duration as far as we have seen
            lease["spec"] = self._spec(spec, now)
            updated = await self.api.replace_lease(self.namespace, self.name, lease,
                                                   self._timeout)
            self._observe(updated.get("spec") or lease["spec"])
            self._renewed_at = started
            return True
        except ClusterApiError as e:
            if e.status != 409:  # 409: another replica wrote first
                log.warning("lease %s/%s: %s", self.namespace, self.name, e)
            return False

    def _period(self) -> float:
        return self.settings.retry_period * random.uniform(1.0, 1.2)

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait until this replica holds the Lease (True) or ``stop`` is set (False)."""
        log.info("%s campaigns for the lease %s/%s", self.identity, self.namespace, self.name)
        while not stop.is_set():
            if await self.try_acquire_or_renew():
                self._set_leading(True)
                return True
            await _stopped(stop, self._period())
        return False

    async def hold(self, stop: asyncio.Event) -> bool:
        """Renew every retry period until ``stop`` is set (True) or ``renew_deadline`` has
        passed since the last renewal (False: leadership lost; the caller must stop acting at
        once). Failed tries are retried sooner as the deadline nears."""
        deadline = self.settings.renew_deadline
        while True:
            left = deadline - (self.clock() - self._renewed_at)
            if await _stopped(stop, max(0.0, min(self.settings.retry_period, left))):
                return True
            left = deadline - (self.clock() - self._renewed_at)
            if left > 0 and await _within(self.try_acquire_or_renew(), left) and \
                    self.holder == self.identity:
                continue
            if self.clock() - self._renewed_at >= deadline or \
                    (self.holder and self.holder != self.identity):
                log.error("%s could not renew the lease %s/%s within %g s (holder now: %s)",
                          self.identity, self.namespace, self.name, deadline,
                          self.holder or "none")
                self._set_leading(False)
                return False

    async def release(self) -> None:
        """Give the Lease up (a clean stop): no holder, a one-second duration. A write that
        conflicts (409: a renewal this replica sent before it stopped landed after the read,
        changing the Lease's version) is read again and retried, :data:`RELEASE_ATTEMPTS`
        times in all."""
        if not self.leading:
            return
        self._set_leading(False)
        for attempt in range(1, RELEASE_ATTEMPTS + 1):
            try:
                lease = await self.api.get_lease(self.namespace, self.name, self._timeout)
                if lease is None or (lease.get("spec") or {}).get("holderIdentity") != \
                        self.identity:
                    return
                now = _micro_time(datetime.now(tz=UTC))
                lease["spec"] = {**lease["spec"], "holderIdentity": None,
                                 "leaseDurationSeconds": 1, "renewTime": now}
                await self.api.replace_lease(self.namespace, self.name, lease, self._timeout)
                log.info("%s released the lease %s/%s", self.identity, self.namespace,
                         self.name)
                return
            except ClusterApiError as e:
                if e.status == 409 and attempt < RELEASE_ATTEMPTS:
                    continue
                log.warning("could not release the lease %s/%s (%s); a standby takes over "
                            "after its duration", self.namespace, self.name, e)
                return


async def _stopped(stop: asyncio.Event, seconds: float) -> bool:
    """Wait ``seconds``; True if ``stop`` was set meanwhile."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return stop.is_set()
    return True


async def _within(aw: Any, seconds: float) -> bool:
    """``await aw`` for at most ``seconds`` (False past them). A late try is cancelled but not
    waited for: a request on the wire may take longer to give up (the client retries a timed-out
    read), and the leader must know it lost by its deadline."""
    task = asyncio.ensure_future(aw)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
        return False
    return bool(task.result())


__all__ = ["LeaderElector", "LeaseApi", "default_identity", "default_namespace"]
