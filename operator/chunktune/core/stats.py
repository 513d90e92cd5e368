"""Pure percentile arithmetic for latency samples (no numpy needed, same numbers as numpy).

:func:`percentile` is numpy's default ``method="linear"`` (type 7 of Hyndman and Fan): for
``n`` sorted samples the q-th percentile sits at rank ``h = (n - 1) * q / 100`` and is
interpolated linearly between the samples either side of it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["PERCENTILES", "MetricStats", "hit_rate", "percentile", "percentiles", "summarize",
           "weighted_percentile"]

#: The percentiles every summary reports.
PERCENTILES = (50.0, 90.0, 95.0, 99.0)


def _at(sorted_values: Sequence[float], q: float) -> float:
    if not 0.0 <= q <= 100.0 or math.isnan(q):
        raise ValueError(f"percentile must be within [0, 100] (got {q})")
    n = len(sorted_values)
    h = (n - 1) * q / 100.0
    lo = math.floor(h)
    hi = min(lo + 1, n - 1)
    a, b = sorted_values[lo], sorted_values[hi]
    return a + (h - lo) * (b - a)


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, as ``numpy.percentile(values, q)``.

    Raises ``ValueError`` for an empty input or ``q`` outside [0, 100].
    """
    s = sorted(values)
    if not s:
        raise ValueError("percentile of no values")
    return _at(s, q)


def percentiles(values: Iterable[float], qs: Sequence[float] = PERCENTILES) -> list[float]:
    """Several percentiles with one sort."""
    s = sorted(values)
    if not s:
        raise ValueError("percentile of no values")
    return [_at(s, q) for q in qs]


def weighted_percentile(values: Sequence[float], weights: Sequence[float], q: float,
                        ) -> float | None:
    """The ``q``-th percentile (0-100) of ``values`` where value ``i`` counts ``weights[i]``
    times: the smallest value whose cumulative weight reaches ``q`` % of the total (no
    interpolation). None when the weights sum to 0. Raises ``ValueError`` for ``q`` outside
    [0, 100] or lengths that differ."""
    if not 0.0 <= q <= 100.0 or math.isnan(q):
        raise ValueError(f"percentile must be within [0, 100] (got {q})")
    if len(values) != len(weights):
        raise ValueError(f"{len(values)} values but {len(weights)} weights")
    pairs = sorted((v, w) for v, w in zip(values, weights, strict=True) if w > 0)
    total = sum(w for _, w in pairs)
    if total <= 0:
        return None
    need = total * q / 100.0
    acc = 0.0
    for v, w in pairs:
        acc += w
        if acc >= need:
            return v
    return pairs[-1][0]


@dataclass(frozen=True)
class MetricStats:
    """Distribution of one latency metric, in seconds."""

    count: int
    mean: float
    min: float
    p50: float
    p90: float
    p95: float
    p99: float
    max: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MetricStats:
        return cls(count=int(d["count"]), **{k: float(d[k]) for k in
                                            ("mean", "min", "p50", "p90", "p95", "p99", "max")})


def summarize(values: Iterable[float]) -> MetricStats | None:
    """Count, mean, min, p50/p90/p95/p99 and max of ``values``; ``None`` when there are none."""
    s = sorted(values)
    if not s:
        return None
    p50, p90, p95, p99 = (_at(s, q) for q in PERCENTILES)
    return MetricStats(count=len(s), mean=math.fsum(s) / len(s), min=s[0], p50=p50, p90=p90,
                       p95=p95, p99=p99, max=s[-1])


def hit_rate(queries: float | None, hits: float | None) -> float | None:
    """The share of looked-up tokens a cache found (``hits / queries``, within 0..1), or None
    where nothing was looked up (the prefix cache off): not a rate of 0."""
    if not queries or hits is None:
        return None
    return min(1.0, max(0.0, hits / queries))
