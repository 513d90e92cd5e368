"""The conformance cases: engine configurations and request batches run through real vLLM 0.32
(``vllm_steps.py``) and through the simulator's scheduler (``chunktune.sim.engine.step_trace``).

Every engine gets the same KV block count on both sides (``num_gpu_blocks_override``), the
CPU backend's block size (128), prefix caching off unless it is the case's subject, and
token-id prompts of exact lengths with ``min_tokens = max_tokens`` and ``ignore_eos`` (a
request may open with a shared opening: ``prefixes``). Every request of a case is waiting
before the first step (the in-process engine takes them all before ``step()`` is called), so the
schedules cannot differ by arrival timing; there is no timing-dependent case here, and none of
the bounds below is needed.

Used by ``tests/conformance/test_steps.py`` and ``bench/real_vs_sim.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chunktune.core import vllm_release
from chunktune.sim.engine.step_trace import BatchTrace

#: vLLM's CPU backend's default KV block size.
CPU_BLOCK_SIZE = 128
#: KV cache bytes given to vLLM (the block count itself is forced by the override).
KV_CACHE_BYTES = 64 * 2**20


@dataclass(frozen=True)
class Case:
    name: str
    #: (request id, prompt tokens, output tokens)
    requests: tuple[tuple[str, int, int], ...]
    #: each request's priority (``--scheduling-policy priority``); empty: all 0
    priorities: tuple[int, ...] = ()
    #: each request's opening (key, tokens) or None; empty: none
    prefixes: tuple[tuple[str, int] | None, ...] = ()


@dataclass(frozen=True)
class EngineCase:
    name: str
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    num_gpu_blocks: int
    long_prefill_token_threshold: int = 0
    enable_chunked_prefill: bool = True
    scheduling_policy: str = "fcfs"
    enable_prefix_caching: bool = False
    cases: tuple[Case, ...] = field(default_factory=tuple)

    def vllm_engine_args(self) -> dict[str, Any]:
        """Keyword arguments for ``vllm.EngineArgs`` (the harness adds the model, dummy
        weights, eager mode, iteration logging and prefix caching off)."""
        return {
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_num_seqs": self.max_num_seqs,
            "max_model_len": self.max_model_len,
            "long_prefill_token_threshold": self.long_prefill_token_threshold,
            "enable_chunked_prefill": self.enable_chunked_prefill,
            "num_gpu_blocks_override": self.num_gpu_blocks,
            "kv_cache_memory_bytes": KV_CACHE_BYTES,
            "block_size": CPU_BLOCK_SIZE,
            "scheduling_policy": self.scheduling_policy,
            "enable_prefix_caching": self.enable_prefix_caching,
        }

    def flags(self) -> list[str]:
        """The same configuration as ``vllm serve`` flags."""
        out = ["--max-num-batched-tokens", str(self.max_num_batched_tokens),
               "--max-num-seqs", str(self.max_num_seqs),
               "--max-model-len", str(self.max_model_len),
               "--long-prefill-token-threshold", str(self.long_prefill_token_threshold),
               "--num-gpu-blocks-override", str(self.num_gpu_blocks),
               "--block-size", str(CPU_BLOCK_SIZE)]
        if not self.enable_chunked_prefill:
            out.append("--no-enable-chunked-prefill")
        if self.scheduling_policy != "fcfs":
            out += ["--scheduling-policy", self.scheduling_policy]
        out.append("--enable-prefix-caching" if self.enable_prefix_caching
                   else "--no-enable-prefix-caching")
        return out


ENGINES: tuple[EngineCase, ...] = (
    EngineCase(
        "threshold", max_num_batched_tokens=64, long_prefill_token_threshold=32,
        max_num_seqs=4, max_model_len=2048, num_gpu_blocks=256,
        cases=(
            # vLLM 0.32 does not apply the threshold to a lone request: 15 x 64 + 40.
            Case("lone_long_prompt", (("lone", 1000, 4),)),
            # The reference run: the threshold shares the budget while the short prompts
            # prefill and decode, then the long prompt runs alone at the full budget.
            Case("long_prompt_beside_decodes",
                 (("long", 1000, 8), ("mid", 100, 8), ("short", 50, 8), ("tiny", 20, 8))),
        )),
    EngineCase(
        "budget_below_threshold", max_num_batched_tokens=16, long_prefill_token_threshold=32,
        max_num_seqs=4, max_model_len=2048, num_gpu_blocks=256,
        cases=(Case("budget_caps_chunks", (("a", 300, 6), ("b", 40, 6), ("c", 10, 6))),)),
    EngineCase(
        "max_num_seqs_binding", max_num_batched_tokens=256, max_num_seqs=2,
        max_model_len=2048, num_gpu_blocks=256,
        cases=(Case("two_running_at_most",
                    tuple((f"r{i}", 30 + 10 * i, 5 + i) for i in range(6))),)),
    EngineCase(
        "kv_exhaustion", max_num_batched_tokens=512, max_num_seqs=8, max_model_len=512,
        num_gpu_blocks=5,  # 4 usable blocks of 128 tokens beside vLLM's null block
        cases=(Case("preemption_by_recompute",
                    tuple((f"p{i}", 100, 250) for i in range(4))),)),
    EngineCase(
        "chunked_prefill_off", max_num_batched_tokens=512, max_num_seqs=4,
        max_model_len=512, num_gpu_blocks=256, enable_chunked_prefill=False,
        cases=(Case("whole_prompts_only",
                    (("a", 300, 4), ("b", 200, 4), ("c", 100, 4), ("d", 400, 4))),)),
    EngineCase(
        "priority_policy", max_num_batched_tokens=512, max_num_seqs=2, max_model_len=512,
        num_gpu_blocks=5, scheduling_policy="priority",
        cases=(
            # Added lowest priority first: WAITING serves them by (priority, arrival).
            Case("waiting_by_priority",
                 (("c0", 60, 6), ("c1", 60, 6), ("a0", 60, 6), ("b0", 60, 6)),
                 priorities=(2, 2, 0, 1)),
            # Two running (admitted by priority), growing past the four blocks: the victim is
            # the running request with the largest (priority, arrival), and it goes back to
            # WAITING in its (priority, arrival) place, ahead of the lower-priority one.
            Case("preemption_by_priority",
                 (("hi", 250, 24), ("lo", 250, 24), ("mid", 250, 24)),
                 priorities=(0, 5, 1)),
        )),
    EngineCase(
        "prefix_cache", max_num_batched_tokens=256, max_num_seqs=4, max_model_len=2048,
        num_gpu_blocks=64, enable_prefix_caching=True,
        cases=(
            # Three prompts open with one 512-token opening (four blocks): the first prefills
            # it in chunks, caching each block as it is allocated; the others, admitted once
            # it is cached, prefill only their own 88 tokens. The fourth shares nothing.
            Case("shared_opening",
                 (("a", 600, 4), ("b", 600, 4), ("c", 600, 4), ("d", 300, 4)),
                 prefixes=(("doc", 512), ("doc", 512), ("doc", 512), None)),
        )),
    EngineCase(
        "prefix_cache_preemption", max_num_batched_tokens=512, max_num_seqs=8,
        max_model_len=640, num_gpu_blocks=6, enable_prefix_caching=True,
        cases=(
            # Five usable blocks: c is preempted when a and b grow; admitted again after a
            # ends, it finds its first block still cached in the free queue and recomputes
            # 97 tokens instead of 225.
            Case("preempted_finds_its_blocks",
                 (("a", 260, 40), ("b", 260, 150), ("c", 100, 300))),
        )),
)


def vllm_spec(model_dir: str | Path, engines: tuple[EngineCase, ...] = ENGINES) -> dict[str, Any]:
    """The JSON spec ``vllm_steps.py`` reads."""
    return {
        "model": str(model_dir),
        "engines": [
            {"name": e.name, "engine": e.vllm_engine_args(),
             "cases": [{"name": c.name,
                        "requests": [{"id": rid, "prompt_len": p, "max_tokens": o,
                                      "priority": c.priorities[i] if c.priorities else 0,
                                      "prefix": c.prefixes[i] if c.prefixes else None}
                                     for i, (rid, p, o) in enumerate(c.requests)]}
                       for c in e.cases]}
            for e in engines
        ],
    }


def sim_trace(engine: EngineCase, case: Case, model_config: str | Path) -> BatchTrace:
    """The simulator's trace of ``case`` on ``engine``."""
    from chunktune.core.engine_args import EngineArgs, resolve
    from chunktune.core.gpus import resolve_gpu
    from chunktune.core.models import resolve_model
    from chunktune.sim.engine.step_trace import run_batch

    cfg = resolve(EngineArgs(
        max_num_batched_tokens=engine.max_num_batched_tokens,
        max_num_seqs=engine.max_num_seqs,
        max_model_len=engine.max_model_len,
        long_prefill_token_threshold=engine.long_prefill_token_threshold,
        enable_chunked_prefill=engine.enable_chunked_prefill,
        num_gpu_blocks_override=engine.num_gpu_blocks,
        block_size=CPU_BLOCK_SIZE,
        enforce_eager=True,
        scheduling_policy=engine.scheduling_policy,
        enable_prefix_caching=engine.enable_prefix_caching,
    ), resolve_model(config_path=model_config), resolve_gpu("h100-sxm"),
        version=vllm_release.CURRENT)  # the CPU build's scheduler
    return run_batch(cfg, engine.num_gpu_blocks, list(case.requests),
                     priorities=case.priorities, prefixes=case.prefixes)
