"""The virtual-time engine: replay a workload through the scheduler and the step-time model.

``build_engine`` does what ``vllm serve`` does before it opens its port — resolve the arguments
with vLLM's defaults and checks, profile memory, size the KV cache — and raises
:class:`~chunktune.core.engine_args.EngineStartupError` where vLLM would exit.
``Engine.replay`` then runs the requests: arrivals join WAITING at their time (or, in
closed-loop mode, as soon as one finishes), each step is scheduled, timed and applied, and the
clock moves by the step's time. Deterministic: no randomness here; the workload's seed fixes
the requests.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from chunktune.core.engine_args import EngineArgs, ResolvedConfig, resolve
from chunktune.core.errors import SpecError
from chunktune.core.gpus import GPU
from chunktune.core.models import ModelConfig
from chunktune.core.steps import StepRecord
from chunktune.core.vllm_release import Version
from chunktune.core.workload import Profile, RequestSpec
from chunktune.sim.cost.draft import DraftCost
from chunktune.sim.cost.step_time import StepCostModel
from chunktune.sim.engine.memory import MemoryPlan, drafter, plan_memory
from chunktune.sim.engine.request import REJECTED, Request
from chunktune.sim.engine.scheduler import Scheduler, StepPlan
from chunktune.sim.engine.step_trace import StepCounts, iteration_counts

#: vLLM's HTTP 503 message for a request beyond ``--max-num-queued-reqs``
#: (``QueueOverflowError``, ``vllm/exceptions.py``, 0.32).
QUEUE_FULL_MESSAGE = ("The engine is currently busy and cannot accept new requests. "
                      "Please try again later or on a different instance.")


@dataclass(frozen=True)
class ServerCost:
    """The time a served vLLM spends on a request outside the engine's steps before its first
    token, which an offline engine does not: a fixed part (HTTP parsing, the hand-off to the
    engine core, the first chunk detokenized and streamed back) and a part per prompt token
    (chat template and tokenization in the API process). Waiting for the step in flight and
    being scheduled are the engine's own (simulated). Applied by ``chunktune sim run`` and
    the simulated backend; ``chunktune sim serve`` pays the real HTTP cost instead."""

    fixed_s: float = 0.0
    per_prompt_token_s: float = 0.0

    def before_first_token(self, prompt_tokens: int) -> float:
        return self.fixed_s + self.per_prompt_token_s * prompt_tokens


#: A served vLLM's cost before the first token (docs/simulator.md, "Before the first token"):
#: the fixed part fitted on AIConfigurator's light-load vLLM runs
#: (:func:`chunktune.sim.calibration.e2e.first_token_residuals`), tokenization at an assumed
#: 2 us per prompt token (the end-to-end runs cannot separate it from the prefill).
API_SERVER = ServerCost(fixed_s=0.0208, per_prompt_token_s=2e-6)


def server_cost(profile_overhead_s: float | None) -> ServerCost:
    """The cost before the first token a replay adds: a calibration profile's fitted figure
    (``server_overhead_s``, the engine's own, measured) where it has one, else
    :data:`API_SERVER`."""
    return API_SERVER if profile_overhead_s is None else ServerCost(profile_overhead_s)


@dataclass
class StepColumns:
    """Per-step trace columns (parallel lists, cheap to append); one logged step, as vLLM logs
    it, is :class:`chunktune.core.steps.StepRecord`."""

    start: list[float] = field(default_factory=list)
    duration: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    prefill_tokens: list[int] = field(default_factory=list)
    decodes: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    kv_used_blocks: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    iterations: list[StepCounts] = field(default_factory=list)
    """vLLM's iteration-log counts per step (``replay(log_iterations=True)`` only)."""
    iteration_kv: list[int] = field(default_factory=list)
    """KV tokens in use after each step was scheduled (``log_iterations`` only)."""

    def __len__(self) -> int:
        return len(self.start)


@dataclass
class ReplayResult:
    requests: list[Request]
    steps: StepColumns
    end_time: float
    num_preemptions: int
    peak_kv_blocks: int
    rejected: list[tuple[Request, str]]


def next_event(deferred: list[tuple[float, int, Request]], specs: list[RequestSpec],
               idx: int, closed: bool) -> float:
    """When an engine with nothing to schedule next has work: the first request handed to
    the scheduler after the server's cost (``deferred``, a heap) or, open loop, the next
    arrival (``specs[idx]``); infinity when neither is left."""
    nxt = deferred[0][0] if deferred else float("inf")
    arrival = specs[idx].arrival if not closed and idx < len(specs) else None
    return nxt if arrival is None else min(nxt, arrival)


def engine_cost(cfg: ResolvedConfig, max_tokens: int | None = None,
                vllm_env: Mapping[str, str] | None = None,
                fused_allreduce_tokens: int = 0) -> StepCostModel:
    """The step-time model of an engine started with ``cfg`` (its model, GPU, tensor and
    expert parallelism, KV cache dtype, graphs or not, scheduling, data parallelism and
    release), tabulated up to ``max_tokens`` a step (None: the engine's budget): what
    :class:`Engine` prices its steps with, and what a step-log calibration of that engine
    fits its scales on (``tuning.strategies.twin_fit``)."""
    return StepCostModel(cfg.model, cfg.gpu, cfg.tensor_parallel_size,
                         max_tokens=max_tokens or cfg.max_num_batched_tokens,
                         enforce_eager=cfg.enforce_eager,
                         kv_dtype_bytes=cfg.kv_cache_dtype_bytes,
                         async_scheduling=cfg.async_scheduling,
                         expert_parallel=cfg.enable_expert_parallel,
                         vllm_env=vllm_env,
                         data_parallel_size=cfg.data_parallel_size,
                         fused_allreduce_tokens=fused_allreduce_tokens,
                         vllm_version=cfg.vllm_version)


class Engine:
    """A started engine: its resolved configuration, memory plan, scheduler and cost model."""

    def __init__(self, cfg: ResolvedConfig, memory: MemoryPlan,
                 vllm_env: Mapping[str, str] | None = None,
                 fused_allreduce_tokens: int = 0) -> None:
        """``vllm_env``: the vLLM environment variables the server runs with, where they
        choose a kernel the step time prices (:class:`StepCostModel`);
        ``fused_allreduce_tokens``: the largest step whose all-reduces run fused with the
        RMSNorm after them, where the server's compilation config enables it
        (:func:`chunktune.sim.cost.collectives.fi_allreduce_fusion_tokens`; 0: none)."""
        self.cfg = cfg
        self.memory = memory
        self.cost = engine_cost(cfg, vllm_env=vllm_env,
                                fused_allreduce_tokens=fused_allreduce_tokens)
        self.scheduler = Scheduler(cfg, memory.pool_blocks or memory.num_gpu_blocks)
        #: the drafter's time per step, with speculative decoding
        self.draft = DraftCost.build(cfg.speculative, self.cost, drafter(cfg)) \
            if cfg.speculative is not None else None
        #: each traffic class's draft acceptance (:meth:`use_acceptance`)
        self.acceptance: tuple[float, ...] = ()
        #: requests answered 503 by ``--max-num-queued-reqs``
        self.num_queue_rejections = 0

    def use_acceptance(self, profile: Profile) -> None:
        """Take each traffic class's ``spec_acceptance`` for speculative decoding; raises
        :class:`SpecError` naming the classes without one (the simulator does not guess how
        well drafts match a traffic)."""
        if self.cfg.speculative is None:
            return
        missing = [c.name for c in profile.classes if c.spec_acceptance is None]
        if missing:
            raise SpecError(
                f"--speculative-config needs each traffic class's draft acceptance: give "
                f"spec_acceptance (0 to 1) to class{'es' if len(missing) > 1 else ''} "
                f"{', '.join(missing)} (chunktune workload from-prometheus derives it from "
                f"vLLM's spec_decode counters)", field="classes")
        self.acceptance = tuple(float(c.spec_acceptance or 0.0) for c in profile.classes)

    def queue_full(self, in_system: int) -> str | None:
        """vLLM's answer when ``--max-num-queued-reqs`` is reached: a request is refused with
        HTTP 503 when the requests already in the system (waiting and running, counted by the
        API server) plus itself exceed N (``AsyncLLM.check_admission``, vLLM 0.32-0.34)."""
        limit = self.cfg.max_num_queued_reqs
        if limit is None or in_system + 1 <= limit:
            return None
        self.num_queue_rejections += 1
        return QUEUE_FULL_MESSAGE

    def kv_tokens_in_use(self) -> int:
        """KV-cache tokens allocated now (after a step is scheduled: what vLLM's iteration log
        reports as KV cache usage)."""
        pool = self.scheduler.pool
        return (pool.total - pool.free) * pool.block_size

    def validate_request(self, prompt_len: int, max_tokens: int) -> str | None:
        """vLLM's 400 message for a request that cannot fit ``max_model_len``, else None (the
        same wording ``chunktune sim serve`` answers with)."""
        limit = self.cfg.max_model_len
        if prompt_len >= limit:
            return (f"This model's maximum context length is {limit} tokens. However, your "
                    f"request has {prompt_len} input tokens. Please reduce the length of the "
                    "input messages.")
        if prompt_len + max_tokens > limit:
            return (f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This "
                    f"model's maximum context length is {limit} tokens and your request has "
                    f"{prompt_len} input tokens ({max_tokens} > {limit} - {prompt_len}).")
        return None

    def step_time(self, plan: StepPlan) -> float:
        draft = 0.0 if self.draft is None else self.draft.time(
            plan.num_tokens, plan.num_sampling, plan.prefill_chunks, plan.num_decodes,
            plan.decode_context_tokens)
        if self.cost.calibration is not None:  # costed as the calibration log saw steps
            ctx_reqs, ctx_tokens, gen_reqs, gen_tokens = iteration_counts(plan)
            return draft + self.cost.calibrated_step_time(
                ctx_reqs, ctx_tokens, gen_reqs, gen_tokens, self.kv_tokens_in_use())
        return draft + self.cost.step_time(
            plan.num_tokens, len(plan.scheduled), plan.num_logits, plan.prefill_chunks,
            plan.num_decodes, plan.decode_context_tokens,
        )

    def replay_profile(self, specs: list[RequestSpec], profile: Profile, drain_timeout: float,
                       **kw: Any) -> ReplayResult:
        """Replay a profile's requests as every path runs a workload: arrivals (open loop) or
        new requests (closed loop) until ``profile.duration``, then the requests in flight
        drain for up to ``drain_timeout`` seconds, as the load driver lets them; those still
        running then are the summary's ``timeout`` failures (:mod:`chunktune.sim.report`).
        ``kw`` goes to :meth:`replay`."""
        self.use_acceptance(profile)
        return self.replay(specs, concurrency=profile.arrival.concurrency,
                           time_limit=profile.duration + drain_timeout,
                           stop_arrivals=profile.duration, **kw)

    def replay(self, specs: list[RequestSpec], concurrency: int | None = None,
               time_limit: float | None = None, record_steps: bool = True,
               tick: float | None = None,
               on_tick: Callable[[float, list[Request]], bool] | None = None,
               stop_arrivals: float | None = None,
               server_overhead_s: float = 0.0,
               log_iterations: bool = False,
               server_per_token_s: float = 0.0) -> ReplayResult:
        """Run ``specs`` to completion (or until ``time_limit`` of virtual time).

        Open loop: each spec arrives at its ``arrival``. Closed loop (``concurrency``): the
        first N start at their ``arrival`` (0 when None: all at once) and each finish lets the
        next one in at that instant, until ``stop_arrivals``. ``on_tick(now, requests)`` is
        called every ``tick`` seconds of virtual time; returning True stops the replay there
        (pruning).
        ``server_overhead_s`` (+ ``server_per_token_s`` x its prompt tokens): each request
        reaches the scheduler this long after it arrives (see :class:`ServerCost`); its
        latencies still count from its arrival.
        ``log_iterations``: also record each step's counts as vLLM's iteration log gives them
        (:func:`chunktune.sim.engine.step_trace.iteration_counts`; read before the step is
        applied).
        """
        sched = self.scheduler
        reqs: list[Request] = []
        rejected: list[tuple[Request, str]] = []
        steps = StepColumns()
        now = 0.0
        idx = 0
        n_specs = len(specs)
        in_flight = 0
        closed = concurrency is not None
        step_fn = self.step_time

        deferred: list[tuple[float, int, Request]] = []  # (reaches the scheduler, rid, req)
        delay = server_overhead_s
        per_token = server_per_token_s

        acceptance = self.acceptance
        queued = self.cfg.max_num_queued_reqs is not None

        def admit(spec: RequestSpec, t: float) -> bool:
            r = Request(spec.rid, t, spec.prompt_tokens, spec.output_tokens, spec.cls,
                        spec.priority, spec.prefix_key, spec.prefix_tokens)
            if acceptance:
                r.spec_acceptance = acceptance[spec.cls]
            reqs.append(r)
            err = self.validate_request(spec.prompt_tokens, spec.output_tokens)
            if err is None and queued:
                err = self.queue_full(len(sched.running) + len(sched.waiting) + len(deferred))
            if err:
                r.status = REJECTED
                r.finish_time = t
                rejected.append((r, err))
                return False
            if delay > 0 or per_token > 0 or t > now:
                heapq.heappush(deferred, (t + delay + per_token * spec.prompt_tokens,
                                          spec.rid, r))
            else:
                sched.add_request(r)
            return True

        if closed:
            while idx < n_specs and in_flight < concurrency:  # type: ignore[operator]
                if admit(specs[idx], specs[idx].arrival or 0.0):
                    in_flight += 1
                idx += 1

        rec = record_steps
        s_start, s_dur, s_tok, s_pre = steps.start, steps.duration, steps.tokens, \
            steps.prefill_tokens
        s_dec, s_run, s_wait, s_kv, s_pmt = steps.decodes, steps.running, steps.waiting, \
            steps.kv_used_blocks, steps.preempted
        pool = sched.pool
        next_tick = tick if (tick and on_tick) else float("inf")
        while True:
            if not closed:
                while idx < n_specs and specs[idx].arrival <= now:  # type: ignore[operator]
                    admit(specs[idx], specs[idx].arrival)  # type: ignore[arg-type]
                    idx += 1
            while deferred and deferred[0][0] <= now:
                sched.add_request(heapq.heappop(deferred)[2])
            if not sched.has_work:
                nxt = next_event(deferred, specs, idx, closed)
                if nxt == float("inf"):
                    break
                now = nxt
                continue
            if time_limit is not None and now >= time_limit:
                break
            plan = sched.schedule(now)
            if not plan.scheduled:
                # Nothing fits (cannot happen once max_model_len fits the cache); avoid a spin.
                raise RuntimeError(f"scheduler made no progress at t={now:.3f}s: "
                                   f"{len(sched.running)} running, {len(sched.waiting)} waiting")
            dt = step_fn(plan)
            end = now + dt
            if log_iterations:
                steps.iterations.append(iteration_counts(plan))
                steps.iteration_kv.append(self.kv_tokens_in_use())
            out = sched.apply(plan, end)
            if rec:
                s_start.append(now)
                s_dur.append(dt)
                s_tok.append(plan.num_tokens)
                s_pre.append(plan.num_prefill_tokens)
                s_dec.append(plan.num_decodes)
                s_run.append(len(sched.running))
                s_wait.append(len(sched.waiting))
                s_kv.append(pool.total - pool.free)
                s_pmt.append(len(plan.preempted))
            now = end
            if now >= next_tick:
                if on_tick(now, reqs):  # type: ignore[misc]
                    break
                while next_tick <= now:
                    next_tick += tick  # type: ignore[operator]
            if closed and out.finished and (stop_arrivals is None or now < stop_arrivals):
                for _ in out.finished:
                    while idx < n_specs:
                        ok = admit(specs[idx], now)
                        idx += 1
                        if ok:
                            break
        return ReplayResult(reqs, steps, now, sched.num_preemptions, pool.peak_used, rejected)


def iteration_records(engine: Engine, result: ReplayResult, gap_s: float = 0.0
                      ) -> list[StepRecord]:
    """A replay's steps as vLLM's iteration log records them (``replay(log_iterations=True)``;
    ``gap_s``: a calibration profile's wall time between steps, which vLLM's elapsed time
    leaves out)."""
    tokens = engine.scheduler.pool.total * engine.scheduler.pool.block_size
    tr = result.steps
    return [StepRecord(iteration=i, context_requests=c[0], context_tokens=c[1],
                            generation_requests=c[2], generation_tokens=c[3],
                            elapsed_ms=(tr.duration[i] - gap_s) * 1e3,
                            kv_usage_pct=100.0 * tr.iteration_kv[i] / tokens)
            for i, c in enumerate(tr.iterations)]


def build_engine(args: EngineArgs, model: ModelConfig, gpu: GPU,
                 version: Version | None = None,
                 vllm_env: Mapping[str, str] | None = None,
                 fused_allreduce_tokens: int = 0) -> Engine:
    """Resolve, profile memory and start the engine (with vLLM ``version``'s start-up
    defaults; None: the current; ``vllm_env``: the server's vLLM environment variables,
    ``fused_allreduce_tokens``: the reach of its fused all-reduce, :class:`Engine`); raises
    EngineStartupError on failure and SpecError for a setting the simulator does not model."""
    args.check_simulated()
    if args.data_parallel_size > 1:
        raise SpecError([("--data-parallel-size", "data parallelism above 1 is not simulated "
                          "here yet: the simulator runs it (an MoE model's ranks stepping "
                          "together, chunktune.sim.engine.data_parallel) only in its fidelity "
                          "replay (bench/fidelity_e2e.py)")])
    cfg = resolve(args, model, gpu, version)
    return Engine(cfg, plan_memory(cfg, vllm_env), vllm_env, fused_allreduce_tokens)
