"""The Kubernetes emulator's object store: resource declarations, and reads and writes with the
API server's semantics (server-managed metadata, patch types, the ``/status`` subresource,
finalizers, deletion preconditions, garbage collection, namespace and CRD clean-up), plus the
pod-log store.

:class:`StoreLayer` is one layer of :class:`tests.kube.emulator.ApiServer`: the state it uses
(kmock's ``objects`` and ``resources``, the lock, the counters) is declared on that class.
Every committed change is handed to the watch layer (``_emit``/``_notify``,
:mod:`tests.kube.watch`) as :class:`~tests.kube.objects.WatchEvent` objects.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import uuid
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any

import jsonpatch
import jsonpointer
import kmock

from tests.kube.objects import (
    _SYSTEM_DRAINED,
    ALL_VERBS,
    CRD_RESOURCE,
    NAMESPACES,
    PODS,
    SECRETS,
    Body,
    ObjectKey,
    ResourceSpec,
    Selector,
    WatchEvent,
    _random_suffix,
    _spec_part,
    api_error,
    merge_patch,
    now_rfc3339,
    strategic_merge_patch,
)

_Base = kmock.KubernetesEmulator if TYPE_CHECKING else object


class StoreLayer(_Base):
    """Declared resources and stored objects, read and written as the API server does."""

    __slots__ = ()

    _rv: int
    _pod_logs: dict[tuple[str, str, str | None], str]
    _crd_resources: dict[str, list[kmock.resource]]
    _draining: set[ObjectKey]
    _tasks: set[asyncio.Task[Any]]
    _closing: asyncio.Event
    object_history_limit: int

    # ---- discovery ----------------------------------------------------------------------

    def register(self, spec: ResourceSpec) -> None:
        """Declare a resource for discovery (kopf ignores one without list, watch and patch)."""
        self.resources[spec.resource] = kmock.ResourceInfo(
            kind=spec.kind, namespaced=spec.namespaced,
            singular=spec.singular or spec.kind.lower(), verbs=set(ALL_VERBS),
            shortnames=set(spec.shortnames), categories=set(spec.categories),
            subresources=set(spec.subresources))

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
