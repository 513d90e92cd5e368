"""A client that goes away has its request aborted in the scheduler: its KV blocks are freed,
it is counted as ``finished_reason="abort"``, and the server keeps serving."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.sim.serving.conftest import MODEL, metric_samples, post, value, wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]  # a real sim serve process


def _idle(sim) -> bool:
    s = metric_samples(sim)
    return (value(s, "vllm:num_requests_running") == 0
            and value(s, "vllm:num_requests_waiting") == 0
            and value(s, "vllm:kv_cache_usage_perc") == 0)


async def test_streaming_client_disconnect_aborts(sim):
    assert wait_for(lambda: _idle(sim))
    aborts = value(metric_samples(sim), "vllm:request_success_total", finished_reason="abort")
    async with aiohttp.ClientSession() as s:
        body = {"model": MODEL, "prompt": list(range(1500)), "max_tokens": 2000,
                "stream": True}
        resp = await s.post(sim.url + "/v1/completions", json=body)
        events = 0
        async for line in resp.content:
            if line.startswith(b"data: "):
                events += 1
                if events == 3:
                    break
        s_mid = metric_samples(sim)
        assert value(s_mid, "vllm:num_requests_running") == 1
        assert value(s_mid, "vllm:kv_cache_usage_perc") > 0
        resp.close()  # drop the connection mid-stream
    assert wait_for(lambda: _idle(sim), timeout=5)
    after = value(metric_samples(sim), "vllm:request_success_total", finished_reason="abort")
    assert after == aborts + 1
    r = post(sim, "/v1/completions", {"model": MODEL, "prompt": "still there?", "max_tokens": 3})
    assert r.status_code == 200


async def test_non_streaming_client_timeout_aborts(sim):
    assert wait_for(lambda: _idle(sim))
    aborts = value(metric_samples(sim), "vllm:request_success_total", finished_reason="abort")
    timeout = aiohttp.ClientTimeout(total=0.3)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "long answer"}],
                "max_tokens": 3000}
        with pytest.raises(asyncio.TimeoutError):
            async with s.post(sim.url + "/v1/chat/completions", json=body) as resp:
                await resp.read()
    assert wait_for(lambda: _idle(sim), timeout=5)
    after = value(metric_samples(sim), "vllm:request_success_total", finished_reason="abort")
    assert after == aborts + 1


async def test_one_disconnect_does_not_disturb_the_others(sim):
    async with aiohttp.ClientSession() as s:
        async def full(n: int) -> int:
            body = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": n, "stream": True}
            tokens = 0
            async with s.post(sim.url + "/v1/completions", json=body) as resp:
                async for line in resp.content:
                    if line.startswith(b"data: {"):
                        tokens += 1
            return tokens

        async def quitter() -> None:
            body = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 500, "stream": True}
            resp = await s.post(sim.url + "/v1/completions", json=body)
            await resp.content.readline()
            resp.close()

        got = await asyncio.gather(full(20), full(30), quitter())
    assert got[:2] == [20, 30]
    assert wait_for(lambda: _idle(sim), timeout=5)
