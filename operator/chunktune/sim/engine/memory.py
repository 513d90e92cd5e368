"""Start-up memory model: what vLLM's memory profiling leaves for the KV cache, and how it fails.

vLLM V1 (``Worker.determine_available_memory``) loads the weights, runs a dummy forward pass of
``max_num_batched_tokens`` tokens and a dummy sampler pass of ``max_num_seqs`` requests, then

    KV = total x gpu_memory_utilization - weights - activation peak - non-torch - CUDA graphs

(CUDA-graph memory is part of the profile since v0.21, PR #38284). The KV memory is cut into
blocks of ``block_size`` tokens; one max-length request must fit.

Calibration (each figure from a published vLLM start-up log; see ``docs/simulator.md``):

- the activation peak is the larger of the forward pass (~135 KB per batched token for
  Llama-3.1-8B at TP1, seen on a pipeline-parallel first stage: 1.05-1.10 GiB at 8192 tokens) and
  the sampler warm-up (~15.3 bytes x max_num_seqs x vocab: 1.89 GiB for Llama-3.1-8B,
  2.21 GiB for Qwen2.5-7B at 1024 sequences, unchanged by TP) — llm-d-planner's vLLM 0.19 logs;
- non-torch memory: 0.25 GiB at TP1, ~2.1 GiB with TP >= 2 (NCCL buffers), same logs;
- CUDA graphs: 0.9 GiB for an 8B model, 1.7 GiB for a 70B model at the default 67 capture
  sizes, same logs.

Derived from vLLM 0.33's code instead (:mod:`.activation`; not measured): the fused-MoE
workspace the profile run leaves allocated (added under both passes' peak) and MLA's and the
MXFP4 experts' transients of the forward pass. The sampler warm-up is derived from each read
release's ``_dummy_sampler_run`` (0.17 / 0.19: the V1 runner, 14 B a logit plus the Triton
top-k/top-p buffer, which reproduces the calibration above within 2%; 0.31 / 0.32: Model Runner
V2's single default pass, the model-dtype logits; 0.33: its second pass with
``for_sampler_warmup`` parameters, 14 B a logit), plus Model Runner V2's per-request penalty
state (4.125 B a logit, allocated at load); other releases keep the calibration.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from chunktune.core.engine_args import EngineStartupError, ResolvedConfig
from chunktune.core.errors import SpecError
from chunktune.core.models import CHUNKED, SLIDING, ModelConfig
from chunktune.core.vllm_release import cudagraphs_profiled, in_flight_tokens
from chunktune.sim.engine.activation import (
    mla_profile_bytes,
    moe_transient_bytes,
    moe_workspace_bytes,
    sampler_state_bytes,
    sampler_warmup_bytes,
)
from chunktune.sim.engine.mxfp4 import mxfp4_layout_bytes

GiB = float(2**30)

#: Forward-pass activation bytes per token = this x dtype bytes x (2*hidden + qkv + 3*inter).
#: 1.18 reproduces ~135 KB/token for Llama-3.1-8B (the allocator's rounding and temporaries).
ACTIVATION_FUDGE = 1.18
#: Sampler warm-up bytes per (sequence x vocab entry), calibrated on vLLM 0.19 start-up logs:
#: the figure for releases whose sampler warm-up is not derived
#: (:func:`.activation.sampler_warmup_bytes` is None).
SAMPLER_BYTES_PER_LOGIT = 15.3
NON_TORCH_TP1_GIB = 0.25
NON_TORCH_TP_GIB = 2.1
#: CUDA-graph pool at vLLM's 67 default capture sizes: a + b x layers (GiB).
CUDAGRAPH_BASE_GIB = 0.367
CUDAGRAPH_PER_LAYER_GIB = 0.01667
DEFAULT_CAPTURE_SIZES = 67


@dataclass(frozen=True)
class MemoryPlan:
    """The start-up memory accounting of one engine, in bytes (what vLLM logs)."""

    total: float
    requested: float
    weights: float
    activation_peak: float
    forward_activation: float
    sampler_activation: float
    non_torch: float
    cudagraph: float
    kv_cache: float
    kv_bytes_per_block: float
    num_gpu_blocks: int
    max_model_len: int
    block_size: int
    #: vLLM's pool of block ids (``KVCacheConfig.num_blocks``) and the KV tokens it prints,
    #: when windowed layers make them differ from :attr:`num_gpu_blocks`, the blocks of
    #: block_size tokens the scheduler admits and preempts against (0: the same)
    pool_blocks: int = 0
    reported_tokens: int = 0
    #: blocks one max-length request takes from the pool (0: ceil(max_model_len/block_size))
    pool_blocks_per_request: int = 0
    #: of :attr:`activation_peak`, the fused-MoE workspace the profiling pass leaves allocated
    #: (:func:`.activation.moe_workspace_bytes`)
    moe_workspace: float = 0.0
    #: of :attr:`activation_peak`, Model Runner V2's sampler state allocated at load
    #: (:func:`.activation.sampler_state_bytes`)
    sampler_state: float = 0.0

    @property
    def kv_cache_tokens(self) -> int:
        return self.reported_tokens or self.num_gpu_blocks * self.block_size

    @property
    def max_concurrency(self) -> float:
        """How many max-length requests fit at once (vLLM's "Maximum concurrency")."""
        if self.pool_blocks_per_request:
            return self.pool_blocks / self.pool_blocks_per_request
        per_req = math.ceil(self.max_model_len / self.block_size)
        return self.num_gpu_blocks / per_req

    def log_lines(self) -> list[str]:
        """The start-up lines vLLM prints, with this plan's figures."""
        g = GiB
        return [
            f"Memory profiling takes 1.00 seconds. Total GPU memory: {self.total / g:.2f}GiB; "
            f"requested memory: {self.requested / g:.2f}GiB; model weights take "
            f"{self.weights / g:.2f}GiB; non_torch_memory takes {self.non_torch / g:.2f}GiB; "
            f"PyTorch activation peak memory takes {self.activation_peak / g:.2f}GiB; "
            f"CUDA graph memory takes {self.cudagraph / g:.2f}GiB; the rest of the memory "
            f"reserved for KV Cache is {self.kv_cache / g:.2f}GiB.",
            f"Available KV cache memory: {self.kv_cache / g:.2f} GiB",
            f"GPU KV cache size: {self.kv_cache_tokens:,} tokens",
            f"Maximum concurrency for {self.max_model_len:,} tokens per request: "
            f"{self.max_concurrency:.2f}x",
        ]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["kv_cache_tokens"] = self.kv_cache_tokens
        d["max_concurrency"] = self.max_concurrency
        return d


@dataclass(frozen=True)
class KVGroup:
    """One KV-cache group of vLLM's hybrid KV cache manager: layers of one attention kind
    sharing a block table (vLLM 0.33 ``kv_cache_planning._get_kv_cache_groups_uniform_page_size``).
    """

    kind: str
    #: layers in the group (the largest of its kind's groups when the kind splits unevenly)
    layers: int
    #: KV bytes one layer of the group stores per token on one rank
    bytes_per_token: float
    #: blocks one max-length request takes from the pool for this group
    #: (``KVCacheSpec.max_memory_usage_bytes`` / ``page_size_bytes``)
    blocks_per_request: int
    #: tokens one block of the group holds: block_size, times the page ratio when vLLM
    #: unifies a smaller page by its block size (``unify_kv_cache_spec_page_size``)
    block_tokens: int = 0
    #: bytes of one layer's page of a block after the page-size unification (0: the
    #: layer's bytes a token x block_size)
    page_bytes: float = 0.0


@dataclass(frozen=True)
class KVLayout:
    """How vLLM lays out a model's KV cache: its groups and the bytes of one pool block."""

    groups: tuple[KVGroup, ...]
    #: bytes of one block id across every layer of the widest group
    #: (``_get_kv_cache_bytes_per_block``): each group's layers hold one page of it
    bytes_per_block: float
    block_size: int
    max_model_len: int

    @property
    def hybrid(self) -> bool:
        return len({g.kind for g in self.groups}) > 1

    @property
    def blocks_per_request(self) -> int:
        """Pool blocks one max-length request takes across all groups."""
        return sum(g.blocks_per_request for g in self.groups)

    def tokens(self, pool_blocks: int) -> int:
        """The KV tokens vLLM prints for ``pool_blocks`` (``get_kv_cache_capacity``: max
        concurrency x max_model_len; blocks x block_size without windowed layers)."""
        if not self.hybrid:
            return pool_blocks * self.block_size
        return int(pool_blocks / self.blocks_per_request * self.max_model_len)


def _blocks_per_request(kind: str, model: ModelConfig, block_size: int, max_model_len: int,
                        in_flight: int) -> int:
    """vLLM 0.33 ``max_admission_blocks_per_request`` of each spec: a sliding-window layer
    holds its window (less one) plus the tokens in flight, +1 block for the window's
    misaligned start (``SlidingWindowSpec``); a chunked-local one its chunk plus the tokens in
    flight (``ChunkedLocalAttentionSpec``); full attention and MLA every token."""
    if kind == SLIDING:
        n = min(model.sliding_window - 1 + in_flight, max_model_len)
        return math.ceil(n / block_size) + 1
    if kind == CHUNKED:
        return math.ceil(min(model.attention_chunk_size + in_flight, max_model_len)
                         / block_size)
    return math.ceil(max_model_len / block_size)


def kv_cache_layout(cfg: ResolvedConfig) -> KVLayout:
    """The model's KV-cache groups as vLLM 0.33 forms them (``get_kv_cache_groups``): one
    group of every layer when all layers share one spec; otherwise (gpt-oss's sliding and
    full layers, Llama-4's chunked and full ones, Gemma-4's sliding and full ones) the layers
    of each kind split into groups of the smallest kind's layer count (the largest's when it
    is under 1.5x the smallest), every group's layers holding a page of each pool block.
    Kinds with different page sizes (Gemma-4's full layers: 2 KV heads of 512 against the
    sliding layers' 8 of 256) are first unified to the largest page
    (``unify_kv_cache_spec_page_size``): a page that divides it takes proportionally more
    tokens a block, another is padded to it. That is the layout of vLLM's default
    layer-outer KV-cache layout (LBNHC, ``resolve_kv_cache_layout`` when no backend declares
    others); the block-outer packing (``_get_packed_kv_cache_groups``) is not modelled.
    Tokens in flight: ``max_concurrent_batches`` (2 with async scheduling) x
    max_num_batched_tokens (``VllmConfig.max_in_flight_tokens``), one batch before vLLM 0.26
    (:func:`~chunktune.core.vllm_release.in_flight_tokens`)."""
    m, tp, bs = cfg.model, cfg.tensor_parallel_size, cfg.block_size
    kinds = m.layer_kinds()
    counts = {k: kinds.count(k) for k in dict.fromkeys(kinds)}
    in_flight = in_flight_tokens(cfg.vllm_version, cfg.async_scheduling,
                                 cfg.max_num_batched_tokens)
    if len(counts) == 1:
        group_size = len(kinds)
    else:
        group_size = min(counts.values())
        if max(counts.values()) < 1.5 * group_size:
            group_size = max(counts.values())
    per_token = {k: m.kv_bytes_per_token_per_layer(k, tp, cfg.kv_cache_dtype_bytes)
                 for k in counts}
    max_page = max(per_token.values()) * bs
    groups: list[KVGroup] = []
    for kind, n in counts.items():
        page = per_token[kind] * bs
        ratio = int(max_page // page) if max_page % page == 0 else 1
        blocks = _blocks_per_request(kind, m, bs * ratio, cfg.max_model_len, in_flight)
        num = math.ceil(n / group_size)  # layers[i::num] for the i-th group
        groups += [KVGroup(kind, math.ceil(n / num), per_token[kind], blocks, bs * ratio,
                           max_page)] * num
    per_block = max(g.layers * g.page_bytes for g in groups)
    return KVLayout(tuple(groups), per_block, bs, cfg.max_model_len)


def forward_activation_bytes(cfg: ResolvedConfig, vllm_env: Mapping[str, str] | None = None
                             ) -> float:
    """The transient peak of the profiling forward pass: the per-token live set calibrated on
    Llama-3.1-8B (:data:`ACTIVATION_FUDGE`), plus the MoE and MLA buffers vLLM 0.33's code
    allocates on top of it in that pass (:mod:`.activation`: the monolithic MXFP4 experts'
    intermediate, MLA's ``kv_b_proj`` worst-case tensor). The fused-MoE workspace, which
    stays allocated, is :func:`.activation.moe_workspace_bytes`, charged in
    :func:`plan_memory`. ``vllm_env``: the server's vLLM environment variables."""
    return per_token_activation_bytes(cfg) + max(moe_transient_bytes(cfg, vllm_env),
                                                 mla_profile_bytes(cfg))


def per_token_activation_bytes(cfg: ResolvedConfig) -> float:
    m, tp = cfg.model, cfg.tensor_parallel_size
    kv = (m.kv_lora_rank + m.qk_rope_head_dim if m.is_mla  # the latent, on every rank
          else max(1, math.ceil(m.num_key_value_heads / tp)) * m.head_dim)
    inter = (m.moe_intermediate_size * m.num_experts_per_tok if m.is_moe
             else m.intermediate_size)
    per_token = m.dtype_bytes * (2 * m.hidden_size + m.q_dim / tp + 2 * kv + 3 * inter / tp)
    return ACTIVATION_FUDGE * per_token * cfg.max_num_batched_tokens


def sampler_activation_bytes(cfg: ResolvedConfig) -> float:
    """The sampler warm-up's peak: derived from the release's ``_dummy_sampler_run``
    (:func:`.activation.sampler_warmup_bytes`) where its code was read, else the vLLM 0.19
    calibration (:data:`SAMPLER_BYTES_PER_LOGIT`)."""
    derived = sampler_warmup_bytes(cfg)
    if derived is not None:
        return derived
    return SAMPLER_BYTES_PER_LOGIT * cfg.max_num_seqs * cfg.model.vocab_size


def cudagraph_bytes(cfg: ResolvedConfig) -> float:
    if not cfg.cudagraph_capture_sizes:
        return 0.0
    per_default = CUDAGRAPH_BASE_GIB + CUDAGRAPH_PER_LAYER_GIB * cfg.model.num_hidden_layers
    return per_default * len(cfg.cudagraph_capture_sizes) / DEFAULT_CAPTURE_SIZES * GiB


def drafter(cfg: ResolvedConfig) -> ModelConfig | None:
    """The speculative drafter's network, whose weights and KV the engine also holds: a draft
    model, or one decoder layer of the target's shape for EAGLE / EAGLE-3 / MTP heads; None
    for ngram or without speculative decoding."""
    spec = cfg.speculative
    if spec is None or spec.method == "ngram":
        return None
    if cfg.draft_model is not None:
        return cfg.draft_model
    return cfg.model.with_overrides(num_hidden_layers=1)


def plan_memory(cfg: ResolvedConfig, vllm_env: Mapping[str, str] | None = None) -> MemoryPlan:
    """Reproduce start-up profiling under the server's vLLM environment variables
    ``vllm_env`` (those that choose a kernel, and so a weight layout: gpt-oss's MXFP4
    experts on Marlin under ``VLLM_MXFP4_USE_MARLIN=1``). Raises
    :class:`EngineStartupError` with vLLM's message when the engine would not start
    (``EngineOOM``, ``KVCacheTooSmall``)."""
    total = cfg.gpu.memory_bytes
    tp = cfg.tensor_parallel_size
    draft = drafter(cfg)
    dp = cfg.data_parallel_size
    # MXFP4 experts: as the release's backend for this GPU stores them (padded, swizzled, kept)
    weights = (cfg.model.weight_bytes(tp, data_parallel=dp) + mxfp4_layout_bytes(cfg, vllm_env)
               + (draft.weight_bytes(tp, ropes_held=cfg.model.rope_caches()) if draft else 0.0))
    # the NCCL buffers of a rank in a group: the TP group's, or the experts' across DP ranks
    non_torch = (NON_TORCH_TP1_GIB if tp * dp == 1 else NON_TORCH_TP_GIB) * GiB
    fwd = forward_activation_bytes(cfg, vllm_env)
    smp = sampler_activation_bytes(cfg)
    # the fused-MoE workspace stays allocated from the first MoE layer through the sampler;
    # Model Runner V2's sampler state from the model's loading on
    workspace = moe_workspace_bytes(cfg, vllm_env)
    state = sampler_state_bytes(cfg)
    act = workspace + state + max(fwd, smp)
    graphs = cudagraph_bytes(cfg)
    requested = total * cfg.gpu_memory_utilization
    if weights + non_torch > total:
        _torch_oom(weights + non_torch - total + 1 * GiB, total, 0.0, weights,
                   hint=f"the model's weights alone ({weights / GiB:.1f} GiB per GPU at "
                        f"tensor-parallel-size {tp}) do not fit the {cfg.gpu.name}'s "
                        f"{total / GiB:.1f} GiB: no batch budget or sequence count starts "
                        "it; use a GPU with more memory, a larger tensor-parallel-size or a "
                        "smaller (quantized) model")
    if weights + non_torch + act > total:
        free = max(0.0, total - weights - non_torch)
        _torch_oom(act, total, free, weights + non_torch)
    if cfg.kv_cache_memory_bytes is not None:
        kv = float(cfg.kv_cache_memory_bytes)
    else:  # before v0.21 the graphs were captured after the KV cache, outside this budget
        kv = requested - weights - act - non_torch \
            - (graphs if cudagraphs_profiled(cfg.vllm_version) else 0.0)
    layout = kv_cache_layout(cfg)
    per_block = layout.bytes_per_block
    if draft is not None:  # the drafter's attention layers share the cache's blocks
        if layout.hybrid:
            raise SpecError("speculative decoding on a model whose KV cache has several "
                            "groups (sliding-window or chunked layers beside full ones) is not "
                            "modelled: vLLM adds the drafter's layers to those groups",
                            field="--speculative-config")
        per_block += draft.kv_bytes_per_token(tp, cfg.kv_cache_dtype_bytes) * cfg.block_size
    blocks = int(kv // per_block) if kv > 0 else 0
    if cfg.num_gpu_blocks_override is not None:
        blocks = cfg.num_gpu_blocks_override
    pool = {}
    if layout.hybrid:  # the pool's blocks (the scheduler's), and the tokens vLLM prints
        tokens = layout.tokens(blocks)
        pool = {"pool_blocks": blocks, "reported_tokens": tokens,
                "pool_blocks_per_request": layout.blocks_per_request}
        blocks = tokens // cfg.block_size
    plan = MemoryPlan(total, requested, weights, act, fwd, smp, non_torch, graphs, kv,
                      per_block, blocks, cfg.max_model_len, cfg.block_size,
                      moe_workspace=workspace, sampler_state=state, **pool)
    if kv <= 0 and cfg.num_gpu_blocks_override is None:
        raise EngineStartupError(
            "KVCacheTooSmall",
            "ValueError: No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine (this flag also controls "
            "CPU memory reservation on the CPU backend, despite its name). See "
            "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.",
            hint="weights, the activation peak of max_num_batched_tokens / max_num_seqs and "
                 "CUDA graphs leave nothing for the KV cache: lower max-num-batched-tokens or "
                 "max-num-seqs, or raise gpu-memory-utilization",
            preceding=tuple(plan.log_lines()[:2]),
        )
    # vLLM 0.32 sizes one request as its blocks plus the null block (kv_cache_utils.py
    # _check_enough_kv_cache_memory / estimate_max_model_len).
    need_blocks = math.ceil(cfg.max_model_len / cfg.block_size) + 1
    if layout.hybrid:  # every group's blocks of one max-length request, from the one pool
        need_blocks, blocks = layout.blocks_per_request + 1, plan.pool_blocks
    if blocks < need_blocks:
        need = need_blocks * per_block
        have = blocks * per_block
        est = max(blocks - 1, 0) * cfg.block_size if not layout.hybrid \
            else _longest_fitting(cfg, blocks)
        estimated = (f"Based on the available memory, the estimated maximum model length is "
                     f"{est}. " if est > 0 else "")
        raise EngineStartupError(
            "MaxModelLenTooLarge",
            f"ValueError: To serve at least one request with the model's max seq len "
            f"({cfg.max_model_len}), ({_gib(need)} GiB KV cache is needed, which is larger "
            f"than the available KV cache memory ({_gib(have)} GiB). {estimated}Try increasing "
            "`gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or "
            "decreasing `max_model_len` when initializing the engine. See "
            "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.",
            hint=f"lower --max-model-len to at most {est}, or free memory for the KV cache",
            preceding=tuple(plan.log_lines()[:3]),
            estimated_max_model_len=est,
        )
    return plan


def _longest_fitting(cfg: ResolvedConfig, pool_blocks: int) -> int:
    """The longest request whose blocks of every group fit ``pool_blocks`` with the null
    block (vLLM 0.33 ``estimate_max_model_len``: a binary search over the length)."""
    lo, hi = 0, cfg.max_model_len
    while lo < hi:
        mid = (lo + hi + 1) // 2
        layout = kv_cache_layout(replace(cfg, max_model_len=mid))
        if layout.blocks_per_request + 1 <= pool_blocks:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _gib(b: float) -> str:
    """vLLM's ``format_gib``: GiB rounded to 2 decimals, as ``str(round(...))`` prints it."""
    return f"{round(b / GiB, 2)}"


def _torch_oom(alloc: float, total: float, free: float, in_use: float,
               hint: str = "the memory profiling run (a forward pass of max_num_batched_tokens "
                           "tokens and a sampler pass of max_num_seqs requests) does not fit: "
                           "lower either") -> None:
    raise EngineStartupError(
        "EngineOOM",
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {alloc / GiB:.2f} GiB. "
        f"GPU 0 has a total capacity of {total / GiB:.2f} GiB of which {free / 2**20:.2f} MiB "
        f"is free. Including non-PyTorch memory, this process has {in_use / GiB:.2f} GiB "
        "memory in use.",
        hint=hint,
    )
