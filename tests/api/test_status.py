"""render_status and set_condition: the status shape, bounded trial lists, conditions."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from chunktune.api.status import improvement, render_status, set_condition
from chunktune.core.study_records import StudySummary, TrialRecord

T0 = datetime(2026, 12, 2, 18, 0, tzinfo=UTC)


def trial(n: int, state: str = "COMPLETE", ttft: float = 1.0, **params: int) -> TrialRecord:
    return TrialRecord(
        number=n,
        params={"max-num-batched-tokens": 512 * (n + 1), "long-prefill-token-threshold": 0,
                **params},
        state=state,
        reason=None if state in ("COMPLETE", "RUNNING") else "SLOViolated",
        metrics={"long-context.ttft_p99": ttft, "ttft_p99": ttft, "chat.itl_p99": 0.04,
                 "total_tokens_per_s": 1234.5, "nan_metric": math.nan},
        constraints_ok=state != "INFEASIBLE",
    )


def test_shape() -> None:
    trials = [trial(0, ttft=3.0), trial(1, ttft=2.0), trial(2, "INFEASIBLE", ttft=1.0),
              trial(3, "PRUNED"), trial(4, "FAIL"), trial(5, "SKIPPED"), trial(6, "RUNNING")]
    status = render_status(StudySummary(
        phase="Running", trials=trials, objectives=[("long-context.ttft_p99", "minimize")],
        key_metrics=["chat.itl_p99"], baseline=0, best=1, max_trials=20,
        observed_generation=3, start_time=T0, message="7 of 20 trials"))
    assert status["phase"] == "Running"
    assert status["observedGeneration"] == 3
    assert status["startTime"] == "2026-12-02T18:00:00Z"
    assert "completionTime" not in status
    assert status["counts"] == {"completed": 2, "pruned": 1, "infeasible": 1, "failed": 1,
                                "running": 1, "skipped": 1}
    assert status["trialsCompleted"] == 5
    assert status["trialsSummary"] == "5/20"
    best = status["best"]
    assert best["trial"] == 1
    assert best["parameters"] == {"max-num-batched-tokens": 1024,
                                  "long-prefill-token-threshold": 0}
    assert best["flags"] == "--max-num-batched-tokens 1024 --long-prefill-token-threshold 0"
    assert best["improvement"] == "-33%"
    assert best["metrics"]["ttft_p99"] == 2.0  # the printer column's path
    assert "nan_metric" not in best["metrics"]  # not representable in JSON
    assert status["baseline"]["trial"] == 0 and "improvement" not in status["baseline"]
    assert "paretoFront" not in status
    assert status["trials"][2] == {
        "number": 2, "parameters": {"max-num-batched-tokens": 1536,
                                    "long-prefill-token-threshold": 0},
        "state": "INFEASIBLE", "reason": "SLOViolated",
        "metrics": {"long-context.ttft_p99": 1.0, "chat.itl_p99": 0.04}}


def test_a_baseline_that_stays_best_reads_no_change() -> None:
    """When no trial beats the defaults, the best is the baseline and its Improvement column
    reads 0% (as the results file's improvement does), not an empty cell."""
    trials = [trial(0, ttft=1.0), trial(1, ttft=2.0)]
    status = render_status(StudySummary(
        phase="Succeeded", trials=trials, objectives=[("ttft_p99", "minimize")], baseline=0,
        best=0))
    assert status["best"]["trial"] == 0 and status["best"]["improvement"] == "0%"


def test_trials_are_bounded_but_counted() -> None:
    trials = [trial(n) for n in reversed(range(120))]
    status = render_status(StudySummary(phase="Succeeded", trials=trials, max_trials=120,
                                        completion_time="2026-12-02T19:00:00Z"))
    assert len(status["trials"]) == 50
    assert [t["number"] for t in status["trials"]] == list(range(70, 120))
    assert status["counts"]["completed"] == 120 and status["trialsSummary"] == "120/120"
    assert status["completionTime"] == "2026-12-02T19:00:00Z"
    small = render_status(StudySummary(phase="Running", trials=trials, trials_limit=5))
    assert [t["number"] for t in small["trials"]] == [115, 116, 117, 118, 119]
    assert small["trialsSummary"] == "120"


def test_pareto_front() -> None:
    trials = [trial(0, ttft=2.0), trial(1, ttft=1.0), trial(2, ttft=1.5)]
    status = render_status(StudySummary(
        phase="Succeeded", trials=trials, baseline=0, pareto=[1, 2, 99],
        objectives=[("ttft_p99", "minimize"), ("total_tokens_per_s", "maximize")]))
    assert [p["trial"] for p in status["paretoFront"]] == [1, 2]
    assert [p["improvement"] for p in status["paretoFront"]] == ["-50%", "-25%"]
    assert "best" not in status


def test_cost_model_line_in_the_status() -> None:
    """A simulated study says what its GPU's step-time model was fitted on; a cut keeps it
    within the CRD's bound on status strings."""
    line = "b300: no measured kernels; borrowed from b200"
    status = render_status(StudySummary(phase="Running", cost_model=line))
    assert status["costModel"] == line
    assert "costModel" not in render_status(StudySummary(phase="Running"))
    long = render_status(StudySummary(phase="Running", cost_model="x" * 10_000))["costModel"]
    assert len(long) <= 4096 and long.endswith("(cut)")


def test_empty_study() -> None:
    assert render_status(StudySummary(phase="Pending")) == {
        "phase": "Pending", "conditions": [], "trialsCompleted": 0, "trialsSummary": "0",
        "counts": {"completed": 0, "pruned": 0, "infeasible": 0, "failed": 0, "running": 0,
                   "skipped": 0},
        "trials": []}


@pytest.mark.parametrize(("value", "base", "text"), [
    (0.66, 1.0, "-34%"), (1.2, 1.0, "+20%"), (1.001, 1.0, "0%"), (1.0, 0.0, None),
    (math.inf, 1.0, None)])
def test_improvement(value: float, base: float, text: str | None) -> None:
    assert improvement(value, base) == text


def test_set_condition_keeps_transition_time_until_status_flips() -> None:
    t1, t2, t3 = T0, T0.replace(minute=5), T0.replace(minute=9)
    conds = set_condition([], "Running", True, "TrialsRunning", "1 of 20", 1, t1)
    assert conds == [{"type": "Running", "status": "True", "reason": "TrialsRunning",
                      "message": "1 of 20", "lastTransitionTime": "2026-12-02T18:00:00Z",
                      "observedGeneration": 1}]
    conds2 = set_condition(conds, "Running", True, "TrialsRunning", "5 of 20", 2, t2)
    assert conds2[0]["lastTransitionTime"] == "2026-12-02T18:00:00Z"
    assert conds2[0]["message"] == "5 of 20" and conds2[0]["observedGeneration"] == 2
    assert conds[0]["message"] == "1 of 20"  # the input is not changed
    conds3 = set_condition(conds2, "Running", False, "Done", "finished", 2, t3)
    assert conds3[0]["lastTransitionTime"] == "2026-12-02T18:09:00Z"
    both = set_condition(conds3, "Complete", "True", "BudgetSpent", "20 trials", None, t3)
    assert [c["type"] for c in both] == ["Running", "Complete"]
    assert "observedGeneration" not in both[1]
    with pytest.raises(ValueError):
        set_condition([], "Running", "yes", "r", "m", None, t1)


def test_conditions_pass_through_render() -> None:
    conds = set_condition([], "Ready", False, "Pending", "waiting", 1, T0)
    status = render_status(StudySummary(phase="Pending", conditions=conds))
    assert status["conditions"] == conds


def test_a_derived_workload_and_the_retune_history_render() -> None:
    workload = {"url": "http://prom:9090", "selector": '{model_name="m"}', "window": 3600.0,
                "peakWindow": 300.0, "at": "2026-01-01T00:00:00Z", "rateFrom": "mean",
                "rate": 3.2, "peakRate": 7.9, "requests": 11520.0, "longShare": 0.17,
                "longThreshold": 2000.0, "promptTokens": {"p50": 473.0, "p99": 15733.0},
                "outputTokens": {"p50": 94.0, "mean": 110.0}}
    retune = {"state": "Watching", "round": 1, "checks": 12, "drifting": 0,
              "study": "ns/t#retune-1", "reference": {"rate": 3.2},
              "lastCheck": {"time": "2026-01-01T01:00:00Z", "drift": []},
              "history": [{"round": 1, "study": "ns/t#retune-1", "started": "s",
                           "finished": "f", "reasons": ["arrival rate 2 -> 4 req/s"],
                           "outcome": "Applied", "running": {"max-num-seqs": 256},
                           "best": {"max-num-seqs": 128}, "metric": "ttft_p99",
                           "before": 1.0, "after": 0.8, "gain": "-20%",
                           "confirmedBy": [3, 5]}]}
    s = render_status(StudySummary(phase="Succeeded", workload=workload, retune=retune))
    assert s["workload"]["promptTokens"] == {"p50": 473.0, "p99": 15733.0}
    assert s["workload"]["selector"] == '{model_name="m"}' and s["workload"]["peakRate"] == 7.9
    (entry,) = s["retune"]["history"]
    assert entry["outcome"] == "Applied" and entry["confirmedBy"] == [3, 5]
    assert s["retune"]["lastCheck"] == {"time": "2026-01-01T01:00:00Z", "drift": []}
    with pytest.raises(ValueError):
        render_status(StudySummary(phase="Succeeded", retune={**retune, "history": [
            {**retune["history"][0], "outcome": "Maybe"}]}))
