"""Real vLLM 0.32 (the CPU build, in process) runs ngram speculation on the tiny model: its
step log (``--enable-logging-iteration-details``) shows each decode verifying its drafts and
the prefill chunk beside them getting what the budget leaves, as the simulator predicts it."""

from __future__ import annotations

import json

import pytest

from chunktune.core.engine_args import EngineArgs, resolve
from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.sim.engine.request import Request
from chunktune.sim.engine.scheduler import Scheduler
from chunktune.sim.engine.step_trace import iteration_counts
from tests.conformance.conftest import run_helper

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

BUDGET, SEQS, K = 64, 4, 4
SPEC = {"method": "ngram", "num_speculative_tokens": K}
#: three chat turns decoding beside one long prompt: every step's budget is shared
REQUESTS = [("a", 20, 40), ("b", 30, 40), ("c", 12, 40), ("d", 600, 8)]


def real_steps(tiny_model, tmp) -> list[tuple[int, int, int, int]]:
    spec = {"model": str(tiny_model), "engines": [{
        "name": "ngram",
        "engine": {"max_num_batched_tokens": BUDGET, "max_num_seqs": SEQS,
                   "long_prefill_token_threshold": 0, "max_model_len": 2048,
                   "kv_cache_memory_bytes": 64 * 2**20,
                   "speculative_config": {**SPEC, "prompt_lookup_max": 3,
                                          "prompt_lookup_min": 1}},
        "cases": [{"name": "spec", "requests": [
            {"id": rid, "prompt_len": p, "max_tokens": o} for rid, p, o in REQUESTS]}]}]}
    out = run_helper("vllm_steps.py", spec, tmp)
    return [tuple(s) for s in out["engines"][0]["cases"][0]["steps"]]


def simulated_steps() -> list[tuple[int, int, int, int]]:
    """The simulator's scheduler on the same requests (every draft accepted: the tiny model's
    greedy output repeats, so n-gram drafts match it once it has)."""
    cfg = resolve(EngineArgs(max_num_batched_tokens=BUDGET, max_num_seqs=SEQS,
                             max_model_len=2048, speculative_config=json.dumps(SPEC)),
                  resolve_model("llama-3.1-8b"), resolve_gpu("h100-sxm"))
    sched = Scheduler(cfg, 10_000)
    for i, (_, p, o) in enumerate(REQUESTS):
        r = Request(i, i * 1e-6, p, o)
        r.spec_acceptance = 1.0
        sched.add_request(r)
    steps = []
    while sched.has_work:
        plan = sched.schedule(float(len(steps)))
        steps.append(iteration_counts(plan))
        sched.apply(plan, float(len(steps)))
    return steps


def test_ngram_speculation_eats_the_budget_as_simulated(vllm_installed, tiny_model,
                                                        tmp_path):
    real = real_steps(tiny_model, tmp_path)
    sim = simulated_steps()
    for name, steps in (("vLLM", real), ("simulator", sim)):
        assert all(c + g <= BUDGET for _, c, _, g in steps), name
        # decodes verified drafts: more generation tokens than generation requests
        assert any(g > n for _, _, n, g in steps), name
        # a step with decodes beside a prefill chunk the budget cut: the chunk is the budget
        # less every decode's 1 + drafts (the long prompt's last chunk aside)
        shared = [s for s in steps if s[0] and s[2]]
        cut = shared[:-1]
        assert cut and all(c == BUDGET - g for _, c, _, g in cut), (name, shared)
    # the steady state both reach: three decodes verifying K drafts each, the prompt the rest
    steady = (1, BUDGET - 3 * (1 + K), 3, 3 * (1 + K))
    assert steady in real and steady in sim, (real, sim)
