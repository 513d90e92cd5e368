"""The points a twin-first study runs for real: the calibration points spread over the space
(:func:`calibration_points`), and the twin's best configurations put forward for confirmation
(:func:`candidates`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna

from chunktune.core.study_records import TrialRecord
from chunktune.core.trials import TrialState
from chunktune.tuning import space
from chunktune.tuning.results.model import Results
from chunktune.tuning.runner import TrialRunner


def calibration_points(tuner: TrialRunner, k: int, context: space.EngineContext,
                       seed: int) -> list[dict[str, Any]]:
    """The engine's defaults, then ``k - 1`` points spread over the space (a Latin hypercube:
    each parameter's range cut into ``k - 1`` strata, one point per stratum, strata shuffled
    per parameter), skipping points the twin's engine rules refuse."""
    params = tuner.params
    points = [tuner.context.default_point(params)]
    rng = np.random.default_rng(seed)
    n = k - 1
    tries = 0
    while len(points) < k and tries < 50:
        tries += 1
        perms = {p.name: rng.permutation(n) for p in params}
        for i in range(n):
            if len(points) >= k:
                break
            pt = {p.name: _stratum_value(p, (perms[p.name][i] + rng.random()) / n)
                  for p in params}
            if pt in points or context.feasibility(pt, True) is not None:
                continue
            points.append(pt)
    return points


def space_size(params: Sequence[Any]) -> int | None:
    """How many points a finite search space has (None: a continuous range)."""
    n = 1
    for p in params:
        if not p.is_finite:
            return None
        n *= len(p.grid_values())
    return n


def _stratum_value(p: Any, u: float) -> Any:
    """The value of parameter ``p`` at quantile ``u`` of its range (choices in order; int
    ranges on their step, log ranges in log space)."""
    u = min(max(u, 0.0), 1.0 - 1e-9)
    d = space.distribution(p)
    if isinstance(d, optuna.distributions.CategoricalDistribution):
        return d.choices[int(u * len(d.choices))]
    assert isinstance(d, optuna.distributions.IntDistribution
                      | optuna.distributions.FloatDistribution)
    lo, hi = float(d.low), float(d.high)
    v = math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo))) if d.log and lo > 0 \
        else lo + u * (hi - lo)
    if d.step:
        v = min(max(lo + round((v - lo) / d.step) * d.step, lo), hi)
    if isinstance(d, optuna.distributions.IntDistribution):
        return round(v)
    return v



def outcome(t: TrialRecord) -> tuple[tuple[str, float], ...]:
    """What the twin says a configuration does: every simulated metric (to 9 significant
    digits). Two configurations with the same outcome ran the same schedule in the twin (a flag
    that never binds under this workload, such as a ``max-num-seqs`` above the concurrency the
    load reaches), so measuring both spends a real trial on one behaviour twice."""
    return tuple(sorted((k, float(f"{v:.9g}")) for k, v in t.metrics.items()))


def candidates(results: Results, measured: list[dict[str, Any]], m: int,
               incumbent: dict[str, Any] | None = None, tolerance: float = math.inf,
               ) -> list[TrialRecord]:
    """The twin's ``m`` best distinct configurations not in ``measured``: feasible ones by the
    first objective (for several objectives the Pareto front first, spread along it), then, if
    the twin found too few feasible ones, the rest by the first objective. A configuration
    whose simulated :func:`outcome` equals one already measured or picked is left out (the
    twin says it behaves the same), so fewer than ``m`` may come back.

    ``incumbent`` (one objective): the best measured configuration. Only configurations the
    twin predicts feasible and no worse than its prediction for the incumbent by more than
    ``tolerance`` (its error allowance, relative) come back: a real trial on one the twin ranks
    clearly worse than what is measured already buys nothing."""
    o = results.objectives[0]
    sign = 1.0 if o.direction == "minimize" else -1.0

    def key(t: TrialRecord) -> float:
        return sign * t.metrics.get(o.key, math.inf * sign)

    bound = math.inf
    if incumbent is not None and len(results.objectives) == 1:
        inc = next((t for t in results.trials if t.state == TrialState.COMPLETE
                    and dict(t.params) == incumbent and o.key in t.metrics), None)
        if inc is not None:
            bound = key(inc) + abs(inc.metrics[o.key]) * tolerance

    seen = [dict(p) for p in measured]
    done = [t for t in results.trials if t.state == TrialState.COMPLETE and o.key in t.metrics]
    behaviours = {outcome(t) for t in done if dict(t.params) in seen}
    first: dict[tuple[tuple[str, float], ...], TrialRecord] = {}
    for t in sorted(done, key=lambda t: t.number):
        first.setdefault(outcome(t), t)
    done = [t for b, t in first.items() if b not in behaviours]
    if bound < math.inf:
        done = [t for t in done if t.constraints_ok and key(t) <= bound]
    feasible = sorted((t for t in done if t.constraints_ok), key=key)
    front = [t for t in feasible if t.number in results.pareto]
    if len(front) > m > 0:
        idx = sorted({round(i * (len(front) - 1) / max(1, m - 1)) for i in range(m)})
        front = [front[i] for i in idx]
    order = front + [t for t in feasible if t not in front] + \
        sorted((t for t in done if not t.constraints_ok), key=key)
    return order[:m] if m > 0 else []
