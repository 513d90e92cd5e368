"""Speculative decoding in the simulated scheduler, rule by rule (vLLM 0.32
``Scheduler.schedule`` / ``update_from_output``; :mod:`chunktune.core.speculative`)."""

from __future__ import annotations

import itertools
import json

import pytest

from chunktune.core.engine_args import EngineArgs, EngineStartupError, resolve
from chunktune.core.errors import SpecError
from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.core.speculative import expected_accepted
from chunktune.sim.engine.request import Request
from tests.sim.factories import create_scheduler, run_to_completion


def spec(method: str = "ngram", k: int = 4, **extra: object) -> str:
    return json.dumps({"method": method, "num_speculative_tokens": k, **extra})


def decoding(sched, n: int, prompt: int = 16, out: int = 64, acceptance: float = 1.0
             ) -> list[Request]:
    """``n`` requests past their prefill (one step), each with its first drafts proposed."""
    reqs = [Request(i, 0.0, prompt, out) for i in range(n)]
    for r in reqs:
        r.spec_acceptance = acceptance
        sched.add_request(r)
    sched.apply(sched.schedule(0.0), 1.0)
    assert all(r.num_output == 1 and r.spec_tokens == sched.spec.num_speculative_tokens
               for r in reqs)
    return reqs


def test_each_decode_verifies_k_plus_one_tokens_and_the_prefill_gets_the_rest():
    """Budget 64, ngram K=4: four decodes take 4 x 5 = 20 tokens, a long prompt the other 44
    (without speculative decoding it would get 60)."""
    sched = create_scheduler(max_num_batched_tokens=64, max_num_seqs=8,
                             speculative_config=spec("ngram", 4))
    decoding(sched, 4)
    long = Request(9, 0.0, 1000, 8)
    sched.add_request(long)
    plan = sched.schedule(1.0)
    assert [n for _, n in plan.scheduled] == [5, 5, 5, 5, 44]
    assert plan.num_tokens == 64 and plan.num_decodes == 4 and plan.num_logits == 20
    assert sum(plan.spec.values()) == 16

    plain = create_scheduler(max_num_batched_tokens=64, max_num_seqs=8)
    for i in range(4):
        plain.add_request(Request(i, 0.0, 16, 64))
    plain.apply(plain.schedule(0.0), 1.0)
    plain.add_request(Request(9, 0.0, 1000, 8))
    assert [n for _, n in plain.schedule(1.0).scheduled] == [1, 1, 1, 1, 60]


def test_rejected_drafts_roll_back_num_computed():
    """Acceptance 0: every verification keeps one token (the bonus) and gives back K."""
    sched = create_scheduler(max_num_batched_tokens=256, speculative_config=spec("ngram", 3))
    (req,) = decoding(sched, 1, out=10, acceptance=0.0)
    for step in range(3):
        plan = sched.schedule(float(step))
        assert plan.scheduled == [(req, 4)]
        sched.apply(plan, step + 1.0)
        assert req.num_computed == req.num_tokens - 1 and req.spec_tokens == 3
    assert req.num_output == 4
    assert (sched.num_drafts, sched.num_draft_tokens, sched.num_accepted_tokens) == (3, 9, 0)


def test_accepted_tokens_follow_the_class_acceptance_exactly_over_a_request():
    """The expected accepted count per verification, its fraction carried: acceptance 0.5 at
    K=2 accepts 0.75 a verification, 3 in 4."""
    assert expected_accepted(0.5, 2) == pytest.approx(0.75)
    sched = create_scheduler(max_num_batched_tokens=256, speculative_config=spec("eagle3", 2))
    (req,) = decoding(sched, 1, out=400, acceptance=0.5)
    outputs = [req.num_output]
    for step in range(4):
        sched.apply(sched.schedule(float(step)), step + 1.0)
        outputs.append(req.num_output)
    assert [b - a for a, b in itertools.pairwise(outputs)] == [1, 2, 2, 2]
    assert (sched.num_draft_tokens, sched.num_accepted_tokens) == (8, 3)


def test_a_draft_model_charges_one_slot_per_scheduled_request():
    """vLLM 0.32 ``max_num_new_slots_for_drafting`` = 1 for a draft model: each scheduled
    request costs its tokens + 1 of the budget (``input_budget``), so 3 decodes of K=2 leave
    the prompt 64 - 3 x (3 + 1) - 1 = 51 tokens."""
    sched = create_scheduler(max_num_batched_tokens=64, max_num_seqs=8,
                             model="llama-3.1-70b",
                             speculative_config=spec("draft_model", 2, model="llama-3.1-8b"))
    assert sched.draft_slots == 1
    decoding(sched, 3, prompt=16)
    sched.add_request(Request(9, 0.0, 1000, 8))
    plan = sched.schedule(1.0)
    assert [n for _, n in plan.scheduled] == [3, 3, 3, 51]
    assert plan.num_tokens == 64 - 4


def test_kv_is_allocated_k_tokens_ahead_for_eagle_not_for_ngram():
    for method, ahead in (("eagle", 3), ("ngram", 0)):
        sched = create_scheduler(max_num_batched_tokens=256, block_size=16,
                                 speculative_config=spec(method, 3))
        req = Request(0, 0.0, 16, 8)
        sched.add_request(req)
        sched.schedule(0.0)
        assert req.num_blocks == -(-(16 + ahead) // 16), method


def test_budget_and_kv_hold_over_whole_runs():
    """With drafts, no step exceeds the budget less the draft slots, KV covers the scheduled
    tokens and the lookahead, and every request ends with exactly its max_tokens."""
    for method in ("ngram", "eagle3", "draft_model"):
        extra = {"model": "llama-3.1-8b"} if method == "draft_model" else {}
        sched = create_scheduler(num_blocks=400, max_num_batched_tokens=96, max_num_seqs=6,
                                 long_prefill_token_threshold=40, block_size=16,
                                 model="llama-3.1-70b", speculative_config=spec(method, 3,
                                                                                **extra))
        reqs = [Request(i, 0.0, 50 + 37 * i, 5 + 7 * i) for i in range(12)]
        for i, r in enumerate(reqs):
            r.spec_acceptance = (0.0, 0.6, 1.0)[i % 3]

        def check(s, plan):
            assert plan.num_tokens + s.draft_slots * len(plan.scheduled) <= 96
            for r, n in plan.scheduled:
                if r in s.running:
                    assert r.num_blocks * 16 >= min(r.num_computed + n + s.lookahead, 8192)

        run_to_completion(sched, reqs, check=check)
        assert [r.num_output for r in reqs] == [r.max_tokens for r in reqs], method


def test_bad_speculative_configs_are_refused_by_name():
    model, gpu = resolve_model("llama-3.1-8b"), resolve_gpu("h100-sxm")
    for text, field in ((spec("medusa", 2), "--speculative-config.method"),
                        (spec("ngram", 0), "--speculative-config.num_speculative_tokens"),
                        (spec("eagle3", 2, parallel_drafting=True),
                         "--speculative-config.parallel_drafting"),
                        (spec("draft_model", 2), "--speculative-config.model"),
                        ("[1]", "--speculative-config")):
        with pytest.raises(SpecError) as e:
            EngineArgs(speculative_config=text).check_simulated()
        assert [p for p, _ in e.value.problems] == [field]
    with pytest.raises(SpecError, match="give --speculative-config"):
        resolve(EngineArgs(num_speculative_tokens=3), model, gpu)
    # vLLM: the budget must leave a token beside the draft slots
    with pytest.raises(EngineStartupError, match="does not have enough slots"):
        resolve(EngineArgs(max_num_batched_tokens=1, max_num_seqs=1,
                           speculative_config=spec("draft_model", 2, model="llama-3.1-8b")),
                model, gpu)


def test_num_speculative_tokens_replaces_k_and_zero_turns_it_off():
    model, gpu = resolve_model("llama-3.1-8b"), resolve_gpu("h100-sxm")
    base = EngineArgs(speculative_config=spec("eagle3", 3))
    assert resolve(base, model, gpu).speculative.num_speculative_tokens == 3
    base.num_speculative_tokens = 5
    assert resolve(base, model, gpu).speculative.num_speculative_tokens == 5
    base.num_speculative_tokens = 0
    assert resolve(base, model, gpu).speculative is None


def test_the_drafter_runs_with_the_servers_kv_cache_graphs_and_release():
    """An EAGLE-3 head beside Llama-3.1-8B with an FP8 KV cache under ``--enforce-eager``:
    the drafter's passes are priced with the target's KV cache dtype (vLLM's drafter layers
    share the engine's cache config), without CUDA graphs and under the target's release,
    not as a bf16-cache graphed head of the current release."""
    from chunktune.sim.cost.draft import DraftCost
    from chunktune.sim.cost.step_time import StepCostModel
    from chunktune.sim.engine.memory import drafter

    cfg = resolve(EngineArgs(speculative_config=spec("eagle3", 3), kv_cache_dtype="fp8",
                             enforce_eager=True),
                  resolve_model("llama-3.1-8b"), resolve_gpu("h100-sxm"), (0, 19, 0))
    net = drafter(cfg)
    assert net is not None
    target = StepCostModel(cfg.model, cfg.gpu, 1, max_tokens=cfg.max_num_batched_tokens,
                           enforce_eager=True, kv_dtype_bytes=cfg.kv_cache_dtype_bytes,
                           vllm_version=cfg.vllm_version)
    head = DraftCost.build(cfg.speculative, target, net).net
    assert head is not None
    assert head.kv_dtype_bytes == 1 and head.enforce_eager
    assert head.vllm_version == cfg.vllm_version == (0, 19, 0)
    same = StepCostModel(net, cfg.gpu, 1, max_tokens=cfg.max_num_batched_tokens,
                         enforce_eager=True, kv_dtype_bytes=1, vllm_version=cfg.vllm_version)
    plain = StepCostModel(net, cfg.gpu, 1, max_tokens=cfg.max_num_batched_tokens)
    args = (8, 8, [], 8, 8 * 2000)
    assert head.forward_time(*args) == pytest.approx(same.forward_time(*args))
    assert head.forward_time(*args) > plain.forward_time(*args)  # eager launches, FP8 cache
