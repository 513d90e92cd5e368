"""FP8 weights and an FP8 KV cache in the step-time model: the GEMMs at the FP8 rate (the GPU's
measured FP8 grid or its fitted FP8 form), the KV bytes halved."""

from __future__ import annotations

import numpy as np
import pytest

from chunktune.core.engine_args import EngineArgs
from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.sim.cost.coefficients import coefficients
from chunktune.sim.cost.step_time import StepCostModel, linear_op_times
from chunktune.sim.engine.virtual import build_engine


def test_fp8_weights_run_the_linear_layers_at_the_fp8_rate():
    """An FP8 checkpoint (or ``--quantization fp8``) runs its GEMMs in FP8: the fitted form
    reads one byte per weight (a one-token GEMM's memory term halves) and computes at the FP8
    peak and its own fitted efficiency; the H100's own measured FP8 grid beats its bf16 one
    at decode and prefill sizes alike. Activations and the elementwise kernels stay bf16."""
    gpu = resolve_gpu("h100-sxm")
    c = coefficients(gpu)
    bf16, fp8 = resolve_model("llama-3.1-70b"), resolve_model("llama-3.1-70b-fp8")
    assert StepCostModel(fp8, gpu, 4).weight_dtype == "fp8"
    assert StepCostModel(bf16, gpu, 4).weight_dtype == "bf16"
    t = np.array([1.0, 8192.0])
    a = linear_op_times(bf16, gpu, 4, t, c, "bf16", use_table=False)
    b = linear_op_times(fp8, gpu, 4, t, c, "fp8", use_table=False)
    for op in ("qkv", "o", "up", "down"):
        k, n = {"qkv": (8192, 2560), "o": (2048, 8192), "up": (8192, 14336),
                "down": (7168, 8192)}[op]
        weights = k * n / (gpu.hbm_tb_s * 1e12)  # one byte each
        assert b[op][0] == pytest.approx(c.fp8_overhead_s + weights / c.fp8_memory_eff,
                                         rel=0.05), op
        flops = 2.0 * 8192 * k * n
        assert b[op][1] >= flops / (gpu.fp8_tflops * 1e12 * c.fp8_compute_eff), op
    assert b["elementwise"] == pytest.approx(a["elementwise"])
    # the MLP's wide GEMMs are faster in FP8 at every size, fitted and measured alike; a
    # narrow one over a long activation need not be (quantising 8,192 x 8,192 activations
    # costs what FP8 saves on a 2,560-wide qkv: measured 66 us against 54 in bf16 at 1,024)
    measured_bf16 = linear_op_times(bf16, gpu, 4, t, c, "bf16")
    measured_fp8 = linear_op_times(fp8, gpu, 4, t, c, "fp8")
    for op in ("up", "down"):
        assert np.all(b[op] < 0.8 * a[op]), op
        assert np.all(measured_fp8[op] < 0.8 * measured_bf16[op]), op
    # without FP8 tensor cores (A100) vLLM runs FP8 weight-only: the bytes halve, the
    # compute stays at the bf16 rate
    a100 = resolve_gpu("a100-sxm")
    ca = coefficients(a100)
    wa = linear_op_times(bf16, a100, 4, t, ca, "bf16", use_table=False)
    wo = linear_op_times(fp8, a100, 4, t, ca, "fp8")
    assert wo["up"][0] < 0.6 * wa["up"][0]
    assert wo["up"][1] == pytest.approx(wa["up"][1], rel=0.05)


def test_fp8_kv_cache_halves_the_decodes_kv_reads():
    gpu, m = resolve_gpu("h100-sxm"), resolve_model("llama-3.1-8b")
    auto = StepCostModel(m, gpu)
    fp8 = StepCostModel(m, gpu, kv_dtype_bytes=1.0)
    c = auto.c
    layers = m.num_hidden_layers
    fixed = layers * (c.attn_overhead_s + c.attn_per_decode_s * 64
                      + c.attn_decode_alone_overhead_s)
    kv = 64 * 8192
    assert fp8.attention_time([], 64, kv) - fixed == pytest.approx(
        (auto.attention_time([], 64, kv) - fixed) / 2)


def test_engine_costs_steps_with_its_kv_cache_dtype():
    gpu, m = resolve_gpu("h100-sxm"), resolve_model("llama-3.1-8b")
    auto = build_engine(EngineArgs(max_model_len=8192), m, gpu)
    fp8 = build_engine(EngineArgs(max_model_len=8192, kv_cache_dtype="fp8"), m, gpu)
    assert fp8.cost.attention_time([], 32, 32 * 4096) < auto.cost.attention_time(
        [], 32, 32 * 4096)
    assert fp8.cost.linear_time(32) == auto.cost.linear_time(32)
