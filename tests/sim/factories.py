"""Factories for scheduler tests, in the manner of vLLM's tests/v1/core/utils.py."""

from __future__ import annotations

from chunktune.core.engine_args import EngineArgs, ResolvedConfig, resolve
from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.sim.engine.request import Request
from chunktune.sim.engine.scheduler import Scheduler


def create_config(max_num_batched_tokens: int = 2048, max_num_seqs: int = 64,
                  long_prefill_token_threshold: int = 0, block_size: int = 16,
                  max_model_len: int = 8192, enable_chunked_prefill: bool = True,
                  model: str = "llama-3.1-8b", gpu: str = "h100-sxm",
                  scheduling_policy: str = "fcfs",
                  enable_prefix_caching: bool = False,
                  speculative_config: str | None = None) -> ResolvedConfig:
    return resolve(
        EngineArgs(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                   long_prefill_token_threshold=long_prefill_token_threshold,
                   block_size=block_size, max_model_len=max_model_len,
                   enable_chunked_prefill=enable_chunked_prefill,
                   scheduling_policy=scheduling_policy,
                   enable_prefix_caching=enable_prefix_caching,
                   speculative_config=speculative_config),
        resolve_model(model), resolve_gpu(gpu))


def create_scheduler(num_blocks: int = 10_000, **kw: object) -> Scheduler:
    return Scheduler(create_config(**kw), num_blocks)  # type: ignore[arg-type]


def create_requests(num_requests: int, prompt_len: int = 100, max_tokens: int = 16,
                    start: float = 0.0) -> list[Request]:
    return [Request(i, start, prompt_len, max_tokens) for i in range(num_requests)]


def run_to_completion(sched: Scheduler, reqs: list[Request], step_s: float = 0.01,
                      max_steps: int = 100_000, check=None) -> int:
    """Add ``reqs`` and step until nothing is left; ``check(sched, plan)`` runs every step."""
    for r in reqs:
        sched.add_request(r)
    now = 0.0
    steps = 0
    while sched.has_work:
        plan = sched.schedule(now)
        if check is not None:
            check(sched, plan)
        now += step_s
        sched.apply(plan, now)
        steps += 1
        assert steps < max_steps, "scheduler did not finish"
    return steps
