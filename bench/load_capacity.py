"""How fast can one Locust process drive streaming requests while still timing them right?

Steps a Poisson arrival rate up (``--rates``) against a target and prints, per step: the offered
rate (nominal, and what the seeded sequence actually holds in the measured interval), the rate
the client sent and the rate of completed requests, client TTFT p50/p99, the client-vs-server
TTFT error, and the CPU used by the Locust process and the server. It stops at the first step
where the completed rate falls short of the offered rate by more than ``--max-shortfall``
(default 5 %), a request fails, or the TTFT error exceeds ``--max-error`` (default 5 ms), and
prints the highest rate that passed.

The TTFT error is per request (client TTFT minus the server's own TTFT for that request; the
table shows its mean, p50 and p99) when the server reports per-request times, as the fake server
does at ``GET /_stats``; otherwise only the difference of the means is known, the server's taken
from its ``vllm:time_to_first_token_seconds`` histogram on ``/metrics`` (sum and count before
and after the step), which works against the simulator and a real vLLM. The step's gate is the
mean error by default (the one statistic both sources give; a bias of the client's clock), or
``--error-stat p50|p99``. The p99 of the per-request error mostly measures how often the
machine deschedules the client or the server for a few milliseconds: on a machine whose CPUs
other work shares, it exceeds 5 ms at any rate.

Default target: ``tests/load/fake_openai.py`` started in its own process with no service time
(``--ttft 0 --itl 0``: tokens as fast as it can write them; ``--itl 0.001`` spreads them out,
which costs the client a wake-up per token). ``--target URL`` uses another server instead::

    python bench/load_capacity.py                        # the fake server
    python bench/load_capacity.py --target http://127.0.0.1:8000 --rates 10,20,40

``--workers 0,2`` repeats the steps with Locust in one process (0) and with its master and two
worker processes (2, ``workload.loadWorkers``), and prints the highest sustained rate of each.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import sys
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "operator"), str(ROOT)]

from chunktune.core.summary import LoadSummary  # noqa: E402
from chunktune.core.workload import generate, parse_profile  # noqa: E402
from chunktune.load.config import DriverConfig  # noqa: E402
from chunktune.load.launcher import resolve_model, run_load  # noqa: E402


def _get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return bytes(resp.read())
    except (OSError, ValueError):
        return None


def server_ttft_totals(target: str) -> tuple[float, float] | None:
    """(sum, count) of the server's TTFT histogram, or None without one."""
    text = _get(target + "/metrics")
    if text is None:
        return None
    total = count = 0.0
    found = False
    for line in text.decode().splitlines():
        m = re.match(r"vllm(?::|_)time_to_first_token_seconds_(sum|count)(?:\{[^}]*\})?\s+(\S+)",
                     line)
        if m:
            found = True
            if m.group(1) == "sum":
                total += float(m.group(2))
            else:
                count += float(m.group(2))
    return (total, count) if found else None


def per_request_errors(target: str, summary: LoadSummary) -> list[float] | None:
    """Client minus server TTFT per request, when the server lists its requests."""
    body = _get(target + "/_stats")
    if body is None or summary.raw is None:
        return None
    srv = {r["rid"]: r for r in json.loads(body).get("requests", [])}
    return [r.ttft - srv[r.rid]["ttft"] for r in summary.raw
            if r.ok and r.ttft is not None and srv.get(r.rid, {}).get("ttft") is not None]


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    h = (len(s) - 1) * q / 100
    lo = int(h)
    return s[lo] + (h - lo) * (s[min(lo + 1, len(s) - 1)] - s[lo])


def profile(rate: float, duration: float, warmup: float, prompt: int, tokens: int,
            seed: int) -> dict[str, Any]:
    return {"name": "capacity", "arrival": {"mode": "poisson", "rate": rate},
            "duration": duration, "warmup": warmup, "seed": seed,
            "classes": [{"name": "bench", "weight": 1, "api": "completions",
                         "prompt_tokens": {"dist": "constant", "value": prompt},
                         "output_tokens": {"dist": "constant", "value": tokens}}]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", help="server to drive (default: start the fake server)")
    ap.add_argument("--model", help="model name (default: first of GET /v1/models)")
    ap.add_argument("--rates", default="25,50,100,150,200,300,400,500,600,800",
                    help="comma-separated arrival rates to step through, req/s")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per step")
    ap.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds per step")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens per request")
    ap.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    ap.add_argument("--ttft", type=float, default=0.0, help="fake server: first-token delay")
    ap.add_argument("--itl", type=float, default=0.0, help="fake server: token interval")
    ap.add_argument("--max-shortfall", type=float, default=0.05)
    ap.add_argument("--max-error", type=float, default=0.005, help="seconds")
    ap.add_argument("--error-stat", choices=("mean", "p50", "p99"), default="mean",
                    help="which statistic of the per-request TTFT error gates a step")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", default="0",
                    help="comma-separated Locust worker counts to compare (0: one process)")
    args = ap.parse_args(argv)

    import psutil

    with ExitStack() as stack:
        server_proc = None
        if args.target:
            target = args.target.rstrip("/")
        else:
            from tests.load.fake_openai import FakeServer

            fake = stack.enter_context(FakeServer(ttft=args.ttft, itl=args.itl))
            target = fake.url
            server_proc = psutil.Process(fake.pid)
        model = args.model or resolve_model(target)
        where = (f"fake server (ttft {args.ttft * 1000:g} ms, itl {args.itl * 1000:g} ms)"
                 if not args.target else target)
        print(f"target: {where}; {args.prompt} prompt / {args.tokens} output tokens per "
              f"request; steps of {args.duration:g}s ({args.warmup:g}s warm-up); "
              f"{psutil.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} before the "
              f"first step", flush=True)
        found: dict[int, float | None] = {}
        for workers in (int(x) for x in args.workers.split(",")):
            found[workers] = steps(args, target, model, server_proc, workers)
        print(f"\nload average after the last step: {os.getloadavg()[0]:.2f} (other processes "
              f"on the machine compete for the same CPUs and inflate the timing error)")
        for workers, best in found.items():
            how = "one Locust process" if not workers else f"Locust master + {workers} workers"
            if best is None:
                print(f"{how}: no step passed")
                continue
            print(f"{how}: highest sustained rate {best:g} req/s (completed within "
                  f"{args.max_shortfall * 100:g}% of offered, no failures, TTFT error "
                  f"{args.error_stat} <= {args.max_error * 1000:g} ms)")
    return 0 if all(v is not None for v in found.values()) else 1


def steps(args: argparse.Namespace, target: str, model: str, server_proc: Any,
          workers: int) -> float | None:
    """Step the rate up with ``workers`` Locust workers; the highest rate that passed."""
    print(f"\n{'one Locust process' if not workers else f'{workers} Locust workers'}:")
    head = (f"{'offered':>8} {'(seq)':>7} {'sent/s':>7} {'done/s':>7} {'fail':>5} "
            f"{'TTFT p50':>9} {'TTFT p99':>9} {'err mean':>8} {'err p50':>8} {'err p99':>8} "
            f"{'client CPU':>10} {'server CPU':>10}  verdict")
    print(head)
    print("-" * len(head))
    best = None
    for rate in (float(x) for x in args.rates.split(",")):
        prof = profile(rate, args.duration, args.warmup, args.prompt, args.tokens,
                       args.seed)
        seq = sum(1 for s in generate(parse_profile(prof))
                  if s.arrival is not None and s.arrival >= args.warmup)
        offered = seq / (args.duration - args.warmup)
        before = server_ttft_totals(target)
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        srv0 = sum(server_proc.cpu_times()[:2]) if server_proc else None
        t0 = time.perf_counter()
        s = run_load(DriverConfig(target=target, model=model, profile=prof,
                                  drain_timeout=30.0, load_workers=workers), raw=True)
        wall = time.perf_counter() - t0
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        client_cpu = (ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime)
        # CPU over the child's whole life (imports included), per second of the run.
        client_pct = 100 * client_cpu / max(s.duration.elapsed, 1e-9)
        srv_pct = (100 * (sum(server_proc.cpu_times()[:2]) - srv0) / wall
                   if server_proc and srv0 is not None else None)
        o = s.overall
        errs = per_request_errors(target, s)
        if errs:
            emean, e50, e99 = statistics.fmean(errs), statistics.median(errs), _pct(errs, 99)
            err_gate = {"mean": emean, "p50": e50, "p99": e99}[args.error_stat]
        else:
            after = server_ttft_totals(target)
            if before and after and after[1] > before[1] and o.ttft:
                srv_mean = (after[0] - before[0]) / (after[1] - before[1])
                emean = err_gate = o.ttft.mean - srv_mean
                e50 = e99 = float("nan")
            else:
                emean = e50 = e99 = err_gate = float("nan")
        done = o.throughput.request_rate
        short = done < offered * (1 - args.max_shortfall)
        bad_err = not (abs(err_gate) <= args.max_error)
        verdict = "ok"
        if o.requests.failed:
            verdict = f"{o.requests.failed} failed"
        elif short:
            verdict = f"short by {100 * (1 - done / offered):.1f}%"
        elif bad_err:
            verdict = f"TTFT error {args.error_stat} {err_gate * 1000:.1f} ms"
        ttft = o.ttft
        print(f"{rate:8g} {offered:7.1f} {o.throughput.sent_rate:7.1f} {done:7.1f} "
              f"{o.requests.failed:5d} "
              f"{(ttft.p50 * 1000 if ttft else float('nan')):8.2f}m "
              f"{(ttft.p99 * 1000 if ttft else float('nan')):8.2f}m "
              f"{emean * 1000:7.2f}m {e50 * 1000:7.2f}m {e99 * 1000:7.2f}m "
              f"{client_pct:9.0f}% "
              f"{(f'{srv_pct:9.0f}%' if srv_pct is not None else '        -'):>10}  "
              f"{verdict}", flush=True)
        if verdict != "ok":
            break
        best = rate
    return best


if __name__ == "__main__":
    sys.exit(main())
