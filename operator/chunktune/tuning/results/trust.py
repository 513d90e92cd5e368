"""The twin's error, as a twin-first study's trust check (``spec.strategy.maxTwinError``) and
its reports judge it: the twin's predictions beside the measurements of the confirmed trials.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from chunktune.core.steps import outside_engine
from chunktune.core.study_records import TrialRecord
from chunktune.tuning.objectives import ConstraintDef, ObjectiveDef


def prediction_errors(records: Sequence[TrialRecord]) -> dict[str, list[float]]:
    """``predicted / measured - 1`` per metric over ``records``, leaving out the trials whose
    measured latencies were set outside the engine (:func:`outside_engine`: the twin models
    the engine, not other work on the host; reports list them instead)."""
    out: dict[str, list[float]] = {}
    for r in records:
        if outside_engine(r.metrics):
            continue
        for k, pred in r.predicted.items():
            meas = r.metrics.get(k)
            if meas is None or not meas > 0 or not math.isfinite(pred):
                continue
            out.setdefault(k, []).append(pred / meas - 1.0)
    return out


def bound_of(c: ConstraintDef) -> float:
    """A constraint's bound (its ``max``, else its ``min``)."""
    b = c.max if c.max is not None else c.min
    assert b is not None
    return b


def trust_errors(records: Sequence[TrialRecord], objectives: Sequence[ObjectiveDef],
                 constraints: Sequence[ConstraintDef]) -> dict[str, float]:
    """The twin's error on each goal metric as the trust check (``maxTwinError``) judges it,
    over ``records`` (the confirmed trials, those set outside the engine left out as in
    :func:`prediction_errors`).

    - An objective: the median ``|predicted / measured - 1|``: the twin ranks by it, so any
      relative error counts.
    - A constraint metric (not also an objective): the median ``|predicted - measured| /
      max(|measured|, |bound|)``. The twin only has to tell on which side of the bound a
      configuration lands, so a miss is measured against the bound while the measurement is
      inside it (chat TTFT p99 predicted 91 ms, measured 196 ms, bound 3 s: 3.5%, not 54%), and
      against the measurement beyond it. An error rate predicted 0% and measured 2% against a
      bound of 1% is 100%: a wrong verdict counts in full.
    """
    out: dict[str, float] = {}
    rel = prediction_errors(records)
    for o in objectives:
        if rel.get(o.key):
            out[o.key] = statistics.median(abs(x) for x in rel[o.key])
    for c in constraints:
        if c.key in out:
            continue
        b = abs(bound_of(c))
        errs = []
        for r in records:
            if outside_engine(r.metrics):
                continue
            p, m = r.predicted.get(c.key), r.metrics.get(c.key)
            if p is None or m is None or not (math.isfinite(p) and math.isfinite(m)):
                continue
            scale = max(abs(m), b)
            if scale > 0:
                errs.append(abs(p - m) / scale)
        if errs:
            out[c.key] = max(out.get(c.key, 0.0), statistics.median(errs))
    return out
