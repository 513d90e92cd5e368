"""Build the operator (registry, API client) and run kopf.

:func:`run` is what ``chunktune operator run`` calls; tests call it in-process with their own
``login`` (the emulator's URL and token) and ``stop_flag``. Without ``login``, kopf logs in
the way the ``kubernetes`` client does (in-cluster service account, else the kubeconfig).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import kopf

from chunktune.k8s import handlers
from chunktune.k8s.controller import Operator
from chunktune.k8s.kube import KubeApi, make_api_client
from chunktune.k8s.settings import Settings

log = logging.getLogger(__name__)


def build(settings: Settings, api_client: Any | None = None,
          login: Callable[..., Any] | None = None) -> tuple[kopf.OperatorRegistry, Operator]:
    """A registry with every handler, and the shared operator state."""
    client = api_client if api_client is not None else make_api_client(
        pool_size=settings.api_threads)
    op = Operator(settings, KubeApi(client, settings.api_threads,
                                    retry_seconds=settings.api_retry_seconds,
                                    request_timeout=settings.api_timeout))
    registry = kopf.OperatorRegistry()
    handlers.register(registry, op)
    kopf.on.login(registry=registry)(login or kopf.login_via_client)
    return registry, op


async def run(settings: Settings, *, api_client: Any | None = None,
              login: Callable[..., Any] | None = None, stop_flag: Any = None,
              ready_flag: Any = None) -> None:
    """Run the operator until ``stop_flag`` is set (or a signal arrives)."""
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    registry, op = build(settings, api_client, login)
    try:
        await kopf.operator(
            registry=registry, clusterwide=settings.clusterwide,
            namespaces=list(settings.namespaces), standalone=settings.standalone,
            liveness_endpoint=settings.liveness, stop_flag=stop_flag, ready_flag=ready_flag)
    finally:
        await op.api.close()


__all__ = ["build", "run"]
