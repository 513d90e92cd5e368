"""``chunktune sim run``: replay a workload on a simulated engine and print the results table."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from chunktune.core.bounds import MAX_CONCURRENCY, MAX_RATE, MAX_TIMEOUT_S, bounded, rate_bound
from chunktune.core.engine_args import EngineStartupError
from chunktune.core.errors import Problems, SpecError
from chunktune.core.flags import TUNABLE, flags_line
from chunktune.core.steps import write_steps
from chunktune.core.vllm_release import parse_version, scheduler_note
from chunktune.core.workload import (
    Profile,
    generate,
    load_profile,
    openings_note,
    parse_duration,
    trace_profile,
)
from chunktune.sim.args import (
    add_engine_args,
    engine_args_from,
    model_and_gpu,
    split_unknown,
)
from chunktune.sim.calibration import profile as profiles
from chunktune.sim.cost.provenance import provenance
from chunktune.sim.engine.virtual import build_engine, engine_cost, iteration_records, server_cost
from chunktune.sim.report import format_summary, summarize

#: The model ``sim run`` simulates when none is given.
DEFAULT_MODEL = "llama-3.1-8b"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sim = sub.add_parser("sim", help="the vLLM-compatible simulator")
    simsub = sim.add_subparsers(dest="sim_cmd", required=True, metavar="{run,serve}")
    run = simsub.add_parser(
        "run", help="replay a workload in virtual time and print latency/throughput per class",
        description="Replay a workload profile on a simulated vLLM engine (virtual time).",
        allow_abbrev=False,
    )
    add_engine_args(run)
    w = run.add_argument_group("workload")
    w.add_argument("--workload", default="mixed",
                   help="profile file or shipped name (mixed, chat, long-context, rag, smoke); a "
                        "profile file with a trace: mapping replays a trace with options")
    w.add_argument("--trace", metavar="FILE",
                   help="replay this request trace (Azure CSV, Mooncake JSONL or the generic "
                        "CSV/JSONL; docs/traffic.md) at its own arrival times, instead of "
                        "--workload")
    w.add_argument("--duration", help="arrival window, e.g. 600, 90s, 10m (default: profile's)")
    w.add_argument("--warmup", help="requests arriving earlier are not measured")
    w.add_argument("--rate", type=float, help="Poisson arrival rate, req/s")
    w.add_argument("--concurrency", type=int, help="closed loop: requests kept in flight")
    w.add_argument("--seed", type=int, help="workload seed (default: profile's)")
    w.add_argument("--drain-timeout", default="60s",
                   help="how long requests still in flight when arrivals end may take to "
                        "finish before they count as timeouts, as in `chunktune load run` "
                        "(default: 60s)")
    run.add_argument("--vllm-version", metavar="VERSION",
                     help="the vLLM whose scheduler runs (0.18, 0.19, 0.23, 0.28 and 0.31 to "
                          "0.34 checked; another runs the nearest older one's, 0.9-0.17 "
                          "0.18's) and whose start-up defaults apply (batch budget and "
                          "sequences, --gpu-memory-utilization, CUDA-graph memory), e.g. 0.33.0 "
                          "(default: the newest checked, 0.34; docs/vllm-versions.md)")
    run.add_argument("--json", metavar="PATH",
                     help="also write the summary as JSON (the load driver's summary schema, "
                          "plus engine and config)")
    run.add_argument("--steps", metavar="PATH",
                     help="write every engine step as vLLM's iteration log records it "
                          "(--enable-logging-iteration-details), as JSON lines")
    run.add_argument("--raw", action="store_true",
                     help="keep every request record in the JSON summary, as `chunktune load "
                          "run --raw` does")
    run.add_argument("--calibration", metavar="PROFILE",
                     help="a calibration profile from `chunktune calibrate` (its model and "
                          "--gpu): steps cost what the profiled engine's steps cost")
    run.set_defaults(func=cmd_run, parser=run, accepts_unknown=True)
    cal = sub.add_parser(
        "calibrate", help="fit the step-time model to a real engine's step log",
        description="Fit the simulator's step-time model to a real vLLM engine's step log "
                    "(--enable-logging-iteration-details lines, or the .steps.jsonl files the "
                    "backends keep per trial) and write a calibration profile.",
        allow_abbrev=False)
    cal.add_argument("--log", nargs="+", required=True, metavar="FILE",
                     help="vLLM logs or .steps.jsonl files of the same model and device")
    cal.add_argument("--model", help="catalog model the engine served")
    cal.add_argument("--model-config", metavar="PATH",
                     help="the served model's config.json (e.g. the tiny model's)")
    cal.add_argument("--gpu", required=True, help="device the engine ran on (cpu for vLLM's "
                                                  "CPU build)")
    cal.add_argument("--gpu-peer-to-peer", action=argparse.BooleanOptionalAction, default=None,
                     help="whether the node's PCIe GPUs reached each other peer to peer: "
                          "the fitted per-token cost carries that node's all-reduces, and the "
                          "profile records the path and holds an engine to it (default: not "
                          "stated)")
    cal.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    cal.add_argument("--kv-cache-dtype", default="auto",
                     help="the engine's KV cache dtype (its attention terms are fitted as it "
                          "ran them; give the same to `sim run --calibration`)")
    cal.add_argument("--enforce-eager", action="store_true",
                     help="the engine ran without CUDA graphs")
    cal.add_argument("--vllm-version", metavar="VERSION",
                     help="the engine's vLLM release (default: the one its logs name, else "
                          "the newest checked)")
    cal.add_argument("--server-overhead", type=float, metavar="SECONDS",
                     help="measured per-request time before the first token beyond the "
                          "prefill steps (HTTP, tokenization), kept in the profile")
    cal.add_argument("--step-gap", type=float, default=0.0, metavar="SECONDS",
                     help="measured wall time between steps beyond vLLM's iteration elapsed "
                          "time (output processing), kept in the profile")
    cal.add_argument("--out", required=True, metavar="PROFILE", help="profile JSON to write")
    cal.set_defaults(func=cmd_calibrate)
    try:
        from chunktune.sim.serving import cli as serve
    except ImportError:  # pragma: no cover - serve needs the server extras
        return
    serve.register(simsub)


def cmd_run(ns: argparse.Namespace, unknown: list[str]) -> int:
    ignored, errors = split_unknown(ns.parser, unknown)
    if errors:
        for e in errors:
            print(f"{ns.parser.prog}: error: {e}", file=sys.stderr)
        return 2
    for flag in ignored:
        print(f"WARNING: {flag} is a vLLM flag the simulator does not model; ignored",
              file=sys.stderr)
    if not (ns.model or ns.model_config):
        ns.model = DEFAULT_MODEL
    problems = Problems()
    collect = problems.attempt
    mg = collect(model_and_gpu, ns)
    args = collect(engine_args_from, ns)
    if args is not None:
        collect(args.check_simulated)
    profile = collect(trace_profile, ns.trace) if ns.trace else \
        collect(load_profile, ns.workload)
    drain = collect(parse_duration, ns.drain_timeout, "--drain-timeout")
    if ns.rate is not None:
        collect(bounded, ns.rate, "--rate", low=0, low_open=True, high=MAX_RATE)
    if ns.concurrency is not None:
        collect(bounded, ns.concurrency, "--concurrency", low=1, high=MAX_CONCURRENCY,
                integral=True)
    version = collect(parse_version, ns.vllm_version, "--vllm-version") \
        if ns.vllm_version else None
    duration = collect(parse_duration, ns.duration, "--duration") if ns.duration else None
    warmup = collect(parse_duration, ns.warmup, "--warmup") if ns.warmup else None
    if profile is not None and not problems:
        profile = collect(_overrides, profile, duration, warmup, ns)
    if profile is not None and not problems and profile.warmup >= profile.duration:
        problems.append(("--warmup", f"must be shorter than --duration "
                         f"({profile.warmup:g}s >= {profile.duration:g}s)"))
    if profile is not None and not problems and profile.trace is None:
        collect(rate_bound, profile.arrival.rate, profile.duration,
                "--rate" if ns.rate is not None else
                "--duration" if duration is not None else "--workload")
    if problems or mg is None or profile is None or drain is None:  # attempt() said why
        for path, msg in problems:
            print(f"error: {path}: {msg}" if path else f"error: {msg}", file=sys.stderr)
        return 2
    assert mg is not None and args is not None and profile is not None and drain is not None
    model, gpu = mg
    calib = None
    if ns.calibration:
        try:
            calib = profiles.read_profile(ns.calibration)
        except SpecError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        args = profiles.engine_args(args, calib)
        version = version or profiles.fitted_version(calib)
    try:
        engine = build_engine(args, model, gpu, version)
        engine.use_acceptance(profile)
        if calib is not None:
            profiles.apply(engine, calib)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except EngineStartupError as e:
        for line in e.preceding:
            print(f"INFO {line}", file=sys.stderr)
        for line in e.lines:
            print(line, file=sys.stderr)
        if e.hint:
            print(f"chunktune: engine start-up failed ({e.reason}): {e.hint}", file=sys.stderr)
        return 1
    for w in engine.cfg.warnings:
        print(f"WARNING {w}", file=sys.stderr)
    note = openings_note(profile, engine.cfg.enable_prefix_caching)
    if note:
        print(f"WARNING {note}", file=sys.stderr)
    for line in engine.memory.log_lines()[1:]:
        print(f"INFO {line}", file=sys.stderr)
    if profile.trace is not None:
        print(f"INFO replaying {profile.trace.source}", file=sys.stderr)
        for note in profile.trace.notes:
            print(f"WARNING {note}", file=sys.stderr)
    specs = generate(profile)
    t0 = time.perf_counter()
    server = server_cost(calib.server_overhead_s if calib is not None else None)
    result = engine.replay_profile(specs, profile, drain, server_overhead_s=server.fixed_s,
                                   server_per_token_s=server.per_prompt_token_s,
                                   log_iterations=bool(ns.steps))
    wall = time.perf_counter() - t0
    summary: dict[str, Any] = summarize(engine, result, profile,
                                        deliver=profiles.delivery(calib, profile.seed),
                                        include_raw=ns.raw)
    summary["model"] = model.name
    summary["gpu"] = gpu.name
    summary["cost_model"] = provenance(gpu, engine.cfg.model)  # as loaded (--quantization)
    summary["workload"] = profile.name
    summary["wall_seconds"] = wall
    summary["scheduler"] = scheduler_note(version)
    print(f"{model.name} on {gpu.name} x{engine.cfg.tensor_parallel_size}, workload "
          f"{profile.name} ({profile.duration:g}s, warm-up {profile.warmup:g}s); flags: "
          + flags_line({k: v for k, v in engine.cfg.flags().items()
                        if k in TUNABLE or k in args.point()}))
    print(f"cost model: {summary['cost_model']}")
    print(f"scheduler: {summary['scheduler']}")
    print(format_summary(summary))
    print(f"(replayed in {wall:.2f} s wall, {result.end_time / max(wall, 1e-9):,.0f}x real time)")
    if ns.json:
        Path(ns.json).write_text(json.dumps(summary, indent=2) + "\n")
    if ns.steps:
        write_steps(ns.steps, iteration_records(engine, result))
    return 0


def _overrides(profile: Profile, duration: float | None, warmup: float | None,
               ns: argparse.Namespace) -> Profile:
    try:
        return profile.with_overrides(duration=duration, warmup=warmup, rate=ns.rate,
                                      concurrency=ns.concurrency, seed=ns.seed)
    except SpecError as e:  # a trace refuses --rate and --concurrency
        raise SpecError([(f"--{p}", m) for p, m in e.problems]) from e


def cmd_calibrate(ns: argparse.Namespace, unknown: list[str] | None = None) -> int:
    """``chunktune calibrate``: fit the step-time model to step logs, write the profile."""
    from chunktune.core.engine_args import EngineArgs, EngineStartupError, resolve
    from chunktune.core.gpus import resolve_gpu, with_peer_to_peer
    from chunktune.core.models import resolve_model
    try:
        bounded(ns.tensor_parallel_size, "--tensor-parallel-size", low=1, high=64)
        if ns.server_overhead is not None:
            bounded(ns.server_overhead, "--server-overhead", low=0, high=MAX_TIMEOUT_S)
        bounded(ns.step_gap, "--step-gap", low=0, high=MAX_TIMEOUT_S)
        model = resolve_model(ns.model, ns.model_config)
        gpu = with_peer_to_peer(resolve_gpu(ns.gpu), ns.gpu_peer_to_peer, "--gpu-peer-to-peer")
        declared = ns.model or model.name
        logs = profiles.load_logs(ns.log, model, declared)
        budget = max(max(s.tokens for s in log.steps) for log in logs)
        version = (parse_version(ns.vllm_version, "--vllm-version") if ns.vllm_version
                   else profiles.logs_version(logs))
        # the terms the profile's scales multiply are the engine's as it ran: its KV cache,
        # graphs or not, release (what `sim run --calibration` with the same flags prices)
        cfg = resolve(EngineArgs(tensor_parallel_size=ns.tensor_parallel_size,
                                 kv_cache_dtype=ns.kv_cache_dtype,
                                 enforce_eager=ns.enforce_eager), model, gpu, version)
        cost = engine_cost(cfg, max_tokens=max(budget, 16))
        fit = profiles.fit_logs(logs, cost)
        prof = profiles.build_profile(ns.log, logs, fit, cost, model, gpu.name,
                                      ns.tensor_parallel_size, ns.server_overhead,
                                      ns.step_gap, engine=True)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except EngineStartupError as e:
        print(f"error: vLLM would refuse this configuration ({e.reason}): {e.message}",
              file=sys.stderr)
        return 2
    profiles.write_profile(ns.out, prof)
    c = prof.coefficients
    print(f"calibrated {model.name} on {gpu.name} from {prof.fitted_on['steps']} steps in "
          f"{len(ns.log)} file(s) (vLLM {prof.fitted_on['vllm_version'] or 'version unknown'})")
    print("  coefficients: " + ", ".join(f"{k} {v:.3g}" for k, v in c.items()))
    print(f"  step error: median {fit.median_rel_err:.1%}, p90 {fit.p90_rel_err:.1%}, total "
          f"{fit.total_ratio - 1:+.1%} in sample; median "
          f"{fit.cross_validated_median_rel_err:.1%}, total "
          f"{fit.cross_validated_total_ratio - 1:+.1%} cross-validated (5-fold)")
    print(f"wrote {ns.out}")
    return 0
