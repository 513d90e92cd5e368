"""The models users serve, read from their own config.json as vLLM 0.33 reads them.

The configs are the real ones in ``../shared/data/aiconfigurator-vllm/model-configs/``; the
parameter counts each test pins are the model cards' published totals.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from chunktune.core.errors import SpecError
from chunktune.core.models import (
    CATALOG_HF,
    CHUNKED,
    FULL,
    MLA,
    SLIDING,
    from_hf_config,
    resolve_model,
)

CONFIGS = Path(__file__).resolve().parents[3] / "shared" / "data" / "aiconfigurator-vllm" \
    / "model-configs"
needs_configs = pytest.mark.skipif(not CONFIGS.is_dir(), reason="model configs not beside "
                                   "this checkout")


def real(name: str):
    return resolve_model(config_path=CONFIGS / f"{name}_config.json")


@needs_configs
@pytest.mark.parametrize(("name", "total_b", "active_b"), [
    # published totals: DeepSeek-V3 671B (37B active) without its MTP layer, which vLLM
    # loads only for speculative decoding; Kimi-K2 1.04T (32B); gpt-oss 116.8B / 20.9B;
    # Qwen3-235B-A22B; MiniMax-M2.5 229B (10B); Llama-4 Scout 109B with its vision tower
    # (the text model alone ~107.8B), 17B active; Mixtral-8x22B 141B (39B).
    ("deepseek-ai--DeepSeek-V3", 671, 37),
    ("moonshotai--Kimi-K2.5", 1026, 32.9),
    ("openai--gpt-oss-120b", 116.8, 5.1),
    ("openai--gpt-oss-20b", 20.9, 3.6),
    ("Qwen--Qwen3-235B-A22B-FP8", 235, 22),
    ("MiniMaxAI--MiniMax-M2.5", 229, 10),
    ("meta-llama--Llama-4-Scout-17B-16E-Instruct", 107.8, 17),
    ("mistralai--Mixtral-8x22B-v0.1", 141, 39),
])
def test_parameter_counts_match_the_model_cards(name, total_b, active_b):
    m = real(name)
    assert m.num_params() / 1e9 == pytest.approx(total_b, rel=0.01)
    # active: the routed experts a token visits; the cards leave out the input embedding
    # (a lookup, not a matmul), and round (hence the looser bound)
    active = m.num_params(active_only=True) - m.vocab_size * m.hidden_size
    assert active / 1e9 == pytest.approx(active_b, rel=0.06)


@needs_configs
def test_layer_kinds_follow_vllm_model_files():
    ds = real("deepseek-ai--DeepSeek-V3")
    assert ds.is_mla and set(ds.layer_kinds()) == {MLA}
    assert (ds.kv_lora_rank, ds.qk_rope_head_dim) == (512, 64)
    assert ds.num_dense_layers == 3 and ds.num_moe_layers == 58  # first_k_dense_replace 3
    oss = real("openai--gpt-oss-120b")
    # gpt_oss.py: sliding window on even layers (layer_idx % 2 == 0), window 128
    assert oss.layer_kinds()[:2] == (SLIDING, FULL) and oss.sliding_window == 128
    assert oss.layer_kinds().count(SLIDING) == 18
    scout = real("meta-llama--Llama-4-Scout-17B-16E-Instruct")
    # llama4.py: every 4th layer is NoPE global attention (HF no_rope_layers default),
    # the others chunked local attention of attention_chunk_size 8192
    kinds = scout.layer_kinds()
    assert kinds.count(FULL) == 12 and kinds[3] == FULL and kinds[0] == CHUNKED
    assert scout.attention_chunk_size == 8192 and scout.num_dense_layers == 0
    maverick = real("meta-llama--Llama-4-Maverick-17B-128E-Instruct")
    assert maverick.num_dense_layers == 24  # interleave_moe_layer_step 2
    assert maverick.dense_intermediate_size == 16384  # intermediate_size_mlp


@needs_configs
@pytest.mark.parametrize(("name", "field", "text"), [
    ("Qwen--Qwen3.5-397B-A17B", "layer_types",
     "linear_attention layers (qwen3_5_moe) are not modelled"),
    ("nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-FP8", "hybrid_override_pattern",
     "mamba layers (nemotron_h) are not modelled"),
    ("deepseek-ai--DeepSeek-V3.2", "index_topk",
     "MLA with a sparse indexer (deepseek_v32, DSA) is not modelled"),
    ("zai-org--GLM-5-FP8", "index_topk", "sparse indexer (glm_moe_dsa"),
])
def test_unmodelled_layer_kinds_are_refused_by_name(name, field, text):
    with pytest.raises(SpecError) as e:
        real(name)
    assert any(field in p and text in m for p, m in e.value.problems), e.value.problems


@needs_configs
def test_gemma4_as_vllm_builds_it():
    """vLLM 0.33 gemma4.py: full layers with their own head size and KV heads
    (per_layer_config), a dense MLP beside the experts in every layer, K-only full layers whose
    K is loaded into both slots of qkv_proj; gemma4_mm.py loads the vision tower too."""
    g = real("google--gemma-4-26B-A4B")
    # the card: 25.2B parameters without the ~550M vision encoder, 3.8B active (embeddings
    # counted)
    assert g.num_params() / 1e9 == pytest.approx(25.2, rel=0.01)
    assert g.num_params(active_only=True) / 1e9 == pytest.approx(3.8, rel=0.02)
    kinds = g.layer_kinds()
    assert kinds.count(FULL) == 5 and kinds[5] == FULL and g.sliding_window == 1024
    assert (g.layer_head_dim(FULL), g.layer_kv_heads(FULL)) == (512, 2)
    assert (g.layer_head_dim(SLIDING), g.layer_kv_heads(SLIDING)) == (256, 8)
    assert g.per_kind_heads and g.gated_mlp and g.num_moe_layers == 30
    # every layer: a 2112-wide dense MLP beside 128 experts 704 wide
    assert g.mlp_params_per_layer() == 3 * 2816 * (2112 + 128 * 704) + 2816 * 128
    # the V slot vLLM allocates for each K-only full layer: 2816 x 2 heads x 512 x 5 layers
    assert g.attention_params() - g.attention_params(loaded=False) == 2816 * 2 * 512 * 5
    # the vision tower and its projection, whole on every rank: transformers 5.19's
    # Gemma4ForConditionalGeneration built on the meta device counts 569,548,080 + 3,244,032
    # (vLLM builds the tower with AutoModel.from_config); its text model 25,233,141,760
    assert g.vision_params == pytest.approx(569_548_080 + 3_244_032, rel=1e-4)
    assert g.num_params() == pytest.approx(25_233_141_760, rel=1e-4)
    # and the rotary caches of the sliding layers' head (256) and the full layers' (512), for
    # 262,144 positions (vLLM 0.33 get_rope, one cos_sin_cache each)
    whole = (g.vision_params + 30 * g.router_params()) * 2 + 262144 * (256 + 512) * 2
    assert g.weight_bytes(2) == pytest.approx((g.weight_bytes(1) - whole) / 2 + whole)
    assert g.weight_bytes(1) / 2**30 == pytest.approx(48.47, abs=0.01)


@pytest.mark.parametrize(("field", "value", "text"), [
    ("num_kv_shared_layers", 10, "KV-shared layers"),
    ("hidden_size_per_layer_input", 256, "per-layer input embeddings"),
])
@needs_configs
def test_gemma4_variants_not_modelled_are_refused_by_name(field, value, text):
    import json
    cfg = json.loads((CONFIGS / "google--gemma-4-26B-A4B_config.json").read_text())
    cfg["text_config"][field] = value
    with pytest.raises(SpecError) as e:
        from_hf_config(cfg)
    assert any(field in p and text in m for p, m in e.value.problems), e.value.problems


@needs_configs
def test_quantized_modules_as_vllm_stores_them():
    # gpt-oss: vLLM's Mxfp4Config quantizes the experts only (4 bits + an e8m0 scale per 32)
    oss = real("openai--gpt-oss-120b")
    assert (oss.quantization, oss.weight_dtype) == ("mxfp4", "mxfp4")
    assert oss.module_weight_bytes("experts") == pytest.approx(0.5 + 1 / 32)
    assert oss.module_weight_bytes("attention") == 2
    assert oss.weight_bytes() / 2**30 == pytest.approx(60.7, abs=0.1)
    # Kimi-K2.5: compressed-tensors INT4 groups of 32 on the routed experts; ignore keeps
    # attention, shared experts and the dense first layer in bf16
    kimi = real("moonshotai--Kimi-K2.5")
    assert kimi.weight_dtype == "int4_g32"
    assert kimi.module_weight_bytes("experts") == pytest.approx(0.5 + 2 / 32)
    for c in ("attention", "shared_experts", "dense_mlp"):
        assert kimi.module_weight_bytes(c) == 2
    # Qwen3-235B-A22B-FP8 leaves out only norms and routers: every linear layer is FP8
    q = real("Qwen--Qwen3-235B-A22B-FP8")
    assert q.unquantized == () and q.module_weight_bytes("attention") == 1
    # ModelOpt NVFP4 from hf_quant_config.json beside config.json; attention excluded per layer
    ds = real("nvidia--DeepSeek-V3.1-NVFP4")
    assert (ds.quantization, ds.weight_dtype, ds.kv_cache_dtype) == \
        ("modelopt", "nvfp4", "fp8_e4m3")
    assert ds.module_weight_bytes("attention") == 2
    assert ds.module_weight_bytes("experts") == pytest.approx(0.5 + 1 / 16)


@pytest.mark.parametrize("text", [
    '{"producer": {"name": "modelopt", "version": "0.33.0"}, '
    '"quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"}}',
    # Nemotron-3-Super-120B-A12B-FP8's has no producer
    '{"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}'])
def test_a_quantization_config_given_for_the_model_config_is_named(tmp_path, text):
    """ModelOpt's hf_quant_config.json given where config.json goes: refused as what it is,
    with the fix (not "hidden_size is missing")."""
    q = tmp_path / "hf_quant_config.json"
    q.write_text(text)
    with pytest.raises(SpecError) as e:
        resolve_model(config_path=q)
    assert [f for f, _ in e.value.problems] == ["--model-config"]
    assert "is a quantization config (ModelOpt's hf_quant_config.json)" in str(e.value)
    assert "give the model's config.json" in str(e.value)
    assert "hidden_size" not in str(e.value)


def test_a_models_shape_is_its_own_whatever_its_name_or_weights():
    """``shape_key``: one model to the simulator across its names and weight formats (the
    end-to-end figures a run quotes are matched on it), another model's is another."""
    a, b = resolve_model("llama-3.1-70b"), resolve_model("llama-3.1-70b-fp8")
    assert a.shape_key == b.shape_key and (a.weights, b.weights) == ("bf16", "fp8")
    assert resolve_model("llama-3.1-8b").shape_key != a.shape_key
    oss = resolve_model("gpt-oss-120b")
    assert oss.weights == "mxfp4"
    assert oss.shape_key != resolve_model("gpt-oss-20b").shape_key
    assert "e128/4x2880" in oss.shape_key and "sliding_attention18" in oss.shape_key


@needs_configs
def test_mla_down_projections_and_router_stay_whole_on_each_rank():
    ds = real("deepseek-ai--DeepSeek-V3")
    whole = 61 * ds.mla_replicated_params_per_layer() * 1 + 58 * ds.router_params() * 2 \
        + 163840 * 64 * 2  # the rotary cache of qk_rope_head_dim
    assert ds.weight_bytes(8) == pytest.approx((ds.weight_bytes(1) - whole) / 8 + whole)
    # ~79 GiB a rank: 671B weights, FP8 but for the bf16 embeddings, lm_head, norms and
    # routers, / 8, plus the replicated parts
    assert 78 < ds.weight_bytes(8) / 2**30 < 81


def test_old_configs_read_as_before():
    m = from_hf_config(CATALOG_HF["llama-3.1-70b"])
    assert m.layer_kinds() == (FULL,) * 80 and not m.is_mla and m.num_dense_layers == 0
    assert m.kv_bytes_per_token(tp=2) == 80 * 4 * 128 * 2 * 2
    # Qwen2/3 configs carry a sliding_window that use_sliding_window false turns off
    qwen = from_hf_config({**CATALOG_HF["qwen3-32b"], "sliding_window": 4096,
                           "use_sliding_window": False})
    assert set(qwen.layer_kinds()) == {FULL}


def test_layer_types_must_match_the_layer_count():
    cfg = {**CATALOG_HF["llama-3.1-8b"], "layer_types": ["full_attention"] * 3}
    with pytest.raises(SpecError, match="one kind per layer"):
        from_hf_config(cfg)


@needs_configs
@pytest.mark.parametrize(("key", "config"), [
    ("deepseek-v3", "deepseek-ai--DeepSeek-V3"),
    ("deepseek-r1", "deepseek-ai--DeepSeek-R1"),
    ("kimi-k2.5", "moonshotai--Kimi-K2.5"),
    ("gpt-oss-20b", "openai--gpt-oss-20b"),
    ("gpt-oss-120b", "openai--gpt-oss-120b"),
    ("qwen3-8b", "Qwen--Qwen3-8B"),
    ("qwen3-235b-a22b", "Qwen--Qwen3-235B-A22B"),
    ("qwen3-235b-a22b-fp8", "Qwen--Qwen3-235B-A22B-FP8"),
    ("minimax-m2.5", "MiniMaxAI--MiniMax-M2.5"),
    ("llama-4-scout", "meta-llama--Llama-4-Scout-17B-16E-Instruct"),
    ("gemma-4-26b-a4b", "google--gemma-4-26B-A4B"),
])
def test_catalog_entries_read_as_their_real_configs(key, config):
    ours, theirs = resolve_model(key), real(config)
    assert replace(ours, name="", hf_name="") == replace(theirs, name="", hf_name="")
    assert resolve_model(ours.hf_name).name == key  # the HF repo id finds the entry


#: Config files committed beside the published runs (bench/data/e2e/model-configs/README.md)
COMMITTED = Path(__file__).resolve().parents[2] / "bench" / "data" / "e2e" / "model-configs"


@pytest.mark.parametrize(("key", "config"), [
    ("glm-4.5-air", "zai-org--GLM-4.5-Air"),
    # GLM-4.6 has GLM-4.7's shape: AIConfigurator's GLM-4.7-FP8 entry holds no quantization
    # section, so it reads as the bf16 model
    ("glm-4.6", "zai-org--GLM-4.7-FP8"),
])
def test_glm_catalog_entries_read_as_their_configs(key, config):
    ours = resolve_model(key)
    theirs = resolve_model(config_path=COMMITTED / f"{config}_config.json")
    assert replace(ours, name="", hf_name="") == replace(theirs, name="", hf_name="")
    assert resolve_model(ours.hf_name).name == key
    assert ours.num_experts and ours.num_shared_experts == 1 and ours.num_dense_layers
