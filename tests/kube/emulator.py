"""A Kubernetes API server for end-to-end tests: kmock 0.8 plus the server behaviour it lacks.

:class:`KubeEmulator` runs kmock's :class:`kmock.KubernetesEmulator` behind a
:class:`kmock.Server` (:class:`HttpServer`, without kmock's process-wide DNS interception, so
that several emulators can coexist) on ``127.0.0.1`` and a free port, in a thread of its own
with its own event loop (as a real API server is another process: synchronous clients such as
the official ``kubernetes`` package can call it from a test's event loop without deadlocking
it). It writes a kubeconfig with token auth for that URL, so that kopf, the ``kubernetes``
client and kubectl talk to it over real HTTP.

:class:`ApiServer` is the kmock subclass that serves the requests. Each extension over stock
kmock is a method or helper with a docstring saying which API-server behaviour it emulates and
why kmock lacks it; ``tests/kube/README.md`` lists them with the gaps left alone. In short:

* discovery of the built-in resources the project uses, and of custom resources created from
  ``CustomResourceDefinition`` objects (kmock only knows what it is told);
* server-managed metadata: ``uid``, ``resourceVersion`` (bumped on every write), namespace from
  the URL, ``creationTimestamp``, ``generation`` (spec changes only), ``generateName``;
* PUT, JSON/merge/strategic-merge/apply patches, the ``/status`` subresource, finalizers and
  ``deletionTimestamp``, deletion preconditions, garbage collection by ``ownerReferences``,
  namespace and CRD clean-up;
* ``labelSelector``/``fieldSelector`` on list, watch and delete-collection; watches that resume
  from a ``resourceVersion`` (or answer 410 Gone) and end at ``timeoutSeconds``;
* the ``pods/log`` subresource fed from a log store (:meth:`KubeEmulator.set_pod_log`);
* fixes of kmock 0.8 bugs: ``GET /api/v1/namespaces`` (500), PUT (404), ``generateName``
  collisions, a watch that lost events between its listing and its subscription, and the
  request history that every request scanned (now trimmed).

The server is built in layers, one module each: :mod:`tests.kube.objects` (the pure data model:
resource specs, errors, patches, selectors, watch events), :mod:`tests.kube.store` (objects
and their write semantics), :mod:`tests.kube.watch` (event logs, watch streams, listeners) and
:mod:`tests.kube.http_api` (request intake, verbs, discovery, and injected faults:
:meth:`KubeEmulator.add_fault`); :class:`ApiServer` composes them and holds their state.

Tests read and write objects directly with :meth:`KubeEmulator.get`, :meth:`KubeEmulator.objects`,
:meth:`KubeEmulator.create`, :meth:`KubeEmulator.patch` and :meth:`KubeEmulator.delete`: no HTTP,
but the same server semantics (metadata, watch events, finalizers, garbage collection).

Usage::

    with KubeEmulator() as kube:
        api = kubernetes.client.CoreV1Api(kube.api_client())
        api.create_namespaced_config_map('default', {'metadata': {'name': 'x'}})
        assert kube.get('configmaps', 'default', 'x')['metadata']['resourceVersion']
"""


from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import copy
import logging
import pathlib
import shutil
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Self, TypeVar

import attrs
import kmock
import yaml

from tests.kube.http_api import Fault, HttpLayer, HttpServer, parse_path
from tests.kube.objects import (
    BUILTIN_RESOURCES,
    NAMESPACES,
    PODS,
    Body,
    Listener,
    ObjectKey,
    ResourceSpec,
    Selector,
    WatchEvent,
    merge_patch,
    now_rfc3339,
    parse_field_selector,
    parse_label_selector,
    strategic_merge_patch,
)
from tests.kube.store import StoreLayer
from tests.kube.watch import WatchLayer

logger = logging.getLogger(__name__)

T = TypeVar('T')


# --------------------------------------------------------------------------------------------
# The request handler: the layers composed over kmock's emulator, with their state.
# --------------------------------------------------------------------------------------------

@attrs.define(kw_only=True)
class ApiServer(HttpLayer, WatchLayer, StoreLayer, kmock.KubernetesEmulator):
    """kmock's Kubernetes emulator, extended to behave like a real API server (see module doc).

    All state lives in kmock's ``objects`` array (so kmock-style assertions keep working) and
    all user-defined kmock reactions still take precedence over the built-in behaviour, e.g.
    ``kube.server['patch', kmock.resource('', 'v1', 'pods')] << 500`` to inject an error.
    Unlike stock kmock, an intercepted write does not change the stored state. Faults added
    with :meth:`~tests.kube.http_api.HttpLayer.add_fault` answer before any reaction.
    """

    history_limit: int = 200
    """How many recent requests are kept for ``kube.server.requests`` assertions."""
    object_history_limit: int = 50
    """How many versions of each object kmock's ``objects[...].history`` keeps."""
    event_log_limit: int = 2000
    """How many past watch events per resource a watch can resume from (older: 410 Gone)."""

    server_errors: list[BaseException] = attrs.field(factory=list, init=False)
    faults: list[Fault] = attrs.field(factory=list, init=False)
    """Injected faults, consulted in order before each request is served."""
    _rv: int = attrs.field(default=0, init=False)
    _request_count: int = attrs.field(default=0, init=False)
    _event_logs: dict[kmock.resource, collections.deque[WatchEvent]] = attrs.field(
        factory=dict, init=False)
    _log_floors: dict[kmock.resource, int] = attrs.field(factory=dict, init=False)
    _listeners: list[Listener] = attrs.field(factory=list, init=False)
    _pod_logs: dict[tuple[str, str, str | None], str] = attrs.field(factory=dict, init=False)
    _crd_resources: dict[str, list[kmock.resource]] = attrs.field(factory=dict, init=False)
    _draining: set[ObjectKey] = attrs.field(factory=set, init=False)
    _tasks: set[asyncio.Task[Any]] = attrs.field(factory=set, init=False)
    _closing: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)

    def __attrs_post_init__(self) -> None:
        # Discovery and the 404 catch-all come from kmock's scaffold; the object-serving
        # fallbacks are ours (kmock's would also mutate state for intercepted requests).
        kmock.KubernetesScaffold.__attrs_post_init__(self)
        fb = self.fallback
        (fb ** 1)[kmock.action.FETCH, kmock.subresource('log')] \
            << kmock.headers({'Content-Type': 'text/plain'}) << self._serve_log
        fb[kmock.action.LIST] << self._serve_list
        fb[kmock.action.WATCH] << kmock.headers({'Content-Type': 'application/json'}) \
            << self._serve_watch
        fb[kmock.action.FETCH] << self._serve_fetch
        fb[kmock.action.CREATE] << 201 << self._serve_create
        fb[kmock.action.UPDATE] << self._serve_update
        fb[kmock.action.DELETE] << self._serve_delete
        for spec in BUILTIN_RESOURCES:
            self.register(spec)

    async def close(self) -> None:
        """End the watches and the background work, so that the HTTP server stops at once
        (aiohttp would otherwise wait 60 s for open watch streams)."""
        self._closing.set()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


# --------------------------------------------------------------------------------------------
# The test-facing wrapper: a thread with its own loop, a kubeconfig, and direct access.
# --------------------------------------------------------------------------------------------

class KubeEmulator:
    """An emulated Kubernetes API server on ``127.0.0.1`` for the duration of a ``with`` block.

    Use it as ``with KubeEmulator() as kube:`` or ``async with KubeEmulator() as kube:``.
    The server runs in its own thread and event loop. The direct-access methods are
    thread-safe and may be called from any thread except the emulator's own.
    """

    def __init__(self, *, host: str = '127.0.0.1', port: int | None = None,
                 token: str = 'kmock-test-token', namespaces: Iterable[str] = ('default',),
                 startup_timeout: float = 10.0) -> None:
        self.host = host
        self.token = token
        self._port = port
        self._namespaces = tuple(namespaces)
        self._startup_timeout = startup_timeout
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: ApiServer | None = None
        self._stopped: asyncio.Event | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._url: str | None = None
        self._tmpdir: pathlib.Path | None = None
        self._addons: list[Callable[[], Awaitable[None]]] = []

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> Self:
        """Start the server thread and wait until it listens and the kubeconfig is written."""
        if self._thread is not None:
            raise RuntimeError('The emulator is already started.')
        self._tmpdir = pathlib.Path(tempfile.mkdtemp(prefix='kube-emulator-'))
        self._thread = threading.Thread(target=self._thread_main, name='kube-emulator',
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(self._startup_timeout):
            raise TimeoutError('The Kubernetes emulator did not start in time.')
        if self._failure is not None:
            raise RuntimeError('The Kubernetes emulator failed to start.') from self._failure
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop attached add-ons (kubelets), end all watches, stop the server and the thread."""
        thread, loop, stopped = self._thread, self._loop, self._stopped
        if thread is None:
            return
        if loop is not None and stopped is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopped.set)
        thread.join(timeout)
        self._thread = None
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
        if thread.is_alive():
            raise TimeoutError('The Kubernetes emulator did not stop in time.')

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await asyncio.to_thread(self.stop)

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._serve())  # also cancels and awaits whatever tasks are left
        except BaseException as e:
            self._failure = e
            logger.exception('The Kubernetes emulator crashed.')
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        server = ApiServer()
        async with server, HttpServer(server, host=self.host, port=self._port) as http:
            self._server = server
            self._url = str(http.url).rstrip('/')
            for namespace in self._namespaces:
                await server.store_create(NAMESPACES, None, {'metadata': {'name': namespace}})
            self._write_kubeconfig()
            self._ready.set()
            await self._stopped.wait()
            for addon in reversed(self._addons):
                with contextlib.suppress(Exception):
                    await addon()
            await server.close()

    def _write_kubeconfig(self) -> None:
        assert self._tmpdir is not None
        config = {
            'apiVersion': 'v1', 'kind': 'Config', 'preferences': {},
            'clusters': [{'name': 'kmock', 'cluster': {'server': self.url}}],
            'users': [{'name': 'kmock', 'user': {'token': self.token}}],
            'contexts': [{'name': 'kmock', 'context': {
                'cluster': 'kmock', 'user': 'kmock', 'namespace': 'default'}}],
            'current-context': 'kmock',
        }
        self.kubeconfig_path.write_text(yaml.safe_dump(config), encoding='utf-8')

    # ---- properties ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (no trailing slash)."""
        if self._url is None:
            raise RuntimeError('The emulator is not started.')
        return self._url

    @property
    def port(self) -> int:
        return int(self.url.rsplit(':', 1)[1])

    @property
    def kubeconfig_path(self) -> pathlib.Path:
        """A kubeconfig file for this server (token auth), valid while the emulator runs."""
        if self._tmpdir is None:
            raise RuntimeError('The emulator is not started.')
        return self._tmpdir / 'kubeconfig.yaml'

    @property
    def server(self) -> ApiServer:
        """The kmock handler itself: ``.objects``, ``.resources``, ``.requests``, reactions."""
        if self._server is None:
            raise RuntimeError('The emulator is not started.')
        return self._server

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The emulator's event loop (add-ons such as the fake kubelet run their tasks in it)."""
        if self._loop is None:
            raise RuntimeError('The emulator is not started.')
        return self._loop

    @property
    def server_errors(self) -> list[BaseException]:
        """Unexpected exceptions inside the emulator (API errors such as 404 are not here)."""
        return list(self.server.server_errors)

    def api_client(self) -> Any:
        """A new ``kubernetes.client.ApiClient`` configured from :attr:`kubeconfig_path`."""
        import kubernetes

        return kubernetes.config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig_path))

    def add_addon(self, shutdown: Callable[[], Awaitable[None]]) -> None:
        """Register a coroutine function run in the emulator's loop when the emulator stops."""
        self._addons.append(shutdown)

    # ---- direct access (no HTTP, same server semantics) ---------------------------------

    def call(self, fn: Callable[[], Awaitable[T]], timeout: float = 10.0) -> T:
        """Run ``await fn()`` in the emulator's loop and return its result (thread-safe)."""
        loop = self.loop
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError('Called from the emulator loop: await the ApiServer methods.')

        async def runner() -> T:
            return await fn()

        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(runner(), loop)
        return future.result(timeout)

    def _sync(self, fn: Callable[[], T]) -> T:
        async def wrapper() -> T:
            return fn()

        return self.call(wrapper)

    # NB: resources are resolved inside the emulator's loop: CRDs change them concurrently.

    def get(self, resource: str | kmock.resource, namespace: str | None,
            name: str) -> Body | None:
        """A deep copy of the stored object, or ``None`` if absent (or its resource is)."""
        def read() -> Body | None:
            try:
                return copy.deepcopy(self.server.store_get(
                    self.server.resolve(resource), namespace, name))
            except kmock.KubernetesError:  # a declared-then-removed resource: nothing there
                return None

        return self._sync(read)

    def objects(self, resource: str | kmock.resource, namespace: str | None = None, *,
                label_selector: str | None = None, field_selector: str | None = None,
                ) -> list[Body]:
        """Deep copies of the stored objects of a resource, optionally filtered."""
        selector = Selector.from_params(
            {k: v for k, v in {'labelSelector': label_selector,
                               'fieldSelector': field_selector}.items() if v}, namespace)

        def read() -> list[Body]:
            try:
                res = self.server.resolve(resource)
                return copy.deepcopy(self.server.store_list(res, selector))
            except kmock.KubernetesError:
                return []

        return self._sync(read)

    def create(self, resource: str | kmock.resource, body: Mapping[str, Any],
               namespace: str | None = None) -> Body:
        """Create an object (as a POST would)."""
        return copy.deepcopy(self.call(lambda: self.server.store_create(
            self.server.resolve(resource), namespace, body)))

    def patch(self, resource: str | kmock.resource, namespace: str | None, name: str,
              patch: Any, *, subresource: str | None = None, patch_type: str = 'merge') -> Body:
        """Patch an object (merge patch by default; ``json``, ``strategic``, ``replace``)."""
        return copy.deepcopy(self.call(lambda: self.server.store_update(
            self.server.resolve(resource), namespace, name, patch, patch_type=patch_type,
            subresource=subresource)))

    def delete(self, resource: str | kmock.resource, namespace: str | None, name: str, *,
               propagation: str = 'Background') -> Body | None:
        """Delete an object (finalizers and garbage collection apply); ``None`` if absent."""
        try:
            return copy.deepcopy(self.call(lambda: self.server.store_delete(
                self.server.resolve(resource), namespace, name, propagation=propagation)))
        except kmock.KubernetesError as e:
            if e.status == 404:
                return None
            raise

    def add_fault(self, fault: Fault | None = None, **criteria: Any) -> Fault:
        """Inject an API fault: the requests it matches are answered with an error (or a dropped
        connection) instead of being served, until :meth:`remove_fault` or ``times`` hits.
        Pass a :class:`~tests.kube.http_api.Fault` or its fields, e.g.
        ``kube.add_fault(status=409, reason='Conflict', method='PATCH', subresource='status',
        times=8)``; ``kube.add_fault(status=0)`` drops every connection (an outage)."""
        new = fault if fault is not None else Fault(**criteria)
        return self._sync(lambda: self.server.add_fault(new))

    def remove_fault(self, fault: Fault) -> None:
        self._sync(lambda: self.server.remove_fault(fault))

    def clear_faults(self) -> None:
        self._sync(self.server.faults.clear)

    def register_resource(self, spec: ResourceSpec) -> None:
        """Declare one more resource for discovery (CRD objects do this by themselves)."""
        self._sync(lambda: self.server.register(spec))

    def set_pod_log(self, namespace: str, name: str, text: str,
                    container: str | None = None) -> None:
        """Set the text that ``read_namespaced_pod_log`` returns for a pod."""
        self._sync(lambda: self.server.set_pod_log(namespace, name, text, container))

    def pod_log(self, namespace: str, name: str, container: str | None = None) -> str:
        return self._sync(lambda: self.server.pod_log(namespace, name, container))

    def wait_for(self, predicate: Callable[[], T | None], timeout: float = 10.0,
                 interval: float = 0.02, message: str = 'condition') -> T:
        """Poll ``predicate()`` until it returns something truthy; return that, or time out."""
        return wait_for(predicate, timeout=timeout, interval=interval, message=message)

    async def until(self, predicate: Callable[[], T | None], timeout: float = 10.0,
                    interval: float = 0.02, message: str = 'condition') -> T:
        """The async variant of :meth:`wait_for` (it does not block the caller's loop)."""
        return await until(predicate, timeout=timeout, interval=interval, message=message)


def wait_for(predicate: Callable[[], T | None], *, timeout: float = 10.0,
             interval: float = 0.02, message: str = 'condition') -> T:
    """Poll ``predicate()`` until it returns something truthy, for at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f'Timed out after {timeout} s waiting for: {message}')
        time.sleep(interval)


async def until(predicate: Callable[[], T | None], *, timeout: float = 10.0,
                interval: float = 0.02, message: str = 'condition') -> T:
    """Await until ``predicate()`` (run in a worker thread) is truthy, at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        result = await asyncio.to_thread(predicate)
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f'Timed out after {timeout} s waiting for: {message}')
        await asyncio.sleep(interval)



__all__ = [
    'BUILTIN_RESOURCES', 'NAMESPACES', 'PODS', 'ApiServer', 'Body', 'Fault', 'HttpServer',
    'KubeEmulator', 'Listener', 'ObjectKey', 'ResourceSpec', 'Selector', 'WatchEvent',
    'merge_patch', 'now_rfc3339', 'parse_field_selector', 'parse_label_selector', 'parse_path',
    'strategic_merge_patch', 'until', 'wait_for',
]
