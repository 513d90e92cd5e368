"""Recovering trials left in flight: re-attaching to them, closing them as ``Interrupted`` and
queueing their points again, taking over the ones a stopped writer abandoned, and waiting out
an infrastructure fault under a running trial.

Apart from the loop (:mod:`chunktune.tuning.runner`), which calls these with what it holds.
Every trial's state lives in the study storage. A trial found RUNNING whose writer stopped
(:func:`~chunktune.tuning.study.abandoned`: a previous run that died or was cancelled, or
another writer whose heartbeat stopped) is taken over under the study's lock
(:func:`claim_left`); the backend may re-attach to it (:meth:`TrialBackend.recover`); if it
cannot, the trial is closed as FAIL with reason ``Interrupted`` (not counted) and its point is
queued again, so nothing is lost or repeated (:func:`adopt`).

Faults are not results: a backend that raises :class:`~chunktune.core.errors.InfrastructureFault`
(the cluster API unreachable past its retries) leaves the trial in flight, and the trial is
re-adopted once the backend answers again (:func:`readopt`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import TrialState as OptunaState

from chunktune.backends.base import TrialBackend
from chunktune.core.errors import InfrastructureFault
from chunktune.core.trials import TrialPlan, TrialResult, TrialState
from chunktune.tuning import study as st

log = logging.getLogger(__name__)

#: Backoff while a trial waits out an infrastructure fault: first delay, cap (seconds).
FAULT_RETRY_FIRST = 1.0
FAULT_RETRY_CAP = 30.0
#: The reason of a FAIL whose process stopped before the trial ended (not counted).
INTERRUPTED_REASON = "Interrupted"

Report = Callable[[int, dict[str, float]], bool]


def claim_left(study: optuna.Study, storage: BaseStorage, t: optuna.trial.FrozenTrial,
               owner: str) -> optuna.Trial | None:
    """Trial ``t``, taken over by ``owner``, if it is RUNNING and its writer stopped; None
    when another live writer runs it (or it is not running)."""
    if t.state != OptunaState.RUNNING or not st.abandoned(t, owner):
        return None
    return st.claim(study, storage, t.number, owner)


async def adopt(study: optuna.Study, backend: TrialBackend, owner: str,
                t: optuna.trial.FrozenTrial, trial: optuna.Trial,
                plan: Callable[[int, dict[str, Any]], TrialPlan],
                tell: Callable[[optuna.Trial, dict[str, Any], TrialResult], None],
                enqueue: Callable[[dict[str, Any], dict[str, Any]], None]) -> None:
    """Re-attach to a trial a stopped writer left (the backend's ``recover``; its result is
    told through ``tell``), or close it as ``Interrupted`` and queue its point again
    (``enqueue``, with the attributes a queued point carries)."""
    point = st.point_of(t)
    if not point:  # asked, never started (its answer lost with the database)
        trial.set_user_attr(st.ATTR_STATE, TrialState.FAIL.value)
        trial.set_user_attr(st.ATTR_REASON, INTERRUPTED_REASON)
        study.tell(trial, state=OptunaState.FAIL)
        return
    to_run = plan(t.number, point)
    async with st.heartbeat(trial, owner):
        result = await backend.recover(to_run)
    if result is not None:
        tell(trial, point, result)
        return
    trial.set_user_attr(st.ATTR_STATE, TrialState.FAIL.value)
    trial.set_user_attr(st.ATTR_REASON, INTERRUPTED_REASON)
    trial.set_user_attr(st.ATTR_MESSAGE, "the process running this trial stopped "
                        "before it ended; its configuration was queued again")
    study.tell(trial, state=OptunaState.FAIL)
    enqueue(point, {key: t.user_attrs[key]
                    for key in (st.ATTR_BASELINE, *st.QUEUED_ATTRS)
                    if t.user_attrs.get(key) is not None})


async def readopt(backend: TrialBackend, plan: TrialPlan, report: Report | None,
                  fault: InfrastructureFault, bounded: Callable[[], Awaitable[TrialResult]],
                  on_fault: Callable[[int, str | None], None]) -> TrialResult:
    """The backend's infrastructure failed under a trial (the cluster API is unreachable):
    that is never the trial's result. Wait for it with capped, jittered backoff, then
    re-adopt the trial where it is (its measurement is kept if the load finished) or, if
    its objects are gone, run it again under the same trial number (``bounded``). Tells
    ``on_fault`` ``(trial, message)`` at each wait and ``(trial, None)`` once re-adopted.
    Ends only with a result, or when the study is stopped (cancellation)."""
    delay = FAULT_RETRY_FIRST
    attempt = 0
    while True:
        attempt += 1
        log.warning("trial %d: %s; re-adopting it in %.0f s (try %d; the trial is not "
                    "failed and no budget is spent)", plan.number, fault, delay, attempt)
        on_fault(plan.number, str(fault))
        await asyncio.sleep(delay * random.uniform(0.5, 1.0))
        delay = min(FAULT_RETRY_CAP, delay * 2)
        try:
            result = await backend.recover(plan, report)
            if result is None:
                log.warning("trial %d: its objects are gone; running it again", plan.number)
                result = await bounded()
            on_fault(plan.number, None)
            return result
        except InfrastructureFault as again:
            fault = again
