"""Does tuning on the traffic you serve matter? Tune on a trace, and on its synthetic twin.

Usage: ``python bench/trace_tuning.py [--trace CSV] [--start 0] [--end 600] [--speedup 1]
[--trials 20] [--seeds 0 1 2]``.

The quickstart's question (``examples/quickstart.yaml``: a simulated Llama-3.1-8B on one H100;
the lowest chat p99 TTFT while chat's p99 ITL stays <= 60 ms, long prompts get their first
token within 3 s and errors stay <= 1 %), tuned twice with the same search space, budget,
sampler and seed, on:

1. **the trace**: the Azure LLM inference conversation trace (2023; ``../shared/data/traces``,
   CC-BY 4.0, "Azure LLM inference trace 2023, Microsoft"), a window of it replayed at its
   recorded arrival times (divided by ``--speedup``: the same requests at a multiple of the
   rate), rows split into ``chat`` (prompts up to 2048 tokens) and ``long-context`` (the
   rest);
2. **its synthetic twin**: a profile with the trace's mean rate (Poisson arrivals), class
   shares and, per class, the mean and standard deviation of the prompt and output lengths
   (lognormal, clipped to the class's range in the trace).

Then the trace is replayed under each study's best configuration (and vLLM's defaults), and
the script prints each one's result on the trace: does tuning on the synthetic profile find the
trace's optimum, and how far off is its answer when the real traffic comes? ``--seeds`` repeats
both studies with other sampler seeds (and synthetic draws). Simulated figures, not
measurements of a GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from chunktune.api.reader import parse_manifest
from chunktune.backends.simulated import SimulatedBackend
from chunktune.core.flags import flags_line
from chunktune.core.workload import Profile, generate
from chunktune.tuning.results.model import collect
from chunktune.tuning.tuner import Tuner

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "data" / "traces" / "azure-2023-splitwise_conv.csv"
CHAT_MAX_PROMPT = 2048
METRICS = ("chat.ttft_p99", "chat.itl_p99", "long-context.ttft_p99", "error_rate")


def manifest(workload: dict[str, Any], name: str, trials: int, seed: int) -> dict[str, Any]:
    m = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    m["metadata"]["name"] = name
    m["spec"]["workload"] = workload
    m["spec"]["budget"]["maxTrials"] = trials
    m["spec"]["sampler"]["seed"] = seed
    return m


def trace_workload(trace: Path, start: float, end: float, speedup: float) -> dict[str, Any]:
    return {"trace": {"file": trace.name, "format": "azure", "start": int(start),
                      "end": int(end), "speedup": speedup, "classes": [
                          {"name": "chat", "maxPromptTokens": CHAT_MAX_PROMPT},
                          {"name": "long-context"}]},
            "warmup": "30s"}


def moments(values: list[int]) -> tuple[float, float, int, int]:
    return statistics.fmean(values), statistics.pstdev(values), min(values), max(values)


def lognormal(values: list[int]) -> dict[str, Any]:
    """A lognormal with the values' mean and standard deviation, clipped to their range."""
    mean, std, lo, hi = moments(values)
    return {"dist": "lognormal", "mean": mean, "sigma": math.sqrt(math.log(1 + (std / mean) ** 2)),
            "min": lo, "max": hi}


def synthetic_twin(trace: Profile, seed: int) -> dict[str, Any]:
    """The synthetic profile of the trace's mean rate, class shares and per-class length
    moments."""
    specs = generate(trace)
    classes = []
    for k, c in enumerate(trace.classes):
        mine = [s for s in specs if s.cls == k]
        classes.append({"name": c.name, "weight": len(mine) / len(specs), "api": c.api,
                        "prompt_tokens": lognormal([s.prompt_tokens for s in mine]),
                        "output_tokens": lognormal([s.output_tokens for s in mine])})
    return {"inline": {"name": "azure-conv-synthetic", "description": "the trace's moments",
                       "arrival": {"mode": "poisson", "rate": len(specs) / trace.duration},
                       "duration": trace.duration, "warmup": trace.warmup, "seed": seed,
                       "classes": classes}}


def describe(profile: Profile) -> str:
    specs = generate(profile)
    out = [f"{len(specs)} requests in {profile.duration:g} s ({len(specs) / profile.duration:.2f}"
           " req/s)"]
    for k, c in enumerate(profile.classes):
        mine = [s for s in specs if s.cls == k]
        p, o = moments([s.prompt_tokens for s in mine]), moments([s.output_tokens for s in mine])
        out.append(f"{c.name} {len(mine) / len(specs):.0%}: prompt {p[0]:.0f}+-{p[1]:.0f} "
                   f"[{p[2]}-{p[3]}], output {o[0]:.0f}+-{o[1]:.0f}")
    return "; ".join(out)


def tune(m: dict[str, Any], base_dir: Path) -> tuple[Tuner, dict[str, Any], bool]:
    """Run a study; its tuner, its best trial's parameters and whether that one met the
    constraints (when none did: the completed trial that missed them by the least)."""
    tuning = parse_manifest(m, base_dir)
    with tempfile.TemporaryDirectory() as d:
        tuner = Tuner(tuning, SimulatedBackend(), str(Path(d) / "s.journal"))
        asyncio.run(tuner.run())
        res = collect(tuner.study, tuner.objectives, tuner.constraints)
    best = res.configuration(res.best)
    if best is not None:
        return tuner, dict(best.params), True
    done = [t for t in res.trials if t.state == "COMPLETE"]
    if not done:
        raise SystemExit(f"{m['metadata']['name']}: no trial completed")
    least = min(done, key=lambda t: sum(max(0.0, c.violation(t.metrics))
                                        for c in tuner.constraints))
    return tuner, dict(least.params), False


def on_trace(trace_tuner: Tuner, params: dict[str, Any]) -> dict[str, Any]:
    """The trace replayed under ``params``: its metrics and the constraints it misses."""
    r = SimulatedBackend().run_sync(trace_tuner.plan(0, params))
    missed = [c.key for c in trace_tuner.constraints if c.violation(r.metrics) > 0] \
        if r.state == "COMPLETE" else [r.reason or r.state]
    return {"state": r.state, "metrics": r.metrics, "missed": missed}


def fmt(v: float | None, key: str) -> str:
    if v is None:
        return "-"
    return f"{v:.1%}" if key == "error_rate" else f"{v * 1e3:,.0f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=TRACE,
                    help="an Azure-format trace (default: the conversation trace in "
                         "../shared/data/traces)")
    ap.add_argument("--start", type=float, default=0.0, help="window start, trace seconds")
    ap.add_argument("--end", type=float, default=600.0, help="window end, trace seconds")
    ap.add_argument("--speedup", type=float, default=1.0,
                    help="replay the window this many times faster (a busier engine)")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = ap.parse_args()
    if not args.trace.is_file():
        sys.exit(f"no trace at {args.trace}")
    base = args.trace.resolve().parent
    t0 = time.perf_counter()
    for seed in args.seeds:
        trace_m = manifest(trace_workload(args.trace, args.start, args.end, args.speedup),
                           "trace", args.trials, seed)
        trace_profile = parse_manifest(trace_m, base).spec.workload.resolve()
        synth_m = manifest(synthetic_twin(trace_profile, seed), "synthetic", args.trials, seed)
        synth_profile = parse_manifest(synth_m).spec.workload.resolve()
        print(f"== seed {seed}")
        print(f"trace:     {trace_profile.trace.source if trace_profile.trace else ''}")
        print(f"           {describe(trace_profile)}")
        print(f"synthetic: {describe(synth_profile)}")
        trace_tuner, trace_best, trace_ok = tune(trace_m, base)
        _, synth_best, synth_ok = tune(synth_m, base)
        for label, ok in (("the trace", trace_ok), ("the synthetic profile", synth_ok)):
            if not ok:
                print(f"no trial met the constraints on {label}: its row is the one that "
                      "missed them by the least")
        rows = [("tuned on the trace", trace_best), ("tuned on the synthetic", synth_best),
                ("vLLM defaults", {})]
        results = [(label, params, on_trace(trace_tuner, params)) for label, params in rows]
        print(f"\n{'on the trace':24} {'flags':62} " + " ".join(f"{k:>22}" for k in METRICS)
              + "  constraints")
        for label, params, res in results:
            line = flags_line(params) if params else "(defaults)"
            vals = " ".join(f"{fmt(res['metrics'].get(k), k):>22}" for k in METRICS)
            ok = "met" if not res["missed"] else "missed " + ", ".join(res["missed"])
            print(f"{label:24} {line:62} {vals}  {ok}")
        t, s = results[0][2]["metrics"], results[1][2]["metrics"]
        key = "chat.ttft_p99"
        if key in t and key in s:
            print(f"\nthe synthetic profile's best, replayed on the trace: {key} "
                  f"{fmt(s[key], key)} vs {fmt(t[key], key)} tuned on the trace "
                  f"({s[key] / t[key] - 1:+.0%})"
                  + ("" if not results[1][2]["missed"] else
                     "; and it misses " + ", ".join(results[1][2]["missed"])))
        print()
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
