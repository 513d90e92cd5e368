"""Percentiles: the same numbers as numpy's default (linear) method."""

from __future__ import annotations

import random

import numpy as np
import pytest

from chunktune.core.stats import MetricStats, percentile, percentiles, summarize


@pytest.mark.parametrize("n", [1, 2, 3, 7, 100, 1001])
def test_percentile_matches_numpy(n: int) -> None:
    rng = random.Random(n)
    values = [rng.lognormvariate(0, 1) for _ in range(n)]
    for q in (0, 1, 25, 50, 90, 95, 99, 99.9, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)),
                                                      rel=1e-12, abs=1e-15)


def test_percentile_with_ties_and_order() -> None:
    values = [5.0, 1.0, 1.0, 3.0, 5.0, 5.0]
    assert percentile(values, 50) == float(np.percentile(values, 50))
    assert percentiles(values, [10, 90]) == [float(np.percentile(values, q)) for q in (10, 90)]


def test_percentile_errors() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)
    with pytest.raises(ValueError):
        percentile([1.0], -1)


def test_summarize() -> None:
    assert summarize([]) is None
    values = [0.1, 0.4, 0.2, 0.3]
    s = summarize(values)
    assert s is not None
    assert s.count == 4 and s.min == 0.1 and s.max == 0.4
    assert s.mean == pytest.approx(0.25)
    for q, got in ((50, s.p50), (90, s.p90), (95, s.p95), (99, s.p99)):
        assert got == pytest.approx(float(np.percentile(values, q)))
    assert MetricStats.from_dict(s.to_dict()) == s


def test_weighted_percentile_counts_each_value_by_its_weight() -> None:
    from chunktune.core.stats import weighted_percentile

    assert weighted_percentile([1.0, 2.0, 3.0], [1, 1, 1], 50) == 2.0
    assert weighted_percentile([3.0, 1.0], [1, 9], 90) == 1.0
    assert weighted_percentile([3.0, 1.0], [1, 9], 91) == 3.0
    assert weighted_percentile([5.0], [0], 99) is None  # nothing weighs anything
    assert weighted_percentile([1.0, 7.0], [0, 2], 1) == 7.0  # zero weight is left out
    with pytest.raises(ValueError, match="weights"):
        weighted_percentile([1.0], [1, 2], 50)
    with pytest.raises(ValueError, match="within"):
        weighted_percentile([1.0], [1], 101)
