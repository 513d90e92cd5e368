"""Gemma-4 in the step-time model: the dense MLP every layer runs beside its experts is timed,
and what one attention shape approximates of its two head sizes is said in the cost model's
line (``sim.cost.provenance``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.sim.cost.coefficients import coefficients
from chunktune.sim.cost.provenance import approximations, provenance
from chunktune.sim.cost.step_time import layer_gemms, linear_layer_time, linear_op_times

CONFIG = Path(__file__).resolve().parents[4] / "shared" / "data" / "aiconfigurator-vllm" \
    / "model-configs" / "google--gemma-4-26B-A4B_config.json"
pytestmark = pytest.mark.skipif(not CONFIG.is_file(), reason="model configs not beside this "
                                "checkout")


def test_the_dense_mlp_beside_the_experts_is_timed():
    """vLLM 0.33 Gemma4DecoderLayer.forward runs ``self.mlp`` and then ``self.experts`` on
    every layer: the gate/up and down GEMMs of the 2112-wide MLP come with the experts."""
    g = resolve_model(config_path=CONFIG)
    assert layer_gemms(g, 1)[2:] == [(2816, 2 * 2112), (2112, 2816)]
    gpu = resolve_gpu("h100-sxm")
    c = coefficients(gpu)
    tokens = np.array([1.0, 512.0, 8192.0])
    ops = linear_op_times(g, gpu, 1, tokens, c)
    assert {"up", "down", "experts"} <= set(ops)
    without = linear_layer_time(replace(g, dense_mlp_beside_moe=False), gpu, 1, tokens, c)
    assert np.all(linear_layer_time(g, gpu, 1, tokens, c) > without)


def test_the_cost_model_line_says_what_it_approximates():
    g = resolve_model(config_path=CONFIG)
    line = provenance("h100-sxm", g)
    # the GPU's line, then the end-to-end figures of this model's kind (no run of it here)
    assert line.startswith(provenance("h100-sxm").split("; end to end:")[0])
    assert "; end to end: no real serving runs of this model on this GPU" in line
    assert "approximated for google--gemma-4-26B-A4B: every layer's attention and QKV/O " \
        "projections timed with 8 KV heads of 256 (the 5 full_attention layers' 2 of 512 " \
        "approximated)" in line
    # a model with one head size and no vision tower approximates nothing
    assert approximations(resolve_model("llama-3.1-8b")) == ""
    assert "approximated for" not in provenance("h100-sxm", resolve_model("llama-3.1-8b"))
