"""The routed experts' time from the GPU's measured MoE table (AIConfigurator's vLLM MoE layer)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import ModelConfig
from chunktune.sim.cost import moe_table
from chunktune.sim.cost.coefficients import coefficients
from chunktune.sim.cost.fit import moe_derive
from chunktune.sim.cost.step_time import moe_form, moe_time

SHARED = Path(__file__).resolve().parents[4] / "shared" / "data"

#: MiniMax-M2.5's MoE layers (config.json: hidden 3072, 256 experts of width 1536, top 8).
MINIMAX = ModelConfig("minimax-m2.5-shape", 3072, 62, 48, 8, 128, 1536, 200064, 196608,
                      num_experts=256, num_experts_per_tok=8, moe_intermediate_size=1536,
                      weight_dtype="fp8", quantization="fp8")


def test_a_measured_curve_is_interpolated_in_log_time_over_log_tokens():
    us = moe_table.curve("b200", "fp8_block", 3072, 1536, 256, 8, 4, 1)
    assert us is not None and len(us) == len(moe_table.TOKENS)
    grid = np.array(moe_table.TOKENS, dtype=np.float64)
    assert moe_table.seconds(us, grid) == pytest.approx(us * 1e-6)
    # between two measured counts: the geometric interpolation, inside the bracket
    mid = float(moe_table.seconds(us, np.array([6.0]))[0])
    lo, hi = us[2] * 1e-6, us[3] * 1e-6  # 4 and 8 tokens
    assert mid == pytest.approx(np.exp((np.log(lo) + np.log(hi)) / 2), rel=0.1)
    assert min(lo, hi) <= mid <= max(lo, hi)
    # past the largest count, proportional to tokens; nothing at no tokens
    big = moe_table.seconds(us, np.array([0.0, 32768.0]))
    assert big[0] == 0.0 and big[1] == pytest.approx(2 * us[-1] * 1e-6)


def test_the_step_time_takes_the_gpus_measured_moe_layer_where_it_has_the_shape():
    """MiniMax-M2.5's block-FP8 experts on the B200 at TP 4: the measured curve (vLLM 0.24's
    FlashInfer TRT-LLM kernel), sharded experts or, with ``--enable-expert-parallel``, the
    experts split whole over the 4 ranks; a shape the table lacks: the fitted form."""
    gpu = resolve_gpu("b200")
    c = coefficients(gpu)
    t = np.array([1.0, 4.0, 16.0, 1024.0])
    sharded = moe_table.curve("b200", "fp8_block", 3072, 1536, 256, 8, 4, 1)
    split = moe_table.curve("b200", "fp8_block", 3072, 1536, 256, 8, 1, 4)
    assert sharded is not None and split is not None
    assert moe_time(MINIMAX, gpu, 4, t, c, "fp8") == pytest.approx(
        moe_table.seconds(sharded, t))
    assert moe_time(MINIMAX, gpu, 4, t, c, "fp8", expert_parallel=True) == pytest.approx(
        moe_table.seconds(split, t))
    form = moe_form(t, 3072, 1536 / 4, 8, 256, 3, gpu, c, "fp8")
    assert moe_time(MINIMAX, gpu, 4, t, c, "fp8", use_table=False) == pytest.approx(form)
    odd = MINIMAX.with_overrides(moe_intermediate_size=1000)
    assert moe_table.curve("b200", "fp8_block", 3072, 1000, 256, 8, 4, 1) is None
    assert moe_time(odd, gpu, 4, t, c, "fp8") == pytest.approx(
        moe_form(t, 3072, 1000 / 4, 8, 256, 3, gpu, c, "fp8"))
    # the GPU without measured MoE rows in the committed table: the fitted form
    a100 = resolve_gpu("a100-sxm")
    ca = coefficients(a100)
    assert moe_time(MINIMAX, a100, 4, t, ca, "fp8") == pytest.approx(
        moe_form(t, 3072, 1536 / 4, 8, 256, 3, a100, ca, "fp8"))


@pytest.mark.skipif(not SHARED.is_dir(), reason="raw data not beside this checkout")
def test_the_committed_table_is_what_the_raw_tables_give(tmp_path):
    rows = moe_derive.derive(SHARED)
    out = tmp_path / "moe.csv"
    moe_derive.write(rows, out)
    assert out.read_text() == moe_table.MOE_PATH.read_text()
    versions = {(key[0], version) for key, version, _ in rows}
    # the newest release's curves, where it has them (vLLM's own MoE layer and backend)
    assert ("b200", "0.24.0") in versions and ("h200", "0.24.0") in versions


def test_a_gpu_without_a_moe_table_borrows_its_neighbours_scaled_per_regime():
    """The GB200 (no timings: it borrows the B200's kernels) runs MiniMax-M2.5's experts from
    the B200's measured curve scaled by the ratio of the fitted form on the two data sheets
    (``moe_table.lent``; holding out the measured GPUs chose the table over the form,
    ``moe_borrowing``): the same HBM bandwidth and an 11% higher peak, so a layer bound by its
    fixed cost or by streaming the experts' weights keeps the B200's time and one bound by
    FLOPs runs faster, never more than the peaks' ratio. The B300 (the B200's bandwidth and
    peaks) runs the B200's curve as measured; a measured GPU never borrows."""
    b200, gb200, b300 = resolve_gpu("b200"), resolve_gpu("gb200"), resolve_gpu("b300")
    assert moe_table.borrowing() is not None and moe_table.borrowing()["use"] == "table"
    assert moe_table.lent(gb200) == b200 and moe_table.lent(b300) == b200
    assert moe_table.lent(b200) is None and moe_table.lent(resolve_gpu("l40s")) is None
    t = np.array([1.0, 16.0, 16384.0])
    us = moe_table.curve("b200", "fp8_block", 3072, 1536, 256, 8, 4, 1)
    assert us is not None
    measured = moe_table.seconds(us, t)
    ratio = moe_time(MINIMAX, gb200, 4, t, coefficients(gb200), "fp8") / measured
    assert ratio[0] == pytest.approx(1.0, abs=0.005)  # one token: fixed cost and weights
    assert b200.bf16_tflops / gb200.bf16_tflops <= ratio[2] < ratio[0] - 0.02  # FLOPs
    assert moe_time(MINIMAX, b300, 4, t, coefficients(b300), "fp8") == pytest.approx(measured)
    # a shape the B200's table lacks: the fitted form, as before
    odd = MINIMAX.with_overrides(moe_intermediate_size=1000)
    c = coefficients(gb200)
    assert moe_time(odd, gb200, 4, t, c, "fp8") == pytest.approx(
        moe_form(t, 3072, 1000 / 4, 8, 256, 3, gb200, c, "fp8"))
