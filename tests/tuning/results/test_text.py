"""Rendering a study's results as text (chunktune.tuning.results.text)."""

from __future__ import annotations

from chunktune.core.study_records import TrialRecord
from chunktune.core.trials import TrialState
from chunktune.tuning.objectives import ConstraintDef, ObjectiveDef
from chunktune.tuning.results.model import Results
from chunktune.tuning.results.text import format_results


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


def _trial(n: int, itl: float, band: tuple[float, float] | None) -> TrialRecord:
    return TrialRecord(number=n, params={"max-num-batched-tokens": 1024 * (n + 1)},
                       state=TrialState.COMPLETE,
                       metrics={"chat.itl_p99": itl, "itl_p99": itl, "engine_itl_p99": 0.015,
                                "error_rate": 0.0}, itl_band=band)


def test_results_name_trials_whose_itl_p99_is_on_a_cliff() -> None:
    trials = [_trial(0, 0.020, (0.0109, 0.072)), _trial(1, 0.031, (0.0267, 0.0349))]
    res = Results(trials=trials, objectives=[ObjectiveDef("itl_p99", "chat", "minimize")],
                  constraints=[], baseline=0, best=0, pareto=[])
    text = format_results(res)
    line = next(x for x in text.splitlines() if x.startswith("cliff:"))
    assert "1 of 2 measured trials (0)" in line and "72.0 ms at p99.5" in line
    # an objective that is not an ITL p99: nothing to say about it
    res = Results(trials=trials, objectives=[ObjectiveDef("ttft_p99", "chat", "minimize")],
                  constraints=[], baseline=0, best=0, pareto=[])
    assert "cliff:" not in format_results(res)


def test_twin_rows_mark_an_itl_p99_on_a_cliff() -> None:
    t = TrialRecord(number=4, params={"max-num-batched-tokens": 2048}, state=TrialState.COMPLETE,
                    metrics={"chat.itl_p99": 0.060, "chat.ttft_p99": 0.3},
                    phase="confirm", predicted={"chat.itl_p99": 0.020, "chat.ttft_p99": 0.3},
                    itl_band=(0.0156, 0.211))
    res = Results(trials=[t], objectives=[ObjectiveDef("itl_p99", "chat", "minimize")],
                  constraints=[ConstraintDef("ttft_p99", "chat", 3.0, None)], baseline=None,
                  best=4, pareto=[])
    rows = {line.split()[1]: line for line in format_results(res).splitlines()
            if line.strip().startswith("4 ")}
    assert rows["chat.itl_p99"].endswith("(cliff)")
    assert "(cliff)" not in rows["chat.ttft_p99"]


def test_a_clients_p99_on_the_engines_cliff_is_not_called_host_noise() -> None:
    """Trial 0's clients' ITL p99 is over twice the engine's (flagged by outside_engine) but
    inside the engine's own band on a cliff: the `noisy:` line and the twin rows' `(host)` used
    to blame the host for it (session 5 found half of those flags were this). Trial 1's is far
    beyond its band: the host's."""
    cliff = TrialRecord(number=0, params={"max-num-batched-tokens": 2048},
                        state=TrialState.COMPLETE, phase="confirm",
                        metrics={"chat.itl_p99": 0.0519, "itl_p99": 0.0519,
                                 "engine_itl_p99": 0.0166},
                        predicted={"chat.itl_p99": 0.020}, itl_band=(0.0166, 0.212))
    host = TrialRecord(number=1, params={"max-num-batched-tokens": 4096},
                       state=TrialState.COMPLETE, phase="confirm",
                       metrics={"chat.itl_p99": 0.0560, "itl_p99": 0.0560,
                                "engine_itl_p99": 0.0180},
                       predicted={"chat.itl_p99": 0.020}, itl_band=(0.0150, 0.0190))
    res = Results(trials=[cliff, host], objectives=[ObjectiveDef("itl_p99", "chat", "minimize")],
                  constraints=[], baseline=None, best=0, pareto=[])
    text = format_results(res)
    noisy = next(x for x in text.splitlines() if x.startswith("noisy:"))
    assert "1 of 2 measured trials (1)" in noisy
    assert "cliff: 1 of 2 measured trials (0)" in text
    rows = {line.split()[0]: line for line in text.splitlines()
            if line.strip().startswith(("0 ", "1 ")) and "chat.itl_p99" in line}
    assert rows["0"].endswith("(cliff)") and "(host)" not in rows["0"]
    assert rows["1"].endswith("(host)")
    assert "(cliff): trial 0" in text  # not counted in the twin's error, and why
    # neither counts in the twin's error: no median to show
    assert "median |error|: -" in text
