"""End-to-end fidelity: real vLLM serving runs replayed through the simulator.

Two sets of measured runs, each replayed as its client ran it:

- **AIConfigurator's silicon runs** (``silicon-e2e.csv``, Apache-2.0, NVIDIA): vLLM served on
  H100/H200/B200, closed loop: ``concurrency`` requests in flight, every request exactly ``isl``
  prompt and ``osl`` output tokens, the client's mean TTFT and TPOT. Engine flags beyond TP and
  precision were not recorded: the replay takes the defaults of the row's vLLM version (of the
  current one where the row names none).
- **LLMServingSim's vLLM 0.19 runs** (RTX 4090, RTX PRO 6000; MIT, CASYS Lab at KAIST): an
  offline engine with timed injection, open loop, engine-side timestamps (no server cost),
  replayed by :func:`chunktune.sim.calibration.fidelity.simulate_run`.

How the closed-loop client is modelled (:func:`replay_closed_loop`). A benchmark client
(``vllm bench serve --max-concurrency N``, genai-perf/aiperf in concurrency mode) sends its
first N requests at once, so their prefills collide in the first steps, and sends the next
request the instant one completes. With identical requests the groups the first wave formed
stay together: requests prefilled in one step finish in one step and their successors are
prefilled together again. Real clients drift apart (network and client jitter, the API
server tokenising requests one after another, a group straddling a step boundary), and a
group once split never merges again. The replay brackets the measured steady state by the
two ends of that drift, each replaying ``3 N`` requests and averaging the second wave
(requests ``N .. 2N-1``; the first is warm-up, the third keeps N in flight to the end):

- **lockstep**: the first N sent at once, nothing desynchronising them later;
- **desynchronised**: the first N sent evenly over one request's lifetime (``osl`` decode
  steps of N requests, from the cost model), so requests start and finish spread out, the
  state a long run drifts to.

TPOT hardly depends on which (every request's decode shares its steps with the others'
prefills either way): the figure compared is the desynchronised one. TTFT does: both are
reported. Measured light-load TTFT (tens of ms where a lockstep wave's prefills take
hundreds) lies near the desynchronised end; at 64 requests in flight, between the two.
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from chunktune.core.engine_args import EngineArgs, EngineStartupError
from chunktune.core.errors import SpecError
from chunktune.core.gpus import GPU, GPUS, resolve_gpu
from chunktune.core.models import ModelConfig, resolve_model
from chunktune.core.vllm_release import Version, parse_version
from chunktune.core.workload import RequestSpec
from chunktune.sim.calibration.fidelity import measured_latencies, simulate_run
from chunktune.sim.cost.kernel_data import EngineRun
from chunktune.sim.engine.request import Request
from chunktune.sim.engine.virtual import API_SERVER, Engine, ServerCost, build_engine

#: silicon-e2e's ``system`` -> our GPU name.
SILICON_GPUS = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200",
                "a100_sxm": "a100-sxm", "l40s": "l40s"}
#: silicon-e2e's ``model_path`` -> the catalog model the replay runs. An FP8 row of a bf16
#: checkpoint ran it with ``--quantization fp8`` (online); an FP8 checkpoint runs as itself.
SILICON_MODELS = {"Qwen/Qwen3-32B": "qwen3-32b", "meta-llama/Llama-3.1-70B": "llama-3.1-70b",
                  "nvidia/Llama-3.1-8B-Instruct-FP8": "llama-3.1-8b-fp8"}
#: Precisions the replay runs (``precision`` column), with what it leaves out where it leaves
#: something out; the rest are reported, not run.
MODELLED_PRECISIONS = {"bf16": "", "fp8": ""}
#: Requests sent per concurrency slot, and which wave is measured (see the module docstring).
WAVES = 3
MEASURED_WAVE = 1
#: The two client models :func:`replay_closed_loop` takes.
LOCKSTEP, DESYNCHRONISED = "lockstep", "desynchronised"


@dataclass(frozen=True)
class ServingRun:
    """One row of ``silicon-e2e.csv``: a closed-loop serving benchmark and its means."""

    model: str
    system: str
    vllm_version: str | None
    precision: str
    isl: int
    osl: int
    concurrency: int
    tp: int
    ttft_s: float
    tpot_s: float

    @property
    def name(self) -> str:
        return (f"{self.model.split('/')[-1]} {self.system} tp{self.tp} {self.precision} "
                f"{self.isl}/{self.osl} c{self.concurrency}")

    @property
    def request_steps(self) -> int:
        """What replaying it costs: requests x output tokens of the waves simulated, under
        both client models."""
        return 2 * (MEASURED_WAVE + 2) * self.concurrency * self.osl


def read_silicon(path: Path) -> list[ServingRun]:
    """The rows of ``silicon-e2e.csv`` (the shared data's or the committed copy)."""
    out = []
    with path.open() as fh:
        for r in csv.DictReader(line for line in fh if not line.startswith("#")):
            out.append(ServingRun(
                r["model_path"], r["system"], r["backend_version"] or None, r["precision"],
                int(r["isl"]), int(r["osl"]), int(float(r["concurrency"])),
                int(float(r["tp_size"])), float(r["silicon_ttft_ms"]) / 1e3,
                float(r["silicon_tpot_ms"]) / 1e3))
    return out


@dataclass(frozen=True)
class Replay:
    """A measured run against its replay: the group it is reported in, and either the
    simulated means or why the simulator cannot run it."""

    name: str
    group: str
    measured_ttft_s: float
    measured_tpot_s: float
    #: simulated means: desynchronised client (open loop: the run's own arrivals)
    ttft_s: float | None = None
    tpot_s: float | None = None
    #: mean TTFT under the lockstep client (closed loop only)
    ttft_lockstep_s: float | None = None
    skipped: str | None = None

    @property
    def ttft_err(self) -> float | None:
        return None if self.ttft_s is None else self.ttft_s / self.measured_ttft_s - 1.0

    @property
    def ttft_lockstep_err(self) -> float | None:
        return (None if self.ttft_lockstep_s is None
                else self.ttft_lockstep_s / self.measured_ttft_s - 1.0)

    @property
    def tpot_err(self) -> float | None:
        return None if self.tpot_s is None else self.tpot_s / self.measured_tpot_s - 1.0


def silicon_engine(run: ServingRun) -> tuple[EngineArgs, ModelConfig, GPU, Version | None]:
    """The engine a silicon row ran, as the simulator takes it, and the vLLM version whose
    defaults apply (the row's; None where it records none: the current one); raises
    :class:`SpecError` naming what the simulator does not model."""
    if run.precision not in MODELLED_PRECISIONS:
        raise SpecError(f"{run.precision} weights are not modelled")
    if run.model not in SILICON_MODELS:
        raise SpecError(f"model {run.model} is not in the catalog")
    gpu_name = SILICON_GPUS.get(run.system, run.system)
    if gpu_name not in GPUS:
        raise SpecError(f"GPU {gpu_name} is not in the catalog")
    gpu = resolve_gpu(gpu_name)
    model = resolve_model(SILICON_MODELS[run.model])
    online = "fp8" if run.precision == "fp8" and not model.quantization else None
    version = parse_version(run.vllm_version, "backend_version") if run.vllm_version else None
    return EngineArgs(tensor_parallel_size=run.tp, quantization=online), model, gpu, version


def replay_closed_loop(engine: Engine, isl: int, osl: int, concurrency: int,
                       server: ServerCost, client: str = DESYNCHRONISED
                       ) -> tuple[float, float]:
    """(mean TTFT, mean TPOT) of the measured wave of a closed-loop client keeping
    ``concurrency`` requests of ``isl`` / ``osl`` tokens in flight, its first wave sent as
    ``client`` says (see the module docstring); TPOT = (E2E - TTFT) / (osl - 1)."""
    n = concurrency
    first = [0.0] * n
    if client == DESYNCHRONISED:
        ctx = isl + osl // 2
        step = engine.cost.step_time(n, n, n, [], n, n * ctx)
        first = [i * osl * step / n for i in range(n)]
    elif client != LOCKSTEP:
        raise ValueError(f"client must be {LOCKSTEP} or {DESYNCHRONISED} (got {client!r})")
    specs = [RequestSpec(i, first[i] if i < n else None, isl, osl, 0)
             for i in range(WAVES * n)]
    lo, hi = MEASURED_WAVE * n, (MEASURED_WAVE + 1) * n
    cursor = [lo]

    def measured_done(_now: float, reqs: list[Request]) -> bool:
        while cursor[0] < hi and cursor[0] < len(reqs) and reqs[cursor[0]].finish_time >= 0:
            cursor[0] += 1
        return cursor[0] >= hi

    res = engine.replay(specs, concurrency=n, record_steps=False, tick=0.05,
                        on_tick=measured_done, server_overhead_s=server.fixed_s,
                        server_per_token_s=server.per_prompt_token_s)
    wave = [r for r in res.requests if lo <= r.rid < hi]
    if len(wave) < n or any(r.finish_time < 0 for r in wave):
        raise RuntimeError(f"closed-loop replay stopped before request {hi - 1} finished")
    ttft = [r.first_token - r.arrival for r in wave]
    tpot = [(r.finish_time - r.first_token) / max(osl - 1, 1) for r in wave]
    return float(np.mean(ttft)), float(np.mean(tpot))


def replay_silicon(run: ServingRun) -> Replay:
    """One silicon row replayed, or the reason it cannot be."""
    group = f"{SILICON_GPUS.get(run.system, run.system)} {run.precision}"
    base = Replay(run.name, group, run.ttft_s, run.tpot_s)
    try:
        args, model, gpu, version = silicon_engine(run)
        engine = build_engine(args, model, gpu, version)
    except SpecError as e:
        return _skip(base, str(e))
    except EngineStartupError as e:
        return _skip(base, f"the engine does not start here ({e.reason})")
    ttft, tpot = replay_closed_loop(engine, run.isl, run.osl, run.concurrency, API_SERVER,
                                    DESYNCHRONISED)
    lockstep, _ = replay_closed_loop(build_engine(args, model, gpu, version), run.isl,
                                     run.osl, run.concurrency, API_SERVER, LOCKSTEP)
    return Replay(run.name, group, run.ttft_s, run.tpot_s, ttft, tpot, lockstep)


def replay_engine_run(run: EngineRun) -> Replay:
    """One LLMServingSim run (open loop, engine-side timestamps): mean TTFT and TPOT."""
    group = f"{run.gpu} bf16"
    meas = measured_latencies(run)
    base = Replay(run.name, group, float(np.mean(meas["ttft"])), float(np.mean(meas["tpot"])))
    if run.dp != 1:
        return _skip(base, f"data parallelism (x{run.dp}) is not modelled")
    pred = simulate_run(run)
    return Replay(run.name, group, base.measured_ttft_s, base.measured_tpot_s,
                  float(np.mean(pred["ttft"])), float(np.mean(pred["tpot"])))


def _skip(base: Replay, why: str) -> Replay:
    return Replay(base.name, base.group, base.measured_ttft_s, base.measured_tpot_s,
                  skipped=why)


@dataclass(frozen=True)
class GroupFigures:
    """One GPU and precision: rows, rows not run, median |error| of TPOT and TTFT."""

    group: str
    rows: int
    run: int
    tpot_median_abs_err: float | None
    ttft_median_abs_err: float | None
    ttft_lockstep_median_abs_err: float | None
    skipped: dict[str, int]


def summarize(replays: Iterable[Replay]) -> dict[str, GroupFigures]:
    """Per group (``"h100-sxm fp8"``): the figures :class:`GroupFigures` holds."""
    groups: dict[str, list[Replay]] = {}
    for r in replays:
        groups.setdefault(r.group, []).append(r)
    out = {}
    for g, rs in sorted(groups.items()):
        ran = [r for r in rs if r.skipped is None]
        skipped: dict[str, int] = {}
        for r in rs:
            if r.skipped is not None:
                skipped[r.skipped] = skipped.get(r.skipped, 0) + 1

        def med(values: Sequence[float | None]) -> float | None:
            v = [abs(x) for x in values if x is not None]
            return statistics.median(v) if v else None

        out[g] = GroupFigures(g, len(rs), len(ran), med([r.tpot_err for r in ran]),
                              med([r.ttft_err for r in ran]),
                              med([r.ttft_lockstep_err for r in ran]), skipped)
    return out


@dataclass(frozen=True)
class FirstTokenResidual:
    """A light-load silicon row: its measured mean TTFT against the replay's without any
    server cost (prefill and step waits only, desynchronised client)."""

    run: ServingRun
    simulated_s: float

    @property
    def residual_s(self) -> float:
        return self.run.ttft_s - self.simulated_s


#: The systems whose light-load rows the cost before the first token is fitted on: the Hopper
#: GPUs, whose decode steps the step model meets best (B200's TPOT is off by more than a
#: quarter, and its residual would carry the step model's prefill error with it).
FIRST_TOKEN_SYSTEMS = ("h100_sxm", "h200_sxm")


def first_token_residuals(runs: Sequence[ServingRun], max_concurrency: int = 4,
                          max_isl: int = 1024,
                          systems: Sequence[str] = FIRST_TOKEN_SYSTEMS
                          ) -> list[FirstTokenResidual]:
    """The rows at light load (at most ``max_concurrency`` in flight, prompts of at most
    ``max_isl`` tokens) on ``systems`` that the simulator runs, with their TTFT left once the
    simulated prefill and waits are taken off: what the server costs before the first token,
    plus the step model's prefill error (smallest where the prefill per rank is, at the
    highest TP)."""
    out = []
    for run in runs:
        if (run.concurrency > max_concurrency or run.isl > max_isl
                or run.system not in systems):
            continue
        try:
            args, model, gpu, version = silicon_engine(run)
            engine = build_engine(args, model, gpu, version)
        except (SpecError, EngineStartupError):
            continue
        ttft, _ = replay_closed_loop(engine, run.isl, run.osl, run.concurrency, ServerCost())
        out.append(FirstTokenResidual(run, ttft))
    return out


def fit_server_cost(residuals: Sequence[FirstTokenResidual],
                    per_prompt_token_s: float = API_SERVER.per_prompt_token_s) -> ServerCost:
    """The fixed cost before the first token: the median, over the residuals at the highest
    tensor-parallel size (where the simulated prefill is the smallest part of the TTFT), of
    what is left once ``per_prompt_token_s`` x the prompt is taken off."""
    if not residuals:
        raise ValueError("no light-load rows to fit the cost before the first token on")
    top = max(r.run.tp for r in residuals)
    left = [r.residual_s - per_prompt_token_s * r.run.isl for r in residuals if r.run.tp == top]
    return ServerCost(float(statistics.median(left)), per_prompt_token_s)


def quick(runs: Sequence[ServingRun], budget: int = 150_000) -> list[ServingRun]:
    """The rows whose replay is cheap (:attr:`ServingRun.request_steps` within ``budget``):
    what the CI guard replays."""
    return [r for r in runs if r.request_steps <= budget]


# ---- the committed copy of LLMServingSim's runs -------------------------------------------------

_RUN_COLUMNS = ("run", "gpu", "model", "tp", "dp", "max_num_seqs", "max_num_batched_tokens",
                "max_model_len", "kv_blocks")
_REQUEST_COLUMNS = ("run", "arrival_s", "prompt_tokens", "output_tokens", "ttft_s", "e2e_s")


def write_engine_runs(runs: Sequence[EngineRun], runs_path: Path, requests_path: Path,
                      header: str) -> None:
    """The runs' engine arguments (one line per run) and their requests (one line each);
    ``header``: comment lines both files start with."""
    with runs_path.open("w", newline="") as fh:
        fh.write(header)
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(_RUN_COLUMNS)
        for run in runs:
            w.writerow([run.name, run.gpu, run.model, run.tp, run.dp, run.max_num_seqs,
                        run.max_num_batched_tokens, run.max_model_len or "",
                        run.kv_blocks or ""])
    with requests_path.open("w", newline="") as fh:
        fh.write(header)
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(_REQUEST_COLUMNS)
        for run in runs:
            for a, p, o, ttft, e2e in run.requests:
                w.writerow([run.name, f"{a:.4f}", p, o, f"{ttft:.4f}", f"{e2e:.4f}"])


def read_engine_runs(runs_path: Path, requests_path: Path) -> list[EngineRun]:
    """The runs :func:`write_engine_runs` wrote, requests in arrival order."""
    runs: dict[str, EngineRun] = {}
    with runs_path.open() as fh:
        for r in csv.DictReader(line for line in fh if not line.startswith("#")):
            runs[r["run"]] = EngineRun(
                r["run"], r["gpu"], r["model"], int(r["tp"]), int(r["dp"]),
                int(r["max_num_seqs"]), int(r["max_num_batched_tokens"]),
                int(r["max_model_len"]) if r["max_model_len"] else None,
                int(r["kv_blocks"]) if r["kv_blocks"] else None, [])
    with requests_path.open() as fh:
        for r in csv.DictReader(line for line in fh if not line.startswith("#")):
            runs[r["run"]].requests.append((float(r["arrival_s"]), int(r["prompt_tokens"]),
                                            int(r["output_tokens"]), float(r["ttft_s"]),
                                            float(r["e2e_s"])))
    return list(runs.values())
