"""The kopf handlers: thin adapters from kopf to :mod:`chunktune.k8s.controller`.

* ``@kopf.on.startup`` :func:`configure` applies the settings (event posting, watch timeouts,
  handler progress and diff-base in annotations, our finalizer name) — once;
* ``@kopf.on.create``: validate (an invalid spec is ``Failed`` with the field paths in a
  condition, and a :class:`kopf.PermanentError`), create or open the study, phase ``Pending``;
* ``@kopf.on.update`` of ``spec``: re-validate (same outcome for an invalid spec);
* ``@kopf.daemon``: one per resource, :meth:`StudyController.serve` — the study itself;
* ``@kopf.on.delete`` (the finalizer): wait for the daemon to stop its trials, delete every
  trial object (ownerReferences are the second net) and the resource's own default study
  journal (named by its uid).

Domain errors (:class:`~chunktune.core.errors.SpecError`) become kopf's at this boundary only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Mapping
from typing import Any

import kopf

from chunktune.api.crd import PLURAL
from chunktune.api.v1alpha1 import API_GROUP, API_VERSION
from chunktune.core.errors import SpecError
from chunktune.k8s.controller import (
    Operator,
    StudyController,
    delete_study,
    generation,
    owner_of,
    parse,
    problems_text,
)
from chunktune.k8s.live import StopCause
from chunktune.k8s.reporting import Emit
from chunktune.k8s.settings import Settings
from chunktune.tuning import storage as storages

log = logging.getLogger(__name__)
RESOURCE = (API_GROUP, API_VERSION, PLURAL)
#: Prefix of kopf's annotations (handler progress, last handled spec) and our finalizer.
ANNOTATION_PREFIX = "chunktune.dev"
FINALIZER = "chunktune.dev/finalizer"
#: Seconds a stopping daemon may take (its trials stop and clean up) before kopf cancels it.
CANCELLATION_TIMEOUT = 60.0


def configure_kopf(ours: Settings, settings: kopf.OperatorSettings) -> None:
    """Apply our settings to kopf's (the body of the startup handler)."""
    settings.networking.error_backoffs = kopf_backoffs(ours.api_outage_seconds)
    settings.posting.enabled = True
    settings.posting.level = logging.WARNING  # kopf's own log lines; ours are explicit events
    settings.watching.server_timeout = ours.watch.server_timeout
    settings.watching.client_timeout = ours.watch.client_timeout
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration")


def kopf_backoffs(seconds: float) -> tuple[float, ...]:
    """kopf's retry delays for its own API requests (watches, patches, events): kopf's
    default (1, 1, 2, ... 21 s: 54 s in all), then 30 s steps until ``seconds`` are covered,
    each jittered by up to 10%. Past them kopf gives up on a request (a watch failing for
    that long stops the operator, and its pod restarts)."""
    delays = [1.0, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0]
    while sum(delays) < seconds:
        delays.append(30.0)
    return tuple(round(d * random.uniform(0.9, 1.0), 2) for d in delays)


def emitter(body: kopf.Body) -> Emit:
    def emit(kind: str, reason: str, message: str) -> None:
        with contextlib.suppress(LookupError):  # outside the operator (no posting queue)
            kopf.event(body, type=kind, reason=reason, message=message[:1000])

    return emit


class KopfLive:
    """kopf's live body and stop flag, as :class:`chunktune.k8s.live.Live`; the
    operator's ``exiting`` flag stops it too (kopf never signals a daemon it spawned while
    it was already stopping)."""

    def __init__(self, body: kopf.Body, stopped: kopf.DaemonStopped,
                 exiting: asyncio.Event | None = None) -> None:
        self._body = body
        self._stopped = stopped
        self._exiting = exiting or asyncio.Event()

    def body(self) -> Mapping[str, Any]:
        return self._body

    def stopping(self) -> StopCause | None:
        reason = self._stopped.reason if self._stopped else None
        if reason is not None and reason & kopf.DaemonStoppingReason.RESOURCE_DELETED:
            return StopCause.DELETED
        if self._stopped or self._exiting.is_set():
            return StopCause.EXITING
        return None

    async def sleep(self, seconds: float) -> None:
        """Sleep until ``seconds`` pass or a stop comes, whichever is first, waking at once on
        either flag (kopf gives a daemon a few loop cycles to exit before it waits its
        cancellation backoff: a deleted resource would keep its finalizer that long). NOTE: not
        ``stopped.wait(seconds)``: its timer task outlives a daemon cancelled during it, and
        kopf re-raises that task's TimeoutError from ``kopf.operator``."""
        if self.stopping() is not None:
            return
        waits = [asyncio.ensure_future(self._stopped.wait()),
                 asyncio.ensure_future(self._exiting.wait())]
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)


def register(registry: kopf.OperatorRegistry, op: Operator) -> None:
    """Register every handler of the operator in ``registry``."""

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_kopf(op.settings, settings)

    @kopf.on.cleanup(registry=registry)
    def exiting(**_: Any) -> None:
        op.exiting.set()

    async def refuse_if_invalid(body: kopf.Body) -> Any:
        tuning, problems = parse(body)
        if tuning is not None:
            try:
                url = await op.storage(tuning, owner_of(body))
                await asyncio.to_thread(op.check_study, tuning, url)
            except SpecError as e:
                problems = e.problems
            except storages.StorageFault as e:  # the daemon's condition says it, and retries
                log.warning("%s: %s", body.get("metadata", {}).get("name"), e)
        if problems:
            ctrl = StudyController(op, body, emitter(body))
            await ctrl.invalid(problems, generation(body))
            text = problems_text(problems)
            kopf.event(body, type="Warning", reason="InvalidSpec", message=text[:1000])
            raise kopf.PermanentError(f"invalid spec: {text}")
        return tuning

    @kopf.on.create(*RESOURCE, registry=registry)
    async def created(body: kopf.Body, **_: Any) -> None:
        await refuse_if_invalid(body)
        await StudyController(op, body, emitter(body)).pending(generation(body))

    @kopf.on.update(*RESOURCE, field="spec", registry=registry)
    async def updated(body: kopf.Body, **_: Any) -> None:
        await refuse_if_invalid(body)

    @kopf.daemon(*RESOURCE, registry=registry, cancellation_backoff=CANCELLATION_TIMEOUT,
                 cancellation_timeout=10.0, backoff=15.0)
    async def study(body: kopf.Body, stopped: kopf.DaemonStopped, **_: Any) -> None:
        uid = str(body["metadata"]["uid"])
        exited = op.exited.setdefault(uid, asyncio.Event())
        exited.clear()
        try:
            live = KopfLive(body, stopped, op.exiting)
            await StudyController(op, body, emitter(body)).serve(live)
        finally:
            exited.set()

    @kopf.on.delete(*RESOURCE, registry=registry)
    async def deleted(body: kopf.Body, **_: Any) -> None:
        exited = op.exited.get(str(body["metadata"]["uid"]))

        async def daemon_exit() -> None:
            if exited is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(exited.wait(), CANCELLATION_TIMEOUT)

        left = await delete_study(op, body, daemon_exit)
        if left:
            raise kopf.TemporaryError(f"trial objects still there: {', '.join(left)}", delay=5)


__all__ = ["ANNOTATION_PREFIX", "FINALIZER", "RESOURCE", "KopfLive", "configure_kopf",
           "emitter", "kopf_backoffs", "register"]
