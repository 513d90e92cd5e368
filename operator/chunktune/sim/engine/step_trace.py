"""The simulator's scheduler as a step trace in the shape of vLLM's iteration log.

vLLM's ``--enable-logging-iteration-details`` logs one line per engine step::

    Iteration(N): A context requests, B context tokens, C generation requests, D generation tokens

where a request counts as *context* while it has produced no output token yet (a fresh prompt or
a later chunk of it) and as *generation* otherwise, a preempted request recomputing its prompt
and outputs included (``vllm/v1/utils.py::compute_iteration_details``). :func:`iteration_counts`
gives the same four numbers for a :class:`~chunktune.sim.engine.scheduler.StepPlan`, and
:func:`run_batch` runs a batch of requests that are all waiting before the first step (as the
conformance suite adds them to an in-process vLLM engine) and records every step, so the two
traces can be compared step by step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from chunktune.core.engine_args import ResolvedConfig
from chunktune.sim.engine.request import Request
from chunktune.sim.engine.scheduler import Scheduler, StepPlan

#: (context requests, context tokens, generation requests, generation tokens)
StepCounts = tuple[int, int, int, int]


def iteration_counts(plan: StepPlan) -> StepCounts:
    """vLLM's iteration-log counts for a plan, read before the plan is applied (a request
    resumed after a preemption counts as context in the step that resumes it from 0.34:
    ``StepPlan.admitted_as_context``)."""
    ctx_reqs = ctx_tokens = gen_reqs = gen_tokens = 0
    admitted = len(plan.scheduled) - plan.num_admitted if plan.admitted_as_context else -1
    for k, (req, n) in enumerate(plan.scheduled):
        if req.num_output == 0 or 0 <= admitted <= k:
            ctx_reqs += 1
            ctx_tokens += n
        else:
            gen_reqs += 1
            gen_tokens += n
    return ctx_reqs, ctx_tokens, gen_reqs, gen_tokens


@dataclass
class BatchTrace:
    """Per step: the iteration counts, the requests preempted in the step, and the preemptions
    vLLM *reports* in the step; then the request ids in the order they finished and each
    request's preemptions.

    vLLM 0.32 reports a preemption (``IterationStats.num_preempted_reqs``, so
    ``vllm:num_preemptions_total``) with the preempted request's next output, i.e. in the step
    where it produces its next token after recomputing, not in the step that preempted it;
    ``reported`` follows that rule."""

    steps: list[StepCounts] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    #: speculative decoding: the draft tokens each step verifies (all requests together)
    drafts: list[int] = field(default_factory=list)
    reported: list[int] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    request_preemptions: dict[str, int] = field(default_factory=dict)

    @property
    def num_preemptions(self) -> int:
        return sum(self.preempted)


def run_batch(cfg: ResolvedConfig, num_gpu_blocks: int,
              requests: list[tuple[str, int, int]], max_steps: int = 100_000,
              priorities: Sequence[int] = (),
              prefixes: Sequence[tuple[str, int] | None] = (),
              arrivals: Sequence[int] = (),
              scheduler: Callable[[ResolvedConfig, int], Scheduler] = Scheduler) -> BatchTrace:
    """Run ``(id, prompt tokens, output tokens)`` requests, all waiting before step 0, to
    completion through a fresh :class:`Scheduler` with ``num_gpu_blocks`` KV blocks.
    ``priorities``: each request's (``--scheduling-policy priority``; default 0);
    ``prefixes``: each request's opening (key, tokens) or None (default none). The requests
    arrive in list order, a microsecond apart, as they do when added one after the other to
    an engine (vLLM stamps each with its own arrival time). ``arrivals``: the step before
    which each request is added (default 0: all before the first step); while nothing is
    left to run, the steps jump to the next arrival. ``scheduler``: makes the scheduler from
    the config and the KV blocks (a subclass that scripts the drafts accepted, say); each
    request's ``rid`` is its index in ``requests``.

    A step that schedules nothing is left out of the trace, as vLLM logs no iteration for
    it. Raises ``RuntimeError`` if steps keep scheduling nothing while work is left (a
    request that can never fit) or if ``max_steps`` pass first.
    """
    sched = scheduler(cfg, num_gpu_blocks)
    ids: dict[int, str] = {}
    pending: list[tuple[int, Request]] = []
    for i, (rid, prompt, out) in enumerate(requests):
        if prompt <= 0 or out <= 0:
            raise ValueError(f"request {rid!r}: prompt and output tokens must be > 0 "
                             f"(got {prompt}, {out})")
        ids[i] = rid
        opening = prefixes[i] if prefixes else None
        pending.append((arrivals[i] if arrivals else 0, Request(
            i, i * 1e-6, prompt, out, priority=priorities[i] if priorities else 0,
            prefix_key=opening[0] if opening else None,
            prefix_tokens=opening[1] if opening else 0)))
    pending.sort(key=lambda p: p[0])
    trace = BatchTrace()
    seen: dict[int, int] = {}  # preemptions already reported, per request
    now = 0.0
    step = empties = 0
    while pending or sched.has_work:
        while pending and pending[0][0] <= step:
            sched.add_request(pending.pop(0)[1])
        if not sched.has_work:
            step = pending[0][0]
            continue
        step += 1
        if len(trace.steps) >= max_steps:
            raise RuntimeError(f"scheduler did not finish within {max_steps} steps")
        plan = sched.schedule(now)
        if plan.empty:
            # vLLM 0.31-0.32 under priority: a request that preempted itself ended the step
            # with nothing scheduled; the next one schedules the others (no iteration logged)
            empties += 1
            if empties > 3:
                raise RuntimeError(f"step {len(trace.steps)} scheduled nothing: "
                                   f"{len(sched.running)} running, "
                                   f"{len(sched.waiting)} waiting")
            continue
        empties = 0
        trace.steps.append(iteration_counts(plan))
        trace.preempted.append(len(plan.preempted))
        trace.drafts.append(sum(plan.spec.values()))
        now += 1.0
        outcome = sched.apply(plan, now)
        reported = 0
        for req in outcome.produced:
            if req.num_preemptions != seen.get(req.rid, 0):
                reported += req.num_preemptions - seen.get(req.rid, 0)
                seen[req.rid] = req.num_preemptions
        trace.reported.append(reported)
        for req in outcome.finished:
            rid = ids[req.rid]
            trace.finished.append(rid)
            trace.request_preemptions[rid] = req.num_preemptions
    return trace
