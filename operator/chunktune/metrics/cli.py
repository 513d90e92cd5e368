"""``chunktune workload from-prometheus``: a workload profile derived from a running
deployment's vLLM metrics.

Reads the request histograms under ``--selector`` over ``--window`` from Prometheus
(:meth:`~chunktune.metrics.client.PrometheusClient.observe_workload`), derives a profile
(:func:`~chunktune.metrics.derive.derive`), prints what it derived and from which window, and
writes the profile (``--out FILE``, else stdout) in the ``loadtest/profiles`` format that
``chunktune sim run --workload``, ``chunktune load run --profile`` and ``spec.workload.profile``
read. Exit 1 when nothing can be derived (the message names the selector), 2 for bad
arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import yaml

from chunktune.core.bounds import MAX_TIMEOUT_S, MAX_TOKENS, bounded
from chunktune.core.errors import SpecError
from chunktune.core.selectors import LabelSelector
from chunktune.core.workload import parse_duration
from chunktune.metrics.client import PrometheusClient
from chunktune.metrics.derive import LONG_PROMPT_TOKENS, DerivedWorkload, WorkloadUnavailable
from chunktune.metrics.derive import derive as derive_profile

#: The last Unix second a ``datetime`` holds (9999-12-31T23:59:59Z).
MAX_UNIX_SECONDS = 253402300799.0


def parse_time(text: str) -> float:
    """Unix seconds from ``1735689600`` or an ISO 8601 / RFC 3339 time
    (``2025-01-01T00:00:00Z``)."""
    want = "must be Unix seconds or an RFC 3339 time such as 2025-01-01T00:00:00Z"
    try:
        seconds = float(text)
    except ValueError:
        try:
            return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
        except ValueError as e:
            raise SpecError(f"{want} (got {text!r})", field="--at") from e
    # Unix seconds after the epoch and before the year 10000 (what a datetime can hold).
    return bounded(seconds, "--at", low=0, high=MAX_UNIX_SECONDS)


def profile_yaml(derived: DerivedWorkload) -> str:
    """The profile file: what it was derived from as a comment, then the profile."""
    head = "".join(f"# {line}\n" for line in
                   ["Derived by chunktune workload from-prometheus",
                    *derived.describe().splitlines()])
    return head + yaml.safe_dump(derived.profile.to_dict(), sort_keys=False,
                                 default_flow_style=None, width=99)


def from_prometheus(url: str, selector: str, window: float, *, at: float | None = None,
                    peak_window: float | None = None,
                    long_threshold: float = LONG_PROMPT_TOKENS, rate_from: str = "mean",
                    duration: float = 300.0, warmup: float | None = None, seed: int = 0,
                    name: str | None = None, timeout: float = 30.0) -> DerivedWorkload:
    """Query and derive (blocking). Raises :class:`WorkloadUnavailable`, or ``ValueError``
    for a selector that does not parse."""
    client = PrometheusClient(url, timeout=timeout)
    try:
        obs = client.observe_workload(selector, window, at=at, peak_window=peak_window)
    finally:
        asyncio.run(client.close())
    return derive_profile(obs, long_threshold=long_threshold, rate_from=rate_from,
                          duration=duration, warmup=warmup, seed=seed, name=name)


def main_from_prometheus(a: argparse.Namespace, out: IO[str] | None = None,
                         err: IO[str] | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    try:
        LabelSelector.parse(a.selector)
        window = parse_duration(a.window, "--window")
        peak = parse_duration(a.peak_window, "--peak-window") if a.peak_window else None
        duration = parse_duration(a.duration, "--duration")
        warmup = parse_duration(a.warmup, "--warmup") if a.warmup else None
        at = parse_time(a.at) if a.at else None
        if window <= 0:
            raise SpecError("must be > 0", field="--window")
        bounded(a.timeout, "--timeout", low=0, low_open=True, high=MAX_TIMEOUT_S)
        bounded(a.long_prompt_tokens, "--long-prompt-tokens", low=1, high=MAX_TOKENS)
    except ValueError as e:
        problems = e.problems if isinstance(e, SpecError) else [("--selector", str(e))]
        for path, message in problems:
            print(f"error: {path} {message}", file=err)
        return 2
    try:
        derived = from_prometheus(a.url, a.selector, window, at=at, peak_window=peak,
                                  long_threshold=a.long_prompt_tokens, rate_from=a.rate,
                                  duration=duration, warmup=warmup, seed=a.seed, name=a.name,
                                  timeout=a.timeout)
    except WorkloadUnavailable as e:
        print(f"error: {e}", file=err)
        return 1
    text = profile_yaml(derived)
    if a.out:
        Path(a.out).write_text(text)
        print(derived.describe(), file=out)
        print(f"wrote {a.out}", file=out)
    else:
        print(derived.describe(), file=err)
        out.write(text)
    return 0


def register(subparsers: Any) -> None:
    """Add ``workload from-prometheus``."""
    w = subparsers.add_parser("workload", help="workload profiles from what a deployment serves",
                              description="Workload profiles from what a deployment serves.")
    sub = w.add_subparsers(dest="workload_cmd", required=True, metavar="COMMAND")
    p = sub.add_parser(
        "from-prometheus", help="derive a profile from vLLM's metrics in Prometheus",
        description="Derive a workload profile from a running vLLM deployment's own metrics "
                    "in Prometheus: the arrival rate and its peak, prompt and output length "
                    "distributions (from the vllm:request_prompt_tokens and "
                    "vllm:request_generation_tokens histograms) and the share of long prompts.")
    p.add_argument("--url", required=True, help="Prometheus base URL, e.g. "
                                                "http://prometheus.monitoring:9090")
    p.add_argument("--selector", required=True,
                   help='label matchers of the deployment\'s series, e.g. '
                        '\'{model_name="meta-llama/Llama-3.1-8B-Instruct"}\'')
    p.add_argument("--window", default="24h", help="how far back to look (default: 24h)")
    p.add_argument("--at", help="the window's end: Unix seconds or RFC 3339 (default: now)")
    p.add_argument("--peak-window", metavar="DURATION",
                   help="the stretch the peak rate is measured over (default: an eighth of "
                        "the window, 10s to 5m)")
    p.add_argument("--long-prompt-tokens", type=float, default=LONG_PROMPT_TOKENS,
                   metavar="N", help="prompts above this are the long class (moved to the "
                                     f"nearest bucket bound; default: {LONG_PROMPT_TOKENS})")
    p.add_argument("--rate", choices=("mean", "peak"), default="mean",
                   help="the arrival rate the profile replays (default: mean)")
    p.add_argument("--duration", default="5m", help="the profile's duration (default: 5m)")
    p.add_argument("--warmup", help="the profile's warm-up (default: 30s, or a tenth of a "
                                    "shorter duration)")
    p.add_argument("--seed", type=int, default=0, help="the profile's seed (default: 0)")
    p.add_argument("--name", help="the profile's name (default: from the selector)")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds per Prometheus query (default: 30)")
    p.add_argument("--out", metavar="FILE",
                   help="write the profile here (default: stdout; the summary goes to stderr)")
    p.set_defaults(func=main_from_prometheus)


__all__ = ["from_prometheus", "main_from_prometheus", "parse_time", "profile_yaml",
           "register"]
