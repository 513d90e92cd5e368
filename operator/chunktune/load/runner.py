"""The Locust process of a load run: Locust in library mode, reporting over a pipe.

:mod:`chunktune.load.launcher` starts this in a child process (gevent's monkey-patching and an
asyncio or threaded caller do not share a process well) with its ``BOOTSTRAP`` program, which
patches the process before anything else is imported. The child builds a Locust
``Environment`` whose request events feed Locust's statistics (and, with ``locust_csv``, its
CSV files), replays the profile with a :class:`chunktune.load.users.Schedule`, and writes
every event as one JSON line to the file descriptor it was given: ``start``, ``record``,
``tick``, ``mark``, ``end`` and, if the run breaks, ``error``. SIGTERM or SIGINT stops the run
early (in-flight requests are recorded as ``cancelled``) and still ends with an ``end`` event.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from typing import Any

import gevent  # type: ignore[import-untyped]
from locust import events
from locust.env import Environment
from locust.stats import CSV_STATS_INTERVAL_SEC, PERCENTILES_TO_REPORT, StatsCSVFileWriter

from chunktune.load.config import DriverConfig
from chunktune.load.users import Schedule

__all__ = ["FdSink", "main"]


class FdSink:
    """Writes events as JSON lines to a pipe; a reader that went away stops the run."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.broken = False
        self.on_broken: list[Any] = []

    def __call__(self, event: dict[str, Any]) -> None:
        if self.broken:
            return
        view = memoryview((json.dumps(event, separators=(",", ":")) + "\n").encode())
        try:
            while view:
                n = os.write(self.fd, view)
                view = view[n:]
        except (BrokenPipeError, OSError):
            self.broken = True
            for cb in self.on_broken:
                cb()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="chunktune-load-child", description=__doc__)
    ap.add_argument("--config", help="JSON file with a DriverConfig (-: read it from stdin)")
    ap.add_argument("--events-fd", type=int, help="where to write JSON events")
    ap.add_argument("--worker", metavar="HOST:PORT",
                    help="be a Locust worker of the master at HOST:PORT instead")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="locust child: %(levelname)s %(name)s: %(message)s")
    if args.worker:
        from chunktune.load.distributed import run_worker

        return run_worker(args.worker)
    if args.config is None or args.events_fd is None:
        ap.error("--config and --events-fd are required")
    if args.config == "-":
        cfg = DriverConfig.from_dict(json.load(sys.stdin))
    else:
        with open(args.config) as f:
            cfg = DriverConfig.from_dict(json.load(f))
    sink = FdSink(args.events_fd)
    if cfg.load_workers > 0:
        return _master(cfg, sink)
    try:
        profile = cfg.parsed_profile()
        env = Environment(user_classes=[], events=events, host=cfg.target)
        env.create_local_runner()
        schedule = Schedule(env, profile, cfg, sink)
    except Exception as e:
        sink({"type": "error", "message": f"{type(e).__name__}: {e}"})
        return 1
    sink.on_broken.append(schedule.stop)
    for sig in (signal.SIGTERM, signal.SIGINT):
        gevent.signal_handler(sig, schedule.stop)
    csv_writer = csv_greenlet = None
    if cfg.locust_csv:
        if d := os.path.dirname(cfg.locust_csv):
            os.makedirs(d, exist_ok=True)
        csv_writer = StatsCSVFileWriter(env, PERCENTILES_TO_REPORT, cfg.locust_csv)
        csv_greenlet = gevent.spawn(csv_writer.stats_writer)
    g = gevent.spawn(schedule.run)
    g.join()
    rc = 0
    if not g.successful():
        sink({"type": "error", "message": "".join(traceback.format_exception(g.exception))})
        rc = 1
    if csv_writer is not None and csv_greenlet is not None:
        gevent.sleep(CSV_STATS_INTERVAL_SEC + 0.1)  # one more write with the final numbers
        csv_greenlet.kill()
        csv_writer.close_files()
    if env.runner is not None:
        env.runner.quit()
    return rc


def _master(cfg: DriverConfig, sink: FdSink) -> int:
    """The master of a distributed run (:mod:`chunktune.load.distributed`)."""
    from chunktune.load.distributed import Master
    from chunktune.load.launcher import BOOTSTRAP

    try:
        master = Master(cfg, sink, BOOTSTRAP)
    except Exception as e:
        sink({"type": "error", "message": f"{type(e).__name__}: {e}"})
        return 1
    sink.on_broken.append(master.stop)
    for sig in (signal.SIGTERM, signal.SIGINT):
        gevent.signal_handler(sig, master.stop)
    g = gevent.spawn(master.run)
    g.join()
    rc = 0
    if not g.successful():
        master.stop()
        sink({"type": "error", "message": "".join(traceback.format_exception(g.exception))})
        rc = 1
    master.close()
    return rc


if __name__ == "__main__":
    sys.exit(main())
