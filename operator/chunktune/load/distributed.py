"""Locust's distributed mode for one load run: a master and N workers, one schedule.

Import this only in a Locust process (the child of :mod:`chunktune.load.runner`). With
``DriverConfig.load_workers`` N the child is Locust's master (``MasterRunner``, ZeroMQ on
``master_port``): it starts N local worker processes (or, in a cluster, waits for N worker
pods) and for each to say it listens (Locust acks a worker's connection before the worker
has registered chunktune's messages, and drops a message it has no handler for), sends each
its share — the whole config and its ``(index, count)`` — then, once all
have prepared it, a shared time zero a moment ahead, and writes the workers' events to the
launcher's pipe as one run's:

* every ``record`` as it comes (the summary is built from the raw records of all workers,
  so its histograms and percentiles are exact, not averaged);
* a ``mark`` (window boundary) once every worker passed it, with their ``sent`` counts summed;
* ``tick`` progress summed over the workers' latest ones;
* one ``end``, once every worker ended: the latest dispatch end and drain, complete only if
  all were.

Each worker (``WorkerRunner``) runs a :class:`~chunktune.load.users.Schedule` over its share
(:mod:`chunktune.load.shards`) from the shared time zero and sends its events back in
batches. A stop (SIGTERM) at the master stops every worker; their in-flight requests are
recorded ``cancelled`` as in one process.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import Any

import gevent  # type: ignore[import-untyped]
import gevent.event  # type: ignore[import-untyped]
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner

from chunktune.load.config import DriverConfig
from chunktune.load.launcher import child_env
from chunktune.load.users import Schedule

__all__ = ["Master", "run_worker"]

MSG_HELLO = "chunktune_hello"
MSG_START = "chunktune_start"
MSG_READY = "chunktune_ready"
MSG_GO = "chunktune_go"
MSG_STOP = "chunktune_stop"
MSG_EVENTS = "chunktune_events"
#: Seconds between a worker's batches of events.
FLUSH_SECONDS = 0.1
#: Seconds the workers get to connect, and between the start message and time zero.
CONNECT_TIMEOUT = 60.0
START_AHEAD = 0.5

Sink = Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Master:
    """The master side of a distributed run; :meth:`run` replaces ``Schedule.run``."""

    def __init__(self, cfg: DriverConfig, sink: Sink, bootstrap: str) -> None:
        self.cfg = cfg
        self.sink = sink
        self.count = cfg.load_workers
        self.names = [c.name for c in cfg.parsed_profile().classes]
        self.port = cfg.master_port or free_port()
        self.env = Environment(user_classes=[], host=cfg.target)
        self.runner: MasterRunner = self.env.create_master_runner(cfg.master_bind, self.port)
        self.runner.register_message(MSG_EVENTS, self._on_events)
        self.runner.register_message(MSG_READY, self._on_ready)
        self.runner.register_message(MSG_HELLO, self._on_hello)
        self.listening: set[str] = set()
        self.ready: set[str] = set()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.bootstrap = bootstrap
        self.marks: dict[float, list[dict[str, int]]] = {}
        self.ticks: dict[str, dict[str, Any]] = {}
        self.ends: dict[str, dict[str, Any]] = {}
        self.done = gevent.event.Event()
        self.stopped = False
        self.start_wall = 0.0

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.runner.send_message(MSG_STOP, {})

    def _on_hello(self, environment: Environment, msg: Any, **_: Any) -> None:
        self.listening.add(str(msg.node_id))

    def _on_ready(self, environment: Environment, msg: Any, **_: Any) -> None:
        self.ready.add(str(msg.node_id))

    def _on_events(self, environment: Environment, msg: Any, **_: Any) -> None:
        worker = str(msg.node_id)
        for ev in msg.data["events"]:
            kind = ev.get("type")
            if kind == "record":
                self.sink(ev)
            elif kind == "tick":
                self.ticks[worker] = ev
                self.sink({"type": "tick", "t": max(float(e["t"]) for e in self.ticks.values()),
                           "sent": sum(int(e["sent"]) for e in self.ticks.values()),
                           "inflight": sum(int(e["inflight"]) for e in self.ticks.values())})
            elif kind == "mark":
                t = float(ev["t"])
                got = self.marks.setdefault(t, [])
                got.append(ev["sent"])
                if len(got) == self.count:
                    self.sink({"type": "mark", "t": t, "sent": {
                        n: sum(int(s.get(n, 0)) for s in got) for n in self.names}})
            elif kind == "end":
                self.ends[worker] = ev
                if len(self.ends) == self.count:
                    self._end()
            elif kind == "error":
                self.sink({"type": "error",
                           "message": f"load worker {worker}: {ev.get('message')}"})
                self.stop()
                self.done.set()

    def _end(self) -> None:
        ends = list(self.ends.values())
        dispatch_end = max(float(e["dispatch_end"]) for e in ends)
        self.sink({"type": "end", "t": max(float(e["t"]) for e in ends),
                   "wall": max(float(e["wall"]) for e in ends), "dispatch_end": dispatch_end,
                   "drain": max(float(e["dispatch_end"]) + float(e["drain"]) for e in ends)
                   - dispatch_end,
                   "complete": all(bool(e["complete"]) for e in ends),
                   "sent": sum(int(e["sent"]) for e in ends), "workers": self.count})
        self.done.set()

    def _spawn_local(self) -> None:
        for _ in range(self.count):
            self.procs.append(subprocess.Popen(
                [sys.executable, "-c", self.bootstrap, "--worker", f"127.0.0.1:{self.port}"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=child_env()))

    def run(self) -> None:
        if self.cfg.spawn_workers:
            self._spawn_local()
        deadline = time.monotonic() + CONNECT_TIMEOUT
        # a worker is counted once it said hello: its handlers are registered by then, so the
        # share sent to it cannot arrive before them and be dropped
        while len(self.listening) < self.count:
            if time.monotonic() > deadline or self.stopped:
                raise RuntimeError(f"{len(self.listening)} of {self.count} load "
                                   f"workers connected to the master on port {self.port} "
                                   f"within {CONNECT_TIMEOUT:g} s")
            gevent.sleep(0.05)
        profile = self.cfg.parsed_profile()
        tag = os.urandom(3).hex()
        for i, node in enumerate(sorted(self.listening)[:self.count]):
            self.runner.send_message(MSG_START, {
                "config": self.cfg.to_dict(), "index": i, "count": self.count,
                "run_tag": tag}, client_id=node)
        while len(self.ready) < self.count:
            if time.monotonic() > deadline + CONNECT_TIMEOUT or self.stopped:
                raise RuntimeError(f"{len(self.ready)} of {self.count} load workers prepared "
                                   "their share in time")
            gevent.sleep(0.02)
        self.start_wall = time.time() + START_AHEAD
        self.sink({"type": "start", "wall": self.start_wall, "classes": self.names,
                   "requests_planned": None, "workers": self.count})
        self.runner.send_message(MSG_GO, {"start_wall": self.start_wall})
        limit = profile.duration + self.cfg.drain_timeout + CONNECT_TIMEOUT + 30
        if not self.done.wait(limit):
            raise RuntimeError(f"the load workers did not end within {limit:g} s")

    def close(self) -> None:
        self.runner.quit()
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def run_worker(master: str) -> int:
    """A worker process: connect to ``master`` (``host:port``), run the share it is given,
    send the events back; returns the exit status."""
    host, _, port = master.rpartition(":")
    env = Environment(user_classes=[])
    runner: WorkerRunner = env.create_worker_runner(host, int(port))
    started = gevent.event.AsyncResult()
    go = gevent.event.AsyncResult()
    batch: list[dict[str, Any]] = []
    schedule: list[Schedule] = []

    def on_start(environment: Environment, msg: Any, **_: Any) -> None:
        started.set(msg.data)

    def on_go(environment: Environment, msg: Any, **_: Any) -> None:
        go.set(msg.data)

    def on_stop(environment: Environment, msg: Any, **_: Any) -> None:
        for s in schedule:
            s.stop()

    def flush() -> None:
        if batch:
            out = list(batch)
            batch.clear()
            runner.send_message(MSG_EVENTS, {"events": out})

    def flusher() -> None:
        while True:
            gevent.sleep(FLUSH_SECONDS)
            flush()

    runner.register_message(MSG_START, on_start)
    runner.register_message(MSG_STOP, on_stop)
    runner.register_message(MSG_GO, on_go)
    runner.send_message(MSG_HELLO, {})
    data = started.get(timeout=CONNECT_TIMEOUT + 600)
    cfg = DriverConfig.from_dict(data["config"])
    env.host = cfg.target
    s = Schedule(env, cfg.parsed_profile(), cfg, batch.append,
                 share=(int(data["index"]), int(data["count"])), run_tag=str(data["run_tag"]))
    schedule.append(s)
    s.prepare()
    runner.send_message(MSG_READY, {})
    s.start_wall = float(go.get(timeout=2 * CONNECT_TIMEOUT)["start_wall"])
    pump = gevent.spawn(flusher)
    g = gevent.spawn(s.run)
    g.join()
    rc = 0
    if not g.successful():
        batch.append({"type": "error", "message": repr(g.exception)})
        rc = 1
    pump.kill()
    flush()
    gevent.sleep(0.5)  # let the last batch leave before the socket closes
    runner.quit()
    return rc
