"""A twin-first study's stored state: one reader and writer, with a schema version."""

from __future__ import annotations

import optuna
import pytest

from chunktune.core.errors import SpecError
from chunktune.core.progress import StopReason
from chunktune.tuning.strategies.twin_state import ATTR_SCHEMA, SCHEMA, RoundEnd, TwinState


def test_what_is_written_reads_back() -> None:
    study = optuna.create_study(study_name="ns/t")
    state = TwinState.read(study)
    assert state.calibration is None and state.rounds == {} and state.rounds_closed() == []
    state.set_calibration(study, [{"x": 1}, {"x": 2}])
    state.set_profile(study, 1, {"fit": {"median_rel_err": 0.05}})
    state.set_confirm(study, 1, [{"x": 3}])
    state.set_end(study, 1, RoundEnd(best=0.2, error=0.1, simulated=25, stop=None))
    state.set_profile(study, 2, {"fit": {}})
    state.set_untrusted(study, "the twin erred")
    again = TwinState.read(study)
    assert again == state
    assert study.user_attrs[ATTR_SCHEMA] == SCHEMA == 1
    assert again.rounds_closed() == [RoundEnd(0.2, 0.1, 25, None)]
    assert again.round(2).confirm is None and again.round(2).end is None
    assert again.round(3).profile is None
    state.set_end(study, 2, RoundEnd(simulated=5, stop=StopReason.CONVERGED))
    assert TwinState.read(study).round(2).end == RoundEnd(None, None, 5, StopReason.CONVERGED)


def test_a_study_stored_before_the_schema_version_reads_as_schema_1() -> None:
    """The attributes a study wrote before the state was versioned (same layout, no
    ``twin_schema``)."""
    study = optuna.create_study(study_name="ns/old")
    study.set_user_attr("twin_calibration", [{"x": 1}])
    study.set_user_attr("twin_round_1_profile", {"fit": {}})
    study.set_user_attr("twin_round_1_confirm", [{"x": 2}])
    study.set_user_attr("twin_round_1_done", {"best": 0.3, "error": None, "simulated": 40,
                                              "stop": "converged"})
    state = TwinState.read(study)
    assert state.calibration == [{"x": 1}]
    assert state.rounds_closed() == [RoundEnd(0.3, None, 40, StopReason.CONVERGED)]


def test_a_newer_schema_is_refused_naming_the_fix() -> None:
    study = optuna.create_study(study_name="ns/new")
    study.set_user_attr(ATTR_SCHEMA, 2)
    with pytest.raises(SpecError) as e:
        TwinState.read(study)
    [(where, message)] = e.value.problems
    assert where == "spec.storage"
    assert "schema 2" in message and "reads schema 1" in message
    assert "new metadata.name" in message
