"""Step-time model: how long one engine step takes for the batch it runs.

A step's time is the sum of

- the **linear operators** of every layer (QKV, O, gate/up and down projections; an MoE layer's
  routed experts; norms, RoPE, activation, residual add) as a function of the step's token
  count ``T``: each GEMM from the GPU's own measured grid where it covers the shape
  (:mod:`chunktune.sim.cost.gemm_table`), else a fitted roofline ``overhead + (compute^p +
  memory^p)^(1/p)``, in bf16 or FP8 (:data:`WEIGHT_DTYPES`);
- **attention** (:func:`attention_layer_time`). With a prefill chunk in the batch the varlen
  kernel runs one CTA per 64-row query tile and query head (a decode is a one-row tile): the
  soft maximum of its padded FLOPs (all CTAs at the bf16 peak, where the GPU runs
  FlashAttention 2 with the query tiles' work beside their MMAs at SMs x clock; or the longest
  CTA on one SM: its MMAs at that SM's share of the peak and the work beside them at the SM's
  clock) and its memory traffic (the tiles' K/V reads, the decodes' KV read once per KV head
  from HBM and re-read per query head through L2 at a rate per SM, where the group's query
  heads run in one wave or one KV head's KV fits the L2), plus a fixed cost per wave of CTAs
  over the SMs; decodes alone are memory-bound on their KV bytes. An FP8 KV cache costs its
  measured bytes per element (``attn_kv_fp8_bytes``: the FP8 kernels do not read it at twice
  the bf16 rate) and a fixed cost per layer;
- **lm_head and sampling** for the rows that produce a token (decodes, last prefill chunks);
- **tensor-parallel all-reduces**, two per layer of the step's activations
  (:func:`chunktune.sim.cost.collectives.tp_allreduce_s`);
- a fixed **per-step overhead** (scheduling, input preparation, launch) plus a small cost per
  scheduled request: the host's part of a step; at TP > 1 also the executor's messages
  (:data:`EXECUTOR_IPC_S`). Under async scheduling (vLLM's default since 0.14) the host
  prepares the next step while the GPU runs this one, so a step takes the longer of the two
  parts, not their sum.

Every coefficient is the GPU's own, fitted on its measured kernels, or borrowed from the
nearest measured GPU (:mod:`chunktune.sim.cost.coefficients`, fitted offline by
:mod:`chunktune.sim.cost.fit.kernel_fit`). The linear part depends only on ``T``, so it is
tabulated once per engine for every ``T`` up to the budget; a step then costs a table lookup
plus a few multiplications.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from chunktune.core.errors import SpecError
from chunktune.core.gpus import GPU
from chunktune.core.infile import shown
from chunktune.core.models import DTYPE_BYTES, SLIDING, ModelConfig
from chunktune.core.vllm_release import CURRENT, Version
from chunktune.sim.cost import gemm_table, mla_table, moe_table
from chunktune.sim.cost.coefficients import (
    KernelCoefficients,
    coefficients,
    lent_quant_memory_eff,
    quant_rule,
)
from chunktune.sim.cost.collectives import Interconnect, nccl_gather_scatter_s, tp_allreduce_s
from chunktune.sim.cost.moe_table import SM100_GPUS

#: Weight dtypes the linear operators run in: ``bf16`` (also fp16), ``fp8`` (an FP8
#: checkpoint or ``--quantization fp8``: FP8 weights and per-tensor scaled FP8 activations) and
#: ``nvfp4`` (a ModelOpt NVFP4 checkpoint's dense linear layers on a GPU with FP4 tensor cores:
#: W4A4, FP4 weights with an FP8 scale per 16, the activations quantised to NVFP4 on the fly;
#: vLLM ``quantization/modelopt.py`` ``ModelOptNvFp4LinearMethod``).
WEIGHT_DTYPES = ("bf16", "fp8", "nvfp4")

#: At TP > 1 vLLM runs its workers in their own processes (``MultiprocExecutor``; TP 1 runs
#: ``UniProcExecutor``, a call in the engine core's process): each step is two RPCs over a
#: shared-memory ``MessageQueue`` (``vllm/v1/executor/multiproc_executor.py``:
#: ``execute_model`` pickles the ``SchedulerOutput`` to every worker, ``sample_tokens`` then
#: returns rank 0's ``ModelRunnerOutput``; ``EngineCore.step`` waits for both), each message
#: pickled by its sender and unpickled by its reader in turn. Their serialization, timed with
#: vLLM 0.12's own ``shm_broadcast`` and messages of its fields on a loaded 2-core Xeon (CPU
#: time, least of 7 repeats, 1-512 decodes; not a GPU host's CPU): 18.7 us + 0.66 us per
#: scheduled request. A lower bound: the readers' wake-up (they spin on their own cores on a
#: GPU host) is not in it. Host time: overlapped like the rest under async scheduling.
EXECUTOR_IPC_S = 1.87e-5
#: Of the elementwise kernels a layer launches (:func:`linear_op_times`: two RMSNorms, the
#: residual add, the rotary embedding, the activation), those FlashInfer's fused all-reduce
#: runs inside its own kernel where vLLM fuses them (``AllReduceFusedAddRMSNorm*Pattern``,
#: vLLM 0.10.2 ``compilation/collective_fusion.py``: all-reduce, residual add, RMSNorm and
#: the next GEMM's FP8 or NVFP4 quantization in one kernel): the two norms and the add.
FUSED_ALLREDUCE_KERNELS = 3
EXECUTOR_IPC_PER_REQUEST_S = 6.6e-7


def layer_gemms(model: ModelConfig, tp: int) -> list[tuple[float, float]]:
    """The (K, N) weight shapes of one layer's GEMMs on one rank (dense part: a dense model's
    MLP, or the one Gemma-4 runs beside its experts)."""
    h = model.hidden_size
    q = model.q_dim / tp
    kv = max(1, math.ceil(model.num_key_value_heads / tp)) * model.head_dim
    shapes = [(h, q + 2 * kv), (q, h)]
    if not model.is_moe or model.dense_mlp_beside_moe:
        i = model.intermediate_size / tp
        shapes += [(h, 2 * i), (i, h)] if model.gated_mlp else [(h, i), (i, h)]
    return shapes


#: The operators :func:`linear_op_times` prices separately: the dense layer's four GEMMs, the
#: routed experts of a mixture-of-experts layer (with its router and shared experts), and the
#: elementwise kernels (norms, rotary embedding, activation, residual add) together.
LINEAR_OPS = ("qkv", "o", "up", "down", "experts", "elementwise")


def gemm_form(m: np.ndarray, k: float | np.ndarray, n: float | np.ndarray, gpu: GPU,
              c: KernelCoefficients, weight_dtype: str = "bf16") -> np.ndarray:
    """The fitted form of a GEMM's seconds (arrays broadcast): ``overhead + (compute^p +
    memory^p)^(1/p)``, compute at a fraction of the dtype's peak, memory the weights and bf16
    activations at a fraction of HBM; FP8 adds the activation's quantisation (read bf16, write
    fp8). FP8 on a GPU without FP8 tensor cores runs weight-only (Marlin): the bf16 terms with
    one byte per weight. NVFP4 (only where a shape lies outside the GPU's measured nvfp4
    grid): the FP8 terms with its bytes per weight, scales included (borrowed: no FP4 form is
    fitted)."""
    m = np.asarray(m, dtype=np.float64)
    B = gpu.hbm_tb_s * 1e12
    fp8 = weight_dtype in ("fp8", "nvfp4") and gpu.fp8_tflops > 0
    wb = {"fp8": 1.0, "nvfp4": DTYPE_BYTES["nvfp4"]}.get(weight_dtype, 2.0)
    if fp8:
        F, me, ov, p = (gpu.fp8_tflops * 1e12 * c.fp8_compute_eff, c.fp8_memory_eff,
                        c.fp8_overhead_s, c.fp8_smoothness)
    else:
        F, me, ov, p = (gpu.bf16_tflops * 1e12 * c.gemm_compute_eff, c.gemm_memory_eff,
                        c.gemm_overhead_s, c.gemm_smoothness)
    comp = 2.0 * m * k * n / F
    mem = (k * n * wb + (m * k + m * n) * 2.0) / (B * me)
    t: np.ndarray = ov + (comp**p + mem**p) ** (1.0 / p)
    if fp8:
        t = t + m * k * 3.0 / (B * c.fp8_quant_memory_eff)
    return t


def lender_coefficients(c: KernelCoefficients, gpu: GPU, lender: GPU) -> KernelCoefficients:
    """``c`` as borrowed by ``gpu`` from ``lender``, with the terms carried over to ``gpu``'s
    data sheet (:func:`chunktune.sim.cost.coefficients.lent_quant_memory_eff`) taken back to
    ``lender``'s: the form on the lender's sheet that its measured table is scaled by."""
    eff = lent_quant_memory_eff(c.fp8_quant_memory_eff, gpu, lender, quant_rule())
    return replace(c, fp8_quant_memory_eff=eff)


def gemm_time(m: np.ndarray, k: float, n: float, gpu: GPU, c: KernelCoefficients,
              weight_dtype: str = "bf16", use_table: bool = True,
              vllm_version: Version | None = None) -> np.ndarray:
    """Seconds of one GEMM, an ``m x k`` activation times a ``k x n`` weight, for each ``m``.

    Where the GPU's own measured grid in that dtype covers (``n``, ``k``) (``use_table``), its
    interpolation (:mod:`chunktune.sim.cost.gemm_table`), never faster than the weights take
    to stream from HBM at the fraction of the data sheet the grid's GPU reaches
    (:func:`chunktune.sim.cost.gemm_table.weight_stream_s`: the grid's small weights stayed in
    L2 between its repeated calls; in an engine each layer's weights come from HBM); where it
    borrows a same-architecture neighbour's grid (:func:`chunktune.sim.cost.gemm_table.lent`),
    that grid scaled by the ratio of the two GPUs' fitted forms; else the fitted form
    (:func:`gemm_form`). NVFP4 from the GPU's own measured grid of the kernel vLLM
    ``vllm_version`` (None: the current release) runs there
    (:func:`chunktune.sim.cost.gemm_table.nvfp4_table`), else from its family neighbour's
    (:func:`chunktune.sim.cost.gemm_table.nvfp4_lender`: the B300's and GB200's, the B200's)
    scaled by the ratio of the two GPUs' forms at their FP4 peaks; else the form."""
    if weight_dtype == "nvfp4":
        fp4 = gemm_table.nvfp4_table(gpu, vllm_version) if use_table else None
        if fp4 is not None and fp4.covers(n, k):
            floor = gemm_table.weight_stream_s(k, n, "nvfp4", gpu, gpu.name)
            measured: np.ndarray = np.maximum(fp4.seconds(m, n, k), floor)
            return measured
        src = gemm_table.nvfp4_lender(gpu) if use_table else None
        theirs = None if src is None else gemm_table.nvfp4_table(src, vllm_version)
        if src is not None and theirs is not None and theirs.covers(n, k):
            # the neighbour's grid scaled by the two GPUs' forms at their FP4 peaks
            scale = gemm_form(m, k, n, replace(gpu, fp8_tflops=gpu.fp4_tflops), c,
                              weight_dtype) / gemm_form(
                m, k, n, replace(src, fp8_tflops=src.fp4_tflops),
                lender_coefficients(c, gpu, src), weight_dtype)
            lent_fp4: np.ndarray = np.maximum(
                theirs.seconds(m, n, k) * scale,
                gemm_table.weight_stream_s(k, n, "nvfp4", gpu, src.name))
            return lent_fp4
        return gemm_form(m, k, n, gpu, c, weight_dtype)
    fp8 = weight_dtype == "fp8"
    own = "fp8" if fp8 and gpu.fp8_tflops > 0 else "bf16"
    table = gemm_table.table(gpu.name, own) if use_table and (own == "fp8") == fp8 else None
    if table is not None and table.covers(n, k):
        out: np.ndarray = np.maximum(table.seconds(m, n, k),
                                     gemm_table.weight_stream_s(k, n, own, gpu, gpu.name))
        return out
    lent = gemm_table.lent(gpu, own) if use_table and (own == "fp8") == fp8 else None
    if lent is not None and lent[1].covers(n, k):  # a neighbour's table, scaled
        scale = gemm_form(m, k, n, gpu, c, weight_dtype) / gemm_form(
            m, k, n, lent[0], lender_coefficients(c, gpu, lent[0]), weight_dtype)
        borrowed: np.ndarray = np.maximum(lent[1].seconds(m, n, k) * scale,
                                          gemm_table.weight_stream_s(k, n, own, gpu,
                                                                     lent[0].name))
        return borrowed
    return gemm_form(m, k, n, gpu, c, weight_dtype)


def linear_op_times(model: ModelConfig, gpu: GPU, tp: int, tokens: np.ndarray,
                    c: KernelCoefficients, weight_dtype: str = "bf16",
                    use_table: bool = True,
                    expert_parallel: bool = False,
                    vllm_env: Mapping[str, str] | None = None,
                    vllm_version: Version | None = None) -> dict[str, np.ndarray]:
    """Seconds each linear operator of ONE layer takes on one rank, for each token count
    (keys: the ``LINEAR_OPS`` the model has). Measured per operator, these separate the GEMM
    efficiencies from the elementwise kernels, which a per-layer sum alone cannot.
    ``expert_parallel``, ``vllm_env``: how the routed experts are split and which kernel runs
    them (:func:`moe_time`); ``vllm_version``: the release, which picks the NVFP4 GEMM kernel
    (:func:`gemm_time`)."""
    T = np.asarray(tokens, dtype=np.float64)
    b = model.dtype_bytes

    # a mixture-of-experts layer has only the attention's two: zip stops there; an MLA
    # layer's projections are timed with its attention (mla_table: the whole module). A
    # 4-bit MoE checkpoint's attention projections and dense MLPs run what
    # four_bit_linear_dtype says (NVFP4 W4A4 where quantized, else weight_dtype)
    dtypes = {name: four_bit_linear_dtype(model, gpu, module) or weight_dtype
              for name, module in (("qkv", "attention"), ("o", "attention"),
                                   ("up", "dense_mlp"), ("down", "dense_mlp"))}
    out = {name: gemm_time(T, k, n, gpu, c, dtypes[name], use_table, vllm_version)
           for name, (k, n)
           in zip(("qkv", "o", "up", "down"), layer_gemms(model, tp), strict=False)
           if not (model.is_mla and name in ("qkv", "o"))}
    h = model.hidden_size
    q = model.q_dim / tp
    kv = max(1, math.ceil(model.num_key_value_heads / tp)) * model.head_dim
    if model.is_moe:
        routed = moe_time(model, gpu, tp, T, c, weight_dtype, use_table, expert_parallel,
                          vllm_env)
        router = gemm_time(T, h, model.num_experts, gpu, c, "bf16", use_table)  # bf16
        out["experts"] = routed + router
        if model.num_shared_experts or model.shared_expert_intermediate_size:
            si = (model.shared_expert_intermediate_size
                  or model.num_shared_experts * model.moe_intermediate_size) / tp
            # shared experts the checkpoint quantizes to 4 bits: four_bit_linear_dtype
            shared = four_bit_linear_dtype(model, gpu, "shared_experts") or weight_dtype
            up = gemm_time(T, h, 2 * si, gpu, c, shared, use_table, vllm_version)
            down = gemm_time(T, si, h, gpu, c, shared, use_table, vllm_version)
            side = shared_experts_side_stream(vllm_env) if gpu.name != "cpu" else 0
            # on the side stream the shared experts run beside the router and the routed
            # experts (SharedFusedMoE): the layer takes the longer of the two, the main
            # stream's lengthened by the SMs the shared GEMMs hold meanwhile
            busy = up * side_stream_sm_share(T, 2 * si, gpu) \
                + down * side_stream_sm_share(T, h, gpu)
            alongside = np.less_equal(T, side)
            out["experts"] = np.where(alongside, np.maximum(out["experts"] + busy, up + down),
                                      out["experts"] + up + down)
        inter = model.moe_intermediate_size * model.num_experts_per_tok / tp
    else:
        inter = model.intermediate_size / tp
    # Elementwise, a kernel each: two RMSNorms (read h, write h), RoPE on q and k, the
    # activation (read 2i, write i), the residual add (read 2h, write h); an MLA layer's rotary
    # embedding runs inside its measured module (vLLM's DeepseekV2MLAAttention applies it in
    # forward: mla_table times it with the projections)
    kernel_bytes = [T * b * 2 * h, T * b * 2 * h, T * b * 3 * inter, T * b * 3 * h]
    if not model.is_mla:
        kernel_bytes.append(T * b * 2 * (q + kv))
    if model.qk_norm_allreduce and tp > 1:
        # MiniMax-M2's q/k norm in fp32 (MiniMaxText01RMSNormTP.forward_qk, compiled): the
        # all-reduce of the variances cuts it in two, a kernel of its own reading q and k for
        # their variances, and the scaling, fused with the rotary embedding's kernel after it
        # (at TP 1 the whole norm fuses there)
        kernel_bytes.append(T * b * (q + kv))
    out["elementwise"] = elementwise_time(kernel_bytes, gpu, c)
    return out


def elementwise_time(kernel_bytes: list[np.ndarray], gpu: GPU, c: KernelCoefficients
                     ) -> np.ndarray:
    """Seconds of elementwise kernels that each read and write ``kernel_bytes`` (one array of
    token counts' bytes per kernel): a fixed cost each, and their bytes at the L2's rate as
    far as the kernel's bytes fit the L2 (``min(1, L2 / bytes)`` of them: what the kernel
    before it wrote is still there), at the HBM's for the rest. The L2 rate is bytes per SM
    clock cycle (``elementwise_l2_bytes_per_sm_cycle`` x SMs x clock), the HBM's a fraction
    of the data sheet (``elementwise_memory_eff``). Measured alone, the same activation
    kernel (Llama-3.1-8B, 14,336 wide) on the RTX PRO 6000 (128 MB of L2) moves 4.5 TB/s at
    512 tokens (44 MB) and 1.9 at 2,048 (176 MB), on the RTX 4090 (72 MB) 1.6 and 1.0
    (LLMServingSim's vLLM 0.19 profiles); the A40's 6 MB hold nothing a kernel streams."""
    l2 = gpu.l2_mib * 2**20
    hbm = gpu.hbm_tb_s * 1e12 * c.elementwise_memory_eff
    cache = max(c.elementwise_l2_bytes_per_sm_cycle * gpu.sm_count * gpu.boost_mhz * 1e6, hbm)
    out: np.ndarray = np.zeros_like(np.asarray(kernel_bytes[0], dtype=np.float64))
    for w in kernel_bytes:
        hit = np.minimum(1.0, l2 / np.maximum(w, 1.0))
        out = out + c.elementwise_overhead_s + w * (hit / cache + (1.0 - hit) / hbm)
    return out


#: vLLM's ``VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD`` default (0.15.1, 0.17, 0.19, 0.33
#: ``envs.py``): steps of at most this many tokens run an MoE layer's shared experts on a
#: side CUDA stream.
SHARED_EXPERTS_STREAM_TOKENS = 256


def shared_experts_side_stream(vllm_env: Mapping[str, str] | None = None) -> int:
    """The most tokens a step may have for vLLM to run the shared experts of an MoE layer on a
    side CUDA stream (``aux_stream()``), beside the router GEMM and the routed experts
    (``SharedFusedMoE``; vLLM 0.17 ``fused_moe/runner/default_moe_runner.py``
    ``_maybe_setup_shared_experts_stream``); 0 with
    ``VLLM_DISABLE_SHARED_EXPERTS_STREAM=1``. Not for the data-parallel chunked path, which
    the data-parallel step prices apart."""
    env = vllm_env or {}
    if env_flag(env, "VLLM_DISABLE_SHARED_EXPERTS_STREAM"):
        return 0
    return int(env.get("VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD",
                       SHARED_EXPERTS_STREAM_TOKENS))


#: Output rows and columns of one CTA's tile in the GEMMs a decode step runs (128 x 128,
#: the CUTLASS / FlashInfer tile of Hopper's and Blackwell's FP8 and FP4 GEMMs at small M).
GEMM_TILE = 128


def side_stream_sm_share(tokens: np.ndarray, n: float, gpu: GPU) -> np.ndarray:
    """The share of ``gpu``'s SMs a GEMM of ``tokens`` rows and ``n`` output columns holds
    while it runs on a side stream, one CTA a 128 x 128 output tile (:data:`GEMM_TILE`), at
    most all of them: the routed experts' kernel beside it, which fills the GPU, waits that
    share of the GEMM's time for its SMs. Derived from the tile and the SM count; not
    measured (no concurrent-kernel timing here)."""
    ctas = np.ceil(np.maximum(tokens, 1) / GEMM_TILE) * math.ceil(n / GEMM_TILE)
    out: np.ndarray = np.minimum(1.0, ctas / gpu.sm_count)
    return out


#: 4-bit weight formats (:data:`chunktune.core.models.DTYPE_BYTES`) whose routed experts the
#: step time prices: MXFP4 (gpt-oss: vLLM 0.33 ``quantization/mxfp4.py``, Marlin or Triton on
#: Hopper, FlashInfer TRT-LLM W4A16 on Blackwell), NVFP4 (ModelOpt W4A4: ``modelopt.py``,
#: FlashInfer TRT-LLM/CUTLASS on Blackwell), INT4 W4A16 in groups (Kimi-K2.x:
#: ``compressed_tensors_moe.py``, Marlin).
FOUR_BIT = ("mxfp4", "nvfp4", "int4_g32", "int4_g64", "int4_g128")


#: Hopper GPUs (SM90, vLLM's ``is_device_capability(90)``), where vLLM runs MXFP4 experts with
#: OpenAI's Triton kernels (``triton_kernels``) unless ``VLLM_MXFP4_USE_MARLIN=1``.
SM90_GPUS = frozenset({"h100-sxm", "h100-pcie", "h200"})


#: The vLLM environment variables the step time and the memory plan read, as ``vllm/envs.py``
#: reads them: ``flag`` ``bool(int(v))``, ``count`` ``int(v)``.
VLLM_ENV_READ = {"VLLM_USE_FLASHINFER_MOE_FP8": "flag", "VLLM_MOE_USE_DEEP_GEMM": "flag",
                 "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8": "flag", "VLLM_MXFP4_USE_MARLIN": "flag",
                 "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16": "flag",
                 "VLLM_DISABLE_SHARED_EXPERTS_STREAM": "flag",
                 "VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD": "count"}


#: The first release checked that no longer reads a variable of :data:`VLLM_ENV_READ` (0.31.0:
#: its ``envs.py`` has none of the four; vLLM picks those MoE kernels by its kernel oracle).
VLLM_ENV_GONE = {"VLLM_USE_FLASHINFER_MOE_FP8": (0, 31, 0),
                 "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8": (0, 31, 0),
                 "VLLM_MXFP4_USE_MARLIN": (0, 31, 0),
                 "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16": (0, 31, 0)}


def env_read_by(env: Mapping[str, str], version: Version | None) -> dict[str, str]:
    """``env`` less the variables vLLM ``version`` (None: :data:`CURRENT`) no longer reads
    (:data:`VLLM_ENV_GONE`): a server's environment as that release acts on it."""
    v = version or CURRENT
    return {k: val for k, val in env.items() if k not in VLLM_ENV_GONE or v < VLLM_ENV_GONE[k]}


def check_vllm_env(env: Mapping[str, str], field: Callable[[str], str]) -> None:
    """Raise :class:`SpecError` for a variable of :data:`VLLM_ENV_READ` whose value vLLM's
    ``int()`` would not read (vLLM fails to start on it), naming ``field(name)``; the others
    are not read here."""
    problems = []
    for name, kind in VLLM_ENV_READ.items():
        value = env.get(name)
        if value is None:
            continue
        try:
            int(value)
        except ValueError:
            what = "0 or 1" if kind == "flag" else "a whole number of tokens"
            problems.append((field(name), f"{name} is {shown(value)}: vLLM reads it with "
                                          f"int(); give {what}"))
    if problems:
        raise SpecError(problems)


def env_flag(env: Mapping[str, str], name: str) -> bool | None:
    """A boolean vLLM environment variable as ``vllm/envs.py`` reads it (``bool(int(v))``);
    None where unset."""
    v = env.get(name)
    return None if v is None else bool(int(v))


def moe_weight_format(weight_dtype: str, gpu: str = "",
                      vllm_env: Mapping[str, str] | None = None) -> str:
    """The routed experts' format in the measured MoE table (:mod:`chunktune.sim.cost.
    moe_table`) for the checkpoint's weight dtype (:attr:`ModelConfig.weight_dtype`), on GPU
    ``gpu`` under the vLLM environment variables the server ran with (``vllm_env``). FP8 MoE
    checkpoints ship 128x128 block scales (DeepSeek-V3/R1, Qwen3 MoE FP8, MiniMax-M2.5, GLM-5:
    ``weight_block_size``), run by vLLM's block-FP8 MoE kernels: the fastest timed
    (``fp8_block``), or Triton's ``fused_moe`` (``fp8_block_triton``) where FlashInfer's and
    DeepGEMM's are turned off (``VLLM_USE_FLASHINFER_MOE_FP8=0 VLLM_MOE_USE_DEEP_GEMM=0``:
    vLLM 0.17-0.19 ``fused_moe/oracle/fp8.py`` then has Triton left, its CUTLASS kernel being
    disallowed for ``Fp8MoEMethod``). MXFP4 experts on an SM100 GPU with
    ``VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1`` run FlashInfer's TRT-LLM kernel on MXFP8
    activations (``mxfp4_mxfp8``; vLLM 0.15 ``quantization/mxfp4.py``:
    ``SM100_FI_MXFP4_MXFP8_TRTLLM``), else on bf16 ones (``mxfp4``). MXFP4 experts on Hopper
    with ``VLLM_MXFP4_USE_MARLIN=1`` run Marlin's W4A16 kernel (``mxfp4_marlin``; vLLM
    0.13-0.19 ``get_mxfp4_backend``: ``if envs.VLLM_MXFP4_USE_MARLIN or not
    triton_kernels_supported: return Mxfp4Backend.MARLIN``, reached on SM90 when FlashInfer's
    SM90 BF16 kernel is not asked for), else OpenAI's Triton kernel (``mxfp4``). INT4 groups of
    any size are the table's ``int4`` (W4A16, Marlin)."""
    env = vllm_env or {}
    if weight_dtype == "fp8":
        if (env_flag(env, "VLLM_USE_FLASHINFER_MOE_FP8") is False
                and env_flag(env, "VLLM_MOE_USE_DEEP_GEMM") is False):
            return "fp8_block_triton"
        return "fp8_block"
    if weight_dtype.startswith("int4"):
        return "int4"
    if (weight_dtype == "mxfp4" and gpu in SM100_GPUS
            and env_flag(env, "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8")):
        return "mxfp4_mxfp8"
    if weight_dtype == "mxfp4" and mxfp4_marlin_asked(gpu, env):
        return "mxfp4_marlin"
    return weight_dtype or "bf16"


def mxfp4_marlin_asked(gpu: str, vllm_env: Mapping[str, str] | None) -> bool:
    """Whether the server's environment asks a Hopper GPU for Marlin's MXFP4 experts
    (``VLLM_MXFP4_USE_MARLIN=1`` without ``VLLM_USE_FLASHINFER_MOE_MXFP4_BF16``; read by vLLM
    0.13-0.19 ``get_mxfp4_backend``): the kernel the step time prices and the layout the
    memory plan holds (:func:`chunktune.sim.engine.mxfp4.mxfp4_backend`)."""
    env = vllm_env or {}
    return (gpu in SM90_GPUS and bool(env_flag(env, "VLLM_MXFP4_USE_MARLIN"))
            and not env_flag(env, "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16"))


#: Kernel formats timed on other shapes than the models': the format whose curve of the
#: model's own shape gives the kernel's fixed cost (the same FlashInfer TRT-LLM kernel on bf16
#: activations; for Marlin's MXFP4 kernel on Hopper, timed there on one other shape only,
#: the Triton kernel vLLM runs otherwise), see :func:`borrowed_moe_curve`.
BORROWED_MOE_FORMATS = {"mxfp4_mxfp8": "mxfp4", "mxfp4_marlin": "mxfp4"}


def borrowed_moe_curve(gpu: GPU, c: KernelCoefficients, fmt: str, hidden: int, inter: int,
                       experts: int, topk: int, tp: int, ep: int,
                       mats: float = 3) -> np.ndarray | None:
    """The microseconds at :data:`moe_table.TOKENS` of a kernel format the GPU's table times
    on other shapes only (:data:`BORROWED_MOE_FORMATS`), or None: the model's own curve in the
    format it borrows from (same kernel, other activations) at one token, plus the growth past
    one token of the measured ``fmt`` curve of the nearest shape (:func:`moe_table.nearest`,
    same split) scaled by the ratio of the two shapes' growth in the fitted form
    (:func:`moe_form`). Borrowed: on the B200 the MXFP8-activation curves of the two shapes
    timed (4096/2048/256/6, 7168/3072/384/6) predict each other this way within 9% at the
    median over token counts and splits (23% at the 90th percentile)."""
    own = moe_table.curve(gpu.name, BORROWED_MOE_FORMATS[fmt], hidden, inter, experts, topk,
                          tp, ep)
    near = moe_table.nearest(gpu.name, fmt, hidden, inter, tp, ep)
    if own is None or near is None:
        return None
    (h2, i2, e2, k2), us = near
    t = np.array(moe_table.TOKENS, dtype=np.float64)
    wb = BORROWED_MOE_FORMATS[fmt]
    form = moe_form(t, hidden, inter / tp, topk / ep, experts / ep, mats, gpu, c, wb)
    form2 = moe_form(t, h2, i2 / tp, k2 / ep, e2 / ep, mats, gpu, c, wb)
    growth = np.maximum(us - us[0], 0.0) * (form - form[0]) / np.maximum(form2 - form2[0],
                                                                         1e-12)
    out: np.ndarray = own[0] + growth
    return out


#: Kernel formats a GPU's table times on a few shapes only (INT4 W4A16, Marlin as vLLM runs it:
#: Kimi-K2's shape on every measured GPU, more on the H100 and H200, ``moe_table.
#: SLOW_INT4_SOURCE``): at another shape, the nearest timed shape's curve in the same format
#: and split, scaled by the fitted form (:func:`other_shape_curve`).
SHAPE_BORROWED_FORMATS = frozenset({"int4"})


def borrowed_shape(gpu: str, fmt: str, hidden: int, inter: int, experts: int, topk: int,
                   tp: int, ep: int) -> tuple[int, int, int, int] | None:
    """The timed shape (hidden, width, experts, top-k) whose curve a model's MoE layer in
    kernel format ``fmt`` runs scaled (:func:`other_shape_curve`) where ``gpu``'s table lacks
    the model's own; None where it has it, the format is not borrowed by shape
    (:data:`SHAPE_BORROWED_FORMATS`) or no curve is timed at the split."""
    if (fmt not in SHAPE_BORROWED_FORMATS
            or moe_table.curve(gpu, fmt, hidden, inter, experts, topk, tp, ep) is not None):
        return None
    near = moe_table.nearest(gpu, fmt, hidden, inter, tp, ep)
    return None if near is None else near[0]


def other_shape_curve(gpu: GPU, c: KernelCoefficients, fmt: str, hidden: int, inter: int,
                      experts: int, topk: int, tp: int, ep: int, mats: float = 3,
                      weight_dtype: str = "int4_g128") -> np.ndarray | None:
    """The microseconds at :data:`moe_table.TOKENS` of a model's MoE layer in kernel format
    ``fmt`` where the GPU's table times that format on other shapes only: the curve of the
    nearest shape at the same split (:func:`moe_table.nearest`) times the ratio of the fitted
    form (:func:`moe_form`, weights in ``weight_dtype``) at the model's shape to that at the
    timed one, token count by token count: the kernel's measured efficiency kept, the bytes and
    FLOPs moved to the model's shape. None where the format has no curve at the split.
    Borrowed, with its error: from Kimi-K2's curve (7168 x 2048, 384 experts, top 8) this
    predicts the H100's and H200's 68 other INT4 curves (vLLM 0.14's collector: Mixtral,
    Qwen3, DeepSeek-V3 shapes; 1-16,384 tokens) within 13.7% at the median, 36% at the 90th
    percentile, signed +2.7% (the fitted form alone: 33%, signed -19%)."""
    near = moe_table.nearest(gpu.name, fmt, hidden, inter, tp, ep)
    if near is None:
        return None
    (h2, i2, e2, k2), us = near
    t = np.array(moe_table.TOKENS, dtype=np.float64)
    form = moe_form(t, hidden, inter / tp, topk / ep, experts / ep, mats, gpu, c, weight_dtype)
    form2 = moe_form(t, h2, i2 / tp, k2 / ep, e2 / ep, mats, gpu, c, weight_dtype)
    out: np.ndarray = us * form / form2
    return out


def moe_time(model: ModelConfig, gpu: GPU, tp: int, tokens: np.ndarray, c: KernelCoefficients,
             weight_dtype: str = "bf16", use_table: bool = True,
             expert_parallel: bool = False,
             vllm_env: Mapping[str, str] | None = None) -> np.ndarray:
    """Seconds of a fused MoE layer's routed experts on one rank, for each token count: the
    GPU's measured MoE layer where its table has the model's shape and split in the kernel
    format vLLM runs (:func:`moe_weight_format`, ``vllm_env``: the server's vLLM environment
    variables) or borrows it from the format's nearest shape (:func:`borrowed_moe_curve`,
    :func:`other_shape_curve`; ``expert_parallel``: each of the ``tp`` ranks holds ``1/tp``
    of the experts whole, as ``--enable-expert-parallel`` splits them, else every expert is
    sharded ``tp`` ways); where
    the GPU has no MoE table and borrows a neighbour's
    (:func:`chunktune.sim.cost.moe_table.lent`), that table scaled by the ratio of the fitted
    form on the two GPUs; else the fitted form (:func:`moe_form`, sharded experts)."""
    experts_dtype = model.weight_dtype if weight_dtype in ("fp8", "bf16") \
        and model.weight_dtype in FOUR_BIT else weight_dtype
    if use_table:
        ep = tp if expert_parallel else 1
        fmt = moe_weight_format(experts_dtype, gpu.name, vllm_env)
        shape = (model.hidden_size, model.moe_intermediate_size, model.num_experts,
                 model.num_experts_per_tok, tp // ep, ep)
        us = moe_table.curve(gpu.name, fmt, *shape)
        if us is None and fmt in BORROWED_MOE_FORMATS:
            us = borrowed_moe_curve(gpu, c, fmt, *shape, mats=3 if model.gated_mlp else 2)
        elif us is None and fmt in SHAPE_BORROWED_FORMATS:
            us = other_shape_curve(gpu, c, fmt, *shape, mats=3 if model.gated_mlp else 2,
                                   weight_dtype=experts_dtype)
        if us is not None:
            out: np.ndarray = moe_table.seconds(us, tokens)
            if fmt == "mxfp4_mxfp8":
                # the activations quantized to MXFP8 by a kernel of their own before the
                # experts (vLLM 0.15 mxfp4.py: flashinfer.mxfp8_quantize): read bf16, write
                # one byte an element and a scale per 32
                t = np.asarray(tokens, dtype=np.float64)
                out = out + np.where(t > 0, c.elementwise_overhead_s + t * model.hidden_size
                                     * (2.0 + 1.0 + 1.0 / 32) / (gpu.hbm_tb_s * 1e12
                                                                 * c.elementwise_memory_eff),
                                     0.0)
            return out
        src = moe_table.lent(gpu)
        lent = None if src is None else lent_moe_seconds(
            gpu, src, c, fmt, experts_dtype, *shape, tokens, 3 if model.gated_mlp else 2)
        if lent is not None:
            return lent
    return moe_form(np.asarray(tokens, dtype=np.float64), model.hidden_size,
                    model.moe_intermediate_size / tp, model.num_experts_per_tok,
                    model.num_experts, 3 if model.gated_mlp else 2, gpu, c, experts_dtype)


def lent_moe_seconds(gpu: GPU, src: GPU, c: KernelCoefficients, fmt: str, weight_dtype: str,
                     hidden: int, inter: int, experts: int, topk: int, tp: int, ep: int,
                     tokens: np.ndarray, mats: float = 3) -> np.ndarray | None:
    """Seconds on ``gpu`` of an MoE layer's routed experts at ``tokens`` borrowed from
    ``src``'s measured table (:func:`chunktune.sim.cost.moe_table.lent`): ``src``'s curve of
    the shape and split (``tp``/``ep``, as :func:`moe_table.curve` keys it) in format ``fmt``,
    scaled by the ratio of the fitted form (:func:`moe_form` under ``c``, experts sharded
    ``tp x ep`` ways, weights in ``weight_dtype``) on the two data sheets: per regime, so a
    layer bound by its fixed cost keeps ``src``'s time, one bound by streaming the experts'
    weights scales by HBM bandwidth and one bound by their FLOPs by the peak. None where
    ``src``'s table lacks the shape. What the engine runs for a GPU without a table and what
    ``kernel_report`` holds each measured GPU out by."""
    theirs = moe_table.curve(src.name, fmt, hidden, inter, experts, topk, tp, ep)
    if theirs is None:
        return None
    T = np.asarray(tokens, dtype=np.float64)
    args = (hidden, inter / (tp * ep), topk, experts, mats)
    scale = moe_form(T, *args, gpu, c, weight_dtype) / moe_form(T, *args, src, c, weight_dtype)
    out: np.ndarray = moe_table.seconds(theirs, tokens) * scale
    return out


def moe_form(tokens: np.ndarray, hidden: float | np.ndarray, inter: float | np.ndarray,
             topk: float | np.ndarray, experts: float | np.ndarray, mats: float, gpu: GPU,
             c: KernelCoefficients, weight_dtype: str = "bf16") -> np.ndarray:
    """A fused MoE layer's seconds (arrays broadcast; ``inter``: one expert's width on this
    rank): each token visits ``topk`` of ``experts`` experts, and the weights of every expert
    that receives a token are read once. Compute and memory at the GPU's fitted MoE
    efficiencies (fitted on vLLM's fused MoE kernel in bf16; FP8 weights at the FP8 peak and
    one byte per weight) combined as a soft maximum, plus a fixed cost."""
    fp8 = weight_dtype == "fp8"
    # a 4-bit format without a measured table: its bytes at the bf16 peak (W4A16; borrowed)
    wb = 1.0 if fp8 else DTYPE_BYTES.get(weight_dtype, 2.0)
    peak = gpu.fp8_tflops if fp8 and gpu.fp8_tflops > 0 else gpu.bf16_tflops
    active = experts * (1.0 - (1.0 - topk / experts) ** np.maximum(tokens, 0))
    tok = tokens * topk
    comp = 2.0 * tok * mats * hidden * inter / (peak * 1e12 * c.moe_compute_eff)
    mem = (active * mats * hidden * inter * wb + tok * (2 * hidden + mats * inter) * 2.0) / (
        gpu.hbm_tb_s * 1e12 * c.moe_memory_eff)
    p = c.moe_smoothness
    out: np.ndarray = c.moe_overhead_s + (comp**p + mem**p) ** (1.0 / p)
    return out


def linear_layer_time(model: ModelConfig, gpu: GPU, tp: int, tokens: np.ndarray,
                      c: KernelCoefficients, weight_dtype: str = "bf16",
                      use_table: bool = True, expert_parallel: bool = False,
                      vllm_env: Mapping[str, str] | None = None,
                      vllm_version: Version | None = None) -> np.ndarray:
    """Seconds the linear operators of ONE layer take on one rank, for each token count."""
    ops = linear_op_times(model, gpu, tp, tokens, c, weight_dtype, use_table, expert_parallel,
                          vllm_env, vllm_version)
    t: np.ndarray = np.zeros_like(np.asarray(tokens, dtype=np.float64))
    for name in LINEAR_OPS:
        if name in ops:
            t = t + ops[name]
    return t


#: Query rows per CTA (tile) of the varlen FlashAttention kernel vLLM runs for chunked
#: prefills: 64 on the measured RTX cards (a 16- or 64-token chunk takes the time of one tile;
#: on the RTX 4090 a 256-token chunk's 4 x 32 heads = 128 CTAs fill its 128 SMs in one wave and
#: a 512-token chunk takes two).
Q_TILE = 64
ATTENTION_FIELDS = ("attn_overhead_s", "attn_per_decode_s", "attn_compute_eff",
                    "attn_cta_cycles_per_flop",
                    "attn_tile_memory_eff", "attn_mixed_memory_eff",
                    "attn_reread_l2_bytes_per_sm_s", "attn_smoothness", "attn_per_wave_s",
                    "attn_decode_alone_overhead_s", "attn_decode_memory_eff")


@dataclass(frozen=True)
class AttentionShape:
    """What the attention term needs of a model on one rank."""

    heads: float
    kv_heads: float
    head_dim: float
    dtype_bytes: float

    @classmethod
    def of(cls, model: ModelConfig, tp: int, kv_dtype_bytes: float | None = None
           ) -> AttentionShape:
        """``kv_dtype_bytes``: bytes per KV element (1 for an FP8 KV cache; default the
        model's dtype)."""
        kv_heads = max(1, math.ceil(model.num_key_value_heads / tp))
        return cls(model.num_attention_heads / tp, kv_heads, model.head_dim,
                   model.dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes)


def attention_layer_time(s: AttentionShape, gpu: GPU, c: KernelCoefficients,
                         prefill_chunks: list[tuple[int, int]], num_decodes: int,
                         decode_context_tokens: int, window: int = 0) -> float:
    """Seconds ONE layer's attention takes on one rank for a (possibly mixed) batch.

    ``window``: a sliding-window layer's window (0: full attention): a query tile attends to
    at most ``window`` keys before its first row (vLLM's FlashAttention ``window_size``), so
    its keys stop growing there; the caller bounds the decodes' context by the window.

    ``prefill_chunks``: ``(chunk, computed)`` per prefilling request; the decodes read
    ``decode_context_tokens`` KV tokens in all. With a prefill in the batch, everything runs in
    the varlen prefill kernel: one CTA per query tile of ``Q_TILE`` rows and query head, a
    decode being a one-row tile. Each tile attends its causal keys (``computed`` plus the
    chunk up to its last row), padded to ``Q_TILE`` rows. Terms (coefficients fitted per GPU
    family; GPU figures from its data sheet):

    - ``overhead + per_decode x decodes``;
    - compute: the larger of all CTAs' padded FLOPs (:func:`all_ctas_time`: at ``peak x
      compute_eff``, and where the GPU runs FlashAttention 2 the query tiles' work beside
      their MMAs at ``cta_cycles_per_flop`` cycles of ``SMs x clock``) and the longest CTA's
      (few CTAs leave SMs idle), whose MMAs run at one SM's share ``peak / SMs`` and the
      work beside them at ``cta_cycles_per_flop`` SM clock cycles per FLOP, the two combined
      in the soft maximum below (:func:`longest_cta_time`);
    - memory: the tiles' K/V reads at a fraction of HBM (above 1 where L2 serves them); the
      decodes' KV read once per KV head from HBM and re-read by the other query heads of its
      group: from L2 at a rate per SM where those heads' CTAs run beside the first (a wave
      of ``SMs`` CTAs holds ``SMs / decodes`` query heads) or while one KV head's KV of all
      the decodes fits the L2, the rest from HBM again (:func:`reread_hit_fraction`);
    - compute and memory combine as a soft maximum, plus a cost per wave of CTAs over the
      SMs (``ceil(CTAs / SMs)``, one CTA per SM at a time);
    - decodes alone (split-KV decode kernel): a fixed cost plus KV bytes / (HBM x
      decode_memory_eff).
    """
    kv_token = 2.0 * s.kv_heads * s.head_dim * s.dtype_bytes
    F = gpu.bf16_tflops * 1e12
    B = gpu.hbm_tb_s * 1e12
    t = c.attn_overhead_s + c.attn_per_decode_s * num_decodes
    if prefill_chunks:
        tile_keys = tiles = 0.0
        longest = float(decode_context_tokens) / num_decodes if num_decodes else 0.0
        for chunk, computed in prefill_chunks:
            n = math.ceil(chunk / Q_TILE)
            if window:
                # tile i attends computed + (i + 1) Q_TILE keys, at most window + Q_TILE
                cap = window + Q_TILE
                m = min(n, max(0, (cap - computed) // Q_TILE))
                tile_keys += m * computed + Q_TILE * m * (m + 1) / 2 + (n - m) * cap
                longest = max(longest, float(min(computed + chunk, cap)))
            else:
                tile_keys += n * computed + Q_TILE * (n - 1) * n / 2 + chunk
                longest = max(longest, float(computed + chunk))
            tiles += n
        tiles += num_decodes
        # :func:`all_ctas_time`, :func:`longest_cta_time` and :func:`reread_hit_fraction` in
        # Python floats, the same operations in the same order (numpy costs about a
        # microsecond an operation on scalars, and this runs on every step with a prefill;
        # tests/sim/cost/test_step_time.py checks both give the same bits)
        per_key = 4.0 * s.head_dim * Q_TILE
        clock = gpu.boost_mhz * 1e6
        p = c.attn_smoothness
        cpf = c.attn_cta_cycles_per_flop
        tile_flops = per_key * s.heads * tile_keys
        peak = F * c.attn_compute_eff
        if gpu.flash_attention >= 3:
            tiles_s = tile_flops / peak
        else:
            tiles_s = _longest_cta_s(tile_flops, peak, gpu.sm_count * clock, cpf, p)
        comp = max(tiles_s + per_key * s.heads * decode_context_tokens / peak,
                   _longest_cta_s(per_key * longest, F / gpu.sm_count, clock, cpf, p))
        head_bytes = 2.0 * s.head_dim * s.dtype_bytes
        group = s.heads / s.kv_heads
        dec_bytes = s.heads * decode_context_tokens * head_bytes
        at_once = gpu.sm_count / max(float(num_decodes), 1.0)
        share = min(max((at_once - 1.0) / max(group - 1.0, 1e-9), 0.0), 1.0)
        hit = share + (1.0 - share) * min(
            1.0, gpu.l2_mib * 2**20 / max(float(decode_context_tokens * head_bytes), 1.0))
        reread = dec_bytes * (group - 1) / group
        mem = (s.heads * tile_keys * head_bytes
               / (B * c.attn_tile_memory_eff)
               + (dec_bytes / group + reread * (1.0 - hit)) / (B * c.attn_mixed_memory_eff)
               + reread * hit / (gpu.sm_count * c.attn_reread_l2_bytes_per_sm_s))
        p, top = c.attn_smoothness, max(comp, mem)
        t += (top * ((comp / top) ** p + (mem / top) ** p) ** (1.0 / p)
              + c.attn_per_wave_s * math.ceil(s.heads * tiles / gpu.sm_count))
    elif num_decodes:
        t += (c.attn_decode_alone_overhead_s
              + decode_context_tokens * kv_token / (B * c.attn_decode_memory_eff))
    return t


def _longest_cta_s(flops: float, sm_peak: float, clock_hz: float, cycles_per_flop: float,
                   p: float) -> float:
    """:func:`longest_cta_time` of floats, in Python floats (the step loop's path)."""
    mma = flops / sm_peak
    other = flops * cycles_per_flop / clock_hz
    top = max(mma, other, 1e-30)
    out: float = top * ((mma / top) ** p + (other / top) ** p) ** (1.0 / p)
    return out


def l2_hit_fraction(l2_bytes: float | np.ndarray, working_set_bytes: float | np.ndarray
                    ) -> np.ndarray:
    """Fraction of the decodes' per-query-head KV re-reads the L2 serves: all of them while
    the working set (one KV head's K and V for every decode in the batch) fits the L2, then
    ``L2 / working set``."""
    ws = np.maximum(np.asarray(working_set_bytes, dtype=np.float64), 1.0)
    out: np.ndarray = np.minimum(1.0, np.asarray(l2_bytes, dtype=np.float64) / ws)
    return out


def reread_hit_fraction(l2_bytes: float | np.ndarray, working_set_bytes: float | np.ndarray,
                        sm_count: float | np.ndarray, decodes: float | np.ndarray,
                        group: float | np.ndarray) -> np.ndarray:
    """Fraction of the decodes' per-query-head KV re-reads (``group - 1`` of every ``group``
    reads of a KV head's KV) that L2 serves in a mixed batch. The varlen kernel's CTAs go
    query head by query head (one per decode), so a wave of ``SMs`` CTAs holds ``SMs /
    decodes`` query heads at once: the first reads a decode's KV from HBM and the others of
    its group running beside it find it in L2, ``(SMs / decodes - 1) / (group - 1)`` of the
    re-reads (at most all). The rest hit L2 as far as the working set fits it
    (:func:`l2_hit_fraction`). More SMs, more heads at once: the RTX PRO 6000's 188 SMs hold
    1.5 query heads of 128 decodes where the RTX 4090's 128 hold one."""
    g = np.asarray(group, dtype=np.float64)
    at_once = np.asarray(sm_count, dtype=np.float64) / np.maximum(
        np.asarray(decodes, dtype=np.float64), 1.0)
    share = np.clip((at_once - 1.0) / np.maximum(g - 1.0, 1e-9), 0.0, 1.0)
    out: np.ndarray = share + (1.0 - share) * l2_hit_fraction(l2_bytes, working_set_bytes)
    return out


def longest_cta_time(flops: float | np.ndarray, sm_peak: float | np.ndarray,
                     clock_hz: float | np.ndarray, cycles_per_flop: float | np.ndarray,
                     p: float | np.ndarray) -> np.ndarray:
    """Seconds one CTA's ``flops`` take on one SM: its MMAs at the SM's share of the tensor
    peak, the work beside them (softmax, loads, rescaling) at ``cycles_per_flop`` SM cycles,
    combined as ``(mma^p + other^p)^(1/p)``. Where the tensor cores are fast against the
    clock (RTX PRO 6000: 1,024 bf16 FLOPs per SM cycle against the RTX 4090's 512) the
    other work takes the larger share, so one CTA is not twice as fast."""
    mma = np.asarray(flops, dtype=np.float64) / sm_peak
    other = np.asarray(flops, dtype=np.float64) * cycles_per_flop / clock_hz
    top = np.maximum(np.maximum(mma, other), 1e-30)
    out: np.ndarray = top * ((mma / top) ** p + (other / top) ** p) ** (1.0 / p)
    return out


def all_ctas_time(tile_flops: float | np.ndarray, decode_flops: float | np.ndarray,
                  peak: float | np.ndarray, sm_clock_hz: float | np.ndarray,
                  cycles_per_flop: float | np.ndarray, p: float | np.ndarray,
                  overlapped: bool | np.ndarray) -> np.ndarray:
    """Seconds the varlen kernel's CTAs take on all SMs together, compute only: the decodes'
    (one-row, padded) MMAs at ``peak`` (their CTAs wait on KV reads, the memory term), and the
    query tiles' ``tile_flops``. FlashAttention 3 and later (``overlapped``: Hopper) overlap
    a tile's softmax, loads and rescaling with the next MMAs, so the tiles run at ``peak``
    too. FlashAttention 2 (every other card vLLM runs it on) issues them from the same warps:
    the work beside the MMAs takes ``cycles_per_flop`` cycles of ``sm_clock_hz`` (SMs x
    clock), combined with the MMAs as in :func:`longest_cta_time`. On the RTX cards a
    2,048-token chunk over 16k of context (Llama-3.1-8B, TP1) takes 4,225 us on the RTX 4090
    and 2,138 us on the RTX PRO 6000, 1.98x, where the bf16 peaks say 2.93x and SMs x clock
    1.45x."""
    tiles_alone = np.asarray(tile_flops, dtype=np.float64) / peak
    fa2 = longest_cta_time(tile_flops, peak, sm_clock_hz, cycles_per_flop, p)
    out: np.ndarray = (np.where(overlapped, tiles_alone, fa2)
                       + np.asarray(decode_flops, dtype=np.float64) / peak)
    return out


def attention_grid_time(s_heads: np.ndarray, s_kv_heads: np.ndarray, head_dim: np.ndarray,
                        dtype_bytes: float | np.ndarray, sm_count: np.ndarray,
                        peak: np.ndarray,
                        hbm: np.ndarray, l2: np.ndarray, clock: np.ndarray,
                        c: dict[str, Any], chunk: np.ndarray,
                        computed: np.ndarray, decodes: np.ndarray,
                        decode_context: np.ndarray,
                        overlapped: bool | np.ndarray = False,
                        prefills: np.ndarray | float = 1.0) -> np.ndarray:
    """:func:`attention_layer_time` over arrays of batches with ``prefills`` identical prefill
    chunks (0 or 1 in LLMServingSim's grid; a batch of prompts in AIConfigurator's) beside the
    decodes; ``c`` maps the ``attn_*`` names to scalars or arrays. Used by the fit;
    ``tests/sim/cost/test_kernel_fit.py`` checks that both agree."""
    kv_token = 2.0 * s_kv_heads * head_dim * dtype_bytes
    n = np.ceil(chunk / Q_TILE)
    has_pre = chunk > 0
    t = c["attn_overhead_s"] + c["attn_per_decode_s"] * decodes
    tile_keys = (n * computed + Q_TILE * (n - 1) * n / 2 + chunk) * prefills
    per_dec = np.where(decodes > 0, decode_context / np.maximum(decodes, 1), 0.0)
    longest = np.maximum(computed + chunk, per_dec)
    per_key = 4.0 * head_dim * Q_TILE
    comp = np.maximum(all_ctas_time(per_key * s_heads * tile_keys,
                                    per_key * s_heads * decode_context,
                                    peak * c["attn_compute_eff"], sm_count * clock,
                                    c["attn_cta_cycles_per_flop"], c["attn_smoothness"],
                                    overlapped),
                      longest_cta_time(per_key * longest, peak / sm_count, clock,
                                       c["attn_cta_cycles_per_flop"], c["attn_smoothness"]))
    head_bytes = 2.0 * head_dim * dtype_bytes
    group = s_heads / s_kv_heads
    dec_bytes = s_heads * decode_context * head_bytes
    hit = reread_hit_fraction(l2, decode_context * head_bytes, sm_count, decodes, group)
    reread = dec_bytes * (group - 1) / group
    mem = (s_heads * tile_keys * head_bytes / (hbm * c["attn_tile_memory_eff"])
           + (dec_bytes / group + reread * (1.0 - hit)) / (hbm * c["attn_mixed_memory_eff"])
           + reread * hit / (sm_count * c["attn_reread_l2_bytes_per_sm_s"]))
    p, top = c["attn_smoothness"], np.maximum(np.maximum(comp, mem), 1e-30)
    var = (top * ((comp / top) ** p + (mem / top) ** p) ** (1.0 / p)
           + c["attn_per_wave_s"] * np.ceil(s_heads * (n * prefills + decodes) / sm_count))
    alone = (c["attn_decode_alone_overhead_s"]
             + decode_context * kv_token / (hbm * c["attn_decode_memory_eff"]))
    dec = np.where(decodes > 0, alone, 0.0)
    out: np.ndarray = t + np.where(has_pre, var, dec)
    return out


def check_modelled(model: ModelConfig, gpu: GPU) -> None:
    """Raise :class:`SpecError` naming what of ``model`` the step time does not price on
    ``gpu``: MLA attention of other dimensions than the measured module's, and 4-bit dense
    linear layers (attention projections or dense MLPs the checkpoint quantizes to 4 bits)
    other than a dense model's NVFP4 layers on a GPU with a measured nvfp4 GEMM grid, its own
    or its family neighbour's (:func:`fp4_dense_refusal`)."""
    if model.is_mla:
        odd = [k for k, v in mla_table.MLA_SHAPE.items() if getattr(model, k) != v]
        if odd:
            raise SpecError(f"model {model.name}: MLA layers of other dimensions than "
                            f"DeepSeek-V3's ({', '.join(odd)}) are not timed: the measured MLA "
                            "module has those only")
    if model.weight_dtype == "nvfp4" and not model.is_moe:
        why = fp4_dense_refusal(model, gpu)
        if why is not None:
            raise SpecError(f"model {model.name}: {why}")
    elif model.weight_dtype in FOUR_BIT:
        # an MoE model's 4-bit dense MLPs and shared experts are priced (four_bit_linear_dtype);
        # its 4-bit attention projections only from a measured nvfp4 grid; a dense model's
        # other than NVFP4 are refused
        for module in ("attention",) if model.is_moe else ("attention", "dense_mlp"):
            if model.module_weight_bytes(module) < model.dtype_bytes and not (
                    model.is_moe and four_bit_linear_dtype(model, gpu, module) == "nvfp4"):
                raise SpecError(f"model {model.name}: {model.weight_dtype} {module} linear "
                                "layers (4-bit dense GEMMs) are not modelled")


def four_bit_linear_dtype(model: ModelConfig, gpu: GPU, module: str) -> str | None:
    """What the linear layers of ``module`` (a module class outside the routed experts:
    ``attention``, ``dense_mlp``, ``shared_experts``) of a 4-bit MoE checkpoint (or one of its
    dense layers, :func:`dense_layer`) run in on ``gpu``, or None where the checkpoint leaves
    them at the model's dtype (its ``ignore`` / ``exclude_modules``), is not 4-bit or is a
    dense model (whose layers run the caller's ``weight_dtype``: :func:`fp4_dense_refusal`).

    ``nvfp4``: a ModelOpt NVFP4 checkpoint's quantized layers on a GPU with a measured nvfp4
    GEMM grid, its own or its family neighbour's (vLLM 0.15-0.33 ``modelopt.py``
    ``ModelOptNvFp4LinearMethod`` on SM100: W4A4, FlashInfer CuTe DSL / CUTLASS FP4 GEMMs, the
    grid AIConfigurator timed). ``fp8``
    elsewhere (borrowed: one byte a weight at the FP8 peak; NVFP4 on a GPU without the grid,
    where vLLM on Hopper runs Marlin weight-only, and INT4 W4A16 groups, no table times
    either; :func:`check_modelled` refuses such attention projections)."""
    if model.weight_dtype not in FOUR_BIT or not (model.is_moe or model.num_dense_layers) \
            or model.module_weight_bytes(module) >= model.dtype_bytes:
        return None
    if model.weight_dtype == "nvfp4" and gpu.family == "blackwell" \
            and (gemm_table.has_nvfp4(gpu.name) or gemm_table.nvfp4_lender(gpu)):
        return "nvfp4"
    return "fp8"


def fp4_dense_refusal(model: ModelConfig, gpu: GPU) -> str | None:
    """Why a dense NVFP4 checkpoint's linear layers are not timed on ``gpu``, or None where
    they are (from ``gpu``'s own measured nvfp4 GEMM grid). vLLM (0.33 ``kernels/linear/
    nvfp4``) runs them W4A4 on FP4 tensor cores (Blackwell: CUTLASS or FlashInfer kernels);
    on an older GPU it falls back to weight-only FP4 with bf16 activations (Marlin,
    ``MarlinNvFp4LinearKernel``), a kernel not measured here. A checkpoint that leaves some
    dense linear layers in bf16 is not timed either (one dtype prices all four GEMMs)."""
    mixed = [m for m in ("attention", "dense_mlp") if dict(model.unquantized).get(m, 0.0) > 0]
    if mixed:
        return (f"nvfp4 dense linear layers beside unquantized {', '.join(mixed)} layers "
                "(4-bit dense GEMMs mixed with bf16) are not modelled")
    if gpu.family != "blackwell":
        return (f"nvfp4 dense linear layers on {gpu.name} are not modelled: without FP4 "
                "tensor cores vLLM runs them weight-only (Marlin FP4, bf16 activations), a "
                "kernel not measured here")
    if not gemm_table.has_nvfp4(gpu.name) and gemm_table.nvfp4_lender(gpu) is None:
        return (f"nvfp4 dense linear layers on {gpu.name} are not modelled: no measured "
                "nvfp4 GEMM grid for this GPU or a GPU of its family")
    return None


def mla_module(model: ModelConfig, gpu: GPU, tp: int, kv_dtype_bytes: float | None
               ) -> mla_table.MlaTable:
    """The measured MLA module (:mod:`chunktune.sim.cost.mla_table`) of ``model``'s layers on
    one of ``tp`` ranks: its query heads split over the ranks, its projections in the
    checkpoint's format (bf16 where it leaves attention unquantized, as Kimi-K2.5's INT4 and
    NVFP4 exports do; block FP8 for DeepSeek's FP8), the KV cache's; where the GPU's tables
    lack it, its nearest measured GPU's scaled by the data sheets
    (:meth:`mla_table.MlaTable.lent`). Raises :class:`SpecError` where neither has it."""
    heads = model.num_attention_heads // tp
    if model.module_weight_bytes("attention") >= model.dtype_bytes:
        gemm = "bf16"
    elif model.weight_dtype == "fp8":
        gemm = "fp8_block"
    else:
        gemm = model.weight_dtype
    kv = "fp8" if kv_dtype_bytes == 1 else "bf16"
    found = (mla_table.MlaTable.find(gpu.name, gemm, kv, heads)
             or mla_table.MlaTable.lent(gpu, gemm, kv, heads))
    if found is None:
        raise SpecError(f"model {model.name}: no measured MLA module on {gpu.name} or a GPU "
                        f"it borrows from for {heads} heads a rank, {gemm} projections and a "
                        f"{kv} KV cache")
    return found


def dense_layer(model: ModelConfig) -> ModelConfig:
    """One of an MoE model's dense layers, as a dense model (its MLP's width)."""
    return model.with_overrides(num_experts=0, num_experts_per_tok=0, num_shared_experts=0,
                                shared_expert_intermediate_size=0,
                                intermediate_size=model.dense_intermediate_size
                                or model.intermediate_size)


class StepCostModel:
    """Predicts step times for one (model, GPU, TP, budget) engine."""

    def __init__(self, model: ModelConfig, gpu: GPU, tp: int = 1, max_tokens: int = 16384,
                 enforce_eager: bool = False, interconnect: Interconnect | None = None,
                 weight_dtype: str | None = None, kv_dtype_bytes: float | None = None,
                 async_scheduling: bool = False, expert_parallel: bool = False,
                 vllm_env: Mapping[str, str] | None = None,
                 data_parallel_size: int = 1, fused_allreduce_tokens: int = 0,
                 vllm_version: Version | None = None) -> None:
        """``weight_dtype``: what the linear layers run in (``WEIGHT_DTYPES``; None: the
        model's, ``fp8`` for an FP8 checkpoint or ``--quantization fp8``, ``nvfp4`` for a dense
        NVFP4 checkpoint); ``kv_dtype_bytes``:
        bytes per KV-cache element (None: the model's dtype); ``async_scheduling``: the host's
        part of a step overlaps the GPU's (see the module docstring); ``expert_parallel``:
        ``--enable-expert-parallel`` (the experts split whole across the TP ranks,
        :func:`moe_time`); ``vllm_env``: the vLLM environment variables the server ran with,
        where they choose the MoE kernel (:func:`moe_weight_format`); ``data_parallel_size``:
        attention data-parallel ranks of an expert-parallel MoE model: the step of one rank
        leaves out the routed experts, which :meth:`dp_experts_time` prices on the tokens of
        all ranks; ``fused_allreduce_tokens``: steps of up to this many tokens run each
        tensor-parallel all-reduce fused with the residual add and RMSNorm after it
        (FlashInfer's ``trtllm_allreduce_fusion``, where the server enables vLLM's all-reduce
        fusion pass: :func:`chunktune.sim.cost.collectives.fi_allreduce_fusion_tokens`; 0:
        none); ``vllm_version``: the release the server runs (None: the current), where it
        picks a kernel (the NVFP4 GEMM's, :func:`gemm_time`)."""
        if weight_dtype is None:
            weight_dtype = model.weight_dtype if model.weight_dtype == "fp8" or (
                model.weight_dtype == "nvfp4" and not model.is_moe) else "bf16"
        check_modelled(model, gpu)
        if gpu.l2_mib <= 0 or gpu.boost_mhz <= 0:
            raise ValueError(f"GPU {gpu.name!r}: l2_mib and boost_mhz must be positive (the data "
                             "sheet's L2 size in MiB and SM boost clock in MHz; the attention "
                             "term scales with them); set them as chunktune.core.gpus does")
        if weight_dtype not in WEIGHT_DTYPES:
            raise ValueError(f"weight dtype {weight_dtype!r}: use one of "
                             f"{', '.join(WEIGHT_DTYPES)}")
        self.model = model
        self.gpu = gpu
        self.tp = tp
        self.weight_dtype = weight_dtype
        self.c = c = coefficients(gpu)
        layers = model.num_hidden_layers
        tokens = np.arange(max_tokens + 1, dtype=np.float64)
        b = model.dtype_bytes
        # an MoE model's dense layers (first_k_dense_replace, moe_layer_freq) run a dense MLP
        dense = model.num_dense_layers if model.is_moe else 0
        # with data parallelism the routed experts leave the rank's step (below) and the
        # shared experts run in it, one after the other (vLLM's chunked DP path, or the
        # all2all kernel owning them, runs no side stream)
        lin_env = {**(vllm_env or {}), "VLLM_DISABLE_SHARED_EXPERTS_STREAM": "1"} \
            if data_parallel_size > 1 else vllm_env
        lin = linear_layer_time(model, gpu, tp, tokens, c, weight_dtype,
                                expert_parallel=expert_parallel,
                                vllm_env=lin_env, vllm_version=vllm_version) * (layers - dense)
        if dense:
            # 4-bit dense MLPs of an MoE model: what four_bit_linear_dtype says
            lin = lin + linear_layer_time(dense_layer(model), gpu, tp, tokens, c,
                                          weight_dtype, vllm_version=vllm_version) * dense
        self.data_parallel_size = dp = data_parallel_size
        self._dp_experts: list[float] = []
        if dp > 1:
            if not (model.is_moe and expert_parallel):
                raise SpecError("--data-parallel-size is modelled for a mixture-of-experts "
                                "model with --enable-expert-parallel only",
                                field="--data-parallel-size")
            moe_layers = layers - dense
            # the routed experts leave the rank's own step: they run on every rank's tokens
            lin = lin - moe_time(model, gpu, tp, tokens, c, weight_dtype, True,
                                 expert_parallel, vllm_env) * moe_layers
            gathered = np.arange(dp * max_tokens + 1, dtype=np.float64)
            # each of the dp x tp ranks holds 1/(dp x tp) of the experts whole (vLLM: EP size
            # = DP x TP); the measured layer's time at the tokens of all ranks
            ex = moe_time(model, gpu, tp * dp, gathered, c, weight_dtype, True, True,
                          vllm_env) * moe_layers
            # vLLM's default all2all backend (allgather_reducescatter): every MoE layer
            # gathers the ranks' hidden states (and their top-k ids and weights, 4 bytes
            # each) and reduce-scatters the experts' outputs, over NCCL
            per_token = model.hidden_size * b + 8 * model.num_experts_per_tok
            ex = ex + moe_layers * nccl_gather_scatter_s(gathered * per_token, dp, gpu,
                                                         interconnect=interconnect)
            ex[0] = 0.0
            self._dp_experts = ex.tolist()
        if tp > 1 and fused_allreduce_tokens > 0:
            # the fused kernel (one per all-reduce, two a layer) adds the residual and
            # normalizes in the all-reduce's own kernel: the layer's two RMSNorms and its
            # residual add launch no kernels of their own (their bytes stay, read and written
            # by the fused kernel); its all-reduce is priced as vLLM's (tp_allreduce_s)
            top = min(fused_allreduce_tokens, max_tokens)
            lin[1:top + 1] -= FUSED_ALLREDUCE_KERNELS * c.elementwise_overhead_s * layers
        lin[0] = 0.0
        self._linear: list[float] = lin.tolist()
        self._B = gpu.hbm_tb_s * 1e12 * c.gemm_memory_eff
        # an FP8 cache (1 byte an element) costs what its kernels were measured to take
        fp8_kv = kv_dtype_bytes == 1
        self._attn_shape = AttentionShape.of(
            model, tp, c.attn_kv_fp8_bytes if fp8_kv else kv_dtype_bytes)
        self._attn_fixed = c.attn_kv_fp8_overhead_s if fp8_kv else 0.0
        # ... and its kernel's cost per decode
        self._attn_c = c.for_kv_fp8() if fp8_kv else c
        self._layers = layers
        # windowed layers (gpt-oss, Gemma: sliding_attention) attend to their window only
        kinds = model.layer_kinds()
        self._windowed = sum(k == SLIDING for k in kinds) if model.sliding_window else 0
        self._window = model.sliding_window
        self._mla = mla_module(model, gpu, tp, kv_dtype_bytes) if model.is_mla else None
        # lm_head: [rows x hidden] x [hidden x vocab/tp], then fp32 logits through the sampler
        v = model.vocab_size / tp
        self._lm_weight_s = model.hidden_size * v * b / self._B
        self._lm_row_s = max(2.0 * model.hidden_size * v / (gpu.bf16_tflops * 1e12
                                                            * c.gemm_compute_eff),
                             3 * v * 4 / self._B)
        # all-reduce: 2 per layer of T x hidden activations (after attention and after the MLP)
        ar = 2 * layers * tp_allreduce_s(tokens * model.hidden_size * b, tp, gpu,
                                         interconnect=interconnect)
        if model.qk_norm_allreduce:
            # a q/k RMSNorm over all heads (MiniMax-M2: vLLM's MiniMaxText01RMSNormTP
            # .forward_qk): each layer all-reduces every token's two fp32 variances
            ar = ar + layers * tp_allreduce_s(tokens * 2 * 4, tp, gpu,
                                              interconnect=interconnect)
        ar[0] = 0.0
        self._allreduce: list[float] = ar.tolist()
        self._overhead = c.step_overhead_s + (EXECUTOR_IPC_S if tp > 1 else 0.0)
        # without CUDA graphs every kernel is launched from the host inside the forward: part
        # of the GPU's time, not overlapped by async scheduling
        self._eager = c.eager_launch_overhead_per_layer_s * layers if enforce_eager else 0.0
        self._per_req = c.per_request_overhead_s + (EXECUTOR_IPC_PER_REQUEST_S if tp > 1
                                                    else 0.0)
        self.async_scheduling = async_scheduling
        self.max_tokens = max_tokens
        # what a drafter beside this model runs with too (chunktune.sim.cost.draft): the
        # server's KV cache dtype, graphs or not, interconnect, expert split, environment and
        # release
        self.kv_dtype_bytes = kv_dtype_bytes
        self.enforce_eager = enforce_eager
        self.interconnect = interconnect
        self.expert_parallel = expert_parallel
        self.vllm_env = vllm_env
        self.vllm_version = vllm_version
        self.calibration: tuple[float, ...] | None = None
        """A calibration profile's coefficients (see :mod:`chunktune.sim.calibration.profile`):
        scales of the (step overhead, per-request, linear, attention) terms, then seconds per
        scheduled token, per prefill query-key pair and per decode KV token, then the wall time
        between steps; when set, a step costs exactly that sum."""

    def calibrate(self, coefficients: tuple[float, ...]) -> None:
        """Cost steps with a calibration profile's eight coefficients from now on."""
        if len(coefficients) != 8:
            raise ValueError(f"8 calibration coefficients expected, got {len(coefficients)}")
        self.calibration = tuple(coefficients)

    def log_features(self, ctx_reqs: int, ctx_tokens: int, gen_reqs: int, gen_tokens: int,
                     kv_tokens: float | None) -> tuple[float, ...]:
        """A step's seven calibration features from what vLLM's iteration log says of it
        (context requests and tokens, generation requests and tokens, KV tokens in use after
        scheduling; None: not logged): step overhead, per-request overhead, linear and
        attention seconds of the unscaled model, then scheduled tokens, prefill query-key
        pairs and the decodes' KV tokens.

        The log does not say where in its prompt a chunk starts, so every context request
        gets an even share of the context tokens from position 0, and the decodes' context is
        the KV in use less the context tokens (which then includes the earlier chunks of
        prompts still prefilling). The fit
        (:func:`chunktune.sim.calibration.profile.twin_features`) and a calibrated replay
        (:meth:`calibrated_step_time`) both cost a step from these features, so a replay reproduces
        the fit's accuracy instead of mixing two views."""
        tokens = ctx_tokens + gen_tokens
        chunks: list[tuple[int, int]] = []
        pairs = 0.0
        if ctx_reqs:
            each = max(1, ctx_tokens // ctx_reqs)
            chunks = [(each, 0)] * ctx_reqs
            share = ctx_tokens / ctx_reqs
            pairs = ctx_reqs * share * (share + 1) / 2
        dec_ctx, kv = 0, 0.0
        if gen_reqs and kv_tokens is not None:
            dec_ctx = max(gen_reqs, int(kv_tokens) - ctx_tokens)
            kv = max(float(gen_reqs), kv_tokens - ctx_tokens)
        attn = self.attention_time(chunks, gen_reqs, dec_ctx)
        return (self.c.step_overhead_s, self.c.per_request_overhead_s * (ctx_reqs + gen_reqs),
                self.linear_time(tokens) if tokens else 0.0, attn, float(tokens), pairs, kv)

    def calibrated_step_time(self, ctx_reqs: int, ctx_tokens: int, gen_reqs: int,
                             gen_tokens: int, kv_tokens: float) -> float:
        """Seconds for one step under a calibration profile (:meth:`calibrate`), from the
        step's iteration-log view (:meth:`log_features`), plus the profile's step gap."""
        assert self.calibration is not None
        if ctx_tokens + gen_tokens == 0:
            return 0.0
        f = self.log_features(ctx_reqs, ctx_tokens, gen_reqs, gen_tokens, kv_tokens)
        return sum(c * x for c, x in zip(self.calibration[:7], f, strict=True)) \
            + self.calibration[7]

    def linear_time(self, tokens: int) -> float:
        if tokens <= self.max_tokens:
            return self._linear[tokens]
        lin = self._linear
        per = (lin[self.max_tokens] - lin[self.max_tokens // 2]) / (self.max_tokens // 2)
        return lin[self.max_tokens] + per * (tokens - self.max_tokens)

    def dp_experts_time(self, gathered_tokens: int) -> float:
        """The routed experts of a data-parallel step (``data_parallel_size > 1``): every MoE
        layer on the ``gathered_tokens`` of all ranks (each rank's tokens padded to the
        largest rank's, as vLLM's DPMetadata pads them), the experts split over the ranks,
        with the dispatch and combine between the ranks."""
        ex = self._dp_experts
        top = len(ex) - 1
        if gathered_tokens <= top:
            return ex[gathered_tokens]
        per = (ex[top] - ex[top // 2]) / (top - top // 2)
        return ex[top] + per * (gathered_tokens - top)

    def allreduce_time(self, tokens: int) -> float:
        """All layers' tensor-parallel all-reduces for a step of ``tokens`` tokens."""
        if tokens <= self.max_tokens:
            return self._allreduce[tokens]
        ar = self._allreduce
        per = (ar[self.max_tokens] - ar[self.max_tokens // 2]) / (self.max_tokens // 2)
        return ar[self.max_tokens] + per * (tokens - self.max_tokens)

    def attention_time(self, prefill_chunks: list[tuple[int, int]], num_decodes: int,
                       decode_context_tokens: int) -> float:
        """All layers' attention for the batch (see :func:`attention_layer_time`)."""
        if not prefill_chunks and not num_decodes:
            return 0.0
        if self._mla is not None:
            dec = self._mla.decode_s(num_decodes, decode_context_tokens / num_decodes) \
                if num_decodes else 0.0
            return self._layers * (dec + sum(self._mla.prefill_s(c, done)
                                             for c, done in prefill_chunks))
        full = self._layers - self._windowed
        t = full * (attention_layer_time(
            self._attn_shape, self.gpu, self._attn_c, prefill_chunks, num_decodes,
            decode_context_tokens) + self._attn_fixed) if full else 0.0
        if self._windowed:
            t += self._windowed * (attention_layer_time(
                self._attn_shape, self.gpu, self._attn_c, prefill_chunks, num_decodes,
                min(decode_context_tokens, num_decodes * self._window), self._window)
                + self._attn_fixed)
        return t

    def step_time(self, num_tokens: int, num_reqs: int, num_logits: int,
                  prefill_chunks: list[tuple[int, int]], num_decodes: int,
                  decode_context_tokens: int, gathered_tokens: int = 0,
                  without_graphs: bool = False) -> float:
        """Seconds for one step.

        ``prefill_chunks``: ``(chunk_tokens, already_computed_tokens)`` per prefilling request;
        ``decode_context_tokens``: the summed context length of the decodes;
        ``gathered_tokens``: with data parallelism, the tokens of all ranks the routed experts
        run on (:meth:`dp_experts_time`, part of the GPU's time); ``without_graphs``: a batch
        that would run as a CUDA graph runs without one (a data-parallel rank whose peer's
        batch exceeds the capture sizes): the host launches its kernels, as under
        ``--enforce-eager``.
        """
        if num_tokens == 0:
            return 0.0
        if self.calibration is not None:
            s0, s1, s2, s3, per_tok, per_pair, per_kv, gap = self.calibration
            pairs = sum(c * (done + (c + 1) / 2) for c, done in prefill_chunks)
            return (s0 * self.c.step_overhead_s + s1 * self.c.per_request_overhead_s * num_reqs
                    + s2 * self.linear_time(num_tokens)
                    + s3 * self.attention_time(prefill_chunks, num_decodes,
                                               decode_context_tokens)
                    + per_tok * num_tokens + per_pair * pairs
                    + per_kv * decode_context_tokens + gap)
        host = self._overhead + self._per_req * num_reqs
        t = self.forward_time(num_tokens, num_logits, prefill_chunks, num_decodes,
                              decode_context_tokens)
        if without_graphs and not self._eager:
            t += self.c.eager_launch_overhead_per_layer_s * self._layers
        if self._dp_experts:
            t += self.dp_experts_time(gathered_tokens)
        return max(host, t) if self.async_scheduling else host + t

    def forward_time(self, num_tokens: int, num_logits: int,
                     prefill_chunks: list[tuple[int, int]], num_decodes: int,
                     decode_context_tokens: int) -> float:
        """The GPU's part of a step (no host overhead): the forward pass, the logits of
        ``num_logits`` rows, the all-reduces; also a drafter's forward
        (:mod:`chunktune.sim.cost.draft`)."""
        if num_tokens == 0:
            return 0.0
        t = self._eager + self.linear_time(num_tokens)
        t += self.attention_time(prefill_chunks, num_decodes, decode_context_tokens)
        if num_logits:
            t += self._lm_weight_s + self._lm_row_s * num_logits
        return t + self.allreduce_time(num_tokens)

    def prefill_time(self, prompt: int, chunk: int | None = None) -> float:
        """Time to prefill one prompt alone in chunks of ``chunk`` tokens (whole if None)."""
        chunk = chunk or prompt
        done, t = 0, 0.0
        while done < prompt:
            c = min(chunk, prompt - done)
            last = done + c >= prompt
            t += self.step_time(c, 1, 1 if last else 0, [(c, done)], 0, 0)
            done += c
        return t
