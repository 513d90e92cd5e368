"""Attention data parallelism (``--data-parallel-size``): ranks of an expert-parallel MoE model
with their own schedulers and KV caches, stepping together."""

from __future__ import annotations

import pytest

from chunktune.core.engine_args import EngineArgs
from chunktune.core.errors import SpecError
from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.core.workload import RequestSpec
from chunktune.sim.engine.data_parallel import DataParallelEngine, build_data_parallel_engine
from chunktune.sim.engine.mxfp4 import TRITON, mxfp4_layer_bytes
from chunktune.sim.engine.request import Request
from chunktune.sim.engine.scheduler import Scheduler
from chunktune.sim.engine.virtual import build_engine

MODEL = "gpt-oss-120b"


def _args(dp: int) -> EngineArgs:
    return EngineArgs(tensor_parallel_size=1, data_parallel_size=dp,
                      enable_expert_parallel=True, max_num_batched_tokens=2048,
                      max_num_seqs=64, max_model_len=4096, async_scheduling=True)


@pytest.fixture(scope="module")
def dp2() -> DataParallelEngine:
    return build_data_parallel_engine(_args(2), resolve_model(MODEL), resolve_gpu("h200"))


def test_a_rank_holds_its_attention_whole_and_its_share_of_the_experts(dp2):
    """Each rank's weights: everything but the routed experts as at its TP (1), the routed
    experts split over the DP x TP ranks; the memory they free goes to the rank's KV cache
    (gpt-oss's MXFP4 experts as the H200's Triton backend stores them, ``sim/engine/mxfp4.py``:
    whole experts under EP, so half the layer's bytes on each of 2 ranks)."""
    model = resolve_model(MODEL)
    one = model.weight_bytes(1)
    experts = model.num_moe_layers * model.expert_params() * model.module_weight_bytes("experts")
    held = model.num_moe_layers * mxfp4_layer_bytes(model, TRITON, None)
    assert dp2.memory.weights == pytest.approx(one - experts + held / 2)
    assert model.weight_bytes(2, data_parallel=2) == pytest.approx(model.weight_bytes(2)
                                                                   - experts / 4)
    alone = build_engine(EngineArgs(**{**_args(1).__dict__, "data_parallel_size": 1}),
                         model, resolve_gpu("h200"))
    assert dp2.memory.num_gpu_blocks > alone.memory.num_gpu_blocks


def test_an_idle_rank_runs_a_dummy_step_and_the_experts_see_every_rank(dp2):
    """With one request on two ranks, the other rank runs a one-token dummy forward; a
    300-token prefill exceeds the capture sizes (max_num_seqs 64: up to 128), so no rank is
    padded (vLLM pads only when every rank runs a graph): the experts see 300 + 1 tokens and
    the dummy runs without its graph."""
    assert dp2.cfg.cudagraph_capture_sizes[-1] == 128
    sched = Scheduler(dp2.cfg, dp2.memory.num_gpu_blocks)
    sched.add_request(Request(0, 0.0, 300, 10))
    plan = sched.schedule(0.0)
    assert plan.num_tokens == 300
    cost = dp2.cost
    busy = cost.step_time(300, 1, plan.num_logits, plan.prefill_chunks, 0, 0, 301)
    dummy = cost.step_time(1, 0, 0, [], 0, 0, 301, without_graphs=True)
    assert dp2.step_time([plan, None]) == pytest.approx(max(busy, dummy))
    # the experts of the gathered 600 tokens cost more than those of the rank's 300 alone
    assert cost.dp_experts_time(600) > cost.dp_experts_time(300) > 0.0
    assert busy > cost.step_time(300, 1, plan.num_logits, plan.prefill_chunks, 0, 0, 300)
    # a graph-less forward of one token costs the host's kernel launches
    assert dummy > cost.step_time(1, 0, 0, [], 0, 0, 301)


def test_graphed_ranks_run_the_largest_ranks_padded_graph(dp2):
    """Decodes that fit a graph on every rank: each rank (the idle one's dummy too) runs the
    largest rank's capture size, and the experts see DP x that many tokens
    (``dp_utils._post_process_dp_padding``)."""
    sched = Scheduler(dp2.cfg, dp2.memory.num_gpu_blocks)
    for i in range(3):
        sched.add_request(Request(i, 0.0, 8, 10))
    plan = sched.schedule(0.0)
    assert plan.num_tokens == 24  # a capture size
    sched.apply(plan, 0.01)
    plan = sched.schedule(0.01)
    assert plan.num_decodes == 3 and plan.num_tokens == 3
    cost = dp2.cost
    busy = cost.step_time(4, 3, plan.num_logits, [], 3, plan.decode_context_tokens, 8)
    dummy = cost.step_time(4, 0, 0, [], 0, 0, 8)
    assert dp2.step_time([plan, None]) == pytest.approx(max(busy, dummy))
    # with a peer past the capture sizes, the same decodes run unpadded and without graphs
    big = Scheduler(dp2.cfg, dp2.memory.num_gpu_blocks)
    big.add_request(Request(9, 0.0, 1000, 10))
    prefill = big.schedule(0.0)
    assert prefill.num_tokens > dp2.cfg.cudagraph_capture_sizes[-1]
    gathered = prefill.num_tokens + 3
    eager = cost.step_time(3, 3, plan.num_logits, [], 3, plan.decode_context_tokens, gathered,
                           without_graphs=True)
    assert eager == pytest.approx(cost.step_time(3, 3, plan.num_logits, [], 3,
                                                 plan.decode_context_tokens, gathered)
                                  + cost.c.eager_launch_overhead_per_layer_s
                                  * dp2.cfg.model.num_hidden_layers)
    first = cost.step_time(prefill.num_tokens, 1, prefill.num_logits, prefill.prefill_chunks,
                           0, 0, gathered)
    assert dp2.step_time([plan, prefill]) == pytest.approx(max(eager, first))


def test_requests_are_spread_over_the_ranks_and_each_has_its_own_kv_cache(dp2):
    """vLLM's load balancer sends a request to the rank with the lowest 4 x waiting + running:
    two requests at once land on both ranks, each rank's KV cache holds its own."""
    specs = [RequestSpec(i, 0.0, 500, 20, 0) for i in range(2)]
    res = dp2.replay(specs, record_steps=True)
    assert all(r.finish_time > 0 for r in res.requests)
    # both prefilled in the first step, one on each rank (one rank would take 1000 tokens)
    assert res.steps.tokens[0] == 1000 and res.steps.prefill_tokens[0] == 1000
    # one request's blocks in each of gpt-oss's two KV-cache groups (sliding and full), at
    # most; two requests on one rank would take twice that
    blocks_one = 2 * -(-520 // dp2.cfg.block_size)
    assert res.peak_kv_blocks <= blocks_one
    # the two requests finish together: neither waits for the other's rank
    assert res.requests[0].finish_time == pytest.approx(res.requests[1].finish_time)


def test_closed_loop_replay_finishes_every_request(dp2):
    specs = [RequestSpec(i, 0.0 if i < 4 else None, 200 + 10 * i, 8, 0) for i in range(12)]
    res = dp2.replay(specs, concurrency=4, record_steps=False)
    assert len(res.requests) == 12 and all(r.finish_time > 0 for r in res.requests)


def test_data_parallelism_is_refused_where_it_is_not_modelled():
    """The single-engine path names the flag; the data-parallel engine refuses a dense model
    and sharded (not expert-parallel) experts."""
    gpu = resolve_gpu("h200")
    with pytest.raises(SpecError, match="--data-parallel-size"):
        build_engine(_args(2), resolve_model(MODEL), gpu)
    with pytest.raises(SpecError, match="mixture-of-experts"):
        build_data_parallel_engine(_args(2), resolve_model("llama-3.1-8b"), gpu)
    sharded = EngineArgs(**{**_args(2).__dict__, "enable_expert_parallel": False})
    with pytest.raises(SpecError, match="--enable-expert-parallel"):
        build_data_parallel_engine(sharded, resolve_model(MODEL), gpu)


def test_the_flag_is_an_engine_flag_vllm_takes():
    args = EngineArgs.from_point({"data-parallel-size": 4})
    assert args.data_parallel_size == 4 and "--data-parallel-size" in " ".join(args.to_cli())
    with pytest.raises(SpecError, match="data-parallel-size"):
        EngineArgs.from_point({"data-parallel-size": 0})
