"""The operator's asynchronous view of the Kubernetes API, over the official client.

:class:`KubeApi` wraps the (synchronous) ``kubernetes`` package: each call runs in a thread
pool of its own (so that long waits never starve kopf's default executor), reads responses as
plain JSON mappings (``_preload_content=False``: no model deserialisation, camelCase keys as
the API sends them), and turns ``ApiException`` into
:class:`~chunktune.backends.cluster.ClusterApiError` (404 becomes ``None``/``False`` where
that reads better); a request that got no answer (connection refused or reset, timeout) is a
``ClusterApiError`` with status 0.

Transient errors (no answer, 429, 5xx) are retried in place with jittered exponential backoff
(0.2 s doubling up to 5 s, each sleep drawn from its upper half), every retry logged, for at
most ``retry_seconds``; past that the call raises
:class:`~chunktune.backends.cluster.ApiUnavailable`, which the tuner treats as a fault of
the cluster, never as the trial's result. Every request has a timeout, so a hung API server
is an error rather than a hang. A call that is cancelled mid-flight still completes before the
cancellation propagates, so a caller's clean-up never races an object being created.

The API objects (``ApiClient`` and the typed APIs) are built once per operator: the first one
costs most of a second (toolchain notes).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import logging
import os
import random
from collections.abc import Callable
from typing import Any, TypeVar

import kubernetes
import urllib3
import yaml
from kubernetes.client.exceptions import ApiException

from chunktune.api.crd import PLURAL
from chunktune.api.v1alpha1 import API_GROUP, API_VERSION
from chunktune.backends.cluster import ApiUnavailable, ClusterApiError
from chunktune.core.errors import BackendUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")
Body = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"

#: Resource kind -> (API attribute, method suffix).
_KINDS: dict[str, tuple[str, str]] = {
    "pods": ("core", "namespaced_pod"),
    "configmaps": ("core", "namespaced_config_map"),
    "services": ("core", "namespaced_service"),
    "secrets": ("core", "namespaced_secret"),
    "events": ("core", "namespaced_event"),
    "jobs": ("batch", "namespaced_job"),
    "deployments": ("apps", "namespaced_deployment"),
    "leases": ("coordination", "namespaced_lease"),
}
#: First retry delay and the cap of the doubling delays, seconds.
RETRY_FIRST = 0.2
RETRY_CAP = 5.0


def make_api_client(kubeconfig: str | None = None, pool_size: int = 16) -> Any:
    """An ``ApiClient``: in-cluster configuration when running in a pod, else the kubeconfig
    (``kubeconfig``, ``$KUBECONFIG`` or ``~/.kube/config``)."""
    config = kubernetes.client.Configuration()
    try:
        if kubeconfig:
            raise kubernetes.config.ConfigException("explicit kubeconfig")
        kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=config)
    except kubernetes.config.ConfigException:
        try:
            kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=config)
        except (kubernetes.config.ConfigException, OSError, ValueError, yaml.YAMLError) as e:
            where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
            raise BackendUnavailable(
                f"no Kubernetes cluster to talk to: not running in a pod, and the kubeconfig "
                f"{where} gives none ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
                "; set KUBECONFIG to a cluster's kubeconfig or run the operator in the "
                "cluster") from e
    config.connection_pool_maxsize = pool_size
    return kubernetes.client.ApiClient(configuration=config)


class KubeApi:
    """Async calls on the official client; every result is a JSON mapping."""

    def __init__(self, api_client: Any, threads: int = 16, retry_seconds: float = 30.0,
                 request_timeout: float = 30.0) -> None:
        self.client = api_client
        self.retry_seconds = retry_seconds
        """How long transient errors are retried before :class:`ApiUnavailable`."""
        self.request_timeout = request_timeout
        """Seconds one request may take (connect and read)."""
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.batch = kubernetes.client.BatchV1Api(api_client)
        self.apps = kubernetes.client.AppsV1Api(api_client)
        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.coordination = kubernetes.client.CoordinationV1Api(api_client)
        self.on_retry: Callable[[str, int], None] = lambda what, status: None
        """Told ``(call, HTTP status)`` of every transient error retried in place (status 0:
        no answer)."""
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="chunktune-kube")

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            # NOTE: the request is on the wire: let it finish, so that whoever cleans up after
            # the cancellation sees the object it created (or its deletion done).
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(fut, 30)
            raise

    async def _retrying(self, run: Callable[[], T], what: str) -> T:
        """``run()`` in the pool; transient errors retried with jittered backoff for at most
        :attr:`retry_seconds`, then :class:`ApiUnavailable`."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        delay = RETRY_FIRST
        attempt = 0
        while True:
            try:
                return await self._call(run)
            except ClusterApiError as e:
                if not e.transient or isinstance(e, ApiUnavailable):
                    raise
                attempt += 1
                waited = loop.time() - start
                if waited + delay > self.retry_seconds:
                    raise ApiUnavailable(e.status, f"{what}: {e.message} (still failing after "
                                                   f"{attempt} tries in {waited:.1f} s)") from e
                sleep = delay * random.uniform(0.5, 1.0)
                log.warning("%s: %s; retry %d in %.1f s", what, e, attempt, sleep)
                self.on_retry(what, e.status)
                await asyncio.sleep(sleep)
                delay = min(RETRY_CAP, delay * 2)

    async def _json(self, fn: Callable[..., Any], *args: Any, _once: float | None = None,
                    **kwargs: Any) -> Any:
        """The call's JSON answer. ``_once``: one try with this timeout, no retries (leader
        election must know within its deadline, and retries on its own schedule)."""
        def run() -> Any:
            try:
                resp = fn(*args, _preload_content=False,
                          _request_timeout=_once or self.request_timeout, **kwargs)
                data = resp.data
            except ApiException as e:
                raise _error(e) from e
            except (urllib3.exceptions.HTTPError, OSError) as e:
                raise _unreachable(e) from e
            return json.loads(data) if data else None

        if _once is not None:
            return await self._call(run)
        return await self._retrying(run, _describe(fn, args))

    def _method(self, verb: str, kind: str) -> Callable[..., Any]:
        api, suffix = _KINDS[kind]
        return getattr(getattr(self, api), f"{verb}_{suffix}")  # type: ignore[no-any-return]

    # ---- generic verbs ---------------------------------------------------------------------

    async def create(self, kind: str, namespace: str, body: Body) -> Body:
        return await self._json(self._method("create", kind), namespace, body)  # type: ignore[no-any-return]

    async def get(self, kind: str, namespace: str, name: str) -> Body | None:
        try:
            return await self._json(self._method("read", kind), name, namespace)  # type: ignore[no-any-return]
        except ClusterApiError as e:
            if e.status == 404:
                return None
            raise

    async def list(self, kind: str, namespace: str, selector: str | None = None) -> list[Body]:
        data = await self._json(self._method("list", kind), namespace,
                                label_selector=selector)
        return list((data or {}).get("items") or [])

    async def delete(self, kind: str, namespace: str, name: str,
                     grace_seconds: int | None = None) -> bool:
        """Delete (background propagation: a Job's pods go with it); False if absent."""
        try:
            await self._json(self._method("delete", kind), name, namespace,
                             propagation_policy="Background",
                             grace_period_seconds=grace_seconds)
            return True
        except ClusterApiError as e:
            if e.status == 404:
                return False
            raise

    async def patch(self, kind: str, namespace: str, name: str, patch: Body,
                    content_type: str = STRATEGIC_PATCH) -> Body:
        return await self._json(self._method("patch", kind), name, namespace, patch,  # type: ignore[no-any-return]
                                _content_type=content_type)

    async def pod_log(self, namespace: str, name: str, container: str | None = None,
                      tail_lines: int | None = None, limit_bytes: int | None = None) -> str:
        """The pod's log ("" when the pod or its log is not there yet); ``limit_bytes``: its
        first bytes only (the API server stops there, maybe inside a line)."""
        def run() -> str:
            try:
                resp = self.core.read_namespaced_pod_log(
                    name, namespace, container=container, tail_lines=tail_lines,
                    limit_bytes=limit_bytes, _preload_content=False,
                    _request_timeout=self.request_timeout)
                data: Any = getattr(resp, "data", b"")
            except ApiException as e:
                if e.status in (400, 404):  # not started yet, or gone
                    return ""
                raise _error(e) from e
            except (urllib3.exceptions.HTTPError, OSError) as e:
                raise _unreachable(e) from e
            return bytes(data or b"").decode("utf-8", errors="replace")

        return await self._retrying(run, f"read the log of pod {namespace}/{name}")

    # ---- the custom resource -----------------------------------------------------------------

    async def get_tuning(self, namespace: str, name: str) -> Body | None:
        """The resource as the API has it now (None: it is gone): the fresh read a status
        patch retries from after a conflict."""
        try:
            body: Body = await self._json(self.custom.get_namespaced_custom_object,
                                          API_GROUP, API_VERSION, namespace, PLURAL, name)
            return body
        except ClusterApiError as e:
            if e.status == 404:
                return None
            raise

    async def patch_tuning_status(self, namespace: str, name: str, status: Body) -> Body | None:
        """Merge-patch ``status`` into the resource's status subresource (None: it is gone)."""
        try:
            return await self._json(  # type: ignore[no-any-return]
                self.custom.patch_namespaced_custom_object_status, API_GROUP, API_VERSION,
                namespace, PLURAL, name, {"status": status}, _content_type=MERGE_PATCH)
        except ClusterApiError as e:
            if e.status == 404:
                return None
            raise

    async def apply_configmap(self, namespace: str, body: Body) -> Body:
        """Create the ConfigMap, or replace its data and labels if it exists."""
        try:
            return await self.create("configmaps", namespace, body)
        except ClusterApiError as e:
            if e.status != 409:
                raise
        meta = body["metadata"]
        return await self.patch("configmaps", namespace, meta["name"], {
            "metadata": {"labels": meta.get("labels") or {},
                         "annotations": meta.get("annotations") or {}},
            "data": body.get("data") or {}}, content_type=MERGE_PATCH)

    # ---- leases (one try each: see :mod:`chunktune.k8s.leader`) -------------------------------

    async def get_lease(self, namespace: str, name: str, timeout: float) -> Body | None:
        try:
            return await self._json(self._method("read", "leases"), name, namespace,  # type: ignore[no-any-return]
                                    _once=timeout)
        except ClusterApiError as e:
            if e.status == 404:
                return None
            raise

    async def create_lease(self, namespace: str, body: Body, timeout: float) -> Body:
        return await self._json(self._method("create", "leases"), namespace, body,  # type: ignore[no-any-return]
                                _once=timeout)

    async def replace_lease(self, namespace: str, name: str, body: Body,
                            timeout: float) -> Body:
        """PUT the whole Lease; its ``metadata.resourceVersion`` makes the write conditional
        (a 409 when another replica wrote it first)."""
        return await self._json(self._method("replace", "leases"), name, namespace, body,  # type: ignore[no-any-return]
                                _once=timeout)

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(Exception):
            self.client.close()


def _unreachable(e: BaseException) -> ClusterApiError:
    reason = getattr(e, "reason", None) or e
    return ClusterApiError(0, f"no answer from the API server ({type(e).__name__}: {reason})")


def _describe(fn: Callable[..., Any], args: tuple[Any, ...]) -> str:
    """``patch_namespaced_pod default/t-t0`` for log lines."""
    name = getattr(fn, "__name__", "call")
    texts = [a for a in args if isinstance(a, str)]
    if len(texts) >= 5:  # custom objects: group, version, namespace, plural, name
        return f"{name} {texts[2]}/{texts[4]}"
    return f"{name} {'/'.join(reversed(texts[:2]))}".strip() if texts else name


def _error(e: ApiException) -> ClusterApiError:
    message = e.reason or ""
    with contextlib.suppress(Exception):
        message = json.loads(e.body or "{}").get("message") or message
    return ClusterApiError(int(e.status or 0), str(message))


__all__ = ["MERGE_PATCH", "RETRY_CAP", "RETRY_FIRST", "STRATEGIC_PATCH", "KubeApi",
           "make_api_client"]
