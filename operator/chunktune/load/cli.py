"""``chunktune load run``: drive an OpenAI-compatible server with a workload profile.

``register(subparsers)`` adds the ``load`` command group to the main command line; ``main(argv)``
runs it standalone (``python -m chunktune.load.cli run --target URL ...``; a leading ``load`` is
accepted too). Exit status: 0 when the summary was written (failed requests are results, not
errors), 1 when the run could not happen, 2 for bad arguments, 130 when interrupted (Ctrl-C once:
the run stops, in-flight requests are cancelled and the partial summary is still written; twice:
abort without a summary).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from chunktune.core.bounds import MAX_CONCURRENCY, MAX_RATE, bounded, rate_bound
from chunktune.core.errors import SpecError
from chunktune.core.summary import LoadSummary, Slo, Window
from chunktune.load.config import DriverConfig
from chunktune.load.launcher import LoadRunError, Progress, resolve_model, run_load
from chunktune.load.report import format_summary

__all__ = ["add_run_arguments", "build_config", "cmd_run", "main", "parse_slos", "register"]

_SLO_METRICS = ("ttft", "tpot", "e2e")


def add_run_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument("--target", required=True,
                     help="base URL of the OpenAI-compatible server, e.g. http://vllm:8000")
    source = run.add_mutually_exclusive_group()
    source.add_argument("--profile",
                        help="workload profile file, or a shipped name (mixed, chat, "
                             "long-context, rag, smoke); default: mixed. A profile file with a "
                             "trace: mapping replays a trace with options")
    source.add_argument("--trace", metavar="FILE",
                        help="replay this request trace (Azure CSV, Mooncake JSONL or the "
                             "generic CSV/JSONL; docs/traffic.md) open loop at its own arrival "
                             "times")
    run.add_argument("--model", help="served model name (default: the first of GET /v1/models)")
    run.add_argument("--out", default="-",
                     help="where to write the JSON summary (default: stdout)")
    o = run.add_argument_group("overrides of the profile")
    o.add_argument("--duration", help="arrival window, e.g. 60, 90s, 10m")
    o.add_argument("--warmup", help="requests arriving earlier are not measured, e.g. 10s")
    mode = o.add_mutually_exclusive_group()
    mode.add_argument("--rate", type=float, help="open loop: arrivals per second (Poisson, or "
                      "constant when the profile says so)")
    mode.add_argument("--concurrency", type=int,
                      help="closed loop: requests kept in flight, no think time")
    o.add_argument("--seed", type=int, help="seed of the request sequence and prompts")
    r = run.add_argument_group("run")
    r.add_argument("--drain-timeout", default="60s",
                   help="how long requests still in flight at the end may take before they "
                        "fail with reason timeout (default: 60s)")
    r.add_argument("--request-timeout", default="300s",
                   help="read timeout within one response (default: 300s)")
    r.add_argument("--token-ids", action="store_true",
                   help="send completions prompts as token ids (exact length on a real server; "
                        "chat classes still send text)")
    r.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                   help="bearer token (default: $OPENAI_API_KEY)")
    r.add_argument("--windows", metavar="SECONDS",
                   help="also emit a summary window every SECONDS, as JSON lines")
    r.add_argument("--windows-out", metavar="PATH",
                   help="file for the window JSON lines (default: stdout, where the summary "
                        "then follows as the last line)")
    r.add_argument("--raw", action="store_true",
                   help="keep every request record in the summary (for goodput, plots)")
    r.add_argument("--slo", action="append", default=[], metavar="[CLASS:]METRIC=SECONDS",
                   help="goodput objective, repeatable: ttft=0.5, chat:tpot=50ms, e2e=10s "
                        "(metrics: ttft, tpot, e2e)")
    r.add_argument("--locust-csv", metavar="PREFIX", help="also write Locust's CSV statistics")
    r.add_argument("--workers", type=int, default=0, metavar="N",
                   help="run Locust's master and N worker processes, one schedule split "
                        "across them (workload.loadWorkers) [0: one process]")
    r.add_argument("--master-bind", default="127.0.0.1", metavar="HOST",
                   help="with --workers: where the master listens [127.0.0.1]")
    r.add_argument("--master-port", type=int, default=0, metavar="PORT",
                   help="with --workers: the master's port [a free one]")
    r.add_argument("--external-workers", action="store_true",
                   help="with --workers: start no worker processes, wait for N `chunktune "
                        "load worker` to connect (a worker Job in a cluster)")
    r.add_argument("--quiet", action="store_true", help="no progress or report on stderr")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``load`` (with ``run``) to a command line's subparsers."""
    load = subparsers.add_parser("load", help="drive a server with a workload (Locust)",
                                 description="Load-test an OpenAI-compatible server.")
    _add_commands(load)


def _add_commands(load: argparse.ArgumentParser) -> None:
    sub = load.add_subparsers(dest="load_cmd", required=True, metavar="{run,worker}")
    run = sub.add_parser(
        "run", help="run a workload profile against a server and write a JSON summary",
        description="Run a workload profile against an OpenAI-compatible server (streaming "
                    "completions and chat) with Locust, and write a "
                    "chunktune.dev/load-summary/v1 JSON summary.",
        allow_abbrev=False)
    add_run_arguments(run)
    run.set_defaults(func=cmd_run)
    worker = sub.add_parser(
        "worker", help="be one Locust worker of a `load run --workers N --external-workers`",
        description="Connect to a distributed load run's master and send the share of its "
                    "schedule the master gives this worker.")
    worker.add_argument("--master", required=True, metavar="HOST:PORT")
    worker.set_defaults(func=cmd_worker)


def parse_slos(items: Sequence[str]) -> dict[str, Slo]:
    """``["ttft=0.5", "chat:tpot=50ms"]`` to ``{"*": Slo(ttft=0.5), "chat": Slo(tpot=0.05)}``."""
    from chunktune.core.workload import parse_duration

    raw: dict[str, dict[str, float]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        cls, _, metric = key.rpartition(":")
        if not sep or metric not in _SLO_METRICS:
            raise SpecError(f"must look like [CLASS:]METRIC=SECONDS with METRIC one of "
                            f"{', '.join(_SLO_METRICS)} (got {item!r})", field="--slo")
        raw.setdefault(cls or "*", {})[metric] = parse_duration(value, "--slo")
    return {k: Slo(**v) for k, v in raw.items()}


def build_config(ns: argparse.Namespace, model: str) -> DriverConfig:
    """The run's settings from parsed arguments (raises SpecError for bad values)."""
    from chunktune.core.workload import load_profile, parse_duration, trace_profile

    profile = trace_profile(ns.trace) if ns.trace else load_profile(ns.profile or "mixed")
    dur = None if ns.duration is None else parse_duration(ns.duration, "--duration")
    warm = None if ns.warmup is None else parse_duration(ns.warmup, "--warmup")
    if ns.rate is not None:
        bounded(ns.rate, "--rate", low=0, low_open=True, high=MAX_RATE)
    if ns.concurrency is not None:
        bounded(ns.concurrency, "--concurrency", low=1, high=MAX_CONCURRENCY, integral=True)
    try:
        profile = profile.with_overrides(duration=dur, warmup=warm, rate=ns.rate,
                                         concurrency=ns.concurrency, seed=ns.seed)
    except SpecError as e:  # a trace refuses --rate and --concurrency
        raise SpecError([(f"--{p}", m) for p, m in e.problems]) from e
    if profile.duration <= 0:
        raise SpecError("must be > 0", field="--duration")
    if profile.warmup >= profile.duration:
        raise SpecError(f"must be shorter than the duration ({profile.warmup:g}s >= "
                        f"{profile.duration:g}s)", field="--warmup")
    if profile.trace is None:
        rate_bound(profile.arrival.rate, profile.duration,
                   "--rate" if ns.rate is not None else
                   "--duration" if dur is not None else "--profile")
    window = None if ns.windows is None else parse_duration(ns.windows, "--windows")
    if window is not None and window <= 0:
        raise SpecError("must be > 0", field="--windows")
    return DriverConfig(
        target=ns.target.rstrip("/"), model=model, profile=profile.to_dict(),
        drain_timeout=parse_duration(ns.drain_timeout, "--drain-timeout"),
        request_timeout=parse_duration(ns.request_timeout, "--request-timeout"),
        token_ids=ns.token_ids, api_key=ns.api_key, window=window,
        locust_csv=ns.locust_csv, load_workers=_workers(ns.workers),
        master_bind=ns.master_bind,
        master_port=int(bounded(ns.master_port, "--master-port", low=0, high=65535)),
        spawn_workers=not ns.external_workers)


def _workers(n: int) -> int:
    return int(bounded(n, "--workers", low=0, high=64, integral=True))


def _progress_printer(stream: IO[str]) -> Any:
    tty = stream.isatty()
    last = [-1e9]

    def show(p: Progress) -> None:
        if tty:
            stream.write("\r" + p.line() + "\x1b[K")
        elif p.elapsed - last[0] >= 5.0:
            stream.write(p.line() + "\n")
        else:
            return
        last[0] = p.elapsed
        stream.flush()

    return show


def cmd_worker(ns: argparse.Namespace) -> int:
    """Become a Locust worker process (gevent's patch comes first, in a fresh interpreter)."""
    import subprocess

    from chunktune.load.launcher import BOOTSTRAP, child_env

    if ":" not in ns.master:
        raise SpecError(f"must be HOST:PORT (got {ns.master!r})", field="--master")
    return subprocess.call([sys.executable, "-c", BOOTSTRAP, "--worker", ns.master],
                           env=child_env())


def cmd_run(ns: argparse.Namespace) -> int:
    """Handler of ``load run``."""
    err = sys.stderr
    try:
        slos = parse_slos(ns.slo)
        if ns.model is None:
            build_config(ns, "?")  # check the arguments before touching the network
        model = ns.model or resolve_model(ns.target, ns.api_key)
        cfg = build_config(ns, model)
    except SpecError as e:
        print(f"chunktune load run: {e}", file=err)
        return 2
    except LoadRunError as e:
        print(f"chunktune load run: {e}", file=err)
        return 1
    win_out: IO[str] | None = None
    if cfg.window:
        win_out = sys.stdout if ns.windows_out in (None, "-") else open(  # noqa: SIM115
            ns.windows_out, "w")

    def on_window(w: Window) -> None:
        if win_out is not None:
            win_out.write(json.dumps(w.to_dict(), separators=(",", ":")) + "\n")
            win_out.flush()

    if not ns.quiet:
        p = cfg.parsed_profile()
        arr = (f"{p.arrival.concurrency} in flight" if p.arrival.mode == "concurrency"
               else f"{p.arrival.mode} {p.arrival.rate:g} req/s")
        if p.trace is not None:
            arr = f"trace {p.trace.source}, {p.arrival.rate:.3g} req/s"
            for note in p.trace.notes:
                print(f"chunktune load run: {note}", file=err)
        print(f"chunktune load run: {p.name} ({arr}, {p.duration:g}s, warm-up {p.warmup:g}s) "
              f"against {cfg.target}, model {model}", file=err)
    stop = threading.Event()
    try:
        summary = run_load(cfg, raw=ns.raw, slos=slos or None, on_window=on_window,
                           on_progress=None if ns.quiet else _progress_printer(err),
                           stop=stop)
    except LoadRunError as e:
        print(f"\nchunktune load run: {e}", file=err)
        return 1
    except KeyboardInterrupt:
        print("\nchunktune load run: interrupted", file=err)
        return 130
    finally:
        if win_out is not None and win_out is not sys.stdout:
            win_out.close()
    _write_summary(summary, ns.out, compact=win_out is sys.stdout)
    if not ns.quiet:
        if err.isatty():
            err.write("\n")
        err.write(format_summary(summary) + "\n")
        if ns.out not in (None, "-"):
            err.write(f"summary written to {ns.out}\n")
    if not summary.complete:  # only Ctrl-C stops a command-line run early
        print("chunktune load run: interrupted; the summary covers the part that ran",
              file=err)
        return 130
    return 0


def _write_summary(summary: LoadSummary, out: str | None, compact: bool = False) -> None:
    if compact and out in (None, "-"):  # stdout is a JSON-lines stream of windows
        text = json.dumps(summary.to_dict(), separators=(",", ":")) + "\n"
    else:
        text = json.dumps(summary.to_dict(), indent=2) + "\n"
    if out in (None, "-"):
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry: ``python -m chunktune.load.cli run ...`` (or ``load run ...``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["load"]:
        args = args[1:]
    parser = argparse.ArgumentParser(prog="chunktune load", allow_abbrev=False,
                                     description="Load-test an OpenAI-compatible server.")
    _add_commands(parser)
    ns = parser.parse_args(args)
    return int(ns.func(ns) or 0)


if __name__ == "__main__":
    sys.exit(main())
