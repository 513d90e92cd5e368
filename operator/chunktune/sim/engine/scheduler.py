"""The V1 scheduling step: ``schedule() -> StepPlan``, then ``apply(plan, end_time)``.

This follows ``vllm/v1/core/sched/scheduler.py::schedule()`` (``docs/vllm-behaviour.md`` §3):

1. ``token_budget = max_num_batched_tokens``. The ``long_prefill_token_threshold`` applies only
   when more than one request is in the system (running + waiting) at the start of the step:
   vLLM 0.31+ lets a lone request use the whole budget, as there is nobody to starve (before,
   the threshold caps it too).
2. RUNNING requests first, in order: each asks for ``num_tokens - num_computed`` tokens, capped by
   the threshold (when it applies), by what is left of the budget and by
   ``max_model_len - num_computed - 1``. If its KV blocks do not fit, the scheduler preempts a
   victim — freeing its blocks and resetting it to recompute — until they fit, or until the
   victim is the request itself. Under ``fcfs`` the victim is the *last* running request; under
   ``priority`` the running request with the largest ``(priority, arrival)``, and if it was
   already scheduled in this step its tokens go back to the budget.
3. WAITING requests are admitted only if nothing was preempted in this step, while the running
   set is below ``max_num_seqs`` and budget is left; each takes its (capped) chunk, or stops the
   admission when the blocks for its *whole* current sequence (prompt plus tokens generated so
   far) do not fit (``--scheduler-reserve-full-isl``, on by default from 0.19; before, or with
   ``--no-scheduler-reserve-full-isl``, only the chunk's blocks must fit:
   ``SchedulerRelease.reserves_full_sequence``). With chunked prefill
   off a prompt that does not fit the remaining budget stops the admission instead of being
   split. WAITING is a FIFO under ``fcfs`` and ordered by ``(priority, arrival)`` under
   ``priority`` (``vllm/v1/core/sched/request_queue.py``: ``FCFSRequestQueue``,
   ``PriorityRequestQueue``).
4. Preempted requests go back to WAITING: to its head under ``fcfs``, in their
   ``(priority, arrival)`` place under ``priority``.
5. Like vLLM's ``BlockPool``, one of the ``num_gpu_blocks`` blocks is the reserved null block:
   requests share the other ``num_gpu_blocks - 1``.
6. With ``--enable-prefix-caching`` the pool is a :class:`PrefixCache`: a WAITING request with
   nothing computed first takes the longest cached run of its leading blocks (vLLM's
   ``get_computed_blocks``) and schedules only the rest; cached blocks it takes from the free
   queue count against the free blocks, in both admission checks; every allocation caches the
   full blocks it fills (``allocate_slots``).

7. The release: ``cfg.vllm_version`` picks the row of
   :data:`chunktune.core.vllm_release.SCHEDULERS` whose rules apply (the newest checked when
   none is named): from 0.33 ``--prefill-schedule-interval`` holds prefill without data
   parallelism (:meth:`Scheduler._prefill_held`) and a request preempting itself under
   ``priority`` lets the requests after it run; from 0.34 the threshold needs chunked prefill
   and ``--cache-aware-admission-window`` reorders WAITING (:meth:`Scheduler._cache_aware`).
   ``--long-prefill-token-threshold-adaptive`` (every checked release) floors the threshold at
   the budget over the requests in the system.
8. With ``--speculative-config`` (:mod:`chunktune.core.speculative`; vLLM 0.32
   ``Scheduler.schedule`` and ``update_from_output``): a decode asks for ``1 + K`` tokens, its
   drafts included; every scheduled request costs its tokens plus the method's draft slots
   against the budget (``input_budget``), nothing is scheduled once the budget left is at most
   the draft slots, and KV is allocated ``lookahead`` tokens past the scheduled ones. After the
   step the rejected drafts roll ``num_computed`` back (:meth:`Scheduler.verify`). Before 0.28
   the draft slots are not charged per request: the budget is cut once by the slots of
   ``max_num_seqs`` requests (``VllmConfig._set_max_num_scheduled_tokens``).

NOTE: with the default threshold of 0 a long prompt takes *all* budget left after the decodes
scheduled before it — decodes admitted after it in the running list, and new arrivals, wait:
the head-of-line blocking the threshold exists to limit.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from chunktune.core.engine_args import ResolvedConfig, check_windowed_admission
from chunktune.core.models import CHUNKED, SLIDING
from chunktune.core.speculative import expected_accepted
from chunktune.core.vllm_release import scheduler_release, uncached_freed_first
from chunktune.sim.engine.kv_cache import (
    BlockClass,
    BlockPool,
    HybridBlocks,
    HybridPrefixCache,
    PrefixCache,
)
from chunktune.sim.engine.memory import kv_cache_layout
from chunktune.sim.engine.request import FINISHED, RUNNING, WAITING, Request


@dataclass
class StepPlan:
    """What one step runs. ``scheduled`` keeps the scheduler's order."""

    scheduled: list[tuple[Request, int]] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    num_tokens: int = 0
    #: (chunk tokens, tokens computed before the chunk) per prefilling request
    prefill_chunks: list[tuple[int, int]] = field(default_factory=list)
    num_decodes: int = 0
    decode_context_tokens: int = 0
    #: rows that sample a token: decodes plus prefills that complete in this step
    num_logits: int = 0
    num_prefill_tokens: int = 0
    #: the last ``num_admitted`` of ``scheduled`` came from WAITING
    num_admitted: int = 0
    #: the iteration log counts those admitted as context, resumed ones included
    #: (``SchedulerRelease.resumed_counts_as_context``)
    admitted_as_context: bool = False
    #: speculative decoding: draft tokens scheduled for verification, per request
    spec: dict[Request, int] = field(default_factory=dict)
    #: requests that sample in this step (decodes and prefills that complete): the drafter's
    #: rows after it
    num_sampling: int = 0

    @property
    def empty(self) -> bool:
        return not self.scheduled


@dataclass
class StepOutcome:
    """What a step produced: requests that got a token, and those that finished."""

    produced: list[Request]
    finished: list[Request]
    num_generated: int
    num_prompt_done: int


class PriorityQueue:
    """WAITING under ``--scheduling-policy priority``: a heap on ``(priority, arrival, rid)``,
    with the deque methods the scheduler uses (``appendleft`` inserts in order too, as vLLM's
    ``PriorityRequestQueue.prepend_request`` does)."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, int, Request]] = []
        self._seq = itertools.count()

    def append(self, req: Request) -> None:
        heapq.heappush(self._heap, (req.priority, req.arrival, req.rid, next(self._seq), req))

    appendleft = append

    def popleft(self) -> Request:
        return heapq.heappop(self._heap)[-1]

    def __getitem__(self, index: int) -> Request:
        if index == 0 and self._heap:
            return self._heap[0][-1]
        return sorted(self._heap)[index][-1]

    def remove(self, req: Request) -> None:
        self._heap = [e for e in self._heap if e[-1] is not req]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (e[-1] for e in sorted(self._heap))


class Scheduler:
    """The engine's request state (WAITING queue, RUNNING list, block pool) and its step."""

    def __init__(self, cfg: ResolvedConfig, num_blocks: int) -> None:
        self.cfg = cfg
        self.budget = cfg.max_num_batched_tokens
        self.threshold = cfg.long_prefill_token_threshold
        self.max_num_seqs = cfg.max_num_seqs
        self.chunked = cfg.enable_chunked_prefill
        self.priority = cfg.scheduling_policy == "priority"
        self.max_model_len = cfg.max_model_len
        # vLLM's BlockPool keeps block 0 as the null block, never handed to a request.
        usable = max(num_blocks - 1, 1)
        #: several KV-cache groups in the pool (windowed layers beside full ones), else None
        self.hybrid = hybrid_blocks(cfg)
        #: the prefix cache, with ``--enable-prefix-caching`` (it is the pool then)
        self.cache: PrefixCache | None = None
        if cfg.enable_prefix_caching:
            own_first = uncached_freed_first(cfg.vllm_version, windowed=False)
            self.cache = PrefixCache(usable, cfg.block_size, own_first) \
                if self.hybrid is None else HybridPrefixCache(
                    usable, cfg.block_size, self.hybrid, own_first,
                    uncached_freed_first(cfg.vllm_version, windowed=True))
        self.pool: BlockPool = self.cache or BlockPool(usable, cfg.block_size)
        self.waiting: deque[Request] | PriorityQueue = \
            PriorityQueue() if self.priority else deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        #: speculative decoding (None: off), its per-request draft slots and KV lookahead
        self.spec = cfg.speculative
        self.draft_slots = self.spec.draft_slots if self.spec else 0
        self.lookahead = self.spec.lookahead if self.spec else 0
        #: vLLM's spec-decode counters: drafts verified, draft tokens, accepted tokens
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        #: accepted tokens by draft position (``..._accepted_tokens_per_pos``)
        self.accepted_per_pos = [0] * (self.spec.num_speculative_tokens if self.spec else 0)
        self._release_rules(cfg)

    def _release_rules(self, cfg: ResolvedConfig) -> None:
        """The rules of the release the config names (:func:`scheduler_release`); raises
        :class:`SpecError` for one whose rules for this model are not modelled
        (:func:`check_windowed_admission`)."""
        check_windowed_admission(cfg.model, cfg.vllm_version, cfg.scheduler_reserve_full_isl)
        release = self.release = scheduler_release(cfg.vllm_version)
        self.adaptive = cfg.long_prefill_token_threshold_adaptive
        self.threshold_needs_chunking = release.threshold_needs_chunking
        self.lone_request_unthrottled = release.threshold_skips_lone_request
        self.self_preemption_continues = release.priority_self_preemption_continues
        # vLLM 0.33 Scheduler.__init__: local_prefill_interval (no DP here); a full interval
        # back, so that the first step is never held
        self.interval = cfg.prefill_schedule_interval if release.local_prefill_cadence else 1
        self.last_prefill_step = -self.interval
        #: steps that scheduled tokens (vLLM's ``num_executed_steps``)
        self.num_executed_steps = 0
        #: the last step that admitted from WAITING left it non-empty (``prefill_capacity_bound``)
        self.capacity_bound = False
        # vLLM 0.34 Scheduler.__init__: cache_aware_window, fcfs with prefix caching only
        self.cache_window = (cfg.cache_aware_admission_window
                             if release.cache_aware_admission and not self.priority
                             and self.cache is not None else 0)
        self.cache_threshold = cfg.cache_aware_admission_threshold

    # ---- state -----------------------------------------------------------------------------

    def add_request(self, req: Request) -> None:
        req.status = WAITING
        self.waiting.append(req)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def abort(self, req: Request) -> None:
        """Drop a request (client went away): free its blocks, forget it."""
        if req.status == RUNNING:
            self.running.remove(req)
        elif req.status == WAITING:
            self.waiting.remove(req)
        req.status = FINISHED  # before the release: the pool forgets a finished request
        self.pool.release(req)

    # ---- the step --------------------------------------------------------------------------

    def schedule(self, now: float) -> StepPlan:
        plan = StepPlan(admitted_as_context=self.release.resumed_counts_as_context)
        # vLLM's input_budget: each scheduled request costs its tokens plus the draft slots
        budget = self.budget
        slots = self.draft_slots
        if slots and not self.release.draft_slots_per_request:
            # vLLM 0.18-0.27: the budget is cut once by the slots of max_num_seqs requests
            budget -= slots * self.max_num_seqs
            slots = 0
        total = budget
        ahead = self.lookahead
        # The threshold exists to stop a long prefill from starving others: with one request
        # in the system vLLM 0.31+ does not apply it.
        in_system = len(self.running) + len(self.waiting)
        thr = self.threshold if in_system > 1 or not self.lone_request_unthrottled else 0
        if self.threshold_needs_chunking and not self.chunked:
            thr = 0
        if thr and self.adaptive:  # a fair share of the budget at least
            thr = max(thr, self.budget // in_system)
        held = self.interval > 1 and self._prefill_held()
        prefill_ran = False
        max_len = self.max_model_len
        pool = self.pool
        cache = self.cache
        hybrid = self.hybrid
        hbs = hybrid.smallest if hybrid is not None else 0
        bs = pool.block_size
        running = self.running
        scheduled = plan.scheduled
        preempted = plan.preempted
        chunks = plan.prefill_chunks
        decodes = 0
        decode_ctx = 0
        logits = 0
        prefill_tokens = 0
        sampling = 0
        #: under priority: what each scheduled running request took, to undo if preempted
        done: dict[Request, tuple[int, int, int]] = {}

        priority = self.priority
        # (hot loop: comparisons inline rather than min(), locals rather than attributes)
        i = 0
        n_running = len(running)  # changes only where a request is preempted
        while i < n_running and budget > slots:
            req = running[i]
            if held and req.prefill_chunk:
                i += 1
                continue
            computed = req.num_computed
            remaining = req.prompt_len + req.num_output - computed
            n = remaining + req.spec_tokens
            if 0 < thr < n:
                n = thr
            if n > budget - slots:
                n = budget - slots
            if n > max_len - computed - 1:
                n = max_len - computed - 1
            if n <= 0:
                i += 1
                continue
            end = computed + n + ahead
            if end > max_len:
                end = max_len
            if hybrid is None:
                need = -(-end // bs) - req.num_blocks
            else:
                if computed >= req.trim_at:
                    hybrid.trim(req, pool)
                # a new block in some group only where the smallest block is crossed
                old = req.slot_end
                need = 0 if end <= old or -(-end // hbs) == -(-old // hbs) \
                    else hybrid.grow(req, end)
            if need > pool.free:
                victim = None
                while need > pool.free:
                    if priority:
                        victim = max(running, key=_priority_key)
                        at = running.index(victim)
                        del running[at]
                        if at < i:
                            i -= 1
                        if victim in done:  # already scheduled in this step: undo it
                            vn, vcomputed, vremaining = done.pop(victim)
                            scheduled.remove((victim, vn))
                            budget += vn + slots
                            plan.spec.pop(victim, None)
                            if vremaining == 1 and vcomputed:
                                decodes -= 1
                                decode_ctx -= vcomputed + vn
                                logits -= vn
                                sampling -= 1
                            else:
                                chunks.remove((vn, vcomputed))
                                prefill_tokens -= vn
                                if vn == vremaining:
                                    logits -= 1
                                    sampling -= 1
                    else:
                        victim = running.pop()
                    self._preempt(victim)
                    preempted.append(victim)
                    if victim is req:
                        break
                n_running = len(running)
                if victim is req:
                    if self.priority and self.self_preemption_continues:
                        continue  # vLLM 0.33: running[i] is the next request already
                    break
            if need:
                pool.allocate(req, need)
            if hybrid is not None and end > req.slot_end:
                req.slot_end = end
            if cache is not None:
                cache.commit(req, min(computed + n, req.prompt_len + req.num_output))
            scheduled.append((req, n))
            if req.prefill_chunk:
                prefill_ran = True
            if priority:
                done[req] = (n, computed, remaining)
            budget -= n + slots
            if req.spec_tokens:
                # the drafts that fit are verified; new ones come after the step
                if n > remaining:
                    plan.spec[req] = n - remaining
                req.spec_tokens = 0
            if remaining == 1 and computed:
                # a decode verifies its drafts: every position is sampled
                decodes += 1
                decode_ctx += computed + n
                logits += n
                sampling += 1
            else:
                chunks.append((n, computed))
                prefill_tokens += n
                if n == remaining:
                    logits += 1
                    sampling += 1
            i += 1

        if not preempted:
            if self.cache_window and not held:
                self._cache_aware()
            waiting = self.waiting
            max_seqs = self.max_num_seqs
            chunked = self.chunked
            full = self.release.reserves_full_sequence and self.cfg.scheduler_reserve_full_isl
            lookahead_in = self.release.admission_lookahead
            while waiting and budget > slots and len(running) < max_seqs:
                req = waiting[0]
                computed = req.num_computed
                hit = touch = 0
                if cache is not None and computed == 0:
                    # the longest cached run of its leading blocks; those still in the free
                    # queue leave it when taken, so they count against the free blocks
                    hit, touch = cache.lookup(req)
                    computed = hit * bs
                remaining = req.prompt_len + req.num_output - computed
                if held and remaining > 1:
                    break  # vLLM 0.33: the cadence holds this step's prefill
                n = remaining
                if 0 < thr < n:
                    n = thr
                if n > budget - slots:
                    if not chunked:
                        break
                    n = budget - slots
                # From 0.19 the whole current sequence must fit before the request is
                # admitted; before, its chunk only (below).
                if full:
                    whole = min(req.prompt_len + req.num_output, max_len)
                    gate = -(-whole // bs) - req.num_blocks - hit if hybrid is None \
                        else hybrid.gate(whole, computed)
                    if gate + touch > pool.free:
                        break
                # before 0.23 a request that has computed nothing is admitted without them
                wahead = ahead if lookahead_in or req.num_computed else 0
                end = min(computed + n + wahead, max_len)
                need = -(-end // bs) - req.num_blocks - hit if hybrid is None \
                    else hybrid.admit(end, computed)
                if need + touch > pool.free:
                    break
                waiting.popleft()
                if cache is not None and req.num_computed == 0:
                    cache.take(req, hit)
                pool.allocate(req, need)
                if hybrid is not None:
                    hybrid.start(req, end, computed)
                if cache is not None:
                    cache.commit(req, min(computed + n, req.prompt_len + req.num_output))
                req.status = RUNNING
                running.append(req)
                if req.first_scheduled < 0:
                    req.first_scheduled = now
                scheduled.append((req, n))
                budget -= n + slots
                chunks.append((n, computed))
                prefill_tokens += n
                if n == remaining:
                    logits += 1
                    sampling += 1
                plan.num_admitted += 1
                prefill_ran |= remaining > 1
            if not held:
                self.capacity_bound = bool(waiting)
        else:
            # Preempted requests go back to the head of WAITING, earliest-admitted first
            # (under priority: in their (priority, arrival) place).
            for victim in preempted:
                self.waiting.appendleft(victim)

        plan.num_tokens = total - budget - slots * len(scheduled)
        plan.num_sampling = sampling
        if plan.num_tokens:
            self.num_executed_steps += 1
            if prefill_ran and self.interval > 1:
                self.last_prefill_step = self.num_executed_steps
        plan.num_decodes = decodes
        plan.decode_context_tokens = decode_ctx
        plan.num_logits = logits
        plan.num_prefill_tokens = prefill_tokens
        return plan

    def _prefill_held(self) -> bool:
        """vLLM 0.33's local prefill cadence (``schedule()``, "Local prefill cadence"): hold
        prefill — admissions and chunks of running prompts — until ``interval`` executed
        steps have passed since the last step that carried prefill, while a running request
        decodes, unless the last admitting step could not drain WAITING."""
        return (not self.capacity_bound
                and self.num_executed_steps + 1 - self.last_prefill_step < self.interval
                and any(not r.prefill_chunk for r in self.running))

    def _cache_aware(self) -> None:
        """vLLM 0.34's ``Scheduler._reorder_waiting_by_cached_prefix``: once KV usage reaches
        the threshold, within the first ``cache_window`` waiting requests those never
        scheduled (a preempted one keeps its place) go deepest cached prefix first, arrival
        order breaking ties."""
        waiting = self.waiting
        cache = self.cache
        if len(waiting) < 2 or cache is None or cache.usage < self.cache_threshold:
            return
        assert isinstance(waiting, deque), "cache-aware admission is fcfs only"
        head = list(itertools.islice(waiting, self.cache_window))
        slots = [i for i, r in enumerate(head) if r.num_preemptions == 0]
        if len(slots) < 2:
            return
        cached = {i: cache.lookup(head[i])[0] for i in slots}
        order = sorted(slots, key=lambda i: (-cached[i], i))
        if order == slots:
            return
        reordered = list(head)
        for slot, source in zip(slots, order, strict=True):
            reordered[slot] = head[source]
        for _ in head:
            waiting.popleft()
        waiting.extendleft(reversed(reordered))

    def _preempt(self, req: Request) -> None:
        """Preemption by recompute: free the blocks, restart from token 0
        (docs/vllm-behaviour.md §3)."""
        self.pool.release(req)
        if self.hybrid is not None:
            self.hybrid.reset(req)
        req.num_computed = 0
        req.spec_tokens = 0
        req.num_preemptions += 1
        req.status = WAITING
        self.num_preemptions += 1

    def verify(self, req: Request, drafts: int) -> int:
        """The drafts of ``req`` the step accepted (the expected number at the request's
        acceptance, its fraction carried to the next verification); the rejected ones roll
        ``num_computed`` back, as vLLM's ``update_from_output`` does. Counts them as vLLM's
        ``spec_decode_num_drafts`` / ``_num_draft_tokens`` / ``_num_accepted_tokens``."""
        accepted = self.accept(req, drafts)
        req.num_computed -= drafts - accepted
        self.num_drafts += 1
        self.num_draft_tokens += drafts
        self.num_accepted_tokens += accepted
        per_pos = self.accepted_per_pos
        for pos in range(accepted):
            per_pos[pos] += 1
        return accepted

    def accept(self, req: Request, drafts: int) -> int:
        """How many of ``drafts`` the target model accepts: the expected number at the
        request's acceptance, its fraction carried to the request's next verification."""
        carry = req.spec_carry + expected_accepted(req.spec_acceptance, drafts)
        accepted = min(int(carry), drafts)
        req.spec_carry = carry - accepted
        return accepted

    def apply(self, plan: StepPlan, end_time: float) -> StepOutcome:
        """Advance the scheduled requests by their tokens; sample where a request caught up."""
        produced: list[Request] = []
        finished: list[Request] = []
        generated = 0
        prompts_done = 0
        spec = plan.spec
        k = self.spec.num_speculative_tokens if self.spec else 0
        running = RUNNING
        # (hot loop: comparisons inline rather than min(), locals rather than globals)
        for req, n in plan.scheduled:
            if req.status != running:
                continue  # aborted while the step ran
            computed = req.num_computed + n
            req.num_computed = computed
            output = req.num_output
            if computed < req.prompt_len + output:
                req.prefill_chunk = True
                continue
            req.prefill_chunk = False
            tokens = 1 + self.verify(req, spec[req]) if spec and req in spec else 1
            if output == 0:
                req.first_token = end_time
                prompts_done += 1
            else:
                req.itl.append(end_time - req.last_token)
            req.last_token = end_time
            left = req.max_tokens - output
            if tokens > left:
                tokens = left
            output += tokens
            req.num_output = output
            generated += tokens
            produced.append(req)
            if output >= req.max_tokens:
                finished.append(req)
            elif k:
                req.spec_tokens = k  # the drafter proposes K for the next step
        if finished:
            pool = self.pool
            for req in finished:
                req.status = FINISHED
                req.finish_time = end_time
                pool.release(req)
            self.running = [r for r in self.running if r.status == RUNNING]
        return StepOutcome(produced, finished, generated, prompts_done)


def hybrid_blocks(cfg: ResolvedConfig) -> HybridBlocks | None:
    """The block classes of ``cfg``'s KV-cache groups when they are of several kinds
    (:func:`~chunktune.sim.engine.memory.kv_cache_layout`), else None (one group, or groups
    of one kind, count as one table)."""
    layout = kv_cache_layout(cfg)
    if not layout.hybrid:
        return None
    m = cfg.model
    counts: dict[tuple[str, int, int], int] = {}
    for g in layout.groups:
        key = (g.kind, g.block_tokens or cfg.block_size, g.blocks_per_request)
        counts[key] = counts.get(key, 0) + 1
    classes = [BlockClass(n, tokens,
                          window=m.sliding_window if kind == SLIDING else 0,
                          chunk=m.attention_chunk_size if kind == CHUNKED else 0,
                          cap=per_request if kind in (SLIDING, CHUNKED) else 0)
               for (kind, tokens, per_request), n in counts.items()]
    return HybridBlocks(classes)


def _priority_key(req: Request) -> tuple[int, float]:
    """vLLM's preemption order under ``priority``: the largest (priority, arrival) goes first."""
    return req.priority, req.arrival
