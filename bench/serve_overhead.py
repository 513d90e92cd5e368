"""Served simulator vs virtual time: per-step Python overhead and latency agreement.

Usage::

    python bench/serve_overhead.py [--workload smoke] [--duration S] [--model llama-3.1-8b]
                                   [--gpu h100-sxm] [-- ENGINE FLAGS...]

Starts ``chunktune sim serve`` in a subprocess (127.0.0.1, ephemeral port, no load delay),
replays the workload's requests over HTTP with an aiohttp client — each sent at its arrival
time as a streaming ``/v1/completions`` request whose prompt is token ids (so the prompt
length is exact), ``max_tokens`` = the spec's output tokens — and replays the same specs with
``Engine.replay`` in virtual time. Prints:

- the engine loop's Python work per step (schedule + cost model + apply + token push + metrics;
  median, p99) against the simulated step time, and the event loop's wake-up lateness
  (from the server's ``GET /sim/stats``);
- TTFT / ITL / E2E p50 and p90, served (measured by the client: from just before the request
  is sent to each SSE token event) vs virtual, and the relative difference of the p50s.

The tests (``tests/sim/serving/test_agreement.py``) reuse :func:`replay_http`,
:func:`start_server` and :func:`virtual_latencies`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from chunktune.core.workload import RequestSpec, generate, load_profile
from chunktune.sim.engine.virtual import build_engine

ROOT = Path(__file__).resolve().parents[1]
_READY = re.compile(r"Uvicorn running on (http://\S+)")


# ---- the server ----------------------------------------------------------------------------


class ServerProc:
    """A ``chunktune sim serve`` subprocess; its output is collected in :attr:`lines`."""

    def __init__(self, args: list[str], timeout: float = 60.0) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT / "operator"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "chunktune", "sim", "serve", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: list[str] = []
        self.url = ""
        ready = threading.Event()

        def pump() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(line.rstrip("\n"))
                m = _READY.search(line)
                if m:
                    self.url = m.group(1)
                    ready.set()
            ready.set()

        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()
        if not ready.wait(timeout) or not self.url:
            self.stop()
            raise RuntimeError("chunktune sim serve did not start:\n" + "\n".join(self.lines))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._pump.join(5)
        return self.proc.returncode

    def __enter__(self) -> ServerProc:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def start_server(model: str, engine_flags: list[str], *, extra: list[str] | None = None,
                 timeout: float = 60.0) -> ServerProc:
    return ServerProc([model, "--host", "127.0.0.1", "--port", "0", "--load-time", "0",
                       *engine_flags, *(extra or [])], timeout=timeout)


# ---- the client ----------------------------------------------------------------------------


@dataclass
class ClientRecord:
    """One replayed request as the client saw it (``loop.time()`` seconds)."""

    rid: int
    sent: float = -1.0
    token_times: list[float] = field(default_factory=list)
    end: float = -1.0
    usage: dict[str, Any] | None = None
    error: str | None = None

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.sent

    @property
    def e2e(self) -> float:
        return self.token_times[-1] - self.sent

    @property
    def itl(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in itertools.pairwise(t)]


_JSON = {"Content-Type": "application/json"}


async def _send(session: aiohttp.ClientSession, url: str, data: bytes,
                rec: ClientRecord) -> None:
    """Send an encoded body; the clock starts just before it is handed to aiohttp."""
    loop = asyncio.get_running_loop()
    try:
        rec.sent = loop.time()
        async with session.post(url, data=data, headers=_JSON) as resp:
            if resp.status != 200:
                rec.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                return
            async for line in resp.content:
                if not line.startswith(b"data: "):
                    continue
                now = loop.time()
                payload = line[6:].strip()
                if payload == b"[DONE]":
                    break
                obj = json.loads(payload)
                choices = obj.get("choices")
                if choices and choices[0].get("text"):
                    rec.token_times.append(now)
                if obj.get("usage"):
                    rec.usage = obj["usage"]
        rec.end = loop.time()
    except (aiohttp.ClientError, TimeoutError) as e:
        rec.error = repr(e)


async def replay_http(base_url: str, specs: list[RequestSpec], model: str | None = None,
                      *, start_delay: float = 0.2) -> list[ClientRecord]:
    """Send each spec at ``start + spec.arrival`` as a streaming completions request with a
    token-id prompt of exactly ``spec.prompt_tokens`` ids; wait for all to finish."""
    loop = asyncio.get_running_loop()
    url = base_url.rstrip("/") + "/v1/completions"
    records = [ClientRecord(s.rid) for s in specs]
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=300)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        t0 = loop.time() + start_delay

        async def one(spec: RequestSpec, rec: ClientRecord) -> None:
            body: dict[str, Any] = {
                "prompt": [1000 + (spec.rid * 7919 + i) % 30000
                           for i in range(spec.prompt_tokens)],
                "max_tokens": spec.output_tokens, "min_tokens": spec.output_tokens,
                "ignore_eos": True, "temperature": 0.0, "stream": True,
                "stream_options": {"include_usage": True},
            }
            if model:
                body["model"] = model
            data = json.dumps(body).encode()
            delay = t0 + (spec.arrival or 0.0) - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await _send(session, url, data, rec)

        await asyncio.gather(*(one(s, r) for s, r in zip(specs, records, strict=True)))
    return records


# ---- comparison ----------------------------------------------------------------------------


def virtual_latencies(model: str, gpu: str, engine_flags: list[str],
                      specs: list[RequestSpec]) -> dict[str, list[float]]:
    """TTFT/ITL/E2E samples of ``Engine.replay`` for the same engine flags and specs."""
    from chunktune.sim.args import engine_args_from, model_and_gpu
    from chunktune.sim.cli import register

    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    register(sub)
    ns, _ = p.parse_known_args(["sim", "serve", model, "--gpu", gpu, *engine_flags])
    m, g = model_and_gpu(ns)
    engine = build_engine(engine_args_from(ns), m, g)
    result = engine.replay(specs)
    ttft, itl, e2e = [], [], []
    for r in result.requests:
        if r.first_token < 0:
            continue
        ttft.append(r.first_token - r.arrival)
        e2e.append(r.last_token - r.arrival)
        itl.extend(r.itl)
    return {"ttft": ttft, "itl": itl, "e2e": e2e}


def served_latencies(records: list[ClientRecord]) -> dict[str, list[float]]:
    ok = [r for r in records if r.error is None and r.token_times]
    return {"ttft": [r.ttft for r in ok], "itl": [x for r in ok for x in r.itl],
            "e2e": [r.e2e for r in ok]}


def compare(served: dict[str, list[float]],
            virtual: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """p50/p90 of each metric, served and virtual, and the p50's relative difference."""
    out: dict[str, dict[str, float]] = {}
    for k in ("ttft", "itl", "e2e"):
        s50, s90 = np.percentile(served[k], (50, 90))
        v50, v90 = np.percentile(virtual[k], (50, 90))
        out[k] = {"served_p50": float(s50), "virtual_p50": float(v50),
                  "served_p90": float(s90), "virtual_p90": float(v90),
                  "rel_diff_p50": float(s50 / v50 - 1.0)}
    return out


async def _stats(base_url: str) -> tuple[dict[str, float], str]:
    async with aiohttp.ClientSession() as s:
        async with s.get(base_url + "/sim/stats") as r:
            data: dict[str, float] = await r.json()
        async with s.get(base_url + "/metrics") as r:
            return data, await r.text()


def _server_mean(metrics_text: str, family: str) -> float:
    """Mean of one of the server's histograms (sum / count)."""
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(metrics_text):
        if fam.name == family:
            v = {x.name.rsplit("_", 1)[1]: x.value for x in fam.samples
                 if x.name.endswith(("_sum", "_count"))}
            return v["sum"] / v["count"] if v.get("count") else float("nan")
    return float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="smoke", help="profile name or file (default smoke)")
    ap.add_argument("--duration", type=float, help="override the profile's duration (s)")
    ap.add_argument("--rate", type=float, help="override the profile's arrival rate (req/s)")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--gpu", default="h100-sxm")
    ap.add_argument("engine_flags", nargs="*", help="vllm serve flags (after --)")
    a = ap.parse_args()
    profile = load_profile(a.workload).with_overrides(duration=a.duration, rate=a.rate)
    specs = generate(profile)
    flags = ["--gpu", a.gpu, *a.engine_flags]
    print(f"{a.model} on {a.gpu} {' '.join(a.engine_flags)}; workload {profile.name}: "
          f"{len(specs)} requests over {profile.duration:g} s")
    with start_server(a.model, flags) as srv:
        t0 = time.perf_counter()
        records = asyncio.run(replay_http(srv.url, specs))
        wall = time.perf_counter() - t0
        stats, metrics_text = asyncio.run(_stats(srv.url))
    errors = [r for r in records if r.error]
    print(f"served replay: {wall:.1f} s wall, {len(records) - len(errors)} ok, "
          f"{len(errors)} failed" + (f" (first: {errors[0].error})" if errors else ""))
    print(f"engine loop: {stats['steps']:.0f} steps; Python overhead per step median "
          f"{stats['overhead_p50'] * 1e6:.1f} us, p99 {stats['overhead_p99'] * 1e6:.1f} us; "
          f"simulated step median {stats['step_time_p50'] * 1e3:.2f} ms, p99 "
          f"{stats['step_time_p99'] * 1e3:.2f} ms; overhead/step time "
          f"{stats['overhead_mean'] / stats['step_time_mean']:.2%} (means)")
    print(f"event-loop wake-up lateness median {stats['lateness_p50'] * 1e3:.2f} ms, p99 "
          f"{stats['lateness_p99'] * 1e3:.2f} ms, max {stats['max_lateness'] * 1e3:.1f} ms; "
          f"{stats['late_steps']:.0f} steps started late")
    virtual = virtual_latencies(a.model, a.gpu, a.engine_flags, specs)
    served = served_latencies(records)
    cmp = compare(served, virtual)
    print(f"{'metric':6} {'served p50':>11} {'virtual p50':>12} {'diff':>7} "
          f"{'served p90':>11} {'virtual p90':>12}")
    for k, d in cmp.items():
        print(f"{k:6} {d['served_p50'] * 1e3:9.2f}ms {d['virtual_p50'] * 1e3:10.2f}ms "
              f"{d['rel_diff_p50']:+7.1%} {d['served_p90'] * 1e3:9.2f}ms "
              f"{d['virtual_p90'] * 1e3:10.2f}ms")
    print("mean TTFT: client {:.2f} ms, server (vllm:time_to_first_token_seconds, from frontend "
          "arrival) {:.2f} ms, virtual {:.2f} ms".format(
              1e3 * float(np.mean(served["ttft"])),
              1e3 * _server_mean(metrics_text, "vllm:time_to_first_token_seconds"),
              1e3 * float(np.mean(virtual["ttft"]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
