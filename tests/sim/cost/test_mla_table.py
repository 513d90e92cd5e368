"""MLA layers timed from the GPU's measured MLA module (AIConfigurator's vLLM tables)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from chunktune.core.errors import SpecError
from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import from_hf_config
from chunktune.sim.cost import mla_table, moe_table
from chunktune.sim.cost.fit import mla_derive
from chunktune.sim.cost.step_time import StepCostModel, linear_op_times

ROOT = Path(__file__).resolve().parents[3]
SHARED = ROOT.parent / "shared" / "data"
CONFIGS = ROOT / "bench" / "data" / "e2e" / "model-configs"


def model(name: str):  # type: ignore[no-untyped-def]
    return from_hf_config(json.loads((CONFIGS / f"{name}_config.json").read_text()), name)


def test_decodes_and_prefills_interpolate_the_measured_module():
    t = mla_table.MlaTable.find("b200", "bf16", "bf16", 8)
    assert t is not None
    grid = dict(t.gen)
    # on the grid: the measured microseconds (8 heads a rank, 16 decodes of 1024 tokens)
    i = mla_table.STEPS.index(1024)
    assert t.decode_s(16, 1024) == pytest.approx(2.718281828 ** grid[16][i] * 1e-6, rel=1e-6)
    # between grid points: inside the bracket, growing with batch and context
    assert t.decode_s(16, 1024) < t.decode_s(24, 1024) < t.decode_s(32, 1024)
    assert t.decode_s(16, 1024) < t.decode_s(16, 1500) < t.decode_s(16, 2048)
    # a chunk after computed tokens costs what the longer prefill costs beyond the shorter
    whole, first = t.prefill_s(2048, 0), t.prefill_s(1024, 0)
    assert t.prefill_s(1024, 1024) == pytest.approx(max(whole - first, first))
    assert mla_table.MlaTable.find("b200", "bf16", "bf16", 3) is None


def test_an_mla_model_steps_through_its_measured_module():
    """Kimi-K2.5 (INT4 experts, bf16 attention, 64 heads) at TP 8 on the B200: every layer's
    attention is the module's at 8 heads (projections included: no qkv/o GEMMs beside it)."""
    kimi = model("moonshotai--Kimi-K2.5")
    gpu = resolve_gpu("b200")
    cost = StepCostModel(kimi, gpu, tp=8, max_tokens=1024)
    t = mla_table.MlaTable.find("b200", "bf16", "bf16", 8)
    assert t is not None
    assert cost.attention_time([], 16, 16 * 1024) == pytest.approx(
        kimi.num_hidden_layers * t.decode_s(16, 1024))
    assert cost.attention_time([(512, 1024)], 0, 0) == pytest.approx(
        kimi.num_hidden_layers * t.prefill_s(512, 1024))
    ops = linear_op_times(kimi, gpu, 8, np.array([16.0]), cost.c)
    assert set(ops) == {"experts", "elementwise"}
    # nor a rotary-embedding kernel beside it: the module applies RoPE (two norms, the
    # activation and the residual add are left; a dense layer's five kernels include RoPE)
    assert 4 * cost.c.elementwise_overhead_s < ops["elementwise"][0] \
        < 4.5 * cost.c.elementwise_overhead_s
    # an FP8 KV cache reads the FP8 rows
    fp8 = StepCostModel(kimi, gpu, tp=8, max_tokens=1024, kv_dtype_bytes=1)
    assert fp8.attention_time([], 16, 16 * 1024) != cost.attention_time([], 16, 16 * 1024)


def test_what_the_tables_do_not_time_is_refused_by_name():
    kimi = model("moonshotai--Kimi-K2.5")
    odd = kimi.with_overrides(kv_lora_rank=256)
    with pytest.raises(SpecError, match="kv_lora_rank"):
        StepCostModel(odd, resolve_gpu("b200"), tp=8, max_tokens=64)
    # the A100 runs another MLA backend (Triton's) than any GPU with a table: not borrowed
    with pytest.raises(SpecError, match="no measured MLA module on a100-sxm or a GPU it "
                                        "borrows from"):
        StepCostModel(kimi, resolve_gpu("a100-sxm"), tp=8, max_tokens=64)


def test_a_gpu_without_tables_borrows_its_family_neighbours_as_the_report_holds_out():
    """The B300 and GB200 (no MLA tables) run the B200's, the H100 PCIe the H100 SXM's
    (``MlaTable.lent``: the nearest GPU of the same compute capability family and memory
    kind), each point scaled by the two data sheets by the rule ``kernel_report.mla_report``
    holds every measured GPU out by (decode: what it reads from HBM beyond L2 at each GPU's
    bandwidth; prefill: above the launch floor by the dense peak): the committed
    ``mla_borrowing`` figures are that rule's error. The B300's sheet is the B200's at these
    terms (8 TB/s, 4,500 FP8 TFLOP/s, 126 MiB of L2): its borrowed module is the B200's; the
    H100 PCIe (2.0 TB/s, 1,513 TFLOP/s) is slower than the SXM. DeepSeek-V3 on 8 B300s ran
    into "no measured MLA module on b300" before."""
    b200, b300, gb200, pcie = (resolve_gpu(g) for g in ("b200", "b300", "gb200", "h100-pcie"))
    assert mla_table.MlaTable.lender(b300, "fp8_block", "bf16", 16) == "b200"
    assert mla_table.MlaTable.lender(gb200, "nvfp4", "fp8", 16) == "b200"
    assert mla_table.MlaTable.lender(pcie, "fp8_block", "bf16", 16) == "h100-sxm"
    assert mla_table.MlaTable.lender(b200, "fp8_block", "bf16", 16) is None  # its own
    for gpu in ("a100-sxm", "rtx-pro-6000", "l40s"):
        assert mla_table.table_lender(resolve_gpu(gpu)) is None, gpu
    own = mla_table.MlaTable.find("b200", "fp8_block", "bf16", 16)
    lent = mla_table.MlaTable.lent(b300, "fp8_block", "bf16", 16)
    sxm = mla_table.MlaTable.find("h100-sxm", "fp8_block", "bf16", 16)
    slow = mla_table.MlaTable.lent(pcie, "fp8_block", "bf16", 16)
    assert own and lent and sxm and slow
    for decodes, context in ((1, 128), (16, 4096), (256, 8192)):
        assert lent.decode_s(decodes, context) == pytest.approx(own.decode_s(decodes, context))
        assert slow.decode_s(decodes, context) >= sxm.decode_s(decodes, context)
    assert slow.decode_s(256, 8192) > 1.3 * sxm.decode_s(256, 8192)  # HBM: 3.35 / 2.0
    assert lent.prefill_s(4096, 0) == pytest.approx(own.prefill_s(4096, 0))
    assert slow.prefill_s(4096, 0) > 1.2 * sxm.prefill_s(4096, 0)  # FP8 peak: 1,979 / 1,513
    ds = model("deepseek-ai--DeepSeek-V3")
    cost = StepCostModel(ds, b300, tp=8, max_tokens=64)
    assert cost.attention_time([], 16, 16 * 4096) == pytest.approx(
        StepCostModel(ds, b200, tp=8, max_tokens=64).attention_time([], 16, 16 * 4096))
    rule = mla_table.borrowing()
    assert rule is not None and {"decode", "prefill", "held_out"} <= set(rule)


@pytest.mark.skipif(not SHARED.is_dir(), reason="raw data not beside this checkout")
def test_the_committed_mla_borrowing_is_what_the_report_holds_out():
    from chunktune.sim.cost.fit import kernel_report

    rule = kernel_report.mla_borrowing(mla_derive.served_curves(SHARED))
    assert rule == mla_table.borrowing()
    assert rule["decode"] == pytest.approx(0.0934, abs=5e-4)
    assert rule["prefill"] == pytest.approx(0.0769, abs=5e-4)


@pytest.mark.skipif(not SHARED.is_dir(), reason="raw data not beside this checkout")
def test_the_committed_table_is_what_the_raw_tables_give(tmp_path):
    out = tmp_path / "mla.csv"
    mla_derive.write(mla_derive.derive(SHARED), out)
    assert out.read_text() == mla_table.MLA_PATH.read_text()


def test_gpt_oss_windowed_layers_and_mxfp4_experts():
    """gpt-oss-120b: half its layers attend to a 128-token window (their decodes read at most
    128 tokens each, their prefill tiles at most the window before them), its MXFP4 experts
    come from the GPU's measured MXFP4 MoE layer, its bf16 attention projections from the
    bf16 GEMMs."""
    oss = model("openai--gpt-oss-120b")
    gpu = resolve_gpu("h200")
    cost = StepCostModel(oss, gpu, tp=1, max_tokens=1024)
    assert cost.weight_dtype == "bf16" and cost._windowed == 18
    full = StepCostModel(oss.with_overrides(layer_types=(), sliding_window=0), gpu, tp=1,
                         max_tokens=1024)
    # long contexts: the windowed layers cost far less than full ones
    assert cost.attention_time([], 16, 16 * 8000) < 0.7 * full.attention_time([], 16, 16 * 8000)
    assert cost.attention_time([(2048, 6000)], 0, 0) < 0.7 * full.attention_time(
        [(2048, 6000)], 0, 0)
    # short contexts inside the window: the same
    assert cost.attention_time([], 4, 4 * 100) == pytest.approx(full.attention_time([], 4, 400))
    us = moe_table.curve("h200", "mxfp4", 2880, 2880, 128, 4, 1, 1)
    assert us is not None
    ops = linear_op_times(oss, gpu, 1, np.array([16.0]), cost.c)
    router = ops["experts"][0] - moe_table.seconds(us, np.array([16.0]))[0]
    # the rest is the bf16 router GEMM (16 x 2880 x 128): 5.8 us from the H200's own measured
    # GEMM grid, a launch-bound kernel (4-5 us when the H200 borrowed the H100's fitted form)
    assert 0 < router < 1e-5


def test_a_dense_4bit_checkpoint_is_refused_by_name():
    llama = from_hf_config({
        "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
        "max_position_embeddings": 131072}, "llama")
    # INT4 W4A16 dense layers: no measured 4-bit dense GEMM of that kind (NVFP4 dense layers
    # on a GPU with a measured nvfp4 grid are timed: tests/sim/cost/test_fp4_dense.py)
    int4 = llama.with_overrides(quantization="compressed-tensors", weight_dtype="int4_g128")
    with pytest.raises(SpecError, match="int4_g128 attention linear layers"):
        StepCostModel(int4, resolve_gpu("b200"), tp=1, max_tokens=64)


def test_the_hopper_tables_run_without_the_native_norm_chain():
    """The H100's and H200's module tables timed RMSNorm and rotary through their native
    PyTorch chains (AIConfigurator re-collected only the B200's with vLLM's fused ops): the
    chain, as the B200 measured it, is taken off theirs. At 8 heads and 4 decodes the H200
    then runs about 48 us a layer (92 us as committed; the B200 38 us); at 128 heads and one
    decode it stays above the B200 by about what its slower HBM takes to stream the module's
    bf16 weights."""
    h200 = mla_table.MlaTable.find("h200", "bf16", "bf16", 8)
    b200 = mla_table.MlaTable.find("b200", "bf16", "bf16", 8)
    assert h200 is not None and b200 is not None
    assert 40e-6 < h200.decode_s(4, 1024) < 55e-6
    assert b200.decode_s(4, 1024) < h200.decode_s(4, 1024)
    chain = mla_table.norm_chain()
    assert chain[("gen", "bf16", "bf16", 8, 4)][0] == pytest.approx(44.4)
    # the committed curve less the chain on a Hopper GPU, unchanged on the B200
    key = ("h200", "gen", "bf16", "bf16", 8, 4)
    assert mla_table.measured_us(key, [92.3, 99.0]) == pytest.approx([47.9, 54.6])
    assert mla_table.measured_us(("b200", *key[1:]), [37.5]) == [37.5]
    # every Hopper curve has its chain, and stays positive without it
    for r in mla_table._rows(mla_table.MLA_PATH):
        k = (r["gpu"], r["kind"], r["gemm"], r["kv"], int(r["heads"]), int(r["batch"]))
        if k[0] in mla_table.NATIVE_NORM_CHAIN_GPUS:
            assert k[1:] in chain, k
            assert min(mla_table.measured_us(k, [float(u) for u in r["us"].split()])) > 0, k
    # 128 heads, one decode: 374 MB of bf16 weights take 78 us from the H200's HBM, 47 us
    # from the B200's
    big = {g: mla_table.MlaTable.find(g, "bf16", "bf16", 128) for g in ("h200", "b200")}
    gap = big["h200"].decode_s(1, 128) - big["b200"].decode_s(1, 128)  # type: ignore[union-attr]
    assert 15e-6 < gap < 45e-6
    # a prefill's chain grows with the prompt: taken off per prompt
    ctx = chain[("ctx", "bf16", "bf16", 8, 0)]
    assert len(ctx) == len(mla_table.PROMPTS) and ctx[-1] > ctx[0]
