"""The routed experts' time from the GPU's measured MoE table (AIConfigurator's vLLM MoE layer)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import ModelConfig
from chunktune.sim.cost import moe_table
from chunktune.sim.cost.coefficients import coefficients, group_sources, moe_kernel
from chunktune.sim.cost.fit import aic_kernels, measurements, moe_derive
from chunktune.sim.cost.step_time import (
    borrowed_moe_curve,
    lent_moe_seconds,
    moe_form,
    moe_time,
    moe_weight_format,
    other_shape_curve,
)

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
    # a format the GPU's table lacks (the A100 timed bf16 experts only): the fitted form
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

#: gpt-oss-120b's MoE layers (config.json: hidden 2880, 128 experts of width 2880, top 4).
GPT_OSS = ModelConfig("gpt-oss-shape", 2880, 36, 64, 8, 64, 2880, 201088, 131072,
                      num_experts=128, num_experts_per_tok=4, moe_intermediate_size=2880,
                      weight_dtype="mxfp4", quantization="mxfp4")
MXFP8 = {"VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8": "1"}
TRITON = {"VLLM_USE_FLASHINFER_MOE_FP8": "0", "VLLM_MOE_USE_DEEP_GEMM": "0"}
MARLIN = {"VLLM_MXFP4_USE_MARLIN": "1"}


def test_the_vllm_environment_picks_the_kernel_the_moe_table_is_read_for():
    """vLLM's environment variables choose the MoE kernel: MXFP8 activations for MXFP4
    experts on SM100 GPUs only, Triton's block-FP8 kernel once FlashInfer and DeepGEMM are
    both off; otherwise the format's default."""
    assert moe_weight_format("mxfp4") == "mxfp4"
    assert moe_weight_format("mxfp4", "b200", MXFP8) == "mxfp4_mxfp8"
    assert moe_weight_format("mxfp4", "h200", MXFP8) == "mxfp4"  # no SM100: bf16 activations
    assert moe_weight_format("mxfp4", "b200", {"VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8": "0"}) \
        == "mxfp4"
    assert moe_weight_format("fp8", "b200") == "fp8_block"
    assert moe_weight_format("fp8", "b200", TRITON) == "fp8_block_triton"
    # FlashInfer off alone leaves DeepGEMM first: not the Triton kernel
    assert moe_weight_format("fp8", "b200", {"VLLM_USE_FLASHINFER_MOE_FP8": "0"}) == "fp8_block"
    assert moe_weight_format("int4_g32", "b200", MXFP8) == "int4"
    # Marlin's MXFP4 kernel on Hopper when asked for, OpenAI's Triton kernel otherwise
    assert moe_weight_format("mxfp4", "h100-sxm", MARLIN) == "mxfp4_marlin"
    assert moe_weight_format("mxfp4", "h200", {"VLLM_MXFP4_USE_MARLIN": "0"}) == "mxfp4"
    assert moe_weight_format("fp8", "h200", MARLIN) == "fp8_block"


def test_marlin_mxfp4_on_hopper_borrows_its_growth_from_the_shape_marlin_was_timed_on():
    """gpt-oss's MXFP4 experts under ``VLLM_MXFP4_USE_MARLIN=1`` on the H200: the Marlin
    kernel is timed on another shape only (vLLM 0.24's collector, 3584 x 3072, 896 experts,
    top 16); the borrowed curve keeps the Triton kernel's one-token cost and, past a few
    hundred tokens, costs more than Triton's (Marlin's W4A16 tiles run about half the FLOP
    rate of OpenAI's kernel on that shape at 8,192 tokens)."""
    gpu = resolve_gpu("h200")
    c = coefficients(gpu)
    assert moe_table.curve("h200", "mxfp4_marlin", 2880, 2880, 128, 4, 1, 1) is None
    shape, _ = moe_table.nearest("h200", "mxfp4_marlin", 2880, 2880, 1, 1) or ((0,), None)
    assert shape == (3584, 3072, 896, 16)
    t = np.array([1.0, 8192.0])
    for tp in (1, 2, 4, 8):
        triton = moe_time(GPT_OSS, gpu, tp, t, c, "bf16")
        marlin = moe_time(GPT_OSS, gpu, tp, t, c, "bf16", vllm_env=MARLIN)
        assert marlin[0] == pytest.approx(triton[0])
        assert 1.5 * triton[1] < marlin[1] < 2.5 * triton[1]


def test_triton_block_fp8_is_its_own_curve_slower_than_flashinfers_on_the_b200():
    """MiniMax-M2.5's block-FP8 experts under Triton's ``fused_moe`` (timed by the 0.19/0.22
    collectors) against FlashInfer TRT-LLM's (0.24) at TP 2: slower at every token count."""
    gpu = resolve_gpu("b200")
    c = coefficients(gpu)
    t = np.array([4.0, 16.0, 64.0, 1024.0])
    triton = moe_table.curve("b200", "fp8_block_triton", 3072, 1536, 256, 8, 2, 1)
    assert triton is not None
    assert moe_time(MINIMAX, gpu, 2, t, c, "fp8", vllm_env=TRITON) == pytest.approx(
        moe_table.seconds(triton, t))
    assert (moe_time(MINIMAX, gpu, 2, t, c, "fp8", vllm_env=TRITON)
            > moe_time(MINIMAX, gpu, 2, t, c, "fp8")).all()


def test_mxfp8_activations_borrow_the_nearest_shapes_growth_onto_the_models_own_kernel():
    """gpt-oss's shape is timed with bf16 activations only: under MXFP8 activations its
    curve keeps its own kernel's cost at one token and grows as the MXFP8 kernel measured on
    the nearest shape does, scaled by the fitted form; faster than bf16 activations past one
    token, most where the experts are compute-bound."""
    gpu = resolve_gpu("b200")
    c = coefficients(gpu)
    assert moe_table.curve("b200", "mxfp4_mxfp8", 2880, 2880, 128, 4, 1, 1) is None
    shape, _ = moe_table.nearest("b200", "mxfp4_mxfp8", 2880, 2880, 1, 1) or ((0,), None)
    assert shape == (4096, 2048, 256, 6)
    t = np.array(moe_table.TOKENS, dtype=np.float64)
    for tp in (1, 2, 4, 8):
        bf16 = moe_table.curve("b200", "mxfp4", 2880, 2880, 128, 4, tp, 1)
        mxfp8 = borrowed_moe_curve(gpu, c, "mxfp4_mxfp8", 2880, 2880, 128, 4, tp, 1)
        assert bf16 is not None and mxfp8 is not None
        assert mxfp8[0] == pytest.approx(bf16[0])
        assert (mxfp8[1:] < bf16[1:]).all()
        assert mxfp8[-1] < 0.5 * bf16[-1]
        # the step time: the borrowed curve plus the kernel quantizing the activations
        quant = moe_time(GPT_OSS, gpu, tp, t, c, "bf16", vllm_env=MXFP8) \
            - moe_table.seconds(mxfp8, t)
        assert (quant > c.elementwise_overhead_s).all() and (quant[:4] < 2e-5).all()
    # on the H100 the environment variable changes nothing
    h100 = resolve_gpu("h100-sxm")
    ch = coefficients(h100)
    assert moe_time(GPT_OSS, h100, 1, t, ch, "bf16", vllm_env=MXFP8) == pytest.approx(
        moe_time(GPT_OSS, h100, 1, t, ch, "bf16"))


def test_the_borrowed_growth_predicts_one_measured_mxfp8_shape_from_the_other():
    """What the borrowing's error is stated from: each of the B200's two MXFP8-activation
    shapes predicted from the other (its own one-token cost, the other's growth scaled by the
    fitted form) over the splits both were timed at: within 10% at the median."""
    gpu = resolve_gpu("b200")
    c = coefficients(gpu)
    t = np.array(moe_table.TOKENS, dtype=np.float64)
    a, b = (4096, 2048, 256, 6), (7168, 3072, 384, 6)
    errors = []
    for tp, ep in ((1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (1, 4), (1, 8)):
        ca = moe_table.curve("b200", "mxfp4_mxfp8", *a, tp, ep)
        cb = moe_table.curve("b200", "mxfp4_mxfp8", *b, tp, ep)
        assert ca is not None and cb is not None
        for (own, o), (other, x) in (((a, ca), (b, cb)), ((b, cb), (a, ca))):
            f_own = moe_form(t, own[0], own[1] / tp, own[3] / ep, own[2] / ep, 3, gpu, c,
                             "mxfp4")
            f_other = moe_form(t, other[0], other[1] / tp, other[3] / ep, other[2] / ep, 3,
                               gpu, c, "mxfp4")
            pred = o[0] + np.maximum(x - x[0], 0) * (f_own - f_own[0]) / (f_other - f_other[0])
            errors += list(np.abs(pred[1:] / o[1:] - 1))
    assert float(np.median(errors)) < 0.10


#: Qwen3-30B-A3B's MoE layers (config.json: hidden 2048, 128 experts of width 768, top 8).
QWEN3_30B = ModelConfig("qwen3-30b-shape", 2048, 48, 32, 4, 128, 6144, 151936, 40960,
                        num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768)


def test_every_gpu_with_measured_moe_layers_runs_its_own_table():
    """Every GPU AIConfigurator timed vLLM's MoE layer on has its curves committed (issue
    #32: the A100, L40S and RTX PRO 6000 ran their fitted form before; the A100's rows are
    vLLM 0.14's only, power-law routing) and runs them, borrowing nobody's."""
    assert set(moe_derive.MOE_GPUS.values()) == set(aic_kernels.AIC_GPUS.values())
    t = np.array([1.0, 16.0, 512.0, 4096.0])
    for name in aic_kernels.AIC_GPUS.values():
        gpu = resolve_gpu(name)
        assert moe_table.has_table(name) and moe_table.lent(gpu) is None, name
    for name, tp in (("a100-sxm", 4), ("l40s", 2), ("rtx-pro-6000", 1)):
        gpu = resolve_gpu(name)
        c = coefficients(gpu)
        us = moe_table.curve(name, "bf16", 2048, 768, 128, 8, tp, 1)
        assert us is not None, name
        got = moe_time(QWEN3_30B, gpu, tp, t, c)
        assert got == pytest.approx(moe_table.seconds(us, t)), name
        assert not np.allclose(got, moe_time(QWEN3_30B, gpu, tp, t, c, use_table=False))


def test_a_gpu_without_moe_data_borrows_the_table_of_the_nearest_gpu_on_its_moe_kernel():
    """vLLM 0.33 runs a bf16 MoE layer with FlashInfer on Blackwell (SM 10.x TRT-LLM or
    CUTLASS, SM 12.0 CUTLASS) and Triton's ``fused_moe`` elsewhere (Ampere and Ada have no
    FlashInfer MoE kernel; SM 9.0 puts it behind Triton): a GPU without MoE data borrows the
    group and the table of its nearest measured GPU running the same kernel, as the fit holds
    each measured GPU out (the B200 from the RTX PRO 6000, not the H100; the L40S from the
    A100, not the RTX PRO 6000), and the L4, RTX 4090, A40 and A10G now run a measured table
    scaled rather than a form."""
    kernels = {g: moe_kernel(resolve_gpu(g)) for g in (
        "b200", "b300", "gb200", "rtx-pro-6000", "h100-sxm", "h100-pcie", "h200", "l40s",
        "l4", "rtx4090", "a100-sxm", "a40", "a10g")}
    assert {g for g, k in kernels.items() if k == "flashinfer"} == {
        "b200", "b300", "gb200", "rtx-pro-6000"}
    lenders = {"b300": "b200", "gb200": "b200", "h100-pcie": "h100-sxm", "l4": "l40s",
               "rtx4090": "l40s", "a40": "a100-sxm", "a10g": "a100-sxm"}
    for g, src in lenders.items():
        assert group_sources(g)["moe"] == src, g
        lent = moe_table.lent(resolve_gpu(g))
        assert lent is not None and lent.name == src, g
        assert kernels[g] == kernels[src]
    have = measurements.families_with_data(measurements.load(None))
    held = {g: measurements.borrow_source(g, "moe", have) for g in sorted(have["moe"])}
    assert held == {"a100-sxm": "h100-sxm", "b200": "rtx-pro-6000", "h100-sxm": "h200",
                    "h200": "h100-sxm", "l40s": "a100-sxm", "rtx-pro-6000": "b200"}
    # the L4 at TP 4: the L40S's measured curve scaled per regime by the two data sheets
    l4, l40s = resolve_gpu("l4"), resolve_gpu("l40s")
    c = coefficients(l4)
    t = np.array([1.0, 16.0, 512.0, 4096.0])
    want = lent_moe_seconds(l4, l40s, c, "bf16", "bf16", 2048, 768, 128, 8, 4, 1, t)
    assert want is not None
    assert moe_time(QWEN3_30B, l4, 4, t, c) == pytest.approx(want)
    assert not np.allclose(want, moe_time(QWEN3_30B, l4, 4, t, c, use_table=False))


#: DeepSeek-V3's MoE layers (config.json: hidden 7168, 256 experts of width 2048, top 8).
DEEPSEEK_V3 = ModelConfig("deepseek-v3-shape", 7168, 61, 128, 128, 128, 18432, 129280, 163840,
                          num_experts=256, num_experts_per_tok=8, moe_intermediate_size=2048)


def test_a_blackwell_bf16_table_holds_only_the_flashinfer_kernel_vllm_runs_there():
    """vLLM 0.33 runs bf16 experts with FlashInfer on the B200 and the RTX PRO 6000: the older
    collectors' Triton ``fused_moe`` curves (vLLM 0.19, 0.22) of shapes vLLM 0.24's collector
    did not time are not what it runs (on the B200 Triton takes mostly 1.1-1.7x the TRT-LLM
    kernel on the shapes both timed), so those shapes run the GPU's fitted form, which is
    fitted on its FlashInfer rows. Hopper, Ada and Ampere keep their Triton curves (those
    with the tiles vLLM runs today, the next test)."""
    assert moe_table.row_kernel("vllm_fused_moe") == "triton"
    assert moe_table.row_kernel("vllm_unquantizedfusedmoe_triton_tritonexperts") == "triton"
    assert moe_table.row_kernel(
        "vllm_unquantizedfusedmoe_flashinfer_trtllm_trtllmbf16experts") == "flashinfer"
    assert not moe_table.runs_kernel("b200", "bf16", "vllm_fused_moe")
    assert not moe_table.runs_kernel("rtx-pro-6000", "bf16", "vllm_fused_moe")
    assert moe_table.runs_kernel("b200", "fp8_block_triton", "vllm_fused_moe")  # next test
    assert moe_table.runs_kernel("h100-sxm", "bf16", "vllm_fused_moe")
    assert not moe_table.runs_kernel("h100-sxm", "bf16",
                                      "vllm_unquantizedfusedmoe_flashinfer_cutlass_"
                                      "flashinferexperts")
    for gpu in ("b200", "rtx-pro-6000"):
        assert moe_table.curve(gpu, "bf16", 7168, 2048, 256, 8, 1, 1) is None, gpu
        assert moe_table.curve(gpu, "bf16", 2048, 768, 128, 8, 1, 1) is not None, gpu
    for gpu in ("h100-sxm", "h200"):
        assert moe_table.curve(gpu, "bf16", 7168, 2048, 256, 8, 1, 1) is not None, gpu
    b200 = resolve_gpu("b200")
    c = coefficients(b200)
    t = np.array([1.0, 16.0, 512.0, 4096.0])
    assert moe_time(DEEPSEEK_V3, b200, 8, t, c) == pytest.approx(
        moe_time(DEEPSEEK_V3, b200, 8, t, c, use_table=False))


def test_a_triton_curve_counts_only_with_the_tiles_vllm_runs_today():
    """vLLM 0.17 made Triton ``fused_moe``'s default tiles grow with the tokens; the A100's only
    rows are vLLM 0.14's, so only its shapes with a tuned config (shipped in 0.14 and 0.33
    alike) time what vLLM runs there now: Qwen3-30B-A3B at TP 4 (128 experts of width 192 on a
    rank) stays, at TP 1 (width 768: the old default tiles) it does not, and the A100's MoE
    group is fitted on the rows that stay."""
    assert not moe_table.current_tiles("a100-sxm", "0.14.0", 128, 768, 1, 1)
    assert moe_table.current_tiles("a100-sxm", "0.14.0", 128, 768, 4, 1)
    assert moe_table.current_tiles("a100-sxm", "0.14.0", 8, 14336, 2, 1)  # Mixtral, TP 2
    assert moe_table.current_tiles("h100-sxm", "0.24.0", 128, 768, 1, 1)
    assert moe_table.current_tiles("l40s", "0.22.0", 384, 2048, 1, 1)
    assert moe_table.curve("a100-sxm", "bf16", 2048, 768, 128, 8, 1, 1) is None
    assert moe_table.curve("a100-sxm", "bf16", 2048, 768, 128, 8, 4, 1) is not None
    assert moe_table.curve("l40s", "bf16", 7168, 2048, 256, 8, 1, 1) is None  # vLLM 0.14's
    assert moe_table.curve("h100-sxm", "bf16", 2048, 768, 128, 8, 1, 1) is not None
    fit = {(r.experts, r.inter // r.tp) for r in aic_kernels.read_points()[1]
           if r.gpu == "a100-sxm" and r.dtype == "bf16"}
    assert fit and all(moe_table.current_tiles("a100-sxm", "0.14.0", e, n, 1, 1)
                       for e, n in fit)


#: Qwen3-235B-A22B's MoE layers (config.json: hidden 4096, 128 experts of width 1536, top 8)
#: in an INT4 W4A16 export (AWQ / GPTQ, groups of 128): a shape vLLM 0.24's collector did not
#: time in INT4.
QWEN3_235B_INT4 = ModelConfig("qwen3-235b-int4-shape", 4096, 94, 64, 4, 128, 1536, 151936,
                              40960, num_experts=128, num_experts_per_tok=8,
                              moe_intermediate_size=1536, weight_dtype="int4_g128",
                              quantization="compressed-tensors")


def test_int4_rows_count_except_the_op_that_times_marlin_slower_than_vllm_runs_it():
    """vLLM runs INT4 W4A16 experts with Marlin (``CompressedTensorsWNA16MarlinMoEMethod``);
    the 0.18-0.22 collectors' ``vllm_marlin_int4_moe`` rows take 2.2-2.6x as long as vLLM
    0.24's collector at the one shape both timed, so the committed table leaves them out and
    keeps 0.24's and 0.14's (``vllm_marlin_moe``, which agrees with 0.24's)."""
    row = {"kernel_source": "vllm_marlin_int4_moe", "num_experts": "384", "inter_size": "2048",
           "moe_tp_size": "1", "moe_ep_size": "1"}
    assert not moe_table.counts("h100-sxm", "int4", "0.19.0", row)
    assert not moe_table.counts("l40s", "int4", "0.22.0", row)
    assert moe_table.counts("h100-sxm", "int4", "0.14.0", dict(
        row, kernel_source="vllm_marlin_moe"))
    assert moe_table.counts("h100-sxm", "int4", "0.24.0", dict(
        row, kernel_source="vllm_compressedtensorswna16marlinmoe_marlin_marlinexperts"))
    assert moe_table.counts("h100-sxm", "fp8_block", "0.19.0", dict(
        row, kernel_source="vllm_fused_moe"))  # other formats keep their older rows
    with moe_table.MOE_PATH.open() as fh:
        versions = {line.split(",")[1] for line in fh
                    if not line.startswith("#") and line.split(",")[2:3] == ["int4"]}
    assert versions == {"0.14.0", "0.24.0"}


@pytest.mark.skipif(not SHARED.is_dir(), reason="raw data not beside this checkout")
def test_the_left_out_int4_rows_are_slower_than_vllms_marlin_at_the_same_shape():
    """The evidence for the rule above, from the raw tables: at Kimi-K2's shape (7168 x 2048,
    384 experts, top 8, power-law routing) the H100's ``vllm_marlin_int4_moe`` rows (vLLM
    0.19) take over 1.5x vLLM 0.24's at nearly every token count and split, over 2x at the
    median; vLLM 0.14's ``vllm_marlin_moe`` rows within 10% of 0.24's at the median."""
    import csv
    import gzip

    def load(version: str) -> dict[tuple[str, str, str], float]:
        path = SHARED / "aiconfigurator-vllm" / "h100_sxm" / version / "moe_perf.csv.gz"
        with gzip.open(path, "rt", newline="") as fh:
            return {(r["moe_tp_size"], r["moe_ep_size"], r["num_tokens"]): float(r["latency"])
                    for r in csv.DictReader(fh)
                    if r["moe_dtype"] == "int4_wo" and r["distribution"] == "power_law_1.01"
                    and (r["hidden_size"], r["inter_size"], r["num_experts"], r["topk"])
                    == ("7168", "2048", "384", "8")}

    old, new, first = load("0.19.0"), load("0.24.0"), load("0.14.0")
    ratio = np.array([old[k] / new[k] for k in sorted(set(old) & set(new))])
    assert len(ratio) >= 100
    assert np.median(ratio) > 2.0 and np.percentile(ratio, 10) > 1.5
    agree = np.array([first[k] / new[k] for k in sorted(set(first) & set(new))])
    assert len(agree) >= 50 and abs(np.median(agree) - 1.0) < 0.1


def test_an_int4_moe_shape_the_table_lacks_borrows_the_nearest_timed_marlin_curve():
    """Qwen3-235B's INT4 experts on the B200 at TP 4: its table times INT4 (Marlin, as vLLM
    runs it) at Kimi-K2's shape only, so the layer is that curve at the same split scaled by
    the fitted form's ratio of the two shapes. It streams the experts at over 2 TB/s at 64
    tokens (every expert touched), as Marlin does at Kimi's shape; the left-out curve of this
    shape, which the engine ran before, streamed them at 0.6 TB/s."""
    gpu = resolve_gpu("b200")
    c = coefficients(gpu)
    assert moe_table.curve("b200", "int4", 4096, 1536, 128, 8, 4, 1) is None
    us = other_shape_curve(gpu, c, "int4", 4096, 1536, 128, 8, 4, 1, 3, "int4_g128")
    kimi = moe_table.curve("b200", "int4", 7168, 2048, 384, 8, 4, 1)
    assert us is not None and kimi is not None
    t = np.array(moe_table.TOKENS, dtype=np.float64)
    assert moe_time(QWEN3_235B_INT4, gpu, 4, t, c, "int4_g128") == pytest.approx(
        moe_table.seconds(us, t))
    ratio = (moe_form(t, 4096, 1536 / 4, 8, 128, 3, gpu, c, "int4_g128")
             / moe_form(t, 7168, 2048 / 4, 8, 384, 3, gpu, c, "int4_g128"))
    assert us == pytest.approx(kimi * ratio)
    at64 = moe_time(QWEN3_235B_INT4, gpu, 4, np.array([64.0]), c, "int4_g128")[0]
    weights = 128 * 4096 * 1536 / 4 * 3 * 0.515625  # bytes: every expert, INT4 + scales
    assert weights / at64 > 2.0e12
    # no INT4 curve at a split the table lacks: the fitted form
    assert other_shape_curve(gpu, c, "int4", 4096, 1536, 128, 8, 16, 1) is None


def test_the_borrowed_int4_curve_predicts_the_int4_shapes_the_hopper_tables_time():
    """Held out: Kimi-K2's INT4 curve scaled by the fitted form predicts the H100's and H200's
    other INT4 curves (vLLM 0.14's Marlin: Mixtral, Qwen3, DeepSeek-V3 shapes) within 14% at
    the median over shapes, splits and 1-16,384 tokens, more than twice as close as the form
    alone (33%)."""
    t = np.array(moe_table.TOKENS, dtype=np.float64)
    borrowed, form = [], []
    for name in ("h100-sxm", "h200"):
        gpu = resolve_gpu(name)
        c = coefficients(gpu)
        for (h, i, e, k, tp, ep), us in moe_table.curves(name, "int4").items():
            kimi = moe_table.curve(name, "int4", 7168, 2048, 384, 8, tp, ep)
            if (h, i, e, k) == (7168, 2048, 384, 8) or kimi is None:
                continue
            f = moe_form(t, h, i / tp, k / ep, e / ep, 3, gpu, c, "int4_g128")
            f2 = moe_form(t, 7168, 2048 / tp, 8 / ep, 384 / ep, 3, gpu, c, "int4_g128")
            borrowed.append(kimi * f / f2 / us - 1.0)
            form.append(f * 1e6 / us - 1.0)
    assert len(borrowed) >= 60
    b, f = np.abs(np.concatenate(borrowed)), np.abs(np.concatenate(form))
    assert np.median(b) < 0.15 and np.median(f) > 2 * np.median(b)


def test_block_fp8_on_sm100_counts_triton_rows_only_as_the_triton_fallback():
    """vLLM runs block-FP8 experts with FlashInfer TRT-LLM on the B200 (0.24's collector times
    that); the older collectors' Triton ``fused_moe`` rows there take 1.5-1.6x as long on the
    shapes both timed, so they count only for ``fp8_block_triton`` (FlashInfer and DeepGEMM
    turned off). A shape only they timed has no ``fp8_block`` curve; Hopper and the RTX PRO
    6000 (no FlashInfer rows to say otherwise) keep their Triton rows."""
    assert not moe_table.runs_kernel("b200", "fp8_block", "vllm_fused_moe")
    assert moe_table.runs_kernel("b200", "fp8_block_triton", "vllm_fused_moe")
    assert moe_table.runs_kernel(
        "b200", "fp8_block", "vllm_fp8moe_flashinfer_trtllm_trtllmfp8expertsmonolithic")
    assert moe_table.runs_kernel("h100-sxm", "fp8_block", "vllm_fused_moe")
    assert moe_table.runs_kernel("rtx-pro-6000", "fp8_block", "vllm_fused_moe")
    assert moe_table.curve("b200", "fp8_block", 4096, 2688, 512, 22, 1, 2) is None
    assert moe_table.curve("b200", "fp8_block_triton", 4096, 2688, 512, 22, 1, 2) is not None
    assert moe_table.curve("b200", "fp8_block", 3072, 1536, 256, 8, 4, 1) is not None
