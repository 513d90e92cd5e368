"""The KV-cache block pool.

Only counts matter for scheduling (which blocks a request holds does not, as long as prefix
caching is not modeled), so the pool is a counter plus each request's ``num_blocks``::

    request tokens:  | computed ............ | new (this step) |
    blocks held:     | ceil((computed + new) / block_size)     |

The scheduler computes what ``allocate_slots`` would have to add for ``new`` more tokens
(``ceil((computed + new) / block_size) - num_blocks``, inline in its hot loop); like vLLM's
``KVCacheManager.allocate_slots`` it treats "not enough free" as "won't fit" and preempts.
Invariant: ``free + sum(request.num_blocks) == total``.
"""

from __future__ import annotations

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
