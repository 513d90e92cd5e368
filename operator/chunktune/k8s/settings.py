"""The operator's settings: one tree of frozen dataclasses, validated once.

:meth:`Settings.from_env` reads the ``CHUNKTUNE_*`` environment variables (the Helm chart sets
them), then the command line's values override them (``chunktune operator run --namespace ...``);
every bad value is reported at once as a :class:`~chunktune.core.errors.SpecError` naming the
variable or flag. :func:`chunktune.k8s.handlers.configure` applies the kopf part in one
``@kopf.on.startup`` handler.

Environment variables (defaults in brackets):

=================================  ==============================================================
``CHUNKTUNE_NAMESPACES``           comma-separated namespaces to watch [all namespaces]
``CHUNKTUNE_STATE_DIR``            where default study journals live [/var/lib/chunktune]
``CHUNKTUNE_STANDALONE``           no peering (a single operator replica) [false]
``CHUNKTUNE_LIVENESS``             liveness endpoint, e.g. ``http://0.0.0.0:8080/healthz`` []
``CHUNKTUNE_IMAGE``                the chunktune image of load Jobs and sim engines [required:
                                   none is published; the chart sets it from image.*]
``CHUNKTUNE_IMAGE_PULL_POLICY``    imagePullPolicy of trial containers [unset]
``CHUNKTUNE_TRIAL_SERVICE_ACCOUNT`` service account of trial pods [unset: the default]
``CHUNKTUNE_SHM_SIZE``             sizeLimit of the engine's /dev/shm [8Gi]
``CHUNKTUNE_SIM_LOAD_TIME``        ``--load-time`` of simulated engines, seconds [unset]
``CHUNKTUNE_SIM_REQUEST_GPUS``     simulated engines request the ``nvidia.com/gpu`` they
                                   simulate (a rehearsal of GPU scheduling) [false]
``CHUNKTUNE_POLL_INTERVAL``        seconds between checks of a trial's objects [1]
``CHUNKTUNE_KV_SAMPLE_INTERVAL``   seconds between engine checks during the load [2]
``CHUNKTUNE_KEEP_TRIAL_OBJECTS``   leave finished trials' objects for debugging [false]
``CHUNKTUNE_PROMETHEUS_SELECT_BY`` ``pod`` (namespace+pod labels) or ``instance`` (pod IP) [pod]
``CHUNKTUNE_WATCH_SERVER_TIMEOUT`` kopf's watch server timeout, seconds [300]
``CHUNKTUNE_WATCH_CLIENT_TIMEOUT`` kopf's watch client timeout, seconds [330]
``CHUNKTUNE_API_THREADS``          threads for Kubernetes API calls [16]
``CHUNKTUNE_API_RETRY_SECONDS``    how long transient API errors (no answer, 429, 5xx) are
                                   retried in place before the trial waits for the API [30]
``CHUNKTUNE_API_TIMEOUT``          seconds one Kubernetes API request may take [30]
``CHUNKTUNE_API_OUTAGE_SECONDS``   how long kopf retries its own requests (watches, events)
                                   before giving up (the pod then restarts) [600]
``CHUNKTUNE_ALLOW_DATABASE_URLS``  allow RDB storage URLs (``sqlite:///...``,
                                   ``postgresql://...``) in ``spec.storage`` and
                                   ``spec.storageFrom`` [false: journal files in the state
                                   directory only]
``CHUNKTUNE_LOG_LEVEL``            DEBUG, INFO, WARNING, ERROR [INFO]
``CHUNKTUNE_METRICS_ADDRESS``      serve ``/metrics`` and ``/healthz`` at ``HOST:PORT`` []
``CHUNKTUNE_LEADER_ELECT``         one active replica, elected through a Lease [false]
``CHUNKTUNE_LEASE_NAME``           the Lease [chunktune-operator]
``CHUNKTUNE_LEASE_NAMESPACE``      its namespace [the pod's own, else default]
``CHUNKTUNE_LEASE_DURATION``       seconds a standby waits after the last renewal seen [15]
``CHUNKTUNE_LEASE_RENEW_DEADLINE`` seconds the leader may fail to renew before it exits [10]
``CHUNKTUNE_LEASE_RETRY_PERIOD``   seconds between renewals and acquisition tries [2]
``CHUNKTUNE_LEADER_IDENTITY``      this replica's name in the Lease [pod name + random suffix]
``CHUNKTUNE_ALLOWED_SECRETS``      comma-separated Secrets any tuning may reference []
``CHUNKTUNE_SECRET_OPT_IN``        also allow Secrets labelled chunktune.dev/allow-reference
                                   [false]
``CHUNKTUNE_ALLOWED_REGISTRIES``   comma-separated registries/repositories of engine images
                                   [any]
=================================  ==============================================================
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from chunktune.backends.manifests import TrialOptions
from chunktune.core.errors import SpecError

T = TypeVar("T")

DEFAULT_STATE_DIR = Path("/var/lib/chunktune")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")

#: Why settings without :attr:`TrialSettings.image` are refused, and the fix.
IMAGE_MISSING = ("is not set: the operator runs the chunktune image in every load Job and "
                 "simulated engine, and none is published; build one from the chunktune "
                 "repository, push it, and set CHUNKTUNE_IMAGE to it (the Helm chart sets it "
                 "from image.repository and image.tag)")

@dataclass(frozen=True)
class WatchSettings:
    """How kopf watches the API."""

    server_timeout: float = 300.0
    """Seconds the API server keeps a watch open (kopf re-opens it)."""
    client_timeout: float = 330.0
    """Seconds the client waits on a watch before giving up on it (> server_timeout)."""


@dataclass(frozen=True)
class TrialSettings:
    """How trials run in the cluster."""

    image: str | None = None
    """The chunktune image: runs ``chunktune load run`` in load Jobs, and ``chunktune sim
    serve`` for a simulated engine whose manifest names no image. Required (no chunktune image
    is published): :meth:`Settings.check` refuses settings without it."""
    image_pull_policy: str | None = None
    """``imagePullPolicy`` of trial containers (None: the cluster's default)."""
    service_account: str | None = None
    """Service account of trial pods (None: the namespace's default)."""
    shm_size: str = "8Gi"
    """``sizeLimit`` of the memory ``emptyDir`` mounted on the engine's ``/dev/shm``."""
    sim_load_time: float | None = None
    """``--load-time`` of simulated engines, seconds (None: the simulator's default, 2 s)."""
    sim_requests_gpus: bool = False
    """Simulated engines request the ``nvidia.com/gpu`` they simulate, as vLLM would: parallel
    trials then meet the cluster's GPU capacity (a rehearsal with simulated engines)."""
    poll_interval: float = 1.0
    """Seconds between checks of a trial's pod, Job and log."""
    kv_sample_interval: float = 2.0
    """Seconds between checks of the engine during the load (a crash ends the trial) and
    ``/metrics`` samples for the KV-usage peak; an engine that logs its steps (vLLM, sim) has
    its peak from the step log and is sampled at most every 15 s (a scrape stalls its API
    server)."""
    keep_objects: bool = False
    """Leave a finished trial's Pod, Job and ConfigMap in place (for debugging)."""
    prometheus_select_by: str = "pod"
    """How Prometheus series are matched to a trial pod: ``pod`` or ``instance``."""

    def options(self) -> TrialOptions:
        """The manifest builders' view of these settings."""
        if self.image is None:
            raise SpecError(IMAGE_MISSING, field="CHUNKTUNE_IMAGE")
        return TrialOptions(load_image=self.image, image_pull_policy=self.image_pull_policy,
                            service_account=self.service_account, shm_size=self.shm_size,
                            sim_load_time=self.sim_load_time,
                            sim_requests_gpus=self.sim_requests_gpus)


@dataclass(frozen=True)
class PolicySettings:
    """What tunings may make the operator reference (chart values ``policy.*``; see
    :mod:`chunktune.k8s.policy`)."""

    allowed_secrets: tuple[str, ...] = ()
    """Secret names any tuning may reference in its own namespace."""
    secret_opt_in_label: bool = False
    """Also allow Secrets labelled ``chunktune.dev/allow-reference: "true"`` (the operator then
    needs ``get`` on Secrets, to read their labels)."""
    allowed_registries: tuple[str, ...] = ()
    """Registries or repositories engine images must come from (``docker.io/vllm``,
    ``nvcr.io``); empty: any."""


@dataclass(frozen=True)
class LeaderSettings:
    """Leader election: with several operator replicas, the one holding a
    ``coordination.k8s.io/v1`` Lease runs the studies, the others wait to take over
    (:mod:`chunktune.k8s.leader`)."""

    enabled: bool = False
    lease_name: str = "chunktune-operator"
    lease_namespace: str = ""
    """Empty: the operator pod's namespace (``POD_NAMESPACE``, else the service account's),
    else ``default``."""
    identity: str = ""
    """Empty: the pod's name (``POD_NAME``, else the host name) and a random suffix."""
    lease_duration: float = 15.0
    """Seconds a standby waits, after the last renewal it saw, before it takes the Lease."""
    renew_deadline: float = 10.0
    """Seconds the leader may go without renewing before it exits (< lease_duration, so
    that it has stopped before a standby can take over)."""
    retry_period: float = 2.0
    """Seconds between renewals, and between a standby's tries."""


@dataclass(frozen=True)
class Settings:
    """Everything ``chunktune operator run`` is configured with."""

    namespaces: tuple[str, ...] = ()
    """Namespaces to watch; empty: the whole cluster."""
    state_dir: Path = DEFAULT_STATE_DIR
    """Where studies without ``spec.storage`` keep their journal
    (``<uid>.journal``, the resource's uid); mount a persistent volume here. ``spec.storage``
    journal paths are confined to it."""
    standalone: bool = False
    """Run without kopf's peering (one replica, no ``KopfPeering`` objects needed)."""
    liveness: str | None = None
    """kopf's liveness endpoint (``http://0.0.0.0:8080/healthz``)."""
    api_threads: int = 16
    """Threads for the (synchronous) Kubernetes client's calls."""
    api_retry_seconds: float = 30.0
    """How long transient API errors are retried in place (then the trial in flight waits
    for the API and is re-adopted; never recorded as a failure)."""
    api_timeout: float = 30.0
    """Seconds one Kubernetes API request may take."""
    api_outage_seconds: float = 600.0
    """How long kopf retries its own failed requests (watch streams, events) before it gives
    up on one; trials wait out any outage (they are re-adopted)."""
    allow_database_urls: bool = False
    """Allow RDB storage URLs in ``spec.storage`` (without a password) and
    ``spec.storageFrom`` (a Secret's key holding the URL). Off: only journal files confined to
    :attr:`state_dir`."""
    log_level: str = "INFO"
    metrics_address: str | None = None
    """``HOST:PORT`` of the operator's ``/metrics`` and ``/healthz`` (port 0: any free one)."""
    watch: WatchSettings = field(default_factory=WatchSettings)
    trials: TrialSettings = field(default_factory=TrialSettings)
    policy: PolicySettings = field(default_factory=PolicySettings)
    leader: LeaderSettings = field(default_factory=LeaderSettings)

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from ``CHUNKTUNE_*`` variables, then ``overrides`` (keyword arguments of
        :class:`Settings`, or ``trials=``/``watch=`` mappings of their fields). Raises
        :class:`SpecError` listing every bad value."""
        env = os.environ if env is None else env
        problems: list[tuple[str, str]] = []

        def get(name: str, parse: Callable[[str], T], default: T) -> T:
            raw = env.get(name)
            if raw is None:
                return default
            try:
                return parse(raw.strip())
            except ValueError as e:
                problems.append((name, str(e)))
                return default

        d = TrialSettings()
        trials = TrialSettings(
            image=get("CHUNKTUNE_IMAGE", _nonempty, None),
            image_pull_policy=get("CHUNKTUNE_IMAGE_PULL_POLICY", _pull_policy, None),
            service_account=get("CHUNKTUNE_TRIAL_SERVICE_ACCOUNT", _optional, None),
            shm_size=get("CHUNKTUNE_SHM_SIZE", _quantity, d.shm_size),
            sim_load_time=get("CHUNKTUNE_SIM_LOAD_TIME", _seconds_or_none, None),
            sim_requests_gpus=get("CHUNKTUNE_SIM_REQUEST_GPUS", _bool, False),
            poll_interval=get("CHUNKTUNE_POLL_INTERVAL", _positive, d.poll_interval),
            kv_sample_interval=get("CHUNKTUNE_KV_SAMPLE_INTERVAL", _positive,
                                   d.kv_sample_interval),
            keep_objects=get("CHUNKTUNE_KEEP_TRIAL_OBJECTS", _bool, False),
            prometheus_select_by=get("CHUNKTUNE_PROMETHEUS_SELECT_BY", _select_by, "pod"),
        )
        w = WatchSettings()
        watch = WatchSettings(
            server_timeout=get("CHUNKTUNE_WATCH_SERVER_TIMEOUT", _positive, w.server_timeout),
            client_timeout=get("CHUNKTUNE_WATCH_CLIENT_TIMEOUT", _positive, w.client_timeout))
        policy = PolicySettings(
            allowed_secrets=get("CHUNKTUNE_ALLOWED_SECRETS", _names, ()),
            secret_opt_in_label=get("CHUNKTUNE_SECRET_OPT_IN", _bool, False),
            allowed_registries=get("CHUNKTUNE_ALLOWED_REGISTRIES", _registries, ()))
        e = LeaderSettings()
        leader = LeaderSettings(
            enabled=get("CHUNKTUNE_LEADER_ELECT", _bool, False),
            lease_name=get("CHUNKTUNE_LEASE_NAME", _lease_name, e.lease_name),
            lease_namespace=get("CHUNKTUNE_LEASE_NAMESPACE", _optional, None) or "",
            identity=get("CHUNKTUNE_LEADER_IDENTITY", _optional, None) or "",
            lease_duration=get("CHUNKTUNE_LEASE_DURATION", _positive, e.lease_duration),
            renew_deadline=get("CHUNKTUNE_LEASE_RENEW_DEADLINE", _positive, e.renew_deadline),
            retry_period=get("CHUNKTUNE_LEASE_RETRY_PERIOD", _positive, e.retry_period))
        settings = cls(
            namespaces=get("CHUNKTUNE_NAMESPACES", _namespaces, ()),
            state_dir=get("CHUNKTUNE_STATE_DIR", lambda v: Path(_nonempty(v)),
                          DEFAULT_STATE_DIR),
            standalone=get("CHUNKTUNE_STANDALONE", _bool, False),
            liveness=get("CHUNKTUNE_LIVENESS", _optional, None),
            api_threads=get("CHUNKTUNE_API_THREADS", _count, 16),
            api_retry_seconds=get("CHUNKTUNE_API_RETRY_SECONDS", _non_negative, 30.0),
            api_timeout=get("CHUNKTUNE_API_TIMEOUT", _positive, 30.0),
            api_outage_seconds=get("CHUNKTUNE_API_OUTAGE_SECONDS", _non_negative, 600.0),
            allow_database_urls=get("CHUNKTUNE_ALLOW_DATABASE_URLS", _bool, False),
            log_level=get("CHUNKTUNE_LOG_LEVEL", _level, "INFO"),
            metrics_address=get("CHUNKTUNE_METRICS_ADDRESS", _optional, None),
            watch=watch, trials=trials, policy=policy, leader=leader)
        if problems:
            raise SpecError(problems)
        return settings.with_overrides(**overrides)

    def with_overrides(self, **overrides: Any) -> Settings:
        """A copy with fields replaced (``trials``/``watch`` may be mappings of fields);
        checked as :meth:`from_env` checks the environment."""
        nested: dict[str, Any] = {}
        for key in ("trials", "watch", "policy", "leader"):
            value = overrides.pop(key, None)
            if isinstance(value, Mapping):
                nested[key] = replace(getattr(self, key), **value)
            elif value is not None:
                nested[key] = value
        out = replace(self, **{k: v for k, v in overrides.items() if v is not None}, **nested)
        out.check()
        return out

    def check(self) -> None:
        problems: list[tuple[str, str]] = []
        if self.watch.client_timeout <= self.watch.server_timeout:
            problems.append(("CHUNKTUNE_WATCH_CLIENT_TIMEOUT",
                             f"must be larger than the server timeout "
                             f"({self.watch.client_timeout:g} <= {self.watch.server_timeout:g})"))
        for ns in self.namespaces:
            if not ns:
                problems.append(("--namespace", "must not be empty"))
        if self.liveness and not self.liveness.startswith(("http://", "https://")):
            problems.append(("--liveness", f"must be an http(s) URL (got {self.liveness!r})"))
        if self.trials.image is None:
            problems.append(("CHUNKTUNE_IMAGE", IMAGE_MISSING))
        if self.metrics_address is not None:
            try:
                split_address(self.metrics_address)
            except ValueError as e:
                problems.append(("--metrics-address", str(e)))
        le = self.leader
        if le.enabled and not le.lease_duration > le.renew_deadline > le.retry_period:
            problems.append(("CHUNKTUNE_LEASE_RENEW_DEADLINE", (
                f"must be below the lease duration and above the retry period (got duration "
                f"{le.lease_duration:g} s, renew deadline {le.renew_deadline:g} s, retry "
                f"period {le.retry_period:g} s): the leader must stop before a standby may "
                f"take over")))
        if problems:
            raise SpecError(problems)


# ---- parsers (raise ValueError with the message) ------------------------------------------------


def split_address(v: str) -> tuple[str, int]:
    """``HOST:PORT`` (``:PORT``: every interface) as ``(host, port)``."""
    host, sep, port = v.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"must be HOST:PORT, e.g. 0.0.0.0:8080 (got {v!r})")
    return host.strip("[]") or "0.0.0.0", int(port)


def _lease_name(v: str) -> str:
    from chunktune.api._types import check_object_name

    check_object_name(v, "Lease name")
    return v


def _nonempty(v: str) -> str:
    if not v:
        raise ValueError("must not be empty")
    return v


def _optional(v: str) -> str | None:
    return v or None


def _bool(v: str) -> bool:
    if v.lower() in _TRUE:
        return True
    if v.lower() in _FALSE:
        return False
    raise ValueError(f"must be true or false (got {v!r})")


def _positive(v: str) -> float:
    try:
        x = float(v)
    except ValueError as e:
        raise ValueError(f"must be a number of seconds (got {v!r})") from e
    if not x > 0:
        raise ValueError(f"must be > 0 (got {v!r})")
    return x


def _non_negative(v: str) -> float:
    try:
        x = float(v)
    except ValueError as e:
        raise ValueError(f"must be a number of seconds (got {v!r})") from e
    if not x >= 0:
        raise ValueError(f"must be >= 0 (got {v!r})")
    return x


def _seconds_or_none(v: str) -> float | None:
    if not v:
        return None
    try:
        x = float(v)
    except ValueError as e:
        raise ValueError(f"must be a number of seconds (got {v!r})") from e
    if x < 0:
        raise ValueError(f"must be >= 0 (got {v!r})")
    return x


def _count(v: str) -> int:
    if not v.isdigit() or int(v) < 1:
        raise ValueError(f"must be a whole number >= 1 (got {v!r})")
    return int(v)


def _namespaces(v: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in v.split(",") if n.strip())


def _names(v: str) -> tuple[str, ...]:
    from chunktune.api._types import check_object_name

    out = tuple(n.strip() for n in v.split(",") if n.strip())
    for n in out:
        check_object_name(n, "Secret name")
    return out


def _registries(v: str) -> tuple[str, ...]:
    import re

    out = tuple(n.strip().rstrip("/") for n in v.split(",") if n.strip())
    for n in out:
        if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?"
                            r"(/[a-z0-9]+([._-]+[a-z0-9]+)*)*", n):
            raise ValueError(f"must be registries or repositories such as docker.io/vllm or "
                             f"nvcr.io, separated by commas (got {n!r})")
    return out


def _pull_policy(v: str) -> str | None:
    if not v:
        return None
    if v not in ("Always", "IfNotPresent", "Never"):
        raise ValueError(f"must be Always, IfNotPresent or Never (got {v!r})")
    return v


def _quantity(v: str) -> str:
    from chunktune.api._types import QUANTITY_RE

    if not QUANTITY_RE.fullmatch(v):
        raise ValueError(f"must be a Kubernetes quantity such as 8Gi (got {v!r})")
    return v


def _select_by(v: str) -> str:
    if v not in ("pod", "instance"):
        raise ValueError(f"must be pod or instance (got {v!r})")
    return v


def _level(v: str) -> str:
    name = v.upper()
    if not isinstance(logging.getLevelName(name), int):
        raise ValueError(f"must be DEBUG, INFO, WARNING or ERROR (got {v!r})")
    return name


__all__ = ["DEFAULT_STATE_DIR", "LeaderSettings", "PolicySettings", "Settings", "TrialSettings",
           "WatchSettings", "split_address"]
