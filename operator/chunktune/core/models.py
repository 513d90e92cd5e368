"""Model descriptions, read from the Hugging Face ``config.json`` fields that matter for timing
and memory.

A model is only its shape: layer count, widths, head counts, vocabulary, dtype and, for
mixture-of-experts models, the expert counts. Everything the simulator needs (parameter count,
weight bytes, KV bytes per token, FLOPs per token) is derived from these, so any model with a
``config.json`` can be simulated (``--model-config PATH``), not only the shipped catalog.

Quantized checkpoints: the ``quantization_config`` vLLM reads (``config.json``, or ModelOpt's
``hf_quant_config.json`` merged in) gives the method (:attr:`ModelConfig.quantization`), the
storage type of the linear layers' weights (:attr:`ModelConfig.weight_dtype`) and, for ModelOpt
checkpoints, the KV-cache type ``--kv-cache-dtype auto`` resolves to (vLLM 0.32
``resolve_kv_cache_dtype_string``). FP8 is modelled (``quant_method`` ``fp8``, ModelOpt
``quant_algo`` FP8, compressed-tensors 8-bit float weights); as vLLM's ``Fp8LinearMethod`` does,
only the linear layers (attention projections, MLP and experts) are FP8, the embeddings, the
lm_head, the norms and an MoE router stay in the model's dtype, and the activations too (the
per-tensor, per-channel or 128x128-block scales, under 0.03% of the weights, are left out).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from chunktune.core import infile
from chunktune.core.errors import SpecError

#: The largest model config file read: a config.json is a few KB; anything past this is not
#: one (and is not read).
MAX_CONFIG_BYTES = 4 * 2**20

DTYPE_BYTES: dict[str, float] = {
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "float32": 4,
    "float": 4,
    "fp8": 1,
    "float8_e4m3fn": 1,
    "int8": 1,
    "int4": 0.5,
    # 4-bit weight formats with their block scales: MXFP4 (an e8m0 scale per 32 weights),
    # NVFP4 (an fp8 scale per 16), INT4 W4A16 groups of 32 or 128 (a bf16 scale per group).
    "mxfp4": 0.5 + 1 / 32,
    "nvfp4": 0.5 + 1 / 16,
    "int4_g32": 0.5 + 2 / 32,
    "int4_g64": 0.5 + 2 / 64,
    "int4_g128": 0.5 + 2 / 128,
}

#: Attention kinds of a layer, named as vLLM's KV-cache spec for it (vLLM 0.33
#: ``kv_cache_interface``): ``full_attention`` (FullAttentionSpec), ``sliding_attention``
#: (SlidingWindowSpec), ``chunked_attention`` (ChunkedLocalAttentionSpec, Llama-4's local
#: layers), ``mla`` (MLAAttentionSpec: one latent of kv_lora_rank + qk_rope_head_dim per token).
FULL, SLIDING, CHUNKED, MLA = ("full_attention", "sliding_attention", "chunked_attention",
                               "mla")
LAYER_KINDS = (FULL, SLIDING, CHUNKED, MLA)
#: Module classes whose linear layers a checkpoint may leave unquantized.
MODULE_CLASSES = ("attention", "dense_mlp", "shared_experts", "experts")


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a decoder-only transformer, as its ``config.json`` gives it."""

    name: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    dtype: str = "bfloat16"
    tie_word_embeddings: bool = False
    gated_mlp: bool = True
    #: Mixture of experts: routed experts, experts per token, width of one expert's MLP and
    #: shared experts (0 for dense models).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    hf_name: str = ""
    #: vLLM's name of the checkpoint's quantization method (``fp8``, ``modelopt``,
    #: ``compressed-tensors``, ``mxfp4``), or of ``--quantization``'s (:meth:`quantized`);
    #: "" for none.
    quantization: str = ""
    #: Storage type of the quantized linear layers' weights ("" = :attr:`dtype`).
    weight_dtype: str = ""
    #: What ``--kv-cache-dtype auto`` resolves to for this checkpoint (``auto``: the model's
    #: dtype; ``fp8_e4m3`` for a ModelOpt checkpoint with an FP8 ``kv_cache_scheme`` or
    #: ``kv_cache_quant_algo``).
    kv_cache_dtype: str = "auto"
    #: Attention kind of each layer (:data:`LAYER_KINDS`); () = every layer full attention.
    layer_types: tuple[str, ...] = ()
    #: Tokens a ``sliding_attention`` layer attends to (HF ``sliding_window``).
    sliding_window: int = 0
    #: Tokens of a ``chunked_attention`` layer's chunk (Llama-4 ``attention_chunk_size``).
    attention_chunk_size: int = 0
    #: Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2): the latent's rank, the rotary
    #: part of a query/key head, the rest of a query/key head, a value head, the query's
    #: low-rank width (0: queries projected directly).
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    q_lora_rank: int = 0
    #: MoE models whose first (or interleaved) layers keep a dense MLP: how many, and its width
    #: (0 = :attr:`intermediate_size`).
    num_dense_layers: int = 0
    dense_intermediate_size: int = 0
    #: Width of the shared experts together (0 = num_shared_experts x moe_intermediate_size).
    shared_expert_intermediate_size: int = 0
    #: Share of the layers whose linear layers of a module class (:data:`MODULE_CLASSES`) the
    #: checkpoint leaves at :attr:`dtype` (``modules_to_not_convert``, ``ignore``,
    #: ``exclude_modules``, or a method that quantizes only the experts).
    unquantized: tuple[tuple[str, float], ...] = ()
    #: Gemma-4: the full-attention layers' own head size and KV heads (HF ``global_head_dim``,
    #: ``num_global_key_value_heads``; 0 = :attr:`head_dim` / :attr:`num_key_value_heads`), and
    #: whether their checkpoint ships K only (``attention_k_eq_v``: vLLM 0.33 gemma4.py still
    #: builds a V slot in ``qkv_proj`` and loads K into both, so it counts in the weight bytes).
    global_head_dim: int = 0
    num_global_key_value_heads: int = 0
    attention_k_eq_v: bool = False
    #: Gemma-4: every MoE layer also runs a dense MLP of :attr:`intermediate_size` beside its
    #: experts (vLLM 0.33 ``Gemma4DecoderLayer``: ``mlp`` and ``experts``).
    dense_mlp_beside_moe: bool = False
    #: Parameters of the vision tower and its projection vLLM loads beside the language model
    #: (``Gemma4ForConditionalGeneration``), whole on every rank; 0 = none.
    vision_params: int = 0
    #: Type of the rotary embeddings' cos/sin cache ("" = :attr:`dtype`; gpt-oss: vLLM 0.33
    #: gpt_oss.py builds its rotary embedding in float32).
    rope_cache_dtype: str = ""
    #: Every attention layer adds a learned sink per head to its softmax (gpt-oss: vLLM's
    #: ``gpt_oss.py`` passes ``sinks`` to ``Attention``), which decides the attention backend
    #: vLLM can run (``supports_sink``: FlashAttention 3, TRT-LLM's kernels, Triton).
    attention_sinks: bool = False
    #: The q and k RMSNorms normalise over all heads, so under tensor parallelism each layer
    #: all-reduces every token's two variances across the ranks (MiniMax-M2: vLLM 0.17-0.19
    #: ``minimax_m2.py``, ``MiniMaxText01RMSNormTP.forward_qk``).
    qk_norm_allreduce: bool = False

    # ---- derived quantities -------------------------------------------------------------

    @property
    def dtype_bytes(self) -> float:
        """Bytes per element of the activations, embeddings and norms (the model's dtype)."""
        return DTYPE_BYTES[self.dtype]

    @property
    def weight_dtype_bytes(self) -> float:
        """Bytes per weight of the quantized linear layers (1 for FP8 ones)."""
        return DTYPE_BYTES[self.weight_dtype or self.dtype]

    def module_weight_bytes(self, module: str) -> float:
        """Mean bytes per weight of one module class's linear layers: the quantized ones at
        :attr:`weight_dtype`, the share the checkpoint leaves out at :attr:`dtype`."""
        share = dict(self.unquantized).get(module, 0.0)
        return share * self.dtype_bytes + (1.0 - share) * self.weight_dtype_bytes

    def quantized(self, method: str, weight_dtype: str) -> ModelConfig:
        """This model with its linear layers quantized online (``--quantization``)."""
        return replace(self, quantization=method, weight_dtype=weight_dtype, unquantized=())

    @property
    def shape_key(self) -> str:
        """What makes two configs one model to the simulator, whatever their names or weight
        formats (a checkpoint and its FP8 or NVFP4 export share it): layers, widths, heads,
        vocabulary, experts and each layer kind's count."""
        kinds = ",".join(f"{k}{n}" for k, n in sorted(Counter(self.layer_kinds()).items()))
        return (f"h{self.hidden_size} a{self.num_attention_heads}/{self.num_key_value_heads}"
                f"x{self.head_dim} i{self.intermediate_size} v{self.vocab_size} "
                f"e{self.num_experts}/{self.num_experts_per_tok}x{self.moe_intermediate_size}"
                f"+{self.num_shared_experts} d{self.num_dense_layers} mla{self.kv_lora_rank}"
                f"/{self.q_lora_rank} w{self.sliding_window} c{self.attention_chunk_size} "
                f"{kinds}")

    @property
    def weights(self) -> str:
        """The weights' format in one word: the quantized layers' (``fp8``, ``mxfp4``,
        ``nvfp4``, ``int4_g32``), else the checkpoint's dtype (``bf16``)."""
        short = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32",
                 "float": "fp32"}
        return self.weight_dtype or short.get(self.dtype, self.dtype)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def q_dim(self) -> int:
        if self.is_mla:
            return self.num_attention_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def layer_head_dim(self, kind: str) -> int:
        """The head size of a layer of ``kind`` (Gemma-4's full layers have their own)."""
        return self.global_head_dim if kind == FULL and self.global_head_dim else self.head_dim

    def layer_kv_heads(self, kind: str) -> int:
        """The KV heads of a layer of ``kind`` (Gemma-4's full layers have their own)."""
        if kind == FULL and self.num_global_key_value_heads:
            return self.num_global_key_value_heads
        return self.num_key_value_heads

    @property
    def per_kind_heads(self) -> bool:
        """Whether some layers' head size or KV heads differ from :attr:`head_dim` /
        :attr:`num_key_value_heads` (Gemma-4's full-attention layers)."""
        return any((self.layer_head_dim(k), self.layer_kv_heads(k))
                   != (self.head_dim, self.num_key_value_heads) for k in self.layer_kinds())

    def layer_kinds(self) -> tuple[str, ...]:
        """The attention kind of every layer (:data:`LAYER_KINDS`)."""
        if self.layer_types:
            return self.layer_types
        return ((MLA if self.is_mla else FULL),) * self.num_hidden_layers

    @property
    def num_moe_layers(self) -> int:
        return self.num_hidden_layers - self.num_dense_layers if self.is_moe else 0

    # ---- parameters ----------------------------------------------------------------------

    def mla_replicated_params_per_layer(self) -> int:
        """MLA's down-projections (``q_a_proj``, ``kv_a_proj_with_mqa``, fused in vLLM's
        ``fused_qkv_a_proj``) and their norms: replicated on every TP rank (vLLM 0.33
        deepseek_v2.py, ``disable_tp=True``)."""
        if not self.is_mla:
            return 0
        h, r = self.hidden_size, self.qk_rope_head_dim
        return h * (self.q_lora_rank + self.kv_lora_rank + r) + self.q_lora_rank \
            + self.kv_lora_rank

    def attention_params_per_layer(self, kind: str = FULL, loaded: bool = True) -> int:
        """One layer's attention projections; ``loaded``: as vLLM allocates them (a
        ``attention_k_eq_v`` layer's V slot included), else as the checkpoint ships them."""
        h = self.hidden_size
        if not self.is_mla:
            q = self.num_attention_heads * self.layer_head_dim(kind)
            kv = self.layer_kv_heads(kind) * self.layer_head_dim(kind)
            kv_mats = 1 if kind == FULL and self.attention_k_eq_v and not loaded else 2
            return h * q + kv_mats * h * kv + q * h
        heads = self.num_attention_heads
        q_up = (self.q_lora_rank or h) * self.q_dim
        kv_up = self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
        out = heads * self.v_head_dim * h
        return q_up + kv_up + out + self.mla_replicated_params_per_layer()

    def _mlp_params(self, width: int) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden_size * width

    def dense_mlp_params(self) -> int:
        """One dense layer's MLP."""
        return self._mlp_params(self.dense_intermediate_size or self.intermediate_size)

    def shared_expert_params(self) -> int:
        width = self.shared_expert_intermediate_size or \
            self.num_shared_experts * self.moe_intermediate_size
        return self._mlp_params(width) if self.is_moe else 0

    def expert_params(self, active_only: bool = False) -> int:
        """One MoE layer's routed experts (all, or the ones a token uses)."""
        experts = self.num_experts_per_tok if active_only else self.num_experts
        return experts * self._mlp_params(self.moe_intermediate_size) if self.is_moe else 0

    def router_params(self) -> int:
        return self.hidden_size * self.num_experts if self.is_moe else 0

    def mlp_params_per_layer(self, active_only: bool = False) -> int:
        """The MLP of an MoE layer (routed and shared experts, router, Gemma-4's dense MLP
        beside them), or of a dense model's layer."""
        if not self.is_moe:
            return self.dense_mlp_params()
        beside = self.dense_mlp_params() if self.dense_mlp_beside_moe else 0
        return (self.expert_params(active_only) + self.shared_expert_params()
                + self.router_params() + beside)

    def mlp_params(self, active_only: bool = False) -> int:
        """All layers' MLPs: the MoE layers' and the dense ones'."""
        if not self.is_moe:
            return self.num_hidden_layers * self.dense_mlp_params()
        return (self.num_moe_layers * self.mlp_params_per_layer(active_only)
                + self.num_dense_layers * self.dense_mlp_params())

    def embedding_params(self) -> int:
        emb = self.vocab_size * self.hidden_size
        return emb if self.tie_word_embeddings else 2 * emb

    def attention_params(self, loaded: bool = True) -> int:
        """All layers' attention projections (:meth:`attention_params_per_layer`)."""
        return sum(self.attention_params_per_layer(k, loaded) for k in self.layer_kinds())

    def num_params(self, active_only: bool = False) -> int:
        """Total parameters as the checkpoint ships them (norms included, biases ignored, the
        vision tower not), or those one token uses."""
        return (self.attention_params(loaded=False) + 2 * self.hidden_size
                * self.num_hidden_layers + self.mlp_params(active_only)
                + self.embedding_params() + self.hidden_size)

    def rope_caches(self) -> frozenset[tuple[int, int, str]]:
        """The rotary embeddings' cos/sin caches vLLM 0.33 allocates, as (positions, rotary
        width, dtype): ``get_rope`` builds one ``cos_sin_cache`` buffer of
        max_position_embeddings x rotary_dim per distinct rotary embedding (its ``_ROPE_DICT``
        shares it among the layers that use it): the head size (MLA: qk_rope_head_dim; Gemma-4:
        one for the sliding layers' head, one for the full layers'); Llama-4's NoPE layers
        have none. The positions are the config's, whatever ``--max-model-len`` is (Llama-4
        Scout: 10,485,760 x 128 in bf16, 2.5 GiB a rank)."""
        kinds = self.layer_kinds()
        dtype = self.rope_cache_dtype or self.dtype
        return frozenset(
            (self.max_position_embeddings,
             self.qk_rope_head_dim if k == MLA else self.layer_head_dim(k), dtype)
            for k in kinds if not (k == FULL and CHUNKED in kinds))

    def rope_cache_bytes(self, held: frozenset[tuple[int, int, str]] = frozenset()) -> float:
        """Bytes of :meth:`rope_caches` (whole on every rank), but those in ``held``: a
        drafter's rotary embedding that is the target's is the target's buffer."""
        return sum(n * width * DTYPE_BYTES[dtype]
                   for n, width, dtype in self.rope_caches() - held)

    def weight_bytes(self, tp: int = 1,
                     ropes_held: frozenset[tuple[int, int, str]] = frozenset(),
                     data_parallel: int = 1) -> float:
        """Weight bytes one tensor-parallel rank holds: what vLLM 0.33's model classes
        allocate, parameters and buffers (``bench/vllm_weights_reference.py`` builds them).
        Sharded across ranks: the attention projections, the MLPs and experts (split by
        width, or by expert under expert parallelism: the same bytes), the embeddings and
        lm_head (vLLM's VocabParallelEmbedding); the norms too (they are whole on each rank,
        but under 0.01% of the weights). Whole on every rank: an MoE router, MLA's
        down-projections, a vision tower (:attr:`vision_params`) and the rotary embeddings'
        cos/sin caches (:meth:`rope_cache_bytes`, but ``ropes_held``). Each module class's
        linear layers at :meth:`module_weight_bytes`, the rest at :attr:`dtype`.
        ``data_parallel``: attention data-parallel ranks (``--data-parallel-size``); the routed
        experts split over all ``data_parallel x tp`` ranks (expert parallel), the rest as at
        ``tp`` (each rank a copy)."""
        L, b = self.num_hidden_layers, self.dtype_bytes
        mla_rep = self.mla_replicated_params_per_layer()
        attn = self.module_weight_bytes("attention")
        norms = (2 * L + 1) * self.hidden_size  # whole on each rank, counted as shared (tiny)
        sharded = (self.attention_params() - L * mla_rep) * attn \
            + (self.embedding_params() + norms) * b
        if self.is_moe:
            sharded += self.num_moe_layers * (
                self.expert_params() * self.module_weight_bytes("experts") / data_parallel
                + self.shared_expert_params() * self.module_weight_bytes("shared_experts"))
            dense = self.num_dense_layers + (self.num_moe_layers if self.dense_mlp_beside_moe
                                             else 0)
            sharded += dense * self.dense_mlp_params() * self.module_weight_bytes("dense_mlp")
        else:
            sharded += L * self.dense_mlp_params() * self.module_weight_bytes("dense_mlp")
        whole = L * mla_rep * attn + (self.num_moe_layers * self.router_params()
                                      + self.vision_params) * b
        return sharded / tp + whole + self.rope_cache_bytes(ropes_held)

    # ---- KV cache ------------------------------------------------------------------------

    def kv_bytes_per_token_per_layer(self, kind: str, tp: int = 1,
                                     kv_dtype_bytes: float | None = None) -> float:
        """KV-cache bytes one layer of ``kind`` stores per token on one rank (vLLM 0.33
        ``AttentionSpec.page_size_bytes`` / block_size): K and V of the rank's KV heads (split
        across ranks, never below one head), or for MLA one latent of kv_lora_rank +
        qk_rope_head_dim elements, the same on every rank (``MLAAttentionSpec``,
        num_kv_heads 1)."""
        b = self.dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
        if kind == MLA:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * b
        kv_heads = max(1, math.ceil(self.layer_kv_heads(kind) / tp))
        return kv_heads * self.layer_head_dim(kind) * 2 * b

    def kv_bytes_per_token(self, tp: int = 1, kv_dtype_bytes: float | None = None) -> float:
        """KV-cache bytes per token on one rank, every layer holding every token (for a model
        with windowed layers, an upper bound: see ``sim.engine.memory.kv_cache_layout``)."""
        return sum(self.kv_bytes_per_token_per_layer(k, tp, kv_dtype_bytes)
                   for k in self.layer_kinds())

    def with_overrides(self, **kw: Any) -> ModelConfig:
        return replace(self, **kw)


def from_hf_config(cfg: dict[str, Any], name: str | None = None) -> ModelConfig:
    """Build a :class:`ModelConfig` from a Hugging Face ``config.json`` mapping, as vLLM 0.33's
    model files read it (``deepseek_v2.py``, ``gpt_oss.py``, ``llama4.py``, ``qwen3_moe.py``).

    Raises :class:`SpecError` naming the missing or invalid field, or the layer kind the
    simulator does not model (linear attention, Mamba, sparse MLA indexers, Gemma-4's
    per-kind head sizes): those are refused, never sized as full attention.
    """
    outer = cfg
    if "text_config" in cfg and "hidden_size" not in cfg:  # multimodal wrappers
        inner = cfg["text_config"] if isinstance(cfg["text_config"], dict) else {}
        cfg = {**inner, "torch_dtype": inner.get("torch_dtype") or inner.get("dtype")
               or cfg.get("torch_dtype") or cfg.get("dtype"),
               "quantization_config": inner.get("quantization_config")
               or cfg.get("quantization_config"),
               "_name_or_path": inner.get("_name_or_path") or cfg.get("_name_or_path")}
    label = name or cfg.get("_name_or_path") or cfg.get("model_type") or "custom"
    family = str(outer.get("model_type") or cfg.get("model_type") or label)
    problems: list[tuple[str, str]] = []

    def need(key: str, *alts: str) -> int:
        for k in (key, *alts):
            if k in cfg and cfg[k] is not None:
                v = cfg[k]
                if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                    problems.append((k, f"must be a positive integer (got {v!r})"))
                    return 1
                return v
        problems.append((key, "is missing from the model config"))
        return 1

    def count(key: str, *alts: str) -> int:
        """An optional non-negative integer field (0 when absent)."""
        for k in (key, *alts):
            v = cfg.get(k)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                problems.append((k, f"must be a non-negative integer (got {v!r})"))
                return 0
            return v
        return 0

    hidden = need("hidden_size", "d_model", "n_embd")
    layers = need("num_hidden_layers", "n_layer", "num_layers")
    heads = need("num_attention_heads", "n_head")
    kv_heads = count("num_key_value_heads") or heads
    head_dim = count("head_dim") or (hidden // heads if heads else 0)
    inter = count("intermediate_size", "ffn_dim") or 4 * hidden
    vocab = need("vocab_size")
    max_pos = count("max_position_embeddings", "max_sequence_length") or 4096
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    if dtype not in DTYPE_BYTES:
        problems.append(("torch_dtype", f"unknown dtype {dtype!r}; one of {sorted(DTYPE_BYTES)}"))
        dtype = "bfloat16"
    num_experts = count("num_local_experts", "num_experts", "n_routed_experts")
    moe_inter = count("moe_intermediate_size") or (int(inter) if num_experts else 0)
    kv_lora = count("kv_lora_rank")
    kinds = _layer_kinds(cfg, family, layers, kv_lora > 0, problems)
    window = count("sliding_window") if SLIDING in kinds else 0
    chunk = count("attention_chunk_size") if CHUNKED in kinds else 0
    placement = {k: count(k) for k in ("first_k_dense_replace", "moe_layer_freq",
                                       "interleave_moe_layer_step", "decoder_sparse_step")}
    only = cfg.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) for i in only):
        problems.append(("mlp_only_layers", "must be a list of layer indexes"))
        only = []
    dense_layers = _num_dense_layers(placement, only, layers) if num_experts else 0
    top_k = count("num_experts_per_tok", "experts_per_token", "top_k_experts")
    n_shared = count("n_shared_experts", "num_shared_experts")
    dense_width = count("intermediate_size_mlp")
    quant = read_quantization(cfg.get("quantization_config"), problems, layers)
    gemma4 = _gemma4_fields(outer, cfg, family, problems)
    # vLLM 0.33 gpt_oss.py: get_rope(..., dtype=torch.float32)
    rope_dtype = "float32" if cfg.get("model_type") == "gpt_oss" else ""
    if problems:
        raise SpecError([(f"model config {label}: {p}", m) for p, m in problems])
    shared_width = count("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size")
    if num_experts and str(cfg.get("model_type")) == "llama4_text":
        shared_width = int(inter)  # Llama4MoE: one shared expert as wide as a routed one
    return ModelConfig(
        name=label,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=int(kv_heads),
        head_dim=int(head_dim),
        intermediate_size=int(inter),
        vocab_size=vocab,
        max_position_embeddings=int(max_pos),
        dtype=dtype,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        gated_mlp=_is_gated(cfg),
        num_experts=num_experts,
        num_experts_per_tok=top_k or (2 if num_experts else 0),
        moe_intermediate_size=moe_inter,
        num_shared_experts=n_shared,
        hf_name=str(cfg.get("_name_or_path") or ""),
        quantization=quant.method,
        weight_dtype=quant.weight_dtype,
        kv_cache_dtype=quant.kv_cache_dtype,
        layer_types=kinds,
        sliding_window=window,
        attention_chunk_size=chunk,
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=count("qk_rope_head_dim") if kv_lora else 0,
        qk_nope_head_dim=count("qk_nope_head_dim") if kv_lora else 0,
        v_head_dim=count("v_head_dim") if kv_lora else 0,
        q_lora_rank=count("q_lora_rank") if kv_lora else 0,
        num_dense_layers=dense_layers,
        dense_intermediate_size=dense_width,
        shared_expert_intermediate_size=shared_width,
        unquantized=quant.unquantized,
        rope_cache_dtype=rope_dtype,
        attention_sinks=cfg.get("model_type") == "gpt_oss",
        qk_norm_allreduce=family == "minimax_m2" and bool(cfg.get("use_qk_norm", True)),
        **gemma4,
    )


def _gemma4_fields(outer: dict[str, Any], cfg: dict[str, Any], family: str,
                   problems: list[tuple[str, str]]) -> dict[str, Any]:
    """Gemma-4's fields as vLLM 0.33 gemma4.py / gemma4_mm.py build the model: the full
    layers' head size and KV heads (``per_layer_config``), K-only full layers
    (``attention_k_eq_v``), the dense MLP beside the experts (``Gemma4DecoderLayer``: ``mlp``
    always, ``experts`` when ``num_experts`` is set) and the vision tower
    ``Gemma4ForConditionalGeneration`` loads. KV-shared layers, per-layer input embeddings and
    an audio tower (Gemma-4 E2B/E4B) are refused by name."""
    if not (cfg.get("global_head_dim") or cfg.get("num_global_key_value_heads")
            or str(cfg.get("model_type")).startswith("gemma4")):
        return {}
    for key, what in (("num_kv_shared_layers", "KV-shared layers"),
                      ("hidden_size_per_layer_input", "per-layer input embeddings")):
        v = cfg.get(key)
        if v not in (None, 0):
            problems.append((key, f"{what} ({family}) are not modelled"))
    if isinstance(outer.get("audio_config"), dict):
        problems.append(("audio_config", f"the audio tower ({family}) is not modelled"))
    out: dict[str, Any] = {"attention_k_eq_v": cfg.get("attention_k_eq_v") is True,
                           "dense_mlp_beside_moe": bool(cfg.get("num_experts"))}
    for key in ("global_head_dim", "num_global_key_value_heads"):
        v = cfg.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
            problems.append((key, f"must be a positive integer (got {v!r})"))
        elif v is not None:
            out[key] = v
    vision = outer.get("vision_config")
    if isinstance(vision, dict):
        out["vision_params"] = _vision_tower_params(vision, cfg, problems)
    return out


def _vision_tower_params(v: dict[str, Any], text: dict[str, Any],
                         problems: list[tuple[str, str]]) -> int:
    """Gemma-4's vision tower and its projection into the text model (vLLM 0.33
    gemma4_mm.py: ``vision_tower``, ``embed_vision.embedding_projection``): a patch embedding
    and its two position tables of ``position_embedding_size`` rows, ``num_hidden_layers``
    encoder layers (q/k/v/o projections, a gated MLP, four norms)."""
    vals = {}
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim",
                "intermediate_size", "patch_size"):
        x = v.get(key)
        if isinstance(x, bool) or not isinstance(x, int) or x <= 0:
            problems.append((f"vision_config.{key}", f"must be a positive integer (got {x!r})"))
            return 0
        vals[key] = x
    h, heads = vals["hidden_size"], vals["num_attention_heads"] * vals["head_dim"]
    layer = 4 * h * heads + 3 * h * vals["intermediate_size"] + 4 * h
    pos = v.get("position_embedding_size")
    patch = 3 * vals["patch_size"] ** 2 * h + 2 * (pos if isinstance(pos, int) else 0) * h
    proj = h * int(text.get("hidden_size") or 0)
    return vals["num_hidden_layers"] * layer + patch + proj


#: Layer kinds vLLM runs that the simulator does not model, by the config field naming them.
_UNMODELLED_KINDS = {
    "linear_attention": "linear_attention layers ({family}) are not modelled (their "
                        "fixed-size state is no KV cache)",
    "mamba": "mamba layers ({family}) are not modelled (their fixed-size state is no KV "
             "cache)",
}


def _layer_kinds(cfg: dict[str, Any], family: str, layers: int, mla: bool,
                 problems: list[tuple[str, str]]) -> tuple[str, ...]:
    """Each layer's attention kind as vLLM 0.33 builds it, or () for all full attention;
    appends to ``problems`` a kind the simulator does not model."""
    if cfg.get("hybrid_override_pattern") is not None:
        problems.append(("hybrid_override_pattern",
                         _UNMODELLED_KINDS["mamba"].format(family=family)))
        return ()
    if mla:
        if cfg.get("index_topk") or cfg.get("index_head_dim"):
            problems.append(("index_topk", f"MLA with a sparse indexer ({family}, DSA) is not "
                             "modelled (its indexer keeps a second cache)"))
            return ()
        return (MLA,) * layers
    if (cfg.get("global_head_dim") or cfg.get("num_global_key_value_heads")) \
            and not isinstance(cfg.get("layer_types"), list):
        problems.append(("global_head_dim", f"full-attention layers with their own head size "
                         f"({family}) need layer_types naming them"))
        return ()
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            problems.append(("layer_types", f"must list one kind per layer ({layers})"))
            return ()
        if not all(isinstance(t, str) for t in types):
            problems.append(("layer_types", "must list one kind name (a string) per layer"))
            return ()
        known = {FULL: FULL, SLIDING: SLIDING, "chunked_attention": CHUNKED}
        for t in dict.fromkeys(types):
            if t not in known:
                msg = _UNMODELLED_KINDS.get(str(t), f"{t!r} layers ({family}) are not "
                                            "modelled")
                problems.append(("layer_types", msg.format(family=family)))
        if SLIDING in types and not cfg.get("sliding_window"):
            problems.append(("sliding_window", "is missing for the sliding_attention layers"))
        return tuple(known.get(t, FULL) for t in types)
    if cfg.get("attention_chunk_size"):  # Llama-4: RoPE layers attend within their chunk
        nope = cfg.get("no_rope_layers")
        if not isinstance(nope, list) or len(nope) != layers:
            every = cfg.get("no_rope_layer_interval")  # HF Llama4TextConfig: 4
            every = every if isinstance(every, int) and every > 0 else 4
            nope = [int((i + 1) % every != 0) for i in range(layers)]
        return tuple(FULL if n == 0 else CHUNKED for n in nope)
    if cfg.get("sliding_window") and cfg.get("use_sliding_window", True) is True:
        return (SLIDING,) * layers
    return ()


def _num_dense_layers(placement: dict[str, int], mlp_only: list[int], layers: int) -> int:
    """Layers of an MoE model that keep a dense MLP, as vLLM 0.33's model files place the
    experts: DeepSeek ``first_k_dense_replace`` / ``moe_layer_freq``, Llama-4
    ``interleave_moe_layer_step``, Qwen-MoE ``decoder_sparse_step`` / ``mlp_only_layers``."""
    first = placement["first_k_dense_replace"]
    freq = placement["moe_layer_freq"] or 1
    step = placement["interleave_moe_layer_step"] or placement["decoder_sparse_step"] or 1
    only = set(mlp_only)
    moe = sum(1 for i in range(layers)
              if i >= first and i % freq == 0 and (i + 1) % step == 0 and i not in only)
    return layers - moe


#: Quantization methods modelled (vLLM's names) and what their checkpoints store.
MODELLED_QUANTIZATION = ("fp8", "modelopt", "compressed-tensors", "mxfp4")


@dataclass(frozen=True)
class Quantization:
    """A checkpoint's quantization as vLLM reads it: the method, the quantized linear layers'
    storage type, what ``--kv-cache-dtype auto`` means, and the module classes left out."""

    method: str = ""
    weight_dtype: str = ""
    kv_cache_dtype: str = "auto"
    unquantized: tuple[tuple[str, float], ...] = ()


def _modelopt_kv_fp8(inner: dict[str, Any], qc: dict[str, Any]) -> bool:
    """Whether a ModelOpt checkpoint quantizes its KV cache to FP8, as vLLM (0.15-0.33,
    ``get_kv_cache_quant_algo_string``) reads it: ``kv_cache_scheme`` first (a mapping:
    static 8-bit float, as NVIDIA's Kimi-K2.5-NVFP4 config.json writes it), then
    ``kv_cache_quant_algo`` (``"FP8"``, hf_quant_config.json's form)."""
    algo = inner.get("kv_cache_scheme") or qc.get("kv_cache_scheme") \
        or inner.get("kv_cache_quant_algo") or qc.get("kv_cache_quant_algo")
    if isinstance(algo, dict):
        return algo.get("dynamic") is False and algo.get("num_bits") == 8 \
            and algo.get("type") == "float"
    return str(algo or "").upper() == "FP8"


def read_quantization(qc: Any, problems: list[tuple[str, str]],
                      num_layers: int = 1) -> Quantization:
    """A checkpoint's ``quantization_config`` as vLLM 0.33 reads it (no quantization
    without one). Appends to ``problems`` what the simulator does not model. FP8
    (``fp8``, ModelOpt FP8, compressed-tensors 8-bit float), NVFP4 (ModelOpt), INT4 W4A16
    (compressed-tensors ``pack-quantized`` groups) and MXFP4 (gpt-oss: vLLM's Mxfp4Config
    quantizes only the experts) are modelled; ``modules_to_not_convert`` / ``ignore`` /
    ``exclude_modules`` leave their module classes at the model's dtype."""
    field = "quantization_config"
    if qc is None:
        return Quantization()
    if not isinstance(qc, dict) or not isinstance(qc.get("quant_method"), str):
        problems.append((field, "must be a mapping with quant_method (as in config.json)"))
        return Quantization()
    method = qc["quant_method"]
    kv = "auto"
    if method == "fp8":  # Fp8Config: a serialized FP8 checkpoint (per tensor or 128x128 blocks)
        wd, excluded = "fp8", qc.get("modules_to_not_convert")
    elif method == "mxfp4":  # Mxfp4Config: FusedMoE layers only; every Linear stays unquantized
        return Quantization(method, "mxfp4", kv, tuple(
            (c, 1.0) for c in MODULE_CLASSES if c != "experts"))
    elif method.startswith("modelopt"):  # ModelOpt: the algorithms under "quantization" or flat
        nested = qc.get("quantization")
        inner: dict[str, Any] = nested if isinstance(nested, dict) else qc
        algo = str(inner.get("quant_algo") or "").upper()
        if algo not in ("FP8", "NVFP4"):
            problems.append((f"{field}.quant_algo", f"ModelOpt {algo or 'without quant_algo'} "
                             "is not modelled (FP8 and NVFP4 are)"))
            return Quantization()
        method, wd, excluded = "modelopt", algo.lower(), inner.get("exclude_modules") \
            or qc.get("exclude_modules") or qc.get("ignore")
        kv = "fp8_e4m3" if _modelopt_kv_fp8(inner, qc) else "auto"
    elif method == "compressed-tensors":
        groups = qc.get("config_groups")
        weights = [g.get("weights") for g in groups.values() if isinstance(g, dict)] \
            if isinstance(groups, dict) else []
        kinds = {_compressed_tensors_dtype(w) if isinstance(w, dict) else None
                 for w in weights}
        if len(kinds) != 1 or None in kinds:
            problems.append((f"{field}.config_groups", "compressed-tensors weights other than "
                             "8-bit float, 4-bit float (NVFP4) or 4-bit int groups are not "
                             "modelled"))
            return Quantization()
        wd, excluded = str(kinds.pop()), qc.get("ignore")
    else:
        problems.append((f"{field}.quant_method", f"{method!r} is not modelled; the simulator "
                         f"models {', '.join(MODELLED_QUANTIZATION)} checkpoints"))
        return Quantization()
    return Quantization(method, wd, kv, _unquantized_shares(excluded, num_layers))


def _compressed_tensors_dtype(w: dict[str, Any]) -> str | None:
    bits, kind, group = w.get("num_bits"), w.get("type"), w.get("group_size")
    if bits == 8 and kind == "float":
        return "fp8"
    if bits == 4 and kind == "float" and group == 16:
        return "nvfp4"
    if bits == 4 and kind == "int" and f"int4_g{group}" in DTYPE_BYTES:
        return f"int4_g{group}"
    return None


def _module_class(pattern: str) -> str | None:
    """The module class (:data:`MODULE_CLASSES`) a checkpoint's exclusion pattern names, or
    None for modules that are never quantized anyway (lm_head, embeddings, norms, router)."""
    p = pattern.lower()
    if "norm" in p or p.endswith((".gate", ".router", "e_score_correction_bias")):
        return None
    if "shared_expert" in p:
        return "shared_experts"
    if "attn" in p or "attention" in p:
        return "attention"
    if "expert" in p:
        return "experts"
    if "mlp" in p and "proj" in p:
        return "dense_mlp"
    return None


def _unquantized_shares(patterns: Any, num_layers: int) -> tuple[tuple[str, float], ...]:
    """Share of the layers whose module class each pattern leaves unquantized: a pattern
    naming one layer (``model.layers.7.self_attn``) counts that layer, any other (``*``,
    ``re:``) all of them."""
    if not isinstance(patterns, list):
        return ()
    layers: dict[str, set[int]] = {}
    everywhere: set[str] = set()
    for pat in patterns:
        cls = _module_class(str(pat))
        if cls is None:
            continue
        m = re.search(r"layers\.(\d+)\.", str(pat))
        if m and not str(pat).startswith("re:"):
            layers.setdefault(cls, set()).add(int(m.group(1)))
        else:
            everywhere.add(cls)
    out = {c: 1.0 for c in everywhere}
    for c, idx in layers.items():
        out.setdefault(c, min(1.0, len(idx) / max(num_layers, 1)))
    return tuple(sorted(out.items()))


_GATED_ACTS = {"silu", "swish", "swiglu", "geglu"}
_GATED_TYPES = {"gemma", "gemma2", "gemma3", "gemma3_text", "gemma4", "gemma4_text"}


def _is_gated(cfg: dict[str, Any]) -> bool:
    """Llama-style MLPs (gate, up, down) use SiLU; GPT-style two-matrix MLPs use GELU/ReLU."""
    act = str(cfg.get("hidden_act") or cfg.get("activation_function") or "silu")
    return act in _GATED_ACTS or cfg.get("model_type") in _GATED_TYPES


def _dense(hf: str, h: int, n_l: int, n_h: int, n_kv: int, inter: int, vocab: int, pos: int,
           **kw: Any) -> dict[str, Any]:
    return {
        "_name_or_path": hf, "hidden_size": h, "num_hidden_layers": n_l,
        "num_attention_heads": n_h, "num_key_value_heads": n_kv, "intermediate_size": inter,
        "vocab_size": vocab, "max_position_embeddings": pos, "torch_dtype": "bfloat16", **kw,
    }


#: The shipped catalog: the ``config.json`` fields of common models (values from each model's
#: Hugging Face config). Keys are the short names the CLI and manifests accept.
CATALOG_HF: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": _dense("meta-llama/Llama-3.1-8B-Instruct", 4096, 32, 32, 8, 14336, 128256,
                           131072),
    "llama-3.1-70b": _dense("meta-llama/Llama-3.1-70B-Instruct", 8192, 80, 64, 8, 28672,
                            128256, 131072),
    "llama-3-8b": _dense("meta-llama/Meta-Llama-3-8B", 4096, 32, 32, 8, 14336, 128256, 8192),
    "llama-3-70b": _dense("meta-llama/Meta-Llama-3-70B", 8192, 80, 64, 8, 28672, 128256, 8192),
    "llama-2-7b": _dense("meta-llama/Llama-2-7b-hf", 4096, 32, 32, 32, 11008, 32000, 4096),
    "llama-2-70b": _dense("meta-llama/Llama-2-70b-hf", 8192, 80, 64, 8, 28672, 32000, 4096),
    "codellama-34b": _dense("codellama/CodeLlama-34b-Instruct-hf", 8192, 48, 64, 8, 22016,
                            32000, 16384),
    "mistral-7b": _dense("mistralai/Mistral-7B-Instruct-v0.3", 4096, 32, 32, 8, 14336, 32768,
                         32768),
    "qwen2.5-7b": _dense("Qwen/Qwen2.5-7B-Instruct", 3584, 28, 28, 4, 18944, 152064, 32768),
    "qwen2.5-32b": _dense("Qwen/Qwen2.5-32B-Instruct", 5120, 64, 40, 8, 27648, 152064, 32768),
    "yi-34b": _dense("01-ai/Yi-34B", 7168, 60, 56, 8, 20480, 64000, 4096),
    "mixtral-8x7b": _dense("mistralai/Mixtral-8x7B-Instruct-v0.1", 4096, 32, 32, 8, 14336,
                           32000, 32768, num_local_experts=8, num_experts_per_tok=2),
    "qwen3-8b": _dense("Qwen/Qwen3-8B", 4096, 36, 32, 8, 12288, 151936, 40960, head_dim=128),
    "qwen3-14b": _dense("Qwen/Qwen3-14B", 5120, 40, 40, 8, 17408, 151936, 40960, head_dim=128),
    "qwen3-32b": _dense("Qwen/Qwen3-32B", 5120, 64, 64, 8, 25600, 151936, 40960, head_dim=128),
    "qwen3-30b-a3b": _dense("Qwen/Qwen3-30B-A3B", 2048, 48, 32, 4, 6144, 151936, 40960,
                            head_dim=128, num_experts=128, num_experts_per_tok=8,
                            moe_intermediate_size=768),
    # FP8 checkpoints: the base model's shape with its quantization_config. NVIDIA's ModelOpt
    # export (hf_quant_config.json, which vLLM merges in) also quantizes the KV cache, so
    # --kv-cache-dtype auto runs it in FP8; RedHatAI's compressed-tensors and Qwen's block-FP8
    # checkpoints carry no KV directive (auto: bf16).
    "llama-3.1-8b-fp8": _dense("nvidia/Llama-3.1-8B-Instruct-FP8", 4096, 32, 32, 8, 14336,
                               128256, 131072, quantization_config={
                                   "quant_method": "modelopt", "quant_algo": "FP8",
                                   "kv_cache_quant_algo": "FP8",
                                   "exclude_modules": ["lm_head"]}),
    "llama-3.1-70b-fp8": _dense("RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8", 8192, 80, 64, 8,
                                28672, 128256, 131072, quantization_config={
                                    "quant_method": "compressed-tensors",
                                    "format": "float-quantized", "ignore": ["lm_head"],
                                    "config_groups": {"group_0": {
                                        "targets": ["Linear"],
                                        "weights": {"num_bits": 8, "type": "float",
                                                    "strategy": "channel"},
                                        "input_activations": {"num_bits": 8, "type": "float",
                                                              "dynamic": True}}}}),
    # NVIDIA's NVFP4 export of Llama-3.3-70B (Llama-3.1-70B's shape; InferenceX's B200 FP4
    # runs): its hf_quant_config.json, which vLLM merges in as a ModelOpt config, quantizes
    # every linear layer but the lm_head to NVFP4 (W4A4, an FP8 scale per 16 weights) and the
    # KV cache to FP8
    "llama-3.3-70b-fp4": _dense("nvidia/Llama-3.3-70B-Instruct-FP4", 8192, 80, 64, 8, 28672,
                                128256, 131072, quantization_config={
                                    "quant_method": "modelopt",
                                    "producer": {"name": "modelopt"},
                                    "quantization": {"quant_algo": "NVFP4",
                                                     "kv_cache_quant_algo": "FP8",
                                                     "group_size": 16,
                                                     "exclude_modules": ["lm_head"]}}),
    "qwen3-32b-fp8": _dense("Qwen/Qwen3-32B-FP8", 5120, 64, 64, 8, 25600, 151936, 40960,
                            head_dim=128, quantization_config={
                                "quant_method": "fp8", "fmt": "e4m3",
                                "activation_scheme": "dynamic",
                                "weight_block_size": [128, 128]}),
    # The models served most at the end of 2026 (issue 32): each entry the fields of the
    # model's own config.json that the simulator reads (tests/core/test_models.py checks them
    # against the real files). DeepSeek-V3/R1 and Kimi-K2.5: MLA + MoE with a shared expert
    # and dense first layers; gpt-oss: MXFP4 experts, sliding-window layers on the even
    # ones; Llama-4 Scout: chunked local attention but every 4th layer (Llama4 no_rope_layers).
    **{key: {"_name_or_path": hf, "model_type": "deepseek_v3", "hidden_size": 7168,
             "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
             "intermediate_size": 18432, "vocab_size": 129280,
             "max_position_embeddings": 163840, "torch_dtype": "bfloat16",
             "hidden_act": "silu", "kv_lora_rank": 512, "q_lora_rank": 1536,
             "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
             "n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
             "n_shared_experts": 1, "first_k_dense_replace": 3, "moe_layer_freq": 1,
             "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                     "activation_scheme": "dynamic",
                                     "weight_block_size": [128, 128]}}
       for key, hf in (("deepseek-v3", "deepseek-ai/DeepSeek-V3"),
                       ("deepseek-r1", "deepseek-ai/DeepSeek-R1"))},
    "kimi-k2.5": {
        "_name_or_path": "moonshotai/Kimi-K2.5", "model_type": "kimi_k2", "hidden_size": 7168,
        "num_hidden_layers": 61, "num_attention_heads": 64, "num_key_value_heads": 64,
        "intermediate_size": 18432, "vocab_size": 163840, "max_position_embeddings": 262144,
        "torch_dtype": "bfloat16", "hidden_act": "silu", "kv_lora_rank": 512,
        "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
        "v_head_dim": 128, "n_routed_experts": 384, "num_experts_per_tok": 8,
        "moe_intermediate_size": 2048, "n_shared_experts": 1, "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "quantization_config": {
            "quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {
                "targets": ["Linear"], "input_activations": None,
                "weights": {"num_bits": 4, "type": "int", "group_size": 32,
                            "strategy": "group", "symmetric": True}}},
            "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                       "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]}},
    **{key: {"_name_or_path": f"openai/{key}", "model_type": "gpt_oss", "hidden_size": 2880,
             "num_hidden_layers": layers, "num_attention_heads": 64, "num_key_value_heads": 8,
             "head_dim": 64, "intermediate_size": 2880, "vocab_size": 201088,
             "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
             "hidden_act": "silu", "num_local_experts": experts, "num_experts_per_tok": 4,
             "sliding_window": 128,
             "layer_types": ["sliding_attention", "full_attention"] * (layers // 2),
             "quantization_config": {
                 "quant_method": "mxfp4",
                 "modules_to_not_convert": ["model.layers.*.self_attn",
                                            "model.layers.*.mlp.router",
                                            "model.embed_tokens", "lm_head"]}}
       for key, layers, experts in (("gpt-oss-20b", 24, 32), ("gpt-oss-120b", 36, 128))},
    **{key: _dense(hf, 4096, 94, 64, 4, 12288, 151936, 40960, head_dim=128,
                   model_type="qwen3_moe", num_experts=128, num_experts_per_tok=8,
                   moe_intermediate_size=1536, decoder_sparse_step=1, mlp_only_layers=[],
                   **qc)
       for key, hf, qc in (
           ("qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B", {}),
           ("qwen3-235b-a22b-fp8", "Qwen/Qwen3-235B-A22B-FP8", {"quantization_config": {
               "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
               "weight_block_size": [128, 128],
               "modules_to_not_convert": ["lm_head", "model.layers.*.input_layernorm",
                                          "model.layers.*.post_attention_layernorm",
                                          "model.layers.*.mlp.gate"]}}))},
    # GLM-4.5-Air and GLM-4.6 (Glm4MoeForCausalLM): grouped-query attention (96 query heads
    # over 8 KV heads of 128, wider than the hidden size), MoE with one shared expert and
    # dense first layers; the MTP layer (num_nextn_predict_layers) vLLM loads only for
    # speculative decoding. GLM-4.6 has GLM-4.7's shape (bench/data/e2e/model-configs).
    **{key: {"_name_or_path": hf, "model_type": "glm4_moe", "hidden_size": hidden,
             "num_hidden_layers": layers, "num_attention_heads": 96, "num_key_value_heads": 8,
             "head_dim": 128, "intermediate_size": dense, "vocab_size": 151552,
             "max_position_embeddings": positions, "torch_dtype": "bfloat16",
             "hidden_act": "silu", "n_routed_experts": experts, "num_experts_per_tok": 8,
             "moe_intermediate_size": width, "n_shared_experts": 1,
             "first_k_dense_replace": first_dense, "tie_word_embeddings": False}
       for key, hf, hidden, layers, dense, positions, experts, width, first_dense in (
           ("glm-4.5-air", "zai-org/GLM-4.5-Air", 4096, 46, 10944, 131072, 128, 1408, 1),
           ("glm-4.6", "zai-org/GLM-4.6", 5120, 92, 12288, 202752, 160, 1536, 3))},
    "minimax-m2.5": _dense("MiniMaxAI/MiniMax-M2.5", 3072, 62, 48, 8, 1536, 200064, 196608,
                           head_dim=128, model_type="minimax_m2", num_local_experts=256,
                           num_experts_per_tok=8, quantization_config={
                               "quant_method": "fp8", "fmt": "float8_e4m3fn",
                               "activation_scheme": "dynamic",
                               "weight_block_size": [128, 128],
                               "modules_to_not_convert": ["gate", "e_score_correction_bias",
                                                          "lm_head"]}),
    "llama-4-scout": _dense("meta-llama/Llama-4-Scout-17B-16E-Instruct", 5120, 48, 40, 8,
                            8192, 202048, 10485760, head_dim=128, model_type="llama4_text",
                            num_local_experts=16, num_experts_per_tok=1,
                            interleave_moe_layer_step=1, intermediate_size_mlp=16384,
                            attention_chunk_size=8192),
    # Gemma-4-26B-A4B as its config.json wraps it (Gemma4ForConditionalGeneration): the text
    # model's fields vLLM 0.33 gemma4.py reads, and the vision tower gemma4_mm.py loads
    "gemma-4-26b-a4b": {
        "_name_or_path": "google/gemma-4-26B-A4B", "model_type": "gemma4",
        "tie_word_embeddings": True,
        "text_config": {
            "model_type": "gemma4_text", "hidden_size": 2816, "num_hidden_layers": 30,
            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
            "global_head_dim": 512, "num_global_key_value_heads": 2,
            "attention_k_eq_v": True, "intermediate_size": 2112, "num_experts": 128,
            "top_k_experts": 8, "moe_intermediate_size": 704, "vocab_size": 262144,
            "max_position_embeddings": 262144, "dtype": "bfloat16", "sliding_window": 1024,
            "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
            "num_kv_shared_layers": 0, "hidden_size_per_layer_input": 0,
            "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 5},
        "vision_config": {"hidden_size": 1152, "num_hidden_layers": 27,
                          "num_attention_heads": 16, "head_dim": 72,
                          "intermediate_size": 4304, "patch_size": 16,
                          "position_embedding_size": 10240}},
}

_ALIASES = {v["_name_or_path"].lower(): k for k, v in CATALOG_HF.items()}
_ALIASES.update({v["_name_or_path"].split("/")[-1].lower(): k for k, v in CATALOG_HF.items()})
_ALIASES.update({
    "meta-llama/llama-3.1-8b": "llama-3.1-8b",
    "meta-llama/meta-llama-3.1-8b-instruct": "llama-3.1-8b",
    "meta-llama/llama-3.1-70b": "llama-3.1-70b",
    "mistralai/mistral-7b-v0.1": "mistral-7b",
    "mistralai/mistral-7b-instruct-v0.2": "mistral-7b",
    "qwen/qwen2.5-7b": "qwen2.5-7b",
    "qwen/qwen2.5-32b": "qwen2.5-32b",
    "meta-llama/llama-2-7b-chat-hf": "llama-2-7b",
    "meta-llama/llama-2-70b-chat-hf": "llama-2-70b",
    "codellama/codellama-34b-hf": "codellama-34b",
    "neuralmagic/meta-llama-3.1-70b-instruct-fp8": "llama-3.1-70b-fp8",  # renamed RedHatAI
    "llama-4-scout-17b-16e": "llama-4-scout",
    "meta-llama/llama-4-scout-17b-16e": "llama-4-scout",
})


def _with_hf_quant_config(cfg: dict[str, Any], path: Path) -> dict[str, Any]:
    """``cfg`` with the ModelOpt ``hf_quant_config.json`` next to it (``hf_quant_config.json``
    in the model's directory, or ``NAME_hf_quant_config.json`` beside ``NAME_config.json``)
    as its ``quantization_config``, as vLLM merges it in; ``cfg`` itself without one."""
    stem = path.name.removesuffix("config.json")
    for q in (path.with_name(stem + "hf_quant_config.json"),
              path.with_name("hf_quant_config.json")):
        if q != path and q.is_file():
            text = infile.read_text(q, field="--model-config", max_bytes=MAX_CONFIG_BYTES,
                                    name=f"quantization config file {q}")
            qc = infile.json_value(text, where=str(q), field="--model-config", constants=True)
            if isinstance(qc, dict):
                return {**cfg, "quantization_config": {"quant_method": "modelopt", **qc}}
    return cfg


def _is_quant_config(cfg: dict[str, Any]) -> bool:
    """Whether ``cfg`` is a ModelOpt ``hf_quant_config.json`` (a ``quantization`` section
    with its ``producer`` or its ``quant_algo``: Nemotron-3-Super's has no producer) rather
    than a model's ``config.json``."""
    quant = cfg.get("quantization")
    return (isinstance(quant, dict) and "hidden_size" not in cfg and "text_config" not in cfg
            and ("producer" in cfg or "quant_algo" in quant))


def catalog_names() -> list[str]:
    return sorted(CATALOG_HF)


def catalog_key(name: str) -> str:
    """The catalog's key for a catalog name or a catalogued Hugging Face repo id (or name
    itself, lower-cased, when the catalog does not know it)."""
    key = name.strip().lower()
    return key if key in CATALOG_HF else _ALIASES.get(key, key)


def resolve_model(name: str | None = None, config_path: str | Path | None = None,
                  field: str = "--model") -> ModelConfig:
    """The model for a catalog name, a Hugging Face repo id of a catalog model, or a
    ``config.json`` path. Raises :class:`SpecError` naming ``field`` and the choices."""
    if config_path is not None:
        p = Path(config_path)
        if p.is_dir():  # a model directory, as vLLM takes it
            p = p / "config.json"
        text = infile.read_text(p, field="--model-config", max_bytes=MAX_CONFIG_BYTES,
                                name=f"model config file {p}")
        cfg = infile.json_value(text, where=str(p), field="--model-config", constants=True)
        if not isinstance(cfg, dict):
            raise SpecError(f"{p} is not a model config (a JSON object such as a Hugging Face "
                            "config.json)", field="--model-config")
        if _is_quant_config(cfg):
            raise SpecError(f"{p} is a quantization config (ModelOpt's hf_quant_config.json), "
                            "not a model config: give the model's config.json (or its "
                            "directory); the hf_quant_config.json beside it is read with it",
                            field="--model-config")
        if "quantization_config" not in cfg:
            cfg = _with_hf_quant_config(cfg, p)
        label = p.parent.name if p.name == "config.json" else p.stem.removesuffix("_config")
        return from_hf_config(cfg, name=name or label or p.stem)
    if not name:
        raise SpecError("a model is required: a catalog name or --model-config PATH", field=field)
    key = catalog_key(name)
    if key not in CATALOG_HF:
        raise SpecError(
            f"unknown model {name!r}; use one of {', '.join(catalog_names())}, "
            "or give the model's config.json with --model-config PATH",
            field=field,
        )
    return from_hf_config(CATALOG_HF[key], name=key)
