"""The step-time model against Vidur's measured GPU timings (see chunktune.sim.cost.kernel_fit)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.sim.cost import kernel_data, kernel_fit
from chunktune.sim.cost.collectives import VIDUR_TOPOLOGIES
from chunktune.sim.cost.step_time import (
    AttentionShape,
    StepCostModel,
    attention_layer_time,
    l2_hit_fraction,
    longest_cta_time,
    reread_hit_fraction,
)

SHARED = Path(__file__).resolve().parents[4] / "shared" / "data"


#: Regression thresholds on the committed data: a little above what the committed fit measures
#: (``python -m chunktune.sim.cost.kernel_fit report``), per (dataset, mode), on the median over
#: slices of the per-slice median relative error, and on the worst slice.
THRESHOLDS = {
    ("vidur-linear", "in-sample"): (0.04, 0.045),
    ("vidur-linear", "loo-model"): (0.045, 0.05),
    ("vidur-linear", "loo-gpu"): (0.04, 0.05),
    ("llmss-linear", "in-sample"): (0.03, 0.035),
    ("llmss-linear", "loo-model"): (0.045, 0.05),
    # 13.7% (worst 16.7%) before the fit also weighed each operator: the RTX 4090's GEMMs at
    # 138% of its data sheet then transferred to the PRO 6000 better than its real 97% do
    ("llmss-linear", "loo-gpu"): (0.16, 0.185),
    ("llmss-attention", "in-sample"): (0.08, 0.11),
    # the sub-grid's 445 points per set: 8.3% / worst 10.0% (7.9% / 8.7% on the full grid)
    ("llmss-attention", "loo-model"): (0.09, 0.105),
    # 9.5% / worst 10.6% here (14.5% / 21.6% before the query tiles' work beside the MMAs ran
    # at SMs x clock under FlashAttention 2); 9.2% / 9.4% on the full grid
    # (test_attention_leave_one_gpu_out_full_grid)
    ("llmss-attention", "loo-gpu"): (0.10, 0.115),
    # NCCL all-reduce (chunktune.sim.cost.collectives), committed sub-sample: 7.8% / worst 13.4% in
    # sample; 25.1% / worst 34.1% with each GPU generation held out (its NVSwitch unseen)
    ("vidur-allreduce", "in-sample"): (0.085, 0.145),
    ("vidur-allreduce", "loo-gpu"): (0.27, 0.37),
}


@pytest.fixture(scope="module")
def report_rows():
    return kernel_fit.full_report(None)


def test_calibration_report_regression(report_rows):
    """The committed fit on the committed derived tables: every slice reported, and no
    (dataset, mode) worse than its threshold."""
    print()
    print(kernel_fit.format_rows(report_rows))
    summary = kernel_fit.summarize(report_rows)
    for key, (median_max, worst_max) in THRESHOLDS.items():
        assert key in summary, f"{key} missing from the report"
        worst = max(r.median_rel_err for r in report_rows if (r.dataset, r.mode) == key)
        assert summary[key] <= median_max, (key, summary[key])
        assert worst <= worst_max, (key, worst)
    assert all(r.n > 0 and r.p90_rel_err >= r.median_rel_err for r in report_rows)
    sets = {r.slice for r in report_rows
            if r.dataset == "llmss-attention" and r.mode == "in-sample"}
    assert len([s for s in sets if " tp" in s]) == 7  # 4090 Llama-8B; PRO 6000: 3 models x TP 1/2
    assert {"rtx4090 decodes alone", "rtx-pro-6000 mixed"} <= sets


def test_vectorized_attention_matches_the_engine_path():
    """The fit's array form and the simulator's per-step form are the same function."""
    att, _ = kernel_data.read_points()
    pts = att[::97]
    # the RTX points, and the same batches on an H100 (FlashAttention 3)
    pts = pts + [dataclasses.replace(p, gpu="h100-sxm") for p in pts]
    for family in ("ada", "blackwell", "hopper"):
        coef = kernel_fit.attention_coeffs(family)
        c = kernel_fit.coefficients(family)
        a = kernel_fit._attention_arrays(pts)
        vec = kernel_fit.predict_attention_us(coef, a)
        for p, v in zip(pts, vec, strict=True):
            s = AttentionShape.of(resolve_model(p.model), p.tp)
            one = attention_layer_time(s, resolve_gpu(p.gpu), c,
                                       [(p.chunk, p.kv_prefill)] if p.chunk else [],
                                       p.decodes, p.decodes * p.kv_decode) * 1e6
            assert one == pytest.approx(v, rel=1e-9)


def test_attention_shape_follows_tensor_parallelism():
    m = resolve_model("qwen3-32b")
    one, two = AttentionShape.of(m, 1), AttentionShape.of(m, 2)
    assert (one.heads, one.kv_heads) == (64, 8) and (two.heads, two.kv_heads) == (32, 4)
    cm1 = StepCostModel(m, resolve_gpu("rtx-pro-6000"), 1)
    cm2 = StepCostModel(m, resolve_gpu("rtx-pro-6000"), 2)
    # a decode's attention reads half the KV per rank at TP2
    d1 = cm1.attention_time([], 32, 32 * 4096)
    d2 = cm2.attention_time([], 32, 32 * 4096)
    assert d2 < 0.7 * d1


def test_mixed_batches_cost_more_than_their_parts():
    """Measured: decodes beside a prefill run in the varlen prefill kernel and cost far more
    than alone (RTX 4090 Llama-8B: 128 decodes at 1k beside a 512 chunk 1545 us, alone
    606 us + 41 us)."""
    cm = StepCostModel(resolve_model("llama-3.1-8b"), resolve_gpu("rtx4090"), 1)
    alone = cm.attention_time([], 128, 128 * 1024) + cm.attention_time([(512, 0)], 0, 0)
    mixed = cm.attention_time([(512, 0)], 128, 128 * 1024)
    assert mixed > 1.5 * alone


def test_decode_rereads_hit_l2_only_while_one_kv_head_fits():
    """The decodes' per-query-head KV re-reads come from L2 where the group's query heads run
    in the same wave or while one KV head's KV of every decode fits the data sheet's L2, the
    rest from HBM again."""
    mib = 2.0**20
    assert l2_hit_fraction(72 * mib, 8 * mib) == 1.0
    assert l2_hit_fraction(72 * mib, 144 * mib) == pytest.approx(0.5)
    assert list(l2_hit_fraction(np.array([72 * mib, 128 * mib]), 256 * mib)) == \
        pytest.approx([72 / 256, 128 / 256])
    s = AttentionShape.of(resolve_model("llama-3.1-8b"), 1)
    gpu = resolve_gpu("rtx-pro-6000")
    small_l2 = dataclasses.replace(gpu, l2_mib=6.0)
    c = kernel_fit.coefficients(gpu.family)
    # 128 decodes at 1k: 1.5 query heads per wave of 188 CTAs; one KV head's K and V
    # (64 MiB) fit 128 MiB, not 6 MiB
    fits = attention_layer_time(s, gpu, c, [(256, 0)], 128, 128 * 1024)
    assert attention_layer_time(s, small_l2, c, [(256, 0)], 128, 128 * 1024) > 1.05 * fits
    # 16 decodes: a wave holds the whole group of 4 query heads, the L2 size does not matter
    assert attention_layer_time(s, small_l2, c, [(256, 0)], 16, 16 * 1024) == \
        attention_layer_time(s, gpu, c, [(256, 0)], 16, 16 * 1024)
    # heads at once: 188 / 128 = 1.47 of a group of 4 -> 16% of the re-reads; 128 SMs: none
    assert reread_hit_fraction(0.0, 1.0, 188, 128, 4) == pytest.approx((188 / 128 - 1) / 3)
    assert reread_hit_fraction(0.0, 1.0, 128, 128, 4) == 0.0
    assert reread_hit_fraction(0.0, 1.0, 128, 32, 4) == 1.0
    # a prefill alone re-reads no decode KV: the L2 size does not matter
    assert attention_layer_time(s, small_l2, c, [(2048, 4096)], 0, 0) == \
        attention_layer_time(s, gpu, c, [(2048, 4096)], 0, 0)


def test_fixed_cost_per_wave_of_ctas():
    """The varlen kernel's fixed cost is per wave of CTAs over the SMs: 32 heads x 4 tiles
    are one wave on the RTX 4090's 128 SMs, 32 x 5 two; on the 188-SM RTX PRO 6000 both one."""
    s = AttentionShape.of(resolve_model("llama-3.1-8b"), 1)
    for name, waves in (("rtx4090", (1, 2)), ("rtx-pro-6000", (1, 1))):
        gpu = resolve_gpu(name)
        c = kernel_fit.coefficients(gpu.family)
        free = dataclasses.replace(c, attn_per_wave_s=0.0)
        for chunk, w in zip((256, 320), waves, strict=True):
            extra = (attention_layer_time(s, gpu, c, [(chunk, 0)], 0, 0)
                     - attention_layer_time(s, gpu, free, [(chunk, 0)], 0, 0))
            assert extra == pytest.approx(w * c.attn_per_wave_s)
            assert w == math.ceil(32 * math.ceil(chunk / 64) / gpu.sm_count)


def test_one_cta_is_not_as_fast_as_the_tensor_cores():
    """One CTA's MMAs run at its SM's share of the tensor peak, the rest at the SM clock: the
    RTX PRO 6000's SM does twice the RTX 4090's bf16 FLOPs per cycle at about the same clock,
    yet a one-tile prefill after 16k tokens took 0.71 of the 4090's time (measured, Llama-3.1-8B
    TP1: 520 us on the 4090)."""
    assert longest_cta_time(1e9, 1e12, 2e9, 0.0, 2.0) == pytest.approx(1e-3)
    assert longest_cta_time(1e9, 1e12, 2e9, 1e-3, 1.0) == pytest.approx(1.5e-3)
    s = AttentionShape.of(resolve_model("llama-3.1-8b"), 1)
    c = kernel_fit.coefficients("ada")  # the same coefficients on both cards
    t = {g: attention_layer_time(s, resolve_gpu(g), c, [(16, 16384)], 0, 0)
         for g in ("rtx4090", "rtx-pro-6000")}
    assert 0.6 < t["rtx-pro-6000"] / t["rtx4090"] < 0.85
    assert t["rtx4090"] * 1e6 == pytest.approx(520, rel=0.2)


def test_flash_attention_2_runs_the_tiles_beside_their_mmas():
    """Where vLLM runs FlashAttention 2 (every card but Hopper) the query tiles' softmax and
    loads take SM cycles beside their MMAs; FlashAttention 3 (Hopper) overlaps them. Measured
    (LLMServingSim, Llama-3.1-8B TP1): a 2,048-token chunk over 16k of context takes 4,225 us
    on the RTX 4090 and 2,138 us on the RTX PRO 6000, 1.98x, where their bf16 peaks say 2.93x."""
    from chunktune.core.gpus import GPUS

    assert {g.name for g in GPUS.values() if g.flash_attention == 3} == {
        "h100-sxm", "h100-pcie", "h200"}
    s = AttentionShape.of(resolve_model("llama-3.1-8b"), 1)
    c = kernel_fit.coefficients("ada")  # the same coefficients on both cards
    t = {g: attention_layer_time(s, resolve_gpu(g), c, [(2048, 16384)], 0, 0)
         for g in ("rtx4090", "rtx-pro-6000")}
    assert 1.7 < t["rtx4090"] / t["rtx-pro-6000"] < 2.2
    # the same batch on an H100 under each generation: FlashAttention 3 runs the tiles at the
    # tensor peak (over 0.5 of it here), FlashAttention 2 would hold them near 0.2
    h100 = resolve_gpu("h100-sxm")
    hc = kernel_fit.coefficients(h100.family)
    fa3 = attention_layer_time(s, h100, hc, [(2048, 16384)], 0, 0)
    fa2 = attention_layer_time(s, dataclasses.replace(h100, flash_attention=2), hc,
                               [(2048, 16384)], 0, 0)
    flops = 4.0 * 128 * 32 * (2048 * 16384 + 2048 * 2048 / 2)
    assert flops / fa3 > 0.5 * h100.bf16_tflops * 1e12
    assert flops / fa2 < 0.3 * h100.bf16_tflops * 1e12
    # decodes beside the chunk add their padded MMAs either way
    assert attention_layer_time(s, h100, hc, [(2048, 16384)], 64, 64 * 4096) > fa3


def test_every_catalog_gpu_has_the_attention_figures():
    """L2 size and boost clock are data-sheet figures the attention term needs; a GPU without
    them is refused by name."""
    from chunktune.core.gpus import GPUS

    for g in GPUS.values():
        assert g.l2_mib > 0 and g.boost_mhz > 0 and g.sm_count > 0, g.name
    bare = dataclasses.replace(resolve_gpu("h200"), name="b200", l2_mib=0.0)
    with pytest.raises(ValueError, match=r"b200.*l2_mib and boost_mhz"):
        StepCostModel(resolve_model("llama-3.1-8b"), bare)


@pytest.mark.skipif(not SHARED.is_dir(), reason="raw data not beside this checkout")
def test_attention_leave_one_gpu_out_full_grid():
    """Each RTX card's full attention grid predicted from the other card's fit and its own
    data sheet (median |error| 9.0% PRO 6000, 9.4% RTX 4090 when committed; 11.3% and 9.4%
    before the query tiles' work beside the MMAs ran at SMs x clock (FlashAttention 2), 13.6%
    and 9.9% before the decodes' re-reads shared by the query heads of one wave)."""
    att = kernel_data.read_attention(SHARED)
    med = {}
    for g in ("rtx-pro-6000", "rtx4090"):
        c = kernel_fit.fit_attention([p for p in att if p.gpu != g])
        med[g] = float(np.median(kernel_fit.attention_errors(c, [p for p in att
                                                                    if p.gpu == g])))
    print(med)
    assert med["rtx-pro-6000"] <= 0.095 and med["rtx4090"] <= 0.10


@pytest.mark.skipif(not SHARED.is_dir(), reason="raw data not beside this checkout")
def test_committed_tables_match_raw_data():
    derived = {(s.gpu, s.model, s.tp, s.tokens): s for s in kernel_fit.read_derived()}
    raw = kernel_fit.derive(SHARED / "vidur-profiling")
    assert len(raw) == len(derived)
    for s in raw:
        d = derived[(s.gpu, s.model, s.tp, s.tokens)]
        assert d.per_layer_ms == pytest.approx(s.per_layer_ms, abs=1e-4)
        assert len(s.ops) == len(kernel_data.LINEAR_FIT_OPS)
        assert d.ops == pytest.approx(s.ops, abs=1e-4)
    att, lin = kernel_data.read_points()
    raw_att = kernel_data.committed_subset(kernel_data.read_attention(SHARED))
    assert set(att) == {
        kernel_data.AttentionPoint(p.gpu, p.model, p.tp, p.chunk, p.kv_prefill, p.decodes,
                                   p.kv_decode, float(f"{p.us:.6g}")) for p in raw_att}
    assert len(att) == len(raw_att)
    raw_lin = kernel_data.read_llmss_linear(SHARED)
    assert len(lin) == len(raw_lin)
    for a, b in zip(lin, raw_lin, strict=True):
        assert (a.gpu, a.model, a.tp, a.tokens) == (b.gpu, b.model, b.tp, b.tokens)
        assert a.ops == pytest.approx(b.ops, rel=1e-5) and sum(a.ops) == pytest.approx(
            a.per_layer_ms, rel=1e-5)


def test_published_end_to_end_prefill_times():
    """Sarathi-Serve's Yi-34B TP2 A100-PCIe prefill times (osdi-experiments figure-2), which
    include attention and the all-reduces: within 20%. Its machine (Azure, 4 A100 80GB PCIe
    joined in pairs by NVLink bridges, as Vidur's ``a100_pairwise_nvlink``) runs TP2 over a
    bridge."""
    m = StepCostModel(resolve_model("yi-34b"), resolve_gpu("a100-pcie"), tp=2,
                      interconnect=VIDUR_TOPOLOGIES["a100_pairwise_nvlink"])
    published = {128: 48, 512: 106, 1024: 214, 2048: 366, 4096: 758, 8192: 1863, 16384: 4408}
    for tokens, ms in published.items():
        got = m.prefill_time(tokens) * 1e3
        print(f"prefill {tokens:>6}: published {ms:>5} ms, model {got:7.1f} ms")
        if tokens <= 8192:
            assert got == pytest.approx(ms, rel=0.20)
    # 16k tokens, whole and in 512-token chunks (4512.8 ms published): the model is 14% and 7%
    # low (25% and 18% while the query tiles ran at the bf16 peak: FlashAttention 2's work
    # beside the MMAs, fitted on the RTX cards, accounts for about half of the gap at 16k).
    # The published 16k/8k ratio (2.37) still needs slower attention; the all-reduce does not
    # explain it (138 ms of the 3.3 s). A PCIe all-reduce efficiency fitted to this test used to
    # hide it.
    assert 0.80 <= m.prefill_time(16384) * 1e3 / published[16384] <= 0.90
    assert 0.88 <= m.prefill_time(16383, 512) * 1e3 / 4512.8 <= 0.97


def test_decode_step_is_memory_bound_and_grows_with_batch():
    m = StepCostModel(resolve_model("llama-3.1-8b"), resolve_gpu("h100-sxm"))
    one = m.step_time(1, 1, 1, [], 1, 1000)
    many = m.step_time(128, 128, 128, [], 128, 128 * 1000)
    # weights (15 GB) at 3.35 TB/s: ~5 ms; vLLM V1 reports ~5 ms GPU time per small step
    assert 0.004 < one < 0.010
    assert one < many < 4 * one
    # piggybacked decodes are nearly free beside a prefill chunk (Sarathi table 2)
    chunk = m.step_time(1024, 1, 0, [(1024, 0)], 0, 0)
    hybrid = m.step_time(1024, 4, 3, [(1021, 0)], 3, 3000)
    assert hybrid < 1.05 * chunk


def test_linear_fit_separates_gemms_from_elementwise_kernels_on_one_model():
    """One (model, TP) measured per operator (as LLMServingSim's RTX 4090 set): the fit must
    recover each efficiency, which the per-layer sum alone cannot tell apart (it gave the RTX
    4090 GEMMs at 138% of the data sheet, paid back by elementwise kernels at 19%)."""
    from chunktune.sim.cost.step_time import coefficients, linear_op_times

    true = dataclasses.replace(coefficients("ada"), gemm_compute_eff=0.9,
                               gemm_memory_eff=0.85, gemm_smoothness=2.0,
                               elementwise_memory_eff=0.6)
    tok = np.array(list(range(1, 17)) + list(range(32, 2049, 32)), float)
    ops = linear_op_times(resolve_model("llama-3.1-8b"), resolve_gpu("rtx4090"), 1, tok, true)
    rng = np.random.default_rng(0)
    pts = []
    for j, t in enumerate(tok):  # 2% measurement noise on every operator
        o = tuple(float(ops[n][j] * 1e3 * np.exp(rng.normal(0, 0.02)))
                  for n in kernel_data.LINEAR_FIT_OPS)
        pts.append(kernel_data.LinearPoint("rtx4090", "llama-3.1-8b", 1, int(t), sum(o), o))
    got = kernel_fit.fit_linear(pts, "ada")
    for k in ("gemm_compute_eff", "gemm_memory_eff", "elementwise_memory_eff"):
        assert getattr(got, k) == pytest.approx(getattr(true, k), rel=0.03), k


def test_linear_operators_sum_to_the_layer():
    from chunktune.sim.cost.step_time import coefficients, linear_layer_time, linear_op_times

    tok = np.array([1.0, 64.0, 2048.0])
    for model in ("llama-3.1-8b", "qwen3-30b-a3b"):
        m, g = resolve_model(model), resolve_gpu("h100-sxm")
        c = coefficients(g.family)
        ops = linear_op_times(m, g, 2, tok, c)
        assert ("experts" in ops) == m.is_moe and ("up" in ops) != m.is_moe
        assert sum(ops.values()) == pytest.approx(linear_layer_time(m, g, 2, tok, c))
