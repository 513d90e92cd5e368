"""``chunktune sim serve``: the simulated engine behind vLLM's HTTP interface, in real time.

Takes ``vllm serve``'s arguments (``chunktune sim serve MODEL --max-num-batched-tokens 4096
--port 8000 ...``; the engine flags are :mod:`chunktune.sim.args`'), starts the way vLLM does
and serves the OpenAI API (:mod:`chunktune.sim.serving.server`) from the real-time loop
(:mod:`chunktune.sim.serving.realtime`).

Start-up, in vLLM's order:

1. parse and check the arguments; a configuration vLLM refuses at argument validation
   (``ConfigRejected``) fails at once, before any "model load";
2. sleep ``--load-time`` seconds (the model load; 0 allowed);
3. ``build_engine``: memory profiling and KV-cache sizing; an :class:`EngineStartupError`
   prints the lines vLLM logs before it and vLLM's exact error to stderr and exits 1;
4. log the memory plan (``Available KV cache memory``, ``GPU KV cache size: N tokens``,
   ``Maximum concurrency ...``), then bind the port — so ``/health`` cannot answer before the
   engine is ready, and a failed start never opens the port — and log
   ``Starting vLLM API server 0 on http://HOST:PORT`` (the bound port, also for ``--port 0``)
   and ``Application startup complete.``

With ``--enable-logging-iteration-details`` every engine step logs vLLM's ``Iteration(N)`` line
(the simulated step time as its elapsed time; :mod:`chunktune.core.steps` parses it), and the
start-up lines a step log's reader takes the engine's identity from (``Initializing a V1 LLM
engine (vVERSION+chunktune.sim) with config: model='...'``, ``GPU KV cache size: N tokens``).

SIGTERM/SIGINT stop it: in-flight requests are aborted, the loop's per-step Python overhead is
logged, exit status 0. Logs go to stdout (as vLLM's logger does); start-up errors to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time

from aiohttp import web

from chunktune import __version__
from chunktune.core.bounds import MAX_TIMEOUT_S, MAX_TOKENS, bounded
from chunktune.core.engine_args import EngineStartupError, resolve
from chunktune.core.errors import SpecError
from chunktune.core.flags import FLAGS
from chunktune.core.vllm_release import parse_version, scheduler_release
from chunktune.sim.args import add_engine_args, engine_args_from, model_and_gpu, split_unknown
from chunktune.sim.calibration import profile as profiles
from chunktune.sim.engine.memory import GiB
from chunktune.sim.engine.virtual import Engine, build_engine
from chunktune.sim.serving.metrics import VllmMetrics
from chunktune.sim.serving.realtime import DEFAULT_SLACK_S, RealtimeEngine
from chunktune.sim.serving.server import (
    DEFAULT_MAX_TOKENS_CAP,
    HttpLimits,
    ServerConfig,
    create_app,
    guard_request_heads,
)
from chunktune.sim.serving.tokenizer import resolve_tokenizer

DEFAULT_LOAD_TIME_S = 2.0


def register(simsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = simsub.add_parser(
        "serve", help="serve the simulated engine on vLLM's OpenAI-compatible HTTP API",
        description="Run the simulated vLLM engine in real time behind vLLM's HTTP interface "
                    "(/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics).",
        allow_abbrev=False,
    )
    add_engine_args(p, model_positional=True)
    g = p.add_argument_group("server (vllm serve flags)")
    g.add_argument("--host", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    g.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = any free)")
    g.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="model name(s) the API answers to (default: the model as given)")
    g.add_argument("--api-key", nargs="+", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on /v1/* (also $VLLM_API_KEY)")
    g.add_argument("--tokenizer", default=None, metavar="DIR|FILE",
                   help="count prompt tokens with this tokenizer (a directory holding "
                        "tokenizer.json, or the file), as vLLM counts them; default: the model "
                        "directory's, else one token per word")
    g.add_argument("--seed", type=int, default=0,
                   help="random seed (the simulator is deterministic; seeds the request ids)")
    s = p.add_argument_group("simulator only (serve)")
    s.add_argument("--calibration", metavar="PROFILE",
                   help="a calibration profile from `chunktune calibrate`: steps cost what the "
                        "profiled engine's steps cost (its server overhead is not added: this "
                        "server pays its own HTTP costs)")
    s.add_argument("--vllm-version", metavar="VERSION",
                   help="the vLLM whose scheduler runs (0.18, 0.19, 0.23, 0.28 and 0.31 to "
                        "0.34 checked; another runs the nearest older one's, 0.9-0.17 "
                        "0.18's) and whose start-up defaults apply (batch budget and "
                        "sequences, --gpu-memory-utilization, CUDA-graph memory), e.g. 0.33.0 "
                        "(default: the newest checked, 0.34; docs/vllm-versions.md)")
    s.add_argument("--load-time", type=float, default=DEFAULT_LOAD_TIME_S, metavar="SECONDS",
                   help=f"simulated model-load delay before the port opens "
                        f"(default {DEFAULT_LOAD_TIME_S:g}; 0 allowed)")
    s.add_argument("--default-max-tokens", type=int, default=DEFAULT_MAX_TOKENS_CAP,
                   metavar="N",
                   help="cap on chat's default max_tokens (vLLM: max_model_len - prompt; the "
                        f"simulator never hits EOS; default {DEFAULT_MAX_TOKENS_CAP})")
    s.add_argument("--spec-acceptance", type=float, default=None, metavar="P",
                   help="with --speculative-config: the chance each draft token is accepted "
                        "given the ones before it were (0 to 1), for every request (the "
                        "simulator does not read the text; a workload profile gives it per "
                        "class)")
    s.add_argument("--step-slack", type=float, default=DEFAULT_SLACK_S * 1e3, metavar="MS",
                   help="event-loop wake-up lateness absorbed without delaying the next step "
                        f"(default {DEFAULT_SLACK_S * 1e3:g} ms)")
    s.add_argument("--header-timeout", type=float, default=HttpLimits.header_timeout,
                   metavar="SECONDS",
                   help="close a connection whose first request head is not complete this long "
                        f"after connecting, with a 408 (default {HttpLimits.header_timeout:g})")
    s.add_argument("--body-timeout", type=float, default=HttpLimits.body_timeout,
                   metavar="SECONDS",
                   help="answer 408 and close when a request body takes longer to arrive "
                        f"(default {HttpLimits.body_timeout:g})")
    p.set_defaults(func=cmd_serve, parser=p, accepts_unknown=True)


def log(msg: str, level: str = "INFO", where: str = "api_server.py") -> None:
    """A vLLM-style log line on stdout."""
    print(f"{level} {time.strftime('%m-%d %H:%M:%S')} [{where}] {msg}", flush=True)


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _startup_failed(e: EngineStartupError, where: str) -> int:
    ts = time.strftime("%m-%d %H:%M:%S")
    for line in e.preceding:
        _err(f"INFO {ts} [gpu_worker.py] {line}")
    _err(f"ERROR {ts} [{where}] EngineCore failed to start.")
    for line in e.lines:
        _err(line)
    if e.hint:
        _err(f"chunktune: engine start-up failed ({e.reason}): {e.hint}")
    return 1


def cmd_serve(ns: argparse.Namespace, unknown: list[str]) -> int:
    ignored, errors = split_unknown(ns.parser, unknown)
    if errors:
        _err(ns.parser.format_usage().rstrip())
        for e in errors:
            _err(f"{ns.parser.prog}: error: {e}")
        return 2
    if ignored:
        log("the simulator does not model these vLLM flags; ignored: " + " ".join(ignored),
            level="WARNING", where="arg_utils.py")
    try:
        bounded(ns.load_time, "--load-time", low=0, high=MAX_TIMEOUT_S)
        bounded(ns.default_max_tokens, "--default-max-tokens", low=1, high=MAX_TOKENS)
        bounded(ns.step_slack, "--step-slack", low=0, high=MAX_TIMEOUT_S * 1e3)
        for flag, value in (("--header-timeout", ns.header_timeout),
                            ("--body-timeout", ns.body_timeout)):
            bounded(value, flag, low=0, low_open=True, high=MAX_TIMEOUT_S)
        bounded(ns.port, "--port", low=0, high=65535)
        model, gpu = model_and_gpu(ns)
        args = engine_args_from(ns)
        args.check_simulated()
        if ns.spec_acceptance is not None and not 0 <= ns.spec_acceptance <= 1:
            raise SpecError(f"must be from 0 to 1 (got {ns.spec_acceptance:g})",
                            field="--spec-acceptance")
        if (args.speculative_config is not None) != (ns.spec_acceptance is not None):
            raise SpecError("--speculative-config and --spec-acceptance go together: the "
                            "simulated drafts need how often they are accepted",
                            field="--spec-acceptance")
        calib = profiles.read_profile(ns.calibration) if ns.calibration else None
        if calib is not None:
            args = profiles.engine_args(args, calib)
        counter = resolve_tokenizer(ns.tokenizer, ns.model or ns.model_tag, model.vocab_size)
    except SpecError as e:
        for path, msg in e.problems:
            _err(f"error: {path}: {msg}" if path else f"error: {msg}")
        return 2
    model_tag = ns.model or ns.model_tag or model.name
    served = tuple(ns.served_model_name or [model_tag])
    keys = tuple(ns.api_key or ([os.environ["VLLM_API_KEY"]]
                                if os.environ.get("VLLM_API_KEY") else []))
    log(f"vLLM API server version {__version__}+chunktune.sim (simulated engine)")
    set_args = {FLAGS[k].attr: v for k, v in args.point().items()}
    log(f"non-default args: {({'model': model_tag, **set_args})}")
    log(counter.describe(), where="tokenizer.py")
    try:
        resolve(args, model, gpu)  # argument validation fails before the model load, as in vLLM
    except EngineStartupError as e:
        return _startup_failed(e, "api_server.py")
    log(f"Initializing a V1 LLM engine (v{__version__}+chunktune.sim) with config: "
        f"model='{model_tag}', tensor_parallel_size={args.tensor_parallel_size}, "
        f"enable_chunked_prefill={args.enable_chunked_prefill}", where="core.py")
    log(f"Starting to load model {model_tag} ({model.name} on {gpu.name} "
        f"x{args.tensor_parallel_size})...", where="gpu_model_runner.py")
    t0 = time.monotonic()
    if ns.load_time:
        time.sleep(ns.load_time)
    try:
        version = (parse_version(ns.vllm_version, "--vllm-version") if ns.vllm_version
                   else None if calib is None else profiles.fitted_version(calib))
        engine = build_engine(args, model, gpu, version)
        if ns.spec_acceptance is not None:
            engine.acceptance = (ns.spec_acceptance,)
        if calib is not None:
            profiles.apply(engine, calib)
    except EngineStartupError as e:
        return _startup_failed(e, "core.py")
    except SpecError as e:
        for path, msg in e.problems:
            _err(f"error: {path}: {msg}" if path else f"error: {msg}")
        return 2
    log(f"Model loading took {engine.memory.weights / GiB:.4f} GiB and "
        f"{time.monotonic() - t0:.6f} seconds", where="gpu_model_runner.py")
    if engine.cfg.enable_chunked_prefill:  # vLLM's SchedulerConfig line, with the budget
        log(f"Chunked prefill is enabled with max_num_batched_tokens="
            f"{engine.cfg.max_num_batched_tokens}.", where="scheduler.py")
    for w in engine.cfg.warnings:
        log(w, level="WARNING", where="scheduler.py")
    interval = engine.cfg.prefill_schedule_interval
    if interval > 1 and scheduler_release(version).local_prefill_cadence:  # vLLM 0.33's line
        log(f"Prefill cadence: applying prefill_schedule_interval={interval} locally (this "
            "engine is not DP-coordinated); prefill is held until "
            f"{interval} executed steps have passed since the last prefill-carrying step.",
            where="scheduler.py")
    for line in engine.memory.log_lines():
        log(line, where="gpu_worker.py")
    cfg = ServerConfig(served_model_names=served, model_root=model_tag,
                       max_model_len=engine.cfg.max_model_len,
                       vocab_size=model.vocab_size, tokenizer=counter, api_keys=keys,
                       default_max_tokens=ns.default_max_tokens, seed=ns.seed,
                       prefix_block_size=engine.cfg.block_size
                       if engine.cfg.enable_prefix_caching else None)
    try:
        limits = HttpLimits(header_timeout=ns.header_timeout, body_timeout=ns.body_timeout)
        return asyncio.run(_serve(engine, cfg, ns.host, ns.port, ns.step_slack / 1e3, limits,
                                  user_specified_block_size=ns.block_size is not None,
                                  step_log=args.enable_logging_iteration_details))
    except KeyboardInterrupt:  # pragma: no cover - signal handlers normally catch it
        return 0


async def _serve(engine: Engine, cfg: ServerConfig, host: str, port: int, slack: float,
                 limits: HttpLimits, user_specified_block_size: bool = False,
                 step_log: bool = False) -> int:
    metrics = VllmMetrics(engine.cfg, engine.memory, cfg.served_model_names[0],
                          enable_prefix_caching=engine.cfg.enable_prefix_caching,
                          user_specified_block_size=user_specified_block_size)
    rt = RealtimeEngine(engine, metrics, slack=slack,
                        step_log=sys.stdout if step_log else None)
    app = create_app(rt, cfg, metrics, limits)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                           shutdown_timeout=5.0, **limits.runner_kwargs())
    await runner.setup()
    assert runner.server is not None
    guard_request_heads(runner.server, limits.header_timeout)
    site = web.TCPSite(runner, host, port, reuse_address=True)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        _err(f"ERROR {time.strftime('%m-%d %H:%M:%S')} [launcher.py] [Errno {e.errno}] error "
             f"while attempting to bind on address ({host!r}, {port}): {e.strerror}")
        return 1
    addresses = runner.addresses
    bound = int(addresses[0][1]) if addresses else port
    shown = f"[{host}]" if ":" in host else host
    log(f"Starting vLLM API server 0 on http://{shown}:{bound}")
    log("Available routes are: /health, /version, /v1/models, /v1/completions, "
        "/v1/chat/completions, /tokenize, /detokenize, /metrics", where="launcher.py")
    print(f"INFO:     Started server process [{os.getpid()}]", flush=True)
    print("INFO:     Waiting for application startup.", flush=True)
    print("INFO:     Application startup complete.", flush=True)
    print(f"INFO:     Uvicorn running on http://{shown}:{bound} (Press CTRL+C to quit)",
          flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print("INFO:     Shutting down", flush=True)
    await runner.cleanup()
    log("chunktune sim engine loop: " + rt.stats.format(), where="realtime.py")
    print("INFO:     Application shutdown complete.", flush=True)
    return 0
