"""``sim serve --enable-logging-iteration-details``: one vLLM ``Iteration(N)`` line per engine
step, parseable by :mod:`chunktune.core.steps`, with the scheduler's counts (vLLM's context /
generation rule, :func:`chunktune.sim.engine.step_trace.iteration_counts`) and the simulated step
time."""

from __future__ import annotations

import io

import pytest
import requests
from bench.serve_overhead import start_server

from chunktune.core.engine_args import EngineArgs
from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.core.steps import StepRecord, format_line, parse_line, parse_meta, parse_steps
from chunktune.sim.engine.step_trace import run_batch
from chunktune.sim.engine.virtual import build_engine
from chunktune.sim.serving.realtime import RealtimeEngine

from .conftest import wait_for

#: Prompts and outputs (tokens): with a 256-token budget the long prompts are chunked (later
#: chunks still count as context) while the short ones decode beside them.
REQUESTS = [(600, 4), (40, 6), (300, 3), (10, 8)]


def test_format_line_is_what_the_parser_reads():
    r = StepRecord(7, 2, 512, 30, 30, 41.5234, kv_usage_pct=12.34)
    line = "INFO 12-03 01:02:03 [loggers.py:199] " + format_line(r)
    assert line.endswith("Engine 000: Iteration(7): 2 context requests, 512 context tokens, "
                         "30 generation requests, 30 generation tokens, iteration elapsed "
                         "time: 41.52 ms, GPU KV cache usage: 12.3%")
    assert parse_line(line) == StepRecord(7, 2, 512, 30, 30, 41.52, kv_usage_pct=12.3)


@pytest.mark.asyncio
async def test_realtime_loop_logs_each_step_with_the_schedulers_counts():
    args = EngineArgs(max_model_len=2048, max_num_batched_tokens=256, max_num_seqs=8,
                      num_gpu_blocks_override=200)  # a small cache: a visible usage
    engine = build_engine(args, resolve_model("llama-3.1-8b"), resolve_gpu("h100-sxm"))
    expected = run_batch(engine.cfg, engine.memory.num_gpu_blocks,
                         [(str(i), p, o) for i, (p, o) in enumerate(REQUESTS)])
    out = io.StringIO()
    rt = RealtimeEngine(engine, step_log=out)
    streams = [rt.submit(p, o) for p, o in REQUESTS]  # all waiting before step 0
    rt.start()
    try:
        for s in streams:
            while await s.wait():
                pass
    finally:
        await rt.stop()
    lines = out.getvalue().splitlines()
    steps = parse_steps(lines)
    assert len(steps) == len(lines) == rt.stats.steps == len(expected.steps)
    assert [s.iteration for s in steps] == list(range(len(steps)))
    assert [(s.context_requests, s.context_tokens, s.generation_requests,
             s.generation_tokens) for s in steps] == expected.steps
    assert steps[0].context_tokens == 256 and steps[0].generation_requests == 0
    # the elapsed time is the simulated step time (to the line's 0.01 ms)
    assert [s.elapsed_ms for s in steps] == pytest.approx(
        [dt * 1e3 for dt in rt.stats.step_time], abs=0.006)
    assert all(s.kv_usage_pct is not None for s in steps)
    assert steps[-1].kv_usage_pct == 0.0  # every request finished: its blocks are free
    assert all(s.kv_usage_pct > 0 for s in steps[:-1])  # type: ignore[operator]


@pytest.mark.asyncio
async def test_no_step_log_without_the_stream():
    engine = build_engine(EngineArgs(max_model_len=2048), resolve_model("llama-3.1-8b"),
                          resolve_gpu("h100-sxm"))
    rt = RealtimeEngine(engine)
    assert rt.step_log is None
    rt.start()
    s = rt.submit(50, 2)
    while await s.wait():
        pass
    await rt.stop()


@pytest.mark.slow  # a real sim serve process
def test_sim_serve_prints_iteration_lines_and_the_engine_identity():
    srv = start_server("llama-3.1-8b", ["--max-model-len", "2048", "--max-num-batched-tokens",
                                        "256", "--enable-logging-iteration-details"])
    try:
        r = requests.post(srv.url + "/v1/completions", timeout=30, json={
            "model": "llama-3.1-8b", "prompt": "hello " * 300, "max_tokens": 5})
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        # flushed while the engine still runs (as a pod's log is read before it is deleted)
        assert wait_for(lambda: sum(s.generation_tokens for s in parse_steps(srv.lines)) == 4)
    finally:
        srv.stop()
    steps = parse_steps(srv.lines)
    # one request: its prompt in 256-token chunks (context), then one token per step
    assert sum(s.context_tokens for s in steps) == usage["prompt_tokens"]
    assert all(s.context_requests + s.generation_requests == 1 for s in steps)
    chunks = -(-usage["prompt_tokens"] // 256)
    assert [s.context_requests for s in steps] == [1] * chunks + [0] * 4
    assert all(s.elapsed_ms > 0 for s in steps)
    meta = parse_meta(srv.lines)
    assert meta.model == "llama-3.1-8b" and meta.device == "GPU"
    assert meta.kv_cache_tokens and meta.kv_cache_tokens > 0
    assert meta.vllm_version and meta.vllm_version.endswith("+chunktune.sim")
    assert any("enable_logging_iteration_details" in x for x in srv.lines)  # non-default args


@pytest.mark.slow  # a real sim serve process
def test_sim_serve_without_the_flag_prints_no_iteration_lines():
    srv = start_server("llama-3.1-8b", ["--max-model-len", "2048"])
    try:
        r = requests.post(srv.url + "/v1/completions", timeout=30, json={
            "model": "llama-3.1-8b", "prompt": "hi", "max_tokens": 3})
        assert r.status_code == 200
    finally:
        srv.stop()
    assert parse_steps(srv.lines) == []
