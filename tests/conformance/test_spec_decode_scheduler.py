"""The simulator's scheduler under speculative decoding against vLLM 0.32's own
``Scheduler`` (the CPU build's, driven in a subprocess by ``vllm_sched_spec.py`` with synthetic
model outputs), step for step: which requests each step schedules and how many tokens, and how
many drafts each verifies, over seeded random cases (budgets, thresholds, max-num-seqs, K,
tight KV, accepted drafts per verification from none to all)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from chunktune.core.engine_args import EngineArgs, resolve
from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.sim.engine.request import Request
from chunktune.sim.engine.scheduler import Scheduler
from tests.conformance.conftest import run_helper

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

N_CASES = 32
MAX_MODEL_LEN = 2048


def make_case(i: int) -> dict[str, Any]:
    rng = random.Random(f"spec-{i}")
    k = rng.choice([1, 2, 3, 4, 6])
    seqs = rng.choice([2, 4, 8])
    budget = rng.choice([32, 64, 128, 256])
    budget = max(budget, seqs)
    n = rng.randint(2, 9)
    requests = [{"id": str(j), "prompt_len": rng.choice([rng.randint(4, 60),
                                                         rng.randint(60, 900)]),
                 "max_tokens": rng.randint(1, 40)} for j in range(n)]
    need = max(-(-(r["prompt_len"] + r["max_tokens"] + k) // 16) for r in requests)
    # tight KV in some cases: preemptions, with the drafts' lookahead (ngram has none)
    blocks = rng.choice([need + 2, need * 3, 400])
    accepted = {r["id"]: [rng.randint(0, k) for _ in range(r["max_tokens"] + 2)]
                for r in requests}
    return {"name": f"case{i}-{'draft' if i % 4 == 3 else 'ngram'}-k{k}-b{budget}-s{seqs}",
            "engine": {"max_num_batched_tokens": budget, "max_num_seqs": seqs,
                       "long_prefill_token_threshold": rng.choice([0, 0, 16, 48]),
                       "num_blocks": blocks, "block_size": 16, "max_model_len": MAX_MODEL_LEN},
            # a draft model costs each scheduled request one draft slot and reserves K KV
            # slots ahead; ngram neither
            "speculative": {"method": "draft_model" if i % 4 == 3 else "ngram",
                            "num_speculative_tokens": k},
            "requests": requests, "accepted": accepted}


CASES = [make_case(i) for i in range(N_CASES)]


class Scripted(Scheduler):
    """The simulator's scheduler with each verification's accepted drafts given by the case
    (vLLM's side gets the same numbers through its synthetic model outputs)."""

    def __init__(self, *a: Any, accepted: dict[int, list[int]]) -> None:
        super().__init__(*a)
        self.script = accepted

    def accept(self, req: Request, drafts: int) -> int:
        return min(self.script[req.rid].pop(0), drafts)


def simulate(case: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """The simulator's steps of a case, and its preemptions."""
    eng = case["engine"]
    cfg = resolve(EngineArgs(max_num_batched_tokens=eng["max_num_batched_tokens"],
                             max_num_seqs=eng["max_num_seqs"],
                             long_prefill_token_threshold=eng["long_prefill_token_threshold"],
                             block_size=eng["block_size"], max_model_len=eng["max_model_len"],
                             speculative_config=json.dumps(
                                 {**case["speculative"], "model": "llama-3.1-8b"}
                                 if case["speculative"]["method"] == "draft_model"
                                 else case["speculative"])),
                  resolve_model("llama-3.1-8b"), resolve_gpu("h100-sxm"))
    sched = Scripted(cfg, eng["num_blocks"],
                     accepted={int(r): list(v) for r, v in case["accepted"].items()})
    for i, r in enumerate(case["requests"]):
        sched.add_request(Request(int(r["id"]), i * 1e-6, r["prompt_len"], r["max_tokens"]))
    steps = []
    now = 0.0
    while sched.has_work:
        assert len(steps) < 10_000
        plan = sched.schedule(now)
        steps.append({"scheduled": {str(r.rid): n for r, n in plan.scheduled},
                      "spec": {str(r.rid): d for r, d in plan.spec.items()}})
        now += 1.0
        sched.apply(plan, now)
    return steps, sched.num_preemptions


@pytest.fixture(scope="module")
def vllm_steps(vllm_installed, tiny_model, tmp_path_factory) -> dict[str, list[Any]]:
    out = run_helper("vllm_sched_spec.py", {"model": str(tiny_model), "cases": CASES},
                     tmp_path_factory.mktemp("spec"))
    return {c["name"]: c["steps"] for c in out["cases"]}


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_step_for_step_with_vllm_0_32(vllm_steps, case):
    real = [{"scheduled": dict(s["scheduled"]), "spec": s["spec"]}
            for s in vllm_steps[case["name"]]]
    sim, _ = simulate(case)
    first = next((i for i, (a, b) in enumerate(zip(real, sim, strict=False)) if a != b), None)
    assert first is None and len(real) == len(sim), (
        f"step {first}: vLLM {real[first] if first is not None else len(real)} "
        f"simulator {sim[first] if first is not None else len(sim)}")


def test_the_cases_verify_drafts_beside_prefill_chunks(vllm_steps):
    """The suite means something: drafts are verified in steps that also carry prefill
    chunks cut by the budget, and some cases preempt (tight KV)."""
    mixed = sum(1 for steps in vllm_steps.values() for s in steps
                if s["spec"] and len(s["scheduled"]) > len(s["spec"]))
    assert mixed > 20
    assert sum(simulate(c)[1] > 0 for c in CASES) >= 3
