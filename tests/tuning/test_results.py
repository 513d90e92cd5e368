"""Rendering a study's results (chunktune.tuning.results)."""

from __future__ import annotations

from chunktune.api.status import TrialRecord
from chunktune.core.trials import TrialState
from chunktune.tuning.objectives import ConstraintDef, ObjectiveDef
from chunktune.tuning.results import Results, format_results


def test_twin_rows_show_no_relative_error_where_the_measurement_is_zero() -> None:
    """An error rate the twin predicted at 0 and the engine measured at 0 has no relative
    error: the row says "-" (it printed "+nan%"), and the median leaves it out."""
    t = TrialRecord(number=3, params={"max-num-batched-tokens": 2048}, state=TrialState.COMPLETE,
                    metrics={"chat.itl_p99": 0.025, "error_rate": 0.0},
                    phase="confirm", predicted={"chat.itl_p99": 0.020, "error_rate": 0.0})
    res = Results(trials=[t], objectives=[ObjectiveDef("itl_p99", "chat", "minimize")],
                  constraints=[ConstraintDef("error_rate", None, 0.01, None)], baseline=None,
                  best=3, pareto=[])
    text = format_results(res)
    assert "nan" not in text
    rows = {line.split()[1]: line.split() for line in text.splitlines()
            if line.strip().startswith("3 ")}
    assert rows["chat.itl_p99"][-1] == "-20%"
    assert rows["error_rate"][-1] == "-"
    assert "median |error|: chat.itl_p99 20%" in text
