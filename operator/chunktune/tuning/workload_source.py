"""The profile a study replays when ``spec.workload.fromPrometheus`` derives it: derived once,
when the study starts, and kept in the study.

:func:`resolve` reads the derived workload from the study's user attribute
:data:`ATTR_WORKLOAD` (what a restarted process, or a re-tune that derived it already, finds),
or derives it now from Prometheus (:meth:`~chunktune.metrics.client.PrometheusClient.
observe_workload`, :func:`~chunktune.metrics.derive.derive`) and stores it there; either way
every trial of the study replays the same profile. Other workloads resolve as the spec says.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import optuna

from chunktune.api.v1alpha1 import ChunkedPrefillTuning, FromPrometheus
from chunktune.core.workload import DERIVED_DURATION, Profile, parse_profile
from chunktune.metrics.client import PrometheusClient
from chunktune.metrics.derive import DerivedWorkload, Observation, derive

#: Study user attribute: :meth:`DerivedWorkload.to_dict` of the workload the study replays.
ATTR_WORKLOAD = "chunktune_workload"
#: Seconds per Prometheus query.
QUERY_TIMEOUT = 30.0


def observe(source: FromPrometheus, window: float | None = None,
            latency: tuple[str, ...] = ()) -> Observation:
    """Read the deployment's histograms (blocking). Raises
    :class:`~chunktune.metrics.derive.WorkloadUnavailable` naming the selector."""
    client = PrometheusClient(source.url, timeout=QUERY_TIMEOUT)
    try:
        return client.observe_workload(source.selector, window or source.window,
                                       peak_window=source.peak_window, latency=latency)
    finally:
        asyncio.run(client.close())


def derive_for(tuning: ChunkedPrefillTuning, obs: Observation) -> DerivedWorkload:
    """The profile the study replays from an observation: the spec's ``fromPrometheus``
    options, its duration and seed (its overrides apply on top, :meth:`WorkloadSpec.resolve`)."""
    w = tuning.spec.workload
    source = w.from_prometheus
    assert source is not None
    return derive(obs, long_threshold=source.long_prompt_tokens, rate_from=source.rate,
                  duration=w.duration or DERIVED_DURATION, warmup=w.warmup,
                  seed=w.seed or 0, name=f"{tuning.metadata.name}-derived")


def resolve(tuning: ChunkedPrefillTuning,
            study: optuna.Study) -> tuple[Profile, Mapping[str, Any] | None]:
    """The study's profile, and the derived workload's record (None unless
    ``fromPrometheus``). Blocks while it derives; raises
    :class:`~chunktune.metrics.derive.WorkloadUnavailable`."""
    w = tuning.spec.workload
    if w.from_prometheus is None:
        return w.resolve(), None
    stored = study.user_attrs.get(ATTR_WORKLOAD)
    if stored is None and w.derived is not None:
        return w.resolve(), None  # a copy of a tuning that has it (a twin's search study)
    if stored is None:
        stored = derive_for(tuning, observe(w.from_prometheus)).to_dict()
        study.set_user_attr(ATTR_WORKLOAD, stored)
    w.use_derived(parse_profile(stored["profile"], source="spec.workload.fromPrometheus"))
    return w.resolve(), stored


def status_of(stored: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The ``status.workload`` fields of a stored derived workload."""
    if not stored:
        return None
    return {**stored.get("source", {}), **stored.get("stats", {})}


__all__ = ["ATTR_WORKLOAD", "derive_for", "observe", "resolve", "status_of"]
