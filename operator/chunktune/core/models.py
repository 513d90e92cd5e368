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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from chunktune.core import infile
from chunktune.core.errors import SpecError

#: The largest model config file (a Hugging Face ``config.json``) read.
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
}


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
    #: ``compressed-tensors``), or of ``--quantization``'s (:meth:`quantized`); "" for none.
    quantization: str = ""
    #: Storage type of the linear layers' weights ("" = :attr:`dtype`).
    weight_dtype: str = ""
    #: What ``--kv-cache-dtype auto`` resolves to for this checkpoint (``auto``: the model's
    #: dtype; ``fp8_e4m3`` for a ModelOpt checkpoint with ``kv_cache_quant_algo`` FP8).
    kv_cache_dtype: str = "auto"

    # ---- derived quantities -------------------------------------------------------------

    @property
    def dtype_bytes(self) -> float:
        """Bytes per element of the activations, embeddings and norms (the model's dtype)."""
        return DTYPE_BYTES[self.dtype]

    @property
    def weight_dtype_bytes(self) -> float:
        """Bytes per weight of the linear layers (1 for FP8 ones)."""
        return DTYPE_BYTES[self.weight_dtype or self.dtype]

    def quantized(self, method: str, weight_dtype: str) -> ModelConfig:
        """This model with its linear layers quantized online (``--quantization``)."""
        return replace(self, quantization=method, weight_dtype=weight_dtype)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def attention_params_per_layer(self) -> int:
        h = self.hidden_size
        return h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h

    def mlp_params_per_layer(self, active_only: bool = False) -> int:
        mats = 3 if self.gated_mlp else 2
        h = self.hidden_size
        if not self.is_moe:
            return mats * h * self.intermediate_size
        experts = self.num_experts_per_tok if active_only else self.num_experts
        routed = experts * mats * h * self.moe_intermediate_size
        shared = self.num_shared_experts * mats * h * self.moe_intermediate_size
        router = h * self.num_experts
        return routed + shared + router

    def embedding_params(self) -> int:
        emb = self.vocab_size * self.hidden_size
        return emb if self.tie_word_embeddings else 2 * emb

    def num_params(self) -> int:
        """Total parameters (norms included, biases ignored)."""
        per_layer = (
            self.attention_params_per_layer() + self.mlp_params_per_layer() + 2 * self.hidden_size
        )
        return self.num_hidden_layers * per_layer + self.embedding_params() + self.hidden_size

    def weight_bytes(self, tp: int = 1) -> float:
        """Weight bytes one tensor-parallel rank holds (embeddings and lm_head are sharded too,
        as vLLM's VocabParallelEmbedding does): the linear layers at :attr:`weight_dtype`, the
        rest (embeddings, lm_head, norms, an MoE router) at :attr:`dtype`."""
        router = self.hidden_size * self.num_experts if self.is_moe else 0
        linear = self.num_hidden_layers * (self.attention_params_per_layer()
                                           + self.mlp_params_per_layer() - router)
        rest = self.num_params() - linear
        return (linear * self.weight_dtype_bytes + rest * self.dtype_bytes) / tp

    def kv_bytes_per_token(self, tp: int = 1, kv_dtype_bytes: float | None = None) -> float:
        """KV-cache bytes per token on one rank: layers x kv heads x head dim x 2 (K and V) x
        dtype size. KV heads are split across ranks, but never below one head per rank."""
        b = self.dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
        kv_heads = max(1, math.ceil(self.num_key_value_heads / tp))
        return self.num_hidden_layers * kv_heads * self.head_dim * 2 * b

    def with_overrides(self, **kw: Any) -> ModelConfig:
        return replace(self, **kw)


def from_hf_config(cfg: dict[str, Any], name: str | None = None) -> ModelConfig:
    """Build a :class:`ModelConfig` from a Hugging Face ``config.json`` mapping.

    Raises :class:`SpecError` naming the missing or invalid field.
    """
    if "text_config" in cfg and "hidden_size" not in cfg:  # multimodal wrappers
        cfg = {**cfg["text_config"], "torch_dtype": cfg.get("torch_dtype")}
    label = name or cfg.get("_name_or_path") or cfg.get("model_type") or "custom"
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

    hidden = need("hidden_size", "d_model", "n_embd")
    layers = need("num_hidden_layers", "n_layer", "num_layers")
    heads = need("num_attention_heads", "n_head")
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or (hidden // heads if heads else 0)
    inter = cfg.get("intermediate_size") or cfg.get("ffn_dim") or 4 * hidden
    vocab = need("vocab_size")
    max_pos = cfg.get("max_position_embeddings") or cfg.get("max_sequence_length") or 4096
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    if dtype not in DTYPE_BYTES:
        problems.append(("torch_dtype", f"unknown dtype {dtype!r}; one of {sorted(DTYPE_BYTES)}"))
        dtype = "bfloat16"
    num_experts = int(
        cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0
    )
    moe_inter = int(cfg.get("moe_intermediate_size") or (inter if num_experts else 0))
    quant = read_quantization(cfg.get("quantization_config"), problems)
    if problems:
        raise SpecError([(f"model config {label}: {p}", m) for p, m in problems])
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
        num_experts_per_tok=int(cfg.get("num_experts_per_tok") or (2 if num_experts else 0)),
        moe_intermediate_size=moe_inter,
        num_shared_experts=int(cfg.get("n_shared_experts") or cfg.get("num_shared_experts") or 0),
        hf_name=str(cfg.get("_name_or_path") or ""),
        quantization=quant[0],
        weight_dtype=quant[1],
        kv_cache_dtype=quant[2],
    )


#: Quantization methods modelled (vLLM's names) and what their checkpoints store.
MODELLED_QUANTIZATION = ("fp8", "modelopt", "compressed-tensors")


def read_quantization(qc: Any, problems: list[tuple[str, str]]) -> tuple[str, str, str]:
    """(method, weight dtype, what ``--kv-cache-dtype auto`` means) of a checkpoint's
    ``quantization_config`` as vLLM 0.32 reads it; ("", "", "auto") without one. Appends to
    ``problems`` what the simulator does not model."""
    field = "quantization_config"
    if qc is None:
        return "", "", "auto"
    if not isinstance(qc, dict) or not isinstance(qc.get("quant_method"), str):
        problems.append((field, "must be a mapping with quant_method (as in config.json)"))
        return "", "", "auto"
    method = qc["quant_method"]
    if method == "fp8":  # Fp8Config: a serialized FP8 checkpoint (per tensor or 128x128 blocks)
        return method, "fp8", "auto"
    if method.startswith("modelopt"):  # ModelOpt: the algorithms under "quantization" or flat
        inner = qc.get("quantization", qc)
        algo = str(inner.get("quant_algo") or "").upper()
        if algo != "FP8":
            problems.append((f"{field}.quant_algo", f"ModelOpt {algo or 'without quant_algo'} "
                             "is not modelled (FP8 is)"))
            return "", "", "auto"
        kv = str(inner.get("kv_cache_quant_algo") or qc.get("kv_cache_quant_algo") or "")
        return "modelopt", "fp8", "fp8_e4m3" if kv.upper() == "FP8" else "auto"
    if method == "compressed-tensors":
        groups = qc.get("config_groups") or {}
        weights = [g.get("weights") or {} for g in groups.values() if isinstance(g, dict)]
        if weights and all(w.get("num_bits") == 8 and w.get("type") == "float"
                           for w in weights):
            return method, "fp8", "auto"
        problems.append((f"{field}.config_groups", "compressed-tensors weights other than "
                         "8-bit float are not modelled (FP8 is)"))
        return "", "", "auto"
    problems.append((f"{field}.quant_method", f"{method!r} is not modelled; the simulator "
                     f"models FP8 checkpoints ({', '.join(MODELLED_QUANTIZATION)})"))
    return "", "", "auto"


_GATED_ACTS = {"silu", "swish", "swiglu", "geglu"}
_GATED_TYPES = {"gemma", "gemma2", "gemma3", "gemma3_text"}


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
    "qwen3-32b-fp8": _dense("Qwen/Qwen3-32B-FP8", 5120, 64, 64, 8, 25600, 151936, 40960,
                            head_dim=128, quantization_config={
                                "quant_method": "fp8", "fmt": "e4m3",
                                "activation_scheme": "dynamic",
                                "weight_block_size": [128, 128]}),
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
})


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
        text = infile.read_text(p, field="--model-config", max_bytes=MAX_CONFIG_BYTES,
                                name=f"model config file {p}")
        cfg = infile.json_value(text, where=str(p), field="--model-config")
        if not isinstance(cfg, dict):
            raise SpecError(f"{p} is not a model config (a JSON object such as a Hugging Face "
                            "config.json)", field="--model-config")
        return from_hf_config(cfg, name=name or p.parent.name or p.stem)
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
