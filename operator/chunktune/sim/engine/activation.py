"""The buffers of vLLM 0.33's memory-profiling pass that MoE and MLA layers add, derived from its
code (``bench/vllm_activation_reference.py`` computes them with vLLM's own functions; nothing
here is measured on a GPU).

``Worker.determine_available_memory`` runs ``GPUModelRunner.profile_run`` (``_dummy_run`` of
``max_num_batched_tokens`` tokens without attention metadata, then ``_dummy_sampler_run`` of
``max_num_seqs`` rows) and charges the KV cache with the torch allocator's peak, everything still
allocated afterwards included (``memory_profiling``: ``total_consumed`` + ``torch_peak -
torch_allocated``). Two terms follow from the MoE and MLA code:

- :func:`moe_workspace_bytes`: the fused-MoE workspace. ``FusedMoEKernel._allocate_buffers``
  takes ``workspace13`` (which also holds the output) and ``workspace2`` from the process-wide
  ``WorkspaceManager.get_simultaneous`` (one buffer, each part rounded up to 256 bytes) with the
  shapes of the experts class's ``workspace_shapes`` for the whole batch (0.33 no longer chunks
  it). The manager keeps the buffer: it is allocated through the sampler pass as well, so it
  adds to the peak whichever pass sets it.
- :func:`mla_profile_bytes`: without attention metadata ``MLAAttention.forward`` allocates
  ``(chunked_prefill_workspace_size, heads a rank, qk_nope_head_dim + v_head_dim)`` in the model's
  dtype, the worst case of ``kv_b_proj`` over a context chunk, freed at once (a transient of the
  forward pass).

The experts class is the one vLLM 0.33's MoE oracles pick on Hopper (SM90) for tensor-parallel
experts: ``TritonExperts`` for block-FP8 (``_get_priority_backends`` moves TRITON to the front
on SM90 without EP; with EP it moves FlashInfer CUTLASS there, not derived) and unquantized
experts (FlashInfer moved behind Triton on SM90),
``MarlinExperts`` for INT4 weight-only (compressed-tensors WNA16), the monolithic
``OAITritonMxfp4ExpertsMonolithic`` for MXFP4 (no workspace: its intermediate is allocated
inside the call, :func:`moe_transient_bytes`). Other GPU families pick other kernels (FlashInfer
TRT-LLM on Blackwell) whose buffers are not derived: no workspace is charged there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from chunktune.core.engine_args import ResolvedConfig
from chunktune.core.models import MLA
from chunktune.core.vllm_release import CURRENT
from chunktune.sim.engine.mxfp4 import MARLIN as MXFP4_MARLIN
from chunktune.sim.engine.mxfp4 import TRITON as MXFP4_TRITON
from chunktune.sim.engine.mxfp4 import mxfp4_backend

#: ``WorkspaceManager.get_simultaneous`` rounds each part up to this many bytes
WORKSPACE_ALIGN = 256
#: ``MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size``'s cap (rows)
MLA_CHUNKED_PREFILL_CAP = 64 * 1024

TRITON, MARLIN, OAI_TRITON = "TritonExperts", "MarlinExperts", "OAITritonMxfp4ExpertsMonolithic"


#: MXFP4 experts on Marlin run as a modular kernel (``MarlinExperts``, the workspace manager's
#: buffer) from 0.17.0 (read: 0.17, 0.19, 0.33); 0.14-0.15 call ``fused_marlin_moe`` from
#: ``Mxfp4MoEMethod.apply``, whose per-call caches are not derived (0.16 not read)
MXFP4_MARLIN_MODULAR = (0, 17, 0)


def moe_experts_class(cfg: ResolvedConfig, vllm_env: Mapping[str, str] | None = None) -> str:
    """The fused-MoE experts class vLLM 0.33 runs this engine's routed experts with on Hopper,
    and gpt-oss's MXFP4 experts as the release's backend for the GPU runs them
    (:func:`chunktune.sim.engine.mxfp4.mxfp4_backend`: the OAI Triton kernels on Hopper,
    ``MarlinExperts`` on Ampere / Ada and on Hopper before 0.12); "" where that is not derived
    (not an MoE model, another GPU family, another format or release)."""
    m = cfg.model
    if not m.is_moe:
        return ""
    if m.quantization == "mxfp4":
        backend = mxfp4_backend(cfg.gpu.family, cfg.vllm_version, cfg.gpu.name, vllm_env)
        if backend == MXFP4_TRITON and cfg.gpu.family == "hopper":
            return OAI_TRITON
        if backend == MXFP4_MARLIN and (cfg.vllm_version or CURRENT) >= MXFP4_MARLIN_MODULAR:
            return MARLIN
        return ""
    if cfg.gpu.family != "hopper":
        return ""
    if m.quantization == "compressed-tensors" and m.weight_dtype.startswith("int4"):
        return MARLIN
    ep = cfg.enable_expert_parallel or cfg.data_parallel_size > 1
    if m.quantization == "" or dict(m.unquantized).get("experts", 0.0) == 1.0:
        return TRITON  # UnquantizedFusedMoEMethod: FlashInfer behind Triton on SM90
    if m.quantization == "fp8" and not ep:  # block FP8 under EP: FlashInfer CUTLASS first
        return TRITON
    return ""


def _moe_problem(cfg: ResolvedConfig) -> tuple[int, int, int, int]:
    """(M, N, K, topk) of ``moe_problem_size`` in the profiling pass: M the batch (with data
    parallelism, vLLM 0.33's default ``allgather_reducescatter`` all-to-all hands every rank's
    experts the batch of every DP rank), N the w13 rows of one local expert (2 x the
    intermediate size, split by TP unless the experts are split whole, EP), K the hidden size."""
    m, tp, dp = cfg.model, cfg.tensor_parallel_size, cfg.data_parallel_size
    ep = cfg.enable_expert_parallel or dp > 1
    inter = m.moe_intermediate_size if ep else m.moe_intermediate_size // tp
    return cfg.max_num_batched_tokens * dp, 2 * inter, m.hidden_size, m.num_experts_per_tok


def _aligned(nbytes: float) -> float:
    return math.ceil(nbytes / WORKSPACE_ALIGN) * WORKSPACE_ALIGN


def moe_workspace_bytes(cfg: ResolvedConfig, vllm_env: Mapping[str, str] | None = None
                        ) -> float:
    """Bytes of the fused-MoE workspace the profiling pass leaves allocated (``FusedMoEKernel.
    _allocate_buffers`` / ``WorkspaceManager.get_simultaneous``) on one rank, in the model's
    dtype (``workspace_dtype``): for ``TritonExperts.workspace_shapes`` workspace13 (M, topk,
    max(N/2, K)) and workspace2 (M, topk, max(N, K)); for ``MarlinExperts.workspace_shapes``
    (whose N is the intermediate size, half the w13 rows) (M x topk, max(N, K)) and
    (M x topk x max(2N, K),); the output (M, K) shares workspace13's storage."""
    kind = moe_experts_class(cfg, vllm_env)
    if kind not in (TRITON, MARLIN):
        return 0.0
    M, N, K, k = _moe_problem(cfg)
    if kind == TRITON:
        ws13, ws2 = M * k * max(N // 2, K), M * k * max(N, K)
    else:
        n = N // 2
        ws13, ws2 = M * k * max(n, K), M * k * max(2 * n, K)
    b = cfg.model.dtype_bytes
    return _aligned(max(ws13, M * K) * b) + _aligned(ws2 * b)


def moe_transient_bytes(cfg: ResolvedConfig, vllm_env: Mapping[str, str] | None = None
                        ) -> float:
    """Bytes the monolithic OAI Triton MXFP4 experts allocate inside one call
    (``triton_kernel_fused_experts`` with no intermediate cache: (M x topk, N/2) in the
    model's dtype, freed when the layer returns); 0 for the other classes. The Triton
    ``matmul_ogs`` kernels' own scratch is not followed."""
    if moe_experts_class(cfg, vllm_env) != OAI_TRITON:
        return 0.0
    M, N, _, k = _moe_problem(cfg)
    return M * k * (N // 2) * cfg.model.dtype_bytes


def mla_chunked_prefill_rows(cfg: ResolvedConfig) -> int:
    """``MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size``: 8 max-length
    requests or 4 blocks a sequence, at most 64k rows, rounded up to the block size
    (``align_mla_chunked_context_workspace_size``, no decode context parallelism)."""
    rows = min(max(8 * cfg.max_model_len, 4 * cfg.max_num_seqs * cfg.block_size),
               MLA_CHUNKED_PREFILL_CAP)
    bs = cfg.block_size
    return math.ceil(max(rows, bs) / bs) * bs


def mla_profile_bytes(cfg: ResolvedConfig) -> float:
    """The tensor ``MLAAttention.forward`` allocates in the profiling pass (no attention
    metadata): (chunked_prefill_workspace_size, heads a rank, qk_nope_head_dim + v_head_dim)
    in the model's dtype; 0 without MLA layers."""
    m = cfg.model
    if MLA not in m.layer_kinds():
        return 0.0
    heads = m.num_attention_heads // cfg.tensor_parallel_size
    return (mla_chunked_prefill_rows(cfg) * heads * (m.qk_nope_head_dim + m.v_head_dim)
            * m.dtype_bytes)


# --- the sampler warm-up (``_dummy_sampler_run``) ----------------------------------------------

#: ``DEFAULT_VOCAB_PADDING_SIZE``: the lm-head's rows are the vocabulary rounded up to this
VOCAB_PADDING = 64
#: FlashInfer 0.7's cached row-state buffer of ``top_k_mask_logits`` (``_get_cache_buf``)
FLASHINFER_ROW_STATES_BYTES = 2**20
#: bytes of the float32 tensors the sampler makes (cast, probabilities, noise, masked copy)
FP32 = 4

#: How each derived release's profile run samples (its ``_dummy_sampler_run``):
#: V1_NATIVE: ``GPUModelRunner`` (the default runner before Model Runner V2): ``rand_like`` of
#: the rows, the ``Sampler`` on temperature 0.5 / top-k vocab-1 / top-p 0.9 with FlashInfer's
#: sampler off by default, i.e. the float32 cast, ``apply_top_k_top_p_triton`` in place (its
#: cached (programs, vocab) float32 buffer), ``softmax``'s probabilities and ``random_sample``'s
#: exponential noise; MRV2_DEFAULT: Model Runner V2 (the default on CUDA) samples once with the
#: dummy batch's default parameters: nothing processed, the model-dtype logits sampled by the
#: Gumbel kernel, no vocabulary-wide copy; MRV2_WARMUP: then again with
#: ``SamplingParams.for_sampler_warmup()`` (penalties, logit bias, min-p, top-k 50, top-p 0.9,
#: 5 logprobs): the float32 copy of ``apply_sampling_params``, then FlashInfer's
#: ``top_k_top_p_sampling_from_logits`` (``VLLM_USE_FLASHINFER_SAMPLER`` on by default since
#: 0.31): ``top_k_mask_logits``' masked copy and ``torch.softmax``'s probabilities.
V1_NATIVE, MRV2_DEFAULT, MRV2_WARMUP = "v1-native", "mrv2-default", "mrv2-warmup"
#: The releases whose code was read (``bench/vllm_sampler_reference.py`` runs the V1 path's);
#: other releases keep the vLLM 0.19 start-up-log calibration (``memory.py``).
SAMPLER_PATHS: dict[tuple[int, int], str] = {
    (0, 17): V1_NATIVE, (0, 19): V1_NATIVE,
    (0, 31): MRV2_DEFAULT, (0, 32): MRV2_DEFAULT,
    (0, 33): MRV2_WARMUP,
}


def padded_vocab(vocab: int) -> int:
    """``pad_vocab_size(vocab, 64)``: the lm-head's rows, the width of the logits it returns
    before ``LogitsProcessor._get_logits`` slices the padding off (a view)."""
    return math.ceil(vocab / VOCAB_PADDING) * VOCAB_PADDING


def sampler_path(cfg: ResolvedConfig) -> str:
    """How this engine's vLLM warms its sampler up (:data:`SAMPLER_PATHS`), "" where not
    derived: a release whose code was not read; speculative decoding (the V1 runner's
    rejection-sampler dummy run, Model Runner V2's draft rows: not followed); the V1 runner
    under 8 sequences (``apply_top_k_top_p``'s PyTorch sort path, not followed). Every
    modelled GPU is an NVIDIA one of more than 16 SMs, where ``flashinfer_sampler_supported``
    holds."""
    v = cfg.vllm_version or CURRENT
    path = SAMPLER_PATHS.get((v[0], v[1]), "")
    if cfg.speculative is not None or (path == V1_NATIVE and cfg.max_num_seqs < 8):
        return ""
    return path


def triton_buffer_rows(requests: int, num_sms: int) -> int:
    """Rows of ``apply_top_k_top_p_triton``'s cached float32 buffer: ``min(next_power_of_2(
    programs), SMs)`` with ``programs = min(SMs, rows)``."""
    programs = min(num_sms, requests)
    return min(1 << max(programs - 1, 0).bit_length(), num_sms)


def sampler_warmup_live_bytes(path: str, requests: int, vocab: int, hidden: int,
                              dtype_bytes: float, num_sms: int, tokens: int = 0) -> float:
    """The live bytes at the sampler warm-up's peak on one rank, for ``path``: the forward
    pass's hidden states ``profile_run`` still holds (``tokens`` x hidden) and the rows
    gathered from them (``hidden_states[logits_indices]``), the logits (requests x padded
    vocabulary in the model's dtype: ``LogitsProcessor``'s all-gathered output, held by
    ``_dummy_sampler_run`` throughout) and what the path adds at its peak (see
    :data:`SAMPLER_PATHS`), each float32 (requests x vocab). ``compute_logits``' all-gather
    (tensor parallelism: (1/TP + 2) x the logits) and the small per-request tensors stay
    below this peak and are not counted."""
    logits = requests * padded_vocab(vocab) * dtype_bytes
    held = (tokens + requests) * hidden * dtype_bytes + logits
    plane = requests * vocab * FP32
    cast = plane if dtype_bytes != FP32 else 0.0  # ``logits.to(torch.float32)``
    if path == V1_NATIVE:
        rand = requests * hidden * dtype_bytes  # ``torch.rand_like`` of the rows
        buffer = triton_buffer_rows(requests, num_sms) * vocab * FP32
        return held + rand + cast + 2 * plane + buffer
    if path == MRV2_DEFAULT:
        return held
    if path == MRV2_WARMUP:
        return held + cast + 2 * plane + FLASHINFER_ROW_STATES_BYTES
    raise ValueError(f"no sampler path {path!r}")


def sampler_warmup_bytes(cfg: ResolvedConfig) -> float | None:
    """The sampler warm-up's peak on one rank as this engine's vLLM computes it
    (:func:`sampler_warmup_live_bytes` at ``max_num_seqs`` rows after a forward pass of
    ``max_num_batched_tokens``), None where :func:`sampler_path` is not derived."""
    path = sampler_path(cfg)
    if not path:
        return None
    m = cfg.model
    return sampler_warmup_live_bytes(path, cfg.max_num_seqs, m.vocab_size, m.hidden_size,
                                     m.dtype_bytes, cfg.gpu.sm_count,
                                     tokens=cfg.max_num_batched_tokens)


def sampler_state_bytes(cfg: ResolvedConfig) -> float:
    """The vocabulary-wide per-request state Model Runner V2's ``Sampler`` allocates when the
    model is loaded (``PenaltiesState``: ``output_bin_counts`` (max_num_seqs, vocab) int32 and
    ``prompt_bin_mask`` (max_num_seqs, ceil(vocab / 32)) int32); it stays allocated, so
    ``memory_profiling``'s ``total_consumed`` counts it under both passes. 0 for the V1 runner
    (its penalties are built per step) and where not derived."""
    if sampler_path(cfg) not in (MRV2_DEFAULT, MRV2_WARMUP):
        return 0.0
    reqs, vocab = cfg.max_num_seqs, cfg.model.vocab_size
    return reqs * vocab * 4 + reqs * math.ceil(vocab / 32) * 4
