"""From measurements to numbers Optuna can use: flat metrics, objective values, constraint
violations.

Metric keys follow :func:`chunktune.api.metrics.metric_key`: ``ttft_p99`` over all traffic,
``chat.ttft_p99`` for one class; engine-wide figures (``preemptions_per_minute``,
``kv_cache_usage_peak``, ``queue_time_p99``) come from the server and have no class.

Constraints are constraints, not penalties: each SLO becomes one Optuna constraint value,
``(measured - bound) / bound`` for an upper bound (``<= 0`` is feasible), so samplers that
support constraints (TPE, GP, NSGA-II) rank infeasible points by how far they miss.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from chunktune.api.metrics import METRICS, Direction, metric_key
from chunktune.api.v1alpha1 import Constraint, Objective

#: Constraint key Optuna records for "the engine did not start" (or was predicted not to).
STARTUP_CONSTRAINT = "engine_starts"


@dataclass(frozen=True)
class ObjectiveDef:
    metric: str
    cls: str | None
    direction: Direction

    @property
    def key(self) -> str:
        return metric_key(self.metric, self.cls)

    @classmethod
    def from_spec(cls, o: Objective) -> ObjectiveDef:
        return cls(o.metric, o.class_, o.direction or METRICS[o.metric].direction)

    def label(self) -> str:
        return f"{self.direction} {self.key}"


@dataclass(frozen=True)
class ConstraintDef:
    metric: str
    cls: str | None
    max: float | None
    min: float | None

    @property
    def key(self) -> str:
        return metric_key(self.metric, self.cls)

    @classmethod
    def from_spec(cls, c: Constraint) -> ConstraintDef:
        return cls(c.metric, c.class_, c.max, c.min)

    def violation(self, metrics: Mapping[str, float]) -> float:
        """Relative distance outside the bound (<= 0 when met); 1.0 when unmeasured."""
        v = metrics.get(self.key)
        if v is None or not math.isfinite(v):
            return 1.0
        if self.max is not None:
            return (v - self.max) / self.max if self.max > 0 else v - self.max
        assert self.min is not None
        return (self.min - v) / self.min if self.min > 0 else self.min - v

    def text(self) -> str:
        from chunktune.api.metrics import format_value

        if self.max is not None:
            op, bound = "<=", self.max
        else:
            assert self.min is not None  # a constraint has a max or a min
            op, bound = ">=", self.min
        return f"{self.key} {op} {format_value(self.metric, float(bound))}"


def objective_values(objs: Sequence[ObjectiveDef], metrics: Mapping[str, float]
                     ) -> list[float] | None:
    """The objective values, or None when one of them was not measured."""
    values = []
    for o in objs:
        v = metrics.get(o.key)
        if v is None or not math.isfinite(v):
            return None
        values.append(float(v))
    return values


def slos_for_goodput(constraints: Sequence[ConstraintDef]) -> dict[str, dict[str, float]]:
    """Per-request SLOs for goodput from the latency upper bounds: TTFT and E2E bounds apply
    to each request's own TTFT/E2E; ITL and TPOT bounds to its TPOT (DistServe's definition
    has no per-request ITL). Class-less bounds apply to every class (key ``*``)."""
    out: dict[str, dict[str, float]] = {}
    for c in constraints:
        if c.max is None:
            continue
        base = c.metric.split("_p")[0]
        field = {"ttft": "ttft", "e2e": "e2e", "itl": "tpot", "tpot": "tpot"}.get(base)
        if field is None:
            continue
        slo = out.setdefault(c.cls or "*", {})
        slo[field] = min(slo.get(field, math.inf), c.max)
    return out
