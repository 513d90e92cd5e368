"""The cluster API port: the Kubernetes calls a trial backend makes (:class:`ClusterApi`, JSON
mappings in and out) and the errors its implementation raises (:class:`ClusterApiError`,
:class:`ApiUnavailable`). Implemented over the official client by
:class:`chunktune.k8s.kube.KubeApi`; used by :mod:`.kubernetes` and the whole operator, which
import this module (not the backend) for the errors alone."""

from __future__ import annotations

from typing import Any, Protocol

from chunktune.core.errors import ChunktuneError, InfrastructureFault

Body = dict[str, Any]


#: HTTP statuses that say "try again later", not "this request is wrong": throttled (429)
#: and server-side failures (5xx). Status 0 is a request that never got an answer
#: (connection refused or reset, timeout).
TRANSIENT_STATUSES = frozenset({0, 429, 500, 502, 503, 504})


class ClusterApiError(ChunktuneError):
    """The API server refused a request (``status`` is the HTTP status; 0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message

    @property
    def transient(self) -> bool:
        """Worth retrying: no answer, throttled, or a server-side error."""
        return self.status in TRANSIENT_STATUSES or self.status >= 500


class ApiUnavailable(ClusterApiError, InfrastructureFault):
    """Transient API errors went on past the retry bound: a fault of the cluster, which the
    tuner never records as the trial's result."""


class ClusterApi(Protocol):
    """The Kubernetes calls a trial needs (JSON mappings in and out)."""

    async def create(self, kind: str, namespace: str, body: Body) -> Body: ...

    async def get(self, kind: str, namespace: str, name: str) -> Body | None: ...

    async def list(self, kind: str, namespace: str, selector: str | None = None
                   ) -> list[Body]: ...

    async def delete(self, kind: str, namespace: str, name: str,
                     grace_seconds: int | None = None) -> bool: ...

    async def pod_log(self, namespace: str, name: str, container: str | None = None,
                      tail_lines: int | None = None, limit_bytes: int | None = None) -> str: ...


__all__ = ["TRANSIENT_STATUSES", "ApiUnavailable", "Body", "ClusterApi", "ClusterApiError"]
