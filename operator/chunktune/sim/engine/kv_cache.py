"""The KV-cache block pool.

Only counts matter for scheduling (which blocks a request holds does not, but for the prefix
cache: :class:`PrefixCache`), so the pool is a counter plus each request's ``num_blocks``::

    request tokens:  | computed ............ | new (this step) |
    blocks held:     | ceil((computed + new) / block_size)     |

The scheduler computes what ``allocate_slots`` would have to add for ``new`` more tokens
(``ceil((computed + new) / block_size) - num_blocks``, inline in its hot loop); like vLLM's
``KVCacheManager.allocate_slots`` it treats "not enough free" as "won't fit" and preempts.
Invariant: ``free + sum(request.num_blocks) == total``.

A model whose layers keep KV differently (gpt-oss's sliding-window layers beside full ones,
Llama-4's chunked ones, Gemma-4's) has several KV-cache groups sharing the pool: vLLM's hybrid
KV cache manager. :class:`HybridBlocks` counts what each group's block table takes and frees.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from chunktune.sim.engine.request import FINISHED, Request


class BlockPool:
    __slots__ = ("block_size", "free", "peak_used", "total")

    def __init__(self, total: int, block_size: int) -> None:
        if total <= 0 or block_size <= 0:
            raise ValueError("a block pool needs total > 0 and block_size > 0")
        self.total = total
        self.block_size = block_size
        self.free = total
        self.peak_used = 0

    def allocate(self, req: Request, n_blocks: int) -> None:
        assert 0 <= n_blocks <= self.free, "allocate() beyond the free blocks"
        self.free -= n_blocks
        req.num_blocks += n_blocks
        used = self.total - self.free
        if used > self.peak_used:
            self.peak_used = used

    def release(self, req: Request) -> None:
        self.free += req.num_blocks
        req.num_blocks = 0
        assert self.free <= self.total, "released more blocks than the pool holds"

    def drop(self, req: Request, ci: int, c: BlockClass, first: int, end: int) -> None:
        """Free ``req``'s blocks of class ``c`` (the ``ci``-th of its
        :class:`HybridBlocks`) at places ``first`` to ``end``: a window left them."""
        n = c.groups * (end - first)
        self.free += n
        req.num_blocks -= n

    @property
    def used(self) -> int:
        return self.total - self.free

    @property
    def usage(self) -> float:
        """``vllm:kv_cache_usage_perc``: the fraction of blocks in use."""
        return (self.total - self.free) / self.total


#: A block's identity in the prefix cache: its request's opening and index for a block wholly
#: inside the opening (shared with the opening's other requests), else the request id and
#: index (its own: found again only by itself, after a preemption); or, where the prompt's
#: tokens are known, the hash of the block's tokens chained through the blocks before it
#: (:func:`block_keys`).
BlockKey = tuple[object, ...] | int


def block_keys(tokens: Sequence[int], block_size: int) -> list[int]:
    """The keys of the full blocks of ``tokens``: each block's tokens hashed with the key of
    the block before it, so that two prompts share a block's key only where they agree on
    every token up to its end (vLLM's chained block hashes)."""
    out: list[int] = []
    h = 0
    for i in range(len(tokens) // block_size):
        h = hash((h, tuple(tokens[i * block_size:(i + 1) * block_size])))
        out.append(h)
    return out


class PrefixCache(BlockPool):
    """The block pool with vLLM's prefix cache (``--enable-prefix-caching``), by counts.

    Like vLLM's ``BlockPool``: a full block is cached when it is allocated for the tokens that
    fill it (``allocate_slots`` caches up to ``min(computed + new, num_tokens)``), shared by
    every request that finds it (a reference count), and, once no request holds it, stays
    cached in the free queue until an allocation reaches it there: the queue is
    least-recently-freed first, a request's blocks freed last block first, and allocations
    take from its head, uncached free blocks and cached ones alike. ``free`` counts the free
    queue: never-used and released blocks, cached or not. A request admitted from WAITING
    with nothing computed takes the longest run of its leading blocks that is cached, at most
    ``(num_tokens - 1) // block_size`` (the last token is always computed); a cached block
    taken from the free queue leaves it (vLLM's "touch").

    Which blocks hold what is not modelled beyond that: a block filled by two requests at
    once (the second admitted before the first cached it) is cached once, the second's copy
    staying its own. Blocks are keyed by :data:`BlockKey`.
    """

    __slots__ = ("_gen", "_stale", "evictable", "hits", "own_first", "queries", "queue", "refs")

    def __init__(self, total: int, block_size: int, own_first: bool = False) -> None:
        super().__init__(total, block_size)
        #: a released request's uncached blocks go to the front of the free queue, taken
        #: before any cached block (vLLM 0.24+: ``vllm_release.uncached_freed_first``)
        self.own_first = own_first
        #: cached blocks and how many requests hold each
        self.refs: dict[BlockKey, int] = {}
        #: cached blocks in the free queue, by the generation of their queue entry
        self.evictable: dict[BlockKey, int] = {}
        #: the free queue: runs of uncached blocks (ints) and cached blocks (key, generation;
        #: :class:`HybridPrefixCache` also keeps runs of one request's blocks, :class:`Parked`);
        #: an entry whose block was taken since (another generation) is skipped
        self.queue: deque[Any] = deque([total])
        self._gen = 0
        #: queue entries of blocks taken since (dropped when they outnumber the live ones)
        self._stale = 0
        #: prompt tokens looked up and found, for requests admitted for the first time
        #: (``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``)
        self.queries = 0
        self.hits = 0

    def content(self, req: Request, tokens: int, i: int) -> BlockKey:
        """The key of ``req``'s ``i``-th block of ``tokens`` tokens (the hash block is the pool's
        ``block_size``): a known block's key, its opening's, or its own ``(rid, tokens, i)``."""
        keys = req.block_keys
        if keys is not None:
            j = (i + 1) * tokens // self.block_size - 1
            return keys[j] if j < len(keys) else (req.rid, tokens, i)
        if req.prefix_key is not None and (i + 1) * tokens <= req.prefix_tokens:
            return req.prefix_key, tokens, i
        return req.rid, tokens, i

    def lookup(self, req: Request) -> tuple[int, int]:
        """(blocks found, of which in the free queue) for ``req`` about to be admitted with
        nothing computed."""
        limit = (req.prompt_len + req.num_output - 1) // self.block_size
        refs = self.refs
        hit = touch = 0
        while hit < limit:
            r = refs.get(self.content(req, self.block_size, hit))
            if r is None:
                break
            touch += r == 0
            hit += 1
        return hit, touch

    def take(self, req: Request, hit: int) -> None:
        """Admit ``req`` onto its ``hit`` leading cached blocks (from :meth:`lookup`)."""
        if req.num_preemptions == 0:
            self.queries += req.prompt_len + req.num_output
            self.hits += hit * self.block_size
            req.num_cached = hit * self.block_size
        held: list[BlockKey] = []
        for i in range(hit):
            k = self.content(req, self.block_size, i)
            r = self.refs[k]
            if r == 0:
                del self.evictable[k]
                self.free -= 1
                self._stale += 1
            self.refs[k] = r + 1
            held.append(k)
        if self._stale > 4096 and self._stale > len(self.queue) // 2:
            evictable = self.evictable
            self.queue = deque(e for e in self.queue
                               if isinstance(e, int) or evictable.get(e[0]) == e[1])
            self._stale = 0
        req.held = held
        req.num_blocks += hit
        req.num_computed = hit * self.block_size
        req.cached_upto = hit
        used = self.total - self.free
        if used > self.peak_used:
            self.peak_used = used

    def commit(self, req: Request, tokens: int) -> None:
        """Cache ``req``'s blocks that its first ``tokens`` tokens fill."""
        full = tokens // self.block_size
        if full <= req.cached_upto:
            return
        held = req.held if req.held is not None else []
        refs = self.refs
        for i in range(req.cached_upto, full):
            k = self.content(req, self.block_size, i)
            if k not in refs:
                refs[k] = 1
                held.append(k)
        req.held = held
        req.cached_upto = full

    def allocate(self, req: Request, n_blocks: int) -> None:
        queue = self.queue
        left = n_blocks
        while left:
            entry = queue.popleft()
            if isinstance(entry, int):
                if entry > left:
                    queue.appendleft(entry - left)
                    left = 0
                else:
                    left -= entry
            else:
                left -= self._evict(entry, left)
        BlockPool.allocate(self, req, n_blocks)

    def _evict(self, entry: tuple[BlockKey, int], left: int) -> int:
        """Evict the cached blocks of a free-queue entry, at most ``left``: how many (0 for an
        entry whose block was taken since: stale)."""
        key, gen = entry
        if self.evictable.get(key) != gen:
            self._stale -= 1
            return 0
        del self.evictable[key]
        del self.refs[key]
        return 1

    def release(self, req: Request) -> None:
        held = req.held or []
        own = req.num_blocks - len(held)
        if own:
            if self.own_first:
                self.queue.appendleft(own)
            else:
                self.queue.append(own)
        self.free += own
        for k in reversed(held):
            r = self.refs[k] - 1
            self.refs[k] = r
            if r == 0:
                self._gen += 1
                self.evictable[k] = self._gen
                self.queue.append((k, self._gen))
                self.free += 1
        req.held = None
        req.num_blocks = 0
        req.cached_upto = 0
        assert self.free <= self.total, "released more blocks than the pool holds"


@dataclass(frozen=True)
class BlockClass:
    """The KV-cache groups of one attention kind and block size in a hybrid pool."""

    groups: int
    #: tokens one of their blocks holds
    block_tokens: int
    #: a sliding-window layer's window (tokens), a chunked-local layer's chunk; 0: full
    window: int = 0
    chunk: int = 0
    #: ``max_admission_blocks_per_request`` of a windowed group (vLLM 0.20+), the blocks the
    #: admission gate reserves for it at most
    cap: int = 0

    @property
    def windowed(self) -> bool:
        return bool(self.window or self.chunk)

    def skipped_blocks(self, computed: int) -> int:
        """The leading blocks out of reach once ``computed`` tokens are computed (vLLM's
        ``get_num_skipped_tokens`` over the block size): before the window of the next
        token (``SlidingWindowManager``), before its chunk (``ChunkedLocalAttentionManager``)."""
        if self.window:
            skipped = computed - self.window + 1
            return skipped // self.block_tokens if skipped > 0 else 0
        if self.chunk:
            return computed // self.chunk * self.chunk // self.block_tokens
        return 0


class HybridBlocks:
    """Block counts of vLLM's hybrid KV cache manager: several KV-cache groups, each with its
    block table, in one pool (vLLM 0.34 ``kv_cache_manager.allocate_slots``,
    ``single_type_kv_cache_manager``; the same rules from 0.18 as far as they are modelled).

    A request's table in every group covers the tokens with slots (``Request.slot_end``), a
    block each ``block_tokens``; a windowed group frees the leading blocks its window has
    passed (``remove_skipped_blocks``, on the computed tokens, before each allocation) and
    keeps their places as null blocks, so a running request asks each group for the blocks of
    its new places only (``get_num_blocks_to_allocate``). A waiting request's whole-sequence
    admission gate counts a windowed group at most its ``cap`` (0.20+). With the prefix cache,
    :class:`HybridPrefixCache` keeps which of these blocks are cached. With asynchronous
    scheduling vLLM 0.26+ frees on the tokens already processed (a step later); the simulator
    frees on the computed ones (at most a step's chunk of blocks a request earlier).
    """

    __slots__ = ("classes", "sizes", "smallest", "windows")

    def __init__(self, classes: Sequence[BlockClass]) -> None:
        #: in vLLM's group order (its first layer's kind first)
        self.classes = tuple(classes)
        #: (groups, block tokens) of each class, and (index, class) of the windowed ones
        self.sizes = tuple((c.groups, c.block_tokens) for c in classes)
        self.windows = tuple((i, c) for i, c in enumerate(classes) if c.windowed)
        #: the smallest block (tokens), which every other divides into (page unification)
        self.smallest = min(c.block_tokens for c in classes)
        assert all(c.block_tokens % self.smallest == 0 for c in classes)

    def start(self, req: Request, end: int, hit_tokens: int) -> None:
        """``req`` admitted with slots up to ``end``, its first ``hit_tokens`` cached."""
        req.slot_end = end
        req.skipped = [c.skipped_blocks(hit_tokens) for c in self.classes]
        req.trim_at = 0

    def reset(self, req: Request) -> None:
        """``req`` freed everything (preempted)."""
        req.slot_end = 0
        req.skipped = None
        req.trim_at = 0

    def trim(self, req: Request, pool: BlockPool) -> None:
        """Free the windowed blocks ``req``'s computed tokens have left behind."""
        computed = req.num_computed
        skipped = req.skipped
        if computed < req.trim_at or skipped is None:
            return
        end = req.slot_end
        next_at = 1 << 62
        for i, c in self.windows:
            bt = c.block_tokens
            s = c.skipped_blocks(computed)
            places = -(-end // bt)
            if s >= places:
                s = places
                next_at = 0  # the window waits for more places: look again next time
            elif c.window:
                at = (s + 1) * bt + c.window - 1
                if at < next_at:
                    next_at = at
            else:
                at = (computed // c.chunk + 1) * c.chunk
                if at < next_at:
                    next_at = at
            if s > skipped[i]:
                pool.drop(req, i, c, skipped[i], s)
                skipped[i] = s
        req.trim_at = next_at

    def grow(self, req: Request, end: int) -> int:
        """The blocks a running request takes for slots up to ``end``."""
        old = req.slot_end
        if end <= old:
            return 0
        need = 0
        for groups, bt in self.sizes:
            need += groups * (-(-end // bt) - -(-old // bt))
        return need

    def admit(self, end: int, hit_tokens: int) -> int:
        """The blocks a waiting request (holding none) allocates for slots up to ``end``
        beside the ``hit_tokens`` it found cached (the cached ones it takes are the prefix
        cache's ``touch``)."""
        return sum(c.groups * (-(-end // c.block_tokens) - hit_tokens // c.block_tokens)
                   for c in self.classes)

    def gate(self, tokens: int, hit_tokens: int) -> int:
        """The blocks the whole-sequence admission gate asks for a waiting request of
        ``tokens`` (``get_num_blocks_to_allocate`` with ``apply_admission_cap``)."""
        need = 0
        for c in self.classes:
            want = -(-tokens // c.block_tokens)
            if c.cap and want > c.cap:
                want = c.cap
            want -= hit_tokens // c.block_tokens
            if want > 0:
                need += c.groups * want
        return need


#: A request's cached blocks in a :class:`HybridPrefixCache`: per (class, group), by place,
#: the key and the copy it holds (None where it holds none, or an uncached block; places
#: below its ``kept_to`` only).
Held = dict[tuple[int, int], list[tuple[BlockKey, list[int]] | None]]


def _hold(held: Held, ci: int, g: int, i: int, entry: tuple[BlockKey, list[int]]) -> None:
    row = held.get((ci, g))
    if row is None:
        row = held[ci, g] = []
    if len(row) <= i:
        row.extend([None] * (i + 1 - len(row)))
    row[i] = entry


def _owner(key: BlockKey) -> int:
    """The request whose own content a hybrid cache key is (:meth:`HybridPrefixCache.content`
    ``(rid, tokens, i)``), or -1: shared."""
    content = key[2]  # type: ignore[index]
    if type(content) is tuple and type(content[0]) is int:
        return content[0]
    return -1


class Parked:
    """A run of one request's own cached blocks of one group in the free queue: places ``lo``
    to ``hi``, freed (and evicted) last first. ``gens``: None while they are only counted,
    else each place's generation (:attr:`HybridPrefixCache.parked`; a block taken since is
    skipped as stale)."""

    __slots__ = ("ci", "g", "gens", "hi", "lo")

    def __init__(self, ci: int, g: int, lo: int, hi: int) -> None:
        self.ci, self.g, self.lo, self.hi = ci, g, lo, hi
        self.gens: list[int] | None = None


class HybridPrefixCache(PrefixCache):
    """The prefix cache over several KV-cache groups (vLLM's ``HybridKVCacheCoordinator``).

    Each group's blocks are cached on their own, keyed by class, group and content; a hit is
    the longest prefix every group finds (``find_longest_cache_hit``): the full-attention
    groups' leading cached blocks; a sliding-window group's last ``ceil((window - 1) /
    block)`` blocks before the hit, found from the right (or its leading run, if shorter); a
    chunked group's blocks of the hit's last chunk; with one full and one windowed kind (every
    modelled model) in one pass. A windowed group's blocks the window leaves are freed as the
    request goes, cached, to the free queue; a request's blocks are freed group by group, each
    group's last block first (``SingleTypeKVCacheManager.free``). A block filled with content
    another block already holds is cached beside it (vLLM's ``BlockHashToBlockMap`` keeps
    both; a hit takes the first cached): a request that recomputes a prefix whose windowed
    blocks were evicted caches its full blocks again. Keys are those of :class:`PrefixCache`
    at each class's block size (the hash block is the pool's ``block_size``).

    A request's own blocks (past any opening it shares) can be found by no other request: until
    it is preempted and looks them up, they are not kept one by one. It holds those it cached
    since it was admitted as a count (its places from ``kept_to`` to ``cached_to``); freed,
    they go to the free queue together (:class:`Parked`), as plain free blocks once it has
    finished; its lookup after a preemption gives each still in the queue its entry, after
    any older copy of the same content. The free queue's order and what a lookup finds are
    the same as with every block kept one by one. A waiting request's lookup is remembered
    (``seen``) until one of its blocks is evicted or, if it shares blocks, a shared block is
    cached, evicted, taken from the free queue or put back.
    """

    __slots__ = ("align", "class_own_first", "copies", "hybrid", "parked", "runs", "seen",
                 "shared_changes")

    def __init__(self, total: int, block_size: int, hybrid: HybridBlocks,
                 own_first: bool = False, window_own_first: bool = False) -> None:
        super().__init__(total, block_size, own_first)
        self.hybrid = hybrid
        #: per class, whether its uncached freed blocks go to the front of the free queue
        self.class_own_first = [window_own_first if c.windowed else own_first
                                for c in hybrid.classes]
        #: a hit is a whole number of every group's blocks
        self.align = math.lcm(*(c.block_tokens for c in hybrid.classes))
        #: each cached key's blocks, oldest first: [holders, generation in the free queue]
        self.copies: dict[BlockKey, list[list[int]]] = {}
        #: cached blocks in the free queue, by generation
        self.parked: dict[int, tuple[BlockKey, list[int]]] = {}
        #: the runs of its own blocks each request parked since its last lookup
        self.runs: dict[int, list[Parked]] = {}
        #: a waiting request's last lookup: (``shared_changes`` then, or -1 if it shares no
        #: block, tokens found, blocks of them in the free queue); dropped when one of its own
        #: blocks is evicted, and when it is admitted or released
        self.seen: dict[int, tuple[int, int, int]] = {}
        #: changes to shared blocks that a lookup sees: cached or no more, parked or taken
        self.shared_changes = 0

    def own_from(self, req: Request, tokens: int) -> int:
        """The first of ``req``'s places of ``tokens`` tokens whose content is its own
        (:meth:`content` ``(rid, tokens, i)``): past its opening or its known blocks."""
        keys = req.block_keys
        if keys is not None:
            return -(-(len(keys) + 1) * self.block_size // tokens) - 1
        if req.prefix_key is not None:
            return req.prefix_tokens // tokens
        return 0

    def contents(self, req: Request, tokens: int, places: range) -> list[BlockKey]:
        """:meth:`content` of each of ``places``."""
        if not places:
            return []
        if req.block_keys is None and (req.prefix_key is None
                                       or (min(places) + 1) * tokens > req.prefix_tokens):
            rid = req.rid  # the request's own blocks only
            return [(rid, tokens, i) for i in places]
        return [self.content(req, tokens, i) for i in places]

    def _cached(self, ci: int, c: BlockClass, content: BlockKey) -> bool:
        """Whether every group of class ``ci`` has a block of ``content`` cached."""
        copies = self.copies
        return all((ci, g, content) in copies for g in range(c.groups))

    def _hit(self, req: Request, ci: int, c: BlockClass, max_length: int) -> int:
        """Class ``ci``'s longest hit within ``max_length`` tokens (tokens)."""
        bt = c.block_tokens
        n = max_length // bt
        if not c.windowed:
            hit = 0
            for content in self.contents(req, bt, range(n)):
                if not self._cached(ci, c, content):
                    break
                hit += 1
            return hit * bt
        if c.chunk:
            i = (max_length // c.chunk * c.chunk) // bt if max_length > 0 else 0
            while i < n and self._cached(ci, c, self.content(req, bt, i)):
                i += 1
            return i * bt
        need = -(-(c.window - 1) // bt)
        run = 0
        for i in range(n - 1, -1, -1):
            if self._cached(ci, c, self.content(req, bt, i)):
                if run == 0 and bt != self.align and (i + 1) * bt % self.align:
                    continue
                run += 1
                if run >= need:
                    return (i + run) * bt
            else:
                run = 0
        hit = run * bt
        while hit % self.align:
            hit -= bt
        return hit

    def _taken(self, req: Request, hit: int) -> list[tuple[BlockKey, tuple[int, int, int]]]:
        """The cached blocks a request admitted on ``hit`` tokens takes, with (class, group,
        place): each class's blocks from the first its window needs to the hit."""
        out: list[tuple[BlockKey, tuple[int, int, int]]] = []
        for ci, c in enumerate(self.hybrid.classes):
            bt = c.block_tokens
            places = range(c.skipped_blocks(hit), hit // bt)
            contents = self.contents(req, bt, places)
            for g in range(c.groups):
                out += [((ci, g, content), (ci, g, i))
                        for i, content in zip(places, contents, strict=True)]
        return out

    def lookup_tokens(self, req: Request) -> tuple[int, int]:
        """(tokens found, blocks of them in the free queue) for ``req`` about to be admitted
        with nothing computed: the fixed point over the classes, full attention first."""
        rid = req.rid
        seen = self.seen.get(rid)
        if seen is not None and (seen[0] < 0 or seen[0] == self.shared_changes):
            return seen[1], seen[2]
        if rid in self.runs:
            self._materialize(req)
        hit = req.prompt_len + req.num_output - 1
        if req.block_keys is None and req.num_preemptions == 0:
            # never run: only its shared opening's blocks can be cached
            hit = min(hit, req.prefix_tokens if req.prefix_key is not None else 0)
            if hit < self.align:
                return 0, 0
        classes = self.hybrid.classes
        order = sorted(range(len(classes)), key=lambda ci: classes[ci].windowed)
        simple = len(order) == 2 and not classes[order[0]].windowed
        while True:
            cur = hit
            for ci in order:
                cur = self._hit(req, ci, classes[ci], cur)
            if cur >= hit:
                break
            hit = cur
            if simple:
                break
        copies = self.copies
        touch = sum(copies[k][0][0] == 0 for k, _ in self._taken(req, hit))
        shares = req.block_keys is not None or req.prefix_key is not None
        self.seen[rid] = (self.shared_changes if shares else -1, hit, touch)
        return hit, touch

    def lookup(self, req: Request) -> tuple[int, int]:
        hit, touch = self.lookup_tokens(req)
        return hit // self.block_size, touch

    def take(self, req: Request, hit: int) -> None:
        tokens = hit * self.block_size
        if req.num_preemptions == 0:
            self.queries += req.prompt_len + req.num_output
            self.hits += tokens
            req.num_cached = tokens
        self.seen.pop(req.rid, None)
        held: Held = {}
        taken = 0
        for k, (ci, g, i) in self._taken(req, tokens):
            copy = self.copies[k][0]  # vLLM's get_one_block: the first cached
            if copy[0] == 0:
                del self.parked[copy[1]]
                self.free -= 1
                self._stale += 1
                if _owner(k) < 0:
                    self.shared_changes += 1
            copy[0] += 1
            _hold(held, ci, g, i, (k, copy))
            taken += 1
        if self._stale > 4096 and self._stale > len(self.queue) // 2:
            parked = self.parked
            self.queue = deque(e for e in self.queue if isinstance(e, int) or (
                e.hi > e.lo if type(e) is Parked else e[1] in parked))
            self._stale = 0
        req.held = held
        req.num_blocks += taken
        req.num_computed = tokens
        req.cached_to = [tokens // c.block_tokens for c in self.hybrid.classes]
        req.kept_to = [max(n, self.own_from(req, c.block_tokens))
                       for n, c in zip(req.cached_to, self.hybrid.classes, strict=True)]
        req.cached_upto = self._next_full(req.cached_to)
        used = self.total - self.free
        if used > self.peak_used:
            self.peak_used = used

    def _next_full(self, cached_to: list[int]) -> int:
        """The tokens at which some class fills a block past ``cached_to``."""
        return min((n + 1) * bt for n, (_, bt) in zip(cached_to, self.hybrid.sizes,
                                                      strict=True))

    def commit(self, req: Request, tokens: int) -> None:
        # ``cached_upto`` (here: tokens) is where the next block of some class fills
        if tokens < req.cached_upto:
            return
        cached_to = req.cached_to
        if cached_to is None:
            cached_to = req.cached_to = [0] * len(self.hybrid.classes)
        held = req.held
        if held is None:
            held = req.held = {}
        copies = self.copies
        skipped = req.skipped
        kept_to = req.kept_to
        if kept_to is None:
            kept_to = req.kept_to = [self.own_from(req, c.block_tokens)
                                     for c in self.hybrid.classes]
        for ci, c in enumerate(self.hybrid.classes):
            bt = c.block_tokens
            full = tokens // bt
            first = cached_to[ci]
            if skipped is not None and skipped[ci] > first:
                first = skipped[ci]
            if full <= first:
                continue
            cached_to[ci] = full
            top = min(full, kept_to[ci])
            if top <= first:
                continue  # its own blocks: counted (places below cached_to)
            places = range(first, top)
            contents = self.contents(req, bt, places)
            for g in range(c.groups):
                row = held.get((ci, g))
                if row is None:
                    row = held[ci, g] = []
                if len(row) < top:
                    row.extend([None] * (top - len(row)))
                for i, content in zip(places, contents, strict=True):
                    k = (ci, g, content)
                    copy = [1, 0]
                    got = copies.get(k)
                    if got is None:
                        copies[k] = [copy]
                        if _owner(k) < 0:
                            self.shared_changes += 1
                    else:
                        got.append(copy)
                    row[i] = (k, copy)
        req.cached_upto = self._next_full(cached_to)

    def _materialize(self, req: Request) -> None:
        """Give each of ``req``'s own blocks it parked as runs and still in the free queue
        its entry (it looks them up, preempted): after any older copy of the same content,
        which it took or cached before."""
        rid = req.rid
        copies, parked = self.copies, self.parked
        gen = self._gen
        for run in self.runs.pop(rid, ()):
            bt = self.hybrid.classes[run.ci].block_tokens
            gens = []
            for i in range(run.lo, run.hi):
                gen += 1
                k = (run.ci, run.g, (rid, bt, i))
                copy = [0, gen]
                got = copies.get(k)
                if got is None:
                    copies[k] = [copy]
                else:
                    got.append(copy)
                parked[gen] = (k, copy)
                gens.append(gen)
            run.gens = gens
        self._gen = gen

    def _evict(self, entry: tuple[BlockKey, int] | Parked, left: int) -> int:
        parked = self.parked
        if not isinstance(entry, Parked):
            got = parked.pop(entry[1], None)
            if got is None:
                self._stale -= 1
                return 0
            self._forget(*got)
            return 1
        lo, gens = entry.lo, entry.gens
        if gens is None:  # counted only: every block still there is cached
            n = min(left, entry.hi - lo)
            entry.hi -= n
        else:
            n = 0
            while n < left and entry.hi > lo:
                entry.hi -= 1
                got = parked.pop(gens[entry.hi - lo], None)
                if got is None:
                    self._stale -= 1
                else:
                    self._forget(*got)
                    n += 1
        if entry.hi > lo:
            self.queue.appendleft(entry)
        return n

    def _forget(self, key: BlockKey, copy: list[int]) -> None:
        same = self.copies[key]
        if len(same) == 1:
            del self.copies[key]
        else:
            del same[next(j for j, c in enumerate(same) if c is copy)]
        owner = _owner(key)
        if owner < 0:
            self.shared_changes += 1
        else:
            self.seen.pop(owner, None)

    def _to_back(self, n: int) -> None:
        queue = self.queue
        if queue and isinstance(queue[-1], int):
            queue[-1] += n
        else:
            queue.append(n)

    def _free_blocks(self, req: Request, ci: int, g: int, places: range) -> int:
        """Free ``req``'s blocks of group ``g`` of class ``ci`` at ``places`` (in order), one
        by one: how many."""
        row = (req.held or {}).get((ci, g)) or []
        queue, parked = self.queue, self.parked
        own_first = self.class_own_first[ci]
        gen = self._gen
        freed = own = 0
        n = len(row)
        for i in places:
            got = row[i] if i < n else None
            if got is not None:
                row[i] = None
                k, copy = got
                copy[0] -= 1
                if copy[0] == 0:  # no other request holds it: cached, in the free queue
                    gen += 1
                    copy[1] = gen
                    parked[gen] = (k, copy)
                    queue.append((k, gen))
                    freed += 1
                    if _owner(k) < 0:
                        self.shared_changes += 1
            elif own_first:  # uncached (a block not yet full): gathered below
                own += 1
            else:
                self._to_back(1)
                freed += 1
        if own:  # to the front of the free queue, taken before any cached block
            if queue and isinstance(queue[0], int):
                queue[0] += own
            else:
                queue.appendleft(own)
        self._gen = gen
        return freed + own

    def _free(self, req: Request, ci: int, c: BlockClass, g: int, lo: int, hi: int,
              done: bool) -> None:
        """Free ``req``'s blocks of group ``g`` of class ``ci`` at places ``hi - 1`` down to
        ``lo`` (``done``: it has finished)."""
        if hi <= lo:
            return
        req.num_blocks -= hi - lo
        # the places from cached_to up are not cached (not full yet); below kept_to they are
        # kept one by one, from there to cached_to counted
        ct = req.cached_to[ci] if req.cached_to is not None else 0
        kept = req.kept_to[ci] if req.kept_to is not None else 0
        freed = 0
        edge = max(lo, ct)
        if hi > edge:
            freed += self._free_blocks(req, ci, g, range(hi - 1, edge - 1, -1))
        first, end = max(lo, kept), min(hi, ct)
        if end > first:
            if done:  # nobody can find them: free blocks
                self._to_back(end - first)
            else:
                run = Parked(ci, g, first, end)
                self.queue.append(run)
                self.runs.setdefault(req.rid, []).append(run)
            freed += end - first
        end = min(hi, kept, ct)
        if end > lo:
            freed += self._free_blocks(req, ci, g, range(end - 1, lo - 1, -1))
        self.free += freed

    def drop(self, req: Request, ci: int, c: BlockClass, first: int, end: int) -> None:
        for g in range(c.groups):
            self._free(req, ci, c, g, first, end, False)

    def release(self, req: Request) -> None:
        done = req.status == FINISHED
        self.seen.pop(req.rid, None)
        skipped = req.skipped
        if skipped is not None:
            for ci, c in enumerate(self.hybrid.classes):
                top = -(-req.slot_end // c.block_tokens)
                for g in range(c.groups):
                    self._free(req, ci, c, g, skipped[ci], top, done)
        if req.num_blocks:  # blocks of no place (none: every block has one)
            self.queue.append(req.num_blocks)
            self.free += req.num_blocks
        if done:
            self.runs.pop(req.rid, None)
        req.held = None
        req.num_blocks = 0
        req.cached_upto = 0
        req.cached_to = None
        req.kept_to = None
        assert self.free <= self.total, "released more blocks than the pool holds"
