"""The Kubernetes emulator's change feed: watch streams and in-process listeners.

Every change the store (:mod:`tests.kube.store`) commits goes to a per-resource event log (so a
watch can resume from a ``resourceVersion``, or is answered 410 Gone once the events are no
longer kept), to kmock's event bus for the open watch streams, and to in-process listeners
such as the fake kubelet. :class:`WatchLayer` is one layer of
:class:`tests.kube.emulator.ApiServer`, which declares the state it uses.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import kmock

from tests.kube.objects import Listener, Selector, WatchEvent, api_error

logger = logging.getLogger(__name__)

_Base = kmock.KubernetesEmulator if TYPE_CHECKING else object


class WatchLayer(_Base):
    """Event logs, watch streams and listeners."""

    __slots__ = ()

    _rv: int
    _event_logs: dict[kmock.resource, collections.deque[WatchEvent]]
    _log_floors: dict[kmock.resource, int]
    _listeners: list[Listener]
    _closing: asyncio.Event
    event_log_limit: int

    async def _emit(self, events: list[WatchEvent]) -> None:
        """Publish committed changes to watch streams (under the lock, in order)."""
        for event in events:
            log = self._event_logs.setdefault(event.resource, collections.deque())
            log.append(event)
            if len(log) > self.event_log_limit:
                self._log_floors[event.resource] = log.popleft().rv
            await self._buses[event.resource].put(event)

    def _notify(self, events: list[WatchEvent]) -> None:
        """Tell in-process listeners (the fake kubelet, tests) about committed changes."""
        for event in events:
            for listener in list(self._listeners):
                try:
                    listener(event)
                except Exception:
                    logger.exception('A listener of the Kubernetes emulator failed.')

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(event)`` in the emulator's loop after every committed change."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        """A watch stream, replacing kmock's.

        kmock's watch sends every stored object as ADDED and then follows its event bus, but it
        subscribes after the listing (events in between are lost), ignores selectors, cannot
        resume from a ``resourceVersion`` and never ends. This one: subscribes and snapshots
        under the same lock; with ``resourceVersion`` (not ``0``) replays the logged events
        after it, or answers ``410 Gone`` when they are no longer kept (kopf then re-lists);
        without it sends the current objects as ADDED (plus the initial-events-end BOOKMARK for
        ``sendInitialEvents=true``); turns label changes into ADDED/DELETED for the selector,
        as the watch cache does; and ends after ``timeoutSeconds`` or when the server stops.
        """
        res = request.resource
        self._info(res)
        assert res is not None
        params = request.params
        selector = Selector.from_params(params, request.namespace, request.name)
        since = params.get('resourceVersion') or '0'
        if not since.isdigit():
            raise api_error(400, 'BadRequest', f'invalid resourceVersion: {since!r}')
        timeout = float(params.get('timeoutSeconds') or 0)
        bus = self._buses[res]
        initial: list[Any] = []
        async with self._lock:
            mark = await bus.mark()
            if since == '0':
                initial = [{'type': 'ADDED', 'object': body}
                           for body in self.store_list(res, selector)]
                if params.get('sendInitialEvents') == 'true':
                    initial.append({'type': 'BOOKMARK', 'object': {
                        'kind': self._info(res).kind, 'apiVersion': self._list_body(
                            res, [])['apiVersion'],
                        'metadata': {'resourceVersion': str(self._rv), 'annotations': {
                            'k8s.io/initial-events-end': 'true'}}}})
            elif int(since) < self._log_floors.get(res, 0):
                initial = [{'type': 'ERROR', 'object': {
                    'apiVersion': 'v1', 'kind': 'Status', 'metadata': {}, 'status': 'Failure',
                    'code': 410, 'reason': 'Expired',
                    'message': f'too old resource version: {since} ({self._rv})'}}]
            else:
                for event in self._event_logs.get(res, ()):
                    if event.rv > int(since) and (rendered := _render(event, selector)):
                        initial.append(rendered)
        try:
            yield b''  # send the headers now: a watch with nothing to say is still a watch
            for item in initial:
                yield item
            if initial and initial[-1]['type'] == 'ERROR':
                return
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout if timeout > 0 else None
            while not self._closing.is_set():
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    return
                change = await self._next_event(bus, mark, remaining)
                if change is None:
                    return
                if rendered := _render(change, selector):
                    yield rendered
        finally:
            with contextlib.suppress(ValueError):
                await bus.unmark(mark)

    async def _next_event(self, bus: Any, mark: Any,
                          timeout: float | None) -> WatchEvent | None:
        getter = asyncio.ensure_future(bus.get(since=mark))
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            done, _ = await asyncio.wait({getter, closing}, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
            return getter.result() if getter in done else None
        finally:
            for task in (getter, closing):
                task.cancel()


def _render(event: WatchEvent, selector: Selector) -> dict[str, Any] | None:
    """An event as one watch stream with this selector sees it."""
    now, before = selector.matches(event.object), selector.matches(event.old)
    if event.type == 'MODIFIED':
        kind = 'MODIFIED' if now and before else 'ADDED' if now else 'DELETED' if before else None
    else:
        kind = event.type if now else None
    return None if kind is None else {'type': kind, 'object': event.object}

