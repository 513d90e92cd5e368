"""Helpers every backend shares (chunktune.backends.base)."""

from __future__ import annotations

import asyncio

import pytest

from chunktune.backends.base import take_kv_peak_from_steps, within
from chunktune.core.steps import StepRecord
from chunktune.core.trials import TrialResult, TrialState


def steps(*pcts: float | None) -> list[StepRecord]:
    return [StepRecord(iteration=i, context_requests=0, context_tokens=0, generation_requests=1,
                       generation_tokens=1, elapsed_ms=5.0, kv_usage_pct=p)
            for i, p in enumerate(pcts)]


def test_the_step_logs_kv_peak_raises_the_scraped_one() -> None:
    # scraped before and after the load only (an idle engine's usage); the steps saw 42%
    r = TrialResult(TrialState.COMPLETE, metrics={"kv_cache_usage_peak": 0.01, "ttft_p99": 1.0},
                    server={"kv_cache_usage_peak": 0.01}, steps=steps(3.0, 42.0, 7.5))
    take_kv_peak_from_steps(r)
    assert r.metrics == {"kv_cache_usage_peak": pytest.approx(0.42), "ttft_p99": 1.0}
    assert r.server == {"kv_cache_usage_peak": pytest.approx(0.42)}


def test_a_higher_sample_stays_and_nothing_is_invented() -> None:
    r = TrialResult(TrialState.COMPLETE, metrics={"kv_cache_usage_peak": 0.9},
                    steps=steps(42.0))
    take_kv_peak_from_steps(r)
    assert r.metrics == {"kv_cache_usage_peak": 0.9} and r.server == {}
    # no scraped figure (a failed trial) or no usage in the log: left as it was
    failed = TrialResult(TrialState.FAIL, steps=steps(42.0))
    take_kv_peak_from_steps(failed)
    assert failed.metrics == {}
    blank = TrialResult(TrialState.COMPLETE, metrics={"kv_cache_usage_peak": 0.1},
                        steps=steps(None))
    take_kv_peak_from_steps(blank)
    assert blank.metrics == {"kv_cache_usage_peak": 0.1}


@pytest.mark.asyncio
async def test_within_leaves_the_paused_time_out_of_the_timeout() -> None:
    """A trial whose engine waited for capacity: ``budget.trialTimeout`` counts only the rest
    (the tuner runs each trial under :func:`within`)."""
    started = asyncio.Event()
    cleaned: list[str] = []

    async def trial(seconds: float) -> str:
        started.set()
        try:
            await asyncio.sleep(seconds)
        finally:
            cleaned.append("done")
        return "result"

    assert await within(trial(0.5), 0.2, lambda: 30.0) == "result"
    with pytest.raises(TimeoutError):  # nothing paused: the plain timeout
        await within(trial(30.0), 0.2, lambda: 0.0)
    assert cleaned == ["done", "done"]  # the timed-out trial ran its clean-up first
    task = asyncio.ensure_future(within(trial(30.0), 60.0, lambda: 0.0))
    started.clear()
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == ["done"] * 3


def test_a_complete_trial_without_a_scraped_peak_gets_the_step_logs() -> None:
    """What the runner did apart (it applied the peak a second time): now this rule only."""
    r = TrialResult(TrialState.COMPLETE, metrics={"ttft_p99": 1.0}, steps=steps(3.0, 42.0))
    take_kv_peak_from_steps(r)
    assert r.metrics["kv_cache_usage_peak"] == 0.42 and r.server == {}
