"""vLLM's hybrid KV cache manager in the simulated engine: several KV-cache groups (sliding
window or chunked local attention beside full attention) in one pool of blocks
(:class:`~chunktune.sim.engine.kv_cache.HybridBlocks`, :class:`HybridPrefixCache`).

Step-for-step agreement with each checked release's own scheduler and KV cache manager is in
``tests/sim/releases`` (the ``hybrid_*`` cases: gpt-oss's, Gemma-4's and Llama-4's group
layouts, prefix caching on and off, async sizing, the gate off); here, the rules one by one
and what they change for a deployment.
"""

from __future__ import annotations

from chunktune.core.engine_args import EngineArgs
from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.core.vllm_release import in_flight_tokens, uncached_freed_first
from chunktune.core.workload import RequestSpec, load_profile
from chunktune.sim.engine.kv_cache import (
    BlockClass,
    BlockPool,
    HybridBlocks,
    HybridPrefixCache,
)
from chunktune.sim.engine.request import Request
from chunktune.sim.engine.virtual import build_engine
from chunktune.sim.report import summarize


def test_skipped_blocks_follow_vllms_get_num_skipped_tokens() -> None:
    """The examples of vLLM 0.34's ``SlidingWindowManager.get_num_skipped_tokens`` (window 4,
    7 computed: tokens 0-3 skipped) and ``ChunkedLocalAttentionManager``'s (chunk 8: 13 and 8
    computed skip 8, 7 skip none), over blocks of 4 tokens."""
    sliding = BlockClass(1, 4, window=4)
    assert [sliding.skipped_blocks(n) for n in (0, 3, 6, 7, 11)] == [0, 0, 0, 1, 2]
    chunked = BlockClass(1, 4, chunk=8)
    assert [chunked.skipped_blocks(n) for n in (7, 8, 13, 16)] == [0, 2, 2, 4]
    assert BlockClass(1, 4).skipped_blocks(1000) == 0


def test_a_window_frees_its_blocks_as_it_passes_and_the_gate_counts_its_cap() -> None:
    """One sliding-window group (window 32, cap 7 blocks) beside a full one, 16-token
    blocks: a 100-token prompt takes 7 blocks in each at once; once computed, the window keeps
    the blocks of its last 31 tokens; the admission gate counts the windowed group at most its
    cap."""
    hybrid = HybridBlocks([BlockClass(1, 16, window=32, cap=7), BlockClass(1, 16)])
    pool = BlockPool(100, 16)
    req = Request(0, 0.0, 100, 50)
    assert hybrid.gate(150, 0) == 7 + 10  # capped sliding, every full block
    assert hybrid.admit(100, 0) == 14
    pool.allocate(req, 14)
    hybrid.start(req, 100, 0)
    req.num_computed = 100
    hybrid.trim(req, pool)  # skipped tokens 100 - 31 = 69: 4 whole blocks
    assert req.skipped == [4, 0] and req.num_blocks == 10 and pool.free == 90
    assert hybrid.grow(req, 101) == 0  # the 7th block of each group has room
    assert hybrid.grow(req, 113) == 2


def test_windowed_layers_are_sized_for_the_batches_in_flight_of_their_release() -> None:
    """``max_in_flight_tokens`` (two batches with async scheduling) from vLLM 0.26; before,
    ``max_num_batched_tokens`` (0.19-0.24's ``SlidingWindowSpec``)."""
    assert in_flight_tokens((0, 19, 1), True, 8192) == 8192
    assert in_flight_tokens((0, 24, 0), True, 8192) == 8192
    assert in_flight_tokens((0, 26, 0), True, 8192) == 16384
    assert in_flight_tokens((0, 34, 0), False, 8192) == 8192


def test_uncached_freed_blocks_go_first_from_their_release() -> None:
    """A windowed layer's freed uncached blocks go to the front of the free queue from 0.23
    (``prepend=True``), every layer's from 0.24 (``BlockPool.free_blocks``)."""
    assert not uncached_freed_first((0, 19, 0), windowed=True)
    assert uncached_freed_first((0, 23, 0), windowed=True)
    assert not uncached_freed_first((0, 23, 0), windowed=False)
    assert uncached_freed_first((0, 24, 0), windowed=False)


def test_short_requests_fill_a_gemma_4_pool_long_before_the_printed_tokens() -> None:
    """Gemma-4-26B-A4B on one H100: vLLM prints the KV tokens of max-length requests (a
    sliding layer holds its 1,024-token window, the full one every token), but a 1,600-token
    request holds as many blocks in each of its five sliding groups as in its full one. The
    pool runs out at under a quarter of the requests the printed tokens would hold."""
    engine = build_engine(EngineArgs(), resolve_model("gemma-4-26b-a4b"),
                          resolve_gpu("h100-sxm"))
    memory = engine.memory
    by_printed_tokens = memory.reported_tokens // 1600
    res = engine.replay([RequestSpec(i, 0.0, 1500, 100, 0) for i in range(400)])
    assert all(r.finish_time > 0 for r in res.requests)
    assert res.peak_kv_blocks < memory.pool_blocks
    assert by_printed_tokens > 400 > 4 * max(res.steps.running)
    # the summary's peak KV usage and blocks are the pool's (vLLM's num_gpu_blocks)
    profile = load_profile("smoke")
    engine = build_engine(EngineArgs(), resolve_model("gemma-4-26b-a4b"),
                          resolve_gpu("h100-sxm"))
    summary = summarize(engine, engine.replay(
        [RequestSpec(i, 0.0, 1500, 100, 0) for i in range(400)]), profile)
    assert summary["engine"]["num_gpu_blocks"] == memory.pool_blocks
    assert 0.9 < summary["engine"]["kv_cache_usage_peak"] < 1.0


class _OneByOne(HybridPrefixCache):
    """Every cached block kept one by one: no request's content counts as its own."""

    __slots__ = ()

    def own_from(self, req: Request, tokens: int) -> int:
        return 1 << 40


class _Forgetful(dict[int, tuple[int, int, int]]):
    """No lookup is remembered."""

    def __setitem__(self, rid: int, seen: tuple[int, int, int]) -> None:
        pass


def _replayed(model: str, version: str | None, args: dict[str, int], lazy: bool
              ) -> tuple[list[tuple[object, ...]], int, int]:
    from chunktune.core.vllm_release import parse_version

    engine = build_engine(EngineArgs(enable_prefix_caching=True, **args), resolve_model(model),
                          resolve_gpu("h100-sxm"), parse_version(version) if version else None)
    cache = engine.scheduler.cache
    assert isinstance(cache, HybridPrefixCache)
    if not lazy:
        cache.__class__ = _OneByOne
        cache.seen = _Forgetful()
    rng = __import__("random").Random(7)
    specs = []
    for i in range(90):
        group = rng.randrange(3) if rng.random() < 0.5 else -1
        prompt = rng.randint(300, 5000)
        specs.append(RequestSpec(i, i / 1000, prompt, rng.randint(400, 4000), 0,
                                 prefix_group=group,
                                 prefix_tokens=min(prompt - 1, 1500) if group >= 0 else 0))
    res = engine.replay(specs)
    st = res.steps
    rows = list(zip(st.start, st.duration, st.tokens, st.prefill_tokens, st.decodes,
                    st.running, st.waiting, st.kv_used_blocks, st.preempted, strict=True))
    rows += [(r.rid, r.first_token, r.finish_time, r.num_preemptions) for r in res.requests]
    return rows, res.num_preemptions, len(cache.copies)


def test_own_blocks_counted_in_runs_schedule_as_kept_one_by_one() -> None:
    """A request's own blocks are counted, and freed as runs (:class:`Parked`), until it looks
    them up after a preemption (and again from its next admission), and a waiting request's
    lookup is remembered until what it found changes: every step, preemption and latency is
    what keeping each block and looking up every step gives (gpt-oss's sliding window under
    vLLM 0.23's and 0.34's free-queue rules, Gemma-4's five sliding groups beside a full one;
    openings shared, KV-bound), with far fewer blocks kept one by one."""
    for model, version, args in (
            ("gpt-oss-20b", "0.23.0", {"kv_cache_memory_bytes": 1_000_000_000,
                                       "max_model_len": 12000}),
            ("gpt-oss-20b", None, {"kv_cache_memory_bytes": 1_000_000_000,
                                   "max_model_len": 12000}),
            ("gemma-4-26b-a4b", "0.23.0", {"kv_cache_memory_bytes": 2_500_000_000,
                                           "max_model_len": 12000})):
        lazy, preempted, kept = _replayed(model, version, args, lazy=True)
        eager, preempted_eager, kept_eager = _replayed(model, version, args, lazy=False)
        assert preempted >= 3 and preempted == preempted_eager, (model, version)
        assert lazy == eager, (model, version)
        assert kept < kept_eager / 2, (model, version, kept, kept_eager)
