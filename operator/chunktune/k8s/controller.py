"""One ``ChunkedPrefillTuning``'s study in the cluster: the tuner, its status, events and
outputs. No kopf here: :mod:`.handlers` adapts kopf's live body and stop flag to
:class:`~chunktune.k8s.live.Live`. It reports through :class:`~chunktune.k8s.reporting.Reporting`
and runs the study in a :func:`~chunktune.k8s.session.open_session`, as :mod:`.retuner` does.

:meth:`StudyController.serve` is the daemon's whole life, a small state machine on the
resource's phase (``Pending -> Running -> Succeeded | Failed``, ``Suspended`` in between):

* an invalid spec is ``Failed`` with a ``SpecValid=False`` condition naming the fields, until
  the spec changes;
* ``spec.suspend: true`` is ``Suspended``: trials in flight are stopped (their objects deleted;
  the study re-runs them when resumed), no new ones start;
* otherwise the :class:`~chunktune.tuning.tuner.Tuner` runs with a
  :class:`~chunktune.backends.kubernetes.KubernetesBackend`. Budget and output changes apply
  live; when the study ends the phase is ``Succeeded`` (with a best configuration, then
  ``spec.output`` is written) or ``Failed``; a later spec change (a bigger ``maxTrials``)
  resumes the same study.

All state lives in the study storage and the resource's status: a restarted operator sweeps
the objects of trials the study does not know as running, and the tuner adopts the rest
(:meth:`~chunktune.backends.kubernetes.KubernetesBackend.recover`). Status is written only as
``render_status(summary(...))``, serialised per resource by :class:`StatusWriter`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from chunktune.api.v1alpha1 import ChunkedPrefillTuning
from chunktune.backends import manifests as mf
from chunktune.backends.cluster import ClusterApiError
from chunktune.backends.kubernetes import BackendSettings, KubernetesBackend
from chunktune.core.errors import BackendUnavailable, InfrastructureFault, SpecError
from chunktune.core.flags import flags_line
from chunktune.core.progress import StopReason, StopRequest
from chunktune.core.trials import TrialState
from chunktune.k8s import locations, policy, retuner
from chunktune.k8s.live import Live, StopCause
from chunktune.k8s.outputs import write_outputs
from chunktune.k8s.reporting import Emit, Reporting
from chunktune.k8s.session import Session, open_session
from chunktune.k8s.state import (
    TERMINAL,
    Operator,
    Problem,
    StatusWriter,
    generation,
    owner_of,
    parse,
    problems_text,
)
from chunktune.metrics.derive import WorkloadUnavailable
from chunktune.tuning import storage as storages
from chunktune.tuning import study as st
from chunktune.tuning.results.model import collect
from chunktune.tuning.tuner import Tuner

log = logging.getLogger(__name__)
#: Seconds between tries to derive a workload from Prometheus that could not be derived.
WORKLOAD_RETRY = 30.0
#: Backoff of the daemon after an API error it could not absorb: first delay, cap (seconds).
FAULT_BACKOFF_FIRST = 1.0
FAULT_BACKOFF_CAP = 30.0
#: While a study waits on an object (a Secret, a ConfigMap), it reads it every this many poll
#: intervals (5 s at the default 1 s): a GET per waiting study, not a watch on every Secret.
OBJECT_POLL_INTERVALS = 5
#: The condition that says whether the study's database answers (set once it failed).
STORAGE_CONDITION = "StorageReachable"


def _changed_from(gen: int) -> Callable[[Mapping[str, Any]], bool]:
    return lambda body: generation(body) != gen


class StudyController:
    """Drives one resource's study; :meth:`serve` is the daemon's body."""

    def __init__(self, op: Operator, body: Mapping[str, Any], emit: Emit) -> None:
        self.op = op
        self.owner = owner_of(body)
        self.writer = op.writer(body)
        self.emit = emit
        self.report = Reporting(op, self.owner, self.writer, emit, generation(body))
        """Events, conditions and status writes (the re-tune's too)."""
        self.stop_cause: StopCause | None = None
        self.api_faults = 0
        """API errors in a row that reached the daemon."""

    @property
    def gen(self) -> int:
        """The generation the study runs for (the report's)."""
        return self.report.gen

    @gen.setter
    def gen(self, value: int) -> None:
        self.report.gen = value

    # ---- phases --------------------------------------------------------------------------------

    async def invalid(self, problems: list[Problem], gen: int) -> None:
        text = problems_text(problems)
        self.writer.set("Failed", gen, f"invalid spec: {text}",
                        SpecValid=(False, "InvalidSpec", text),
                        Running=(False, "InvalidSpec", "the spec is invalid"))
        await self.writer.write(None)

    async def pending(self, gen: int) -> None:
        """Pending with SpecValid=True, unless the daemon has moved on already."""
        if self.writer.phase is None:
            self.writer.set("Pending", gen, "waiting for the study to start",
                            SpecValid=(True, "Valid", "the spec is valid"))
            await self.writer.write(None)

    async def _until(self, live: Live, done: Callable[[Mapping[str, Any]], bool]) -> None:
        while live.stopping() is None and not done(live.body()):
            await live.sleep(max(0.2, self.op.settings.trials.poll_interval))

    # ---- the daemon ----------------------------------------------------------------------------

    async def serve(self, live: Live) -> None:
        while live.stopping() is None:
            body = live.body()
            gen = generation(body)
            self.gen = gen
            changed = _changed_from(gen)
            tuning, problems = parse(body)
            if tuning is None:
                await self.invalid(problems, gen)
                await self._until(live, changed)
                continue
            # NOTE: the writer, not the body: the watch event of our own last write may not
            # have arrived yet (the writer starts from the body's status on a restart).
            if self.writer.phase in TERMINAL and not self.writer.pending and \
                    self.writer.generation != gen and retuner.owns_outputs(self.writer.retune):
                self.writer.generation = gen  # re-tuned: the first study's end stays done
            if self.writer.phase in TERMINAL and self.writer.generation == gen and \
                    not self.writer.pending:
                if retuner.watches(tuning, self.writer.phase):
                    await self._guarded(retuner.Retuner(self.op, self.report, tuning).watch(live),
                                        tuning, live, changed)
                else:
                    await self._until(live, changed)
                continue
            # NOTE: the Secrets' versions before the check: a user who fixes one as soon as
            # the refusal is written must not be missed until the re-check is due.
            seen = await self._versions([("secrets", name) for name in policy.secrets_read(
                self.op.settings.policy, tuning)])
            refused = await self._refused(tuning, gen)
            if refused:  # re-checked when due, or as soon as a Secret it names changes
                await self._until_changed(
                    live, [("secrets", r.secret) for r in refused if r.secret is not None],
                    policy.RECHECK_SECONDS, changed, seen)
                continue
            trace = tuning.spec.workload.trace
            ref = None if trace is None else trace.config_map_key_ref
            maps = [] if ref is None else [("configmaps", ref.name)]
            seen = await self._versions(maps)
            traced = await self._with_trace(tuning, body, gen)
            if traced is None:  # the trace's ConfigMap is missing or bad: look again later,
                # or as soon as it is created or edited
                await self._until_changed(live, maps, policy.RECHECK_SECONDS, changed, seen)
                continue
            tuning = traced
            await self._guarded(self._study(tuning, live), tuning, live, changed)

    async def _guarded(self, work: Awaitable[None], tuning: ChunkedPrefillTuning, live: Live,
                       changed: Callable[[Mapping[str, Any]], bool]) -> None:
        """Run ``work`` (the study, or the watch of ``spec.retune``): an invalid spec or
        engine is Failed until the spec changes, a workload that cannot be derived is Pending
        and tried again, and an API or study-database error the layers below did not absorb
        is retried with backoff."""
        gen = self.gen
        source = tuning.spec.storage_from
        # NOTE: the Secret's version before the database is tried with its password: a fix
        # made as soon as the refusal is written is seen at once, not when the backoff ends.
        secrets = [] if source is None else [("secrets", source.secret_key_ref.name)]
        seen = await self._versions(secrets)
        try:
            try:
                await work
            except SpecError as e:
                await self.invalid(e.problems, gen)
                await self._until(live, changed)
            except BackendUnavailable as e:
                await self.invalid([("spec.engine", str(e))], gen)
                await self._until(live, changed)
            except WorkloadUnavailable as e:
                await self._no_workload(e, gen)
                await self._until_changed(live, [], WORKLOAD_RETRY, changed)
        except (ClusterApiError, InfrastructureFault) as e:
            # NOTE: any API error the layers below did not absorb: the daemon lives on and
            # starts over from the study storage (running trials are adopted).
            self.api_faults += 1
            self.op.metrics.fault(self.owner.namespace, self.owner.name, "study")
            delay = min(FAULT_BACKOFF_CAP, FAULT_BACKOFF_FIRST * 2 ** min(
                self.api_faults - 1, 8)) * random.uniform(0.5, 1.0)
            if isinstance(e, storages.StorageFault):  # the study's database, not the API
                await self._storage_failed(e, tuning, gen, delay)
                await self._until_changed(live, secrets, delay, changed, seen)
            else:
                log.warning("%s/%s: the Kubernetes API failed (%s); the study goes on in "
                            "%.1f s", self.owner.namespace, self.owner.name, e, delay)
                if self.api_faults == 3:  # not a blip: say so where users look
                    self.emit("Warning", "ApiError", f"the Kubernetes API keeps failing "
                              f"({e}); the study retries with backoff and loses nothing")
                await live.sleep(delay)
        else:
            self.api_faults = 0

    async def _until_changed(self, live: Live, objects: Sequence[tuple[str, str]],
                             delay: float, changed: Callable[[Mapping[str, Any]], bool],
                             since: Mapping[tuple[str, str], str | None] | None = None
                             ) -> None:
        """Wait ``delay`` seconds, or less: until one of ``objects`` (``(kind, name)`` in the
        resource's namespace) that the wait is about changes (appears, is edited or deleted:
        a Secret whose password was fixed or that was labelled, a ConfigMap created), or the
        spec does. ``since``: the objects' versions when what the wait is about was read
        (:meth:`_versions`; an object not in it is compared with its version now). The spec
        is looked at every poll interval, the objects every :data:`OBJECT_POLL_INTERVALS` (a
        GET each; the operator needs no watch on Secrets or ConfigMaps)."""
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        if not objects:
            await self._until(live, lambda b: changed(b) or loop.time() >= due)
            return
        known = since or {}
        seen = [known[obj] if obj in known else await self._version(*obj) for obj in objects]
        polls = 0
        while live.stopping() is None and (left := due - loop.time()) > 0:
            await live.sleep(min(left, max(0.2, self.op.settings.trials.poll_interval)))
            if changed(live.body()):
                return
            polls += 1
            if polls % OBJECT_POLL_INTERVALS:
                continue
            for (kind, name), was in zip(objects, seen, strict=True):
                if await self._version(kind, name) != was:
                    log.info("%s/%s: %s %s changed; looking again now",
                             self.owner.namespace, self.owner.name, kind, name)
                    return

    async def _versions(self, objects: Sequence[tuple[str, str]]
                        ) -> dict[tuple[str, str], str | None]:
        return {obj: await self._version(*obj) for obj in objects}

    async def _version(self, kind: str, name: str) -> str | None:
        """The resourceVersion of ``kind``/``name`` in the resource's namespace (None:
        missing or unreadable now)."""
        try:
            obj = await self.op.api.get(kind, self.owner.namespace, name)
        except ClusterApiError:
            return None
        return None if obj is None else str((obj.get("metadata") or {}).get(
            "resourceVersion"))

    async def _no_workload(self, e: WorkloadUnavailable, gen: int) -> None:
        """``spec.workload.fromPrometheus`` cannot derive the workload yet: Pending with a
        ``WorkloadDerived=False`` condition and a warning naming the selector (once per
        cause); the daemon tries again every :data:`WORKLOAD_RETRY` seconds."""
        text = str(e)
        if self.writer.condition("WorkloadDerived", False, e.reason, text, gen):
            self.emit("Warning", e.reason, text)
        self.writer.set("Pending", gen, f"waiting for the workload: {text}")
        await self.writer.write(None)

    async def _storage_failed(self, e: storages.StorageFault, tuning: ChunkedPrefillTuning,
                              gen: int, delay: float) -> None:
        """The study's database failed: ``StorageReachable=False`` naming the field and the
        fix (an event when it changes); the daemon tries again after ``delay``."""
        field = "spec.storageFrom" if tuning.spec.storage_from is not None else "spec.storage"
        text = f"{field}: {e} (next try in {delay:.0f} s)"
        if self.writer.condition(STORAGE_CONDITION, False, e.reason, text, gen):
            self.emit("Warning", e.reason, text)
        log.warning("%s/%s: %s", self.owner.namespace, self.owner.name, text)
        with contextlib.suppress(ClusterApiError):
            await self.writer.write_conditions()

    def _storage_answers(self) -> None:
        if self.writer.condition_status(STORAGE_CONDITION) == "False":
            self.report.condition(STORAGE_CONDITION, True, "Reachable",
                                  "the study's database answers")
            self.emit("Normal", "DatabaseReachable", "the study's database answers again")

    async def _refused(self, tuning: ChunkedPrefillTuning, gen: int) -> list[policy.Refusal]:
        """The operator's policy (:mod:`.policy`) on what the trials reference: its refusals
        (and a ``PolicyAllowed=False`` condition naming the field and the fix, phase
        Pending); the daemon re-checks every :data:`~.policy.RECHECK_SECONDS`, and when a
        Secret a refusal names changes."""
        refused = await policy.check_trials(self.op.api, self.op.settings.policy, tuning,
                                            self.owner, self.op.settings.trials.image)
        if not refused:
            if self.writer.condition_status(policy.CONDITION) not in (None, "True"):
                self.writer.condition(policy.CONDITION, True, "Allowed",
                                      "the operator's policy allows what the trials reference",
                                      gen)
            await self._outputs_allowed(tuning, gen)
            return []
        text = policy.refused_text(refused)
        if self.writer.condition(policy.CONDITION, False, refused[0].reason, text, gen,
                                 by_message=True):
            self.emit("Warning", refused[0].reason, text)
        self.writer.set("Pending", gen, f"refused by the operator's policy: {text}")
        await self.writer.write(None)
        return refused

    async def _with_trace(self, tuning: ChunkedPrefillTuning, body: Mapping[str, Any],
                          gen: int) -> ChunkedPrefillTuning | None:
        """The tuning with its trace read: ``spec.workload.trace.configMapKeyRef``'s text, and
        the spec checked again with it (the classes objectives name, the trace's content), and
        the load Job's workload checked to fit its ConfigMap. None when the ConfigMap or its
        key is missing or the trace is bad: phase Pending with ``SpecValid=False`` (reason
        ``TraceUnavailable``) and an event naming the field and the fix; the daemon looks again
        every :data:`~.policy.RECHECK_SECONDS` (the ConfigMap may be created or fixed)."""
        trace = tuning.spec.workload.trace
        if trace is None:
            return tuning
        ref = trace.config_map_key_ref
        where = "spec.workload.trace.configMapKeyRef"
        data = None
        problems: list[Problem] = []
        if ref is not None:
            cm = await self.op.api.get("configmaps", self.owner.namespace, ref.name)
            keys = sorted((cm or {}).get("data") or {})
            data = None if cm is None else ((cm.get("data") or {}).get(ref.key))
            if cm is None:
                problems = [(where, f"there is no ConfigMap {ref.name!r} in namespace "
                             f"{self.owner.namespace!r}; create it with the trace under key "
                             f"{ref.key!r} (kubectl create configmap {ref.name} "
                             f"--from-file={ref.key}=TRACE_FILE)")]
            elif data is None:
                problems = [(where, f"ConfigMap {ref.name!r} has no key {ref.key!r} (its keys: "
                             f"{', '.join(keys) or 'none'})")]
        if not problems:
            traced, problems = parse(body, trace_data=data)
            if traced is not None:
                try:
                    mf.workload_files(traced.spec.workload.resolve())
                except SpecError as e:
                    problems = e.problems
                else:
                    return traced
        text = problems_text(problems)
        if self.writer.message != f"waiting for the trace: {text}":
            self.emit("Warning", "TraceUnavailable", text)
        self.writer.set("Pending", gen, f"waiting for the trace: {text}",
                        SpecValid=(False, "TraceUnavailable", text))
        await self.writer.write(None)
        return None

    async def _outputs_allowed(self, tuning: ChunkedPrefillTuning, gen: int) -> None:
        """Warn at the start (``OutputAllowed=False`` and an event) when ``spec.output`` would
        be refused; the study runs anyway."""
        refused = await policy.check_outputs(self.op.api, tuning, self.owner)
        if refused:
            text = policy.refused_text(refused)
            if self.writer.condition(policy.OUTPUT_CONDITION, False, refused[0].reason, text,
                                     gen, by_message=True):
                self.emit("Warning", refused[0].reason, text)
        elif self.writer.condition_of(policy.OUTPUT_CONDITION) is not None:
            self.writer.condition(policy.OUTPUT_CONDITION, True, "Allowed",
                                  "spec.output is allowed", gen)

    async def _study(self, tuning: ChunkedPrefillTuning, live: Live) -> None:
        async with open_session(self.op, tuning, self.report) as session:
            # a stop cancels the trials in flight: their objects are deleted, or left for
            # the next operator to re-adopt when this one exits
            tuner = await session.tuner(tuning, lambda: (
                StopRequest.CANCEL if self._stop_requested(live, session) else None))
            self.stop_cause = None
            self._storage_answers()
            running = {t.number for t in tuner.trials() if st.trial_state(t) == TrialState.RUNNING}
            swept = await session.backend.sweep(keep=running)
            if swept:
                log.info("%s/%s: deleted %d objects of trials the study does not run",
                         self.owner.namespace, self.owner.name, swept)
            if tuning.spec.suspend:
                await self._suspended(live)
                return
            self.writer.set("Running", self.gen, f"tuning {len(tuner.params)} flags",
                            SpecValid=(True, "Valid", "the spec is valid"),
                            Running=(True, "TrialsRunning", "the study is running"),
                            Suspended=(False, "Resumed", "the study is not suspended"),
                            **retuner.derived_condition(tuner))
            await self.report.write()
            reason = await tuner.run()
            await self.report.drain()
            if reason == StopReason.STOPPED:
                if live.stopping() is None and self.stop_cause == StopCause.SUSPENDED:
                    await self._suspended(live)
                return
            await self._finish(tuner, reason)

    async def _suspended(self, live: Live) -> None:
        self.writer.set("Suspended", self.gen, "suspended: no trial runs until spec.suspend "
                        "is false", Running=(False, "Suspended", "the study is suspended"),
                        Suspended=(True, "Suspended", "spec.suspend is true"))
        await self.report.write()
        self.emit("Normal", "Suspended", "the study is suspended")
        gen = self.gen
        await self._until(live, lambda b: generation(b) != gen or
                          not (b.get("spec") or {}).get("suspend"))

    async def _finish(self, tuner: Tuner, reason: StopReason) -> None:
        results = collect(tuner.study, tuner.objectives, tuner.constraints)
        counted = tuner.counted()
        best = results.best_trial
        if best is not None and reason != StopReason.FAILURES:
            why = reason.text()
            message = f"{why}: best trial {best.number} ({flags_line(dict(best.params))})"
            problems = await write_outputs(self.op.api, self.owner, tuner.spec.output, results)
            conds: dict[str, tuple[bool, str, str]] = {
                "Running": (False, "Completed", why), "Complete": (True, "Completed", message),
                "Failed": (False, "Completed", why)}
            if tuner.spec.output.config_map or tuner.spec.output.patch_deployment:
                conds["OutputWritten"] = ((False, "OutputFailed", "; ".join(problems))
                                          if problems else (True, "Written", "the best flags "
                                                            "were written to spec.output"))
                for p in problems:
                    self.emit("Warning", "OutputFailed", p)
            self.writer.set("Succeeded", self.gen, message, **conds)
            self.emit("Normal", "Succeeded", f"{message} after {counted} trials")
        else:
            if reason == StopReason.FAILURES:
                message = (f"{tuner.counts()[TrialState.FAIL]} trials failed "
                           f"(budget.maxFailedTrials {tuner.spec.budget.max_failed_trials})")
                cause = "TooManyFailures"
            elif results.no_result:
                message, cause = f"{results.no_result} ({reason})", "NoTrialResult"
            else:
                message = f"no trial met every constraint after {counted} trials ({reason})"
                cause = "NoFeasibleTrial"
            self.writer.set("Failed", self.gen, message, Running=(False, cause, message),
                            Complete=(False, cause, message), Failed=(True, cause, message))
            self.emit("Warning", cause, message)
        await self.writer.write(tuner)

    # ---- the tuner's stop ----------------------------------------------------------------------

    def _stop_requested(self, live: Live, session: Session) -> bool:
        why = session.stopping(live)
        if why is not None:
            self.stop_cause = why
            return True
        body = live.body()
        tuner = self.report.tuner
        if generation(body) != self.gen:
            tuning, _ = parse(body)
            if tuning is None or tuner is None or \
                    st.fingerprint(tuning) != st.fingerprint(tuner.tuning):
                self.stop_cause = StopCause.CHANGED
                return True
            # NOTE: the budget and the outputs may change under a running study; the rest
            # (engine, space, workload, goals) is immutable (CEL rules, and the fingerprint).
            tuner.spec.budget = tuning.spec.budget
            tuner.spec.output = tuning.spec.output
            self.gen = generation(body)
            self.writer.generation = self.gen
            self.report.changed()
        if (body.get("spec") or {}).get("suspend"):
            self.stop_cause = StopCause.SUSPENDED
            return True
        return False


async def delete_study(op: Operator, body: Mapping[str, Any],
                       wait: Callable[[], Awaitable[None]] | None = None,
                       timeout: float = 10.0) -> list[str]:
    """The finalizer's work: delete every trial object of the resource (after ``wait``: the
    daemon's exit) and its default study journal; returns what is still there after
    ``timeout`` (empty when everything is gone)."""
    owner = owner_of(body)
    if wait is not None:
        await wait()
    backend = KubernetesBackend(op.api, owner, BackendSettings(
        options=op.settings.trials.options()))
    try:
        await backend.sweep()
        left = await backend.remaining()
        deadline = asyncio.get_running_loop().time() + timeout
        while left and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.2)  # the Jobs' pods go with the garbage collector
            await backend.sweep()
            left = await backend.remaining()
    finally:
        await backend.close()
    spec = body.get("spec") or {}
    if not spec.get("storage") and not spec.get("storageFrom") and owner.uid:
        path = locations.journal_path(op.settings.state_dir, owner.uid)  # its own, by uid
        for p in (path, path.with_name(path.name + ".lock"),
                  path.with_name(path.name + ".study.lock")):
            with contextlib.suppress(OSError):
                p.unlink()
    if owner.uid:
        await asyncio.to_thread(locations.remove_steps, op.settings.state_dir, owner.uid)
    op.forget(owner.uid)
    return left


__all__ = ["Operator", "StatusWriter", "StudyController", "delete_study", "generation",
           "owner_of", "parse", "problems_text"]
