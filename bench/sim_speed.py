"""How many times faster than real time the simulator replays a 10-minute mixed trace.

Usage: ``python bench/sim_speed.py [--repeat 3] [--rate 8] [--profile mixed] [--kv-bound]
[--prefix-caching] [--model M] [--deepseek-v3] [--budgets 0,2] [--fingerprint]``.
Pins itself to one core, replays ``loadtest/profiles/mixed.yaml`` (8 req/s, 10 minutes) on a
simulated Llama-3.1-8B / H100 at a few budgets (``--deepseek-v3``: DeepSeek-V3, its MLA layers
and 256 experts, FP8, on 8 x H200, from its ``config.json`` in ``bench/data/e2e/model-configs``),
and prints two figures per budget (best of ``--repeat``):

- simulated seconds per CPU second of this process (``time.process_time`` around
  ``Engine.replay``): the simulator's own speed, which other work on the machine changes little;
- simulated seconds per wall second (``time.perf_counter``): what a user waits, which other
  work on a shared machine slows.

It prints the machine's load average (``os.getloadavg``) before and after, so that a wall
figure can be read against it. ``--fingerprint`` adds a digest of each replay's step times and
latencies (exact float bits), to check that a speed-up left the results as they were.
Target: >= 300x.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import struct
import time
from pathlib import Path

from chunktune.core.engine_args import EngineArgs
from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.core.workload import RequestSpec, generate, load_profile
from chunktune.sim.engine.virtual import ReplayResult, build_engine

DEEPSEEK_V3 = Path(__file__).with_name("data") / "e2e" / "model-configs" / \
    "deepseek-ai--DeepSeek-V3_config.json"

CONFIGS = [
    {"max_num_batched_tokens": 2048},
    {"max_num_batched_tokens": 8192},
    {"max_num_batched_tokens": 8192, "long_prefill_token_threshold": 512},
    {"max_num_batched_tokens": 16384, "max_num_seqs": 256},
]


def fingerprint(res: ReplayResult) -> str:
    """A digest of what a replay computed: each step's start, duration, tokens and counts, and
    each request's latencies and inter-token gaps, as exact float bits (a speed-up must leave
    it unchanged)."""
    h = hashlib.sha256()
    st = res.steps
    for col in (st.start, st.duration):
        h.update(struct.pack(f"{len(col)}d", *col))
    for icol in (st.tokens, st.prefill_tokens, st.decodes, st.running, st.waiting,
                 st.kv_used_blocks, st.preempted):
        h.update(struct.pack(f"{len(icol)}q", *icol))
    for r in res.requests:
        h.update(struct.pack("q4d3q", r.rid, r.first_scheduled, r.first_token, r.last_token,
                             r.finish_time, r.num_output, r.num_preemptions, r.status))
        h.update(struct.pack(f"{len(r.itl)}d", *r.itl))
    h.update(struct.pack("dqq", res.end_time, res.num_preemptions, res.peak_kv_blocks))
    return h.hexdigest()[:16]


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} (1/5/15 min) on {os.cpu_count()} cores"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rate", type=float, default=8.0)
    ap.add_argument("--profile", default="mixed",
                    help="the workload profile replayed (loadtest/profiles; default: mixed)")
    ap.add_argument("--kv-bound", action="store_true",
                    help="instead of a profile: 3,000 requests of 200-6,000 prompt and 50-600 "
                         "output tokens at 20 req/s (seed 1), which keep one H100 running "
                         "gpt-oss-120b KV-bound, preempting, with requests waiting to resume")
    ap.add_argument("--prefix-caching", action="store_true",
                    help="--enable-prefix-caching (vLLM's default; the simulator's is off)")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--gpu", default="h100-sxm")
    ap.add_argument("--deepseek-v3", action="store_true",
                    help="DeepSeek-V3 (FP8, MLA, 256 experts) on 8 x H200 instead")
    ap.add_argument("--fingerprint", action="store_true",
                    help="also print a digest of each replay's step times and latencies "
                         "(equal before and after a change that must not alter results)")
    ap.add_argument("--budgets", default=None,
                    help="comma-separated indices of the budgets to run (0-3; default: all)")
    a = ap.parse_args()
    configs = CONFIGS if a.budgets is None else \
        [CONFIGS[int(i)] for i in a.budgets.split(",")]
    model = resolve_model(config_path=DEEPSEEK_V3) if a.deepseek_v3 else resolve_model(a.model)
    gpu, tp = ("h200", 8) if a.deepseek_v3 else (a.gpu, 1)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    if a.kv_bound:
        rng = random.Random(1)
        specs = [RequestSpec(i, i / 20, rng.randint(200, 6000), rng.randint(50, 600), 0)
                 for i in range(3000)]
        name, duration, rate = "kv-bound", 150.0, 20.0
    else:
        profile = load_profile(a.profile).with_overrides(rate=a.rate, duration=600)
        specs = generate(profile)
        name, duration, rate = a.profile, profile.duration, a.rate
    print(f"{name} trace: {len(specs)} requests over {duration:.0f} s at {rate:g} req/s; "
          f"{model.name} on {tp} x {gpu}; one core; best of {a.repeat}")
    print(f"load average before: {load()}")
    print(f"{'config':66} {'steps':>7} {'sim s':>7} {'CPU s':>6} {'x CPU':>6} "
          f"{'wall s':>6} {'x wall':>6}")
    for kw in configs:
        best_cpu = best_wall = float("inf")
        for _ in range(a.repeat):
            eng = build_engine(EngineArgs(max_model_len=32768, tensor_parallel_size=tp,
                                          enable_prefix_caching=a.prefix_caching, **kw),
                               model, resolve_gpu(gpu))
            c0, t0 = time.process_time(), time.perf_counter()
            res = eng.replay(specs)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            best_cpu, best_wall = min(best_cpu, cpu), min(best_wall, wall)
        label = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in kw.items())
        print(f"{label:66} {len(res.steps):>7,} {res.end_time:>7.1f} {best_cpu:>6.2f} "
              f"{res.end_time / best_cpu:>5,.0f}x {best_wall:>6.2f} "
              f"{res.end_time / best_wall:>5,.0f}x"
              + (f"  {fingerprint(res)}" if a.fingerprint else ""))
    print(f"load average after: {load()}")
    print("x CPU: simulated s per CPU s of this process (the simulator's speed); "
          "x wall: per wall s (slowed by other work on the machine)")


if __name__ == "__main__":
    main()
