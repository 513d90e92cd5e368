"""Scheduler invariants (property tests) and the V1 rules, step by step."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from chunktune.sim.engine.request import FINISHED, WAITING, Request
from chunktune.sim.engine.scheduler import Scheduler
from tests.sim.factories import create_requests, create_scheduler, run_to_completion

workloads = st.lists(
    st.tuples(st.integers(1, 3000), st.integers(1, 60), st.integers(-2, 2)), min_size=1,
    max_size=40
)


@settings(max_examples=60, deadline=None)
@given(
    reqs=workloads,
    budget=st.sampled_from([64, 256, 512, 2048, 8192]),
    threshold=st.sampled_from([0, 16, 100, 512]),
    seqs=st.sampled_from([1, 4, 16, 64]),
    blocks=st.integers(200, 2000),
    block_size=st.sampled_from([16, 32]),
    policy=st.sampled_from(["fcfs", "priority"]),
)
def test_invariants(reqs, budget, threshold, seqs, blocks, block_size, policy):
    """No step exceeds the budget or the chunk cap; blocks are conserved; every request
    finishes; preemption happens only when blocks run out — under both policies."""
    seqs = min(seqs, budget)
    sched = create_scheduler(num_blocks=blocks, max_num_batched_tokens=budget,
                             max_num_seqs=seqs, long_prefill_token_threshold=threshold,
                             block_size=block_size, max_model_len=3200,
                             scheduling_policy=policy)
    # Every request must fit the cache alone, as vLLM guarantees via max_model_len at start-up
    # (one of the blocks is vLLM's null block, never handed out).
    usable = blocks - 1
    requests = [Request(i, i * 1e-3, p, o, priority=pr) for i, (p, o, pr) in enumerate(reqs)
                if -(-(p + o) // block_size) <= usable]
    pool = sched.pool

    def check(s: Scheduler, plan) -> None:
        assert plan.num_tokens <= budget
        assert sum(n for _, n in plan.scheduled) == plan.num_tokens
        held = sum(r.num_blocks for r in s.running)
        assert pool.free + held == pool.total, "KV blocks not conserved"
        assert len(s.running) <= seqs
        for r, n in plan.scheduled:
            assert n >= 1
            # vLLM 0.32 applies the threshold only with more than one request in the system
            # (scheduling moves requests between WAITING and RUNNING, never adds or drops).
            if threshold and len(s.running) + len(s.waiting) > 1:
                assert n <= threshold, "chunk cap violated"
            assert r.num_blocks * block_size >= r.num_computed + n
        if plan.preempted:
            # V1 admits nobody in a step that preempted; victims hold nothing and recompute.
            assert plan.num_admitted == 0
            for v in plan.preempted:
                assert v.num_blocks == 0 and v.num_computed == 0 and v.status == WAITING

    if requests:
        run_to_completion(sched, requests, check=check)
    assert all(r.status == FINISHED and r.num_output == r.max_tokens for r in requests)
    assert pool.free == pool.total
    # Preemption only when blocks run out: if everything fits at once, nothing is preempted.
    if sum(-(-(r.prompt_len + r.max_tokens) // block_size) for r in requests) <= usable:
        assert sched.num_preemptions == 0


def test_preemption_only_when_blocks_run_out():
    # Plenty of blocks: never preempts, whatever the load.
    sched = create_scheduler(num_blocks=100_000, max_num_batched_tokens=512)
    run_to_completion(sched, create_requests(50, prompt_len=700, max_tokens=50))
    assert sched.num_preemptions == 0
    # Too few blocks for everyone's growth: preempts, and each preemption happened in a step
    # where the request being served could not get its blocks.
    sched = create_scheduler(num_blocks=60, max_num_batched_tokens=512, block_size=16)
    seen = []

    def check(s, plan):
        if plan.preempted:
            seen.append(s.pool.free)

    run_to_completion(sched, create_requests(8, prompt_len=100, max_tokens=60), check=check)
    assert sched.num_preemptions > 0 and seen


def test_running_first_then_waiting_and_budget_split():
    sched = create_scheduler(max_num_batched_tokens=1000, max_num_seqs=8)
    a, b = create_requests(2, prompt_len=800, max_tokens=4)
    sched.add_request(a)
    sched.add_request(b)
    plan = sched.schedule(0.0)
    # a takes 800, b gets the 200 left (chunked), in that order
    assert [(r.rid, n) for r, n in plan.scheduled] == [(0, 800), (1, 200)]
    sched.apply(plan, 0.1)
    assert a.num_output == 1 and a.first_token == 0.1 and b.num_output == 0
    plan = sched.schedule(0.1)
    # running first: a decodes (1 token), b continues its prefill with the rest
    assert [(r.rid, n) for r, n in plan.scheduled] == [(0, 1), (1, 600)]
    assert plan.num_decodes == 1 and plan.prefill_chunks == [(600, 200)]


def test_long_prompt_blocks_later_arrivals_without_threshold():
    """With threshold 0 a long prompt takes all the budget left; a chat request arriving
    behind it waits (head-of-line blocking). A threshold lets the chat request in."""
    for threshold, chat_admitted in ((0, False), (512, True)):
        sched = create_scheduler(max_num_batched_tokens=2048, max_num_seqs=8,
                                 long_prefill_token_threshold=threshold)
        long_req = Request(0, 0.0, 8000, 8)
        chat = Request(1, 0.0, 100, 8)
        sched.add_request(long_req)
        sched.add_request(chat)
        plan = sched.schedule(0.0)
        assert (chat in [r for r, _ in plan.scheduled]) is chat_admitted
        if threshold:
            assert dict((r.rid, n) for r, n in plan.scheduled)[0] == threshold


def test_threshold_is_not_applied_to_a_lone_request():
    """vLLM 0.32 (scheduler.py: ``num_eligible_reqs > 1``): a lone 1000-token prompt at budget
    64, threshold 32 runs as 15 x 64 + 40, not 32-token chunks; a second request brings the
    threshold back."""
    sched = create_scheduler(max_num_batched_tokens=64, max_num_seqs=4,
                             long_prefill_token_threshold=32)
    lone = Request(0, 0.0, 1000, 1)
    sched.add_request(lone)
    chunks = []
    now = 0.0
    while sched.has_work:
        plan = sched.schedule(now)
        chunks.append(plan.num_tokens)
        now += 0.01
        sched.apply(plan, now)
    assert chunks == [64] * 15 + [40]
    sched = create_scheduler(max_num_batched_tokens=64, max_num_seqs=4,
                             long_prefill_token_threshold=32)
    sched.add_request(Request(0, 0.0, 1000, 1))
    sched.add_request(Request(1, 0.0, 1000, 1))
    assert [n for _, n in sched.schedule(0.0).scheduled] == [32, 32]


def test_admission_needs_blocks_for_the_whole_prompt():
    """``scheduler_reserve_full_isl`` (on in vLLM 0.32): a prompt is admitted only when blocks
    for all of it are free, even if its first chunk would fit."""
    sched = create_scheduler(num_blocks=1 + 10, max_num_batched_tokens=64, block_size=16)
    big = Request(0, 0.0, 16 * 11, 1)  # needs 11 blocks, 10 usable
    small = Request(1, 0.0, 16, 1)
    sched.add_request(big)
    sched.add_request(small)
    plan = sched.schedule(0.0)
    assert plan.scheduled == [] and sched.pool.free == 10


def test_max_num_seqs_caps_running():
    sched = create_scheduler(max_num_batched_tokens=8192, max_num_seqs=3)
    for r in create_requests(10, prompt_len=10, max_tokens=5):
        sched.add_request(r)
    plan = sched.schedule(0.0)
    assert plan.num_admitted == 3 and len(sched.running) == 3 and len(sched.waiting) == 7


def test_no_chunked_prefill_does_not_split_prompts():
    sched = create_scheduler(max_num_batched_tokens=8192, max_num_seqs=8,
                             enable_chunked_prefill=False, max_model_len=8192)
    a, b = Request(0, 0, 6000, 2), Request(1, 0, 3000, 2)
    sched.add_request(a)
    sched.add_request(b)
    plan = sched.schedule(0.0)
    assert [(r.rid, n) for r, n in plan.scheduled] == [(0, 6000)]  # b waits whole


def test_preempted_request_recomputes_and_keeps_its_tokens():
    sched = create_scheduler(num_blocks=20, max_num_batched_tokens=512, max_num_seqs=4,
                             block_size=16)
    # Both prompts fit at once (7 + 7 of 19 usable blocks); their growth does not.
    a, b = Request(0, 0, 100, 200), Request(1, 0, 100, 200)
    run_to_completion(sched, [a, b])
    assert sched.num_preemptions >= 1
    victim = b if b.num_preemptions else a
    assert victim.num_output == victim.max_tokens
    # the stall shows up as one long inter-token gap
    assert max(victim.itl) > 5 * min(victim.itl)


def test_fcfs_victim_is_last_admitted():
    sched = create_scheduler(num_blocks=1 + 24, max_num_batched_tokens=1024, max_num_seqs=4,
                             block_size=16)
    reqs = [Request(i, 0, 120, 200) for i in range(3)]  # 8 blocks each, grow by decoding
    for r in reqs:
        sched.add_request(r)
    now = 0.0
    first_victim = None
    while first_victim is None and sched.has_work:
        plan = sched.schedule(now)
        if plan.preempted:
            first_victim = plan.preempted[0]
        now += 0.01
        sched.apply(plan, now)
    assert first_victim is reqs[-1]
    assert sched.waiting[0] is reqs[-1]


def test_abort_frees_blocks():
    sched = create_scheduler(num_blocks=1000)
    a, b = create_requests(2, prompt_len=100)
    sched.add_request(a)
    sched.add_request(b)
    sched.apply(sched.schedule(0.0), 0.01)
    sched.abort(a)
    assert a.num_blocks == 0 and a not in sched.running
    assert sched.pool.free + b.num_blocks == sched.pool.total


# ---- --scheduling-policy priority (vllm/v1/core/sched/request_queue.py, scheduler.py) --------


def _admission_order(policy: str, priorities: list[int]) -> list[int]:
    """The rids in the order one-at-a-time admission serves them."""
    sched = create_scheduler(max_num_seqs=1, scheduling_policy=policy)
    reqs = [Request(i, float(i), 50, 1, priority=p) for i, p in enumerate(priorities)]
    for r in reqs:
        sched.add_request(r)
    order = []
    now = 0.0
    for _ in range(100):
        if not sched.has_work:
            break
        plan = sched.schedule(now)
        order += [r.rid for r, _ in plan.scheduled if r.rid not in order]
        now += 0.01
        sched.apply(plan, now)
    assert not sched.has_work
    return order


def test_waiting_order_by_priority_then_arrival():
    priorities = [2, 0, 1, 0, -1]
    assert _admission_order("priority", priorities) == [4, 1, 3, 2, 0]
    assert _admission_order("fcfs", priorities) == [0, 1, 2, 3, 4]


def test_priority_victim_is_largest_priority_then_latest_arrival():
    """Out of blocks, priority preempts the running request with the largest
    (priority, arrival) — here the first in the running list, already scheduled in the step,
    whose tokens go back to the budget — where FCFS would preempt the last one."""
    def first_victim(policy: str, priorities: list[int]) -> tuple[Request, list[Request]]:
        sched = create_scheduler(num_blocks=24, max_num_batched_tokens=1024, max_num_seqs=4,
                                 block_size=16, scheduling_policy=policy)
        # the first request's shorter prompt needs its next block later than the others
        reqs = [Request(i, i * 0.01, 100 if i == 0 else 120, 200, priority=p)
                for i, p in enumerate(priorities)]
        sched.add_request(reqs[0])  # admitted alone: first in the running list
        now = 0.0
        sched.apply(sched.schedule(now), now + 0.01)
        for r in reqs[1:]:
            sched.add_request(r)
        assert [r.rid for r in sched.running] == [0]
        for _ in range(1000):
            plan = sched.schedule(now)
            if plan.preempted:
                victim = plan.preempted[0]
                assert all(r is not victim for r, _ in plan.scheduled)
                assert plan.num_tokens == sum(n for _, n in plan.scheduled)
                assert victim in list(sched.waiting)
                return victim, reqs
            now += 0.01
            sched.apply(plan, now)
        raise AssertionError("no preemption")

    victim, reqs = first_victim("priority", [5, 0, 0])
    assert victim is reqs[0]  # first in the running list, scheduled earlier in the same step
    victim, reqs = first_victim("priority", [0, 0, 0])  # ties: the latest arrival
    assert victim is reqs[2]
    victim, reqs = first_victim("fcfs", [5, 0, 0])
    assert victim is reqs[2]


def test_priority_queue_keeps_deque_semantics():
    sched = create_scheduler(scheduling_policy="priority")
    a, b, c = (Request(i, float(i), 10, 1, priority=p) for i, p in enumerate([1, 0, 1]))
    for r in (a, b, c):
        sched.add_request(r)
    assert len(sched.waiting) == 3 and sched.waiting[0] is b
    assert list(sched.waiting) == [b, a, c]
    sched.abort(a)
    assert list(sched.waiting) == [b, c] and a.status == FINISHED
