"""Step by step: vLLM 0.32's iteration log against the simulator's step plans.

One in-process vLLM engine per configuration (all started by one helper process), every
request waiting before step 0 (see ``cases.py``). For each case the per-step (context requests,
context tokens, generation requests, generation tokens) sequences must be equal, and so must
the preemptions per step, the completion order and each request's preemption count.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conformance.cases import ENGINES, sim_trace, vllm_spec
from tests.conformance.conftest import run_helper

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CASES = [(e, c) for e in ENGINES for c in e.cases]


@pytest.fixture(scope="module")
def real(vllm_installed: None, tiny_model: Path,
         tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict[str, Any]]:
    out = run_helper("vllm_steps.py", vllm_spec(tiny_model), tmp_path_factory.mktemp("steps"))
    return {(e["name"], c["name"]): c for e in out["engines"] for c in e["cases"]}


def _first_difference(a: list, b: list) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"first difference at step {i}: vLLM {x}, simulator {y}"
    return f"lengths differ: vLLM {len(a)} steps, simulator {len(b)}"


@pytest.mark.parametrize(("engine", "case"), CASES, ids=[f"{e.name}-{c.name}" for e, c in CASES])
def test_same_steps_preemptions_and_completion_order(real, tiny_model, engine, case):
    vllm = real[(engine.name, case.name)]
    sim = sim_trace(engine, case, tiny_model / "config.json")
    vllm_steps = [tuple(s) for s in vllm["steps"]]
    assert vllm_steps, "vLLM logged no Iteration lines"
    assert vllm_steps == sim.steps, _first_difference(vllm_steps, sim.steps)
    # vLLM reports a preemption with the request's next output (see BatchTrace): per step,
    # the reported counts must agree; the schedule above already pins when it happened.
    assert vllm["preempted"] == sim.reported
    assert sum(sim.preempted) == sum(sim.reported)
    assert vllm["finished"] == sim.finished
    assert vllm["request_preemptions"] == sim.request_preemptions


def test_the_cases_exercise_what_they_are_named_for(real):
    """Each case shows the behaviour it exists for, on the vLLM side."""
    lone = real[("threshold", "lone_long_prompt")]["steps"]
    assert [s[1] for s in lone[:16]] == [64] * 15 + [40]  # threshold not applied alone
    beside = real[("threshold", "long_prompt_beside_decodes")]["steps"]
    assert any(s[1] == 32 and s[2] > 0 for s in beside)  # threshold beside decodes
    small = real[("budget_below_threshold", "budget_caps_chunks")]["steps"]
    assert max(s[1] + s[3] for s in small) == 16
    by_priority = real[("priority_policy", "waiting_by_priority")]["finished"]
    assert by_priority == ["a0", "b0", "c0", "c1"]  # added c0, c1, a0, b0
    preempted = real[("priority_policy", "preemption_by_priority")]["request_preemptions"]
    assert preempted == {"hi": 0, "mid": 1, "lo": 0}
    seqs = real[("max_num_seqs_binding", "two_running_at_most")]["steps"]
    assert max(s[0] + s[2] for s in seqs) == 2
    kv = real[("kv_exhaustion", "preemption_by_recompute")]
    assert sum(kv["preempted"]) > 0
    off = real[("chunked_prefill_off", "whole_prompts_only")]["steps"]
    assert {s[1] for s in off if s[0]} <= {300, 200, 100, 400, 500, 300 + 200}
    # b and c prefill only their own 88 tokens (and c 80 of them first, as the budget ends)
    shared = real[("prefix_cache", "shared_opening")]["steps"]
    assert [3, 256, 0, 0] in shared and sum(s[1] for s in shared) == 600 + 88 + 88 + 300
    # c, preempted, recomputes its 100 + 125 tokens less its first block, found cached
    again = real[("prefix_cache_preemption", "preempted_finds_its_blocks")]
    assert sum(again["preempted"]) == 1 and [0, 0, 1, 225 - 128] in again["steps"]
