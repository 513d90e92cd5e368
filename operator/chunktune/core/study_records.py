"""A study's trials as the tuner saw them: :class:`TrialRecord` (one trial) and
:class:`StudySummary` (the study), plain dataclasses with no Optuna types.

:mod:`chunktune.tuning.results.model` fills them from the study's trials; the status renderer
(:func:`chunktune.api.status.render_status`), the result files, the plots, the twin's trust
check and the re-tune read them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from chunktune.core.trials import TrialState

__all__ = ["DEFAULT_TRIALS_LIMIT", "StudySummary", "TrialRecord"]

#: How many trials the status lists by default (the counts cover all of them).
DEFAULT_TRIALS_LIMIT = 50


@dataclass(frozen=True)
class TrialRecord:
    """One trial as the tuner saw it."""

    number: int
    params: Mapping[str, int | float]
    state: TrialState
    reason: str | None = None
    """Why a trial failed, was pruned or skipped (``EngineOOM``, ``SLOViolated``, ...)."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Measured values by metric key (``ttft_p99``, ``chat.itl_p99``)."""
    constraints_ok: bool = True
    phase: str | None = None
    """Twin-first studies: the phase that ran the trial (``calibrate``, ``confirm``,
    ``fallback``)."""
    predicted: Mapping[str, float] = field(default_factory=dict)
    """Twin-first studies: the twin's prediction of ``metrics`` for a confirmed trial."""
    itl_band: tuple[float, float] | None = None
    """Trials with a step log: the engine's ITL half a percentile either side of its p99,
    seconds (:func:`chunktune.core.steps.itl_band`)."""
    repeats: tuple[int, ...] = ()
    """A configuration measured more than once (a ``recheck``): the numbers of every trial
    that measured it, ``metrics`` then being the mean of those not in :attr:`noisy`; empty for
    one measurement."""
    noisy: tuple[int, ...] = ()
    """Of :attr:`repeats`, the measurements left out of the mean: flagged as set outside the
    engine (:func:`chunktune.core.steps.outside_engine`) while another measurement was not."""
    peak: Mapping[str, int] = field(default_factory=dict)
    """Trials with a step log: the most the engine's busiest step used of each limit flag
    (:data:`chunktune.core.steps.LIMIT_USE`: ``max-num-seqs`` -> requests in one step,
    ``max-num-batched-tokens`` -> tokens in one step)."""


@dataclass(frozen=True)
class StudySummary:
    """Everything :func:`chunktune.api.status.render_status` needs."""

    phase: str
    """One of :data:`chunktune.api.status.PHASES`."""
    trials: Sequence[TrialRecord] = ()
    objectives: Sequence[tuple[str, str]] = (("ttft_p99", "minimize"),)
    """``(metric key, direction)`` per objective, in spec order (``Objective.key``)."""
    baseline: int | None = None
    """Number of the baseline trial (the engine's defaults), if one ran."""
    best: int | None = None
    """Number of the best feasible trial (single objective)."""
    pareto: Sequence[int] = ()
    """Numbers of the Pareto-optimal trials (several objectives)."""
    max_trials: int | None = None
    key_metrics: Sequence[str] = ()
    """Metric keys each listed trial keeps besides the objectives (e.g. the constraints')."""
    conditions: Sequence[Mapping[str, Any]] = ()
    observed_generation: int | None = None
    start_time: datetime | str | None = None
    completion_time: datetime | str | None = None
    message: str | None = None
    trials_limit: int = DEFAULT_TRIALS_LIMIT
    twin: Mapping[str, Any] | None = None
    """Twin-first studies: the :class:`chunktune.api.status.TwinStatus` fields (phase, round,
    counts, error)."""
    cost_model: str | None = None
    """Simulated and twin-first studies: what the simulator's step-time model for the study's
    GPU was fitted on (``chunktune.sim.cost.provenance``)."""
    merged: Mapping[int, TrialRecord] = field(default_factory=dict)
    """Configurations measured more than once, by the number of each trial that measured
    them: one record with their mean (:attr:`TrialRecord.repeats`), which the baseline, the
    best and the Pareto front show instead of the single trial."""
    workload: Mapping[str, Any] | None = None
    """A workload derived from Prometheus: the :class:`chunktune.api.status.WorkloadStatus`
    fields."""
    retune: Mapping[str, Any] | None = None
    """``spec.retune``: the :class:`chunktune.api.status.RetuneStatus` fields."""
