"""``result.json`` is versioned (``schema``), and its reader refuses a version it does not know,
naming the file and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chunktune import __version__
from chunktune.core.errors import SpecError
from chunktune.core.study_records import TrialRecord
from chunktune.core.trials import TrialState
from chunktune.tuning.objectives import ConstraintDef, ObjectiveDef
from chunktune.tuning.results.files import SCHEMA_ID, read_result, to_json
from chunktune.tuning.results.model import Results


def results() -> Results:
    t = TrialRecord(number=0, params={"max-num-batched-tokens": 2048}, state=TrialState.COMPLETE,
                    metrics={"chat.ttft_p99": 0.2, "error_rate": 0.0})
    return Results(trials=[t], objectives=[ObjectiveDef("ttft_p99", "chat", "minimize")],
                   constraints=[ConstraintDef("error_rate", None, 0.01, None)], baseline=0,
                   best=0, pareto=[])


def test_result_json_names_its_schema_and_reads_back(tmp_path: Path) -> None:
    doc = to_json(results(), stop_reason="budget")
    assert doc["schema"] == SCHEMA_ID == "chunktune.dev/result/v1"
    assert doc["tool"] == {"name": "chunktune", "version": __version__}
    path = tmp_path / "result.json"
    path.write_text(json.dumps(doc))
    back = read_result(path)
    assert back["best"]["flags"] == "--max-num-batched-tokens 2048"
    assert back["stop_reason"] == "budget"


def test_a_result_json_written_before_versioning_reads_as_v1(tmp_path: Path) -> None:
    doc = to_json(results())
    del doc["schema"], doc["tool"]
    path = tmp_path / "result.json"
    path.write_text(json.dumps(doc))
    assert read_result(path)["best"]["number"] == 0


def test_an_unknown_version_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    path.write_text(json.dumps({**to_json(results()), "schema": "chunktune.dev/result/v2",
                                "tool": {"name": "chunktune", "version": "9.0.0"}}))
    with pytest.raises(SpecError) as e:
        read_result(path)
    [(where, message)] = e.value.problems
    assert where == str(path)
    assert "'chunktune.dev/result/v2'" in message and SCHEMA_ID in message
    assert "(9.0.0)" in message and "chunktune results STORAGE --out DIR" in message
    path.write_text("{not json")
    with pytest.raises(SpecError, match="the file: not valid JSON"):
        read_result(path)
