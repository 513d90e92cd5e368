"""A request inside the simulated engine.

As in vLLM V1 there is no prefill or decode phase: a request has ``num_tokens`` (prompt plus the
tokens generated so far) and ``num_computed``, the tokens whose KV is in the cache; each step
schedules some of the difference. When a step brings ``num_computed`` up to ``num_tokens`` the
request samples one more token.
"""

from __future__ import annotations

from typing import Any

WAITING, RUNNING, FINISHED, REJECTED = 0, 1, 2, 3


class Request:
    __slots__ = (
        "arrival",
        "block_keys",
        "cached_to",
        "cached_upto",
        "cls",
        "finish_time",
        "first_scheduled",
        "first_token",
        "held",
        "itl",
        "kept_to",
        "last_token",
        "max_tokens",
        "num_blocks",
        "num_cached",
        "num_computed",
        "num_output",
        "num_preemptions",
        "prefill_chunk",
        "prefix_key",
        "prefix_tokens",
        "priority",
        "prompt_len",
        "rid",
        "skipped",
        "slot_end",
        "spec_acceptance",
        "spec_carry",
        "spec_tokens",
        "status",
        "trim_at",
    )

    def __init__(self, rid: int, arrival: float, prompt_len: int, max_tokens: int,
                 cls: int = 0, priority: int = 0, prefix_key: str | None = None,
                 prefix_tokens: int = 0) -> None:
        self.rid = rid
        #: The opening this prompt shares with others (its first ``prefix_tokens`` tokens),
        #: for the prefix cache (:class:`chunktune.sim.engine.kv_cache.PrefixCache`).
        self.prefix_key = prefix_key
        self.prefix_tokens = prefix_tokens
        #: Or, for a prompt whose tokens are known (``sim serve``), each full block's key:
        #: a hash of the block's tokens chained through the blocks before it, as vLLM's.
        self.block_keys: list[int] | None = None
        #: Prompt tokens found in the prefix cache when first admitted (not recomputed).
        self.num_cached = 0
        #: The cached blocks this request holds a reference on, in block order, and how many
        #: of its leading blocks the cache has been offered (prefix caching only).
        self.held: Any = None
        self.cached_upto = 0
        #: With several KV-cache groups: per block class, the places cached so far.
        self.cached_to: list[int] | None = None
        #: And per block class, the places below which its cached blocks are kept one by one
        #: (its opening's, and those it took when admitted); its own above are counted.
        self.kept_to: list[int] | None = None
        #: Lower is served first under ``--scheduling-policy priority`` (the OpenAI API's
        #: ``priority`` field); ignored under ``fcfs``.
        self.priority = priority
        self.arrival = arrival
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.cls = cls
        self.num_computed = 0
        self.num_output = 0
        self.num_blocks = 0
        #: With several KV-cache groups (:class:`chunktune.sim.engine.kv_cache.HybridBlocks`):
        #: the tokens that have KV slots (each group's block table covers them), and per
        #: windowed block class the leading blocks freed (or never taken) as the window passed.
        self.slot_end = 0
        self.skipped: list[int] | None = None
        #: the computed tokens at which a window next leaves a block behind
        self.trim_at = 0
        self.num_preemptions = 0
        #: whether its last scheduled chunk left prompt to compute (vLLM's
        #: ``Request.is_prefill_chunk``, set after each step that scheduled it)
        self.prefill_chunk = False
        self.status = WAITING
        self.first_scheduled = -1.0
        self.first_token = -1.0
        self.last_token = -1.0
        self.finish_time = -1.0
        #: Inter-token gaps in seconds, one per step that gave the request tokens after its
        #: first (with speculative decoding a step may give several: one gap for them all,
        #: as a streaming client sees one chunk).
        self.itl: list[float] = []
        #: Speculative decoding: the draft tokens proposed for the next step (vLLM's
        #: ``spec_token_ids``), the chance each is accepted (its traffic class's), and the
        #: fraction of an accepted token carried to the next verification (so a request
        #: accepts, over its steps, exactly the expected number).
        self.spec_tokens = 0
        self.spec_acceptance = 0.0
        self.spec_carry = 0.0

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.num_output

    def __repr__(self) -> str:
        return (f"Request({self.rid}, prompt={self.prompt_len}, out={self.num_output}/"
                f"{self.max_tokens}, computed={self.num_computed}, blocks={self.num_blocks})")
