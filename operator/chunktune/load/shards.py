"""How one load run's arrival schedule is split across Locust workers (pure).

A distributed run (``workload.loadWorkers``) replays the same request sequence as one process:
the profile's sequence (:func:`chunktune.core.workload.generate`, from its seed) is dealt out
round-robin in arrival order, each request keeping its arrival time and id, so every worker
sends its share at the very times one process would have, with the same prompts (they derive
from the seed and the request id). A closed loop (``concurrency``) splits its clients instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

__all__ = ["clients", "shard"]

T = TypeVar("T")


def shard(specs: Sequence[T], index: int, count: int) -> list[T]:
    """Worker ``index``'s share (of ``count``) of an arrival-ordered sequence: every
    ``count``-th request from ``index``."""
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"worker {index} of {count}")
    return list(specs[index::count])


def clients(concurrency: int, index: int, count: int) -> int:
    """Worker ``index``'s share of a closed loop's ``concurrency`` clients (the first
    ``concurrency % count`` workers take one more)."""
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"worker {index} of {count}")
    return concurrency // count + (1 if index < concurrency % count else 0)
