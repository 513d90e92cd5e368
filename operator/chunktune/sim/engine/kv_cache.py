"""The KV-cache block pool.

Only counts matter for scheduling (which blocks a request holds does not, but for the prefix
cache: :class:`PrefixCache`), so the pool is a counter plus each request's ``num_blocks``::

    request tokens:  | computed ............ | new (this step) |
    blocks held:     | ceil((computed + new) / block_size)     |

The scheduler computes what ``allocate_slots`` would have to add for ``new`` more tokens
(``ceil((computed + new) / block_size) - num_blocks``, inline in its hot loop); like vLLM's
``KVCacheManager.allocate_slots`` it treats "not enough free" as "won't fit" and preempts.
Invariant: ``free + sum(request.num_blocks) == total``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from chunktune.sim.engine.request import Request


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
BlockKey = tuple[object, int] | int


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

    __slots__ = ("_gen", "_stale", "evictable", "hits", "queries", "queue", "refs")

    def __init__(self, total: int, block_size: int) -> None:
        super().__init__(total, block_size)
        #: cached blocks and how many requests hold each
        self.refs: dict[BlockKey, int] = {}
        #: cached blocks in the free queue, by the generation of their queue entry
        self.evictable: dict[BlockKey, int] = {}
        #: the free queue: runs of uncached blocks (ints) and cached blocks (key, generation);
        #: an entry whose block was taken since (another generation) is skipped
        self.queue: deque[int | tuple[BlockKey, int]] = deque([total])
        self._gen = 0
        #: queue entries of blocks taken since (dropped when they outnumber the live ones)
        self._stale = 0
        #: prompt tokens looked up and found, for requests admitted for the first time
        #: (``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``)
        self.queries = 0
        self.hits = 0

    def key(self, req: Request, i: int) -> BlockKey:
        keys = req.block_keys
        if keys is not None:
            return keys[i] if i < len(keys) else (req.rid, i)
        if req.prefix_key is not None and (i + 1) * self.block_size <= req.prefix_tokens:
            return req.prefix_key, i
        return req.rid, i

    def lookup(self, req: Request) -> tuple[int, int]:
        """(blocks found, of which in the free queue) for ``req`` about to be admitted with
        nothing computed."""
        limit = (req.prompt_len + req.num_output - 1) // self.block_size
        refs = self.refs
        hit = touch = 0
        while hit < limit:
            r = refs.get(self.key(req, hit))
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
            k = self.key(req, i)
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
            k = self.key(req, i)
            if k not in refs:
                refs[k] = 1
                held.append(k)
        req.held = held
        req.cached_upto = full

    def allocate(self, req: Request, n_blocks: int) -> None:
        queue, evictable, refs = self.queue, self.evictable, self.refs
        left = n_blocks
        while left:
            entry = queue.popleft()
            if isinstance(entry, int):
                if entry > left:
                    queue.appendleft(entry - left)
                    left = 0
                else:
                    left -= entry
            elif evictable.get(entry[0]) == entry[1]:  # evicted
                del evictable[entry[0]]
                del refs[entry[0]]
                left -= 1
            else:
                self._stale -= 1
        super().allocate(req, n_blocks)

    def release(self, req: Request) -> None:
        held = req.held or []
        own = req.num_blocks - len(held)
        if own:
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
