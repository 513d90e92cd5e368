"""The vocabulary of a study's progress, shared by the tuner, the operator and the status.

A study's loop tells what happens through :class:`TrialEvent`; it ends with a
:class:`StopReason`; a twin-first study moves through :class:`TwinPhase`; a stop is asked for
with a :class:`StopRequest`. Members are strings (``StopReason.BUDGET == "budget"``), so stored,
logged and rendered values stay plain text, and a type checker finds every ``match`` that misses
a member.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, assert_never

from chunktune.core.trials import TrialState


class StopReason(enum.StrEnum):
    """Why a study's loop (or one of its phases) stopped."""

    BUDGET = "budget"
    """``budget.maxTrials`` trials ended."""
    CONVERGED = "converged"
    """``budget.patience`` trials without improvement, or a twin-first round that did not
    improve the measured best."""
    FAILURES = "failures"
    """``budget.maxFailedTrials`` trials failed."""
    DURATION = "duration"
    """``budget.maxDuration`` passed."""
    EXHAUSTED = "exhausted"
    """A grid is done, or no launchable point is left to ask."""
    STOPPED = "stopped"
    """A stop was requested (Ctrl-C, the resource deleted, suspended or changed)."""
    ROUNDS = "rounds"
    """A twin-first study's search-and-confirm rounds are all confirmed."""
    QUEUED = "queued"
    """The queued trials ran (a phase that runs only chosen points); never a study's end."""

    @property
    def interrupts(self) -> bool:
        """The study cannot go on to a next phase (a recheck) after this: it was stopped, ran
        out of time, or failed too often."""
        return self in (StopReason.STOPPED, StopReason.DURATION, StopReason.FAILURES)

    def text(self) -> str:
        """What the reason says to a user (``the trial budget is spent``)."""
        match self:
            case StopReason.BUDGET:
                return "the trial budget is spent"
            case StopReason.CONVERGED:
                return "the study converged"
            case StopReason.FAILURES:
                return "too many trials failed"
            case StopReason.DURATION:
                return "the study's maxDuration passed"
            case StopReason.EXHAUSTED:
                return "the search space is exhausted"
            case StopReason.STOPPED:
                return "the study was stopped"
            case StopReason.ROUNDS:
                return "the twin-first rounds are confirmed"
            case StopReason.QUEUED:
                return "the queued trials ran"
            case _:
                assert_never(self)


class StopRequest(enum.StrEnum):
    """How a stop is asked for (what ``stop_requested`` answers, None: go on)."""

    DRAIN = "drain"
    """Ask no new trial; the trials in flight finish and are recorded (a first Ctrl-C)."""
    CANCEL = "cancel"
    """Cancel the trials in flight now. They stay in flight in the study storage: the next
    run re-adopts them where the backend can (the operator's trial pods), else records each as
    ``Interrupted`` and queues its configuration again (a second Ctrl-C; the operator on
    deletion, suspension, a changed spec or its own exit)."""


class TwinPhase(enum.StrEnum):
    """Where a twin-first study is (``status.twin.phase``; each a state the storage records).
    A trial queued for a phase records it (the ``phase`` trial attribute: calibrate, confirm,
    or recheck, which an all-real study's recheck trials carry too)."""

    CALIBRATE = "calibrate"
    """Real trials that record the engine's step log."""
    SEARCH = "search"
    """Simulated trials in the calibrated twin."""
    CONFIRM = "confirm"
    """The twin's best configurations run for real."""
    FALLBACK = "fallback"
    """Ordinary real trials after the twin erred too much."""
    RECHECK = "recheck"
    """The best measured configurations measured once more before the answer."""
    DONE = "done"


class EventKind(enum.StrEnum):
    """What a :class:`TrialEvent` tells."""

    STARTED = "started"
    """A trial was launched."""
    FINISHED = "finished"
    """A trial ended (or was recorded without launching)."""
    PHASE = "phase"
    """A twin-first study entered :attr:`TrialEvent.phase`."""
    WARNING = "warning"
    """Something the user should know (the twin is not trusted): :attr:`TrialEvent.reason`
    names it, :attr:`TrialEvent.message` says it."""


#: The :attr:`TrialEvent.reason` of the warning that the twin's error passed ``maxTwinError``.
TWIN_UNTRUSTED = "TwinUntrusted"


@dataclass
class TrialEvent:
    """What happened to one trial, or to the study (for progress lines, Kubernetes events,
    status). ``number`` is -1 for a study's :data:`EventKind.PHASE` or
    :data:`EventKind.WARNING`."""

    kind: EventKind
    number: int
    point: dict[str, Any] = field(default_factory=dict)
    state: TrialState = TrialState.RUNNING
    reason: str | None = None
    message: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    baseline: bool = False
    phase: TwinPhase | None = None


__all__ = ["TWIN_UNTRUSTED", "EventKind", "StopReason", "StopRequest", "TrialEvent",
           "TwinPhase"]
