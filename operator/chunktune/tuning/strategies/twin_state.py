"""What a twin-first study keeps in its storage (study user attributes of the real study), with
a schema version, and the one reader and writer of it: :class:`TwinState`.

Schema 1 (:data:`SCHEMA`; a study written before the state was versioned has no
``twin_schema`` and the same layout)::

    twin_schema              1
    twin_calibration         [point, ...]             the calibration points, once queued
    twin_round_<r>_profile   calibration profile      the profile fitted for round r
    twin_round_<r>_confirm   [point, ...]             the points queued for confirmation
    twin_round_<r>_done      {best, error, simulated, stop}   round r closed
    twin_untrusted           message                  the twin's error passed maxTwinError

Rounds count from 1. A restarted process rebuilds where the study is from these alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import optuna

from chunktune.core.errors import SpecError
from chunktune.core.progress import StopReason

#: The schema version this chunktune writes and reads.
SCHEMA = 1
ATTR_SCHEMA = "twin_schema"
ATTR_CALIBRATION = "twin_calibration"
ATTR_UNTRUSTED = "twin_untrusted"
_ROUND = "twin_round_{}_{}"  # round number, then profile | confirm | done


@dataclass(frozen=True)
class RoundEnd:
    """How a round closed: the measured best after it, the twin's error on the goals, the
    simulated trials it ran, and the stop it called (``converged``), if any."""

    best: float | None = None
    error: float | None = None
    simulated: int = 0
    stop: StopReason | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"best": self.best, "error": self.error, "simulated": self.simulated,
                "stop": None if self.stop is None else str(self.stop)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RoundEnd:
        stop = d.get("stop")
        return cls(best=d.get("best"), error=d.get("error"),
                   simulated=int(d.get("simulated") or 0),
                   stop=StopReason(stop) if stop else None)


@dataclass
class Round:
    """One search-and-confirm round as stored."""

    number: int
    profile: dict[str, Any] | None = None
    """The calibration profile fitted for it (as :meth:`CalibrationProfile.to_dict`)."""
    confirm: list[dict[str, Any]] | None = None
    """The points it queued for confirmation (None: not queued yet)."""
    end: RoundEnd | None = None
    """How it closed (None: not closed yet)."""


@dataclass
class TwinState:
    """A twin-first study's stored state, read with :meth:`read`; each ``set_*`` writes one
    attribute to the study and to this copy (the study's driver is its only writer)."""

    calibration: list[dict[str, Any]] | None = None
    """The calibration points, once queued."""
    rounds: dict[int, Round] = field(default_factory=dict)
    untrusted: str | None = None
    """Why the twin is not trusted, once its error passed ``maxTwinError``."""

    @classmethod
    def read(cls, study: optuna.Study) -> TwinState:
        """The state stored in ``study``; raises :class:`SpecError` for a schema this
        chunktune does not know (a newer one wrote it)."""
        attrs = study.user_attrs
        version = attrs.get(ATTR_SCHEMA, SCHEMA)
        if version != SCHEMA:
            raise SpecError(f"study {study.study_name!r} holds twin-first state of schema "
                            f"{version!r}; this chunktune reads schema {SCHEMA}: resume it with "
                            "the chunktune that started it, or give a new metadata.name or "
                            "storage to start a new study", field="spec.storage")
        state = cls(calibration=attrs.get(ATTR_CALIBRATION),
                    untrusted=attrs.get(ATTR_UNTRUSTED))
        r = 1
        while any(_ROUND.format(r, part) in attrs for part in ("profile", "confirm", "done")):
            done = attrs.get(_ROUND.format(r, "done"))
            state.rounds[r] = Round(r, attrs.get(_ROUND.format(r, "profile")),
                                    attrs.get(_ROUND.format(r, "confirm")),
                                    RoundEnd.from_dict(done) if done is not None else None)
            r += 1
        return state

    def round(self, r: int) -> Round:
        """Round ``r`` as stored (empty when nothing of it is)."""
        return self.rounds.get(r) or Round(r)

    def rounds_closed(self) -> list[RoundEnd]:
        """The ends of rounds 1, 2, ... up to the first one not closed."""
        out = []
        r = 1
        while (end := self.round(r).end) is not None:
            out.append(end)
            r += 1
        return out

    def set_calibration(self, study: optuna.Study, points: list[dict[str, Any]]) -> None:
        study.set_user_attr(ATTR_SCHEMA, SCHEMA)
        study.set_user_attr(ATTR_CALIBRATION, points)
        self.calibration = points

    def set_profile(self, study: optuna.Study, r: int, profile: dict[str, Any]) -> None:
        study.set_user_attr(_ROUND.format(r, "profile"), profile)
        self.rounds.setdefault(r, Round(r)).profile = profile

    def set_confirm(self, study: optuna.Study, r: int, points: list[dict[str, Any]]) -> None:
        study.set_user_attr(_ROUND.format(r, "confirm"), points)
        self.rounds.setdefault(r, Round(r)).confirm = points

    def set_end(self, study: optuna.Study, r: int, end: RoundEnd) -> None:
        study.set_user_attr(_ROUND.format(r, "done"), end.to_dict())
        self.rounds.setdefault(r, Round(r)).end = end

    def set_untrusted(self, study: optuna.Study, message: str) -> None:
        study.set_user_attr(ATTR_UNTRUSTED, message)
        self.untrusted = message


__all__ = ["ATTR_SCHEMA", "SCHEMA", "Round", "RoundEnd", "TwinState"]
