"""Run a load test from any Python program: Locust in a child process, results back here.

:func:`run_load` starts the Locust child (:mod:`chunktune.load.runner`), reads its JSON-line
events, turns ``mark`` events into :class:`~chunktune.core.summary.Window` summaries as they
complete, reports progress, and returns the run's
:class:`~chunktune.core.summary.LoadSummary`. It blocks; from asyncio call it with
``await asyncio.to_thread(run_load, cfg, ...)`` (callbacks then run in that thread). Setting
``stop`` (or returning ``False`` from ``on_window``) ends the run early, e.g. to prune a trial:
the child stops sending, cancels what is in flight and the summary says ``complete: false``.

This module imports neither gevent nor Locust, so it is safe inside asyncio programs.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import chunktune
from chunktune.core.aggregate import RunInfo, build_summary, build_window
from chunktune.core.errors import ChunktuneError
from chunktune.core.records import RequestRecord
from chunktune.core.stats import percentile
from chunktune.core.summary import ArrivalInfo, LoadSummary, Slo, Window
from chunktune.load.config import DriverConfig

__all__ = ["BOOTSTRAP", "PARENT_ENV", "EventCollector", "LoadRunError", "Progress", "child_env",
           "resolve_model", "run_load"]

#: The pid of the process that starts a Locust child or worker (:func:`child_env`).
PARENT_ENV = "CHUNKTUNE_LOAD_PARENT"

#: ``python -c`` program that starts the Locust child: patch for gevent first, then import
#: chunktune (anything imported before the patch, ssl above all, may misbehave). Before that,
#: on Linux, the child asks the kernel to SIGKILL it when the process that started it exits
#: (``prctl(PR_SET_PDEATHSIG)``), and exits if that one is already gone: a child busy
#: building a prompt handles no SIGTERM, and in its own session a terminal's signals miss it,
#: so nothing else would end it with a killed ``load run`` (or a master its workers).
BOOTSTRAP = ("import ctypes, os, signal, sys\n"
             "if sys.platform.startswith('linux'):\n"
             "    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)\n"
             f"    if str(os.getppid()) != os.environ.get({PARENT_ENV!r}, str(os.getppid())):\n"
             "        sys.exit(1)\n"
             "from gevent import monkey; monkey.patch_all()\n"
             "from chunktune.load.runner import main\n"
             "sys.exit(main(sys.argv[1:]))\n")


class LoadRunError(ChunktuneError):
    """The load run could not run or broke (target unreachable, Locust child crashed)."""


@dataclass(frozen=True)
class Progress:
    """A progress report, about twice a second."""

    elapsed: float
    duration: float
    sent: int
    done: int
    failed: int
    inflight: int
    ttft_p99: float | None
    """p99 TTFT of the ok requests that ended in the last ``ROLLING`` seconds."""

    ROLLING = 10.0

    def line(self) -> str:
        ttft = "-" if self.ttft_p99 is None else f"{self.ttft_p99 * 1000:.1f} ms"
        return (f"[{self.elapsed:6.1f}s/{self.duration:g}s] sent {self.sent}  done {self.done}  "
                f"in flight {self.inflight}  failed {self.failed}  "
                f"TTFT p99 (last {self.ROLLING:g}s) {ttft}")


def resolve_model(target: str, api_key: str | None = None, timeout: float = 10.0) -> str:
    """The first model the server lists at ``GET /v1/models``."""
    req = urllib.request.Request(target.rstrip("/") + "/v1/models")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data = json.load(resp)
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise LoadRunError(f"cannot list models at {target}/v1/models: {e}") from e
    models = data.get("data") if isinstance(data, dict) else None
    if not models or not isinstance(models[0], dict) or "id" not in models[0]:
        raise LoadRunError(f"{target}/v1/models lists no model; pass --model")
    return str(models[0]["id"])


def child_env() -> dict[str, str]:
    """The environment of a process running :data:`BOOTSTRAP`: this chunktune importable, and
    this process named its parent (:data:`PARENT_ENV`)."""
    env = dict(os.environ)
    root = str(Path(chunktune.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    env[PARENT_ENV] = str(os.getpid())
    return env


class EventCollector:
    """Consumes a :class:`~chunktune.load.users.Schedule`'s events and builds the summary."""

    def __init__(self, cfg: DriverConfig, on_window: Callable[[Window], Any] | None,
                 on_progress: Callable[[Progress], None] | None) -> None:
        self.profile = cfg.parsed_profile()
        self.names = [c.name for c in self.profile.classes]
        self.on_window = on_window
        self.on_progress = on_progress
        self.records: list[RequestRecord] = []
        self.pending: list[RequestRecord] = []  # ended since the last window mark
        self.windows: list[Window] = []
        self.last_mark = 0.0
        self.last_sent: dict[str, int] = dict.fromkeys(self.names, 0)
        self.recent: collections.deque[tuple[float, float]] = collections.deque()
        self.failed = 0
        self.start: dict[str, Any] | None = None
        self.end: dict[str, Any] | None = None
        self.error: str | None = None
        self.want_stop = False
        self.interrupted = False
        """The reader was interrupted (Ctrl-C) and stopped the run."""

    def handle(self, ev: dict[str, Any]) -> None:
        kind = ev.pop("type", None)
        if kind == "record":
            r = RequestRecord.from_dict(ev)
            self.records.append(r)
            self.pending.append(r)
            if not r.ok:
                self.failed += 1
            elif r.ttft is not None:
                self.recent.append((r.end, r.ttft))
        elif kind == "tick":
            t = float(ev["t"])
            while self.recent and self.recent[0][0] < t - Progress.ROLLING:
                self.recent.popleft()
            if self.on_progress is not None:
                p99 = percentile([x for _, x in self.recent], 99) if self.recent else None
                self.on_progress(Progress(elapsed=t, duration=self.profile.duration,
                                          sent=int(ev["sent"]), done=len(self.records),
                                          failed=self.failed, inflight=int(ev["inflight"]),
                                          ttft_p99=p99))
        elif kind == "mark":
            self._window(float(ev["t"]), {k: int(v) for k, v in ev["sent"].items()})
        elif kind == "start":
            self.start = ev
        elif kind == "end":
            self.end = ev
        elif kind == "error":
            self.error = str(ev.get("message"))

    def _window(self, t: float, sent: dict[str, int]) -> None:
        inside = [r for r in self.pending if r.end < t]
        self.pending = [r for r in self.pending if r.end >= t]
        delta = {n: sent.get(n, 0) - self.last_sent.get(n, 0) for n in self.names}
        w = build_window(inside, len(self.windows), self.last_mark, t,
                         warmup=self.profile.warmup, class_names=self.names, sent=delta)
        self.windows.append(w)
        self.last_mark, self.last_sent = t, sent
        if self.on_window is not None and self.on_window(w) is False:
            self.want_stop = True

    def summary(self, cfg: DriverConfig, *, raw: bool = False,
                slos: Mapping[str, Slo] | None = None) -> LoadSummary:
        """The summary of a finished run (after its ``end`` event)."""
        if self.start is None or self.end is None:
            raise LoadRunError("the run has not finished")
        p = self.profile
        info = RunInfo(
            target=cfg.target, model=cfg.model, profile=p.name,
            arrival=ArrivalInfo(p.arrival.mode, p.arrival.rate, p.arrival.concurrency),
            seed=p.seed, class_names=tuple(self.names),
            started_wall=float(self.start["wall"]), ended_wall=float(self.end["wall"]),
            configured=p.duration, warmup=p.warmup,
            dispatch_end=float(self.end["dispatch_end"]), drain=float(self.end["drain"]),
            complete=bool(self.end["complete"]))
        return build_summary(self.records, info, windows=self.windows, slos=slos,
                             include_raw=raw)


def run_load(cfg: DriverConfig, *, raw: bool = False, slos: Mapping[str, Slo] | None = None,
             on_window: Callable[[Window], Any] | None = None,
             on_progress: Callable[[Progress], None] | None = None,
             stop: threading.Event | None = None,
             stderr: IO[str] | None = None) -> LoadSummary:
    """Run the load test ``cfg`` describes and return its summary.

    ``raw`` keeps every request record in the summary; ``slos`` (class name or ``"*"`` to
    :class:`Slo`) adds goodput. ``on_window`` gets each window as it completes (only with
    ``cfg.window``) and may return ``False`` to stop the run; ``on_progress`` gets a
    :class:`Progress` about twice a second; ``stop`` ends the run early when set. The child's
    own log lines (Locust warnings) go to ``stderr`` (default ``sys.stderr``).

    Raises :class:`LoadRunError` when the child cannot start or dies without finishing.
    """
    col = EventCollector(cfg, on_window, on_progress)
    err_out = stderr if stderr is not None else sys.stderr
    # The configuration goes to the child on its stdin: nothing is written to disk, so a
    # driver killed mid-run (an operator pod, a SIGKILLed CLI) leaves nothing behind.
    r_fd, w_fd = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", BOOTSTRAP, "--config", "-", "--events-fd", str(w_fd)],
            pass_fds=(w_fd,), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True, env=child_env(), start_new_session=True)
    except BaseException:
        os.close(r_fd)
        raise
    finally:
        os.close(w_fd)
    tail: collections.deque[str] = collections.deque(maxlen=40)
    fwd = threading.Thread(target=_forward, args=(proc.stderr, err_out, tail), daemon=True)
    fwd.start()
    assert proc.stdin is not None
    try:
        with proc.stdin:
            proc.stdin.write(json.dumps(cfg.to_dict()))
    except BrokenPipeError:  # the child died at start-up: its stderr says why, below
        pass
    signalled = False
    interrupts = 0
    try:
        with os.fdopen(r_fd, "rb") as events:
            while True:
                try:
                    for line in events:
                        try:
                            col.handle(json.loads(line))
                        except KeyboardInterrupt:
                            raise
                        except Exception as e:  # a bad line must not lose the run
                            col.error = col.error or f"bad event from the Locust child: {e}"
                        if not signalled and (col.want_stop or (stop is not None
                                                                and stop.is_set())):
                            signalled = True
                            _signal(proc, signal.SIGTERM)
                    break
                except KeyboardInterrupt:
                    # First Ctrl-C: stop the run, keep reading, return what was measured.
                    interrupts += 1
                    col.interrupted = True
                    if interrupts > 1:
                        proc.kill()
                        raise
                    signalled = True
                    _signal(proc, signal.SIGTERM)
    finally:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        fwd.join(timeout=5)
    if col.end is None or col.start is None:
        detail = col.error or "".join(tail).strip() or f"exit status {proc.returncode}"
        raise LoadRunError(f"the Locust child ended without finishing the run: {detail}")
    if col.error:
        raise LoadRunError(f"the Locust child failed: {col.error}")
    return col.summary(cfg, raw=raw, slos=slos)


def _signal(proc: subprocess.Popen[str], sig: int) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)


def _forward(src: IO[str] | None, dst: IO[str], tail: collections.deque[str]) -> None:
    if src is None:
        return
    for line in src:
        tail.append(line)
        try:
            dst.write(line)
            dst.flush()
        except (OSError, ValueError):
            pass
