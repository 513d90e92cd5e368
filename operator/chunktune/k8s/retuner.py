"""Keep a deployment tuned (``spec.retune``): after the study succeeds, the resource's daemon
keeps watching the deployment's workload and re-tunes when it drifts.

:meth:`Retuner.watch` runs in the daemon (:meth:`~chunktune.k8s.controller.StudyController.
serve`) while the phase is ``Succeeded``. It reports through the daemon's
:class:`~chunktune.k8s.reporting.Reporting` and runs its studies in a
:func:`~chunktune.k8s.session.open_session`, as the first study does (the same conditions,
events and metrics: a Prometheus outage during a re-tune's trials is ``PrometheusReachable=
False``), and never imports the controller. Every ``retune.interval`` it derives the workload
over ``retune.window`` from the Prometheus of ``spec.workload.fromPrometheus`` and compares it
with the workload the running configuration was tuned for (:func:`~chunktune.metrics.derive.
drift`; with ``retune.slo``, the deployment's own TTFT/ITL/end-to-end histograms against the
latency bounds of ``spec.constraints`` too). After ``consecutiveChecks`` drifting checks it runs
a re-tune (:mod:`chunktune.tuning.retune`: a new study in the same storage, warm-started from the
previous one, the running configuration as its baseline, its best measured again), and writes
the best to ``spec.output`` only when :func:`~chunktune.tuning.retune.decide` says that real
confirmation beat the running configuration.

Everything it needs to go on lives in ``status.retune`` (checks, the reference workload, the
history with the re-tune in flight) and in the studies' storage, never in the daemon: a
restarted operator resumes a re-tune where its study is (its trials re-adopted) and checks
next when ``lastCheck`` says. Events: ``DriftDetected``, ``RetuneStarted``, ``RetuneApplied``,
``RetuneRecommended``, ``RetuneKept``, ``RetuneFailed``, ``RetuneCheckFailed``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import optuna

from chunktune.api.status import MAX_HISTORY
from chunktune.api.v1alpha1 import ChunkedPrefillTuning, RetuneSpec, slo_watched
from chunktune.backends import deployment as dp
from chunktune.backends.cluster import ClusterApiError
from chunktune.core.errors import SpecError
from chunktune.core.flags import flags_line
from chunktune.core.progress import StopReason, StopRequest
from chunktune.k8s.live import Live
from chunktune.k8s.outputs import write_outputs
from chunktune.k8s.reporting import Reporting
from chunktune.k8s.session import Session, open_session
from chunktune.k8s.state import Operator, generation, timestamp
from chunktune.metrics.derive import (
    Observation,
    WorkloadStats,
    WorkloadUnavailable,
    drift,
    prefix_caveat,
    stats_of,
)
from chunktune.tuning import retune as rt
from chunktune.tuning import study as st
from chunktune.tuning import workload_source
from chunktune.tuning.objectives import ObjectiveDef
from chunktune.tuning.results.model import collect
from chunktune.tuning.tuner import Tuner

log = logging.getLogger(__name__)


def _epoch(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def watches(tuning: ChunkedPrefillTuning, phase: str | None) -> bool:
    """Whether the daemon watches the deployment now: ``spec.retune``, a succeeded study, and
    not ``spec.suspend`` (a re-tune in flight waits for it to be lifted)."""
    return tuning.spec.retune is not None and phase == "Succeeded" and not tuning.spec.suspend


def derived_condition(tuner: Tuner) -> dict[str, tuple[bool, str, str]]:
    """``WorkloadDerived=True`` for a study whose workload ``fromPrometheus`` derived (none
    for other workloads)."""
    if not tuner.derived:
        return {}
    src = tuner.derived.get("source") or {}
    hit = (tuner.derived.get("stats") or {}).get("prefixCacheHitRate")
    caveat = prefix_caveat(None if hit is None else float(hit))
    return {"WorkloadDerived": (True, "Derived", f"derived from {src.get('url')} "
                                f"({src.get('selector')}, {src.get('window', 0):g} s ending "
                                f"{src.get('at')})" + (f"; {caveat}" if caveat else ""))}


def owns_outputs(retune_status: Mapping[str, Any] | None) -> bool:
    """Whether a re-tune has run: the first study's answer is no longer what ``spec.output``
    holds, so a spec change must not run that study's end (and write its best) again."""
    return bool(retune_status and int(retune_status.get("round") or 0) > 0)


def slo_misses(tuning: ChunkedPrefillTuning, obs: Observation) -> list[str]:
    """The latency bounds of ``spec.constraints`` (on all requests) the deployment's own
    histograms miss over the window."""
    out = []
    for c in tuning.spec.constraints:
        base, _, pct = c.metric.rpartition("_p")
        if not slo_watched(c) or base not in obs.latency:
            continue
        assert c.max is not None  # slo_watched: an upper bound
        value = obs.latency[base].quantile(int(pct) / 100)
        if value is not None and value > c.max:
            out.append(f"production {c.metric} {value * 1000:.0f}ms misses {c.text()}")
    return out


def slo_bases(tuning: ChunkedPrefillTuning) -> tuple[str, ...]:
    """The latency histograms a check needs for ``spec.constraints``."""
    bases = []
    for c in tuning.spec.constraints:
        base = c.metric.rpartition("_p")[0]
        if slo_watched(c) and base not in bases:
            bases.append(base)
    return tuple(bases)


class Retuner:
    """The watch on one resource's deployment, for as long as its spec stays the same."""

    def __init__(self, op: Operator, report: Reporting, tuning: ChunkedPrefillTuning) -> None:
        self.op = op
        self.report = report
        self.tuning = tuning
        spec = tuning.spec.retune
        assert spec is not None
        self.spec: RetuneSpec = spec
        self.source = tuning.spec.workload.from_prometheus
        self.writer = report.writer
        self.emit = report.emit
        self.session: Session | None = None
        self.tuner: Tuner | None = None
        self.gen = report.gen

    @property
    def url(self) -> str:
        """The study storage of the open session."""
        assert self.session is not None
        return self.session.url

    # ---- status ------------------------------------------------------------------------------

    @property
    def status(self) -> dict[str, Any]:
        if self.writer.retune is None:
            self.writer.retune = {"state": "Watching", "round": 0, "checks": 0, "drifting": 0,
                                  "history": []}
        return self.writer.retune

    def _history(self) -> list[dict[str, Any]]:
        return list(self.status.get("history") or [])

    def _set_history(self, entry: dict[str, Any]) -> None:
        history = [h for h in self._history() if h.get("round") != entry["round"]]
        self.status["history"] = [*history, entry][-MAX_HISTORY:]

    async def _write(self) -> None:
        await self.report.write()

    # ---- the watch ---------------------------------------------------------------------------

    async def watch(self, live: Live) -> None:
        """Until the spec changes or the daemon stops: resume a re-tune in flight, then check
        every interval."""
        if self.source is None:  # the spec's checks refuse this; nothing to watch
            while not self._stop(live):
                await live.sleep(1.0)
            return
        async with open_session(self.op, self.tuning, self.report) as session:
            self.session = session
            try:
                await self._watch(live)
            finally:
                self.session = self.tuner = None

    async def _watch(self, live: Live) -> None:
        """:meth:`watch`, in the open session."""
        await self._open(int(self.status.get("round") or 0))
        if self.status.get("reference") is None and self.tuner is not None:
            stats = (self.tuner.derived or {}).get("stats")
            self.status["reference"] = stats
        self.status["study"] = self.tuner.study.study_name if self.tuner else None
        last = (self._history() or [{}])[-1]
        if last.get("outcome") == "Running":
            await self._write()
            try:
                await self._round(live, int(last["round"]),
                                  list(last.get("reasons") or []), None)
            except (SpecError, WorkloadUnavailable) as e:
                await self._failed(last, str(e))
        else:
            self.status["state"] = "Watching"
            await self._write()
        while not self._stop(live):
            due = (_epoch((self.status.get("lastCheck") or {}).get("time")) or 0.0) \
                + self.spec.interval
            while not self._stop(live) and time.time() < due:
                await live.sleep(min(1.0, max(0.05, due - time.time())))
            if self._stop(live):
                return
            await self._check(live)

    def _stop(self, live: Live) -> bool:
        why = live.stopping() if self.session is None else self.session.stopping(live)
        return why is not None or generation(live.body()) != self.gen

    async def _open(self, round_: int, observed: Observation | None = None) -> Tuner:
        """The tuner of study ``round_`` (0: the first), created for a new re-tune (its
        workload stored and its first trials queued), or reopened."""
        assert self.session is not None
        if round_ == 0:
            tuning = self.tuning
        else:
            previous = await asyncio.to_thread(self._load, rt.study_name(self.tuning,
                                                                         round_ - 1))
            reuse = previous is not None and rt.twin_profile(previous) is not None
            tuning = rt.retune_tuning(self.tuning, self.spec, round_, reuse)
            if observed is not None:
                await asyncio.to_thread(self._prepare, tuning, round_, observed)
        self.tuner = await self.session.tuner(tuning, lambda: None,
                                              rt.study_name(self.tuning, round_))
        return self.tuner

    def _load(self, name: str) -> optuna.Study | None:
        try:
            return optuna.load_study(study_name=name, storage=st.open_storage(self.url))
        except KeyError:
            return None

    def _prepare(self, tuning: ChunkedPrefillTuning, round_: int, obs: Observation) -> None:
        """Create the re-tune's study with the workload derived from ``obs`` stored in it, so
        that its tuner replays that (and a restarted one too)."""
        directions = [ObjectiveDef.from_spec(o).direction for o in tuning.spec.objectives]
        study = st.open_study(tuning, st.open_storage(self.url), directions,
                              st.make_sampler(tuning, len(directions),
                                              bool(tuning.spec.constraints)),
                              st.make_pruner(tuning, len(directions)),
                              name=rt.study_name(self.tuning, round_))
        if workload_source.ATTR_WORKLOAD not in study.user_attrs:
            study.set_user_attr(workload_source.ATTR_WORKLOAD,
                                workload_source.derive_for(tuning, obs).to_dict())

    # ---- one check ---------------------------------------------------------------------------

    async def _check(self, live: Live) -> None:
        assert self.source is not None
        window = self.spec.window or self.source.window
        check: dict[str, Any] = {"time": timestamp()}
        self.status["checks"] = int(self.status.get("checks") or 0) + 1
        try:
            obs = await asyncio.to_thread(
                workload_source.observe, self.source, window,
                slo_bases(self.tuning) if self.spec.slo else ())
        except WorkloadUnavailable as e:
            check["message"] = str(e)
            previous = (self.status.get("lastCheck") or {}).get("message")
            self.status["lastCheck"] = check
            if previous != check["message"]:
                self.emit("Warning", "RetuneCheckFailed", str(e))
            await self._write()
            return
        current = stats_of(obs, self.source.long_prompt_tokens)
        check["workload"] = current.to_dict()
        if obs.requests < self.spec.min_requests:
            check["message"] = (f"{obs.requests:.0f} requests in the window, fewer than "
                                f"retune.minRequests ({self.spec.min_requests}): no decision")
            self.status["lastCheck"] = check
            await self._write()
            return
        reference = self.status.get("reference")
        if reference is None:  # a study that kept no derived workload: this one is the first
            self.status["reference"] = reference = current.to_dict()
        reasons = drift(WorkloadStats.from_dict(reference), current, rt.limits(self.spec))
        if self.spec.slo:
            reasons += slo_misses(self.tuning, obs)
        check["drift"] = reasons
        self.status["lastCheck"] = check
        if not reasons:
            self.status["drifting"] = 0
            await self._write()
            return
        drifting = int(self.status.get("drifting") or 0) + 1
        self.status["drifting"] = drifting
        self.emit("Warning" if drifting >= self.spec.consecutive_checks else "Normal",
                  "DriftDetected", f"check {drifting}/{self.spec.consecutive_checks}: "
                  + "; ".join(reasons))
        if drifting < self.spec.consecutive_checks:
            await self._write()
            return
        round_ = int(self.status.get("round") or 0) + 1
        await self._round(live, round_, reasons, obs)

    # ---- one re-tune -------------------------------------------------------------------------

    async def _round(self, live: Live, round_: int, reasons: list[str],
                     obs: Observation | None) -> None:
        """Run re-tune ``round_`` (a new one with the workload of ``obs``, or the one in
        flight), decide and apply."""
        entry = next((h for h in self._history() if h.get("round") == round_), None)
        if entry is None:
            running = await self._running()
            entry = {"round": round_, "study": rt.study_name(self.tuning, round_),
                     "started": timestamp(), "reasons": reasons, "outcome": "Running",
                     "running": running}
        tuner = await self._open(round_, obs)
        await asyncio.to_thread(rt.seed, tuner, entry["running"], await asyncio.to_thread(
            self._load, rt.study_name(self.tuning, round_ - 1)), self.spec, reasons, round_)
        self.status.update(round=max(round_, int(self.status.get("round") or 0)),
                           state="Retuning", study=tuner.study.study_name, drifting=0)
        self._set_history(entry)
        self.writer.message = f"re-tune {round_} running: " + "; ".join(reasons)
        await self._write()
        if obs is not None:
            self.emit("Normal", "RetuneStarted",
                      f"re-tune {round_} ({tuner.spec.strategy.name}, up to "
                      f"{tuner.spec.budget.max_trials} real trials) from "
                      f"{flags_line(entry['running'])}: " + "; ".join(reasons))
        # a stop cancels the trials in flight: the next watch re-adopts them (or the next
        # operator, when this one exits)
        tuner.stop_requested = lambda: StopRequest.CANCEL if self._stop(live) else None
        why = await tuner.run()
        await self.report.drain()
        if why == StopReason.STOPPED:
            return  # resumed by the next watch (the history says Running)
        await self._decide(tuner, entry, why)

    async def _failed(self, entry: dict[str, Any], message: str) -> None:
        """A re-tune that cannot go on (its study no longer matches the spec)."""
        self._set_history({**entry, "finished": timestamp(), "outcome": "Failed",
                           "message": message})
        self.status.update(state="Watching", drifting=0)
        await self._write()
        self.emit("Warning", "RetuneFailed", f"re-tune {entry.get('round')}: {message}")

    async def _running(self) -> dict[str, Any]:
        """The configuration that runs now: the searched flags on the Deployment of
        ``spec.output.patchDeployment`` (the engine's defaults where it sets none), else the
        last applied best, else the first study's best."""
        assert self.tuner is not None
        params = self.tuner.params
        defaults = self.tuner.context.default_point(params)
        target = self.tuning.spec.output.patch_deployment
        if target is not None:
            try:
                deploy = await self.op.api.get("deployments", self.report.owner.namespace,
                                               target.name)
            except ClusterApiError as e:
                log.warning("cannot read Deployment %s: %s", target.name, e.message)
                deploy = None
            container = None if deploy is None else dp.engine_container(deploy,
                                                                         target.container)
            if container is not None:
                return {**defaults, **dp.read_flags(container, [p.name for p in params])}
        for h in reversed(self._history()):
            if h.get("outcome") == "Applied" and h.get("best"):
                return dict(h["best"])
        res = collect(self.tuner.study, self.tuner.objectives, self.tuner.constraints)
        best = res.best_trial
        return dict(best.params) if best is not None else defaults

    async def _decide(self, tuner: Tuner, entry: dict[str, Any], why: StopReason) -> None:
        results = collect(tuner.study, tuner.objectives, tuner.constraints)
        decision = rt.decide(results, self.spec.min_gain)
        outcome = "Applied" if decision.apply else "Kept"
        message = decision.message
        if why == StopReason.FAILURES:
            outcome, message = "Failed", f"too many trials failed ({message})"
        elif decision.apply:
            output = self.tuning.spec.output
            if output.config_map or output.patch_deployment:
                problems = await write_outputs(self.op.api, self.report.owner, output, results)
                if problems:
                    outcome, message = "Failed", f"{message}; writing spec.output failed: " \
                        + "; ".join(problems)
            else:
                outcome = "Recommended"
        entry = {**entry, "finished": timestamp(), "outcome": outcome, "message": message,
                 "best": decision.best, "metric": decision.metric, "before": decision.before,
                 "after": decision.after, "gain": decision.gain,
                 "confirmedBy": list(decision.confirmed_by) or None}
        self._set_history({k: v for k, v in entry.items() if v is not None})
        stats = (tuner.derived or {}).get("stats")
        if stats:
            self.status["reference"] = stats  # the running configuration now answers this
        self.status.update(state="Watching", drifting=0)
        self.writer.message = f"re-tune {entry['round']}: {outcome.lower()}: {message}"
        await self._write()
        best = flags_line(decision.best) if decision.best else "none"
        change = f" ({decision.metric} {decision.before:.4g} -> {decision.after:.4g}, " \
                 f"{decision.gain})" if decision.before is not None and \
            decision.after is not None else ""
        kind = "Warning" if outcome == "Failed" else "Normal"
        self.emit(kind, f"Retune{outcome}", f"re-tune {entry['round']}: {best}{change}: "
                  f"{message}")


__all__ = ["Retuner", "derived_condition", "owns_outputs",
           "slo_bases", "slo_misses", "watches"]
