"""Locust side of the load driver: one User class per traffic class, and the open-loop schedule.

Import this only in a process that runs Locust (it imports ``locust``, which monkey-patches the
process for gevent): the Locust child of :mod:`chunktune.load.launcher`, or
``loadtest/locustfile.py``.

How requests are scheduled. Locust users are closed loops, but a benchmark of an LLM server needs
open-loop arrivals (a request starts at its arrival time however many are in flight). So the
users here do not loop: :func:`make_user_classes` builds one ``HttpUser`` subclass per traffic
class of the profile (``weight``, ``api`` and the length distributions come from the profile),
and a :class:`Schedule` replays the profile's request sequence (``core.workload.generate``, the
same sequence the simulator replays for the same seed) through them:

* ``poisson`` / ``constant`` / ``trace``: one dispatcher greenlet spawns each request's greenlet
  :data:`SEND_LEAD` before its arrival time; the greenlet prepares the request (prompt, body,
  encoding), sleeps until the arrival time and sends it with its class's user, never waiting
  for earlier ones. How late the sends went out is the summary's ``schedule.send_lag``: the
  process's own wake-up delays (its event loop's work, a busy CPU), under a millisecond on an
  idle machine;
* ``concurrency``: N worker greenlets, each sending the next request of the sequence as soon
  as its previous one ended (closed loop, no think time); the class mix is per request, as in
  the simulator, not per user.

Requests that arrive (open loop) or start (closed loop) before ``warmup`` are marked as warm-up.
No request starts after ``duration``; requests still running then may finish during the drain
timeout, after which they are cancelled and recorded as ``timeout`` failures.

Every request fires two Locust request events, ``name="ttft"`` and ``name="e2e"`` with the
class name as ``request_type`` and the output tokens as ``response_length``, so Locust's UI and
CSV show them; the numbers chunktune reports come from its own raw records, not Locust's
rounded statistics. The HTTP requests go through the users' ``HttpSession`` (requests), called
as a plain ``requests.Session`` so Locust does not log a third, header-time entry.
"""

from __future__ import annotations

import gc
import itertools
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import gevent  # type: ignore[import-untyped]
import gevent.event  # type: ignore[import-untyped]
from gevent import GreenletExit
from locust import HttpUser, constant
from locust.env import Environment
from requests import PreparedRequest
from urllib3 import PoolManager

from chunktune.core.errors import ChunktuneError
from chunktune.core.records import RequestRecord
from chunktune.core.tokens import count_chat_tokens
from chunktune.core.workload import Profile, RequestSpec, TrafficClass, generate
from chunktune.load import shards
from chunktune.load.client import API_PATHS, build_body, prepare_request, stream_request
from chunktune.load.config import DriverConfig
from chunktune.load.prompts import PromptSynth

__all__ = ["LoadFailure", "Schedule", "StreamingOpenAIUser", "make_user_classes"]

Sink = Callable[[dict[str, Any]], None]

#: Open loop: a request's greenlet starts this long before its arrival time and prepares it
#: (prompt, body, encoding), so that at its arrival it only has to wake up and send.
SEND_LEAD = 0.05


class LoadFailure(ChunktuneError):
    """The exception a failed request is reported to Locust with (``reason: message``)."""


class StreamingOpenAIUser(HttpUser):
    """Sends one traffic class's requests as streaming OpenAI calls. Subclassed per class by
    :func:`make_user_classes`; driven by a :class:`Schedule`, so it has no tasks of its own."""

    abstract = True
    wait_time = constant(0)
    traffic_class: ClassVar[TrafficClass]
    driver: ClassVar[DriverConfig]
    prompt_seed: ClassVar[int] = 0
    run_tag: ClassVar[str] = "0"
    """Makes request ids unique across runs that share a server (vLLM refuses duplicates)."""
    pool_manager = PoolManager(num_pools=4, maxsize=2048, block=False)

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)  # type: ignore[no-untyped-call]
        cfg = self.driver
        self.api = self.traffic_class.api
        self.url = cfg.target.rstrip("/") + API_PATHS[self.api]
        # The session is used as a plain requests.Session (prepare + send): HttpSession.request
        # would log a third, header-time entry. No proxies or .netrc from the environment.
        self.client.explicit_name = None  # read by HttpSession.prepare_request
        self.client.trust_env = False
        self._synth = PromptSynth(self.prompt_seed)
        self._headers = dict(cfg.extra_headers)
        if cfg.api_key:
            self._headers["Authorization"] = f"Bearer {cfg.api_key}"
        self._timeout = (cfg.connect_timeout, cfg.request_timeout)

    def prompt(self, spec: RequestSpec, rid: int) -> tuple[Any, int]:
        """The prompt for a request and its token count under chunktune's rule; its opening
        is its class's shared one where the spec names one."""
        n = spec.prompt_tokens
        key = spec.prefix_key
        prefix = (key, spec.prefix_tokens) if key is not None else None
        if self.api == "chat":
            messages = self._synth.messages(n, rid, prefix)
            return messages, count_chat_tokens(messages)
        if self.driver.token_ids:
            return self._synth.token_ids(n, rid, prefix), n
        return self._synth.text(n, rid, prefix), n

    def prepare(self, spec: RequestSpec, record: RequestRecord) -> PreparedRequest:
        """The request, encoded and ready to go out (its prompt's count in ``record``)."""
        prompt, n = self.prompt(spec, record.rid)
        record.prompt_tokens = n
        body = build_body(self.api, self.driver.model, prompt, spec.output_tokens,
                          spec.priority)
        headers = {**self._headers, "X-Request-Id": f"chunktune-{self.run_tag}-{record.rid}"}
        return prepare_request(self.client, self.url, body, headers)

    def send(self, spec: RequestSpec, record: RequestRecord, clock0: float,
             prepared: PreparedRequest | None = None) -> RequestRecord:
        """Send the request (``prepared`` by :meth:`prepare`, or now) and record it."""
        if prepared is None:
            prepared = self.prepare(spec, record)
        stream_request(self.client, self.url, {}, record, api=self.api, clock0=clock0,
                       timeout=self._timeout, prepared=prepared)
        self.report(record)
        return record

    def report(self, r: RequestRecord) -> None:
        """Fire Locust's request events for a finished request."""
        fire = self.environment.events.request.fire
        name = self.traffic_class.name
        if r.ok and r.ttft is not None:
            fire(request_type=name, name="ttft", response_time=r.ttft * 1000.0,
                 response_length=r.output_tokens, exception=None, context={})
        exc = None if r.ok else LoadFailure(f"{r.reason}: {r.error}")
        fire(request_type=name, name="e2e", response_time=(r.e2e or 0.0) * 1000.0,
             response_length=r.output_tokens, exception=exc, context={})


def _class_name(name: str) -> str:
    parts = [p for p in name.replace(".", "-").replace("_", "-").split("-") if p]
    return "".join(p[:1].upper() + p[1:] for p in parts) + "User"


def make_user_classes(profile: Profile, cfg: DriverConfig
                      ) -> list[type[StreamingOpenAIUser]]:
    """One ``StreamingOpenAIUser`` subclass per traffic class, in profile order."""
    out: list[type[StreamingOpenAIUser]] = []
    for c in profile.classes:
        attrs = {"traffic_class": c, "driver": cfg, "weight": c.weight, "host": cfg.target,
                 "prompt_seed": profile.seed, "abstract": True,
                 "__module__": __name__, "__doc__": f"Traffic class {c.name!r} ({c.api})."}
        out.append(type(_class_name(c.name), (StreamingOpenAIUser,), attrs))
    return out


class Schedule:
    """Replays a profile's request sequence through the class users; see the module docstring.

    Events go to ``sink`` as dicts: ``start``, ``record`` (a finished request), ``tick``
    (progress), ``mark`` (a window boundary, with the requests sent so far per class) and
    ``end``. Call :meth:`run` in a greenlet; :meth:`stop` ends it early (requests in flight are
    cancelled and recorded as ``cancelled``).
    """

    def __init__(self, env: Environment, profile: Profile, cfg: DriverConfig, sink: Sink,
                 classes: Sequence[type[StreamingOpenAIUser]] | None = None,
                 share: tuple[int, int] | None = None, start_wall: float | None = None,
                 run_tag: str | None = None) -> None:
        """``share``: ``(index, count)``, this worker's part of the schedule
        (:mod:`chunktune.load.shards`); ``start_wall``: the run's time zero (``time.time()``)
        that every worker shares; ``run_tag``: the request-id tag all workers share."""
        self.share = share
        self.start_wall = start_wall
        self.env = env
        self.profile = profile
        self.cfg = cfg
        self.sink = sink
        if classes is None:
            classes = make_user_classes(profile, cfg)
        for cls in classes:
            cls.driver = cfg
            cls.prompt_seed = profile.seed
            cls.host = cfg.target
            cls.run_tag = run_tag or secrets.token_hex(3)
        self.classes = list(classes)
        self.stopped = gevent.event.Event()
        self.names = [c.name for c in profile.classes]
        self.sent = [0] * len(self.names)
        self.active: dict[gevent.Greenlet, RequestRecord] = {}
        self.clock0 = 0.0
        self.done = gevent.event.Event()
        self._prepared: tuple[list[StreamingOpenAIUser], list[RequestSpec], int, int,
                              int] | None = None

    def stop(self) -> None:
        self.stopped.set()

    def _execute(self, user: StreamingOpenAIUser, spec: RequestSpec, rec: RequestRecord,
                 at: float | None = None) -> None:
        """Send one request and sink its record. ``at`` (open loop): prepare it now, send it at
        that offset from the start, or not at all if the run is stopped before."""
        prepared = None
        if at is not None:
            try:
                prepared = user.prepare(spec, rec)
            except Exception as e:  # the driver broke, not the request
                self._broke(rec, e)
                return
            wait = self.clock0 + at - time.perf_counter()
            if (wait > 0 and self.stopped.wait(wait)) or self.stopped.is_set():
                return
        g = gevent.getcurrent()
        self.active[g] = rec
        self.sent[spec.cls] += 1
        try:
            user.send(spec, rec, self.clock0, prepared)
        except Exception as e:  # the request's own failures are recorded in send
            self.active.pop(g, None)
            self._broke(rec, e)
            return
        except GreenletExit:
            rec.e2e = time.perf_counter() - self.clock0 - rec.start
            if self.stopped.is_set():
                rec.fail("cancelled", "the run was stopped while the request was in flight")
            else:
                rec.fail("timeout", f"still running {self.cfg.drain_timeout:g}s after the end "
                         f"of the run (drain timeout)")
            user.report(rec)
        finally:
            self.active.pop(g, None)
        self.sink({"type": "record", **rec.to_dict()})

    def _broke(self, rec: RequestRecord, e: Exception) -> None:
        """The driver itself failed on request ``rec`` (out of memory building its prompt, a
        bug): the run stops and ends in an ``error`` event, so it exits non-zero instead of
        finishing without that request (a greenlet's exception is otherwise only printed)."""
        what = "ran out of memory" if isinstance(e, MemoryError) else \
            f"failed ({type(e).__name__}: {str(e)[:200]})"
        self.sink({"type": "error", "message": f"the load driver {what} on request {rec.rid} "
                   f"(class {rec.cls}, {rec.prompt_tokens} prompt tokens)"})
        self.stop()

    def _record(self, spec: RequestSpec, rid: int, now: float) -> RequestRecord:
        p = self.profile
        t = spec.arrival if spec.arrival is not None else now
        return RequestRecord(rid=rid, cls=self.names[spec.cls], arrival=spec.arrival, start=now,
                             prompt_tokens=spec.prompt_tokens, max_tokens=spec.output_tokens,
                             warmup=t < p.warmup)

    def _ticker(self) -> None:
        cfg, p = self.cfg, self.profile
        next_tick = cfg.tick
        win = cfg.window
        next_mark = win if win else None
        while True:
            t = time.perf_counter() - self.clock0
            if next_mark is not None and next_mark < p.duration and t >= next_mark:
                self.sink({"type": "mark", "t": next_mark,
                           "sent": dict(zip(self.names, self.sent, strict=True))})
                next_mark += win  # type: ignore[operator]
            if t >= next_tick:
                self.sink({"type": "tick", "t": t, "sent": sum(self.sent),
                           "inflight": len(self.active)})
                next_tick = t + cfg.tick
            wake = min(next_tick, next_mark if next_mark is not None else next_tick)
            gevent.sleep(max(0.0, wake - (time.perf_counter() - self.clock0)))

    def prepare(self) -> None:
        """Build the users and this run's part of the request sequence (what :meth:`run`
        does first; a distributed worker does it before the shared time zero is set)."""
        if self._prepared is not None:
            return
        p = self.profile
        users = [cls(self.env) for cls in self.classes]
        closed = p.arrival.mode == "concurrency"
        # Closed loop takes what it needs; the client cannot pass ~500 req/s, and the sequence
        # wraps around (with fresh request ids, so fresh prompts) if a run outlasts it.
        specs = generate(p, limit=min(200_000, int(500 * p.duration) + 1000) if closed else None)
        concurrency = p.arrival.concurrency or 1
        index, count = self.share or (0, 1)
        if count > 1 and closed:
            concurrency = shards.clients(concurrency, index, count)
        elif count > 1:
            specs = shards.shard(specs, index, count)
        # Everything allocated so far lives for the whole run: keep the collector off it, or a
        # full collection over a long sequence stalls every stream for milliseconds.
        gc.collect()
        gc.freeze()
        self._prepared = (users, specs, concurrency, index, count)

    def run(self) -> None:
        p, cfg = self.profile, self.cfg
        self.prepare()
        assert self._prepared is not None
        users, specs, concurrency, index, count = self._prepared
        closed = p.arrival.mode == "concurrency"
        self.clock0 = time.perf_counter()
        if self.start_wall is not None:  # a shared time zero, maybe a little ahead
            self.clock0 += self.start_wall - time.time()
            gevent.sleep(max(0.0, self.clock0 - time.perf_counter()))
        self.sink({"type": "start", "wall": time.time(), "classes": self.names,
                   "requests_planned": None if closed else len(specs)})
        ticker = gevent.spawn(self._ticker)
        workers: list[gevent.Greenlet] = []
        if closed:
            counter = itertools.count(index, count)

            def worker() -> None:
                while not self.stopped.is_set():
                    now = time.perf_counter() - self.clock0
                    if now >= p.duration:
                        return
                    i = next(counter)
                    spec = specs[i % len(specs)]
                    self._execute(users[spec.cls], spec, self._record(spec, i, now))

            workers = [gevent.spawn(worker) for _ in range(concurrency)]
            self.stopped.wait(p.duration)
        else:
            for spec in specs:
                assert spec.arrival is not None
                delay = self.clock0 + spec.arrival - SEND_LEAD - time.perf_counter()
                if delay > 0 and self.stopped.wait(delay):
                    break
                if self.stopped.is_set():
                    break
                now = time.perf_counter() - self.clock0
                workers.append(gevent.spawn(self._execute, users[spec.cls], spec,
                                            self._record(spec, spec.rid, now), spec.arrival))
            else:
                self.stopped.wait(max(0.0, self.clock0 + p.duration - time.perf_counter()))
        complete = not self.stopped.is_set()
        dispatch_end = p.duration if complete else time.perf_counter() - self.clock0
        if cfg.window and complete:
            self.sink({"type": "mark", "t": p.duration,
                       "sent": dict(zip(self.names, self.sent, strict=True))})
        # Drain: requests in flight may finish until the drain timeout, then are cancelled.
        deadline = self.clock0 + dispatch_end + cfg.drain_timeout
        pending = [g for g in workers if not g.dead]
        while pending and not self.stopped.is_set():
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                break
            gevent.joinall(pending, timeout=min(remaining, 0.25))
            pending = [g for g in pending if not g.dead]
        gevent.killall([g for g in workers if not g.dead], block=True, timeout=10)
        drain = max(0.0, time.perf_counter() - self.clock0 - dispatch_end)
        ticker.kill(block=True)
        self.sink({"type": "end", "t": time.perf_counter() - self.clock0, "wall": time.time(),
                   "dispatch_end": dispatch_end, "drain": drain, "complete": complete,
                   "sent": sum(self.sent)})
        self.done.set()

