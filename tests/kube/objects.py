"""The Kubernetes emulator's data model, pure: resource specs, object types, API errors,
timestamps, the three patch formats, label and field selectors, and watch events.

No I/O and no state: :mod:`tests.kube.store` keeps the objects, :mod:`tests.kube.watch` streams
the events, :mod:`tests.kube.http_api` serves HTTP, :mod:`tests.kube.emulator` composes them.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import random
import re
from collections.abc import Callable, Mapping
from typing import Any

import kmock

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
    ResourceSpec('coordination.k8s.io', 'v1', 'leases', 'Lease'),
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

