"""Noise checks: whether a trial's latencies were set by the host rather than by the engine,
and what clients would have seen without the host's share.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from chunktune.core.steps import host_added
from chunktune.core.study_records import TrialRecord
from chunktune.core.trials import TrialState


def host_disturbed(t: TrialRecord) -> bool:
    """The trial's latencies were set outside the engine and its own ITL does not explain
    them (:func:`~chunktune.core.steps.host_added`)."""
    return host_added(t.metrics, t.itl_band) is not None


def engine_estimate(trials: Sequence[TrialRecord], runs: Sequence[TrialRecord],
                    key: str) -> float | None:
    """What clients would have seen of ``key`` (a clients' ITL p99: ``itl_p99`` or a class's)
    in ``runs`` without the host's share: the mean of their ``engine_itl_p99`` times the median
    ratio of ``key`` to ``engine_itl_p99`` over the study's completed ``trials`` the host did
    not disturb (None for another metric, or with no such trial). On the CPU example that
    ratio is 1.05-1.2 (the API server's and the client's share of an undisturbed run)."""
    if not key.endswith("itl_p99") or key.endswith("engine_itl_p99"):
        return None
    engine = [r.metrics["engine_itl_p99"] for r in runs if "engine_itl_p99" in r.metrics]
    ratios = [t.metrics[key] / t.metrics["engine_itl_p99"] for t in trials
              if t.state == TrialState.COMPLETE and not host_disturbed(t)
              and key in t.metrics and t.metrics.get("engine_itl_p99", 0.0) > 0]
    if not engine or not ratios:
        return None
    return statistics.fmean(engine) * statistics.median(ratios)
