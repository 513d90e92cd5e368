"""The operator's own Prometheus metrics, and its HTTP endpoint (``/metrics``, ``/healthz``).

Every series is labelled by the tuning (``namespace``, ``tuning``) where it belongs to one.
Two kinds:

* **from the study** (gauges rebuilt from every status the operator writes, so a new leader or
  a restarted operator reports the same values at once): trials by state, the phase, the best
  value of each objective, the twin's error, the trials waiting for capacity;
* **from this process** (counters and histograms, which start at zero in each replica as
  Prometheus counters may): trials that ended by state and reason, trial and start-up
  durations, capacity waits, Kubernetes API retries and the faults trials or studies waited
  out, and whether this replica is the leader.

:data:`METRIC_NAMES` lists every exposed name (``charts/chunktune/dashboards/`` may use no
other). The endpoint answers Prometheus' text format 0.0.4 (no OpenMetrics: no name rewriting)
and ``/healthz`` for the pod's probes, the standby's included.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from chunktune.k8s.settings import split_address

log = logging.getLogger(__name__)
#: Prometheus' plain text exposition (what ``/metrics`` answers).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TUNING = ("namespace", "tuning")
#: Seconds: trials last minutes (a vLLM start-up alone may take several).
DURATION_BUCKETS = (5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)
STARTUP_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0)
WAIT_BUCKETS = (1.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 4 * 3600.0)


@dataclass
class StudyGauges:
    """What the last status of one tuning said."""

    phase: str = "Pending"
    counts: dict[str, int] = field(default_factory=dict)
    best: dict[str, float] = field(default_factory=dict)
    twin_error: dict[str, float] = field(default_factory=dict)
    waiting: int = 0


def best_values(status: Mapping[str, Any], objectives: Sequence[tuple[str, str]]
                ) -> dict[str, float]:
    """The best feasible value of each objective: the best trial's (one objective), else the
    best over the Pareto front by each objective's direction."""
    points = [status["best"]] if status.get("best") else list(status.get("paretoFront") or [])
    out: dict[str, float] = {}
    for key, direction in objectives:
        values = [float(p["metrics"][key]) for p in points
                  if isinstance((p.get("metrics") or {}).get(key), int | float)]
        values = [v for v in values if math.isfinite(v)]
        if values:
            out[key] = min(values) if direction == "minimize" else max(values)
    return out


class _StudyCollector(Collector):
    def __init__(self, studies: dict[tuple[str, str], StudyGauges]) -> None:
        self.studies = studies

    def collect(self) -> Iterator[Metric]:
        trials = GaugeMetricFamily("chunktune_study_trials", "Trials of each study by state, "
                                   "from its storage", labels=[*TUNING, "state"])
        phase = GaugeMetricFamily("chunktune_tuning_phase", "1 for the phase each tuning is "
                                  "in", labels=[*TUNING, "phase"])
        best = GaugeMetricFamily("chunktune_best_objective", "The best feasible measured value "
                                 "of each objective", labels=[*TUNING, "objective"])
        twin = GaugeMetricFamily("chunktune_twin_error", "Twin-first studies: the twin's median "
                                 "relative error on the confirmed trials, per metric",
                                 labels=[*TUNING, "metric"])
        waiting = GaugeMetricFamily("chunktune_trials_waiting_for_capacity", "Trials whose "
                                    "engine pod is unschedulable for lack of resources (GPUs)",
                                    labels=list(TUNING))
        for (ns, name), g in sorted(self.studies.items()):
            for state, n in sorted(g.counts.items()):
                trials.add_metric([ns, name, state], n)
            phase.add_metric([ns, name, g.phase], 1)
            for key, v in sorted(g.best.items()):
                best.add_metric([ns, name, key], v)
            for key, v in sorted(g.twin_error.items()):
                twin.add_metric([ns, name, key], v)
            waiting.add_metric([ns, name], g.waiting)
        yield from (trials, phase, best, twin, waiting)


class OperatorMetrics:
    """The registry ``/metrics`` serves, and what the operator tells it."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.studies: dict[tuple[str, str], StudyGauges] = {}
        r.register(_StudyCollector(self.studies))
        self.trials = Counter("chunktune_trials", "Trials that ended in this replica, by state "
                              "and reason", [*TUNING, "state", "reason"], registry=r)
        self.trial_seconds = Histogram(
            "chunktune_trial_duration_seconds", "Wall time of the trials that ended (start-up, "
            "load and clean-up; the wait for capacity left out)", [*TUNING, "state"],
            buckets=DURATION_BUCKETS, registry=r)
        self.startup_seconds = Histogram(
            "chunktune_trial_startup_seconds", "Engine start-up, from its pod's scheduling to "
            "ready", list(TUNING), buckets=STARTUP_BUCKETS, registry=r)
        self.capacity_seconds = Histogram(
            "chunktune_trial_capacity_wait_seconds", "How long trials' engine pods waited for "
            "capacity (unschedulable)", list(TUNING), buckets=WAIT_BUCKETS, registry=r)
        self.api_retries = Counter("chunktune_api_retries", "Kubernetes API requests retried "
                                   "after a transient error, by HTTP status (0: no answer)",
                                   ["status"], registry=r)
        self.api_faults = Counter("chunktune_api_faults", "Kubernetes API outages waited out "
                                  "without spending budget: by a trial (scope trial) or a "
                                  "study's daemon (scope study)", [*TUNING, "scope"],
                                  registry=r)
        self.leader = Gauge("chunktune_leader", "1 while this replica runs the studies (holds "
                            "the Lease, or runs without leader election)", registry=r)
        self.leader_transitions = Counter("chunktune_leader_transitions", "Times this replica "
                                          "became the leader", registry=r)
        self._labelled: dict[tuple[str, str], set[tuple[Any, tuple[str, ...]]]] = {}

    def _child(self, metric: Any, ns: str, name: str, *more: str) -> Any:
        labels = (ns, name, *more)
        self._labelled.setdefault((ns, name), set()).add((metric, labels))
        return metric.labels(*labels)

    # ---- what the operator tells --------------------------------------------------------------

    def study(self, ns: str, name: str) -> StudyGauges:
        return self.studies.setdefault((ns, name), StudyGauges())

    def observe_status(self, ns: str, name: str, status: Mapping[str, Any],
                       objectives: Sequence[tuple[str, str]] = ()) -> None:
        """A status the operator is about to write."""
        g = self.study(ns, name)
        g.phase = str(status.get("phase") or "Pending")
        g.counts = {k: int(v) for k, v in (status.get("counts") or {}).items()}
        g.best = best_values(status, objectives)
        g.twin_error = {k: float(v) for k, v in
                        ((status.get("twin") or {}).get("twinError") or {}).items()}

    def trial_ended(self, ns: str, name: str, state: str, reason: str | None,
                    times: Mapping[str, Any] | None, waited: float) -> None:
        """A trial ended (``times``: its recorded wall, start-up and load seconds)."""
        self._child(self.trials, ns, name, state, reason or "").inc()
        times = times or {}
        wall = times.get("wall")
        if isinstance(wall, int | float):
            self._child(self.trial_seconds, ns, name, state).observe(max(0.0, wall - waited))
        startup = times.get("startup")
        if isinstance(startup, int | float) and startup > 0:
            self._child(self.startup_seconds, ns, name).observe(startup)

    def capacity(self, ns: str, name: str, waiting: int, waited: float | None) -> None:
        """``waiting`` trials wait for capacity now; ``waited``: one just stopped waiting."""
        self.study(ns, name).waiting = waiting
        if waited is not None:
            self._child(self.capacity_seconds, ns, name).observe(waited)

    def fault(self, ns: str, name: str, scope: str) -> None:
        self._child(self.api_faults, ns, name, scope).inc()

    def api_retry(self, what: str, status: int) -> None:
        self.api_retries.labels(str(status)).inc()

    def leading(self, leading: bool) -> None:
        self.leader.set(1 if leading else 0)
        if leading:
            self.leader_transitions.inc()

    def forget(self, ns: str, name: str) -> None:
        """The tuning is gone: drop its series."""
        self.studies.pop((ns, name), None)
        for metric, labels in self._labelled.pop((ns, name), set()):
            with contextlib.suppress(KeyError):
                metric.remove(*labels)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def metric_names(metrics: OperatorMetrics | None = None) -> set[str]:
    """Every sample name ``/metrics`` may expose (with the ``_total``, ``_bucket``, ``_sum``
    and ``_count`` suffixes)."""
    registry = (metrics or OperatorMetrics()).registry
    names: set[str] = set()
    for family in registry.collect():
        if family.type == "counter":
            names |= {f"{family.name}_total", f"{family.name}_created"}
        elif family.type == "histogram":
            names |= {f"{family.name}_{s}" for s in ("bucket", "sum", "count", "created")}
        else:
            names.add(family.name)
    return names


METRIC_NAMES = frozenset(metric_names())


async def serve(address: str, metrics: OperatorMetrics,
                health: Any = None) -> web.AppRunner:
    """Serve ``/metrics`` and ``/healthz`` at ``address`` (``HOST:PORT``) until the returned
    runner is cleaned up; ``runner.addresses`` has the bound port. ``health()``, if given,
    returns the ``/healthz`` body's role (``leader``, ``standby``)."""
    host, port = split_address(address)

    async def scrape(_: web.Request) -> web.Response:
        return web.Response(body=metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text=f"ok {health() if health else ''}".strip() + "\n")

    app = web.Application()
    app.router.add_get("/metrics", scrape)
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    log.info("metrics at http://%s:%s/metrics", host, runner.addresses[0][1])
    return runner


__all__ = ["CONTENT_TYPE", "METRIC_NAMES", "OperatorMetrics", "StudyGauges", "best_values",
           "metric_names", "serve"]
