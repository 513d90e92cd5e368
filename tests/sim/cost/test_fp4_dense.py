"""Dense NVFP4 checkpoints (ModelOpt W4A4: nvidia/Llama-3.3-70B-Instruct-FP4): read as vLLM
stores them, timed from the GPU's own measured nvfp4 GEMM grid where it has one (the B200),
refused by name where vLLM would run a kernel not measured here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from chunktune.core.errors import SpecError
from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import DTYPE_BYTES, resolve_model
from chunktune.sim.cost import aic_data, gemm_table
from chunktune.sim.cost.coefficients import coefficients
from chunktune.sim.cost.step_time import StepCostModel, layer_gemms, linear_op_times


def test_an_nvfp4_checkpoint_reads_as_vllm_stores_it(tmp_path: Path):
    """ModelOpt's hf_quant_config.json beside config.json (vLLM merges it in): every linear
    layer but the lm_head in NVFP4, half a byte a weight plus an FP8 scale per 16 (vLLM's
    ``ModelOptNvFp4LinearMethod``: ``weight`` uint8 of two values, ``weight_scale`` FP8 per 16;
    the per-tensor FP32 ``weight_scale_2`` and ``input_scale`` are four bytes a layer), the
    KV cache in FP8; embeddings, lm_head and norms in bf16."""
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
           "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
           "intermediate_size": 28672, "vocab_size": 128256,
           "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({
        "producer": {"name": "modelopt", "version": "0.23.0"},
        "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8",
                         "group_size": 16, "exclude_modules": ["lm_head"]}}))
    read = resolve_model(config_path=tmp_path / "config.json")
    catalog = resolve_model("nvidia/Llama-3.3-70B-Instruct-FP4")
    for m in (read, catalog):
        assert (m.quantization, m.weight_dtype, m.kv_cache_dtype) == \
            ("modelopt", "nvfp4", "fp8_e4m3")
        assert m.unquantized == ()
        assert m.module_weight_bytes("attention") == m.module_weight_bytes("dense_mlp") \
            == 0.5 + 1 / 16 == DTYPE_BYTES["nvfp4"]
    # per layer: QKV 8192 x 10240, O 8192 x 8192, gate/up 8192 x 57344, down 28672 x 8192
    linear = 80 * (8192 * 10240 + 8192 * 8192 + 3 * 8192 * 28672)
    rest = 2 * 128256 * 8192 + (2 * 80 + 1) * 8192  # embeddings, lm_head, norms: bf16
    rope = 131072 * 128 * 2  # get_rope's cos/sin cache: bf16, whole on every rank
    expected = linear * (0.5 + 1 / 16) + rest * 2
    assert read.weight_bytes(1) == pytest.approx(expected + rope)
    assert catalog.weight_bytes(1) == pytest.approx(expected + rope)
    assert catalog.weight_bytes(4) == pytest.approx(expected / 4 + rope)
    assert catalog.weight_bytes(1) / 2**30 == pytest.approx(39.8, abs=0.1)  # 131 GiB in bf16


def test_a_b200_nvfp4_step_runs_its_measured_nvfp4_grid():
    """Every dense GEMM of the B200 NVFP4 70B comes from the B200's own nvfp4 grid
    (AIConfigurator, vLLM 0.24's FlashInfer CuTe DSL W4A4 kernel), never under the weights'
    HBM time; at decode sizes under the FP8 grid's time of the same GEMM (by a fifth over the
    layer: the small ones are launch-bound)."""
    gpu = resolve_gpu("b200")
    model = resolve_model("llama-3.3-70b-fp4")
    table = gemm_table.table("b200", "nvfp4")
    assert table is not None
    assert {(p.gpu, p.dtype) for p in aic_data.read_committed_gemm()
            if p.dtype == "nvfp4"} == {("b200", "nvfp4"), ("rtx-pro-6000", "nvfp4")}
    cost = StepCostModel(model, gpu, tp=2, max_tokens=256)
    assert cost.weight_dtype == "nvfp4"
    t = np.array([1.0, 64.0, 256.0])
    ops = linear_op_times(model, gpu, 2, t, coefficients(gpu), cost.weight_dtype)
    fp8 = linear_op_times(model, gpu, 2, t, coefficients(gpu), "fp8")
    for op, (k, n) in zip(("qkv", "o", "up", "down"), layer_gemms(model, 2), strict=True):
        floor = gemm_table.weight_stream_s(k, n, "nvfp4", gpu, "b200")
        assert floor > k * n * DTYPE_BYTES["nvfp4"] / (gpu.hbm_tb_s * 1e12)
        assert table.covers(n, k)
        assert ops[op] == pytest.approx(np.maximum(table.seconds(t, n, k), floor)), op
        assert np.all(ops[op] >= floor)
        assert ops[op][0] < fp8[op][0], op
    gemms = ("qkv", "o", "up", "down")
    assert sum(ops[op][0] for op in gemms) < 0.8 * sum(fp8[op][0] for op in gemms)
    # the engine's step: the bf16 model's layers cost more than the NVFP4 one's
    bf16 = StepCostModel(resolve_model("llama-3.1-70b"), gpu, tp=2, max_tokens=256)
    assert cost.linear_time(64) < 0.7 * bf16.linear_time(64)


@pytest.mark.parametrize(("gpu", "why"), [
    # vLLM runs NVFP4 weight-only there (MarlinNvFp4LinearKernel): not measured
    ("h100-sxm", "without FP4 tensor cores vLLM runs them weight-only"),
    ("h200", "without FP4 tensor cores vLLM runs them weight-only"),
    ("a100-sxm", "without FP4 tensor cores vLLM runs them weight-only"),
    # Blackwell, but no nvfp4 grid of its own
    ("b300", "no measured nvfp4 GEMM grid"),
])
def test_nvfp4_dense_layers_without_a_measured_kernel_are_refused_by_name(gpu: str, why: str):
    model = resolve_model("llama-3.3-70b-fp4")
    with pytest.raises(SpecError, match=f"nvfp4 dense linear layers on {gpu}.*{why}"):
        StepCostModel(model, resolve_gpu(gpu), tp=4, max_tokens=64)


def test_nvfp4_dense_layers_beside_bf16_ones_are_refused_by_name():
    model = resolve_model("llama-3.3-70b-fp4").with_overrides(
        unquantized=(("attention", 1.0),))
    with pytest.raises(SpecError, match="beside unquantized attention layers"):
        StepCostModel(model, resolve_gpu("b200"), tp=1, max_tokens=64)
