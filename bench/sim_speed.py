"""How many times faster than real time the simulator replays a 10-minute mixed trace.

Usage: ``python bench/sim_speed.py [--repeat 3] [--rate 8] [--deepseek-v3]``. Pins itself to
one core, replays ``loadtest/profiles/mixed.yaml`` (8 req/s, 10 minutes) on a simulated
Llama-3.1-8B / H100 at a few budgets (``--deepseek-v3``: DeepSeek-V3, its MLA layers and 256
experts, FP8, on 8 x H200, from its ``config.json`` in ``bench/data/e2e/model-configs``), and
prints simulated seconds / wall seconds (best of ``--repeat``). Target: >= 300x.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from chunktune.core.engine_args import EngineArgs
from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.core.workload import generate, load_profile
from chunktune.sim.engine.virtual import build_engine

DEEPSEEK_V3 = Path(__file__).with_name("data") / "e2e" / "model-configs" / \
    "deepseek-ai--DeepSeek-V3_config.json"

CONFIGS = [
    {"max_num_batched_tokens": 2048},
    {"max_num_batched_tokens": 8192},
    {"max_num_batched_tokens": 8192, "long_prefill_token_threshold": 512},
    {"max_num_batched_tokens": 16384, "max_num_seqs": 256},
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rate", type=float, default=8.0)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--gpu", default="h100-sxm")
    ap.add_argument("--deepseek-v3", action="store_true",
                    help="DeepSeek-V3 (FP8, MLA, 256 experts) on 8 x H200 instead")
    a = ap.parse_args()
    model = resolve_model(config_path=DEEPSEEK_V3) if a.deepseek_v3 else resolve_model(a.model)
    gpu, tp = ("h200", 8) if a.deepseek_v3 else (a.gpu, 1)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    profile = load_profile("mixed").with_overrides(rate=a.rate, duration=600)
    specs = generate(profile)
    print(f"mixed trace: {len(specs)} requests over {profile.duration:.0f} s at {a.rate:g} req/s; "
          f"{model.name} on {tp} x {gpu}; one core; best of {a.repeat}")
    print(f"{'config':66} {'steps':>7} {'sim s':>7} {'wall s':>7} {'x real time':>11}")
    for kw in CONFIGS:
        best = float("inf")
        for _ in range(a.repeat):
            eng = build_engine(EngineArgs(max_model_len=32768, tensor_parallel_size=tp, **kw),
                               model, resolve_gpu(gpu))
            t0 = time.perf_counter()
            res = eng.replay(specs)
            best = min(best, time.perf_counter() - t0)
        label = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in kw.items())
        print(f"{label:66} {len(res.steps):>7,} {res.end_time:>7.1f} {best:>7.2f} "
              f"{res.end_time / best:>10,.0f}x")


if __name__ == "__main__":
    main()
