"""Attention data parallelism (``--data-parallel-size N``) of a mixture-of-experts model.

How vLLM runs it (0.17-0.19: ``vllm/v1/engine/core.py`` ``DPEngineCoreProc``,
``vllm/v1/engine/core_client.py`` ``DPLBAsyncMPClient``, ``vllm/v1/worker/dp_utils.py``):
N engine cores, each a copy of the model's attention (tensor-parallel within the rank), its
own scheduler and KV cache; the API server sends each request to the engine with the lowest
``4 x waiting + running``. The routed experts are split whole over all ``N x TP`` ranks
(``--enable-expert-parallel``), so every MoE layer needs every rank: the ranks step together,
a rank without requests running a dummy forward, and where every rank's batch runs as a CUDA
graph each rank's tokens are padded to the largest rank's graph size
(``_post_process_dp_padding``; :meth:`DataParallelEngine.step_time`).

The simulated step: every rank schedules its own requests; the step takes the slowest rank's
time, each rank's own forward (attention, dense parts, all-reduces, sampler) plus the routed
experts on the gathered tokens of all ranks with the dispatch and combine between them
(:meth:`chunktune.sim.cost.step_time.StepCostModel.dp_experts_time`).

Assumed: the router sees the engines' counts at once (vLLM's coordinator publishes them every
100 ms; the client counts its own choices between); a dummy forward is one token (or the
padded graph size) with no attention and no sampling.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Mapping

from chunktune.core.engine_args import EngineArgs, ResolvedConfig, resolve
from chunktune.core.errors import SpecError
from chunktune.core.gpus import GPU
from chunktune.core.models import ModelConfig
from chunktune.core.vllm_release import Version
from chunktune.core.workload import RequestSpec
from chunktune.sim.engine.memory import MemoryPlan, plan_memory
from chunktune.sim.engine.request import REJECTED, Request
from chunktune.sim.engine.scheduler import Scheduler, StepPlan
from chunktune.sim.engine.virtual import Engine, ReplayResult, StepColumns, next_event


class DataParallelEngine:
    """``data_parallel_size`` ranks of one configuration stepping together; each rank's
    memory plan holds its attention whole (at the rank's TP) and its share of the experts."""

    def __init__(self, cfg: ResolvedConfig, memory: MemoryPlan,
                 vllm_env: Mapping[str, str] | None = None) -> None:
        if cfg.speculative is not None:
            raise SpecError("speculative decoding with --data-parallel-size is not modelled",
                            field="--data-parallel-size")
        self.cfg = cfg
        self.memory = memory
        #: one rank's engine: its cost model (the routed experts priced on all ranks' tokens)
        self.rank = Engine(cfg, memory, vllm_env)
        self.cost = self.rank.cost
        self.size = cfg.data_parallel_size

    @staticmethod
    def route(scheds: list[Scheduler]) -> int:
        """The rank vLLM's load balancer sends a request to: the lowest
        ``4 x waiting + running``, the first such rank on a tie."""
        scores = [4 * len(s.waiting) + len(s.running) for s in scheds]
        return scores.index(min(scores))

    def step_time(self, plans: list[StepPlan | None]) -> float:
        """One lockstep step: the slowest rank, the routed experts on the gathered tokens.

        vLLM (0.15-0.19 ``dp_utils.coordinate_batch_across_dp``) all-reduces each rank's
        token count and CUDA-graph mode every step and takes the lowest mode: where every
        rank's batch fits a captured graph (at most the largest capture size), each rank
        runs the largest rank's graph size (``_post_process_dp_padding``: its dense layers on
        the padded rows, an idle rank's one-token dummy forward too) and the experts see
        ``DP x`` that many tokens; where one rank's batch exceeds the capture sizes (a long
        prefill chunk), no rank pads, the experts see the ranks' own tokens (an idle rank's
        one) and every rank runs without graphs, those whose own batch would have had one
        launching its kernels from the host (``StepCostModel.step_time(without_graphs=)``)."""
        sizes = self.cfg.cudagraph_capture_sizes
        tokens = [p.num_tokens if p is not None else 1 for p in plans]
        graphed = bool(sizes) and max(tokens) <= sizes[-1]
        if graphed:
            padded = sizes[bisect.bisect_left(sizes, max(tokens))]
            run = [padded] * len(tokens)
            gathered = padded * len(tokens)
        else:
            run = tokens
            gathered = sum(tokens)
        cost = self.cost
        worst = 0.0
        for p, n in zip(plans, run, strict=True):
            # a batch that would have had a graph but runs without one (a peer's is too big)
            forced = not graphed and bool(sizes) and n <= sizes[-1]
            if p is None:
                t = cost.step_time(n, 0, 0, [], 0, 0, gathered, without_graphs=forced)
            else:
                t = cost.step_time(n, len(p.scheduled), p.num_logits, p.prefill_chunks,
                                   p.num_decodes, p.decode_context_tokens, gathered,
                                   without_graphs=forced)
            worst = max(worst, t)
        return worst

    def replay(self, specs: list[RequestSpec], concurrency: int | None = None,
               time_limit: float | None = None, record_steps: bool = True,
               server_overhead_s: float = 0.0,
               server_per_token_s: float = 0.0) -> ReplayResult:
        """Run ``specs`` as :meth:`chunktune.sim.engine.virtual.Engine.replay` does (open loop
        at their arrivals, or closed loop with ``concurrency`` in flight), each request routed
        to a rank when it reaches the engines; the steps recorded are the lockstep steps (the
        counts summed over the ranks)."""
        cfg = self.cfg
        scheds = [Scheduler(cfg, self.memory.pool_blocks or self.memory.num_gpu_blocks)
                  for _ in range(self.size)]
        reqs: list[Request] = []
        rejected: list[tuple[Request, str]] = []
        steps = StepColumns()
        deferred: list[tuple[float, int, Request]] = []
        now = 0.0
        idx = 0
        closed = concurrency is not None
        in_flight = 0

        def admit(spec: RequestSpec, t: float) -> bool:
            r = Request(spec.rid, t, spec.prompt_tokens, spec.output_tokens, spec.cls,
                        spec.priority, spec.prefix_key, spec.prefix_tokens)
            reqs.append(r)
            err = self.rank.validate_request(spec.prompt_tokens, spec.output_tokens)
            if err:
                r.status = REJECTED
                r.finish_time = t
                rejected.append((r, err))
                return False
            heapq.heappush(deferred, (t + server_overhead_s
                                      + server_per_token_s * spec.prompt_tokens, spec.rid, r))
            return True

        if closed:
            while idx < len(specs) and in_flight < concurrency:  # type: ignore[operator]
                if admit(specs[idx], specs[idx].arrival or 0.0):
                    in_flight += 1
                idx += 1
        while True:
            if not closed:
                while idx < len(specs) and specs[idx].arrival <= now:  # type: ignore[operator]
                    admit(specs[idx], specs[idx].arrival)  # type: ignore[arg-type]
                    idx += 1
            while deferred and deferred[0][0] <= now:
                r = heapq.heappop(deferred)[2]
                scheds[self.route(scheds)].add_request(r)
            if not any(s.has_work for s in scheds):
                nxt = next_event(deferred, specs, idx, closed)
                if nxt == float("inf"):
                    break
                now = nxt
                continue
            if time_limit is not None and now >= time_limit:
                break
            plans: list[StepPlan | None] = [s.schedule(now) if s.has_work else None
                                            for s in scheds]
            plans = [p if p is not None and p.scheduled else None for p in plans]
            if all(p is None for p in plans):
                raise RuntimeError(f"no data-parallel rank made progress at t={now:.3f}s")
            dt = self.step_time(plans)
            end = now + dt
            finished = 0
            for s, p in zip(scheds, plans, strict=True):
                if p is not None:
                    finished += len(s.apply(p, end).finished)
            if record_steps:
                live = [p for p in plans if p is not None]
                steps.start.append(now)
                steps.duration.append(dt)
                steps.tokens.append(sum(p.num_tokens for p in live))
                steps.prefill_tokens.append(sum(p.num_prefill_tokens for p in live))
                steps.decodes.append(sum(p.num_decodes for p in live))
                steps.running.append(sum(len(s.running) for s in scheds))
                steps.waiting.append(sum(len(s.waiting) for s in scheds))
                steps.kv_used_blocks.append(sum(s.pool.total - s.pool.free for s in scheds))
                steps.preempted.append(sum(len(p.preempted) for p in live))
            now = end
            if closed:
                for _ in range(finished):
                    while idx < len(specs):
                        ok = admit(specs[idx], now)
                        idx += 1
                        if ok:
                            break
        return ReplayResult(reqs, steps, now, sum(s.num_preemptions for s in scheds),
                            max(s.pool.peak_used for s in scheds), rejected)


def build_data_parallel_engine(args: EngineArgs, model: ModelConfig, gpu: GPU,
                               version: Version | None = None,
                               vllm_env: Mapping[str, str] | None = None
                               ) -> DataParallelEngine:
    """Resolve, profile one rank's memory and start ``args.data_parallel_size`` ranks; raises
    EngineStartupError where a rank would not start and SpecError for what is not modelled
    (data parallelism of a dense model or without ``--enable-expert-parallel``)."""
    args.check_simulated()
    if args.data_parallel_size < 2:
        raise SpecError("the data-parallel engine needs --data-parallel-size 2 or more",
                        field="--data-parallel-size")
    if not (model.is_moe and args.enable_expert_parallel):
        raise SpecError("--data-parallel-size is modelled for a mixture-of-experts model with "
                        "--enable-expert-parallel only (dense ranks run apart: serve them as "
                        "replicas)", field="--data-parallel-size")
    cfg = resolve(args, model, gpu, version)
    return DataParallelEngine(cfg, plan_memory(cfg, vllm_env), vllm_env)
