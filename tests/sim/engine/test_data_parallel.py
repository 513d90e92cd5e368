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
    experts split over the DP x TP ranks; the memory they free goes to the rank's KV cache."""
    model = resolve_model(MODEL)
    one = model.weight_bytes(1)
    experts = model.num_moe_layers * model.expert_params() * model.module_weight_bytes("experts")
    assert dp2.memory.weights == pytest.approx(one - experts / 2)
    assert model.weight_bytes(2, data_parallel=2) == pytest.approx(model.weight_bytes(2)
                                                                   - experts / 4)
    alone = build_engine(EngineArgs(**{**_args(1).__dict__, "data_parallel_size": 1}),
                         model, resolve_gpu("h200"))
    assert dp2.memory.num_gpu_blocks > alone.memory.num_gpu_blocks


def test_an_idle_rank_runs_a_dummy_step_and_the_experts_see_every_rank(dp2):
    """With one request on two ranks, the other rank runs a one-token dummy forward; the
    experts run on both ranks' tokens, each padded to the larger (CUDA graphs)."""
    sched = Scheduler(dp2.cfg, dp2.memory.num_gpu_blocks)
    sched.add_request(Request(0, 0.0, 300, 10))
    plan = sched.schedule(0.0)
    assert plan.num_tokens == 300
    cost = dp2.cost
    busy = cost.step_time(300, 1, plan.num_logits, plan.prefill_chunks, 0, 0, 600)
    dummy = cost.step_time(1, 0, 0, [], 0, 0, 600)
    assert dp2.step_time([plan, None]) == pytest.approx(max(busy, dummy))
    # the experts of the gathered 600 tokens cost more than those of the rank's 300 alone
    assert cost.dp_experts_time(600) > cost.dp_experts_time(300) > 0.0
    assert busy > cost.step_time(300, 1, plan.num_logits, plan.prefill_chunks, 0, 0, 300)


def test_requests_are_spread_over_the_ranks_and_each_has_its_own_kv_cache(dp2):
    """vLLM's load balancer sends a request to the rank with the lowest 4 x waiting + running:
    two requests at once land on both ranks, each rank's KV cache holds its own."""
    specs = [RequestSpec(i, 0.0, 500, 20, 0) for i in range(2)]
    res = dp2.replay(specs, record_steps=True)
    assert all(r.finish_time > 0 for r in res.requests)
    # both prefilled in the first step, one on each rank (one rank would take 1000 tokens)
    assert res.steps.tokens[0] == 1000 and res.steps.prefill_tokens[0] == 1000
    blocks_one = -(-520 // dp2.cfg.block_size)
    assert res.peak_kv_blocks <= blocks_one + 1
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
