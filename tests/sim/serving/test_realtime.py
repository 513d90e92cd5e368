"""The real-time engine loop in process (no HTTP): token delivery, abort of waiting and running
requests, timing against the step-time model, the loop's statistics."""

from __future__ import annotations

import asyncio

import pytest

from chunktune.core.engine_args import EngineArgs
from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.sim.engine.virtual import Engine, build_engine
from chunktune.sim.serving.metrics import VllmMetrics
from chunktune.sim.serving.realtime import RealtimeEngine

pytestmark = pytest.mark.asyncio


def _engine(**kw: int | str) -> Engine:
    return build_engine(EngineArgs(max_model_len=8192, **kw), resolve_model("llama-3.1-8b"),
                        resolve_gpu("h100-sxm"))


async def _drain(stream) -> int:
    got = 0
    while n := await stream.wait():
        got += n
    return got


async def test_every_request_gets_exactly_max_tokens_and_blocks_are_freed():
    engine = _engine()
    metrics = VllmMetrics(engine.cfg, engine.memory, "m")
    rt = RealtimeEngine(engine, metrics)
    rt.start()
    streams = [rt.submit(p, o) for p, o in ((100, 5), (900, 12), (30, 1), (2000, 3))]
    got = await asyncio.gather(*(_drain(s) for s in streams))
    assert got == [5, 12, 1, 3]
    assert all(s.finished and not s.aborted for s in streams)
    assert all(s.first_token >= s.arrival for s in streams)
    sched = engine.scheduler
    assert not sched.has_work and sched.pool.free == sched.pool.total
    assert rt.stats.steps > 0
    summary = rt.stats.summary()
    assert {"overhead_p50", "overhead_p99", "step_time_p50", "lateness_p50"} <= set(summary)
    assert summary["overhead_p50"] < summary["step_time_p50"]
    assert "Python overhead per step" in rt.stats.format()
    await rt.stop()


async def test_ttft_matches_the_step_time_model():
    engine = _engine()
    rt = RealtimeEngine(engine)
    rt.start()
    await asyncio.sleep(0.01)
    stream = rt.submit(1000, 2)
    await _drain(stream)
    ttft = stream.first_token - stream.arrival
    prefill = engine.cost.step_time(1000, 1, 1, [(1000, 0)], 0, 0)
    # Up to 10 ms of wake-up and token-push overhead, plus however far a busy machine made the
    # loop's timeline slip (the engine's own account; 0 when idle).
    assert prefill - 0.002 < ttft < prefill + 0.01 + rt.stats.slipped, (ttft, prefill,
                                                                        rt.stats.summary())
    await rt.stop()


async def test_abort_waiting_and_running():
    engine = _engine(max_num_seqs=1)
    metrics = VllmMetrics(engine.cfg, engine.memory, "m")
    rt = RealtimeEngine(engine, metrics)
    rt.start()
    first = rt.submit(50, 1000)
    second = rt.submit(50, 1000)  # waits: one running request at most
    while first.produced < 2:
        await asyncio.sleep(0.005)
    sched = engine.scheduler
    assert len(sched.running) == 1 and len(sched.waiting) == 1
    rt.abort(second)
    assert second.finished and second.aborted and len(sched.waiting) == 0
    assert await second.wait() == 0
    rt.abort(first)
    assert not sched.has_work and sched.pool.free == sched.pool.total
    assert metrics.success["abort"]._value.get() == 2
    third = rt.submit(10, 3)
    assert await _drain(third) == 3
    await rt.stop()


async def test_stop_aborts_what_is_left():
    engine = _engine()
    rt = RealtimeEngine(engine)
    rt.start()
    stream = rt.submit(10, 10_000)
    await asyncio.sleep(0.03)
    await rt.stop()
    assert stream.aborted and await stream.wait() >= 0
    assert not engine.scheduler.has_work
    with pytest.raises(RuntimeError):
        rt.submit(10, 2)


@pytest.mark.parametrize(("policy", "order"), [("priority", [2, 3, 1]), ("fcfs", [1, 2, 3])])
async def test_request_priority_orders_waiting_under_the_priority_policy(policy, order):
    """One running slot; three requests queue behind a long one with priorities 2, 0, 1:
    ``priority`` serves them lowest first, ``fcfs`` in arrival order."""
    engine = _engine(max_num_seqs=1, scheduling_policy=policy)
    rt = RealtimeEngine(engine)
    rt.start()
    first = rt.submit(4000, 4)
    queued = [rt.submit(100, 2, priority=p) for p in (2, 0, 1)]
    await asyncio.gather(*(_drain(s) for s in (first, *queued)))
    by_first_token = sorted(range(3), key=lambda i: queued[i].first_token)
    assert [i + 1 for i in by_first_token] == order
    assert first.first_token < min(s.first_token for s in queued)
    await rt.stop()
