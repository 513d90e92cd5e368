"""The served engine and the virtual-time engine agree on the same workload.

The ``smoke`` profile's requests (``generate(profile)``: 20 s of Poisson arrivals, long-context
and chat classes) are sent to ``chunktune sim serve`` by an aiohttp client, each at its arrival
time, with token-id prompts (exact counts); ``Engine.replay`` runs the same specs in virtual
time. TTFT, ITL and E2E medians must agree within 10 %, plus what the machine demonstrably
added in the same run: the time the server's own timeline slipped (its ``/sim/stats``
``slipped``: steps that started late because Python was descheduled, 0 on an idle machine) and
the scheduling noise a probe process saw meanwhile (:class:`tests.timing.SchedulingNoise`),
with one retry of the run when only that bound misses. On a busy 2-core machine TTFT p50 came
out 30 % high with both of those large; idle, both are about zero and the 10 % stands.

The engine is Llama-3.1-8B on an A100 at vLLM's defaults (budget 2048): its steps (~13 ms
decode) are long enough that the HTTP path's fixed cost (~1-2 ms per request on a busy 2-core
machine, measured by the client on top of the engine's own TTFT) stays well inside the
tolerance. On an H100 (7 ms decode steps, TTFT p50 ~18 ms) TTFT p50 comes out 10-17 % high for
that reason (the server's own TTFT histogram agrees with virtual time within ~1 %), while ITL
and E2E agree within ~2 % — see ``bench/serve_overhead.py``.
"""

from __future__ import annotations

import asyncio

import pytest
import requests
from bench.serve_overhead import (
    compare,
    replay_http,
    served_latencies,
    start_server,
    virtual_latencies,
)

from chunktune.core.workload import RequestSpec, generate, load_profile
from tests.timing import SchedulingNoise, retry_timing, timing

MODEL, GPU = "llama-3.1-8b", "a100-sxm"


@pytest.mark.slow
def test_served_matches_virtual_time_on_the_smoke_profile():
    specs = generate(load_profile("smoke"))
    assert len(specs) > 100
    virtual = virtual_latencies(MODEL, GPU, [], specs)
    retry_timing(lambda: _served_run(specs, virtual), attempts=2)


def _served_run(specs: list[RequestSpec], virtual: dict[str, list[float]]) -> None:
    with start_server(MODEL, ["--gpu", GPU]) as srv, SchedulingNoise() as noise:
        records = asyncio.run(replay_http(srv.url, specs))
        stats = requests.get(srv.url + "/sim/stats", timeout=30).json()
    errors = [r.error for r in records if r.error]
    assert not errors, errors[:3]
    for spec, rec in zip(specs, records, strict=True):
        assert len(rec.token_times) == spec.output_tokens
        assert rec.usage == {"prompt_tokens": spec.prompt_tokens,
                             "completion_tokens": spec.output_tokens,
                             "total_tokens": spec.prompt_tokens + spec.output_tokens,
                             "prompt_tokens_details": None,
                             "completion_tokens_details": None}
    result = compare(served_latencies(records), virtual)
    # What the machine added, by the server's own clock: the timeline's total slip for the
    # latencies that span many steps (TTFT, E2E), the median step's wake-up lateness for ITL.
    slipped = stats["slipped"]
    late_step = max(0.0, stats.get("lateness_p50", 0.0))
    for metric, d in result.items():
        machine = (late_step + noise.q(0.5) if metric == "itl"
                   else slipped + noise.q(0.95))
        tolerance = 0.10 * d["virtual_p50"] + machine
        timing(abs(d["served_p50"] - d["virtual_p50"]) < tolerance,
               metric, d, slipped, late_step, noise)
