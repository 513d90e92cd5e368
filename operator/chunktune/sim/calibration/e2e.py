"""End-to-end fidelity: real vLLM serving runs replayed through the simulator.

Two sets of measured runs, each replayed as its client ran it:

- **AIConfigurator's silicon runs** (``silicon-e2e.csv``, Apache-2.0, NVIDIA): vLLM served on
  H100/H200/B200, closed loop: ``concurrency`` requests in flight, every request exactly ``isl``
  prompt and ``osl`` output tokens, the client's mean TTFT and TPOT. Engine flags beyond TP and
  precision were not recorded: the replay takes the defaults of the row's vLLM version (where
  the row names none, InferenceX's: :data:`INFERENCEX_VLLM`).
- **AIConfigurator's MoE serving runs** (``silicon-e2e-moe.csv``, same source): gpt-oss-120b,
  Kimi-K2.5 and MiniMax-M2.5 on H100/H200/B200, the same closed loop, with the TP, expert
  split and attention data parallelism they ran and the container image where recorded;
  replayed with the checkpoint's own ``config.json`` (:data:`SILICON_MOE_MODELS`) and the
  flags :func:`_moe_engine` assumes, reported per GPU, precision and model.
- **LLMServingSim's vLLM 0.19 runs** (RTX 4090, RTX PRO 6000; MIT, CASYS Lab at KAIST): an
  offline engine with timed injection, open loop, engine-side timestamps (no server cost),
  replayed by :func:`chunktune.sim.calibration.fidelity.simulate_run`.

How the silicon rows ran. The Llama-3.1-70B rows are InferenceX's vLLM benchmarks
(SemiAnalysisAI/InferenceX, ``benchmarks/70b_fp8_{h100,h200}_slurm.sh`` and
``70b_fp8_b200_docker.sh``; AIConfigurator's ``inferencex.py`` adapter maps their ``llama70b``
to ``meta-llama/Llama-3.1-70B``); the rows naming vLLM 0.12.0 (Llama-3.1-8B FP8 on H200,
Qwen3-32B on H100) record no harness and are replayed the same way, an assumption. The
engine (:func:`silicon_engine`): ``--kv-cache-dtype fp8 --async-scheduling
--no-enable-prefix-caching --max-num-batched-tokens 8192 --gpu-memory-utilization 0.9
--max-num-seqs CONC`` (512 on B200), ``--max-model-len`` 10240 on H100 (its script), else
ISL+OSL+20 at 1k/1k, +200 with an 8k side, else 10240 (the H200 script's rule). The B200's
script also turns on vLLM's FlashInfer all-reduce fusion (all-reduce, residual add, RMSNorm
and the next GEMM's quantization in one kernel), which the replay runs
(:data:`FI_ALLREDUCE_FUSION_SYSTEMS`); its attention + output-quant fusion and its decode-only
CUDA graphs (mixed steps without graphs) are not modelled. The B200's FP4 rows are
InferenceX's ``70b-fp4-b200-vllm`` (its ``master.json``:
``nvidia/Llama-3.3-70B-Instruct-FP4``, image ``vllm/vllm-openai:v0.10.2``;
``benchmarks/70b_fp4_b200_docker.sh``: the FP8 script's flags): NVIDIA's ModelOpt NVFP4
export, replayed as that checkpoint (:data:`SILICON_CHECKPOINTS`) with the same flags. The
70B rows record no version; they replay as the release of the image their scripts name,
vLLM 0.10.2 (:data:`INFERENCEX_VLLM`), which picks what the release decides: FlashInfer's
CUTLASS NVFP4 GEMM for the FP4 rows (``gemm_table.nvfp4_kernel``; 0.24 and later run its
CuTe DSL GEMM), the 0.31 scheduler (the oldest checked), the memory profile without graphs.

The H100's 70B rows ran a bf16 KV cache (:data:`BF16_KV_SYSTEMS`), an inference from the rows
themselves: the first H100 and H200 scripts (``benchmarks/70b_h100_slurm.sh`` from when the
project was InferenceMAX, kept in forks such as jyothisambolu/InferenceMAX) passed no
``--kv-cache-dtype``, and only a bf16 cache's capacity (half an FP8 one's) reproduces what the
H100's TP 2 rows show: their mean TTFT of 6.5-59 s at 32-64 in flight (queued for KV blocks;
replayed with an FP8 cache, 0.5-12 s) and a TPOT that stops growing from 32 to 64 in flight
(the batch capped by the cache). The H200's TP 1 rows show the opposite (replayed with a bf16
cache their TTFT comes out 2.6-12x the measured): an FP8 cache.

The client (:func:`replay_client`): vLLM's
``benchmark_serving.py --dataset-name random --random-range-ratio 0.8 --num-prompts
CONC*10 --max-concurrency CONC --request-rate inf --ignore-eos``: the first CONC requests
sent at once, the next one the instant one completes, each request's prompt and output
lengths drawn uniformly from ``[int(0.8 L), L]`` (the script's ``sample_random_requests``),
and the means over all CONC*10 requests, the first wave's included. The drawn lengths are
what desynchronises a first wave sent at once: its requests finish at different steps, so
their successors' prefills spread out.
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from chunktune.core.engine_args import EngineArgs, EngineStartupError, apply_quantization
from chunktune.core.errors import SpecError
from chunktune.core.gpus import GPU, GPUS, resolve_gpu
from chunktune.core.models import ModelConfig, resolve_model
from chunktune.core.vllm_release import Version, parse_version
from chunktune.core.workload import RequestSpec
from chunktune.sim.calibration.fidelity import measured_latencies, simulate_run
from chunktune.sim.cost.collectives import fi_allreduce_fusion_tokens
from chunktune.sim.cost.fit.kernel_data import EngineRun
from chunktune.sim.engine.data_parallel import DataParallelEngine, build_data_parallel_engine
from chunktune.sim.engine.virtual import API_SERVER, Engine, ServerCost, build_engine

#: silicon-e2e's ``system`` -> our GPU name.
SILICON_GPUS = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200",
                "a100_sxm": "a100-sxm", "l40s": "l40s"}
#: silicon-e2e's ``model_path`` -> the catalog model the replay runs. An FP8 row of a bf16
#: checkpoint ran it with ``--quantization fp8`` (online); an FP8 checkpoint runs as itself.
SILICON_MODELS = {"Qwen/Qwen3-32B": "qwen3-32b", "meta-llama/Llama-3.1-70B": "llama-3.1-70b",
                  "nvidia/Llama-3.1-8B-Instruct-FP8": "llama-3.1-8b-fp8"}
#: silicon-e2e's dense (``model_path``, ``precision``) rows that ran a quantized checkpoint of
#: their own, and the catalog model of it: the B200 FP4 rows are InferenceX's
#: ``70b-fp4-b200-vllm`` (``.github/configs/master.json``: ``nvidia/Llama-3.3-70B-Instruct-FP4``,
#: ModelOpt NVFP4 with Llama-3.1-70B's shape; ``benchmarks/70b_fp4_b200_docker.sh``: the flags
#: of its FP8 script, ``--kv-cache-dtype fp8`` and 512 sequences).
SILICON_CHECKPOINTS = {("meta-llama/Llama-3.1-70B", "fp4"): "llama-3.3-70b-fp4"}
#: silicon-e2e-moe's ``model_path`` -> (the name its groups are reported under, and per
#: ``precision`` the checkpoint's ``config.json`` the replay reads, in ``MOE_CONFIGS``): the FP4
#: rows of MiniMax-M2.5 and Kimi-K2.5 ran NVIDIA's NVFP4 exports, gpt-oss-120b's FP4 rows its
#: own MXFP4 checkpoint, Kimi-K2.5's INT4 rows Moonshot's W4A16 checkpoint.
SILICON_MOE_MODELS: dict[str, tuple[str, dict[str, str]]] = {
    "MiniMaxAI/MiniMax-M2.5": ("MiniMax-M2.5", {
        "fp8": "MiniMaxAI--MiniMax-M2.5_config.json",
        "fp4": "nvidia--MiniMax-M2.5-NVFP4_config.json"}),
    "moonshotai/Kimi-K2.5": ("Kimi-K2.5", {
        "int4": "moonshotai--Kimi-K2.5_config.json",
        "fp4": "nvidia--Kimi-K2.5-NVFP4_config.json"}),
    "openai/gpt-oss-120b": ("gpt-oss-120b", {"fp4": "openai--gpt-oss-120b_config.json"}),
}
#: silicon-e2e-moe's (``model_path``, ``system``, ``precision``) rows whose InferenceX script
#: serves ``--tensor-parallel-size=$TP`` alone, whatever split the row records: Kimi-K2.5's
#: NVFP4 export on the B200 (``benchmarks/single_node/kimik2.5_fp4_b200.sh``, every version
#: from its first, 2026-03-11, to the rows' last, 2026-04-20, has neither
#: ``--enable-expert-parallel`` nor ``--data-parallel-size``; InferenceX #1019 set the config's
#: ``ep: 4`` to 1 on 2026-04-14: "script has no EP support"). Its rows labelled ``ep 4`` ran
#: the experts sharded over the TP ranks, and those labelled ``attention_dp 4`` (``moe_ep``
#: 16) TP 4 too, with ``concurrency x attention_dp`` in flight (their ``silicon_concurrency``,
#: the script's ``--max-concurrency``; the same measurements appear in the data a second time
#: as ``tp 4, ep 4`` rows of that concurrency): :func:`served`.
TP_ONLY_SCRIPTS = frozenset({("moonshotai/Kimi-K2.5", "b200_sxm", "fp4")})
#: Where the replay reads the MoE checkpoints' ``config.json`` (the committed copies of the
#: shared data's ``model-configs``; :func:`set_moe_configs` points it elsewhere).
MOE_CONFIGS = Path(__file__).resolve().parents[4] / "bench" / "data" / "e2e" / "model-configs"
#: silicon-e2e systems whose InferenceX rows ran with vLLM's default KV cache (the model's
#: bf16) rather than ``--kv-cache-dtype fp8``: the module docstring gives the evidence.
BF16_KV_SYSTEMS = frozenset({"h100_sxm"})
#: The dense silicon rows whose script turned on vLLM's FlashInfer all-reduce fusion, with
#: the thresholds it exported: InferenceX's B200 Llama-3.1-70B scripts
#: (``benchmarks/70b_fp8_b200_docker.sh``; ``70b_fp4_b200_docker.sh`` has its flags; image
#: ``vllm/vllm-openai:v0.10.2``) pass ``--compilation-config`` with ``pass_config``
#: ``enable_fi_allreduce_fusion`` (and ``enable_attn_fusion``, custom ops ``+quant_fp8``,
#: ``+rms_norm``, ``cudagraph_mode`` ``FULL_DECODE_ONLY``) and export
#: ``VLLM_FLASHINFER_ALLREDUCE_FUSION_THRESHOLDS_MB='{"2":32,"4":32,"8":8}'``; the H100 and
#: H200 scripts of the same image pass neither.
FI_ALLREDUCE_FUSION_SYSTEMS = {"b200_sxm": {2: 32.0, 4: 32.0, 8: 8.0}}
#: The vLLM release the dense silicon rows that record none (InferenceX's Llama-3.1-70B rows,
#: :func:`by_harness`) replay as: the image InferenceX's ``.github/configs/master.json`` names
#: for ``70b-fp8-h100-vllm``, ``70b-fp8-h200-vllm``, ``70b-fp8-b200-vllm`` and
#: ``70b-fp4-b200-vllm``, ``vllm/vllm-openai:v0.10.2`` (the tag, not a recorded version: an
#: inference). What it changes in the replay: the B200 FP4 rows' NVFP4 GEMM kernel
#: (FlashInfer CUTLASS, ``gemm_table.nvfp4_kernel``), the scheduler (0.18's: a prompt admitted
#: on its first chunk) and the memory profile (CUDA graphs outside it).
INFERENCEX_VLLM: Version = (0, 10, 2)
#: Precisions the replay runs (``precision`` column), with what it leaves out where it leaves
#: something out; the rest are reported, not run.
MODELLED_PRECISIONS = {"bf16": "", "fp8": "", "fp4": ""}
#: InferenceX's client (see the module docstring): requests per concurrency slot, the
#: lengths' range ratio, and the seed of the replay's draw.
PROMPTS_PER_SLOT = 10
#: The first vLLM release of the H200 MiniMax-M2.5 rows served expert parallel whatever their
#: recorded split: InferenceX's ``minimaxm2.5_fp8_h200.sh`` passes ``--enable-expert-parallel``
#: when ``EP_SIZE -ge 1`` (always) from 2026-03-13 on; its vLLM 0.16 rows (2026-03-01) ran
#: the script's first version, tensor parallel alone, its vLLM 0.18 rows (2026-03-27/28) EP.
H200_MINIMAX_EP_SINCE: Version = (0, 18, 0)
#: The first vLLM release InferenceX's H100/H200 gpt-oss scripts served with
#: ``VLLM_MXFP4_USE_MARLIN=1`` (``benchmarks/gptoss_fp4_h{100,200}_*.sh`` export it from
#: 2026-01-02, image v0.13.0, to the v0.18.0 rows of 2026-03-27; the rows of vLLM 0.11.2 and
#: those naming no version, 2025-11/12, ran without it).
HOPPER_MXFP4_MARLIN_SINCE: Version = (0, 13, 0)
RANGE_RATIO = 0.8
CLIENT_SEED = 0


#: How a MoE row with attention data parallelism is reported: after its model.
ATTENTION_DP = "attention-DP"


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
    #: silicon-e2e-moe's parallelism: attention data-parallel ranks (``--data-parallel-size``
    #: with attention DP), and the experts' tensor- and expert-parallel sizes (``moe_ep > 1``:
    #: ``--enable-expert-parallel``); 1, 0 (= ``tp``), 1 for the dense rows
    attention_dp: int = 1
    moe_tp: int = 0
    moe_ep: int = 1
    #: the container image's vLLM tag where the row records one (``nightly-<commit>``)
    image: str = ""

    @property
    def is_moe(self) -> bool:
        return self.model in SILICON_MOE_MODELS

    @property
    def name(self) -> str:
        par = (f" dp{self.attention_dp}" if self.attention_dp > 1 else "") + (
            f" ep{self.moe_ep}" if self.moe_ep > 1 else "")
        return (f"{self.model.split('/')[-1]} {self.system} tp{self.tp}{par} {self.precision} "
                f"{self.isl}/{self.osl} c{self.concurrency}")

    @property
    def group(self) -> str:
        """What the row is reported under: GPU and precision (``"h200 fp8"``), and for an MoE
        row its model too (``"h200 fp8 MiniMax-M2.5"``); a row with attention data
        parallelism apart from the model's others (``"b200 fp8 MiniMax-M2.5 attention-DP"``:
        another engine, :mod:`chunktune.sim.engine.data_parallel`)."""
        group = f"{SILICON_GPUS.get(self.system, self.system)} {self.precision}"
        if not self.is_moe:
            return group
        dp = f" {ATTENTION_DP}" if self.attention_dp > 1 else ""
        return f"{group} {SILICON_MOE_MODELS[self.model][0]}{dp}"

    @property
    def request_steps(self) -> int:
        """What replaying it costs: requests x output tokens."""
        return PROMPTS_PER_SLOT * self.concurrency * self.osl


def read_silicon(path: Path) -> list[ServingRun]:
    """The rows of ``silicon-e2e.csv`` or ``silicon-e2e-moe.csv`` (the shared data's or the
    committed copy). A MoE row's vLLM version is its ``backend_version`` (None for a nightly
    build: the current release's defaults apply). A row's concurrency is the client's requests
    in flight, the benchmark's ``silicon_concurrency`` where the row's source records it: a row
    with attention data parallelism counts ``concurrency`` per DP rank (AIConfigurator's
    convention; every such row records ``silicon_concurrency`` = ``concurrency`` x
    ``attention_dp_size``, every other row the two equal), and InferenceX's client kept the
    benchmark's in flight over all the ranks. A measurement the file holds more than once is
    read once (:func:`distinct`)."""
    out = []
    with path.open() as fh:
        for r in csv.DictReader(line for line in fh if not line.startswith("#")):
            tp = int(float(r["tp_size"]))
            version = r["backend_version"] or None
            image = ""
            concurrency = int(float(r["concurrency"]))
            for part in (r.get("silicon_data_source") or "").split(";"):
                if "vllm-openai:" in part:
                    image = part.rsplit(":", 1)[1].strip()
                key, _, value = part.strip().partition("=")
                if key == "silicon_concurrency":
                    concurrency = int(value)
            if version and version.startswith("nightly"):
                version = None
            out.append(served(ServingRun(
                r["model_path"], r["system"], version, r["precision"],
                int(r["isl"]), int(r["osl"]), concurrency, tp,
                float(r["silicon_ttft_ms"]) / 1e3, float(r["silicon_tpot_ms"]) / 1e3,
                int(float(r.get("attention_dp_size") or 1)),
                int(float(r.get("moe_tp_size") or 0)), int(float(r.get("moe_ep_size") or 1)),
                image)))
    return distinct(out)


def distinct(runs: list[ServingRun]) -> list[ServingRun]:
    """``runs`` with each measurement once: silicon-e2e-moe.csv records many runs two or three
    times, from the database dump and from the per-day and gap-analysis files (776 rows, 531
    measurements; the B200 INT4 Kimi-K2.5's 45 rows are 15), with the same engine, load and
    means to 0.01 ms (the gap-analysis file rounds them), so a group's median would weigh a
    run by how many files kept it. Rows are the same measurement when they agree in
    everything :func:`served` makes of them but the image tag, and their means to 0.01 ms;
    the first is kept, with an image tag where a later copy records one (the flags of some
    scripts follow the image)."""
    kept: dict[tuple[object, ...], ServingRun] = {}
    for run in runs:
        key = (replace(run, image="", ttft_s=0.0, tpot_s=0.0),
               round(run.ttft_s * 1e3, 2), round(run.tpot_s * 1e3, 2))
        first = kept.setdefault(key, run)
        if not first.image and run.image:
            kept[key] = replace(first, image=run.image)
    return list(kept.values())


def served(run: ServingRun) -> ServingRun:
    """``run`` with the parallelism its server ran: as recorded, but for the rows of a script
    that serves tensor parallelism alone (:data:`TP_ONLY_SCRIPTS`), whose recorded expert and
    data-parallel split it never passed to vLLM: their experts sharded over the TP ranks and
    the client's requests (``run.concurrency``: :func:`read_silicon` reads the benchmark's
    ``silicon_concurrency``, ``concurrency x attention_dp`` on such a row) in flight on the one
    engine."""
    if (run.model, run.system, run.precision) not in TP_ONLY_SCRIPTS:
        return run
    return replace(run, attention_dp=1, moe_tp=run.tp, moe_ep=1)


@dataclass(frozen=True)
class Replay:
    """A measured run against its replay: the group it is reported in, and either the
    simulated means or why the simulator cannot run it."""

    name: str
    group: str
    measured_ttft_s: float
    measured_tpot_s: float
    #: simulated means (under the run's own client: closed loop as InferenceX's, open loop at
    #: the run's arrivals)
    ttft_s: float | None = None
    tpot_s: float | None = None
    skipped: str | None = None
    #: the model the replay ran (None where it did not run)
    model: ModelConfig | None = None

    @property
    def ttft_err(self) -> float | None:
        return None if self.ttft_s is None else self.ttft_s / self.measured_ttft_s - 1.0

    @property
    def tpot_err(self) -> float | None:
        return None if self.tpot_s is None else self.tpot_s / self.measured_tpot_s - 1.0


def silicon_engine(run: ServingRun) -> tuple[EngineArgs, ModelConfig, GPU, Version | None]:
    """The engine a silicon row ran (InferenceX's flags, the module docstring says which), as
    the simulator takes it, and the vLLM version whose defaults apply (the row's; where it
    records none, InferenceX's image's, :data:`INFERENCEX_VLLM`); raises
    :class:`SpecError` naming what the simulator does not model."""
    gpu_name = SILICON_GPUS.get(run.system, run.system)
    if run.is_moe:
        return _moe_engine(run, gpu_name)
    if run.precision not in MODELLED_PRECISIONS:
        raise SpecError(f"{run.precision} weights are not modelled")
    if run.model not in SILICON_MODELS:
        raise SpecError(f"model {run.model} is not in the catalog")
    checkpoint = SILICON_CHECKPOINTS.get((run.model, run.precision))
    if run.precision == "fp4" and checkpoint is None:
        raise SpecError(f"fp4 weights of {run.model}: no NVFP4 checkpoint of it is known")
    if gpu_name not in GPUS:
        raise SpecError(f"GPU {gpu_name} is not in the catalog")
    gpu = resolve_gpu(gpu_name)
    model = resolve_model(checkpoint or SILICON_MODELS[run.model])
    online = "fp8" if run.precision == "fp8" and not model.quantization else None
    version = parse_version(run.vllm_version, "backend_version") if run.vllm_version \
        else INFERENCEX_VLLM
    # the H100 script's config.yaml: 10240 whatever the lengths
    model_len = 10240 if run.system == "h100_sxm" else _model_len(run)
    kv_dtype = "auto" if run.system in BF16_KV_SYSTEMS and run.vllm_version is None else "fp8"
    args = EngineArgs(tensor_parallel_size=run.tp, quantization=online, kv_cache_dtype=kv_dtype,
                      async_scheduling=True, max_num_batched_tokens=8192,
                      max_num_seqs=512 if run.system == "b200_sxm" else run.concurrency,
                      gpu_memory_utilization=0.9, max_model_len=model_len)
    return args, model, gpu, version


def silicon_fused_allreduce_tokens(run: ServingRun, model: ModelConfig, gpu: GPU) -> int:
    """The largest step whose all-reduces a dense silicon row's server ran fused with the
    RMSNorm after them (:data:`FI_ALLREDUCE_FUSION_SYSTEMS`; 0: none); the MoE rows' scripts
    are replayed with vLLM's all-reduce."""
    thresholds = FI_ALLREDUCE_FUSION_SYSTEMS.get(run.system)
    if run.is_moe or thresholds is None:
        return 0
    return fi_allreduce_fusion_tokens(model.hidden_size, model.dtype_bytes, run.tp, gpu,
                                      thresholds)


#: Dense tensor TFLOP/s a GPU's weights of each dense silicon precision run at, as a multiple
#: of its data sheet's FP8 figure (FP4: Blackwell's NVFP4 is twice its FP8) or its bf16 one.
_PEAK_OF = {"fp8": ("fp8", 1.0), "fp4": ("fp8", 2.0), "bf16": ("bf16", 1.0)}


def peak_share(run: ServingRun) -> float | None:
    """The share of its GPUs' dense tensor peak (data sheet, at the row's precision) that a
    dense silicon row's measured means need, were every request's ``isl`` prompt tokens
    prefilled and its ``osl`` output tokens decoded in full: the closed loop completes
    ``concurrency / (TTFT + (osl - 1) TPOT)`` requests a second, each token costs 2 x the
    layers' parameters of GEMM FLOPs plus causal attention (4 x layers x q width x its
    context), each sampled token the LM head's. A floor on what the engine did (no overhead,
    no idle tensor cores): a share above what the GPU's own GEMMs reach says the row did less
    work than its lengths say (prefix-cache hits, shorter prompts). None for the MoE rows."""
    if run.is_moe or run.model not in SILICON_MODELS or run.precision not in _PEAK_OF:
        return None
    gpu = resolve_gpu(SILICON_GPUS.get(run.system, run.system))
    model = resolve_model(SILICON_CHECKPOINTS.get((run.model, run.precision))
                          or SILICON_MODELS[run.model])
    kind, times = _PEAK_OF[run.precision]
    peak = (gpu.fp8_tflops if kind == "fp8" else gpu.bf16_tflops) * times * 1e12 * run.tp
    per_request_s = run.ttft_s + (run.osl - 1) * run.tpot_s
    if peak <= 0 or per_request_s <= 0:
        return None
    # every token through the layers; the LM head only for the osl tokens sampled
    body = model.num_params(active_only=True) - model.embedding_params()
    gemm = 2.0 * (body * (run.isl + run.osl) + model.hidden_size * model.vocab_size * run.osl)
    attention = 4.0 * model.num_hidden_layers * model.q_dim * (
        run.isl * run.isl / 2 + run.osl * (run.isl + run.osl / 2))
    return run.concurrency / per_request_s * (gemm + attention) / peak


def _model_len(run: ServingRun) -> int:
    """``--max-model-len`` by InferenceX's rule (its H200 and MoE scripts)."""
    if (run.isl, run.osl) == (1024, 1024):
        return run.isl + run.osl + 20
    if 8192 in (run.isl, run.osl):
        return run.isl + run.osl + 200
    return 10240


def _moe_engine(run: ServingRun, gpu_name: str
                ) -> tuple[EngineArgs, ModelConfig, GPU, Version | None]:
    """A silicon-e2e-moe row's engine: the checkpoint's own ``config.json`` and InferenceX's
    flags for its MoE models (``benchmarks/gptoss_fp4_h200.sh``: ``--async-scheduling
    --no-enable-prefix-caching --max-num-batched-tokens 8192 --gpu-memory-utilization 0.9
    --max-num-seqs CONC``, ``--max-model-len`` by :func:`_model_len`, no ``--kv-cache-dtype``:
    the checkpoint's KV cache), assumed for every MoE row (they record parallelism and
    precision only); the H200's MiniMax-M2.5 rows of vLLM 0.18 expert parallel, as their
    script forced it (:data:`H200_MINIMAX_EP_SINCE`); on the B200, gpt-oss as
    ``gptoss_fp4_b200.sh`` runs it (``--kv-cache-dtype fp8 --max-num-seqs 512``) and
    MiniMax-M2.5 as its B200 scripts did when the row ran (:func:`_b200_minimax_args`); the
    vLLM environment variables the scripts export, where they choose a kernel, are
    :func:`silicon_env`'s."""
    short, configs = SILICON_MOE_MODELS[run.model]
    if gpu_name not in GPUS:
        raise SpecError(f"GPU {gpu_name} is not in the catalog")
    if run.precision not in configs:
        raise SpecError(f"{short} in {run.precision} is not a checkpoint the replay knows")
    if run.attention_dp > 1:
        return _dp_args(run), resolve_model(config_path=MOE_CONFIGS / configs[run.precision]), \
            resolve_gpu(gpu_name), \
            parse_version(run.vllm_version, "backend_version") if run.vllm_version else None
    if run.moe_ep not in (1, run.tp):
        raise SpecError(f"experts split {run.moe_tp} x {run.moe_ep} over TP {run.tp}: only "
                        "TP-sharded or expert-parallel over the TP ranks is modelled")
    model = resolve_model(config_path=MOE_CONFIGS / configs[run.precision])
    version = parse_version(run.vllm_version, "backend_version") if run.vllm_version else None
    ep = run.moe_ep > 1 or (
        run.system == "h200_sxm" and short == "MiniMax-M2.5" and version is not None
        and version >= H200_MINIMAX_EP_SINCE)
    if run.system == "b200_sxm" and short == "MiniMax-M2.5":
        args = _b200_minimax_args(run, ep)
    else:
        # InferenceX's B200 gpt-oss script (gptoss_fp4_b200.sh): an FP8 KV cache, 512 sequences
        b200_oss = run.system == "b200_sxm" and short == "gpt-oss-120b"
        args = EngineArgs(tensor_parallel_size=run.tp, async_scheduling=True,
                          max_num_batched_tokens=8192,
                          max_num_seqs=512 if b200_oss else run.concurrency,
                          kv_cache_dtype="fp8" if b200_oss else "auto",
                          gpu_memory_utilization=0.9, max_model_len=_model_len(run),
                          enable_expert_parallel=ep)
    return args, model, resolve_gpu(gpu_name), version


def _dp_args(run: ServingRun) -> EngineArgs:
    """A row with attention data parallelism: InferenceX's scripts with ``DP_ATTENTION=true``
    serve ``--tensor-parallel-size=1 --data-parallel-size=$TP --enable-expert-parallel`` (its
    B200 MoE scripts), so the row's ``tp`` GPUs are ``tp`` ranks of TP 1 (the row's
    ``moe_ep`` of ``tp x attention_dp`` counts them twice); the script's other flags as for
    the row's image (:func:`_b200_minimax_args`; Kimi-K2.5 as :func:`_moe_engine`'s)."""
    if run.attention_dp != run.tp:
        raise SpecError(f"attention data parallelism {run.attention_dp} over TP {run.tp}: "
                        "InferenceX's scripts run DP = TP ranks of TP 1")
    short = SILICON_MOE_MODELS[run.model][0]
    if short == "MiniMax-M2.5":
        base = _b200_minimax_args(run, True)
    else:
        base = EngineArgs(async_scheduling=True, max_num_batched_tokens=8192,
                          max_num_seqs=run.concurrency, gpu_memory_utilization=0.9,
                          max_model_len=_model_len(run))
    return replace(base, tensor_parallel_size=1, data_parallel_size=run.tp,
                   enable_expert_parallel=True)


def _b200_minimax_args(run: ServingRun, expert_parallel: bool) -> EngineArgs:
    """MiniMax-M2.5 on the B200 as InferenceX's scripts served it when the row ran (its
    ``minimaxm2.5_fp8_b200.sh`` and ``minimaxm2.5_fp4_b200.sh``, by the row's image). Under
    vLLM 0.17 (FP8, from 2026-03-11): ``--gpu-memory-utilization 0.95 --block-size 32``, the
    model's KV cache, vLLM's default batch budget and sequences, and
    ``--enable-expert-parallel`` whatever the row's expert split says (the script tests
    ``EP_SIZE -ge 1``, true at 1). The FP4 rows of the nightly image (the script of
    2026-04-02): ``--gpu-memory-utilization 0.95 --block-size 32 --kv-cache-dtype fp8``,
    vLLM's default batch budget. From the vLLM 0.19 image on (FP8 from 2026-04-03, FP4 from
    2026-04-08): ``--gpu-memory-utilization 0.90 --kv-cache-dtype fp8
    --max-num-batched-tokens 2*ISL``, FP8 also ``--block-size 32``. Expert parallel where the
    row's split is (``EP_SIZE -gt 1``) but under 0.17; async scheduling and no prefix cache
    throughout (vLLM's default since 0.14; ``--no-enable-prefix-caching``: the random prompts
    share nothing)."""
    if run.image.startswith("v0.17"):
        return EngineArgs(tensor_parallel_size=run.tp, async_scheduling=True,
                          gpu_memory_utilization=0.95, block_size=32,
                          max_model_len=_model_len(run), enable_expert_parallel=True)
    if run.image.startswith("nightly"):
        return EngineArgs(tensor_parallel_size=run.tp, async_scheduling=True,
                          gpu_memory_utilization=0.95, block_size=32, kv_cache_dtype="fp8",
                          max_model_len=_model_len(run), enable_expert_parallel=expert_parallel)
    return EngineArgs(tensor_parallel_size=run.tp, async_scheduling=True,
                      max_num_batched_tokens=2 * run.isl, kv_cache_dtype="fp8",
                      gpu_memory_utilization=0.9, max_model_len=_model_len(run),
                      block_size=32 if run.precision == "fp8" else 16,
                      enable_expert_parallel=expert_parallel)


def silicon_env(run: ServingRun) -> dict[str, str]:
    """The vLLM environment variables a silicon row's server ran with, where they choose a
    kernel the step time prices (:func:`chunktune.sim.cost.step_time.moe_weight_format`):
    InferenceX's B200 gpt-oss script exports ``VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1`` (every
    version since 2025-09; MXFP8 activations for the MXFP4 experts), its B200 MiniMax-M2.5 FP8
    script under vLLM 0.17 ``VLLM_USE_FLASHINFER_MOE_FP8=0 VLLM_MOE_USE_DEEP_GEMM=0`` (Triton's
    block-FP8 ``fused_moe``); its H100 and H200 gpt-oss scripts ``VLLM_MXFP4_USE_MARLIN=1``
    (Marlin's MXFP4 experts, not OpenAI's Triton kernel) from 2026-01-02 on, the rows of the
    images since (vLLM 0.13 and later: :data:`HOPPER_MXFP4_MARLIN_SINCE`)."""
    if not run.is_moe:
        return {}
    short = SILICON_MOE_MODELS[run.model][0]
    if run.system in ("h100_sxm", "h200_sxm"):
        marlin = short == "gpt-oss-120b" and run.vllm_version is not None and parse_version(
            run.vllm_version, "backend_version") >= HOPPER_MXFP4_MARLIN_SINCE
        return {"VLLM_MXFP4_USE_MARLIN": "1"} if marlin else {}
    if run.system != "b200_sxm":
        return {}
    if short == "gpt-oss-120b":
        return {"VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8": "1"}
    if short == "MiniMax-M2.5" and run.precision == "fp8" and run.image.startswith("v0.17"):
        return {"VLLM_USE_FLASHINFER_MOE_FP8": "0", "VLLM_MOE_USE_DEEP_GEMM": "0"}
    return {}


def moe_config_files() -> list[str]:
    """The ``config.json`` files (and ``hf_quant_config.json`` where the shared data has one)
    the MoE rows' replays read, by name."""
    names = sorted(n for _, configs in SILICON_MOE_MODELS.values() for n in configs.values())
    return names + [n.replace("_config.json", "_hf_quant_config.json") for n in names
                    if (MOE_CONFIGS / n.replace("_config.json", "_hf_quant_config.json")).exists()]


def replay_client(engine: Engine | DataParallelEngine, run: ServingRun, server: ServerCost,
                  seed: int = CLIENT_SEED) -> tuple[float, float]:
    """(mean TTFT, mean TPOT) of ``run`` replayed as InferenceX's client sent it (see the
    module docstring): ``PROMPTS_PER_SLOT`` x ``run.concurrency`` requests of drawn lengths,
    ``run.concurrency`` in flight, the first wave at once; TPOT = (E2E - TTFT) / (the
    request's output tokens - 1), each mean over every request."""
    n = run.concurrency
    total = PROMPTS_PER_SLOT * n
    rng = np.random.default_rng(seed)
    isl = rng.integers(int(run.isl * RANGE_RATIO), run.isl + 1, total)
    osl = rng.integers(int(run.osl * RANGE_RATIO), run.osl + 1, total)
    specs = [RequestSpec(i, 0.0 if i < n else None, int(isl[i]), int(osl[i]), 0)
             for i in range(total)]
    res = engine.replay(specs, concurrency=n, record_steps=False,
                        server_overhead_s=server.fixed_s,
                        server_per_token_s=server.per_prompt_token_s)
    if len(res.requests) < total or any(r.finish_time < 0 for r in res.requests):
        raise RuntimeError(f"closed-loop replay of {run.name} stopped before every request "
                           "finished")
    ttft = [r.first_token - r.arrival for r in res.requests]
    tpot = [(r.finish_time - r.first_token) / max(int(osl[r.rid]) - 1, 1)
            for r in res.requests]
    return float(np.mean(ttft)), float(np.mean(tpot))


def replay_silicon(run: ServingRun) -> Replay:
    """One silicon row replayed, or the reason it cannot be."""
    group = run.group
    base = Replay(run.name, group, run.ttft_s, run.tpot_s)
    try:
        args, model, gpu, version = silicon_engine(run)
        engine: Engine | DataParallelEngine = (
            build_data_parallel_engine(args, model, gpu, version, silicon_env(run))
            if args.data_parallel_size > 1 else
            build_engine(args, model, gpu, version, silicon_env(run),
                         silicon_fused_allreduce_tokens(run, model, gpu)))
    except SpecError as e:
        return _skip(base, str(e))
    except EngineStartupError as e:
        return _skip(base, f"the engine does not start here ({e.reason})")
    ttft, tpot = replay_client(engine, run, API_SERVER)
    # the model as the row names it (meta-llama/Llama-3.1-70B ran as the catalog's Instruct),
    # or the checkpoint it ran where not the row's own (the B200 FP4 rows': Llama-3.3-70B's)
    ran = apply_quantization(model, args.quantization)
    ran = (model_named(ran) if (run.model, run.precision) in SILICON_CHECKPOINTS
           else replace(ran, name=run.model.split("/")[-1]))
    return Replay(run.name, group, run.ttft_s, run.tpot_s, ttft, tpot, model=ran)


def replay_engine_run(run: EngineRun, peer_to_peer: bool | None = None) -> Replay:
    """One LLMServingSim run (open loop, engine-side timestamps): mean TTFT and TPOT, its
    node's peer-to-peer path as ``peer_to_peer`` says (None: not stated, as the guard replays
    them: their hosts' is not recorded)."""
    group = f"{run.gpu} bf16"
    meas = measured_latencies(run)
    base = Replay(run.name, group, float(np.mean(meas["ttft"])), float(np.mean(meas["tpot"])))
    try:
        pred = simulate_run(run, peer_to_peer=peer_to_peer)
    except SpecError as e:
        return _skip(base, str(e))
    return Replay(run.name, group, base.measured_ttft_s, base.measured_tpot_s,
                  float(np.mean(pred["ttft"])), float(np.mean(pred["tpot"])),
                  model=model_named(resolve_model(run.model)))


def _skip(base: Replay, why: str) -> Replay:
    return Replay(base.name, base.group, base.measured_ttft_s, base.measured_tpot_s,
                  skipped=why)


#: How :func:`by_harness` labels the rows that record no harness (after their vLLM version).
UNKNOWN_HARNESS = "harness ?"


def by_harness(runs: Sequence[ServingRun], replays: Sequence[Replay]) -> list[Replay]:
    """``replays`` of ``runs`` (in the same order), each group split by whether the row's
    harness is known: ``"h200 fp8, InferenceX"`` (the rows that name no vLLM version) or
    ``"h200 fp8, vLLM 0.12.0, harness ?"`` (the rows that record a version and no harness)."""
    if len(runs) > len(replays):
        raise ValueError("fewer replays than runs")
    return [replace(rep, group=f"{rep.group}, " + (
        "InferenceX" if run.vllm_version is None
        else f"vLLM {run.vllm_version}, {UNKNOWN_HARNESS}"))
        for run, rep in zip(runs, replays, strict=False)]


#: Bytes a weight of each ``precision`` of the silicon rows: which of a GPU's groups of as many
#: runs :func:`fidelity_table` shows (the wider format, whose kernels the cost model was fitted
#: on most).
_WIDTH = {"bf16": 2.0, "fp8": 1.0, "int4": 0.5, "fp4": 0.5}


def fidelity_table(runs: Sequence[ServingRun], replays: Sequence[Replay],
                   moe_replays: Sequence[Replay] = ()) -> dict[str, Any]:
    """Per GPU (our name), the end-to-end figures :func:`chunktune.sim.cost.provenance
    .provenance` shows: the median |error| of TPOT and TTFT over the dense runs whose
    harness is known (InferenceX's silicon rows, LLMServingSim's runs; not the rows that
    record none), rounded to 0.1%, of the GPU's largest group; and under ``models`` the same
    per model and weight format (:attr:`ModelConfig.shape_key`, :attr:`ModelConfig.weights`)
    over those runs and the MoE rows (InferenceX's; ``moe_replays``, but those of attention
    data parallelism: another engine, reported apart), so a run of a model is quoted its own
    figures. (LLMServingSim's one Qwen3-30B-A3B run, two data-parallel ranks, is the model's
    only run on its GPU and stays in.)
    ``replays``: the silicon rows' replays in the order of ``runs``, then the RTX runs'."""
    known = [r for r in by_harness(runs, replays) if not r.group.endswith(UNKNOWN_HARNESS)]
    known += list(replays[len(runs):])
    out: dict[str, Any] = {}
    for g in summarize(known).values():
        if not g.run or g.tpot_median_abs_err is None or g.ttft_median_abs_err is None:
            continue
        gpu, _, rest = g.group.partition(" ")
        precision = rest.split(",")[0]
        if gpu in out and (out[gpu]["runs"], _WIDTH.get(out[gpu]["precision"], 0)) >= (
                g.run, _WIDTH.get(precision, 0)):
            continue  # the GPU's largest group; of two as large, the wider format's (B200: FP8)
        out[gpu] = {"precision": precision, "runs": g.run,
                    "tpot": round(g.tpot_median_abs_err, 3),
                    "ttft": round(g.ttft_median_abs_err, 3)}
    per_model: dict[tuple[str, str, str], list[Replay]] = {}
    for r in [*known, *(m for m in moe_replays if not m.group.endswith(ATTENTION_DP))]:
        if r.model is not None and r.skipped is None:
            gpu = r.group.partition(" ")[0]
            per_model.setdefault((gpu, r.model.shape_key, r.model.weights), []).append(r)
    for (gpu, shape, weights), rs in sorted(per_model.items()):
        if gpu not in out:
            continue
        f = summarize(replace(r, group=gpu) for r in rs)[gpu]
        assert f.tpot_median_abs_err is not None and f.ttft_median_abs_err is not None
        out[gpu].setdefault("models", []).append({
            "model": rs[0].model.name if rs[0].model else "", "shape": shape,
            "weights": weights, "moe": bool(rs[0].model and rs[0].model.is_moe), "runs": f.run,
            "tpot": round(f.tpot_median_abs_err, 3), "ttft": round(f.ttft_median_abs_err, 3)})
    return dict(sorted(out.items()))


def model_named(model: ModelConfig) -> ModelConfig:
    """``model`` named as its Hugging Face repo names it, without the organisation."""
    return replace(model, name=(model.hf_name or model.name).split("/")[-1])


@dataclass(frozen=True)
class GroupFigures:
    """One GPU and precision: rows, rows not run, median |error| of TPOT and TTFT."""

    group: str
    rows: int
    run: int
    tpot_median_abs_err: float | None
    ttft_median_abs_err: float | None
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
                              med([r.ttft_err for r in ran]), skipped)
    return out


@dataclass(frozen=True)
class FirstTokenResidual:
    """A light-load silicon row: its measured mean TTFT against the replay's without any
    server cost (prefill and step waits only, the run's client)."""

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
                or run.system not in systems or run.is_moe):
            continue
        try:
            args, model, gpu, version = silicon_engine(run)
            engine = build_engine(args, model, gpu, version)
        except (SpecError, EngineStartupError):
            continue
        ttft, _ = replay_client(engine, run, ServerCost())
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
    # the client's prompts average (1 + RANGE_RATIO) / 2 of the row's ISL
    mean_prompt = (1 + RANGE_RATIO) / 2
    left = [r.residual_s - per_prompt_token_s * mean_prompt * r.run.isl for r in residuals
            if r.run.tp == top]
    return ServerCost(float(statistics.median(left)), per_prompt_token_s)


def quick(runs: Sequence[ServingRun], budget: int = 250_000) -> list[ServingRun]:
    """The rows whose replay is cheap (:attr:`ServingRun.request_steps` within ``budget``):
    what the CI guard replays."""
    return [r for r in runs if r.request_steps <= budget]


# ---- the committed copy of LLMServingSim's runs -------------------------------------------------

_RUN_COLUMNS = ("run", "gpu", "model", "tp", "dp", "max_num_seqs", "max_num_batched_tokens",
                "max_model_len", "kv_blocks", "ep")
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
                        run.kv_blocks or "", int(run.ep)])
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
                int(r["kv_blocks"]) if r["kv_blocks"] else None, [],
                r.get("ep", "0") == "1")
    with requests_path.open() as fh:
        for r in csv.DictReader(line for line in fh if not line.startswith("#")):
            runs[r["run"]].requests.append((float(r["arrival_s"]), int(r["prompt_tokens"]),
                                            int(r["output_tokens"]), float(r["ttft_s"]),
                                            float(r["e2e_s"])))
    return list(runs.values())
