"""The daemon's view of its resource, and why a study stops.

:class:`Live` is what :mod:`.controller` and :mod:`.retuner` see of kopf's live body and stop
flag (:class:`~chunktune.k8s.handlers.KopfLive` adapts them; tests pass their own);
:class:`StopCause` names every reason a running study stops: the two a :class:`Live` gives
(the resource was deleted, the operator exits) and the two the controller finds in the spec
(it changed what the study is, or suspended it).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Protocol


class StopCause(StrEnum):
    """Why a running study stops."""

    DELETED = "deleted"
    """The resource was deleted: the trials in flight are stopped and their objects deleted."""
    EXITING = "exiting"
    """The operator exits: the trials in flight are left for the next operator to adopt."""
    CHANGED = "changed"
    """The spec changed what the study is (engine, space, workload, goals)."""
    SUSPENDED = "suspended"
    """``spec.suspend`` became true."""


class Live(Protocol):
    """The daemon's view of its resource (kopf's live body and stop flag)."""

    def body(self) -> Mapping[str, Any]: ...

    def stopping(self) -> StopCause | None:
        """None while running; :attr:`StopCause.DELETED` or :attr:`StopCause.EXITING` once
        asked to stop."""

    async def sleep(self, seconds: float) -> None:
        """Sleep, returning early when asked to stop."""


__all__ = ["Live", "StopCause"]
