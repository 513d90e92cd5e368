"""The trust check of a twin-first study (``maxTwinError``): an objective is judged by the
twin's relative error, a constraint metric by how far the twin misses against its bound
(:func:`chunktune.tuning.results.trust.trust_errors`)."""

from __future__ import annotations

import pytest

from chunktune.core.study_records import TrialRecord
from chunktune.core.trials import TrialState
from chunktune.tuning.objectives import ConstraintDef, ObjectiveDef
from chunktune.tuning.results.model import collect_trials
from chunktune.tuning.results.text import format_results
from chunktune.tuning.results.trust import trust_errors

ITL = ObjectiveDef("itl_p99", "chat", "minimize")
TTFT = ConstraintDef("ttft_p99", "chat", 3.0, None)  # chat.ttft_p99 <= 3s
ERRORS = ConstraintDef("error_rate", None, 0.01, None)  # error_rate <= 1%
TPUT = ConstraintDef("output_tokens_per_s", None, None, 1000.0)  # >= 1000 tokens/s


def rec(n: int, measured: dict[str, float], predicted: dict[str, float]) -> TrialRecord:
    return TrialRecord(n, {"max-num-batched-tokens": 1024 * (n + 1)}, TrialState.COMPLETE,
                       metrics=measured, predicted=predicted)


def test_a_constraint_far_inside_its_bound_is_judged_against_the_bound() -> None:
    # the CPU example on a fast host: chat TTFT p99 predicted 91/56 ms, measured 196/116 ms,
    # against a bound of 3 s; the objective 4/7 ms predicted, 7/8 ms measured
    rows = [rec(4, {"chat.itl_p99": 0.0071, "chat.ttft_p99": 0.196},
                {"chat.itl_p99": 0.0038, "chat.ttft_p99": 0.091}),
            rec(5, {"chat.itl_p99": 0.0079, "chat.ttft_p99": 0.116},
                {"chat.itl_p99": 0.0074, "chat.ttft_p99": 0.056})]
    err = trust_errors(rows, [ITL], [TTFT])
    # the objective: its relative error, as before (47% and 6%: median 26%)
    assert err["chat.itl_p99"] == pytest.approx((0.0071 - 0.0038) / 0.0071 / 2
                                                + (0.0079 - 0.0074) / 0.0079 / 2)
    # the constraint: 105 and 60 ms of a 3 s bound (3.5% and 2%), not 54% and 52%
    assert err["chat.ttft_p99"] == pytest.approx((0.105 / 3 + 0.060 / 3) / 2)
    assert max(err.values()) < 0.3


def test_a_wrong_verdict_on_a_constraint_counts_in_full() -> None:
    # predicted inside the bound, measured beyond it: judged against the measurement
    beyond = [rec(1, {"chat.ttft_p99": 6.0}, {"chat.ttft_p99": 2.0})]
    assert trust_errors(beyond, [ITL], [TTFT])["chat.ttft_p99"] == pytest.approx(4.0 / 6.0)
    # near the bound a miss counts almost as its relative error
    near = [rec(1, {"chat.ttft_p99": 2.9}, {"chat.ttft_p99": 1.45})]
    assert trust_errors(near, [ITL], [TTFT])["chat.ttft_p99"] == pytest.approx(1.45 / 3.0)
    # no errors predicted, 2% measured against a bound of 1% (a measurement of 0 has no
    # relative error, but it has one against the bound)
    errors = [rec(1, {"error_rate": 0.02}, {"error_rate": 0.0})]
    assert trust_errors(errors, [ITL], [ERRORS])["error_rate"] == pytest.approx(1.0)
    assert trust_errors([rec(1, {"error_rate": 0.0}, {"error_rate": 0.0})], [ITL],
                        [ERRORS])["error_rate"] == 0.0
    # a lower bound the same way: throughput 1800 predicted, 1200 measured, >= 1000
    tput = [rec(1, {"output_tokens_per_s": 1200.0}, {"output_tokens_per_s": 1800.0})]
    assert trust_errors(tput, [ITL], [TPUT])["output_tokens_per_s"] == pytest.approx(0.5)


def test_a_metric_both_objective_and_constraint_is_judged_as_the_objective() -> None:
    both = ConstraintDef("itl_p99", "chat", 1.0, None)  # chat.itl_p99 <= 1s
    rows = [rec(1, {"chat.itl_p99": 0.010}, {"chat.itl_p99": 0.005})]
    assert trust_errors(rows, [ITL], [both]) == {"chat.itl_p99": pytest.approx(0.5)}


def test_measurements_set_outside_the_engine_are_left_out() -> None:
    host = rec(1, {"chat.ttft_p99": 6.0, "itl_p99": 0.060, "engine_itl_p99": 0.010},
               {"chat.ttft_p99": 0.1})
    assert "chat.ttft_p99" not in trust_errors([host], [ITL], [TTFT])


def test_the_results_show_a_constraints_error_against_its_bound() -> None:
    import optuna

    from chunktune.tuning import study as st

    study = optuna.create_study()
    dist = {"max-num-batched-tokens": optuna.distributions.IntDistribution(256, 8192)}
    for n, (meas, pred) in enumerate([((0.0071, 0.196), (0.0038, 0.091)),
                                      ((0.0079, 0.116), (0.0074, 0.056))]):
        study.add_trial(optuna.trial.create_trial(
            params={"max-num-batched-tokens": 1024 * (n + 1)}, distributions=dist,
            value=meas[0], user_attrs={
                st.ATTR_METRICS: {"chat.itl_p99": meas[0], "chat.ttft_p99": meas[1]},
                st.ATTR_PREDICTED: {"chat.itl_p99": pred[0], "chat.ttft_p99": pred[1]}}))
    text = format_results(collect_trials(study.get_trials(), [ITL], [TTFT]))
    assert "median |error|: chat.itl_p99 26%, chat.ttft_p99 53%" in text
    assert "against the bound (what maxTwinError judges for a constraint): " \
           "chat.ttft_p99 3% (bound 3.00s)" in text
