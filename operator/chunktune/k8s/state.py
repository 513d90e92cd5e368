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
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from chunktune.api.status import StudySummary, render_status, set_condition
from chunktune.api.v1alpha1 import ChunkedPrefillTuning
from chunktune.api.validation import parse_manifest, validate
from chunktune.backends import manifests as mf
from chunktune.backends.kubernetes import BackendSettings, KubernetesBackend
from chunktune.k8s.kube import KubeApi
from chunktune.k8s.settings import Settings
from chunktune.tuning import study as st
from chunktune.tuning.results import collect, summary
from chunktune.tuning.runner import Tuner

Problem = tuple[str, str]
TERMINAL = ("Succeeded", "Failed")


def generation(body: Mapping[str, Any]) -> int:
    return int((body.get("metadata") or {}).get("generation") or 1)


def owner_of(body: Mapping[str, Any]) -> mf.Owner:
    meta = body.get("metadata") or {}
    return mf.Owner(name=str(meta["name"]), namespace=str(meta.get("namespace") or "default"),
                    uid=str(meta.get("uid") or ""),
                    api_version=str(body.get("apiVersion") or "chunktune.dev/v1alpha1"))


def parse(body: Mapping[str, Any]) -> tuple[ChunkedPrefillTuning | None, list[Problem]]:
    """The resource as a validated model, or every problem with its field path."""
    meta = body.get("metadata") or {}
    raw = {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
           "metadata": {k: meta[k] for k in ("name", "namespace", "generation") if k in meta},
           "spec": _plain(body.get("spec"))}
    problems = validate(raw)
    if problems:
        return None, problems
    tuning = parse_manifest(raw)
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


def _now() -> datetime:
    return datetime.now(tz=UTC)

@dataclass
class Operator:
    """What every handler shares: settings, the API, and per-resource state in memory
    (status writers, daemon exit flags) — nothing that would be lost on a restart."""

    settings: Settings
    api: KubeApi
    writers: dict[str, StatusWriter] = field(default_factory=dict)
    exited: dict[str, asyncio.Event] = field(default_factory=dict)
    backends: list[KubernetesBackend] = field(default_factory=list)

    def storage(self, tuning: ChunkedPrefillTuning) -> str:
        return st.storage_url(tuning, default_dir=self.settings.state_dir)

    def writer(self, body: Mapping[str, Any]) -> StatusWriter:
        owner = owner_of(body)
        if owner.uid not in self.writers:
            self.writers[owner.uid] = StatusWriter(self.api, owner,
                                                   dict(body.get("status") or {}))
        return self.writers[owner.uid]

    def backend(self, tuning: ChunkedPrefillTuning, owner: mf.Owner) -> KubernetesBackend:
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
            trial_timeout=spec.budget.trial_timeout), resources=resources,
            security=(spec.engine.security_context.model_dump(mode="json", by_alias=True,
                                                              exclude_none=True)
                      if spec.engine.security_context else None))

    def check_study(self, tuning: ChunkedPrefillTuning) -> None:
        """Create or open the study (raises :class:`SpecError` if the storage holds this
        study with another search)."""
        from chunktune.tuning.objectives import ObjectiveDef

        directions = [ObjectiveDef.from_spec(o).direction for o in tuning.spec.objectives]
        st.open_study(tuning, st.open_storage(self.storage(tuning)), directions,
                      st.make_sampler(tuning, len(directions), bool(tuning.spec.constraints)),
                      st.make_pruner(tuning, len(directions)))

    def forget(self, uid: str) -> None:
        self.writers.pop(uid, None)
        self.exited.pop(uid, None)


class StatusWriter:
    """Serialised status patches of one resource, and the status fields the renderer does not
    know (conditions, times, phase, message)."""

    def __init__(self, api: KubeApi, owner: mf.Owner, current: dict[str, Any]) -> None:
        self.api = api
        self.owner = owner
        self.last = current
        self.phase: str | None = current.get("phase")
        self.conditions: list[dict[str, Any]] = list(current.get("conditions") or [])
        self.start_time: str | None = current.get("startTime")
        self.completion_time: str | None = current.get("completionTime")
        self.message: str | None = current.get("message")
        self.generation: int | None = current.get("observedGeneration")
        self.lock = asyncio.Lock()

    def set(self, phase: str, generation: int, message: str | None = None,
            **conditions: tuple[bool, str, str]) -> None:
        """Phase, message and conditions (``Type=(status, reason, message)``)."""
        now = _now()
        self.phase, self.generation, self.message = phase, generation, message
        for kind, (ok, reason, text) in conditions.items():
            self.conditions = set_condition(self.conditions, kind, ok, reason, text,
                                            generation, now)
        if phase == "Running" and not self.start_time:
            self.start_time = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        if phase in TERMINAL:
            self.completion_time = self.completion_time or now.strftime("%Y-%m-%dT%H:%M:%SZ")
        else:
            self.completion_time = None

    def render(self, tuner: Tuner | None) -> dict[str, Any]:
        kw: dict[str, Any] = {"conditions": self.conditions, "observed_generation":
                              self.generation, "start_time": self.start_time,
                              "completion_time": self.completion_time, "message": self.message}
        if tuner is None:
            return render_status(StudySummary(phase=self.phase or "Pending", **kw))
        results = collect(tuner.study, tuner.objectives, tuner.constraints)
        return render_status(summary(results, self.phase or "Pending",
                                     tuner.spec.budget.max_trials, **kw))

    async def write(self, tuner: Tuner | None = None) -> None:
        async with self.lock:
            status = self.render(tuner)
            patch: dict[str, Any] = dict(status)
            for key in self.last:
                if key not in status:
                    patch[key] = None  # merge patch: drop what the renderer no longer gives
            if patch == self.last:
                return
            await self.api.patch_tuning_status(self.owner.namespace, self.owner.name, patch)
            self.last = status


__all__ = ["TERMINAL", "Operator", "Problem", "StatusWriter", "generation", "owner_of", "parse",
           "problems_text"]
