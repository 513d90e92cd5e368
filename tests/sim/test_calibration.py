"""The step-time model against Vidur's measured GPU timings (see chunktune.sim.calibration)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.sim import calibration, kernel_data
from chunktune.sim.collectives import VIDUR_TOPOLOGIES
from chunktune.sim.cost_model import AttentionShape, StepCostModel, attention_layer_time

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


#: Regression thresholds on the committed data: a little above what the committed fit measures
#: (``python -m chunktune.sim.calibration report``), per (dataset, mode), on the median over
#: slices of the per-slice median relative error, and on the worst slice.
THRESHOLDS = {
    ("vidur-linear", "in-sample"): (0.04, 0.045),
    ("vidur-linear", "loo-model"): (0.045, 0.05),
    ("vidur-linear", "loo-gpu"): (0.04, 0.05),
    ("llmss-linear", "in-sample"): (0.03, 0.035),
    ("llmss-linear", "loo-model"): (0.045, 0.05),
    ("llmss-linear", "loo-gpu"): (0.15, 0.18),
    ("llmss-attention", "in-sample"): (0.105, 0.135),
    ("llmss-attention", "loo-model"): (0.08, 0.10),
    ("llmss-attention", "loo-gpu"): (0.135, 0.14),
    # NCCL all-reduce (chunktune.sim.collectives), committed sub-sample: 7.8% / worst 13.4% in
    # sample; 25.1% / worst 34.1% with each GPU generation held out (its NVSwitch unseen)
    ("vidur-allreduce", "in-sample"): (0.085, 0.145),
    ("vidur-allreduce", "loo-gpu"): (0.27, 0.37),
}


@pytest.fixture(scope="module")
def report_rows():
    return calibration.full_report(None)


def test_calibration_report_regression(report_rows):
    """The committed fit on the committed derived tables: every slice reported, and no
    (dataset, mode) worse than its threshold."""
    print()
    print(calibration.format_rows(report_rows))
    summary = calibration.summarize(report_rows)
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
    for family in ("ada", "blackwell", "hopper"):
        coef = calibration.attention_coeffs(family)
        c = calibration.coefficients(family)
        a = calibration._attention_arrays(pts)
        vec = calibration.predict_attention_us(coef, a)
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


@pytest.mark.skipif(not SHARED.is_dir(), reason="raw data not beside this checkout")
def test_committed_tables_match_raw_data():
    derived = {(s.gpu, s.model, s.tp, s.tokens): s.per_layer_ms
               for s in calibration.read_derived()}
    raw = calibration.derive(SHARED / "vidur-profiling")
    assert len(raw) == len(derived)
    for s in raw:
        assert derived[(s.gpu, s.model, s.tp, s.tokens)] == pytest.approx(s.per_layer_ms,
                                                                         abs=1e-4)
    att, lin = kernel_data.read_points()
    raw_att = kernel_data.committed_subset(kernel_data.read_attention(SHARED))
    assert set(att) == {
        kernel_data.AttentionPoint(p.gpu, p.model, p.tp, p.chunk, p.kv_prefill, p.decodes,
                                   p.kv_decode, float(f"{p.us:.6g}")) for p in raw_att}
    assert len(att) == len(raw_att)
    assert len(lin) == len(kernel_data.read_llmss_linear(SHARED))


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
    # 16k tokens, whole and in 512-token chunks (4512.8 ms published): the model is 25% and 18%
    # low. The published 16k/8k ratio (2.37) needs attention ~2.4x slower than the
    # FlashAttention-2 rates the model extrapolates to A100; the all-reduce does not explain it
    # (138 ms of the 3.3 s). A PCIe all-reduce efficiency fitted to this test used to hide it.
    assert 0.70 <= m.prefill_time(16384) * 1e3 / published[16384] <= 0.85
    assert 0.75 <= m.prefill_time(16383, 512) * 1e3 / 4512.8 <= 0.90


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
