"""The cases of the per-release scheduler suite: seeded random ones, and one per rule that
changed between releases.

A case is an engine (scheduler settings and a KV-cache size in blocks) and requests
``(id, prompt tokens, output tokens)``, each with a priority, an opening shared with others
(``(key, tokens)`` or None) and the step before which it arrives; with speculative decoding
(``speculative``: method and K), the drafts each verification accepts, per request, are drawn
from a generator seeded by the case and the request, and both sides are given the same
numbers. The same case runs through
each release's own ``Scheduler`` (``vllm_scheduler.py``) and through the simulator's, set to
that release (:func:`sim_trace`).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chunktune.core.engine_args import ResolvedConfig
from chunktune.core.vllm_release import SCHEDULERS, Version
from chunktune.sim.engine.request import Request
from chunktune.sim.engine.scheduler import Scheduler
from chunktune.sim.engine.step_trace import BatchTrace

BLOCK_SIZE = 16
#: The first checked release whose ``SchedulerConfig`` has each setting a case may add
#: (0.18.0 has none of them).
SETTINGS_SINCE: dict[str, Version] = {
    "async_scheduling": (0, 18, 0),
    "scheduler_reserve_full_isl": (0, 19, 0),
    "long_prefill_token_threshold_adaptive": (0, 31, 0),
    "prefill_schedule_interval": (0, 31, 0),
    "cache_aware_admission_window": (0, 34, 0),
    "cache_aware_admission_threshold": (0, 34, 0),
}


@dataclass(frozen=True)
class ReleaseCase:
    name: str
    requests: tuple[tuple[str, int, int], ...]
    max_num_batched_tokens: int = 64
    max_num_seqs: int = 8
    max_model_len: int = 1024
    long_prefill_token_threshold: int = 0
    enable_chunked_prefill: bool = True
    scheduling_policy: str = "fcfs"
    enable_prefix_caching: bool = False
    num_gpu_blocks: int = 256
    priorities: tuple[int, ...] = ()
    prefixes: tuple[tuple[str, int] | None, ...] = ()
    arrivals: tuple[int, ...] = ()
    #: scheduler settings beyond the common ones, by vLLM's ``SchedulerConfig`` field name
    extra: dict[str, Any] = field(default_factory=dict)
    #: the first checked release that has every setting of ``extra`` (None: the first
    #: that has each, :data:`SETTINGS_SINCE`)
    since: Version | None = None
    #: speculative decoding: (method, K), method ``ngram`` or ``draft_model`` (the model
    #: drafting for itself); None: off
    speculative: tuple[str, int] | None = None
    #: vLLM's KV-cache groups, one layer each (``"full"``, ``"sliding"`` or ``"chunked"``):
    #: the hybrid KV cache manager; the simulator's model has one layer of each (so that it
    #: forms the same groups). Empty: one full-attention group.
    kv_groups: tuple[str, ...] = ()
    #: the sliding window or the local-attention chunk of the windowed groups (tokens)
    window: int = 0

    def first_release(self) -> Version:
        """The oldest checked release the case runs on: the newest of its settings' first."""
        if self.since is not None:
            return self.since
        return max([SCHEDULERS[0].version, *(SETTINGS_SINCE[k] for k in self.extra)])

    def runs_on(self, v: Version) -> bool:
        """Whether the case runs on release ``v``: from its first release, except windowed
        groups under 0.19's uncapped whole-sequence gate, which the simulator refuses by name
        (``test_vllm_0_19s_gate_over_windowed_layers_is_refused_by_name``)."""
        if self.first_release() > v:
            return False
        windowed = any(g != "full" for g in self.kv_groups)
        gate_on = self.extra.get("scheduler_reserve_full_isl", True)
        return not (windowed and gate_on and (0, 19, 0) <= v < (0, 20, 0))

    def hf_config(self, tiny: dict[str, Any]) -> dict[str, Any]:
        """The tiny model's config.json with a layer per KV-cache group."""
        kinds = {"full": "full_attention", "sliding": "sliding_attention",
                 "chunked": "chunked_attention"}
        out = dict(tiny, num_hidden_layers=len(self.kv_groups),
                   layer_types=[kinds[g] for g in self.kv_groups],
                   max_position_embeddings=max(tiny["max_position_embeddings"],
                                               self.max_model_len))
        if "sliding" in self.kv_groups:
            out["sliding_window"] = self.window
        if "chunked" in self.kv_groups:
            out["attention_chunk_size"] = self.window
        return out

    def accepted(self) -> dict[str, list[int]]:
        """The drafts accepted at each verification of each request's drafts, in order
        (seeded: the same every run); a verification never accepts more than it has."""
        if self.speculative is None:
            return {}
        k = self.speculative[1]
        out = {}
        for rid, _, o in self.requests:
            rng = random.Random(f"{self.name}-{rid}")
            out[rid] = [rng.randint(0, k) for _ in range(o + 2)]
        return out

    def speculative_config(self) -> str | None:
        """``--speculative-config``'s JSON for the simulator (None: off)."""
        if self.speculative is None:
            return None
        method, k = self.speculative
        spec: dict[str, Any] = {"method": method, "num_speculative_tokens": k}
        if method == "draft_model":
            spec["model"] = "llama-3.1-8b"
        return json.dumps(spec)

    def engine(self) -> dict[str, Any]:
        """The engine as ``vllm_scheduler.py`` takes it."""
        return {"block_size": BLOCK_SIZE, "max_num_batched_tokens": self.max_num_batched_tokens,
                "max_num_seqs": self.max_num_seqs, "max_model_len": self.max_model_len,
                "long_prefill_token_threshold": self.long_prefill_token_threshold,
                "enable_chunked_prefill": self.enable_chunked_prefill,
                "scheduling_policy": self.scheduling_policy,
                "enable_prefix_caching": self.enable_prefix_caching,
                "num_gpu_blocks": self.num_gpu_blocks,
                # windowed groups are sized for the batches in flight: one unless the case
                # says (the harness settles each step before scheduling the next)
                **({"kv_groups": list(self.kv_groups), "sliding_window": self.window,
                    "attention_chunk_size": self.window, "async_scheduling": False}
                   if self.kv_groups else {}), **self.extra}

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, "engine": self.engine(),
                "speculative": list(self.speculative) if self.speculative else None,
                "accepted": self.accepted(), "requests": [
            {"id": rid, "prompt_len": p, "max_tokens": o,
             "priority": self.priorities[i] if self.priorities else 0,
             "prefix": self.prefixes[i] if self.prefixes else None,
             "arrive": self.arrivals[i] if self.arrivals else 0}
            for i, (rid, p, o) in enumerate(self.requests)]}


def random_case(seed: int) -> ReleaseCase:
    """A random engine and workload: budgets, thresholds (adaptive or not), max-num-seqs, KV
    from tight (preemptions) to ample, chunked prefill on or off, fcfs or priority, prefix
    caching on or off with shared openings, requests arriving mid-run."""
    rng = random.Random(seed)
    chunked = rng.random() < 0.7
    budget = rng.choice([32, 48, 64, 96, 128, 256])
    max_len = 1024 if chunked else budget
    n = rng.randint(3, 9)
    requests = []
    for i in range(n):
        out = rng.randint(1, 24)
        prompt = rng.randint(1, (max_len if chunked else budget) - out)
        prompt = min(prompt, 400)
        requests.append((f"r{i}", prompt, out))
    longest = max(-(-(p + o) // BLOCK_SIZE) for _, p, o in requests)
    blocks = 1 + longest + rng.choice([0, 1, 3, 8, 64])
    caching = rng.random() < 0.5
    prefixes = tuple((f"p{rng.randint(0, 1)}", 48) if caching and p > 48 and rng.random() < 0.7
                     else None for _, p, _ in requests)
    priority = rng.random() < 0.3
    threshold = rng.choice([0, 0, 8, 16, 24, 40]) if budget >= 48 else rng.choice([0, 8])
    extra: dict[str, Any] = {}
    if threshold and rng.random() < 0.3:
        extra["long_prefill_token_threshold_adaptive"] = True
    return ReleaseCase(
        f"random{seed}", tuple(requests), max_num_batched_tokens=budget,
        max_num_seqs=rng.randint(1, 6), max_model_len=max_len,
        long_prefill_token_threshold=min(threshold, max_len),
        enable_chunked_prefill=chunked,
        scheduling_policy="priority" if priority else "fcfs",
        enable_prefix_caching=caching, num_gpu_blocks=blocks,
        priorities=tuple(rng.randint(0, 3) for _ in requests) if priority else (),
        prefixes=prefixes if caching else (),
        arrivals=tuple(sorted(rng.choice([0, 0, 2, 5, 9, 15]) for _ in requests)),
        extra=extra)


#: Long prompts beside decodes, with more arriving: the cadence holds chunks and admissions.
_CADENCE_REQUESTS = (("a", 40, 30), ("b", 30, 30), ("c", 300, 5), ("d", 200, 8),
                     ("e", 60, 12), ("f", 90, 6))
_CADENCE_ARRIVALS = (0, 0, 3, 6, 10, 11)
#: A warm opening, then cold and warm requests queued behind a full KV cache.
_CACHE_REQUESTS = (("w0", 120, 40), ("c1", 150, 4), ("c2", 150, 4), ("w1", 120, 4),
                   ("c3", 150, 4), ("w2", 120, 4), ("w3", 120, 4))
_CACHE_PREFIXES = (("warm", 96), None, None, ("warm", 96), None, ("warm", 96), ("warm", 96))
_CACHE_ARRIVALS = (0, 4, 4, 4, 4, 4, 4)

#: Two requests decoding when a long prompt arrives into a nearly full KV cache.
_GATE_REQUESTS = (("a", 60, 40), ("b", 50, 40), ("long", 300, 4), ("c", 40, 10))
_GATE_ARRIVALS = (0, 0, 2, 3)

#: Speculative decoding: prompts cut into chunks beside decodes verifying drafts, with more
#: requests arriving mid-run.
_SPEC_REQUESTS = (("a", 40, 30), ("b", 150, 20), ("c", 90, 25), ("d", 200, 12),
                  ("e", 30, 18))
_SPEC_ARRIVALS = (0, 0, 3, 6, 10)

NAMED: tuple[ReleaseCase, ...] = (
    # 0.33: --prefill-schedule-interval without DP (0.31/0.32: a no-op there)
    ReleaseCase("prefill_schedule_interval_4", _CADENCE_REQUESTS, max_num_batched_tokens=64,
                arrivals=_CADENCE_ARRIVALS, extra={"prefill_schedule_interval": 4}),
    ReleaseCase("prefill_schedule_interval_1", _CADENCE_REQUESTS, max_num_batched_tokens=64,
                arrivals=_CADENCE_ARRIVALS),
    # 0.33: the lowest-priority request preempts itself; the ones after it still run
    ReleaseCase("priority_self_preemption", (("lo", 119, 15), ("hi", 86, 30), ("mid", 67, 36)),
                max_num_batched_tokens=64, scheduling_policy="priority", num_gpu_blocks=15,
                priorities=(5, 0, 1), arrivals=(0, 2, 2)),
    # 0.34: the threshold needs chunked prefill
    ReleaseCase("threshold_without_chunking",
                (("a", 100, 10), ("b", 90, 10), ("c", 120, 10)), max_num_batched_tokens=256,
                max_model_len=256, long_prefill_token_threshold=32,
                enable_chunked_prefill=False, arrivals=(0, 0, 3)),
    # every release: the adaptive threshold floors it at budget / requests in the system
    ReleaseCase("adaptive_threshold", (("a", 300, 5), ("b", 200, 5), ("c", 20, 30)),
                max_num_batched_tokens=128, long_prefill_token_threshold=16,
                extra={"long_prefill_token_threshold_adaptive": True}),
    # 0.34: cache-aware admission, against the same case without it
    ReleaseCase("cache_aware_admission", _CACHE_REQUESTS, max_num_batched_tokens=128,
                max_num_seqs=2, enable_prefix_caching=True, num_gpu_blocks=30,
                prefixes=_CACHE_PREFIXES, arrivals=_CACHE_ARRIVALS,
                extra={"cache_aware_admission_window": 4,
                       "cache_aware_admission_threshold": 0.3}),
    ReleaseCase("cache_aware_admission_off", _CACHE_REQUESTS, max_num_batched_tokens=128,
                max_num_seqs=2, enable_prefix_caching=True, num_gpu_blocks=30,
                prefixes=_CACHE_PREFIXES, arrivals=_CACHE_ARRIVALS),
    # 0.19: a long prompt waits until its whole sequence fits (before: its first chunk's
    # blocks admit it, and its later chunks preempt the requests decoding beside it)
    ReleaseCase("full_sequence_admission", _GATE_REQUESTS, max_num_batched_tokens=64,
                num_gpu_blocks=26, arrivals=_GATE_ARRIVALS),
    # 0.19+ with the gate off: admission on the first chunk again, as 0.18
    ReleaseCase("full_sequence_admission_off", _GATE_REQUESTS, max_num_batched_tokens=64,
                num_gpu_blocks=26, arrivals=_GATE_ARRIVALS,
                extra={"scheduler_reserve_full_isl": False}),
    # 0.31: a lone request is not held to the threshold (before: it is)
    ReleaseCase("lone_request_threshold", (("a", 200, 4), ("b", 40, 4)),
                max_num_batched_tokens=128, long_prefill_token_threshold=32,
                arrivals=(0, 9)),
    # every release: speculative decoding, ngram (no draft slots, no lookahead) and a draft
    # model (a draft slot per request in the budget, K KV slots ahead), budgets that cut the
    # prompts, and a KV cache tight enough to preempt
    ReleaseCase("spec_ngram_k3", _SPEC_REQUESTS, max_num_batched_tokens=64,
                arrivals=_SPEC_ARRIVALS, speculative=("ngram", 3)),
    ReleaseCase("spec_draft_k2", _SPEC_REQUESTS, max_num_batched_tokens=48,
                long_prefill_token_threshold=24, arrivals=_SPEC_ARRIVALS,
                speculative=("draft_model", 2)),
    ReleaseCase("spec_draft_k4_tight_kv", _SPEC_REQUESTS, max_num_batched_tokens=96,
                num_gpu_blocks=22, arrivals=_SPEC_ARRIVALS, speculative=("draft_model", 4)),
    # 0.23: a new request is admitted with its lookahead slots (before: without, and the
    # running request it crowds is preempted for them a step later)
    ReleaseCase("admission_lookahead", (("a", 40, 30), ("b", 48, 6)),
                max_num_batched_tokens=64, num_gpu_blocks=8, arrivals=(0, 2),
                speculative=("draft_model", 4)),
    ReleaseCase("spec_ngram_k2_tight_kv", _SPEC_REQUESTS, max_num_batched_tokens=64,
                max_num_seqs=4, num_gpu_blocks=20, arrivals=_SPEC_ARRIVALS,
                speculative=("ngram", 2)),
)

#: Windowed groups beside a full one in one pool (vLLM's hybrid KV cache manager): short
#: requests, so that a windowed group holds about as many blocks as the full one, in a pool
#: the requests outgrow (preemptions), some arriving mid-run.
_HYBRID_REQUESTS = (("a", 150, 40), ("b", 90, 60), ("c", 200, 30), ("d", 60, 80),
                    ("e", 120, 20), ("f", 40, 90), ("g", 170, 25), ("h", 80, 50))
_HYBRID_ARRIVALS = (0, 0, 0, 2, 4, 6, 9, 12)
#: One opening shared by most requests (prefix caching on).
_HYBRID_PREFIXES = (("sys", 48), ("sys", 48), None, ("sys", 48), ("sys", 48), None,
                    ("sys", 48), ("sys", 48))

HYBRID: tuple[ReleaseCase, ...] = (
    # gpt-oss's layout: one sliding-window group beside one full group; the window passes
    # within a request, its blocks return to the pool as it goes
    ReleaseCase("hybrid_sliding", _HYBRID_REQUESTS, max_num_batched_tokens=64,
                num_gpu_blocks=40, arrivals=_HYBRID_ARRIVALS, kv_groups=("sliding", "full"),
                window=32),
    # Gemma-4's: five sliding-window groups to a full one; requests shorter than the window
    # hold five times the full group's blocks (the whole-sequence gate counts them)
    ReleaseCase("hybrid_gemma_like", _HYBRID_REQUESTS, max_num_batched_tokens=64,
                max_num_seqs=6, num_gpu_blocks=110, arrivals=_HYBRID_ARRIVALS,
                kv_groups=("sliding",) * 5 + ("full",), window=128),
    # with async scheduling (0.26+: a windowed group is sized for two batches in flight)
    ReleaseCase("hybrid_sliding_async", _HYBRID_REQUESTS, max_num_batched_tokens=64,
                num_gpu_blocks=40, arrivals=_HYBRID_ARRIVALS, kv_groups=("sliding", "full"),
                window=32, extra={"async_scheduling": True}),
    # Llama-4's: three chunked-local groups to a full one
    ReleaseCase("hybrid_chunked", _HYBRID_REQUESTS, max_num_batched_tokens=48,
                num_gpu_blocks=60, arrivals=_HYBRID_ARRIVALS,
                kv_groups=("chunked",) * 3 + ("full",), window=64),
    # the prefix cache over the groups: an opening found by later requests, preempted
    # requests finding their own blocks again
    ReleaseCase("hybrid_sliding_prefix_cache", _HYBRID_REQUESTS, max_num_batched_tokens=64,
                num_gpu_blocks=40, arrivals=_HYBRID_ARRIVALS, enable_prefix_caching=True,
                prefixes=_HYBRID_PREFIXES, kv_groups=("sliding", "full"), window=32),
    # 0.19-0.34 with the whole-sequence gate off (0.19's gate on is refused by name)
    ReleaseCase("hybrid_gemma_like_gate_off", _HYBRID_REQUESTS, max_num_batched_tokens=64,
                max_num_seqs=6, num_gpu_blocks=110, arrivals=_HYBRID_ARRIVALS,
                kv_groups=("sliding",) * 5 + ("full",), window=128,
                extra={"scheduler_reserve_full_isl": False}),
)

#: The random cases each release runs (seeded: the same every run).
RANDOM: tuple[ReleaseCase, ...] = tuple(random_case(seed) for seed in range(8))

CASES: tuple[ReleaseCase, ...] = NAMED + HYBRID + RANDOM


def sim_trace(case: ReleaseCase, version: Version | None,
              model_config: str | Path | None = None) -> BatchTrace:
    """The simulator's trace of ``case`` with the scheduler of vLLM ``version`` (None: the
    default) on the model of ``model_config`` (a config.json; None: any, the KV-cache size
    being the case's)."""
    from chunktune.core.engine_args import EngineArgs, resolve
    from chunktune.core.gpus import resolve_gpu
    from chunktune.core.models import from_hf_config, resolve_model
    from chunktune.sim.engine.memory import kv_cache_layout
    from chunktune.sim.engine.step_trace import run_batch

    fields = case.engine()  # vLLM's names, which EngineArgs shares
    fields["num_gpu_blocks_override"] = fields.pop("num_gpu_blocks")
    for key in ("kv_groups", "sliding_window", "attention_chunk_size"):
        fields.pop(key, None)
    if case.kv_groups:
        assert model_config is not None, "a case with KV-cache groups needs the tiny model"
        model = from_hf_config(case.hf_config(json.loads(Path(model_config).read_text())),
                               name=case.name)
    else:
        model = resolve_model("llama-3.1-8b") if model_config is None \
            else resolve_model(config_path=model_config)
    fields.setdefault("async_scheduling", False)  # as the harness steps: one at a time
    cfg = resolve(EngineArgs(enforce_eager=True, speculative_config=case.speculative_config(),
                             **fields), model, resolve_gpu("h100-sxm"), version=version)
    if case.kv_groups:
        groups = kv_cache_layout(cfg).groups
        assert [g.kind.split("_")[0] for g in groups] == list(case.kv_groups), groups
    script = [list(case.accepted().get(rid, ())) for rid, _, _ in case.requests]

    def scripted(cfg: ResolvedConfig, blocks: int) -> Scheduler:
        return _Scripted(cfg, blocks, script)

    return run_batch(cfg, case.num_gpu_blocks, list(case.requests), priorities=case.priorities,
                     prefixes=case.prefixes, arrivals=case.arrivals, scheduler=scripted)


class _Scripted(Scheduler):
    """The simulator's scheduler with each verification's accepted drafts taken, in order,
    from the case's script (``ReleaseCase.accepted``; indexed by the request's ``rid``, its
    place in the case) instead of the expected number at the request's acceptance rate."""

    def __init__(self, cfg: ResolvedConfig, blocks: int, script: list[list[int]]) -> None:
        super().__init__(cfg, blocks)
        self.script = script

    def accept(self, req: Request, drafts: int) -> int:
        return min(self.script[req.rid].pop(0), drafts)
