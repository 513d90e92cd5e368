"""The Kubernetes emulator's HTTP layer: request intake, discovery, the verbs, and injected
faults.

:class:`HttpLayer` parses each request (paths, verbs, JSON/YAML bodies), keeps a bounded
request history, matches kmock reactions in priority order, and serves the verbs from the store
(:mod:`tests.kube.store`) and the watch layer (:mod:`tests.kube.watch`). Before a request is
served, the injected faults (:class:`Fault`, :attr:`HttpLayer.faults`) are consulted: the first
that matches answers instead (an API ``Status`` error, or a dropped connection).
:class:`HttpServer` is kmock's HTTP server without its process-wide DNS interception.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, cast

import aiohttp.web
import attrs
import kmock
import yaml
from kmock._internal import rendering

from tests.kube.objects import PODS, Body, Selector, api_error

logger = logging.getLogger(__name__)

_Base = kmock.KubernetesEmulator if TYPE_CHECKING else object


def parse_path(path: str) -> tuple[kmock.resource | None, str | None, str | None, str | None]:
    """Split a Kubernetes API path into (resource, namespace, name, subresource).

    Replaces kmock's parser, which raises on ``/api/v1/namespaces`` (hence the 500) and reads
    ``/api/v1/namespaces/NAME`` as "the namespace NAME" with no resource.
    """
    parts = [part for part in path.split('/') if part]
    version: str | None
    if len(parts) >= 2 and parts[0] == 'api':
        group, version, rest = '', parts[1], parts[2:]
    elif len(parts) >= 2 and parts[0] == 'apis':
        group, version, rest = parts[1], (parts[2] if len(parts) > 2 else None), parts[3:]
    else:
        return None, None, None, None
    namespace = None
    if rest and rest[0] == 'namespaces' and (
            len(rest) <= 2 or (len(rest) == 3 and rest[2] in ('status', 'finalize'))):
        pass  # the namespaces resource itself: /namespaces[/NAME[/status]]
    elif len(rest) >= 3 and rest[0] == 'namespaces':
        namespace, rest = rest[1], rest[2:]
    plural = rest[0] if rest else None
    name = rest[1] if len(rest) > 1 else None
    subresource = '/'.join(rest[2:]) or None
    resource = kmock.resource(group=group, version=version, plural=plural)
    return resource, namespace, name, subresource


def _guess_action(method: str, name: str | None, params: Mapping[str, str]) -> kmock.action | None:
    """The Kubernetes verb of a request. Unlike kmock, PUT is an update (kmock: 404) and DELETE
    of a collection is a delete-collection."""
    if method == 'GET':
        if params.get('watch') in ('true', '1'):
            return kmock.action.WATCH
        return kmock.action.LIST if name is None else kmock.action.FETCH
    if method == 'POST' and name is None:
        return kmock.action.CREATE
    if method in ('PATCH', 'PUT') and name is not None:
        return kmock.action.UPDATE
    if method == 'DELETE':
        return kmock.action.DELETE
    return None


@dataclasses.dataclass
class Fault:
    """One injected API fault: the hook for fault-injection tests.

    A request that matches every criterion given (``method``: an HTTP method such as
    ``'PATCH'``; ``resource``: a plural such as ``'chunkedprefilltunings'``; ``subresource``:
    ``'status'``...; ``name``; ``where``: any predicate on the parsed request) is not served:
    it is answered with an API ``Status`` error (``status``, ``reason``, ``message``, with a
    ``Retry-After`` header when ``retry_after`` is set), or, with ``status=0``, its connection
    is closed without an answer (a connection loss, as during an API-server outage). A fault
    hits at most ``times`` requests (``None``: until removed); ``hits`` counts them.
    Watches already open are not affected.
    """

    status: int = 500
    reason: str = 'InternalError'
    message: str = 'an injected fault'
    method: str | None = None
    resource: str | None = None
    subresource: str | None = None
    name: str | None = None
    where: Callable[[kmock.Request], bool] | None = None
    times: int | None = None
    retry_after: int | None = None
    hits: int = 0

    def matches(self, request: kmock.Request) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        resource = request.resource
        return ((self.method is None
                 or str(getattr(request.method, 'value', request.method)) == self.method.upper())
                and (self.resource is None
                     or (resource is not None and resource.plural == self.resource))
                and (self.subresource is None or request.subresource == self.subresource)
                and (self.name is None or request.name == self.name)
                and (self.where is None or self.where(request)))

    async def apply(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """Answer a matched request (already counted in :attr:`hits`)."""
        if self.status == 0:
            if raw_request.transport is not None:
                raw_request.transport.close()
            return aiohttp.web.Response(status=503)  # never sent: the connection is closed
        body = {'apiVersion': 'v1', 'kind': 'Status', 'metadata': {}, 'status': 'Failure',
                'message': self.message, 'reason': self.reason, 'details': {'causes': []},
                'code': self.status}
        headers = {} if self.retry_after is None else {'Retry-After': str(self.retry_after)}
        return aiohttp.web.json_response(body, status=self.status, headers=headers)


class HttpLayer(_Base):
    """Request intake and the HTTP verbs of the emulated API server."""

    __slots__ = ()

    history_limit: int
    server_errors: list[BaseException]
    faults: list[Fault]
    _request_count: int

    # ---- injected faults ----------------------------------------------------------------

    def add_fault(self, fault: Fault) -> Fault:
        """Answer the requests that ``fault`` matches with it, until it is removed or spent."""
        self.faults.append(fault)
        return fault

    def remove_fault(self, fault: Fault) -> None:
        with contextlib.suppress(ValueError):
            self.faults.remove(fault)

    def _injected_fault(self, request: kmock.Request) -> Fault | None:
        for fault in list(self.faults):  # tests may add faults from another thread
            if fault.matches(request):
                fault.hits += 1
                return fault
        return None

    # ---- discovery ----------------------------------------------------------------------

    async def _serve_version(self, request: kmock.Request) -> Any:
        """kmock's APIResourceList, with the core ``groupVersion`` fixed (kmock: ``/v1``)
        and subresources listed as the real server does: verbs ``get, patch, update`` for
        ``status`` and ``get`` for others, and no short names or categories (kubectl warns
        that ``ns`` "could also match namespaces/status" otherwise)."""
        result = cast(dict[str, Any], await super()._serve_version(request))
        if result.get('groupVersion', '').startswith('/'):
            result['groupVersion'] = result['groupVersion'][1:]
        for item in result.get('resources', []):
            if '/' in item['name']:
                is_status = item['name'].endswith('/status')
                item.update(verbs=['get', 'patch', 'update'] if is_status else ['get'],
                            shortNames=[], categories=[], singularName='')
        return result

    def _get_resources(self) -> list[kmock.resource]:
        # Only declared resources: kmock also "discovers" resources from stored objects and
        # invents a kind for them, which resurrects the resources of deleted CRDs.
        return list(self._declared())

    # ---- request intake (replaces kmock's parser and its unbounded history) -------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """Parse and serve one HTTP request.

        Replaces :meth:`kmock.RawHandler.__call__` for three reasons: kmock's path parser fails
        on ``/api/v1/namespaces`` and misreads PUT; YAML bodies (server-side apply) are not
        parsed; and the request history grows forever while every request scans it to match
        reactions (22 ms a GET after 300 requests, 175 ms after 3000), so it is trimmed to
        :attr:`history_limit` here, together with the per-reaction histories. A request that
        an injected :class:`Fault` matches is answered by the fault, not served. API errors
        (404, 409, ...) are answered without being recorded; unexpected server exceptions are
        logged and kept in :attr:`server_errors` for tests to assert on.
        """
        body = await raw_request.read()
        raw_response: aiohttp.web.StreamResponse | None = None
        try:
            request = self._parse_request(raw_request, body)
            self._requests.append(request)
            if len(self._requests) > self.history_limit:
                del self._requests[:-self.history_limit]
                for payload in self._payloads:
                    del payload._requests[:-self.history_limit]
            if (fault := self._injected_fault(request)) is not None:
                return await fault.apply(raw_request)
            try:
                return await self._handle(request)
            except rendering.StreamingError as e:
                raw_response = e.args[0]
                raise e.__cause__ from None  # type: ignore[misc]
        except kmock.KubernetesError as e:
            if raw_response is None or not raw_response.prepared:
                return await self._render_error(e)
            await self._stream_error(e, raw_response)
            return raw_response
        except Exception as e:
            logger.exception('Unexpected error in the Kubernetes emulator.')
            self.server_errors.append(e)
            if raw_response is None or not raw_response.prepared:
                return await self._render_error(e)
            await self._stream_error(e, raw_response)
            return raw_response

    def _parse_request(self, raw_request: aiohttp.web.BaseRequest, body: bytes) -> kmock.Request:
        text = body.decode('utf-8', errors='replace')
        content_type = raw_request.headers.get('Content-Type', '')
        data: Any = None
        if body:
            try:
                data = yaml.safe_load(text) if 'yaml' in content_type else json.loads(text)
            except ValueError:
                if 'json' in content_type or 'yaml' in content_type:
                    raise api_error(400, 'BadRequest', 'the request body is not valid') from None
        params = dict(raw_request.query)
        resource, namespace, name, subresource = parse_path(raw_request.path)
        self._request_count += 1
        url = raw_request.url  # without a trailing slash, which kmock's discovery rejects
        if url.path != '/' and url.path.endswith('/'):
            url = url.with_path(url.path.rstrip('/')).with_query(url.query)
        return kmock.Request(
            id=self._request_count, raw_request=raw_request, url=url,
            method=raw_request.method, params=params, headers=dict(raw_request.headers),
            cookies=dict(raw_request.cookies), body=body, text=text, data=data,
            action=None if resource is None else _guess_action(raw_request.method, name, params),
            resource=resource, namespace=namespace, name=name, subresource=subresource)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        """Serve by the first matching reaction, in priority order, as kmock does.

        Replaces ``KubernetesEmulator._handle``, which mutates the stored state before the
        reactions run (so an intercepted write still happened), and speeds up matching:
        kmock decides whether a reaction sees a request by scanning the whole filtered request
        history for it; for the usual reactions, whose views are only filters over this root,
        evaluating the filters on this one request is the same answer in O(1).
        """
        payloads = list(self._payloads)  # tests may add reactions from another thread
        priorities = [payload.priorities for payload in payloads]
        width = max((len(p) for p in priorities), default=0)
        keys = [tuple(-x for x in p) + (0,) * (width - len(p)) for p in priorities]
        order = sorted(range(len(payloads)), key=lambda index: keys[index])
        for payload in [payloads[index] for index in order]:
            if payload._disabled.is_set() or not self._sees(payload._source, request):
                continue
            try:
                return await payload(request)
            except rendering.ReactionMismatchError:  # depleted or declined
                payload._disabled.set()
            except NotImplementedError:  # matched, but nothing to respond with
                pass
        raise NotImplementedError('No reaction matches the request.')

    def _sees(self, view: kmock.View, request: kmock.Request) -> bool:
        criteria = []
        node: Any = view
        while isinstance(node, kmock.Filter | kmock.Priority):
            if isinstance(node, kmock.Filter):
                criteria.append(node.criteria)
            node = node._source
        if node is self:
            return all(criterion(request) for criterion in reversed(criteria))
        return request in view  # slices, groups, exclusions: kmock's own (history-based) way

    # ---- HTTP verbs ---------------------------------------------------------------------

    async def _serve_log(self, request: kmock.Request) -> bytes:
        """``GET /api/v1/namespaces/NS/pods/NAME/log`` (kmock serves the pod object instead):
        the stored log text, honouring ``container``, ``tailLines`` and ``limitBytes``."""
        if request.resource != PODS or request.namespace is None or request.name is None:
            raise api_error(404, 'NotFound', 'the server could not find the requested resource')
        self._require(PODS, request.namespace, request.name)
        text = self.pod_log(request.namespace, request.name, request.params.get('container'))
        if request.params.get('tailLines'):
            lines = text.splitlines(keepends=True)
            text = ''.join(lines[-int(request.params['tailLines']):]) if lines else ''
        data = text.encode()
        if request.params.get('limitBytes'):
            data = data[:int(request.params['limitBytes'])]
        return data

    def _list_body(self, res: kmock.resource, items: list[Body]) -> Body:
        info = self._info(res)
        return {
            'apiVersion': res.version if res.group == '' else f'{res.group}/{res.version}',
            'kind': f'{info.kind}List',
            'metadata': {'resourceVersion': str(self._rv)},
            'items': items,
        }

    async def _serve_list(self, request: kmock.Request) -> Body:
        """A list honouring ``labelSelector``/``fieldSelector``, with a real resourceVersion
        (kmock answers ``'...'``, which a watch cannot resume from)."""
        res = request.resource
        self._info(res)
        assert res is not None
        selector = Selector.from_params(request.params, request.namespace)
        return self._list_body(res, self.store_list(res, selector))

    async def _serve_fetch(self, request: kmock.Request) -> Body:
        res = request.resource
        info = self._info(res)
        assert res is not None and request.name is not None
        if request.subresource is not None and request.subresource not in info.subresources:
            raise api_error(404, 'NotFound', 'the server could not find the requested resource')
        return self._require(res, request.namespace, request.name)

    async def _serve_create(self, request: kmock.Request) -> Body:
        res = request.resource
        self._info(res)
        assert res is not None
        if not isinstance(request.data, dict):
            raise api_error(400, 'BadRequest', 'the body of the request must be an object')
        return await self.store_create(res, request.namespace, request.data)

    async def _serve_update(self, request: kmock.Request) -> Body:
        res = request.resource
        self._info(res)
        assert res is not None and request.name is not None
        content_type = request.headers.get('Content-Type', '').split(';')[0].strip()
        if request.method == kmock.method.PUT:
            patch_type = 'replace'
        else:
            patch_type = {
                'application/json-patch+json': 'json',
                'application/merge-patch+json': 'merge',
                'application/strategic-merge-patch+json': 'strategic',
                'application/apply-patch+yaml': 'apply',
            }.get(content_type, '')
            if not patch_type:
                raise api_error(415, 'UnsupportedMediaType', f'the body of the request was in '
                                f'an unknown format: {content_type}')
        return await self.store_update(res, request.namespace, request.name, request.data,
                                       patch_type=patch_type, subresource=request.subresource)

    async def _serve_delete(self, request: kmock.Request) -> Body:
        res = request.resource
        self._info(res)
        assert res is not None
        options = request.data if isinstance(request.data, dict) else {}
        propagation = str(options.get('propagationPolicy') or
                          request.params.get('propagationPolicy') or 'Background')
        if options.get('orphanDependents') or request.params.get('orphanDependents') == 'true':
            propagation = 'Orphan'
        if request.name is None:  # delete-collection
            selector = Selector.from_params(request.params, request.namespace)
            deleted = []
            for body in self.store_list(res, selector):
                with contextlib.suppress(kmock.KubernetesError):
                    meta = body['metadata']
                    deleted.append(await self.store_delete(
                        res, meta.get('namespace'), meta['name'], propagation=propagation))
            return self._list_body(res, deleted)
        return await self.store_delete(res, request.namespace, request.name,
                                       propagation=propagation,
                                       preconditions=options.get('preconditions'))


@attrs.mutable
class HttpServer(kmock.Server):
    """``kmock.Server`` without its aiohttp DNS interceptor.

    kmock's server patches aiohttp's resolver process-wide while it runs and refuses to stop
    unless the servers stop in the reverse order of starting ("The resolver chain is
    inconsistent"), which breaks two emulators that live side by side. Clients here connect
    to ``127.0.0.1:PORT`` directly and need no name interception.
    """

    async def __aenter__(self) -> Self:
        if self._managed_server is not None:
            raise RuntimeError('The server can be started only once.')
        self._managed_server = self._server_cls(self.handler, host=self._host, port=self._port)
        await self._managed_server.__aenter__()
        self._managed_client = self._client_fct(self._managed_server.make_url('/'))
        await self._managed_client.__aenter__()
        self.handler.servers.append(self)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.handler.servers.remove(self)
        assert self._managed_client is not None and self._managed_server is not None
        await self._managed_client.__aexit__(exc_type, exc, tb)
        await self._managed_server.__aexit__(exc_type, exc, tb)
        self._managed_client = self._managed_server = None
