"""Published vLLM serving runs replayed: GPUStack's performance lab, held out, never fitted.

GPUStack (``gpustack/gpustack``, Apache-2.0) publishes per model and GPU, under
``docs/performance-lab/``, ``vllm bench serve`` results of ``vllm serve`` runs with the serving
command, the vLLM release and the GPU they ran on. ``bench/data/e2e/gpustack_runs.csv`` keeps
each vLLM run the simulator can be asked to replay (derived: the doc and commit, the serving
command's model and flags, the client, the result block's totals and means): nothing in the
simulator was set from them. They add what the AIConfigurator rows lack: synchronous vLLM
(0.10.2-0.11.0, before async scheduling became the default), bf16 dense models at TP 1,
DeepSeek-R1 and Qwen3-235B, A100s, and saturated serving (hundreds of requests at once).

Two clients, as the docs ran ``vllm bench serve`` (``--backend openai-chat``, streaming):

- ``burst``: ``--dataset-name random --random-input-len L --random-output-len O
  --num-prompts N`` at the default request rate (inf): all N requests sent at once. Each
  request's lengths are the run's totals over N (the random dataset's lengths are fixed,
  ``--random-range-ratio`` 0; re-tokenised random text moves the input by under 0.1%, and the
  few outputs that end at EOS move the output mean).
- ``closed``: ShareGPT at ``--max-concurrency C``: C in flight, the next request sent when one
  completes. ShareGPT's per-request lengths are not here: every request gets the run's mean
  lengths, an assumption (at the small batches these runs hold, a decode step depends little
  on the context). The docs' ShareGPT runs sent at once are not kept: their latencies depend on
  the lengths' spread.

A run is replayed as ``vllm serve`` ran it (:func:`engine`): the doc's vLLM release with its
defaults (batch budget and sequences, ``--gpu-memory-utilization``, synchronous scheduling
before 0.14, prefix caching on, a waiting prompt admitted on its first chunk before 0.19),
the serving command's flags, the model from its ``config.json`` fields
(:data:`CATALOG_MODELS`, :data:`CONFIG_FILES`), the GPU the doc's Hardware section names, with
the API server's cost before the first token
(:data:`~chunktune.sim.engine.virtual.API_SERVER`). Where the doc names "H100"
or "A100" without the form, the 80 GB SXM board is assumed (``gpu_stated`` keeps what the doc
says). Frontend flags (:data:`FRONTEND_FLAGS`) change no step; any other flag the simulator does
not take refuses the run by name, as does a model it does not model or has no config for.

The figures: the mean TPOT (each request's (E2E - TTFT) / (output tokens - 1), as
``vllm bench serve`` computes it), the mean TTFT, and the benchmark's duration (the last
request's completion).
"""

from __future__ import annotations

import csv
import math
import shlex
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from chunktune.core import flags
from chunktune.core.engine_args import EngineArgs, EngineStartupError
from chunktune.core.errors import SpecError
from chunktune.core.gpus import GPU, resolve_gpu
from chunktune.core.models import ModelConfig, resolve_model
from chunktune.core.vllm_release import Version, parse_version
from chunktune.core.workload import RequestSpec
from chunktune.sim.engine.data_parallel import DataParallelEngine, build_data_parallel_engine
from chunktune.sim.engine.virtual import API_SERVER, Engine, build_engine

#: The committed table of runs.
TABLE = Path(__file__).resolve().parents[4] / "bench" / "data" / "e2e" / "gpustack_runs.csv"
#: The table's columns, in order.
COLUMNS = ("source", "commit", "gpu", "gpu_stated", "vllm", "model", "args", "env", "client",
           "concurrency", "requests", "input_tokens", "output_tokens", "duration_s",
           "mean_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "case")
CLIENTS = ("burst", "closed")
#: A served model -> the catalog entry the replay runs, and its own config.json's
#: ``max_position_embeddings`` where it differs (None: the entry's): the 2507 releases of
#: Qwen3-235B-A22B have Qwen3-235B-A22B's shape with 262,144 positions (their model card:
#: "262,144 natively"), which sets vLLM's default ``--max-model-len``.
CATALOG_MODELS: dict[str, tuple[str, int | None]] = {
    "deepseek-ai/DeepSeek-R1-0528": ("deepseek-r1", None),
    "openai/gpt-oss-120b": ("gpt-oss-120b", None),
    "openai/gpt-oss-20b": ("gpt-oss-20b", None),
    "Qwen/Qwen3-8B": ("qwen3-8b", None),
    "Qwen/Qwen3-14B": ("qwen3-14b", None),
    "Qwen/Qwen3-32B": ("qwen3-32b", None),
    "Qwen/Qwen3-235B-A22B-Instruct-2507": ("qwen3-235b-a22b", 262144),
    "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8": ("qwen3-235b-a22b-fp8", 262144),
    "zai-org/GLM-4.5-Air": ("glm-4.5-air", None),
    "zai-org/GLM-4.6": ("glm-4.6", None),
}
#: A served model the catalog lacks -> its config.json in :data:`CONFIGS` (read as
#: ``--model-config`` reads it: the reader refuses what is not modelled, by name).
CONFIG_FILES: dict[str, str] = {
    "deepseek-ai/DeepSeek-V3.2": "deepseek-ai--DeepSeek-V3.2_config.json",
}
#: Where :data:`CONFIG_FILES` are (the shared data's ``aiconfigurator-vllm/model-configs``
#: copies, beside the MoE rows' checkpoints).
CONFIGS = TABLE.parent / "model-configs"
#: ``vllm serve`` flags of the API server alone (parsing of reasoning and tool calls, the
#: tokenizer's mode): they change no engine step.
FRONTEND_FLAGS = frozenset({"--reasoning-parser", "--tokenizer-mode", "--tool-call-parser",
                            "--enable-auto-tool-choice", "--served-model-name"})
#: ``vllm serve``'s short spellings the docs use.
_SHORT = {"-tp": "--tensor-parallel-size", "-dp": "--data-parallel-size",
          "-pp": "--pipeline-parallel-size"}


@dataclass(frozen=True)
class PublishedRun:
    """One row of the table: a ``vllm serve`` run and what ``vllm bench serve`` printed."""

    source: str
    line: int
    gpu: str
    gpu_stated: str
    vllm: str
    model: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    client: str
    concurrency: int | None
    requests: int
    input_tokens: int
    output_tokens: int
    duration_s: float
    ttft_s: float
    tpot_s: float
    case: str

    @property
    def prompt_len(self) -> int:
        return max(1, round(self.input_tokens / self.requests))

    @property
    def output_len(self) -> int:
        return max(1, round(self.output_tokens / self.requests))

    @property
    def group(self) -> str:
        """What the run is reported under: the doc's model and GPU (``"qwen3-8b/h100"``)."""
        return self.source.rsplit("/", 1)[0] + "/" + self.gpu

    @property
    def name(self) -> str:
        flags_text = " ".join(self.args) or "(defaults)"
        load = (f"{self.requests} at once" if self.client == "burst"
                else f"{self.concurrency} in flight")
        return (f"{self.group} vLLM {self.vllm} {flags_text}: {self.prompt_len}/"
                f"{self.output_len} tokens, {load}")


def _int(text: str, where: str) -> int:
    try:
        value = int(text)
    except ValueError as e:
        raise SpecError(f"{where}: expected a whole number") from e
    if value < 0:
        raise SpecError(f"{where}: expected a whole number >= 0")
    return value


def _float(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError as e:
        raise SpecError(f"{where}: expected a number") from e
    if not math.isfinite(value) or value <= 0:
        raise SpecError(f"{where}: expected a number > 0")
    return value


def read_runs(path: Path = TABLE) -> list[PublishedRun]:
    """The table's runs; a malformed row is a :class:`SpecError` naming the file, line and
    column (never the row's text)."""
    out = []
    with path.open(newline="") as fh:
        numbered = [(n, line) for n, line in enumerate(fh, 1) if not line.startswith("#")]
    # one record a line (no field of the table holds a line break)
    header = next(csv.reader([numbered[0][1]])) if numbered else []
    if tuple(header) != COLUMNS:
        raise SpecError(f"{path}: the header is not {','.join(COLUMNS)}")
    for line, text in numbered[1:]:
        if not text.strip():
            continue
        cells = next(csv.reader([text]), [])
        where = f"{path} line {line}"
        if len(cells) != len(COLUMNS):
            raise SpecError(f"{where}: expected {len(COLUMNS)} columns, found {len(cells)}")
        r = dict(zip(COLUMNS, cells, strict=True))
        client = r["client"]
        if client not in CLIENTS:
            raise SpecError(f"{where}, column client: expected one of {', '.join(CLIENTS)}")
        concurrency = (_int(r["concurrency"], f"{where}, column concurrency")
                       if r["concurrency"] else None)
        if (client == "closed") != (concurrency is not None):
            raise SpecError(f"{where}, column concurrency: a closed-loop run has one, a "
                            "burst none")
        requests = _int(r["requests"], f"{where}, column requests")
        if requests == 0:
            raise SpecError(f"{where}, column requests: expected at least 1")
        try:
            args = tuple(shlex.split(r["args"]))
            env = tuple(tuple(kv.split("=", 1)) for kv in shlex.split(r["env"]))
        except ValueError as e:
            raise SpecError(f"{where}, column args or env: unbalanced quotes") from e
        if any(len(kv) != 2 for kv in env):
            raise SpecError(f"{where}, column env: expected NAME=VALUE items")
        out.append(PublishedRun(
            r["source"], line, r["gpu"], r["gpu_stated"], r["vllm"], r["model"], args,
            tuple((k, v) for k, v in env), client, concurrency, requests,
            _int(r["input_tokens"], f"{where}, column input_tokens"),
            _int(r["output_tokens"], f"{where}, column output_tokens"),
            _float(r["duration_s"], f"{where}, column duration_s"),
            _float(r["mean_ttft_ms"], f"{where}, column mean_ttft_ms") / 1e3,
            _float(r["mean_tpot_ms"], f"{where}, column mean_tpot_ms") / 1e3,
            r["case"]))
    return out


def model_of(run: PublishedRun) -> ModelConfig:
    """The model ``run`` served, as the simulator reads it; raises :class:`SpecError` naming
    a model it has no config of or does not model."""
    if run.model in CONFIG_FILES:
        return resolve_model(config_path=CONFIGS / CONFIG_FILES[run.model])
    if run.model not in CATALOG_MODELS:
        raise SpecError(f"no config.json of {run.model} here")
    key, positions = CATALOG_MODELS[run.model]
    model = resolve_model(key)
    return model if positions is None else replace(model, max_position_embeddings=positions)


def engine(run: PublishedRun) -> tuple[EngineArgs, ModelConfig, GPU, Version]:
    """The engine ``run`` served, as the simulator takes it; raises :class:`SpecError` naming
    what it does not model."""
    model = model_of(run)
    argv: list[str] = []
    for token in run.args:
        spelling, eq, value = token.partition("=")
        argv.append(_SHORT.get(spelling, spelling) + eq + value)
    parsed = flags.parse_argv(argv)
    if parsed.problems:
        raise SpecError(f"flag {argv[parsed.problems[0][0]]}: {parsed.problems[0][1]}")
    for _, spelling in parsed.unknown:
        if spelling not in FRONTEND_FLAGS:
            raise SpecError(f"{spelling} is not modelled")
    kw = {flags.FLAGS[name].attr: value for name, value in parsed.values.items()}
    version = parse_version(run.vllm, "vllm")
    # vLLM V1 caches prefixes unless told not to (0.10-0.13 EngineArgs._set_default_args: on
    # for generative models); the simulator's EngineArgs leaves it off unless given. Random
    # prompts share nothing: it matters once a request is preempted, whose blocks stay
    # cached until taken (docs/simulator.md, "Published runs").
    kw.setdefault("enable_prefix_caching", True)
    return EngineArgs(**kw), model, resolve_gpu(run.gpu), version


def requests(run: PublishedRun) -> list[RequestSpec]:
    """The client's requests: each of the run's mean lengths; a burst's all sent at 0, a
    closed loop's first ``concurrency`` at 0 and the rest as earlier ones complete."""
    first = run.requests if run.concurrency is None else run.concurrency
    return [RequestSpec(i, 0.0 if i < first else None, run.prompt_len, run.output_len, 0)
            for i in range(run.requests)]


@dataclass(frozen=True)
class PublishedReplay:
    """A run against its replay: the simulated means and duration, or why it cannot run;
    ``refused``: vLLM's start-up error the simulator gives the run as stated, where the replay
    went on at the longest ``--max-model-len`` its KV cache holds (:func:`replay`)."""

    run: PublishedRun
    ttft_s: float | None = None
    tpot_s: float | None = None
    duration_s: float | None = None
    skipped: str | None = None
    refused: str | None = None
    #: the model the replay ran (None where it did not run)
    model: ModelConfig | None = None

    def error(self, what: str) -> float | None:
        """Signed relative error of ``what`` (``ttft``, ``tpot``, ``duration``)."""
        ours = getattr(self, f"{what}_s")
        return None if ours is None else ours / getattr(self.run, f"{what}_s") - 1.0


def start(run: PublishedRun
          ) -> tuple[Engine | DataParallelEngine, ModelConfig, str | None]:
    """The engine of ``run``, its model, and the start-up error the simulator gives its
    command where it would not start: a run that did start on its GPU but that the simulated
    memory profile refuses its model's default ``--max-model-len`` (``MaxModelLenTooLarge``)
    starts at the longest length that profile holds, vLLM's own estimate in its message. Its
    KV cache, and so the replay, is the same; the refusal is reported as an error of the
    profile (or of the GPU assumed). Raises :class:`SpecError` and other start-up errors."""
    args, model, gpu, version = engine(run)
    env = dict(run.env)

    def build(a: EngineArgs) -> Engine | DataParallelEngine:
        if a.data_parallel_size > 1:
            return build_data_parallel_engine(a, model, gpu, version, env)
        return build_engine(a, model, gpu, version, env)

    try:
        return build(args), model, None
    except EngineStartupError as e:
        fits = e.estimated_max_model_len
        if e.reason != "MaxModelLenTooLarge" or fits < run.prompt_len + run.output_len:
            raise
        refused = (f"vLLM {run.vllm} as simulated would not start it on {run.gpu} "
                   f"({e.reason}: {args.max_model_len or model.max_position_embeddings:,} "
                   f"tokens; replayed at --max-model-len {fits:,})")
        return build(replace(args, max_model_len=fits)), model, refused


def replay(run: PublishedRun) -> PublishedReplay:
    """``run`` replayed, or the reason it cannot be."""
    try:
        eng, model, refused = start(run)
    except SpecError as e:
        return PublishedReplay(run, skipped=str(e))
    except EngineStartupError as e:
        return PublishedReplay(run, skipped=f"vLLM {run.vllm} as simulated would not start "
                                            f"it on {run.gpu} ({e.reason})")
    res = eng.replay(requests(run), concurrency=run.concurrency, record_steps=False,
                     server_overhead_s=API_SERVER.fixed_s,
                     server_per_token_s=API_SERVER.per_prompt_token_s)
    done = [r for r in res.requests if r.finish_time >= 0]
    if len(done) < run.requests:
        raise RuntimeError(f"the replay of {run.name} stopped before every request finished")
    out = max(run.output_len - 1, 1)
    return PublishedReplay(
        run, ttft_s=statistics.fmean(r.first_token - r.arrival for r in done),
        tpot_s=statistics.fmean((r.finish_time - r.first_token) / out for r in done),
        duration_s=max(r.finish_time for r in done), refused=refused, model=model)


@dataclass(frozen=True)
class Figures:
    """A set of replays: runs, runs not replayed (by reason), and the median |error| and
    median signed error of the mean TPOT, the mean TTFT and the duration."""

    runs: int
    replayed: int
    skipped: dict[str, int]
    #: replayed though the simulated start-up refuses the stated command
    refused: int
    median_abs: dict[str, float | None]
    median: dict[str, float | None]


def figures(replays: Iterable[PublishedReplay]) -> Figures:
    rs = list(replays)
    ran = [r for r in rs if r.skipped is None]
    skipped: dict[str, int] = {}
    for r in rs:
        if r.skipped is not None:
            skipped[r.skipped] = skipped.get(r.skipped, 0) + 1

    def med(values: Sequence[float | None], absolute: bool) -> float | None:
        v = [abs(x) if absolute else x for x in values if x is not None]
        return statistics.median(v) if v else None

    what = ("tpot", "ttft", "duration")
    return Figures(len(rs), len(ran), skipped, sum(r.refused is not None for r in ran),
                   {w: med([r.error(w) for r in ran], True) for w in what},
                   {w: med([r.error(w) for r in ran], False) for w in what})


def fidelity_table(replays: Iterable[PublishedReplay]) -> dict[str, list[dict[str, object]]]:
    """Per GPU, what :func:`chunktune.sim.cost.provenance.end_to_end` quotes of these runs:
    per model (:attr:`ModelConfig.shape_key` and weight format) and client, the runs replayed,
    the vLLM releases they ran, and the median |error| and median signed error of the mean
    TPOT and TTFT, rounded to 0.1%."""
    groups: dict[tuple[str, str, str, str], list[PublishedReplay]] = {}
    names: dict[tuple[str, str, str, str], str] = {}
    for rep in replays:
        if rep.model is None:
            continue
        key = (rep.run.gpu, rep.model.shape_key, rep.model.weights, rep.run.client)
        groups.setdefault(key, []).append(rep)
        names.setdefault(key, rep.run.model.split("/")[-1])
    out: dict[str, list[dict[str, object]]] = {}
    for (gpu, shape, weights, client), reps in sorted(groups.items()):
        f = figures(reps)

        def r3(v: float | None) -> float:
            assert v is not None
            return round(v, 3)

        out.setdefault(gpu, []).append({
            "model": names[(gpu, shape, weights, client)], "shape": shape, "weights": weights,
            "client": client, "runs": f.replayed,
            "vllm": sorted({r.run.vllm for r in reps}, key=lambda v: parse_version(v, "vllm")),
            "tpot": r3(f.median_abs["tpot"]), "ttft": r3(f.median_abs["ttft"]),
            "tpot_signed": r3(f.median["tpot"]), "ttft_signed": r3(f.median["ttft"])})
    return out


@dataclass(frozen=True)
class Pair:
    """The same doc's workload served two ways (two commands; two docs are never paired):
    ``measured`` and ``simulated`` are ``second / first - 1`` of ``what``."""

    first: PublishedReplay
    second: PublishedReplay
    what: str
    measured: float
    simulated: float

    @property
    def agrees(self) -> bool:
        """Whether the simulator picks the same one as faster."""
        return (self.measured > 0) == (self.simulated > 0)


def pairs(replays: Iterable[PublishedReplay], what: str = "duration") -> list[Pair]:
    """Every two replayed runs of one doc with the same client and case (its lengths) but
    another serving command (flags, TP, the checkpoint's precision): how much the second
    changes ``what``
    (``duration``, ``tpot``, ``ttft``), measured and simulated: whether the twin ranks the
    commands as the runs did."""
    by_load: dict[tuple[object, ...], list[PublishedReplay]] = {}
    for rep in replays:
        if rep.skipped is None:
            r = rep.run
            key = (r.source, r.client, r.concurrency, r.case)
            by_load.setdefault(key, []).append(rep)
    out = []
    for reps in by_load.values():
        for i, a in enumerate(reps):
            for b in reps[i + 1:]:
                if (a.run.model, a.run.args) == (b.run.model, b.run.args):
                    continue
                ours_a, ours_b = getattr(a, f"{what}_s"), getattr(b, f"{what}_s")
                assert ours_a is not None and ours_b is not None
                out.append(Pair(a, b, what,
                                getattr(b.run, f"{what}_s") / getattr(a.run, f"{what}_s") - 1,
                                ours_b / ours_a - 1))
    return out
