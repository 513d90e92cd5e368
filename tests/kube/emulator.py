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
import base64
import collections
import concurrent.futures
import contextlib
import copy
import dataclasses
import datetime
import json
import logging
import pathlib
import random
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Self, TypeVar, cast

import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import kmock
import yaml
from kmock._internal import rendering

logger = logging.getLogger(__name__)

T = TypeVar('T')
Body = dict[str, Any]
ObjectKey = tuple[kmock.resource, str | None, str]
Listener = Callable[['WatchEvent'], None]

ALL_VERBS = ('create', 'delete', 'deletecollection', 'get', 'list', 'patch', 'update', 'watch')
CRD_RESOURCE = kmock.resource('apiextensions.k8s.io', 'v1', 'customresourcedefinitions')
NAMESPACES = kmock.resource('', 'v1', 'namespaces')
PODS = kmock.resource('', 'v1', 'pods')
SECRETS = kmock.resource('', 'v1', 'secrets')


@dataclasses.dataclass(frozen=True)
class ResourceSpec:
    """What discovery says about one resource (the fields kopf and kubectl read)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    subresources: tuple[str, ...] = ()
    shortnames: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    singular: str | None = None

    @property
    def resource(self) -> kmock.resource:
        return kmock.resource(self.group, self.version, self.plural)


BUILTIN_RESOURCES: tuple[ResourceSpec, ...] = (
    ResourceSpec('', 'v1', 'namespaces', 'Namespace', False, ('status', 'finalize'), ('ns',)),
    ResourceSpec('', 'v1', 'pods', 'Pod', True, ('status', 'log'), ('po',), ('all',)),
    ResourceSpec('', 'v1', 'events', 'Event', True, (), ('ev',)),
    ResourceSpec('', 'v1', 'configmaps', 'ConfigMap', True, (), ('cm',)),
    ResourceSpec('', 'v1', 'secrets', 'Secret'),
    ResourceSpec('', 'v1', 'services', 'Service', True, ('status',), ('svc',), ('all',)),
    ResourceSpec('', 'v1', 'serviceaccounts', 'ServiceAccount', True, (), ('sa',)),
    ResourceSpec('events.k8s.io', 'v1', 'events', 'Event', True, (), ('ev',)),
    ResourceSpec('apps', 'v1', 'deployments', 'Deployment', True, ('status',), ('deploy',),
                 ('all',)),
    ResourceSpec('batch', 'v1', 'jobs', 'Job', True, ('status',), (), ('all',)),
    ResourceSpec('apiextensions.k8s.io', 'v1', 'customresourcedefinitions',
                 'CustomResourceDefinition', False, ('status',), ('crd', 'crds')),
)

# Controllers' finalizers that the API server itself adds and resolves (see ApiServer._drain).
_SYSTEM_DRAINED = (NAMESPACES, CRD_RESOURCE)


# --------------------------------------------------------------------------------------------
# Pure helpers: errors, timestamps, patches, selectors.
# --------------------------------------------------------------------------------------------

def api_error(status: int, reason: str, message: str, *, name: str | None = None,
              kind: str | None = None) -> kmock.KubernetesError:
    """A ``Status`` error as the API server sends it (kmock renders it as JSON)."""
    details: dict[str, Any] = {}
    if name is not None:
        details['name'] = name
    if kind is not None:
        details['kind'] = kind
    return kmock.KubernetesError(status=status, reason=reason, message=message,
                                 details=details or {'causes': []})


def now_rfc3339() -> str:
    """A timestamp in the API server's format (RFC 3339, seconds, UTC)."""
    return datetime.datetime.now(tz=datetime.UTC).strftime('%Y-%m-%dT%H:%M:%SZ')


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (``application/merge-patch+json``).

    kmock merges dicts too, but raises when a dict replaces a scalar or vice versa, which
    RFC 7386 allows; it also cannot tell the patch types apart.
    """
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# Merge keys of the list fields that a strategic merge patch merges by key (k8s.io/api tags).
_SMP_MERGE_KEYS: dict[str, tuple[str, ...]] = {
    'containers': ('name',), 'initContainers': ('name',), 'ephemeralContainers': ('name',),
    'env': ('name',), 'volumes': ('name',), 'volumeMounts': ('mountPath',),
    'ports': ('containerPort', 'port'), 'conditions': ('type',),
    'containerStatuses': ('name',), 'initContainerStatuses': ('name',),
    'ownerReferences': ('uid',), 'imagePullSecrets': ('name',), 'hostAliases': ('ip',),
}
_SMP_PRIMITIVE_SETS = frozenset({'finalizers'})


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A strategic merge patch (``application/strategic-merge-patch+json``), simplified.

    The official ``kubernetes`` client sends every dict-shaped patch of a built-in resource
    this way. Like the API server it merges known lists by their merge key (containers and env
    by ``name``, conditions by ``type``, ...), unions ``finalizers``, and honours the
    ``$patch: replace|delete`` and ``$deleteFromPrimitiveList/<field>`` directives. It does not
    know the per-type schemas: lists not in its small table are replaced, as in a merge patch.
    """
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get('$patch')
    if directive == 'replace':
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != '$patch'}
    if directive == 'delete':
        return None
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith('$deleteFromPrimitiveList/'):
            field = key.split('/', 1)[1]
            result[field] = [item for item in result.get(field) or [] if item not in value]
        elif key.startswith('$'):
            continue  # $setElementOrder/..., $retainKeys: ordering hints only
        elif value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = strategic_merge_patch(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _smp_list(key, result.get(key), value)
        else:
            result[key] = value
    return result


def _smp_list(field: str, current: Any, patch: list[Any]) -> list[Any]:
    if field in _SMP_PRIMITIVE_SETS and isinstance(current, list):
        return current + [item for item in patch if item not in current]
    keys = _SMP_MERGE_KEYS.get(field, ())
    merge_key = next((k for k in keys if patch and all(
        isinstance(item, dict) and (k in item or item.get('$patch')) for item in patch)), None)
    if merge_key is None or not isinstance(current, list):
        return [strategic_merge_patch({}, item) if isinstance(item, dict) else item
                for item in patch if not (isinstance(item, dict) and item.get('$patch'))]
    if any(isinstance(item, dict) and item.get('$patch') == 'replace' for item in patch):
        return [strategic_merge_patch({}, item) for item in patch if not item.get('$patch')]
    result = copy.deepcopy(current)
    for item in patch:
        index = next((i for i, old in enumerate(result)
                      if isinstance(old, dict) and old.get(merge_key) == item.get(merge_key)),
                     None)
        if item.get('$patch') == 'delete':
            if index is not None:
                del result[index]
        elif index is not None:
            result[index] = strategic_merge_patch(result[index], item)
        else:
            result.append(strategic_merge_patch({}, item))
    return result


_LABEL_TERM = re.compile(
    r'^\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9][-A-Za-z0-9_./]*)\s*'
    r'(?:(?P<setop>in|notin)\s*\((?P<values>[^)]*)\)|(?P<op>==|=|!=)\s*(?P<value>[-A-Za-z0-9_.]*))?'
    r'\s*$')


@dataclasses.dataclass(frozen=True)
class Requirement:
    """One term of a label selector: ``key op values``."""

    key: str
    op: str  # '=', '!=', 'in', 'notin', 'exists', '!'
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        match self.op:
            case '=' | 'in':
                return value is not None and value in self.values
            case '!=' | 'notin':
                return value is None or value not in self.values
            case 'exists':
                return value is not None
            case _:
                return value is None


def _split_terms(text: str) -> list[str]:
    terms, depth, current = [], 0, ''
    for char in text:
        depth += (char == '(') - (char == ')')
        if char == ',' and depth == 0:
            terms.append(current)
            current = ''
        else:
            current += char
    terms.append(current)
    return [term for term in terms if term.strip()]


def parse_label_selector(text: str | None) -> list[Requirement]:
    """Parse ``labelSelector``: ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``,
    ``a`` (exists), ``!a`` (does not exist), joined by commas (AND).

    kmock 0.8 ignores the parameter and returns every object; kopf, kubectl and the Job
    controller all rely on it.
    """
    requirements = []
    for term in _split_terms(text or ''):
        match = _LABEL_TERM.match(term)
        if match is None or (match['neg'] and (match['op'] or match['setop'])):
            raise api_error(400, 'BadRequest', f'unable to parse requirement: {term!r}')
        if match['setop']:
            values = frozenset(v.strip() for v in match['values'].split(',') if v.strip())
            requirements.append(Requirement(match['key'], match['setop'], values))
        elif match['op']:
            op = '!=' if match['op'] == '!=' else '='
            requirements.append(Requirement(match['key'], op, frozenset({match['value']})))
        else:
            requirements.append(Requirement(match['key'], '!' if match['neg'] else 'exists'))
    return requirements


def parse_field_selector(text: str | None) -> list[tuple[str, bool, str]]:
    """Parse ``fieldSelector`` into ``(dotted.path, equal?, value)`` terms (AND).

    kmock 0.8 ignores it. The real server supports only a few fields per kind
    (``metadata.name`` and ``metadata.namespace`` everywhere, ``status.phase`` for pods, ...);
    this accepts any dotted path and compares its value as a string.
    """
    terms = []
    for term in _split_terms(text or ''):
        match = re.match(r'^\s*([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*?)\s*$', term)
        if match is None:
            raise api_error(400, 'BadRequest', f'invalid field selector: {term!r}')
        terms.append((match[1], match[2] != '!=', match[3]))
    return terms


def _field_value(body: Mapping[str, Any], path: str) -> str:
    value: Any = body
    for part in path.split('.'):
        value = value.get(part) if isinstance(value, Mapping) else None
    if isinstance(value, bool):
        return 'true' if value else 'false'
    return '' if value is None else str(value)


@dataclasses.dataclass(frozen=True)
class Selector:
    """Which objects a list, watch or delete-collection request addresses."""

    namespace: str | None = None
    name: str | None = None
    labels: tuple[Requirement, ...] = ()
    fields: tuple[tuple[str, bool, str], ...] = ()

    @classmethod
    def from_params(cls, params: Mapping[str, str], namespace: str | None = None,
                    name: str | None = None) -> Selector:
        return cls(namespace=namespace, name=name,
                   labels=tuple(parse_label_selector(params.get('labelSelector'))),
                   fields=tuple(parse_field_selector(params.get('fieldSelector'))))

    def matches(self, body: Mapping[str, Any] | None) -> bool:
        if body is None:
            return False
        meta = body.get('metadata') or {}
        if self.namespace is not None and meta.get('namespace') != self.namespace:
            return False
        if self.name is not None and meta.get('name') != self.name:
            return False
        labels = meta.get('labels') or {}
        if not all(req.matches(labels) for req in self.labels):
            return False
        return all((_field_value(body, path) == value) == equal
                   for path, equal, value in self.fields)


def _spec_part(body: Mapping[str, Any]) -> dict[str, Any]:
    """Everything ``metadata.generation`` tracks: all but metadata, status, apiVersion, kind."""
    return {k: v for k, v in body.items() if k not in ('metadata', 'status', 'apiVersion', 'kind')}


def _random_suffix(length: int = 5) -> str:
    # The same alphabet as apimachinery's utilrand (no vowels, no confusable digits).
    return ''.join(random.choices('bcdfghjklmnpqrstvwxz2456789', k=length))


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


@dataclasses.dataclass(frozen=True)
class WatchEvent:
    """One committed change, as it goes to watch streams and to in-process listeners."""

    type: str  # ADDED, MODIFIED, DELETED
    resource: kmock.resource
    object: Body
    old: Body | None
    rv: int

    @property
    def namespace(self) -> str | None:
        namespace = self.object.get('metadata', {}).get('namespace')
        return None if namespace is None else str(namespace)

    @property
    def name(self) -> str:
        return str(self.object.get('metadata', {}).get('name'))


# --------------------------------------------------------------------------------------------
# The request handler: kmock's emulator with the API-server semantics it lacks.
# --------------------------------------------------------------------------------------------

@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    """kmock's Kubernetes emulator, extended to behave like a real API server (see module doc).

    All state lives in kmock's ``objects`` array (so kmock-style assertions keep working) and
    all user-defined kmock reactions still take precedence over the built-in behaviour, e.g.
    ``kube.server['patch', kmock.resource('', 'v1', 'pods')] << 500`` to inject an error.
    Unlike stock kmock, an intercepted write does not change the stored state.
    """

    history_limit: int = 200
    """How many recent requests are kept for ``kube.server.requests`` assertions."""
    object_history_limit: int = 50
    """How many versions of each object kmock's ``objects[...].history`` keeps."""
    event_log_limit: int = 2000
    """How many past watch events per resource a watch can resume from (older: 410 Gone)."""

    server_errors: list[BaseException] = attrs.field(factory=list, init=False)
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

    # ---- discovery ----------------------------------------------------------------------

    def register(self, spec: ResourceSpec) -> None:
        """Declare a resource for discovery (kopf ignores one without list, watch and patch)."""
        self.resources[spec.resource] = kmock.ResourceInfo(
            kind=spec.kind, namespaced=spec.namespaced,
            singular=spec.singular or spec.kind.lower(), verbs=set(ALL_VERBS),
            shortnames=set(spec.shortnames), categories=set(spec.categories),
            subresources=set(spec.subresources))

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

    def _declared(self) -> dict[kmock.resource, kmock.ResourceInfo]:
        return {key: self.resources[key] for key in self.resources}

    def resolve(self, ref: str | kmock.resource) -> kmock.resource:
        """A resource from ``kmock.resource``, ``'v1/pods'``, ``'apps/v1/deployments'``, or
        a plural, kind or short name of a declared resource (``'pods'``, ``'Job'``, ``'cpt'``)."""
        candidate = ref if isinstance(ref, kmock.resource) else kmock.resource(ref)
        if candidate.group is not None and candidate.version is not None and candidate.plural:
            return kmock.resource(candidate.group, candidate.version, candidate.plural)
        text = str(ref).lower()
        found = [res for res, info in self._declared().items()
                 if text in {str(res.plural), (info.kind or '').lower(), *info.shortnames}]
        core = [res for res in found if res.group == '']
        if len(found) == 1 or len(core) == 1:
            return (found if len(found) == 1 else core)[0]
        raise LookupError(f'unknown or ambiguous resource: {ref!r} ({found!r})')

    def _info(self, res: kmock.resource | None) -> kmock.ResourceInfo:
        if res is None or res.plural is None or res not in self.resources:
            raise api_error(404, 'NotFound', 'the server could not find the requested resource')
        return self.resources[res]

    def _has_status(self, res: kmock.resource) -> bool:
        return 'status' in self._info(res).subresources

    # ---- request intake (replaces kmock's parser and its unbounded history) -------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """Parse and serve one HTTP request.

        Replaces :meth:`kmock.RawHandler.__call__` for three reasons: kmock's path parser fails
        on ``/api/v1/namespaces`` and misreads PUT; YAML bodies (server-side apply) are not
        parsed; and the request history grows forever while every request scans it to match
        reactions (22 ms a GET after 300 requests, 175 ms after 3000), so it is trimmed to
        :attr:`history_limit` here, together with the per-reaction histories. API errors
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

    # ---- reading ------------------------------------------------------------------------

    def store_get(self, res: kmock.resource, namespace: str | None, name: str) -> Body | None:
        """The stored object, or ``None``. Never mutate it: it is shared with watch events."""
        key = (res, namespace if self._info(res).namespaced else None, name)
        obj = self.objects._objects.get(key)
        return None if obj is None or obj.deleted else obj.raw

    def store_list(self, res: kmock.resource, selector: Selector | None = None) -> list[Body]:
        """All stored objects of a resource that match a selector (shared, do not mutate)."""
        selector = selector or Selector()
        items = []
        for (obj_res, _, _), obj in self.objects.items():
            if obj_res == res and not obj.deleted and selector.matches(raw := obj.raw):
                items.append(raw)
        return items

    def _require(self, res: kmock.resource, namespace: str | None, name: str) -> Body:
        body = self.store_get(res, namespace, name)
        if body is None:
            raise api_error(404, 'NotFound', f'{res.plural} "{name}" not found',
                            name=name, kind=res.plural)
        return body

    # ---- writing ------------------------------------------------------------------------

    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def _key(self, res: kmock.resource, namespace: str | None, name: str) -> ObjectKey:
        return (res, namespace if self._info(res).namespaced else None, name)

    def _store(self, key: ObjectKey, body: Body | None) -> None:
        obj = self.objects._objects.get(key)
        if body is None:
            if obj is not None and not obj.deleted:
                obj.delete()
        elif obj is None:
            self.objects[key] = body
        elif obj.deleted:
            obj.create(body)
        else:
            obj.history.append(body)
        if obj is not None and len(obj.history) > self.object_history_limit:
            del obj.history[:-self.object_history_limit]

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

    async def store_create(self, res: kmock.resource, namespace: str | None,
                           body: Mapping[str, Any]) -> Body:
        """Create an object as ``POST`` does: server-side metadata, ADDED event, hooks."""
        async with self._lock:
            created, events = self._create_locked(res, namespace, body)
            await self._emit(events)
        self._notify(events)
        return created

    def _create_locked(self, res: kmock.resource, namespace: str | None,
                       body: Mapping[str, Any]) -> tuple[Body, list[WatchEvent]]:
        """Fill the metadata that the API server owns; kmock stores the body as posted.

        ``uid``, ``resourceVersion``, ``creationTimestamp``, ``generation=1``, the namespace
        from the URL (kmock leaves it out: kopf then fails with "Specific namespaces are
        required"), a unique name from ``generateName`` (kmock makes none, so the second
        generated object collides), and no client-set ``deletionTimestamp``. With a status
        subresource the posted status is dropped, as the real server does.
        """
        info = self._info(res)
        if not isinstance(body, Mapping):
            raise api_error(400, 'BadRequest', 'the body of the request must be an object')
        new: Body = copy.deepcopy(dict(body))
        meta = new.setdefault('metadata', {})
        if not isinstance(meta, dict):
            raise api_error(400, 'BadRequest', 'metadata must be an object')
        if info.namespaced:
            body_ns = meta.get('namespace')
            if namespace and body_ns and body_ns != namespace:
                raise api_error(400, 'BadRequest', 'the namespace of the provided object does '
                                'not match the namespace sent on the request')
            meta['namespace'] = namespace or body_ns or 'default'
        else:
            meta.pop('namespace', None)
        ns = meta.get('namespace')
        if not meta.get('name'):
            prefix = meta.get('generateName')
            if not prefix:
                raise api_error(422, 'Invalid', 'name or generateName is required')
            while True:
                meta['name'] = f'{prefix}{_random_suffix()}'
                if self.store_get(res, ns, meta['name']) is None:
                    break
        name = meta['name']
        if self.store_get(res, ns, name) is not None or self._key(res, ns, name) in self._draining:
            raise api_error(409, 'AlreadyExists', f'{res.plural} "{name}" already exists',
                            name=name, kind=res.plural)
        rv = self._next_rv()
        group_version = res.version if res.group == '' else f'{res.group}/{res.version}'
        new.setdefault('apiVersion', group_version)
        new.setdefault('kind', info.kind)
        for field in ('deletionTimestamp', 'deletionGracePeriodSeconds', 'managedFields'):
            meta.pop(field, None)
        meta.update(uid=str(uuid.uuid4()), resourceVersion=str(rv),
                    creationTimestamp=now_rfc3339(), generation=1)
        if 'status' in info.subresources:
            new.pop('status', None)
        self._defaults(res, new)
        self._store(self._key(res, ns, name), new)
        return new, [WatchEvent('ADDED', res, new, None, rv)]

    def _defaults(self, res: kmock.resource, body: Body) -> None:
        """Per-kind server behaviour on every write.

        Pods start ``Pending``; namespaces are ``Active``; Secrets' ``stringData`` is folded
        into base64 ``data`` (kmock keeps ``stringData``, which readers of a Secret never see);
        creating or updating a CRD declares its custom resource for discovery and marks the
        CRD Established (kmock does not turn CRD objects into resources, so kopf would never
        see the custom resource).
        """
        if res == PODS and 'phase' not in (body.get('status') or {}):
            body.setdefault('status', {})['phase'] = 'Pending'
        elif res == NAMESPACES and not body.get('metadata', {}).get('deletionTimestamp'):
            body.setdefault('status', {})['phase'] = 'Active'
        elif res == SECRETS and 'stringData' in body:
            data = body.setdefault('data', {}) or {}
            for key, value in (body.pop('stringData') or {}).items():
                data[key] = base64.b64encode(str(value).encode()).decode()
            body['data'] = data
            body.setdefault('type', 'Opaque')
        elif res == CRD_RESOURCE:
            self._register_crd(body)

    def _register_crd(self, crd: Body) -> None:
        """Declare the custom resource of a CRD object: every served version, its kind,
        plural, singular, short names, categories, scope and ``status`` subresource."""
        spec = crd.get('spec') or {}
        names = spec.get('names') or {}
        group, plural, kind = spec.get('group'), names.get('plural'), names.get('kind')
        if not (group and plural and kind):
            raise api_error(422, 'Invalid', 'spec.group, spec.names.plural and '
                            'spec.names.kind are required')
        crd_name = crd['metadata']['name']
        if crd_name != f'{plural}.{group}':
            raise api_error(422, 'Invalid', f'metadata.name must be {plural}.{group}')
        for res in self._crd_resources.pop(crd_name, []):
            self.resources.pop(res, None)
        registered = []
        for version in spec.get('versions') or []:
            if not version.get('served', True):
                continue
            subresources = tuple(sorted((version.get('subresources') or {}).keys()))
            rspec = ResourceSpec(group, version['name'], plural, kind,
                                 spec.get('scope', 'Namespaced') == 'Namespaced',
                                 subresources, tuple(names.get('shortNames') or ()),
                                 tuple(names.get('categories') or ()), names.get('singular'))
            self.register(rspec)
            registered.append(rspec.resource)
        self._crd_resources[crd_name] = registered
        crd['status'] = {
            'acceptedNames': copy.deepcopy(names),
            'storedVersions': [v['name'] for v in spec.get('versions') or [] if v.get('storage')],
            'conditions': [
                {'type': 'NamesAccepted', 'status': 'True', 'reason': 'NoConflicts',
                 'lastTransitionTime': now_rfc3339()},
                {'type': 'Established', 'status': 'True', 'reason': 'InitialNamesAccepted',
                 'lastTransitionTime': now_rfc3339()},
            ],
        }

    async def store_update(self, res: kmock.resource, namespace: str | None, name: str,
                           patch: Any, *, patch_type: str = 'merge',
                           subresource: str | None = None) -> Body:
        """Patch or replace an object as ``PATCH``/``PUT`` do.

        ``patch_type`` is ``merge``, ``json``, ``strategic``, ``apply`` or ``replace``.
        """
        async with self._lock:
            updated, events, removed = self._update_locked(
                res, namespace, name, patch, patch_type, subresource)
            await self._emit(events)
        self._notify(events)
        if removed is not None:
            self._after_removal(res, removed)
        return updated

    def _update_locked(self, res: kmock.resource, namespace: str | None, name: str, patch: Any,
                       patch_type: str, subresource: str | None,
                       ) -> tuple[Body, list[WatchEvent], Body | None]:
        """Apply a write with the API server's rules.

        kmock merge-patches every write into the object and keeps no server fields. Here:
        each patch type has its own semantics, and a failed JSON-patch ``test`` is a 422 (kopf
        relies on that for optimistic concurrency of finalizers); ``/status`` writes change
        only ``.status`` and main-resource writes keep ``.status`` when the resource has a
        status subresource; ``uid``, ``creationTimestamp`` and deletion marks cannot be changed;
        a mismatching ``resourceVersion`` in the body is a 409; ``generation`` grows only when
        something other than metadata and status changes; a no-op write changes nothing (no
        new resourceVersion, no event); no finalizer can be added to an object being deleted;
        and removing the last finalizer of such an object deletes it.
        """
        info = self._info(res)
        if subresource not in (None, 'status') or (
                subresource == 'status' and 'status' not in info.subresources):
            raise api_error(404, 'NotFound', 'the server could not find the requested resource')
        ns = namespace if info.namespaced else None
        old = self.store_get(res, ns, name)
        if old is None:
            if patch_type == 'apply' and subresource is None:
                created, events = self._create_locked(res, ns, patch or {})
                return created, events, None
            raise api_error(404, 'NotFound', f'{res.plural} "{name}" not found',
                            name=name, kind=res.plural)
        patched = self._apply_patch(res, old, patch, patch_type)
        if not isinstance(patched, dict):
            raise api_error(422, 'Invalid', 'the patched object is not an object')
        wanted_rv = (patched.get('metadata') or {}).get('resourceVersion')
        if patch_type != 'json' and wanted_rv and wanted_rv != old['metadata']['resourceVersion']:
            raise api_error(409, 'Conflict', f'Operation cannot be fulfilled on {res.plural} '
                            f'"{name}": the object has been modified; please apply your changes '
                            'to the latest version and try again', name=name, kind=res.plural)
        if subresource == 'status':
            new = copy.deepcopy(old)
            if 'status' in patched:
                new['status'] = patched['status']
            else:
                new.pop('status', None)
        else:
            new = patched
            if 'status' in info.subresources:
                if 'status' in old:
                    new['status'] = copy.deepcopy(old['status'])
                else:
                    new.pop('status', None)
        meta = new.setdefault('metadata', {})
        old_meta = old['metadata']
        for field in ('name', 'namespace', 'uid', 'creationTimestamp', 'deletionTimestamp',
                      'deletionGracePeriodSeconds', 'generation', 'resourceVersion'):
            if field in old_meta:
                meta[field] = old_meta[field]
            else:
                meta.pop(field, None)
        new['apiVersion'], new['kind'] = old.get('apiVersion'), old.get('kind')
        if old_meta.get('deletionTimestamp'):
            added = set(meta.get('finalizers') or []) - set(old_meta.get('finalizers') or [])
            if added:
                raise api_error(422, 'Invalid', f'Forbidden: no new finalizers can be added if '
                                f'the object is being deleted, found new finalizers {added}')
        self._defaults(res, new)
        if new == old:
            return old, [], None
        if _spec_part(new) != _spec_part(old):
            meta['generation'] = int(old_meta.get('generation') or 0) + 1
        rv = self._next_rv()
        meta['resourceVersion'] = str(rv)
        key = self._key(res, ns, name)
        if meta.get('deletionTimestamp') and not meta.get('finalizers') \
                and key not in self._draining:
            self._store(key, None)
            return new, [WatchEvent('DELETED', res, new, old, rv)], new
        self._store(key, new)
        return new, [WatchEvent('MODIFIED', res, new, old, rv)], None

    def _apply_patch(self, res: kmock.resource, old: Body, patch: Any, patch_type: str) -> Any:
        match patch_type:
            case 'replace':
                if not isinstance(patch, dict):
                    raise api_error(400, 'BadRequest', 'the body of the request must be an object')
                return copy.deepcopy(patch)
            case 'merge' | 'apply':
                return merge_patch(old, patch)
            case 'strategic':
                if any(res in resources for resources in self._crd_resources.values()):
                    raise api_error(415, 'UnsupportedMediaType', 'the body of the request was '
                                    'in an unknown format - accepted media types include: '
                                    'application/json-patch+json, application/merge-patch+json, '
                                    'application/apply-patch+yaml')
                return strategic_merge_patch(old, patch)
            case 'json':
                if not isinstance(patch, list):
                    raise api_error(400, 'BadRequest', 'a JSON patch must be a list')
                try:
                    return jsonpatch.apply_patch(copy.deepcopy(old), patch)
                except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as e:
                    raise api_error(422, 'Invalid', f'the server rejected our request due to '
                                    f'an error in our request: {e}') from None
            case _:
                raise api_error(415, 'UnsupportedMediaType', f'unknown patch type {patch_type}')

    async def store_delete(self, res: kmock.resource, namespace: str | None, name: str, *,
                           propagation: str = 'Background',
                           preconditions: Mapping[str, Any] | None = None) -> Body:
        """Delete an object as ``DELETE`` does (finalizers, then garbage collection)."""
        async with self._lock:
            body, events, removed = self._delete_locked(res, namespace, name, preconditions)
            await self._emit(events)
        self._notify(events)
        if removed is not None:
            self._after_removal(res, removed, propagation)
        elif self._key(res, namespace, name) in self._draining and events:
            self._spawn(self._drain(res, body, propagation))
        return body

    def _delete_locked(self, res: kmock.resource, namespace: str | None, name: str,
                       preconditions: Mapping[str, Any] | None,
                       ) -> tuple[Body, list[WatchEvent], Body | None]:
        """Deletion with finalizers, like kmock, plus preconditions and a new resourceVersion.

        An object with finalizers gets ``deletionTimestamp`` and stays until the last one is
        removed. Namespaces and CRDs are first marked terminating while their contents are
        deleted (the namespace controller's and the CRD cleanup's job), then removed.
        Pods are removed at once (as with ``gracePeriodSeconds=0``).
        """
        info = self._info(res)
        ns = namespace if info.namespaced else None
        old = self._require(res, ns, name)
        old_meta = old['metadata']
        for field in ('uid', 'resourceVersion'):
            wanted = (preconditions or {}).get(field)
            if wanted and wanted != old_meta.get(field):
                raise api_error(409, 'Conflict', f'Precondition failed: {field} in precondition:'
                                f' {wanted}, {field} in object meta: {old_meta.get(field)}')
        key = self._key(res, ns, name)
        if old_meta.get('deletionTimestamp'):
            return old, [], None
        rv = self._next_rv()
        new = copy.deepcopy(old)
        new['metadata']['resourceVersion'] = str(rv)
        if old_meta.get('finalizers') or res in _SYSTEM_DRAINED:
            new['metadata']['deletionTimestamp'] = now_rfc3339()
            new['metadata']['deletionGracePeriodSeconds'] = 0
            if res == NAMESPACES:
                new.setdefault('status', {})['phase'] = 'Terminating'
            if res in _SYSTEM_DRAINED:
                self._draining.add(key)
            self._store(key, new)
            return new, [WatchEvent('MODIFIED', res, new, old, rv)], None
        self._store(key, None)
        return new, [WatchEvent('DELETED', res, new, old, rv)], new

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _after_removal(self, res: kmock.resource, body: Body,
                       propagation: str = 'Background') -> None:
        """What happens when an object is really gone: its pod logs go, a CRD's resources are
        undeclared, and its dependents are garbage-collected."""
        meta = body.get('metadata') or {}
        if res == PODS:
            for log_key in [k for k in self._pod_logs if k[:2] == (meta.get('namespace'),
                                                                  meta.get('name'))]:
                del self._pod_logs[log_key]
        if res == CRD_RESOURCE:
            for crd_res in self._crd_resources.pop(meta.get('name', ''), []):
                self.resources.pop(crd_res, None)
        if meta.get('uid'):
            self._spawn(self._collect_garbage(meta['uid'], propagation))

    async def _collect_garbage(self, owner_uid: str, propagation: str) -> None:
        """The garbage collector, in the background: delete the dependents of a removed owner
        (those listing its uid in ``ownerReferences``) unless other owners remain, or just drop
        the reference with ``propagationPolicy=Orphan``.

        kmock has no garbage collector at all. ``Foreground`` is treated as ``Background``:
        the owner is gone first, its dependents right after.
        """
        await asyncio.sleep(0)
        dependents = []
        for (res, ns, name), obj in list(self.objects.items()):
            if obj.deleted:
                continue
            refs = obj.raw.get('metadata', {}).get('ownerReferences') or []
            if any(ref.get('uid') == owner_uid for ref in refs):
                dependents.append((res, ns, name, refs))
        for res, ns, name, refs in dependents:
            others = [ref for ref in refs if ref.get('uid') != owner_uid]
            with contextlib.suppress(kmock.KubernetesError):
                if propagation == 'Orphan' or any(self._uid_exists(ref.get('uid'))
                                                  for ref in others):
                    await self.store_update(res, ns, name, {'metadata': {
                        'ownerReferences': others or None}})
                else:
                    await self.store_delete(res, ns, name, propagation=propagation)

    def _uid_exists(self, uid: str | None) -> bool:
        return any(not obj.deleted and obj.raw.get('metadata', {}).get('uid') == uid
                   for obj in self.objects.values())

    async def _drain(self, res: kmock.resource, body: Body, propagation: str) -> None:
        """Delete the contents of a terminating namespace (every namespaced object in it) or
        CRD (all its custom resources), wait until they are gone, finalizers included, then
        remove the namespace or CRD itself."""
        meta = body['metadata']
        key = self._key(res, None, meta['name'])
        crd_resources = self._crd_resources.get(meta['name'], []) if res == CRD_RESOURCE else []
        while not self._closing.is_set():
            contents = [
                (obj_res, ns, name, obj.raw) for (obj_res, ns, name), obj
                in list(self.objects.items()) if not obj.deleted and (
                    (res == NAMESPACES and ns == meta['name']) or obj_res in crd_resources)]
            if not contents:
                break
            for obj_res, ns, name, raw in contents:
                if not raw['metadata'].get('deletionTimestamp'):
                    with contextlib.suppress(kmock.KubernetesError):
                        await self.store_delete(obj_res, ns, name, propagation=propagation)
            await asyncio.sleep(0.02)
        async with self._lock:
            self._draining.discard(key)
            current = self.store_get(res, None, meta['name'])
            events: list[WatchEvent] = []
            if current is not None and not current['metadata'].get('finalizers'):
                rv = self._next_rv()
                final = copy.deepcopy(current)
                final['metadata']['resourceVersion'] = str(rv)
                self._store(key, None)
                events = [WatchEvent('DELETED', res, final, current, rv)]
            await self._emit(events)
        self._notify(events)
        for event in events:
            self._after_removal(res, event.object, propagation)

    # ---- pod logs -----------------------------------------------------------------------

    def set_pod_log(self, namespace: str, name: str, text: str,
                    container: str | None = None) -> None:
        """Replace the log that ``GET .../pods/NAME/log`` serves."""
        self._pod_logs[(namespace, name, container)] = text

    def append_pod_log(self, namespace: str, name: str, text: str,
                       container: str | None = None, limit: int = 1 << 20) -> None:
        """Append to a pod's log, keeping its last ``limit`` characters (as log rotation)."""
        key = (namespace, name, container)
        self._pod_logs[key] = (self._pod_logs.get(key, '') + text)[-limit:]

    def pod_log(self, namespace: str, name: str, container: str | None = None) -> str:
        """The log of a container (default: the only/first one), as ``pods/log`` serves it."""
        if container is not None:
            if (namespace, name, container) in self._pod_logs:
                return self._pod_logs[(namespace, name, container)]
            return self._pod_logs.get((namespace, name, None), '')
        if (namespace, name, None) in self._pod_logs:
            return self._pod_logs[(namespace, name, None)]
        pod = self.store_get(PODS, namespace, name) or {}
        containers = (pod.get('spec') or {}).get('containers') or [{}]
        return self._pod_logs.get((namespace, name, containers[0].get('name')), '')

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

    # ---- HTTP verbs ---------------------------------------------------------------------

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

    async def close(self) -> None:
        """End the watches and the background work, so that the HTTP server stops at once
        (aiohttp would otherwise wait 60 s for open watch streams)."""
        self._closing.set()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _render(event: WatchEvent, selector: Selector) -> dict[str, Any] | None:
    """An event as one watch stream with this selector sees it."""
    now, before = selector.matches(event.object), selector.matches(event.old)
    if event.type == 'MODIFIED':
        kind = 'MODIFIED' if now and before else 'ADDED' if now else 'DELETED' if before else None
    else:
        kind = event.type if now else None
    return None if kind is None else {'type': kind, 'object': event.object}


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
    'BUILTIN_RESOURCES', 'ApiServer', 'HttpServer', 'KubeEmulator', 'ResourceSpec', 'Selector',
    'WatchEvent',
    'merge_patch', 'parse_field_selector', 'parse_label_selector', 'parse_path',
    'strategic_merge_patch', 'until', 'wait_for',
]
