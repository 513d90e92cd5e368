"""The virtual-time engine: determinism, closed loop, request validation."""

from __future__ import annotations

import math

import pytest
from bench.sim_speed import fingerprint

from chunktune.core.engine_args import EngineArgs
from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.core.workload import RequestSpec, generate, load_profile
from chunktune.sim.engine.request import FINISHED, REJECTED
from chunktune.sim.engine.virtual import build_engine
from chunktune.sim.report import summarize


def engine(**kw):
    return build_engine(EngineArgs(max_model_len=16384, **kw), resolve_model("llama-3.1-8b"),
                        resolve_gpu("h100-sxm"))


def test_deterministic_for_a_seed():
    p = load_profile("smoke")
    s1 = summarize(e := engine(), e.replay(generate(p)), p)
    s2 = summarize(e := engine(), e.replay(generate(p)), p)
    assert s1 == s2
    s3 = summarize(e := engine(), e.replay(generate(p.with_overrides(seed=7))), p)
    assert s3 != s1


def test_speed_bench_fingerprint_tells_replays_apart():
    """bench/sim_speed.py --fingerprint: equal for the same replay, different where one step's
    time moves by one ulp or one request's latency does (what a speed-up must not change)."""
    p = load_profile("smoke")
    a, b = engine().replay(generate(p)), engine().replay(generate(p))
    assert fingerprint(a) == fingerprint(b)
    b.steps.duration[len(b.steps) // 2] = math.nextafter(b.steps.duration[len(b.steps) // 2],
                                                         math.inf)
    assert fingerprint(a) != fingerprint(b)
    c = engine().replay(generate(p))
    c.requests[-1].itl[-1] = math.nextafter(c.requests[-1].itl[-1], 0.0)
    assert fingerprint(a) != fingerprint(c)


def test_every_request_finishes_with_its_tokens():
    p = load_profile("smoke")
    res = engine().replay(generate(p))
    assert all(r.status == FINISHED and r.num_output == r.max_tokens for r in res.requests)
    for r in res.requests:
        assert r.arrival <= r.first_scheduled <= r.first_token <= r.last_token
        assert len(r.itl) == r.num_output - 1
        assert abs((r.last_token - r.first_token) - sum(r.itl)) < 1e-9


def test_closed_loop_keeps_concurrency():
    specs = [RequestSpec(i, None, 200, 20, 0) for i in range(100)]
    e = engine()
    res = e.replay(specs, concurrency=8)
    assert max(res.steps.running[i] + res.steps.waiting[i] for i in range(len(res.steps))) <= 8
    assert sum(r.status == FINISHED for r in res.requests) == 100
    starts = sorted(r.arrival for r in res.requests)
    assert starts[:8] == [0.0] * 8 and starts[8] > 0


def test_closed_loop_sends_the_first_wave_at_its_arrivals():
    """A closed loop's first N specs may carry send times (a client that spreads its first
    wave); later ones go when a request finishes, whatever their arrival says."""
    specs = [RequestSpec(i, 0.5 * i if i < 4 else 99.0, 200, 20, 0) for i in range(12)]
    res = engine().replay(specs, concurrency=4)
    first = {r.rid: r for r in res.requests}
    assert [first[i].arrival for i in range(4)] == [0.0, 0.5, 1.0, 1.5]
    assert all(first[i].first_scheduled >= first[i].arrival for i in range(4))
    # each later request is sent when one finishes, long before 99 s
    finishes = sorted(r.finish_time for r in res.requests)
    assert sorted(first[i].arrival for i in range(4, 12)) == finishes[:8]


def test_too_long_requests_are_rejected_like_vllm():
    e = engine()
    specs = [RequestSpec(0, 0.0, 16000, 1000, 0), RequestSpec(1, 0.1, 100, 10, 0)]
    res = e.replay(specs)
    assert res.requests[0].status == REJECTED
    assert "maximum context length is 16384 tokens" in res.rejected[0][1]
    assert res.requests[1].status == FINISHED


def test_time_limit_stops_the_clock():
    specs = [RequestSpec(i, None, 500, 2000, 0) for i in range(50)]
    res = engine().replay(specs, concurrency=10, time_limit=5.0)
    assert 5.0 <= res.end_time < 5.5


def test_server_cost_delays_each_request_by_its_part_at_idle():
    """The pre-first-token server cost: at idle every TTFT and E2E grows by exactly its fixed
    part plus its part per prompt token."""
    from chunktune.core.workload import RequestSpec
    from chunktune.sim.engine.virtual import API_SERVER

    eng = build_engine(EngineArgs(max_model_len=8192), resolve_model("llama-3.1-8b"),
                       resolve_gpu("h100-sxm"))
    specs = [RequestSpec(i, 10.0 * i, 500 * (i + 1), 20, 0) for i in range(3)]  # idle
    base = eng.replay(specs)
    eng2 = build_engine(EngineArgs(max_model_len=8192), resolve_model("llama-3.1-8b"),
                        resolve_gpu("h100-sxm"))
    slow = eng2.replay(specs, server_overhead_s=API_SERVER.fixed_s,
                       server_per_token_s=API_SERVER.per_prompt_token_s)
    for a, b in zip(base.requests, slow.requests, strict=True):
        cost = API_SERVER.before_first_token(a.prompt_len)
        assert cost == pytest.approx(API_SERVER.fixed_s + 2e-6 * a.prompt_len)
        assert a.arrival == b.arrival
        assert b.first_token - a.first_token == pytest.approx(cost)
        assert b.finish_time - a.finish_time == pytest.approx(cost)


def test_a_calibration_profile_s_server_overhead_replaces_the_default():
    """A profile's fitted figure is the engine's own, measured: it replaces the default whole
    (its per-token part included)."""
    from chunktune.sim.engine.virtual import API_SERVER, ServerCost, server_cost

    assert server_cost(None) == API_SERVER
    assert server_cost(0.004) == ServerCost(0.004, 0.0)
    assert server_cost(0.0) == ServerCost()
    eng2 = build_engine(EngineArgs(max_model_len=8192), resolve_model("llama-3.1-8b"),
                        resolve_gpu("h100-sxm"))
    specs = [RequestSpec(i, 10.0 * i, 500, 20, 0) for i in range(3)]
    closed = eng2.replay(specs, concurrency=1, server_overhead_s=0.05)
    assert all(r.first_token - r.arrival >= 0.05 for r in closed.requests)
