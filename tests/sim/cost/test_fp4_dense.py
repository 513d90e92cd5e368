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
    (AIConfigurator, vLLM 0.24's FlashInfer CuTe DSL W4A4 kernel, which the current release
    runs), never under the weights' HBM time; at decode sizes under the FP8 grid's time of the
    same GEMM (by a fifth over the layer: the small ones are launch-bound)."""
    gpu = resolve_gpu("b200")
    model = resolve_model("llama-3.3-70b-fp4")
    table = gemm_table.table("b200", "nvfp4", gemm_table.NVFP4_CUTEDSL)
    assert table is not None and gemm_table.nvfp4_table(gpu, None) is table
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


def test_the_nvfp4_kernel_is_the_one_each_release_runs():
    """vLLM's default NVFP4 linear kernel (checked in each release's code): FlashInfer CUTLASS
    before 0.24 (0.10.2 and 0.15.1 ``ModelOptNvFp4LinearMethod``, 0.17/0.19
    ``select_nvfp4_linear_backend``, 0.22/0.23 ``_POSSIBLE_NVFP4_KERNELS``); from 0.24 (to
    0.34) FlashInfer's CuTe DSL GEMM heads the list where it runs, SM 10.x (B200, B300), and
    FlashInfer CUTLASS is the first supported on SM 12.0 (RTX PRO 6000)."""
    b200, b300, rtx = resolve_gpu("b200"), resolve_gpu("b300"), resolve_gpu("rtx-pro-6000")
    cutlass, cutedsl = gemm_table.NVFP4_CUTLASS, gemm_table.NVFP4_CUTEDSL
    for v in ((0, 10, 2), (0, 15, 1), (0, 17, 0), (0, 19, 0), (0, 22, 0), (0, 23, 0)):
        assert gemm_table.nvfp4_kernel(b200, v) == gemm_table.nvfp4_kernel(b300, v) == cutlass
    for v in ((0, 24, 0), (0, 31, 0), (0, 33, 0), None):  # None: the current release
        assert gemm_table.nvfp4_kernel(b200, v) == gemm_table.nvfp4_kernel(b300, v) == cutedsl
    for v in ((0, 10, 2), (0, 24, 0), None):
        assert gemm_table.nvfp4_kernel(rtx, v) == cutlass
    # AIConfigurator's rows: vllm_default is the release's choice, a named class is itself
    assert gemm_table.row_nvfp4_kernel(b200, "0.22.0", "vllm_default") == cutlass
    assert gemm_table.row_nvfp4_kernel(b200, "0.24.0", "vllm_default") == cutedsl
    assert gemm_table.row_nvfp4_kernel(
        b200, "0.24.0", "FlashInferCutlassNvFp4LinearKernel") == cutlass
    assert gemm_table.row_nvfp4_kernel(b200, "0.24.0", "CutlassNvFp4LinearKernel") is None


def test_the_committed_nvfp4_grids_are_the_kernels_vllm_runs():
    """One grid per (GPU, kernel) that some release runs there: the B200's CuTe DSL one
    (vLLM 0.24's rows) and its CUTLASS one (0.22's, the newest to time it), the RTX PRO 6000's
    CUTLASS one; the same shapes in both B200 grids."""
    pts = [p for p in aic_data.read_committed_gemm() if p.dtype == "nvfp4"]
    kernels = {(p.gpu, p.kernel) for p in pts}
    assert kernels == {("b200", gemm_table.NVFP4_CUTEDSL), ("b200", gemm_table.NVFP4_CUTLASS),
                       ("rtx-pro-6000", gemm_table.NVFP4_CUTLASS)}
    assert all(p.kernel == "" for p in aic_data.read_committed_gemm() if p.dtype != "nvfp4")
    shapes = {k: {(p.n, p.k) for p in pts if (p.gpu, p.kernel) == k} for k in kernels}
    assert shapes[("b200", gemm_table.NVFP4_CUTEDSL)] == shapes[("b200", gemm_table.NVFP4_CUTLASS)]


def test_a_b200_nvfp4_step_runs_the_kernel_of_its_release():
    """vLLM 0.10.2 (InferenceX's image) prices the 70B's GEMMs from the CUTLASS grid, the
    current release from the CuTe DSL one; at decode sizes CUTLASS is the slower on the wide
    GEMMs (qkv, gate-up) by more than a tenth."""
    gpu = resolve_gpu("b200")
    model = resolve_model("llama-3.3-70b-fp4")
    c, t = coefficients(gpu), np.array([1.0, 8.0, 64.0, 1024.0])
    old = linear_op_times(model, gpu, 2, t, c, "nvfp4", vllm_version=(0, 10, 2))
    now = linear_op_times(model, gpu, 2, t, c, "nvfp4")
    cutlass = gemm_table.table("b200", "nvfp4", gemm_table.NVFP4_CUTLASS)
    assert cutlass is not None
    for op, (k, n) in zip(("qkv", "o", "up", "down"), layer_gemms(model, 2), strict=True):
        floor = gemm_table.weight_stream_s(k, n, "nvfp4", gpu, "b200")
        assert old[op] == pytest.approx(np.maximum(cutlass.seconds(t, n, k), floor)), op
    for op in ("qkv", "up"):
        assert np.all(old[op][:2] > 1.1 * now[op][:2]), op
    # and the engine's step through StepCostModel(vllm_version=)
    a = StepCostModel(model, gpu, tp=2, max_tokens=64, vllm_version=(0, 10, 2))
    b = StepCostModel(model, gpu, tp=2, max_tokens=64, vllm_version=(0, 24, 0))
    assert a.linear_time(8) > b.linear_time(8)
    assert StepCostModel(model, gpu, tp=2, max_tokens=64).linear_time(8) == b.linear_time(8)


@pytest.mark.parametrize(("gpu", "why"), [
    # vLLM runs NVFP4 weight-only there (MarlinNvFp4LinearKernel): not measured
    ("h100-sxm", "without FP4 tensor cores vLLM runs them weight-only"),
    ("h200", "without FP4 tensor cores vLLM runs them weight-only"),
    ("a100-sxm", "without FP4 tensor cores vLLM runs them weight-only"),
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


def test_a_b300_or_gb200_borrows_the_b200s_nvfp4_grid_scaled_by_the_fp4_peaks():
    """The B300 and GB200 have no NVFP4 grid of their own: they run the B200's (the same
    compute capability family, 10.x, whose W4A4 kernels vLLM builds), scaled by the ratio of
    the two GPUs' forms at their data sheets' FP4 peaks (B200 9,000, B300 13,500, GB200
    10,000 dense TFLOP/s; HBM 8 TB/s on all three): a GEMM streaming its weights takes the
    B200's time, a compute-bound one less (the B300's FP4 rate is 1.5x the B200's). Were the
    B300 refused (no measured nvfp4 GEMM grid), a study of an NVFP4 checkpoint on the GPU
    being bought could not run. The RTX PRO 6000 (12.0, its own grid) and Hopper lend none."""
    model = resolve_model("llama-3.3-70b-fp4")
    b200, b300, gb200 = (resolve_gpu(g) for g in ("b200", "b300", "gb200"))
    for gpu in (b300, gb200):
        lender = gemm_table.nvfp4_lender(gpu)
        assert lender is not None and lender.name == "b200"
    assert gemm_table.nvfp4_lender(b200) is None  # its own
    assert gemm_table.nvfp4_lender(resolve_gpu("h100-sxm")) is None
    assert gemm_table.nvfp4_lender(resolve_gpu("rtx-pro-6000")) is None
    t = np.array([1.0, 16.0, 8192.0])
    theirs = linear_op_times(model, b200, 2, t, coefficients(b200), "nvfp4")
    mine = linear_op_times(model, b300, 2, t, coefficients(b300), "nvfp4")
    gemms = ("qkv", "o", "up", "down")
    for op in gemms:
        assert mine[op][0] == pytest.approx(theirs[op][0], rel=0.02), op  # weights' stream
        assert mine[op][2] < 0.9 * theirs[op][2], op  # 8,192 tokens: FP4 tensor cores
    assert sum(mine[op][2] for op in gemms) < 0.8 * sum(theirs[op][2] for op in gemms)
    assert StepCostModel(model, b300, tp=4, max_tokens=64).weight_dtype == "nvfp4"
    assert StepCostModel(model, gb200, tp=4, max_tokens=64).linear_time(8) > 0
