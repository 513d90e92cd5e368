"""vLLM's prefix cache in the simulated engine (``--enable-prefix-caching``): blocks conserved
with shared blocks counted once, hits only on whole cached blocks, the free queue's order of
eviction, and what a shared opening saves. Step-for-step agreement with real vLLM is in
``tests/conformance`` (cases ``prefix_cache`` and ``prefix_cache_preemption``)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from chunktune.sim.engine.kv_cache import PrefixCache, block_keys
from chunktune.sim.engine.request import FINISHED, Request
from chunktune.sim.engine.scheduler import Scheduler
from tests.sim.factories import create_scheduler, run_to_completion

workloads = st.lists(
    st.tuples(st.integers(1, 2000), st.integers(1, 40), st.sampled_from([None, "a", "b"]),
              st.integers(0, 1500)),
    min_size=1, max_size=40)


def held_blocks(s: Scheduler) -> int:
    """Blocks the running requests hold, a shared one once."""
    cache = s.cache
    assert cache is not None
    shared = {k for k, n in cache.refs.items() if n > 0}
    own = sum(r.num_blocks - len(r.held or []) for r in s.running)
    return own + len(shared)


@settings(max_examples=60, deadline=None)
@given(reqs=workloads, budget=st.sampled_from([64, 512, 2048]),
       blocks=st.integers(130, 1500), block_size=st.sampled_from([16, 128]))
def test_invariants_with_the_cache(reqs, budget, blocks, block_size):
    """Every request finishes; free blocks plus what the running hold (shared ones once) is
    the pool; a request's blocks cover what it computed; the cache counts only evictable
    blocks as free; a first admission's hit is whole blocks of the shared opening only."""
    sched = create_scheduler(num_blocks=blocks, max_num_batched_tokens=budget,
                             block_size=block_size, max_model_len=3200,
                             enable_prefix_caching=True)
    cache = sched.cache
    assert isinstance(cache, PrefixCache) and sched.pool is cache
    requests = [Request(i, i * 1e-3, p, o, prefix_key=key, prefix_tokens=min(n, p))
                for i, (p, o, key, n) in enumerate(reqs)
                if -(-(p + o) // block_size) <= blocks - 1]

    def check(s: Scheduler, plan) -> None:
        assert plan.num_tokens <= budget
        assert cache.free + held_blocks(s) == cache.total, "KV blocks not conserved"
        assert 0 <= len(cache.evictable) <= cache.free
        assert all(cache.refs[k] == 0 for k in cache.evictable)
        for r, n in plan.scheduled:
            assert n >= 1 and r.num_blocks * block_size >= r.num_computed + n
            if r.num_preemptions == 0 and r.num_output == 0 and r.num_cached:
                assert r.num_cached % block_size == 0
                assert r.num_cached <= min(r.prefix_tokens, r.prompt_len - 1)

    if requests:
        run_to_completion(sched, requests, check=check)
    assert all(r.status == FINISHED and r.num_output == r.max_tokens for r in requests)
    assert cache.free == cache.total and not any(cache.refs.values())
    assert cache.hits <= cache.queries == sum(r.prompt_len for r in requests)


def test_a_shared_opening_is_prefilled_once_and_held_once():
    """Four requests opening with one 512-token opening, admitted one after the other: the
    first prefills it; the others find its blocks, compute only their own tokens and share
    the opening's blocks (the pool's usage counts them once)."""
    sched = create_scheduler(num_blocks=1000, max_num_batched_tokens=8192, block_size=16,
                             enable_prefix_caching=True)
    first = Request(0, 0.0, 600, 10, prefix_key="doc", prefix_tokens=512)
    sched.add_request(first)
    plan = sched.schedule(0.0)
    assert plan.prefill_chunks == [(600, 0)]
    sched.apply(plan, 0.01)
    others = [Request(i, 0.02, 600, 10, prefix_key="doc", prefix_tokens=512)
              for i in (1, 2, 3)]
    for r in others:
        sched.add_request(r)
    plan = sched.schedule(0.02)
    assert plan.prefill_chunks == [(88, 512)] * 3  # 512 found, 88 their own
    assert all(r.num_cached == 512 for r in others)
    assert sched.pool.used == 32 + 4 * (38 - 32)  # the opening's 32 blocks, once
    cache = sched.cache
    assert cache is not None and (cache.queries, cache.hits) == (2400, 3 * 512)
    # a prompt that is all opening still computes its last token: at most 599 of 600 found
    whole = Request(9, 0.03, 512, 4, prefix_key="doc", prefix_tokens=512)
    assert cache.lookup(whole) == (31, 0)


def test_the_free_queue_evicts_least_recently_freed_first():
    """Cached blocks stay findable after their requests end, until allocations reach them in
    the free queue: the longest-free first, and a request's last block before its first."""
    cache = PrefixCache(total=8, block_size=16)
    a = Request(0, 0.0, 64, 1, prefix_key="a", prefix_tokens=64)
    cache.take(a, 0)
    cache.allocate(a, 4)
    cache.commit(a, 64)
    assert cache.free == 4 and len(cache.refs) == 4
    cache.release(a)
    # keyed by opening, block size and place (PrefixCache.content)
    assert cache.free == 8 and list(cache.evictable) == [("a", 16, 3), ("a", 16, 2),
                                                        ("a", 16, 1), ("a", 16, 0)]
    b = Request(1, 0.0, 96, 1)  # shares nothing: takes the 4 never-used blocks, then a's
    cache.take(b, 0)
    cache.allocate(b, 5)
    assert ("a", 16, 3) not in cache.refs and ("a", 16, 0) in cache.refs  # its last went first
    # the same opening again: its first three blocks are still there (at most 63 of its 64
    # tokens can be found), all in the free queue, which taking them leaves
    again = Request(2, 0.0, 64, 1, prefix_key="a", prefix_tokens=64)
    assert cache.lookup(again) == (3, 3)
    free = cache.free
    cache.take(again, 3)
    assert cache.free == free - 3 and again.num_computed == 48 and not cache.evictable


def test_block_keys_chain_through_the_blocks_before():
    """Two prompts share a block's key only where they agree on every token up to its end."""
    a = block_keys(list(range(64)), 16)
    b = block_keys([*range(32), 99, *range(33, 64)], 16)
    c = block_keys([99, *range(1, 64)], 16)
    assert len(a) == 4 and a[:2] == b[:2] and a[2:] != b[2:] and b[3] != a[3]
    assert not set(a) & set(c)
    assert block_keys(list(range(15)), 16) == []


def test_taken_blocks_leave_no_growing_queue():
    """A block found in the free queue leaves an entry there that is skipped; once such
    entries outnumber the live ones (and are many), the queue is rebuilt without them."""
    cache = PrefixCache(total=12_000, block_size=16)
    a = Request(0, 0.0, 5000 * 16 + 1, 1, prefix_key="doc", prefix_tokens=5000 * 16)
    cache.take(a, 0)
    cache.allocate(a, 5001)
    cache.commit(a, 5000 * 16)
    cache.release(a)
    assert len(cache.evictable) == 5000 and len(cache.queue) == 5002
    b = Request(1, 0.0, 5000 * 16 + 1, 1, prefix_key="doc", prefix_tokens=5000 * 16)
    assert cache.lookup(b) == (5000, 5000)
    cache.take(b, 5000)
    assert not cache.evictable and all(isinstance(e, int) for e in cache.queue)
    cache.allocate(b, 1)
    assert cache.free == 12_000 - 5001 == sum(cache.queue)
