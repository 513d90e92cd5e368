"""The linear layers of a 4-bit MoE checkpoint outside its routed experts (shared experts,
dense first layers, attention projections): each runs what vLLM runs it in, from the table
that times that kernel. NVIDIA's NVFP4 exports (Kimi-K2.5-NVFP4, MiniMax-M2.5-NVFP4) quantize
every Linear but the ones their ``ignore`` list names (attention, router gate, lm_head): on a
Blackwell GPU with a measured nvfp4 grid vLLM's ``ModelOptNvFp4LinearMethod`` runs W4A4 FP4
GEMMs, timed by that grid; the excluded layers stay bf16."""

from __future__ import annotations

import numpy as np
import pytest

from chunktune.core.errors import SpecError
from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import DTYPE_BYTES, ModelConfig, resolve_model
from chunktune.sim.calibration import e2e
from chunktune.sim.cost import gemm_table
from chunktune.sim.cost.coefficients import coefficients
from chunktune.sim.cost.step_time import (
    StepCostModel,
    dense_layer,
    four_bit_linear_dtype,
    gemm_time,
    linear_op_times,
)


def _checkpoint(name: str) -> ModelConfig:
    return resolve_model(config_path=e2e.MOE_CONFIGS / f"{name}_config.json")


def test_kimi_nvfp4_shared_expert_and_dense_layer_run_the_b200_nvfp4_grid():
    """Kimi-K2.5-NVFP4's ignore list names only self_attn, the lm_head and the vision parts:
    its shared expert and its dense first layer are NVFP4 (W4A4 from the B200's grid, not the
    FP8 GEMMs they borrowed before), its MLA projections bf16."""
    model = _checkpoint("nvidia--Kimi-K2.5-NVFP4")
    gpu = resolve_gpu("b200")
    assert dict(model.unquantized) == {"attention": 1.0}
    assert [four_bit_linear_dtype(model, gpu, m) for m in
            ("attention", "dense_mlp", "shared_experts")] == [None, "nvfp4", "nvfp4"]
    c, tp = coefficients(gpu), 4
    t = np.array([1.0, 16.0, 256.0])
    si = model.num_shared_experts * model.moe_intermediate_size / tp
    h = model.hidden_size
    table = gemm_table.nvfp4_table(gpu, None)
    assert table is not None and table.covers(2 * si, h) and table.covers(h, si)

    def shared(dtype: str) -> np.ndarray:
        out: np.ndarray = gemm_time(t, h, 2 * si, gpu, c, dtype) \
            + gemm_time(t, si, h, gpu, c, dtype)
        return out

    serial = {"VLLM_DISABLE_SHARED_EXPERTS_STREAM": "1"}  # no side stream: one after another
    ops = linear_op_times(model, gpu, tp, t, c, "bf16", vllm_env=serial)
    routed = linear_op_times(model.with_overrides(num_shared_experts=0), gpu, tp, t, c, "bf16")
    assert ops["experts"] - routed["experts"] == pytest.approx(shared("nvfp4"))
    assert not np.allclose(shared("nvfp4"), shared("fp8"))
    # the dense first layer's MLP (18432 wide) from the grid too; MLA: no qkv/o here
    dense = linear_op_times(dense_layer(model), gpu, tp, t, c, "bf16")
    assert "qkv" not in dense
    k, n = h, 2 * model.intermediate_size / tp
    floor = k * n * DTYPE_BYTES["nvfp4"] / (gpu.hbm_tb_s * 1e12)
    assert dense["up"] == pytest.approx(np.maximum(table.seconds(t, n, k), floor))
    assert StepCostModel(model, gpu, tp=tp, max_tokens=64).weight_dtype == "bf16"


def test_the_int4_export_keeps_its_excluded_layers_bf16():
    """Moonshot's INT4 Kimi-K2.5 leaves attention, shared experts and dense MLPs in bf16."""
    model = _checkpoint("moonshotai--Kimi-K2.5")
    gpu = resolve_gpu("b200")
    assert [four_bit_linear_dtype(model, gpu, m) for m in
            ("attention", "dense_mlp", "shared_experts")] == [None, None, None]


def test_minimax_nvfp4_attention_stays_bf16_and_quantized_attention_runs_the_grid():
    """MiniMax-M2.5-NVFP4 excludes self_attn and the router: its projections run bf16 GEMMs.
    An NVFP4 MoE checkpoint that quantizes attention runs its projections from the nvfp4
    grid on the B200 and is refused by name where no table times vLLM's kernel (Hopper:
    Marlin FP4 weight-only)."""
    model = _checkpoint("nvidia--MiniMax-M2.5-NVFP4")
    b200 = resolve_gpu("b200")
    c = coefficients(b200)
    t = np.array([1.0, 64.0])
    ops = linear_op_times(model, b200, 2, t, c, "bf16")
    k, n = model.hidden_size, model.q_dim // 2 + 2 * model.kv_dim // 2
    assert ops["qkv"] == pytest.approx(gemm_time(t, k, n, b200, c, "bf16"))
    quantized = model.with_overrides(unquantized=())
    assert four_bit_linear_dtype(quantized, b200, "attention") == "nvfp4"
    q_ops = linear_op_times(quantized, b200, 2, t, c, "bf16")
    assert q_ops["qkv"] == pytest.approx(gemm_time(t, k, n, b200, c, "nvfp4"))
    StepCostModel(quantized, b200, tp=2, max_tokens=64)
    with pytest.raises(SpecError, match="nvfp4 attention linear layers"):
        StepCostModel(quantized, resolve_gpu("h200"), tp=2, max_tokens=64)


def test_without_a_measured_nvfp4_grid_the_shared_expert_stays_borrowed():
    """On the H200 (no FP4 tensor cores: vLLM runs Marlin FP4, not timed) the NVFP4 shared
    expert keeps the FP8 GEMMs it borrowed; the B300 (no grid of its own) runs the B200's
    NVFP4 grid, scaled by the FP4 peaks (gemm_table.nvfp4_lender)."""
    model = _checkpoint("nvidia--Kimi-K2.5-NVFP4")
    assert four_bit_linear_dtype(model, resolve_gpu("h200"), "shared_experts") == "fp8"
    assert four_bit_linear_dtype(model, resolve_gpu("b300"), "shared_experts") == "nvfp4"


def test_the_shared_expert_runs_on_a_side_stream_in_steps_of_up_to_256_tokens():
    """vLLM 0.15-0.33's SharedFusedMoE runs an MoE layer's shared experts on a side CUDA
    stream beside the router and the routed experts in steps of at most
    VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD (256) tokens: the layer takes the longer of
    the two, the routed side lengthened by the share of the SMs the shared GEMMs hold (one
    CTA a 128 x 128 output tile); longer steps, or VLLM_DISABLE_SHARED_EXPERTS_STREAM=1, run
    them one after the other."""
    model = _checkpoint("nvidia--Kimi-K2.5-NVFP4")
    gpu = resolve_gpu("b200")
    c, tp = coefficients(gpu), 4
    t = np.array([4.0, 64.0, 256.0, 257.0, 2048.0])
    si = model.num_shared_experts * model.moe_intermediate_size / tp
    h = model.hidden_size
    up, down = (gemm_time(t, h, 2 * si, gpu, c, "nvfp4"), gemm_time(t, si, h, gpu, c, "nvfp4"))
    main = linear_op_times(model.with_overrides(num_shared_experts=0), gpu, tp, t, c,
                           "bf16")["experts"]
    side = linear_op_times(model, gpu, tp, t, c, "bf16")["experts"]
    serial = linear_op_times(model, gpu, tp, t, c, "bf16",
                             vllm_env={"VLLM_DISABLE_SHARED_EXPERTS_STREAM": "1"})["experts"]
    assert serial == pytest.approx(main + up + down)
    # 4-256 tokens: beside the routed experts, which take longer; 8 and 56 tiles (twice as
    # many at 256 tokens: two rows of tiles) of the B200's 148 SMs
    rows = np.array([1, 1, 2])
    assert np.all(main[:3] > (up + down)[:3])
    assert side[:3] == pytest.approx(main[:3] + up[:3] * rows * 8 / 148
                                     + down[:3] * rows * 56 / 148)
    assert np.all(side[:3] < serial[:3])
    assert side[3:] == pytest.approx(serial[3:])
    # a lower threshold moves the switch
    env = {"VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD": "32"}
    assert linear_op_times(model, gpu, tp, t, c, "bf16", vllm_env=env)["experts"][1:] \
        == pytest.approx(serial[1:])
    # a model without shared experts is unchanged
    minimax = _checkpoint("nvidia--MiniMax-M2.5-NVFP4")
    assert linear_op_times(minimax, gpu, tp, t, c, "bf16")["experts"] == pytest.approx(
        linear_op_times(minimax, gpu, tp, t, c, "bf16", vllm_env={
            "VLLM_DISABLE_SHARED_EXPERTS_STREAM": "1"})["experts"])
