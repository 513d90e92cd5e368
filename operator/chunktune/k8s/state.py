"""What the operator's handlers share, and the per-resource status writer.

:class:`Operator` holds the settings, the API wrapper and per-resource state kept in memory
(status writers, daemon-exit flags) — nothing that a restart would lose, since everything the
study needs lives in its storage and the resource's status. :class:`StatusWriter` is the only
writer of a resource's status: ``render_status(summary(collect(study)))`` plus the fields the
renderer takes as inputs (phase, conditions, times, message), patched serially as a merge patch
that also drops fields the renderer no longer gives. :func:`parse` reads a resource into the
validated model, or every problem with its field path.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from chunktune.api.reader import parse_manifest, validate
from chunktune.api.status import render_status, set_condition
from chunktune.api.v1alpha1 import ChunkedPrefillTuning
from chunktune.backends import manifests as mf
from chunktune.backends.cluster import ClusterApiError
from chunktune.backends.kubernetes import BackendSettings, KubernetesBackend
from chunktune.core.errors import SpecError
from chunktune.core.study_records import StudySummary
from chunktune.k8s import locations
from chunktune.k8s.kube import KubeApi
from chunktune.k8s.operator_metrics import OperatorMetrics
from chunktune.k8s.settings import Settings
from chunktune.tuning import study as st
from chunktune.tuning import workload_source
from chunktune.tuning.results.model import collect, summary
from chunktune.tuning.runner import cost_model
from chunktune.tuning.tuner import Tuner

log = logging.getLogger(__name__)
Problem = tuple[str, str]
#: Tries of a status patch that meets conflicts (409), each after a fresh read.
CONFLICT_RETRIES = 8
TERMINAL = ("Succeeded", "Failed")


def generation(body: Mapping[str, Any]) -> int:
    return int((body.get("metadata") or {}).get("generation") or 1)


def owner_of(body: Mapping[str, Any]) -> mf.Owner:
    meta = body.get("metadata") or {}
    return mf.Owner(name=str(meta["name"]), namespace=str(meta.get("namespace") or "default"),
                    uid=str(meta.get("uid") or ""),
                    api_version=str(body.get("apiVersion") or "chunktune.dev/v1alpha1"))


def parse(body: Mapping[str, Any], trace_data: str | None = None
          ) -> tuple[ChunkedPrefillTuning | None, list[Problem]]:
    """The resource as a validated model, or every problem with its field path;
    ``trace_data``: the text of its ``spec.workload.trace.configMapKeyRef``, once read."""
    meta = body.get("metadata") or {}
    raw = {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
           "metadata": {k: meta[k] for k in ("name", "namespace", "generation") if k in meta},
           "spec": _plain(body.get("spec"))}
    problems = validate(raw, trace_data=trace_data)
    if problems:
        return None, problems
    tuning = parse_manifest(raw, trace_data=trace_data)
    if tuning.spec.engine.kind == "sglang":
        return None, [("spec.engine.kind", "the operator cannot run sglang engines yet; use "
                                           "vllm or sim")]
    return tuning, []


def problems_text(problems: list[Problem]) -> str:
    return "; ".join(f"{p} {m}" if p else m for p, m in problems)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``: ``new``, with None for
    every key of ``old`` it lacks, in nested mappings too (lists are replaced whole)."""
    out = dict(new)
    for key, was in old.items():
        if key not in new:
            out[key] = None
        elif isinstance(was, Mapping) and isinstance(new[key], Mapping):
            out[key] = merge_patch(was, new[key])
    return out


def utc_now() -> datetime:
    """Now, in UTC (conditions' ``lastTransitionTime``)."""
    return datetime.now(tz=UTC)


def timestamp(when: datetime | None = None) -> str:
    """``when`` (default: now) as the status writes times: RFC 3339 in UTC, to the second."""
    return (when or utc_now()).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Operator:
    """What every handler shares: settings, the API, and per-resource state in memory
    (status writers, daemon exit flags) — nothing that would be lost on a restart."""

    settings: Settings
    api: KubeApi
    writers: dict[str, StatusWriter] = field(default_factory=dict)
    exited: dict[str, asyncio.Event] = field(default_factory=dict)
    backends: list[KubernetesBackend] = field(default_factory=list)
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    #: Set when kopf stops (its cleanup activity): a daemon kopf spawned after its daemon
    #: killer had run is never signalled by kopf, and exits on this instead.
    exiting: asyncio.Event = field(default_factory=asyncio.Event)

    async def storage(self, tuning: ChunkedPrefillTuning, owner: mf.Owner) -> str:
        """The study's storage (:mod:`chunktune.k8s.locations`): its uid's journal, a confined
        ``spec.storage``, the URL in ``spec.storageFrom``'s Secret, or both: the database
        URL in ``spec.storage`` with the password in the Secret. Raises
        :class:`SpecError` naming the field and the fix."""
        spec = tuning.spec
        state_dir = self.settings.state_dir
        secret_url = None
        if spec.storage_from is not None:
            ref = spec.storage_from.secret_key_ref
            if not self.settings.allow_database_urls:
                raise SpecError(f"database URLs are not allowed by this operator: "
                                f"{locations.ALLOW_HINT}", field="spec.storageFrom")
            try:
                secret = await self.api.get("secrets", owner.namespace, ref.name)
            except ClusterApiError as e:
                if e.status != 403:
                    raise
                raise SpecError(f"the operator may not read Secret {ref.name!r} ({e.message}); "
                                "the chart grants get on Secrets with "
                                "storage.allowDatabaseURLs=true",
                                field="spec.storageFrom.secretKeyRef") from e
            secret_url = locations.secret_value(secret, ref.name, ref.key)
            if spec.storage is not None:  # the URL in the spec, the password in the Secret
                secret_url = locations.with_password(spec.storage, secret_url)
        if spec.storage is None and spec.storage_from is None:
            await asyncio.to_thread(locations.adopt_legacy, state_dir, owner.namespace,
                                    owner.name, owner.uid)
        return locations.resolve(spec.storage, state_dir, owner.uid,
                               allow_database_urls=self.settings.allow_database_urls,
                               from_secret=secret_url)

    def writer(self, body: Mapping[str, Any]) -> StatusWriter:
        owner = owner_of(body)
        if owner.uid not in self.writers:
            self.writers[owner.uid] = StatusWriter(self.api, owner,
                                                   dict(body.get("status") or {}),
                                                   metrics=self.metrics)
        return self.writers[owner.uid]

    def backend(self, tuning: ChunkedPrefillTuning, owner: mf.Owner,
                steps_dir: Path | None = None) -> KubernetesBackend:
        """The study's trial backend; ``steps_dir``: where it keeps the engines' step logs
        (:func:`chunktune.k8s.locations.steps_dir`)."""
        s = self.settings.trials
        spec = tuning.spec
        resources = (spec.engine.resources.model_dump(mode="json", exclude_none=True)
                     if spec.engine.resources else None)
        return KubernetesBackend(self.api, owner, BackendSettings(
            options=s.options(), poll_interval=s.poll_interval,
            kv_sample_interval=spec.metrics.scrape_interval or s.kv_sample_interval,
            keep_objects=s.keep_objects, prometheus_url=spec.metrics.prometheus_url,
            prometheus_select_by=s.prometheus_select_by,
            prometheus_delay=spec.metrics.scrape_interval or 15.0,
            trial_timeout=spec.budget.trial_timeout, steps_dir=steps_dir),
            resources=resources,
            security=(spec.engine.security_context.model_dump(mode="json", by_alias=True,
                                                              exclude_none=True)
                      if spec.engine.security_context else None))

    def check_study(self, tuning: ChunkedPrefillTuning, url: str) -> None:
        """Create or open the study in storage ``url`` (raises :class:`SpecError` if the
        storage holds this study with another search)."""
        from chunktune.tuning.objectives import ObjectiveDef

        directions = [ObjectiveDef.from_spec(o).direction for o in tuning.spec.objectives]
        st.open_study(tuning, st.open_storage(url), directions,
                      st.make_sampler(tuning, len(directions), bool(tuning.spec.constraints)),
                      st.make_pruner(tuning, len(directions)))

    def forget(self, uid: str) -> None:
        writer = self.writers.pop(uid, None)
        self.exited.pop(uid, None)
        if writer is not None:
            self.metrics.forget(writer.owner.namespace, writer.owner.name)


class StatusWriter:
    """Serialised status patches of one resource, and the status fields the renderer does not
    know (conditions, times, phase, message)."""

    def __init__(self, api: KubeApi, owner: mf.Owner, current: dict[str, Any],
                 metrics: OperatorMetrics | None = None) -> None:
        self.api = api
        self.owner = owner
        self.metrics = metrics
        """Sees every status rendered (the study's gauges)."""
        self.last = current
        self.phase: str | None = current.get("phase")
        self.conditions: list[dict[str, Any]] = list(current.get("conditions") or [])
        self.start_time: str | None = current.get("startTime")
        self.completion_time: str | None = current.get("completionTime")
        self.message: str | None = current.get("message")
        self.generation: int | None = current.get("observedGeneration")
        self.retune: dict[str, Any] | None = current.get("retune")
        """``status.retune`` (:mod:`chunktune.k8s.retuner` keeps it)."""
        self.lock = asyncio.Lock()
        self.pending = False
        """A phase was set that no successful write has carried yet."""

    def set(self, phase: str, generation: int, message: str | None = None,
            **conditions: tuple[bool, str, str]) -> None:
        """Phase, message and conditions (``Type=(status, reason, message)``)."""
        now = utc_now()
        self.pending = True
        self.phase, self.generation, self.message = phase, generation, message
        for kind, (ok, reason, text) in conditions.items():
            self.conditions = set_condition(self.conditions, kind, ok, reason, text,
                                            generation, now)
        if phase == "Running" and not self.start_time:
            self.start_time = timestamp(now)
        if phase in TERMINAL:
            self.completion_time = self.completion_time or timestamp(now)
        else:
            self.completion_time = None

    def condition(self, kind: str, ok: bool, reason: str, message: str, generation: int, *,
                  by_message: bool = False) -> bool:
        """Set one condition, leaving the phase alone (written with the next write); returns
        whether it changed: it is new, or its status or reason differ (with ``by_message``,
        its message too), which is when an event says so. The one place a condition is set
        apart from a phase (:meth:`set`)."""
        was = self.condition_of(kind)
        self.conditions = set_condition(self.conditions, kind, ok, reason, message,
                                        generation, utc_now())
        if was is None:
            return True
        return was.get("status") != ("True" if ok else "False") or \
            was.get("reason") != reason or (by_message and was.get("message") != message)

    def condition_of(self, kind: str) -> dict[str, Any] | None:
        """Condition ``kind`` as it is now (None: never set)."""
        return next((c for c in self.conditions if c.get("type") == kind), None)

    def condition_status(self, kind: str) -> str | None:
        c = self.condition_of(kind)
        return None if c is None else str(c.get("status"))

    def render(self, tuner: Tuner | None) -> dict[str, Any]:
        kw: dict[str, Any] = {"conditions": self.conditions, "observed_generation":
                              self.generation, "start_time": self.start_time,
                              "completion_time": self.completion_time, "message": self.message,
                              "retune": self.retune}
        if tuner is None:
            return render_status(StudySummary(phase=self.phase or "Pending", **kw))
        results = collect(tuner.study, tuner.objectives, tuner.constraints)
        twin = tuner.strategy.status()
        if twin is not None:
            kw["twin"] = twin
        kw["cost_model"] = cost_model(tuner.tuning, tuner.context.model)
        kw["workload"] = workload_source.status_of(tuner.derived)
        return render_status(summary(results, self.phase or "Pending",
                                     tuner.spec.budget.max_trials, **kw))

    async def write_conditions(self) -> None:
        """Patch the conditions alone (when the study cannot be read to render the rest)."""
        async with self.lock:
            if self.last.get("conditions") == self.conditions:
                return
            await self.api.patch_tuning_status(self.owner.namespace, self.owner.name,
                                               {"conditions": self.conditions})
            self.last = {**self.last, "conditions": self.conditions}

    async def write(self, tuner: Tuner | None = None) -> None:
        """Patch the status; a conflict (409) is retried in place after a fresh read of the
        resource (what the merge patch drops is computed from what is really there), with
        jittered backoff, :data:`CONFLICT_RETRIES` times; transient errors are retried by
        the API wrapper. :attr:`pending` stays True until a write succeeds."""
        async with self.lock:
            status = self.render(tuner)
            if self.metrics is not None:
                self.metrics.observe_status(
                    self.owner.namespace, self.owner.name, status,
                    [(o.key, o.direction) for o in tuner.objectives] if tuner else ())
            delay = 0.1
            for attempt in range(1, CONFLICT_RETRIES + 1):
                # merge patch: drop what the renderer no longer gives, at any depth
                patch = merge_patch(self.last, status)
                if status == self.last:
                    self.pending = False
                    return
                try:
                    await self.api.patch_tuning_status(self.owner.namespace, self.owner.name,
                                                       patch)
                except ClusterApiError as e:
                    if e.status != 409 or attempt == CONFLICT_RETRIES:
                        raise
                    log.warning("status of %s/%s: conflict (%s); retry %d after a fresh read",
                                self.owner.namespace, self.owner.name, e.message, attempt)
                    await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                    delay = min(2.0, delay * 2)
                    fresh = await self.api.get_tuning(self.owner.namespace, self.owner.name)
                    if fresh is None:
                        self.pending = False
                        return  # deleted meanwhile
                    self.last = dict(fresh.get("status") or {})
                    continue
                self.last = status
                self.pending = False
                return


__all__ = ["CONFLICT_RETRIES", "TERMINAL", "Operator", "Problem", "StatusWriter", "generation",
           "merge_patch", "owner_of", "parse", "problems_text", "timestamp", "utc_now"]
