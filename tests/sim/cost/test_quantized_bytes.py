"""The bytes FP8 weights and an FP8 KV cache move in the step-time model (the FP8 GEMM rate
is the kernel fit's: chunktune.sim.cost.kernel_fit)."""

from __future__ import annotations

import numpy as np
import pytest

from chunktune.core.engine_args import EngineArgs
from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.sim.cost.step_time import StepCostModel, coefficients, linear_op_times
from chunktune.sim.engine.virtual import build_engine


def test_fp8_weights_halve_the_gemms_weight_reads():
    """A one-token GEMM reads its weights and little else: at 1 byte per weight its memory
    term halves; at 8,192 tokens the GEMMs are compute-bound and the weights do not matter."""
    gpu = resolve_gpu("h100-sxm")
    c = coefficients(gpu.family)
    bf16, fp8 = resolve_model("llama-3.1-70b"), resolve_model("llama-3.1-70b-fp8")
    t = np.array([1.0, 8192.0])
    a, b = linear_op_times(bf16, gpu, 4, t, c), linear_op_times(fp8, gpu, 4, t, c)
    for op in ("qkv", "o", "up", "down"):
        mem = a[op][0] - c.gemm_overhead_s
        assert b[op][0] - c.gemm_overhead_s == pytest.approx(mem / 2, rel=0.02), op
        assert b[op][1] == pytest.approx(a[op][1], rel=0.02), op
    assert b["elementwise"] == pytest.approx(a["elementwise"])  # activations stay bf16


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
