"""The ``kubernetes`` backend: each trial as a Pod, a load Job and a ConfigMap in the cluster.

A trial (:meth:`KubernetesBackend.run_trial`):

1. create the workload ConfigMap and the engine Pod (:mod:`.manifests`);
2. wait until the pod is Ready, within ``engine.startupTimeout``. A pod the scheduler cannot
   place for lack of resources (``PodScheduled=False``, ``Unschedulable``, ``Insufficient
   nvidia.com/gpu``) is *waiting for capacity* (:mod:`.capacity`; told to
   ``capacity.on_change``): that time counts against neither ``startupTimeout`` nor
   ``budget.trialTimeout`` (:meth:`KubernetesBackend.paused_seconds`), and is never a failure.
   A container that ends before that is classified from its termination state and the tail
   of its log (:func:`~.classify.classify`): vLLM's OOM, KV-cache and argument messages make
   the point ``INFEASIBLE``; an unrecognised crash is ``FAIL EngineCrashed``; ``OOMKilled`` is
   ``FAIL HostOOMKilled``;
3. scrape the engine's ``/metrics`` (unless Prometheus is used), create the load Job against
   the pod IP, and follow it: its log's windows go to ``report`` (pruning deletes the Job),
   ``/metrics`` is sampled for the KV-usage peak (every ``kv_sample_interval``; only every
   ``STEPS_KV_SAMPLE_INTERVAL`` when the engine logs its steps, which carry every step's KV
   usage: a scrape stalls the engine's API server, and every stream with it, for
   milliseconds), and the engine is watched for a crash;
4. when the Job completes, read the summary from its log, take the server-side figures
   (``/metrics`` delta, or Prometheus over the run's wall-clock window);
5. read the engine's log once (its first :attr:`BackendSettings.step_log_limit_bytes`), keep
   its ``Iteration(N)`` lines (vLLM and ``sim serve`` engines run with
   ``--enable-logging-iteration-details``) as the result's steps and, with
   :attr:`BackendSettings.steps_dir`, as ``<trial>.steps.jsonl`` there
   (:func:`chunktune.core.steps.keep_step_log`); a log that cannot be read leaves the steps
   empty (a warning), never fails the trial;
6. delete the trial's objects.

Restart safety: everything needed to go on is in the cluster. :meth:`recover` finds a trial's
objects by label and continues from wherever they are (waiting for readiness, creating or
following the Job, or reading a finished Job's summary); :meth:`sweep` deletes the objects of
trials the study does not know as running. When the operator exits (``detached``), a cancelled
trial leaves its objects for the next operator to adopt.

The Kubernetes API is reached through :class:`~chunktune.backends.cluster.ClusterApi`
(implemented over the official client by :class:`chunktune.k8s.kube.KubeApi`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from chunktune.backends import manifests as mf
from chunktune.backends.base import (
    TrialBackend,
    record_engine_startup,
    take_kv_peak_from_steps,
    trial_tag,
    within,
)
from chunktune.backends.capacity import CapacityWaits, capacity_wait, scheduling_wait
from chunktune.backends.classify import classify
from chunktune.backends.cluster import Body, ClusterApi, ClusterApiError
from chunktune.backends.vllm import STEP_LOG_FLAG, STEP_LOG_KINDS
from chunktune.core.errors import InfrastructureFault
from chunktune.core.flatten import flatten, flatten_window
from chunktune.core.steps import keep_step_log, parse_steps
from chunktune.core.summary import LoadSummary, Window
from chunktune.core.trials import Reporter, TrialPlan, TrialResult, TrialState
from chunktune.metrics import promql
from chunktune.metrics.client import PrometheusClient, PrometheusError, scrape
from chunktune.metrics.promtext import Scrape, server_metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BackendSettings:
    """How the backend runs trials (from the operator's settings)."""

    options: mf.TrialOptions
    poll_interval: float = 1.0
    """Seconds between checks of a trial's objects."""
    kv_sample_interval: float = 2.0
    """Seconds between ``/metrics`` samples during the load (an engine that logs no steps;
    see ``STEPS_KV_SAMPLE_INTERVAL``)."""
    keep_objects: bool = False
    """Leave finished trials' objects in place."""
    prometheus_url: str | None = None
    """Query engine metrics here instead of scraping the pods."""
    prometheus_select_by: str = "pod"
    prometheus_delay: float = 15.0
    """Seconds to wait after the load before querying Prometheus (its last scrape)."""
    trial_timeout: float = 1200.0
    """Bound of a re-attached trial (``budget.trialTimeout``)."""
    http_timeout: float = 5.0
    steps_dir: Path | None = None
    """Where each trial's engine step log is kept (``<trial>.steps.jsonl`` and ``.log``); None:
    the steps are only in the trial's result."""
    step_log_limit_bytes: int = 64 * 2**20
    """Most bytes of an engine's log read for its steps (a longer log: its first steps)."""


_KINDS = ("jobs", "pods", "configmaps", "services")

#: Seconds between ``/metrics`` samples during the load of an engine that logs its steps (the
#: KV-usage peak then comes from the step log; the samples are its fallback when the log cannot
#: be read). A scrape renders the whole exposition on the API server's event loop, stalling
#: every stream in flight for milliseconds (6-14 ms on the CPU engine): at one a second that
#: is one token in ~60 of a stream decoding every 15 ms, within reach of an ITL p99; every
#: 15 s, under 1 in 900.
STEPS_KV_SAMPLE_INTERVAL = 15.0


class _Poll:
    """Sleeps between checks of one wait: 0.1 s at first, growing by half up to the poll
    interval. Short stages (a Job that is done at once, a pod that is ready in a second) are
    seen quickly; a wait of minutes settles at one request per ``poll_interval``."""

    def __init__(self, interval: float, first: float = 0.1) -> None:
        self.interval = interval
        self.next = min(first, interval)

    async def sleep(self) -> None:
        await asyncio.sleep(self.next)
        self.next = min(self.interval, self.next * 1.5)


class KubernetesBackend(TrialBackend):
    name = "kubernetes"

    def __init__(self, api: ClusterApi, owner: mf.Owner, settings: BackendSettings,
                 resources: Mapping[str, Any] | None = None, max_parallel: int = 64,
                 security: Mapping[str, Any] | None = None) -> None:
        self.api = api
        self.owner = owner
        self.settings = settings
        self.resources = resources
        self.security = security
        """``engine.securityContext`` (camelCase), for vLLM/SGLang engine pods."""
        self.max_parallel = max_parallel
        self.detached = False
        """Set when the operator exits: cancelled trials keep their objects (for adoption)."""
        self._http: aiohttp.ClientSession | None = None
        self._prom = (PrometheusClient(settings.prometheus_url)
                      if settings.prometheus_url else None)
        self.timings: dict[int, dict[str, float]] = {}
        """Per trial: wall seconds spent in each stage (for the overhead benchmark)."""
        self.on_warning: Callable[[str, str], None] = lambda reason, message: None
        """Told ``(reason, message)`` of a degradation the study goes on with (Prometheus
        unreachable: the figures come from the engine's /metrics instead)."""
        self.on_recovered: Callable[[str], None] = lambda reason: None
        """Told ``reason`` when that degradation is over."""
        self._before: dict[int, Scrape] = {}
        """Per trial: the engine's /metrics before the load (kept across re-adoption)."""
        self._distributed: set[int] = set()
        """Trials whose load is distributed (their worker Job and Service go with them)."""
        self._unclean: set[int] = set()
        """Trials whose objects could not be deleted yet."""
        self.capacity = CapacityWaits()
        """Trials whose engine pod waits for capacity, and how long each has."""

    @property
    def ns(self) -> str:
        return self.owner.namespace

    def paused_seconds(self, number: int) -> float:
        return self.capacity.paused(number)

    # ---- the protocol ----------------------------------------------------------------------

    async def run_trial(self, plan: TrialPlan, report: Reporter | None = None) -> TrialResult:
        t0 = time.monotonic()
        self.timings[plan.number] = {}
        await self._retry_cleanups()
        self._before.pop(plan.number, None)
        self.capacity.start(plan.number)
        fault = False
        try:
            await self._create_objects(plan)
            self._mark(plan.number, "created", t0)
            return await self._drive(plan, report, fresh=True, t0=t0)
        except InfrastructureFault:
            fault = True  # the objects stay, to be re-adopted once the API answers
            raise
        finally:
            self.capacity.update(plan.number, None, scheduled=False)
            if not fault:
                await self._finish(plan.number)

    async def recover(self, plan: TrialPlan, report: Reporter | None = None
                      ) -> TrialResult | None:
        """Re-attach to a trial left running (by a previous operator, or by this one while
        the API was unreachable): None when it has no engine pod (it is then re-run).
        ``report`` sees the windows not reported yet."""
        pods = await self.api.list("pods", self.ns, self._selector(plan.number, "engine"))
        if not pods:
            await self.cleanup(plan.number)
            return None
        log.info("adopting trial %d of %s/%s", plan.number, self.ns, self.owner.name)
        self.timings[plan.number] = {}
        fault = False
        try:
            names = mf.trial_names(self.owner.name, plan.number)
            if await self.api.get("configmaps", self.ns, names.configmap) is None:
                await self._create("configmaps", mf.workload_configmap(plan, self.owner))
            created = _time(pods[0]["metadata"].get("creationTimestamp"))
            t0 = time.monotonic() - max(0.0, time.time() - created) if created else \
                time.monotonic()
            # the wait for capacity before this process (its pod's scheduling, not the engine)
            self.capacity.start(plan.number, scheduling_wait(pods[0]))
            try:
                return await within(self._drive(plan, report, fresh=False, t0=t0),
                                    self.settings.trial_timeout,
                                    lambda: self.paused_seconds(plan.number))
            except TimeoutError:
                return TrialResult(TrialState.FAIL, reason="TrialTimeout",
                                   message=f"the adopted trial did not end within "
                                           f"{self.settings.trial_timeout:g} s (trialTimeout)")
        except InfrastructureFault:
            fault = True
            raise
        finally:
            self.capacity.update(plan.number, None, scheduled=False)
            if not fault:
                await self._finish(plan.number)

    async def close(self) -> None:
        if not self.detached:
            with contextlib.suppress(Exception):
                await self._retry_cleanups()
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._prom is not None:
            await self._prom.close()

    # ---- objects ---------------------------------------------------------------------------

    def _selector(self, number: int | None = None, component: str | None = None) -> str:
        sel = self.owner.selector(number)
        return f"{sel},{mf.COMPONENT}={component}" if component else sel

    async def _create(self, kind: str, body: Body) -> Body:
        """Create; a leftover of the same name (another study's, or a reset one's) is deleted
        first."""
        name = body["metadata"]["name"]
        for _ in range(100):
            try:
                return await self.api.create(kind, self.ns, body)
            except ClusterApiError as e:
                if e.status != 409:
                    raise
            log.warning("deleting a leftover %s %s/%s", kind, self.ns, name)
            await self.api.delete(kind, self.ns, name, grace_seconds=0)
            await asyncio.sleep(self.settings.poll_interval)
        raise ClusterApiError(409, f"{kind} {name} exists and does not go away")

    async def _create_objects(self, plan: TrialPlan) -> None:
        await self._create("configmaps", mf.workload_configmap(plan, self.owner))
        await self._create("pods", mf.engine_pod(plan, self.owner, self.settings.options,
                                                 self.resources, self.security))

    async def _finish(self, number: int) -> None:
        if self.detached or self.settings.keep_objects:
            return
        t = time.monotonic()
        await self.cleanup(number)
        self._mark(number, "cleanup", t)

    async def cleanup(self, number: int) -> bool:
        """Delete one trial's Job (with its pods), Pod and ConfigMap. A deletion the API
        refuses or does not answer is logged and retried before the next trial starts and when
        the backend closes (and the next operator's sweep is the last net); False then."""
        names = mf.trial_names(self.owner.name, number)
        objects = [("jobs", names.job), ("pods", names.pod), ("configmaps", names.configmap)]
        if number in self._distributed:  # a distributed load's worker Job and Service
            objects += [("jobs", names.workers), ("services", names.master)]
        results = await asyncio.gather(*(self.api.delete(kind, self.ns, name)
                                         for kind, name in objects), return_exceptions=True)
        errors = [r for r in results if isinstance(r, Exception)]
        if errors:
            log.warning("cannot delete the objects of trial %d of %s/%s yet: %s", number,
                        self.ns, self.owner.name, errors[0])
            self._unclean.add(number)
            return False
        self._unclean.discard(number)
        return True

    async def _retry_cleanups(self) -> None:
        for number in sorted(self._unclean):
            await self.cleanup(number)

    async def sweep(self, keep: frozenset[int] | set[int] = frozenset()) -> int:
        """Delete every trial object of this tuning whose trial is not in ``keep``; returns how
        many were deleted."""
        deleted = 0
        for kind in _KINDS:
            for obj in await self.api.list(kind, self.ns, self._selector()):
                meta = obj["metadata"]
                number = (meta.get("labels") or {}).get(mf.TRIAL, "")
                if number.isdigit() and int(number) in keep:
                    continue
                if kind == "pods" and "job-name" in (meta.get("labels") or {}):
                    continue  # the Job's deletion takes its pods
                if await self.api.delete(kind, self.ns, meta["name"]):
                    deleted += 1
        return deleted

    async def remaining(self) -> list[str]:
        """``kind/name`` of this tuning's trial objects still there."""
        out = []
        for kind in _KINDS:
            out += [f"{kind}/{o['metadata']['name']}"
                    for o in await self.api.list(kind, self.ns, self._selector())]
        return out

    # ---- one trial ------------------------------------------------------------------------------

    def _mark(self, number: int, stage: str, since: float) -> None:
        self.timings.setdefault(number, {})[stage] = time.monotonic() - since

    async def _drive(self, plan: TrialPlan, report: Reporter | None, fresh: bool,
                     t0: float) -> TrialResult:
        names = mf.trial_names(self.owner.name, plan.number)
        t = time.monotonic()
        ready = await self._wait_ready(plan, names.pod, t0)
        self._mark(plan.number, "startup", t)
        self.timings[plan.number]["capacity"] = self.paused_seconds(plan.number)
        if isinstance(ready, TrialResult):
            return ready
        startup = time.monotonic() - t0 - self.paused_seconds(plan.number)
        ip = ready["status"]["podIP"]
        url = f"http://{ip}:{plan.target.port}"
        # NOTE: scraped with Prometheus too: the figures fall back to this scrape's delta when
        # Prometheus cannot be reached after the load.
        if fresh or plan.number not in self._before:
            self._before[plan.number] = (await self._scrape(url) if fresh else None) or Scrape()
        before = self._before[plan.number]
        job = await self.api.get("jobs", self.ns, names.job)
        if job is None:
            t = time.monotonic()
            if plan.load_workers:
                self._distributed.add(plan.number)
                await self._create("services", mf.load_master_service(plan, self.owner))
                await self._create("jobs", mf.load_workers_job(plan, self.owner,
                                                               self.settings.options))
            job = await self._create("jobs", mf.load_job(plan, self.owner,
                                                         self.settings.options, url))
            self._mark(plan.number, "job_created", t)
        t1 = time.monotonic()
        result = await self._follow(plan, names, url, report, before, ip)
        self._before.pop(plan.number, None)
        if plan.target.kind in STEP_LOG_KINDS:
            t = time.monotonic()
            await self._keep_steps(plan, names.pod, result)
            take_kv_peak_from_steps(result)
            self._mark(plan.number, "steps", t)
        result.startup_seconds = startup
        result.load_seconds = result.load_seconds or time.monotonic() - t1
        return result

    async def _keep_steps(self, plan: TrialPlan, pod: str, result: TrialResult) -> None:
        """Read the engine's log once (before its pod is deleted) and keep its steps: in
        ``result.steps`` and, with ``steps_dir``, in a file (``result.steps_file``). Nothing
        here fails the trial: a log that cannot be read or kept is a warning."""
        limit = self.settings.step_log_limit_bytes
        where = f"trial {plan.number} of {self.ns}/{self.owner.name}"
        try:
            text = await self.api.pod_log(self.ns, pod, mf.ENGINE_CONTAINER, limit_bytes=limit)
        except Exception as e:  # any failure: no steps, the trial stands
            log.warning("%s: cannot read the engine's log for its step log (%s); the trial "
                        "keeps no steps", where, e)
            return
        if len(text.encode()) >= limit:
            text = text[:text.rfind("\n") + 1]  # the API stops inside a line
            log.warning("%s: the engine's log is over %d bytes (step_log_limit_bytes); its "
                        "step log is truncated to the first %d steps", where, limit,
                        text.count("Iteration("))
        lines = text.splitlines(keepends=True)
        record_engine_startup(result, lines)
        try:
            result.steps, out = await asyncio.to_thread(keep_step_log, lines,
                                                        self.settings.steps_dir, trial_tag(plan))
        except OSError as e:
            result.steps = parse_steps(lines)
            log.warning("%s: cannot write its step log to %s (%s); the steps are in the "
                        "result only", where, self.settings.steps_dir, e)
            return
        if out is not None:
            result.steps_file = str(out)
        elif text.strip() and not result.steps and result.state == TrialState.COMPLETE:
            log.warning("%s: the engine's log holds no Iteration lines (does the engine run "
                        "with %s?)", where, STEP_LOG_FLAG)

    async def _wait_ready(self, plan: TrialPlan, pod_name: str, t0: float) -> Body | TrialResult:
        """The ready pod, or the trial's result if it never gets there. The start-up clock
        stops while the pod waits for capacity."""
        timeout = plan.target.startup_timeout
        waiting = ""
        poll = _Poll(self.settings.poll_interval)
        n = plan.number
        while True:
            pod = await self.api.get("pods", self.ns, pod_name)
            if pod is None or pod["metadata"].get("deletionTimestamp"):
                return TrialResult(TrialState.FAIL, reason="EngineDeleted",
                                   message="the engine pod was deleted before it was ready",
                                   startup_seconds=time.monotonic() - t0
                                   - self.paused_seconds(n))
            unschedulable = capacity_wait(pod)
            self.capacity.update(n, unschedulable)
            if unschedulable is not None:
                await poll.sleep()
                continue
            status = pod.get("status") or {}
            cs = _container(pod, mf.ENGINE_CONTAINER)
            if _ready(pod) and status.get("podIP"):
                return pod
            startup = time.monotonic() - t0 - self.paused_seconds(n)
            if (cs or {}).get("state", {}).get("terminated") or \
                    status.get("phase") in ("Failed", "Succeeded"):
                return await self._startup_failure(pod, cs, startup)
            waiting = _waiting(pod, cs) or waiting
            if startup > timeout:
                tail = await self.api.pod_log(self.ns, pod_name, mf.ENGINE_CONTAINER, 5)
                return TrialResult(
                    TrialState.FAIL, reason="StartupTimeout",
                    message=f"the engine was not ready within {timeout:g} s "
                            f"(engine.startupTimeout)" + (f"; {waiting}" if waiting else "")
                            + (f"; last log lines:\n{tail.strip()}" if tail.strip() else ""),
                    startup_seconds=startup)
            await poll.sleep()

    async def _startup_failure(self, pod: Body, cs: Body | None, startup: float,
                               during: str = "") -> TrialResult:
        term = ((cs or {}).get("state") or {}).get("terminated") or {}
        text = await self.api.pod_log(self.ns, pod["metadata"]["name"], mf.ENGINE_CONTAINER,
                                      200)
        if not text.strip():
            text = str(term.get("message") or "")
        f = classify(term.get("exitCode"), text, oom_killed=term.get("reason") == "OOMKilled")
        return TrialResult(TrialState.INFEASIBLE if f.infeasible else TrialState.FAIL,
                           reason=f.reason, message=f"{during}{f.describe()}",
                           startup_seconds=startup)

    async def _follow(self, plan: TrialPlan, names: mf.TrialNames, url: str,
                      report: Reporter | None, before: Scrape, ip: str) -> TrialResult:
        """Follow the load Job until it ends (or is pruned)."""
        s = self.settings
        kv: list[float] = []
        reported = -1
        job_pod: str | None = None
        next_check = 0.0
        kv_every = s.kv_sample_interval
        # an engine that logs its steps: its step log has the KV usage, /metrics is a fallback
        scrape_every = (max(kv_every, STEPS_KV_SAMPLE_INTERVAL)
                        if plan.target.kind in STEP_LOG_KINDS else kv_every)
        next_scrape = 0.0
        poll = _Poll(s.poll_interval)
        while True:
            job = await self.api.get("jobs", self.ns, names.job)
            if job is None:
                return TrialResult(TrialState.FAIL, reason="LoadFailed",
                                   message="the load Job was deleted before it finished")
            done, failed = _job_done(job)
            if job_pod is None:
                pods = await self.api.list("pods", self.ns, f"job-name={names.job}")
                pods.sort(key=lambda p: p["metadata"].get("creationTimestamp") or "")
                job_pod = pods[-1]["metadata"]["name"] if pods else None
            text = ""
            if job_pod is not None and (report is not None or done or failed):
                text = await self.api.pod_log(self.ns, job_pod, mf.LOAD_CONTAINER)
            parsed = mf.parse_load_log(text)
            if report is not None:
                for w in parsed.windows:
                    if w["index"] <= reported:
                        continue
                    reported = w["index"]
                    window = Window.from_dict(w)
                    if window.warmup:
                        continue
                    if report(window.index, flatten_window(window)):
                        await self.api.delete("jobs", self.ns, names.job)
                        server = await self._server(before, kv, None, names.pod, ip, url)
                        return TrialResult(TrialState.PRUNED, reason="Pruned",
                                           metrics=flatten_window(window), server=server,
                                           pruned_at=window.index)
            if done:
                if parsed.summary is None:
                    return TrialResult(TrialState.FAIL, reason="LoadFailed",
                                       message="the load Job completed but its log holds no "
                                               "summary: " + _tail(text))
                summary = LoadSummary.from_dict(parsed.summary)
                server = await self._server(before, kv, summary, names.pod, ip, url)
                return TrialResult(TrialState.COMPLETE, metrics=flatten(summary, server),
                                   summary=summary, server=server,
                                   load_seconds=summary.duration.elapsed)
            if failed:
                if job_pod is not None and not text:
                    text = await self.api.pod_log(self.ns, job_pod, mf.LOAD_CONTAINER)
                return TrialResult(TrialState.FAIL, reason="LoadFailed",
                                   message=f"the load Job failed ({_job_reason(job)}): "
                                           + _tail(text))
            now = time.monotonic()
            if now >= next_check:
                next_check = now + kv_every
                crashed = await self._engine_gone(names.pod)
                if crashed is not None:
                    await self.api.delete("jobs", self.ns, names.job)
                    return crashed
                if now >= next_scrape:
                    next_scrape = now + scrape_every
                    sample = await self._scrape(url)
                    v = sample.total("vllm:kv_cache_usage_perc") if sample else None
                    if v is not None:
                        kv.append(v)
            await poll.sleep()

    async def _engine_gone(self, pod_name: str) -> TrialResult | None:
        pod = await self.api.get("pods", self.ns, pod_name)
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return TrialResult(TrialState.FAIL, reason="EngineDeleted",
                               message="the engine pod was deleted during the load")
        cs = _container(pod, mf.ENGINE_CONTAINER)
        if ((cs or {}).get("state") or {}).get("terminated"):
            return await self._startup_failure(pod, cs, 0.0, during="the engine stopped "
                                                                   "during the load: ")
        return None

    # ---- server-side figures ------------------------------------------------------------------

    async def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.settings.http_timeout))
        return self._http

    async def _scrape(self, url: str) -> Scrape | None:
        return await scrape(await self._session(), url)

    async def _server(self, before: Scrape, kv: list[float], summary: LoadSummary | None,
                      pod: str, ip: str, url: str) -> dict[str, Any]:
        if self._prom is not None and summary is not None:
            start, end = _time(summary.started), _time(summary.ended)
            if start is None or end is None:
                return {}
            after = await self._scrape(url)  # the fallback's, taken before the wait
            await asyncio.sleep(max(0.0, end + self.settings.prometheus_delay - time.time()))
            try:
                await self._prom.query("vector(1)")
            except PrometheusError as e:
                fallback = self._scraped(before, after, kv, summary, "scrape")
                self.on_warning("PrometheusUnreachable", (
                    f"{e}; the trial's server-side figures come from the engine's /metrics "
                    f"scraped directly instead (fallback: direct /metrics scrape"
                    f"{'' if fallback else ', which also failed: no server-side figures'})"))
                return {**fallback, "fallback": "prometheus unreachable"} if fallback else {}
            self.on_recovered("PrometheusUnreachable")
            sel = promql.PodSelector(self.ns, pod, ip, self.settings.prometheus_select_by)
            return {**await self._prom.trial_metrics(sel, start, end), "source": "prometheus"}
        return self._scraped(before, await self._scrape(url), kv, summary, "scrape")

    def _scraped(self, before: Scrape, after: Scrape | None, kv: list[float],
                 summary: LoadSummary | None, source: str) -> dict[str, Any]:
        if after is None:
            return {}
        seconds = summary.duration.elapsed if summary is not None else 0.0
        return {**server_metrics(before, after, seconds, kv), "source": source}


# ---- reading objects ----------------------------------------------------------------------------


def _container(pod: Body, name: str) -> Body | None:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == name:
            return dict(cs)
    return None


def _ready(pod: Body) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _waiting(pod: Body, cs: Body | None) -> str:
    w = ((cs or {}).get("state") or {}).get("waiting") or {}
    if w.get("reason"):
        return f"container waiting: {w['reason']}" + (f" ({w['message']})"
                                                      if w.get("message") else "")
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return f"not scheduled: {c.get('reason', '')} {c.get('message', '')}".strip()
    return ""


def _job_done(job: Body) -> tuple[bool, bool]:
    conds = {c.get("type"): c.get("status") for c in
             (job.get("status") or {}).get("conditions") or []}
    return conds.get("Complete") == "True", conds.get("Failed") == "True"


def _job_reason(job: Body) -> str:
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Failed":
            return str(c.get("reason") or "Failed")
    return "Failed"


def _tail(text: str, lines: int = 5) -> str:
    keep = [x for x in text.strip().splitlines() if not x.startswith(("{", mf.SUMMARY_MARKER))]
    return "\n".join(keep[-lines:]) or "no log"


def _time(value: str | None) -> float | None:
    if not value:
        return None
    with contextlib.suppress(ValueError):
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return None


__all__ = ["BackendSettings", "KubernetesBackend"]
