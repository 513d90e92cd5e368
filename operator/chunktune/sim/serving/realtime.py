"""The real-time engine loop: the virtual-time engine's scheduler and step-time model, run on the
asyncio event loop so that a served request sees the latencies ``Engine.replay`` predicts.

It drives the *same* objects as :meth:`chunktune.sim.engine.virtual.Engine.replay` —
``engine.scheduler`` (:class:`~chunktune.sim.engine.scheduler.Scheduler`) and ``engine.step_time``
— so the two agree on a workload by construction, up to the event loop's timing. One step::

    plan = scheduler.schedule(start)      # requests that arrived so far are in WAITING
    end  = start + engine.step_time(plan)
    sleep until end                       # absolute deadline on loop.time(): no drift
    scheduler.apply(plan, end)            # tokens produced, requests finished
    push each token to its request's Stream, record metrics
    start = end                           # the next step starts where this one ended

New requests join WAITING as they arrive (:meth:`RealtimeEngine.submit`, called by the HTTP
frontend between steps — the loop only schedules at step boundaries, as vLLM does). A client
that goes away is dropped with :meth:`RealtimeEngine.abort` (``Scheduler.abort``), even in the
middle of a step: ``apply`` skips requests no longer RUNNING.

Timing. Steps are chained on absolute deadlines, so the wake-up jitter of the event loop (the
selector rounds timeouts up to whole milliseconds) does not accumulate. If Python is late — the
loop wakes, or finishes pushing tokens, more than ``slack`` seconds after the step's end — the
next step starts when Python gets to it instead (it "starts late"); every step's lateness is
recorded (``chunktune_sim_step_lateness_seconds``; late starts in
``chunktune_sim_late_steps_total``). The Python work per step (schedule, cost model, apply,
token push, metrics) is measured with ``perf_counter`` and kept in
``chunktune_sim_step_overhead_seconds`` and :attr:`RealtimeEngine.stats`; it must stay far
below the simulated step time (typically tens of microseconds against milliseconds).

Token times seen by a client are the loop's wake-up times after each step's end, i.e. the step
end plus the wake-up jitter; the engine's own request records keep the exact step ends.

Step log. With a ``step_log`` stream (``sim serve --enable-logging-iteration-details``) every
step writes the line vLLM 0.32 logs for it (:class:`IterationLog`): ``Iteration(N)`` with the
context/generation counts of :func:`~chunktune.sim.engine.step_trace.iteration_counts` (read before
the step is applied, as vLLM counts them), the *simulated* step time as the elapsed time and the
KV-cache usage after the step. Lines are flushed when the engine goes idle and at least every
:data:`STEP_LOG_FLUSH_S`, so a pod's log holds them while the engine still runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

import numpy as np

from chunktune.core.steps import StepRecord, format_line
from chunktune.sim.engine.request import FINISHED, RUNNING, WAITING, Request
from chunktune.sim.engine.step_trace import StepCounts, iteration_counts

if TYPE_CHECKING:
    from chunktune.sim.engine.virtual import Engine
    from chunktune.sim.serving.metrics import VllmMetrics

#: Wake-up lateness absorbed without shifting the timeline (asyncio's selector rounds timeouts
#: up to 1 ms, so wake-ups are routinely up to ~1 ms late).
DEFAULT_SLACK_S = 0.002
#: Adjustment per step of the wake-up bias, and its ceiling.
BIAS_STEP_S = 10e-6
MAX_BIAS_S = 0.002
#: Steps kept for :meth:`LoopStats.summary` (a ring buffer; the histograms keep everything).
STATS_WINDOW = 200_000
#: Longest time a step-log line waits in the stream's buffer while the engine is busy.
STEP_LOG_FLUSH_S = 0.1


class IterationLog:
    """Writes vLLM's per-step ``Iteration(N)`` lines (:func:`chunktune.core.steps.format_line`,
    behind vLLM's ``INFO MM-DD HH:MM:SS [loggers.py:199]`` prefix) to a text stream."""

    def __init__(self, out: TextIO, device: str = "GPU") -> None:
        self.out = out
        self.device = device
        self.iteration = 0
        """The next step's number (vLLM counts from 0)."""
        self._flushed = time.monotonic()
        self._second = -1
        self._prefix = ""

    def step(self, counts: StepCounts, elapsed_s: float, kv_usage: float) -> None:
        """One step: its iteration counts, simulated time (seconds), KV usage after it (0-1)."""
        record = StepRecord(self.iteration, *counts, elapsed_ms=elapsed_s * 1e3,
                            kv_usage_pct=kv_usage * 100)
        self.iteration += 1
        second = int(time.time())
        if second != self._second:  # the prefix changes once a second
            self._second = second
            self._prefix = f"INFO {time.strftime('%m-%d %H:%M:%S')} [loggers.py:199] "
        self.out.write(f"{self._prefix}{format_line(record, self.device)}\n")
        now = time.monotonic()
        if now - self._flushed >= STEP_LOG_FLUSH_S:
            self.flush(now)

    def flush(self, now: float | None = None) -> None:
        with contextlib.suppress(OSError, ValueError):  # a closed or broken stdout: no log
            self.out.flush()
        self._flushed = time.monotonic() if now is None else now


def _sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        time.sleep(delay)


class LiveRequest(Request):
    """A scheduler request with a back-reference to the stream its tokens go to."""

    __slots__ = ("reported_preemptions", "stream")

    def __init__(self, rid: int, arrival: float, prompt_len: int, max_tokens: int,
                 stream: Stream, priority: int = 0) -> None:
        super().__init__(rid, arrival, prompt_len, max_tokens, priority=priority)
        self.stream = stream
        #: preemptions already counted in vllm:num_preemptions_total (vLLM counts one with
        #: the preempted request's next output, not in the step that preempted it)
        self.reported_preemptions = 0


class Stream:
    """One request as the HTTP frontend sees it: tokens arrive, then it finishes.

    ``await stream.wait()`` returns how many tokens were produced since the previous call (one
    per engine step, more if the consumer fell behind), and 0 once the request is finished (or
    aborted) and everything was handed out. Times are ``loop.time()`` values.
    """

    __slots__ = ("_waiter", "aborted", "arrival", "delivered", "finished", "first_token",
                 "last_token", "max_tokens", "produced", "prompt_tokens", "req")

    def __init__(self, arrival: float, prompt_tokens: int, max_tokens: int) -> None:
        self.arrival = arrival
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.produced = 0
        self.delivered = 0
        self.finished = False
        self.aborted = False
        self.first_token = -1.0
        self.last_token = -1.0
        self.req: LiveRequest | None = None
        self._waiter: asyncio.Future[None] | None = None

    async def wait(self) -> int:
        while True:
            n = self.produced - self.delivered
            if n > 0:
                self.delivered = self.produced
                return n
            if self.finished:
                return 0
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiter = fut
            await fut

    def _wake(self) -> None:
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)


@dataclass
class LoopStats:
    """Per-step timing of the loop (the last :data:`STATS_WINDOW` steps) and totals."""

    overhead: deque[float] = field(default_factory=lambda: deque(maxlen=STATS_WINDOW))
    step_time: deque[float] = field(default_factory=lambda: deque(maxlen=STATS_WINDOW))
    lateness: deque[float] = field(default_factory=lambda: deque(maxlen=STATS_WINDOW))
    steps: int = 0
    late_steps: int = 0
    max_lateness: float = 0.0
    #: How far the timeline has slipped behind the simulated clock (s): the sum, over the steps
    #: that started late, of how late they started — delay the machine added, not the model.
    slipped: float = 0.0

    def summary(self) -> dict[str, float]:
        """Median/p99 of the Python overhead, simulated step time and wake-up lateness (s)."""
        out: dict[str, float] = {"steps": float(self.steps), "late_steps": float(self.late_steps),
                                 "max_lateness": self.max_lateness, "slipped": self.slipped}
        for name, values in (("overhead", self.overhead), ("step_time", self.step_time),
                             ("lateness", self.lateness)):
            a = np.fromiter(values, dtype=float)
            if a.size:
                p50, p99 = np.percentile(a, (50, 99))
                out[f"{name}_p50"] = float(p50)
                out[f"{name}_p99"] = float(p99)
                out[f"{name}_mean"] = float(a.mean())
        return out

    def format(self) -> str:
        s = self.summary()
        if not self.steps:
            return "no engine steps ran"
        return (f"{self.steps:,} steps; Python overhead per step median "
                f"{s['overhead_p50'] * 1e6:.0f} us, p99 {s['overhead_p99'] * 1e6:.0f} us vs "
                f"simulated step median {s['step_time_p50'] * 1e3:.2f} ms "
                f"(overhead/step {s['overhead_mean'] / max(s['step_time_mean'], 1e-12):.2%}); "
                f"wake-up lateness median {s['lateness_p50'] * 1e3:.2f} ms, p99 "
                f"{s['lateness_p99'] * 1e3:.2f} ms; {self.late_steps:,} steps started late")


class RealtimeEngine:
    """Runs an :class:`~chunktune.sim.engine.virtual.Engine`'s scheduler in real time.

    ``start()`` launches the loop task on the running event loop; ``submit()`` adds a request
    and returns its :class:`Stream`; ``abort()`` drops one; ``stop()`` ends the loop and
    aborts whatever is left.
    """

    def __init__(self, engine: Engine, metrics: VllmMetrics | None = None, *,
                 slack: float = DEFAULT_SLACK_S, precise: bool = True,
                 compensate: bool = True, step_log: TextIO | None = None) -> None:
        self.engine = engine
        self.scheduler = engine.scheduler
        self.metrics = metrics
        self.slack = slack
        self.stats = LoopStats()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._next_rid = 0
        self._live: dict[int, Stream] = {}
        self._stopping = False
        #: Sleep to a step's end in a helper thread (sub-millisecond) instead of on asyncio's
        #: timer (whole milliseconds, rounded up).
        self.precise = precise
        self._clock_thread: ThreadPoolExecutor | None = None
        #: Aim wake-ups this much before a step's end (tracks the median lateness).
        self.compensate = compensate
        self._bias = 0.0
        #: vLLM's ``Iteration(N)`` line per step (``--enable-logging-iteration-details``).
        self.step_log = IterationLog(step_log) if step_log is not None else None

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._stopping = False
            self._task = asyncio.get_running_loop().create_task(self._run(),
                                                                name="chunktune-sim-engine")

    async def stop(self) -> None:
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for s in list(self._live.values()):
            self.abort(s)
        if self._clock_thread is not None:
            self._clock_thread.shutdown(wait=False)
            self._clock_thread = None
        if self.step_log is not None:
            self.step_log.flush()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    # ---- requests --------------------------------------------------------------------------

    def submit(self, prompt_tokens: int, max_tokens: int,
               arrival: float | None = None, priority: int = 0,
               block_keys: list[int] | None = None) -> Stream:
        """Add a request (already validated against ``max_model_len``) to WAITING.

        ``arrival`` is when it reached the frontend (``loop.time()``; default now): TTFT and
        the queue time count from there. ``priority`` orders WAITING under
        ``--scheduling-policy priority`` (lower first). ``block_keys``: its prompt's full
        blocks for the prefix cache (:func:`chunktune.sim.engine.kv_cache.block_keys`).
        """
        if self._stopping:
            raise RuntimeError("the engine is shutting down")
        if arrival is None:
            arrival = asyncio.get_running_loop().time()
        stream = Stream(arrival, prompt_tokens, max_tokens)
        rid = self._next_rid
        self._next_rid += 1
        req = LiveRequest(rid, arrival, prompt_tokens, max_tokens, stream, priority)
        req.block_keys = block_keys
        if self.engine.acceptance:  # sim serve's --spec-acceptance
            req.spec_acceptance = self.engine.acceptance[0]
        stream.req = req
        self._live[rid] = stream
        self.scheduler.add_request(req)
        self._wake.set()
        return stream

    def queue_full(self) -> str | None:
        """vLLM's 503 message when ``--max-num-queued-reqs`` refuses one more request (the
        requests in the system: waiting and running), else None."""
        sched = self.scheduler
        why = self.engine.queue_full(len(sched.running) + len(sched.waiting))
        if why is not None and self.metrics is not None:
            self.metrics.on_admission_rejection()
        return why

    def abort(self, stream: Stream) -> None:
        """Drop a request whose client went away: free its KV blocks, end its stream."""
        if stream.finished:
            return
        req = stream.req
        if req is not None:
            if req.status in (WAITING, RUNNING):
                self.scheduler.abort(req)
            req.status = FINISHED
            self._live.pop(req.rid, None)
        stream.finished = True
        stream.aborted = True
        if self.metrics is not None:
            self.metrics.on_abort()
            sched = self.scheduler
            self.metrics.set_queue(len(sched.running), len(sched.waiting), sched.pool.usage)
        stream._wake()

    # ---- the loop --------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        clock = loop.time
        perf = time.perf_counter
        sched = self.scheduler
        pool = sched.pool
        step_time = self.engine.step_time
        metrics = self.metrics
        stats = self.stats
        s_over, s_dt, s_late = stats.overhead, stats.step_time, stats.lateness
        live = self._live
        slack = self.slack
        step_log = self.step_log
        free_at = clock()  # when the simulated GPU finished its last step
        while True:
            if not sched.has_work:
                if step_log is not None:
                    step_log.flush()
                self._wake.clear()
                await self._wake.wait()
                now = clock()
                if now > free_at:
                    free_at = now
                continue
            now = clock()
            start = free_at
            if now - free_at > slack:
                start = now  # Python is late: this step starts late
                stats.late_steps += 1
                stats.slipped += now - free_at
                if metrics is not None:
                    metrics.late_steps.inc()
            w0 = perf()
            plan = sched.schedule(start)
            if not plan.scheduled:
                # Nothing fits (cannot happen for validated requests): wait for a change
                # instead of spinning.
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), 0.01)
                free_at = clock()
                continue
            dt = step_time(plan)
            end = start + dt
            counts = iteration_counts(plan) if step_log is not None else None
            w1 = perf()
            target = end - self._bias
            delay = target - clock()
            if delay <= 0:
                await asyncio.sleep(0)  # let the frontend run between steps
            elif self.precise:
                if self._clock_thread is None:
                    self._clock_thread = ThreadPoolExecutor(
                        1, thread_name_prefix="chunktune-sim-clock")
                await loop.run_in_executor(self._clock_thread, _sleep_until, target)
            else:
                await asyncio.sleep(delay)
            woke = clock()
            if delay > 0 and self.compensate:
                # Track the median wake-up lateness: aim so that half the wake-ups are late.
                b = self._bias + (BIAS_STEP_S if woke > end else -BIAS_STEP_S)
                self._bias = min(max(b, 0.0), MAX_BIAS_S)
            w2 = perf()
            out = sched.apply(plan, end)
            reported = 0
            for req in out.produced:
                if req.num_preemptions != req.reported_preemptions:  # type: ignore[attr-defined]
                    reported += req.num_preemptions - req.reported_preemptions  # type: ignore[attr-defined]
                    req.reported_preemptions = req.num_preemptions  # type: ignore[attr-defined]
                s = req.stream  # type: ignore[attr-defined]
                first = s.produced == 0
                s.produced = req.num_output  # several tokens with speculative decoding
                if first:
                    s.first_token = woke
                    if metrics is not None:
                        metrics.on_first_token(woke - s.arrival, s.prompt_tokens,
                                               req.num_cached)
                elif metrics is not None:
                    metrics.itl.observe(woke - s.last_token)
                s.last_token = woke
                s._wake()
            for req in out.finished:
                s = req.stream  # type: ignore[attr-defined]
                s.finished = True
                live.pop(req.rid, None)
                if metrics is not None:
                    metrics.on_finished(
                        arrival=s.arrival, scheduled=req.first_scheduled,
                        first_token=s.first_token, last_token=s.last_token,
                        prompt_tokens=req.prompt_len, generation_tokens=req.num_output,
                        max_tokens=req.max_tokens, num_preemptions=req.num_preemptions)
                s._wake()
            if metrics is not None:
                metrics.on_step(out.num_generated, reported, len(sched.running),
                                len(sched.waiting), pool.usage)
                if sched.cache is not None:
                    metrics.on_prefix_lookups(sched.cache.queries, sched.cache.hits)
                if sched.spec is not None:
                    metrics.on_spec_decode((sched.num_drafts, sched.num_draft_tokens,
                                            sched.num_accepted_tokens, *sched.accepted_per_pos))
            if step_log is not None and counts is not None:
                step_log.step(counts, dt, pool.usage)
            w3 = perf()
            overhead = (w1 - w0) + (w3 - w2)
            lateness = woke - end
            stats.steps += 1
            s_over.append(overhead)
            s_dt.append(dt)
            s_late.append(lateness)
            if lateness > stats.max_lateness:
                stats.max_lateness = lateness
            if metrics is not None:
                metrics.step_overhead.observe(overhead)
                metrics.step_lateness.observe(max(0.0, lateness))
            free_at = end
