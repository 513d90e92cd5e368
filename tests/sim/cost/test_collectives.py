"""The tensor-parallel all-reduce model (chunktune.sim.cost.collectives): vLLM's measured
all-reduce on NVLink, and NCCL's curve fitted to Vidur's collectives."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.sim.cost import aic_data
from chunktune.sim.cost import allreduce_backends as ab
from chunktune.sim.cost import collectives as col
from chunktune.sim.cost.fit import aic_kernels, kernel_data, nccl_fit
from chunktune.sim.cost.step_time import StepCostModel

SHARED = Path(__file__).resolve().parents[4] / "shared" / "data"
SIZES = np.geomspace(1e3, 1e9, 200)


def test_ring_factor():
    assert col.ring_factor(1) == 0.0
    assert [float(col.ring_factor(n)) for n in (2, 4, 8)] == [1.0, 1.5, 1.75]


@pytest.mark.parametrize("gpu", ["a100-sxm", "h100-sxm", "h200", "b200", "a100-pcie",
                                 "rtx-pro-6000"])
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_allreduce_grows_with_size_above_a_latency_floor(gpu, tp):
    g = resolve_gpu(gpu)
    t = col.tp_allreduce_s(SIZES, tp, g)
    assert np.all(np.diff(t) >= 0)
    assert t[0] >= 3e-6  # the fastest measured vLLM all-reduce: 4.3 us (H100, 2 ranks)
    if not g.nvlink:  # over PCIe: NCCL, bandwidth-bound at Vidur's PCIe ring efficiency
        c = col.collective_coefficients()
        # TP 2: NCCL's curve (Vidur's eager latency); above: NCCL's graphed latency, 13 / 24
        # us at 4 / 8 ranks on AIConfigurator's PCIe boxes
        assert t[0] >= (c.latency_s if tp == 2 else 0.9 * (13e-6 if tp == 4 else 24e-6))
        link, kind = col.gpu_interconnect(g).bottleneck(tp)
        big = col.ring_factor(tp) * SIZES[-1] / (link * c.link_eff[kind])
        assert t[-1] == pytest.approx(big, rel=0.01)


def test_pcie_above_two_ranks_is_nccl_as_vllm_runs_it():
    """Over PCIe vLLM runs NCCL above TP 2 (custom all-reduce needs NVLink beyond two ranks),
    in CUDA graphs: the engine prices it at the graphed latency the PCIe boxes measured (4
    ranks 13.3 / 12.7 us, 8 ranks 25.0 / 23.6 on the L40S and RTX PRO 6000: the geometric
    mean of their smallest all-reduce, linear in the ring's hops between) plus the ring's
    bytes at Vidur's PCIe efficiency, not at NCCL's eager latency (27.5 us) and chunk term
    (26 us more at 4 ranks on Gen4). Held out, the RTX PRO 6000 (a box with peer-to-peer
    access) from the L40S's latencies: within 8% median above TP 2, 230% on NCCL's curve at
    small messages before; TP 2 and nodes whose links are given keep NCCL's curve."""
    lat = col.pcie_nccl_latencies(col.allreduce_tables(aic_data.read_committed_allreduce()))
    assert set(lat) == {4, 8}
    assert lat[4] == pytest.approx(np.sqrt(13.29e-6 * 12.65e-6), rel=1e-3)
    assert lat[8] == pytest.approx(np.sqrt(24.99e-6 * 23.6e-6), rel=1e-3)
    # between and below the measured rank counts: linear in the ring's n - 1 hops
    assert lat[4] < col.graphed_nccl_latency_s(6, lat) < lat[8]
    assert col.graphed_nccl_latency_s(6, lat) == pytest.approx((lat[4] + lat[8]) / 2)
    assert 0 < col.graphed_nccl_latency_s(3, lat) < lat[4]
    c = col.collective_coefficients()
    for name in ("l40s", "l4", "a10g", "rtx4090", "rtx-pro-6000", "h100-pcie"):
        g = resolve_gpu(name)
        link, kind = col.gpu_interconnect(g).bottleneck(4)
        assert kind == "pcie"
        assert float(col.tp_allreduce_s(256.0, 4, g)) == pytest.approx(lat[4], rel=0.01)
        s = 64.0 * 2**20
        assert float(col.tp_allreduce_s(s, 4, g)) == pytest.approx(
            lat[4] + 1.5 * s / (link * c.link_eff["pcie"]))
        # TP 2 is NCCL's curve as before
        assert float(col.tp_allreduce_s(1e4, 2, g)) == pytest.approx(
            float(col.nccl_allreduce_s(1e4, 2, link, c.link_eff["pcie"], c)))
    # a node whose links are given (PCIe cards in NVLink-bridged pairs) keeps NCCL's curve
    pair = col.VIDUR_TOPOLOGIES["a100_pairwise_nvlink"]
    link, _ = pair.bottleneck(4)
    assert float(col.tp_allreduce_s(1e4, 4, resolve_gpu("a100-pcie"), interconnect=pair)) \
        == pytest.approx(float(col.nccl_allreduce_s(1e4, 4, link, c.link_eff["pcie"], c)))
    # held out: the RTX PRO 6000 from the L40S box's latencies
    rows = aic_data.read_committed_allreduce()
    other = col.pcie_nccl_latencies(col.allreduce_tables(r for r in rows if r.gpu == "l40s"))
    g = resolve_gpu("rtx-pro-6000")
    mine = [r for r in rows if r.gpu == "rtx-pro-6000" and r.ranks > 2]
    err = np.abs(np.array([float(col.pcie_allreduce_s(float(r.nbytes), r.ranks, g,
                                                      latencies=other)) for r in mine])
                 * 1e6 / np.array([r.us for r in mine]) - 1)
    assert float(np.median(err)) < 0.08


def test_measured_vllm_allreduce_on_nvlink():
    """On NVLink the engine interpolates vLLM's own all-reduce as AIConfigurator timed it (in a
    CUDA graph): at each measured size, the fastest figure measured at that size or a larger
    one (a smaller message never costs more); the H200 has its own table, the B300 and GB200
    (no timings here) use the B200's (the same NVLink 5), a GPU of another interconnect does
    not."""
    rows = [r for r in aic_data.read_committed_allreduce() if r.gpu == "h100-sxm"]
    assert {r.ranks for r in rows} == {2, 4, 8}
    for r in rows[::7]:
        fastest = min(q.us for q in rows if q.ranks == r.ranks and q.nbytes >= r.nbytes)
        got = float(col.tp_allreduce_s(float(r.nbytes), r.ranks, resolve_gpu("h100-sxm")))
        assert got == pytest.approx(fastest * 1e-6, rel=1e-6)
        assert got <= r.us * 1e-6 * (1 + 1e-6)
    # B200, 8 ranks: vLLM's custom all-reduce measured 26 us at 256 KiB and 512 KiB (its
    # two-stage algorithm) and 17 us at 1 MiB; the engine takes 17 us
    b200 = {r.nbytes: r.us for r in aic_data.read_committed_allreduce()
            if r.gpu == "b200" and r.ranks == 8}
    assert b200[2**18] > 1.4 * b200[2**20]
    assert float(col.tp_allreduce_s(2.0**18, 8, resolve_gpu("b200"))) == pytest.approx(
        b200[2**20] * 1e-6, rel=1e-6)
    assert col.measured_allreduce_source(resolve_gpu("h200")) == "h200"
    assert col.measured_allreduce_source(resolve_gpu("b300")) == "b200"
    # where vLLM runs the same backend on both (custom all-reduce below 1 MiB at 8 ranks)
    for n in (2**14, 2**18):
        assert float(col.tp_allreduce_s(float(n), 8, resolve_gpu("b300"))) == float(
            col.tp_allreduce_s(float(n), 8, resolve_gpu("b200")))
    assert col.measured_allreduce_source(resolve_gpu("h100-pcie")) is None
    # 1 MiB over 2 H100s: 8.3 us measured, where NCCL's curve says over 20 us
    t = float(col.tp_allreduce_s(2.0**20, 2, resolve_gpu("h100-sxm")))
    assert 5e-6 < t < 12e-6


def test_tensor_parallel_one_has_no_allreduce():
    g = resolve_gpu("h100-sxm")
    assert np.all(col.tp_allreduce_s(SIZES, 1, g) == 0.0)
    cm = StepCostModel(resolve_model("llama-3.1-8b"), g, tp=1)
    assert cm.allreduce_time(1) == cm.allreduce_time(8192) == cm.allreduce_time(40000) == 0.0


def test_more_ranks_cost_more_per_gpu_on_the_same_link():
    """NCCL on one interconnect: the ring's 2(n-1)/n bytes and its 2(n-1) pipeline steps."""
    ic = col.VIDUR_TOPOLOGIES["a100_dgx"]
    c = col.collective_coefficients()
    link, kind = ic.bottleneck(8)
    t = {n: col.nccl_allreduce_s(SIZES, n, link, c.link_eff[kind], c) for n in (2, 4, 8)}
    assert np.all(t[2] < t[4]) and np.all(t[4] < t[8])
    assert float(t[8][-1] / t[2][-1]) == pytest.approx(1.75, rel=0.01)
    assert float(col.nccl_allreduce_s(np.array([0.0]), 1, link, 0.5, c)[0]) == 0.0


def test_pairwise_nvlink_rings_of_four_cross_pcie():
    pair = col.VIDUR_TOPOLOGIES["a100_pairwise_nvlink"]
    assert pair.bottleneck(2) == (300e9, "nvlink-bridge")
    assert pair.bottleneck(4) == (32e9, "pcie")
    assert col.VIDUR_TOPOLOGIES["h100_dgx"].bottleneck(8) == (450e9, "nvswitch-nvlink4")


def test_custom_allreduce_below_8_mib_on_a_given_nvlink_nccl_above():
    """A node whose links are given (Vidur's topologies) runs vLLM's custom all-reduce up to
    8 MiB on NVLink and NCCL's curve above it and over PCIe."""
    g = resolve_gpu("a100-pcie")
    ic = col.VIDUR_TOPOLOGIES["a100_pairwise_nvlink"]
    c = col.collective_coefficients()
    small = col.CUSTOM_AR_MAX_BYTES
    link, kind = ic.bottleneck(2)
    t_small = float(col.tp_allreduce_s(small, 2, g, interconnect=ic))
    assert t_small == pytest.approx(col.CUSTOM_AR_LATENCY_S
                                    + 1.0 * small / (link * c.link_eff[kind]))
    t_big = float(col.tp_allreduce_s(small + 1, 2, g, interconnect=ic))
    assert t_big == pytest.approx(float(col.nccl_allreduce_s(small + 1, 2, link,
                                                             c.link_eff[kind], c)))
    # over PCIe every size goes through NCCL
    link, kind = col.gpu_interconnect(g).bottleneck(2)
    assert kind == "pcie"
    assert float(col.tp_allreduce_s(1e4, 2, g)) == pytest.approx(
        float(col.nccl_allreduce_s(1e4, 2, link, c.link_eff["pcie"], c)))


def test_step_cost_model_pays_two_allreduces_per_layer():
    m = resolve_model("llama-2-70b")
    g = resolve_gpu("h100-sxm")
    cm = StepCostModel(m, g, tp=4)
    for tokens in (1, 64, 4096):
        one = float(col.tp_allreduce_s(tokens * m.hidden_size * m.dtype_bytes, 4, g))
        assert cm.allreduce_time(tokens) == pytest.approx(2 * m.num_hidden_layers * one)
    # beyond the table, linear in tokens
    assert cm.allreduce_time(2 * cm.max_tokens) > cm.allreduce_time(cm.max_tokens)
    # a bridged pair of PCIe cards all-reduces over NVLink, faster than over PCIe
    pcie = StepCostModel(m, resolve_gpu("a100-pcie"), tp=2)
    bridged = StepCostModel(m, resolve_gpu("a100-pcie"), tp=2,
                            interconnect=col.VIDUR_TOPOLOGIES["a100_pairwise_nvlink"])
    assert bridged.allreduce_time(4096) < 0.25 * pcie.allreduce_time(4096)


def test_measured_form_is_the_device_time_above_the_host_floor():
    c = col.collective_coefficients()
    n = np.full(SIZES.shape, 4.0)
    link = np.full(SIZES.shape, 300e9)
    eff = np.full(SIZES.shape, c.link_eff["nvswitch-nvlink3"])
    meas = col.measured_allreduce_s(SIZES, n, link, eff, c)
    dev = col.nccl_allreduce_s(SIZES, 4, 300e9, c.link_eff["nvswitch-nvlink3"], c)
    assert np.all(meas >= dev) and np.all(meas >= c.host_floor_s)
    assert meas[-1] == pytest.approx(dev[-1], rel=1e-3)


def test_committed_coefficients_are_the_fit_of_the_committed_sample():
    """A refit on the committed sub-sample lands near the committed (full-data) curve."""
    pts = kernel_data.read_committed_vidur_allreduce()
    c = nccl_fit.fit_allreduce(pts)
    ref = col.collective_coefficients()
    for k in col.LINK_KINDS:
        assert c.link_eff[k] == pytest.approx(ref.link_eff[k], rel=0.1)
    assert c.latency_s == pytest.approx(ref.latency_s, rel=0.3)


@pytest.mark.skipif(not SHARED.is_dir(), reason="raw data not beside this checkout")
def test_committed_allreduce_sample_matches_raw_data():
    raw = kernel_data.allreduce_subsample(kernel_data.read_allreduce(SHARED))
    committed = kernel_data.read_committed_vidur_allreduce()
    assert len(raw) == len(committed)
    for a, b in zip(raw, committed, strict=True):
        assert (a.topology, a.gpu, a.workers, a.nbytes) == (b.topology, b.gpu, b.workers,
                                                            b.nbytes)
        assert a.ms == pytest.approx(b.ms, rel=1e-5)
    # Vidur's sizes are bytes: its largest DGX message is 4096 x 8192 fp16 elements
    assert max(p.nbytes for p in raw if p.topology == "h100_dgx") == 4096 * 8192 * 2


@pytest.mark.skipif(not SHARED.is_dir(), reason="raw data not beside this checkout")
def test_committed_vllm_allreduce_table_matches_raw_data():
    raw = aic_kernels.read_allreduce(SHARED)
    committed = aic_data.read_committed_allreduce()
    assert [(r.gpu, r.ranks, r.nbytes) for r in raw] == [
        (r.gpu, r.ranks, r.nbytes) for r in committed]
    for a, b in zip(raw, committed, strict=True):
        assert a.us == pytest.approx(b.us, rel=1e-3)
    # message_size counts bf16 elements: bytes are twice it
    assert min(r.nbytes for r in raw) == 2 * 128


def test_a_gpu_held_out_borrows_the_table_of_its_interconnect():
    """Which measured table or fitted form a GPU's all-reduce comes from, given the GPUs
    measured (the kernel report holds each out this way): the H200 without its own table
    reads the H100's (the same NVLink 4 board), the B200 without its own has no NVLink 5
    neighbour (then it is priced per vLLM backend), a PCIe GPU no NVLink table (the engine
    runs NCCL's curve over PCIe)."""
    h100, h200, b200 = (resolve_gpu(g) for g in ("h100-sxm", "h200", "b200"))
    assert col.same_interconnect(h100, h200) and not col.same_interconnect(h100, b200)
    measured = {"a100-sxm", "b200", "h100-sxm", "l40s", "rtx-pro-6000"}
    assert col.measured_allreduce_source(h200, measured) == "h100-sxm"
    assert col.measured_allreduce_source(b200, measured - {"b200"}) is None
    assert col.measured_allreduce_source(resolve_gpu("l40s"), measured - {"l40s"}) is None
    # a table read as the engine reads it: the measured point at a measured size
    table = col.allreduce_tables(r for r in aic_data.read_committed_allreduce()
                                 if r.gpu == "h100-sxm")[("h100-sxm", 2)]
    assert float(col.table_allreduce_s(table, np.array(2.0**20))) == pytest.approx(
        float(col.tp_allreduce_s(2.0**20, 2, h100)), rel=1e-9)


def test_vllm_runs_the_backend_its_code_selects():
    """vLLM 0.24's ``CudaCommunicator.all_reduce`` per compute capability, world size and
    message size: custom all-reduce (one shot at 2 ranks and below 512 / 256 KiB at up to 4 /
    8 ranks, else two shot) below its maximum (8 MiB, lowered by
    ``CUSTOM_ALL_REDUCE_MAX_SIZES`` where symmetric memory is on: SM 9.0 and 10.0), then
    torch symmetric memory (multimem at 4-8 ranks on 9.0, 6-8 on 10.0) up to its maximum,
    then NCCL; over PCIe custom all-reduce only at 2 ranks."""
    a100, h100, b200, b300, l40s = (resolve_gpu(g) for g in
                                    ("a100-sxm", "h100-sxm", "b200", "b300", "l40s"))
    be = ab.vllm_allreduce_backend
    mib = 1024 * 1024
    assert be(h100, 8, 128 * 1024) == ab.CUSTOM_ONE_SHOT
    assert be(h100, 8, 256 * 1024) == ab.SYMM_MULTIMEM
    assert be(h100, 8, 128 * mib) == ab.NCCL
    assert be(h100, 4, 512 * 1024) == ab.CUSTOM_TWO_SHOT
    assert be(h100, 2, 8 * mib) == ab.SYMM_TWO_SHOT      # custom stops below 8 MiB
    assert be(b200, 2, 1 * mib) == ab.CUSTOM_ONE_SHOT
    assert be(b200, 2, 2 * mib) == ab.SYMM_TWO_SHOT
    assert be(b200, 2, 16 * mib) == ab.NCCL
    assert be(b200, 8, 256 * 1024) == ab.CUSTOM_TWO_SHOT
    assert be(b200, 8, 1 * mib) == ab.SYMM_MULTIMEM
    assert be(b300, 2, 4 * mib) == ab.SYMM_TWO_SHOT      # 10.3: custom below 4 MiB
    assert be(a100, 2, 4 * mib) == ab.CUSTOM_ONE_SHOT    # 8.0: no symmetric memory
    assert be(a100, 2, 8 * mib) == ab.NCCL
    assert be(l40s, 2, 1 * mib) == ab.CUSTOM_ONE_SHOT
    assert be(l40s, 2, 1 * mib, p2p=False) == ab.NCCL
    assert be(l40s, 4, 1024) == ab.NCCL


def test_a_nvlink_gpu_without_a_table_is_priced_per_backend():
    """The A100 held out, priced per backend from the other NVLink GPUs' tables (B200, H100,
    H200): within 6% median (4.1%; its own table's shape from no A100 point; the H100's whole
    fitted form was 11% off; 9.3% while the latencies were scaled by the NVLink generation,
    5.8% before, when the B200's longer ones stood in for the A100's slower SM clock); the
    engine prices a NVLink GPU without a table the same way."""
    rows = aic_data.read_committed_allreduce()
    others = ab.fit_backends(col.nvlink_timings(r for r in rows if r.gpu != "a100-sxm"))
    a100 = resolve_gpu("a100-sxm")
    mine = [r for r in rows if r.gpu == "a100-sxm"]
    pred = [ab.backend_allreduce_s([float(r.nbytes)], r.ranks, a100, others) for r in mine]
    assert all(p is not None for p in pred)
    err = np.abs(np.array([float(p[0]) for p in pred if p is not None]) * 1e6
                 / np.array([r.us for r in mine]) - 1)
    assert float(np.median(err)) < 0.06
    fresh = dataclasses.replace(resolve_gpu("b200"), name="nvlink5-unmeasured")
    assert col.measured_allreduce_source(fresh) is None
    want = ab.backend_allreduce_s([2.0**20], 8, fresh, col.backend_coefficients())
    assert want is not None
    assert float(col.tp_allreduce_s(2.0**20, 8, fresh)) == pytest.approx(float(want[0]))


def test_backend_latencies_are_the_kernels_at_the_sm_clock_and_its_link_crossings():
    """The B200 held out from the A100, H100 and H200 tables: vLLM runs the same custom
    one-shot kernel on it as on Hopper below 1 MiB (one 512-thread block below 8 KiB), 6.6-7.4
    us against 4.3-4.7 (4.9-5.7 on the A100). A latency is the kernel's own part at the SM
    clock (Hopper's 1,980 MHz fitted; the A100's 1,410) plus the link crossings the kernel
    waits on one after the other (custom one shot: barrier, the peers' loads, barrier: 4;
    vLLM's csrc/custom_all_reduce.cuh), each NCCL's tuner's 0.6 us on NVLink (1.0 over PCIe)
    and on NVLink 5 the 0.7 us by which NCCL's one-crossing 8-byte all-reduce is slower on 8
    B200s than on 8 H200s (3.0 / 2.3 us: published figures, not the B200's table). Held out,
    the B200 comes within 8% median (6.4%; 13.6% with the latencies scaled by the generation's
    small-message ratio, 30.6% with one latency for every generation) and its messages up to
    64 KiB within 11%."""
    b200, h100, a100 = (resolve_gpu(g) for g in ("b200", "h100-sxm", "a100-sxm"))
    one_shot = ab.CUSTOM_ONE_SHOT
    assert ab.hop_latency_s(h100) == ab.hop_latency_s(a100) == pytest.approx(0.6e-6)
    assert ab.hop_latency_s(b200) == ab.hop_latency_s(resolve_gpu("b300")) == pytest.approx(
        (0.6 + 3.0 - 2.3) * 1e-6)
    assert ab.hop_latency_s(resolve_gpu("l40s")) == pytest.approx(1.0e-6)
    assert ab.crossings_s(b200, one_shot) == pytest.approx(4 * 1.3e-6)
    assert ab.crossings_s(b200, ab.NCCL) == 0.0
    assert ab.kernel_scale(a100, one_shot) == pytest.approx(1980 / 1410)
    assert ab.kernel_scale(h100, one_shot) == 1.0 and ab.kernel_scale(a100, ab.NCCL) == 1.0
    assert ab.kernel_scale(dataclasses.replace(a100, boost_mhz=0.0), one_shot) == 1.0
    rows = aic_data.read_committed_allreduce()
    others = ab.fit_backends(col.nvlink_timings(r for r in rows if r.gpu != "b200"))
    mine = [r for r in rows if r.gpu == "b200"]
    pred = [ab.backend_allreduce_s([float(r.nbytes)], r.ranks, b200, others) for r in mine]
    assert all(p is not None for p in pred)
    signed = (np.array([float(p[0]) for p in pred if p is not None]) * 1e6
              / np.array([r.us for r in mine]) - 1)
    assert float(np.median(np.abs(signed))) < 0.08
    small = np.array([r.nbytes <= 64 * 1024 for r in mine])
    assert float(np.max(np.abs(signed[small]))) < 0.11
    # a price is the kernel's latency at the GPU's clock, its crossings and its bytes
    for gpu in (h100, a100, b200):
        one = ab.backend_allreduce_s([4096.0], 8, gpu, others)
        assert one is not None
        assert float(one[0]) == pytest.approx(
            others.latency(one_shot, 8) * 1980 / gpu.boost_mhz + 4 * ab.hop_latency_s(gpu)
            + ab.backend_bytes(one_shot, 8, 4096.0)
            / (ab.link_bytes_s(gpu) * others.link_eff[one_shot]))


def test_a_borrowed_table_holds_only_where_vllm_runs_the_same_backend():
    """The B300 (SM 10.3) borrows the B200's (SM 10.0) table: vLLM keeps custom all-reduce up
    to 4 MiB on 10.3 where 10.0 hands over to symmetric memory at 2 MiB (2 / 4 ranks) or 1 MiB
    (8), and takes NCCL above 4 MiB at 2 ranks and 64 MiB at 8 where 10.0 stays on symmetric
    memory. There the B300 runs its own backend priced as on the B200 (fitted on the B200's
    table alone, the B300's NVLink 5); elsewhere, and on the GB200 (SM 10.0) everywhere, the
    B200's measured time as it is."""
    b200, b300, gb200 = (resolve_gpu(g) for g in ("b200", "b300", "gb200"))
    mib = 1024 * 1024
    be = ab.vllm_allreduce_backend
    lender = col.lender_backend_coefficients("b200")
    differ = 0
    for (gpu, n), (lb, _) in col.allreduce_tables(aic_data.read_committed_allreduce()).items():
        if gpu != "b200":
            continue
        s = np.exp(lb)
        own = col.tp_allreduce_s(s, n, b200)
        assert np.array_equal(col.tp_allreduce_s(s, n, gb200), own)
        got = col.tp_allreduce_s(s, n, b300)
        for i, x in enumerate(s):
            if be(b300, n, float(x)) == be(b200, n, float(x)):
                assert got[i] == own[i]
                continue
            differ += 1
            b = be(b300, n, float(x))
            lat = lender.latency(b, n)
            assert lat is not None
            # the kernel's latency fitted on the B200, at the B300's clock (NCCL's: as
            # fitted), with NVLink 5's crossings (allreduce_backends.priced_s)
            assert got[i] == pytest.approx(lat * ab.kernel_scale(b300, b)
                                           + ab.crossings_s(b300, b)
                                           + ab.backend_bytes(b, n, float(x))
                                           / (ab.link_bytes_s(b300) * lender.link_eff[b]))
    assert differ >= 4
    # 2 ranks, 2 MiB: custom one shot on the B300, symmetric memory two shot on the B200
    assert be(b300, 2, 2 * mib) == ab.CUSTOM_ONE_SHOT != be(b200, 2, 2 * mib)
    assert be(b300, 8, 1 * mib) == ab.CUSTOM_TWO_SHOT != be(b200, 8, 1 * mib)
    assert be(b300, 8, 128 * mib) == ab.NCCL != be(b200, 8, 128 * mib)
    assert float(col.tp_allreduce_s(2.0 * mib, 2, b300)) < 0.8 * float(
        col.tp_allreduce_s(2.0 * mib, 2, b200))
    assert float(col.tp_allreduce_s(1.0 * mib, 8, b300)) != float(
        col.tp_allreduce_s(1.0 * mib, 8, b200))
    # array in, array out of the same shape
    assert col.tp_allreduce_s(np.full((2, 3), 2.0 * mib), 2, b300).shape == (2, 3)


def test_no_backend_is_fitted_faster_than_its_link():
    """The B200 runs custom two shot only at 256 KiB-2 MiB, where its latency dominates: fitted
    alone, its efficiency is held at the link's data sheet (1), never above."""
    lender = col.lender_backend_coefficients("b200")
    assert lender.link_eff[ab.CUSTOM_TWO_SHOT] == 1.0
    assert all(0 < e <= 1.0 for e in lender.link_eff.values())
    assert all(0 < e < 1.0 for e in col.backend_coefficients().link_eff.values())


# ---- the node's peer-to-peer path over PCIe ------------------------------------------------

def _node(name: str, p2p: bool | None):
    from chunktune.core.gpus import with_peer_to_peer
    return with_peer_to_peer(resolve_gpu(name), p2p)


def _table_us(rows, gpu: str, ranks: int) -> dict[int, float]:
    """A measured table as the engine reads it: no message slower than a larger one
    (``aic_data.envelope``)."""
    mine = sorted((r.nbytes, r.us) for r in rows if r.gpu == gpu and r.ranks == ranks)
    return {b: min(us for b2, us in mine if b2 >= b) for b, _ in mine}


def test_a_stated_peer_to_peer_path_prices_the_allreduce_vllm_runs_there():
    """vLLM's ``CustomAllreduce`` runs over PCIe only at two ranks whose GPUs reach each other
    peer to peer (``_can_p2p``; above two it stays off: "not supported on more than two
    PCIe-only GPUs"), else NCCL, through host memory where the GPUs have no peer-to-peer path.
    Stated (``spec.engine.gpu.peerToPeer``), each is read off the boxes AIConfigurator timed
    alike: with a path, the GPU's own table (the L40S's two ranks, the RTX PRO 6000's two to
    eight); without, NCCL through host memory (an RTX PRO 6000 box of vLLM 0.19 at two ranks,
    the L40S box at four and eight)."""
    rows = aic_data.read_committed_allreduce()
    host = aic_data.read_committed_allreduce(aic_data.NO_P2P_ALLREDUCE_PATH)
    for gpu, ranks in (("l40s", 2), ("rtx-pro-6000", 2), ("rtx-pro-6000", 4),
                       ("rtx-pro-6000", 8)):
        g = _node(gpu, True)
        for nbytes, us in _table_us(rows, gpu, ranks).items():
            assert float(col.tp_allreduce_s(float(nbytes), ranks, g)) * 1e6 \
                == pytest.approx(us, rel=0.02)
    for ranks, box in ((2, "rtx-pro-6000"), (4, "l40s"), (8, "l40s")):
        for gpu in ("l40s", "a10g", "rtx-pro-6000"):
            g = _node(gpu, False)
            for nbytes, us in _table_us(host, box, ranks).items():
                assert float(col.tp_allreduce_s(float(nbytes), ranks, g)) * 1e6 \
                    == pytest.approx(us, rel=0.02)
    # at 8 ranks and 64 MiB a rank: the L40S without a path against the same GPU priced with
    # one (NCCL's graphed latency, the ring at Vidur's PCIe efficiency)
    s = 64.0 * 2**20
    slow = float(col.tp_allreduce_s(s, 8, _node("l40s", False)))
    fast = float(col.tp_allreduce_s(s, 8, _node("l40s", True)))
    assert slow > 8 * fast
    # not stated: as before (NCCL's curve at TP 2, the graphed NCCL above)
    c = col.collective_coefficients()
    for gpu in ("l40s", "rtx-pro-6000", "a10g"):
        g = resolve_gpu(gpu)
        assert g.peer_to_peer is None
        link, _ = col.gpu_interconnect(g).bottleneck(2)
        assert float(col.tp_allreduce_s(1e4, 2, g)) == pytest.approx(
            float(col.nccl_allreduce_s(1e4, 2, link, c.link_eff["pcie"], c)))


def test_the_host_memory_path_is_no_faster_than_the_gpus_own_link():
    """NCCL through host memory still crosses each GPU's own PCIe link: on a card whose link
    carries less than the measured hosts moved (15 GB/s each way at two ranks; a PCIe Gen3 x8
    card's 8), the ring's bytes at that link bound it."""
    g = dataclasses.replace(_node("rtx4090", False), link_gb_s=16.0)
    s = 1024.0 * 2**20
    t = float(col.tp_allreduce_s(s, 2, g))
    assert t >= s / ab.link_bytes_s(g)
    assert t == pytest.approx(s / ab.link_bytes_s(g), rel=1e-9)


def test_a_pcie_gpu_without_a_table_prices_the_custom_allreduce_from_the_l40s_box():
    """A PCIe GPU with a stated peer-to-peer path and no table of its own (A10G, A40, RTX
    4090, the PCIe A100 / H100) runs vLLM's custom kernel at two ranks priced per backend as
    fitted on the boxes timed with a path, its kernel at the GPU's SM clock, its bytes at the
    same fraction of its own link: the L40S box's (its kernel moves 0.6 of PCIe Gen4 each way;
    the RTX PRO 6000's table moves more than the Gen4 figure the catalog keeps for it, so it
    prices nobody by its link). The A10G's link is the L40S's: within 10% of the L40S box's
    table; at small messages 6.0 us (the L40S box 5.4; the A10G's 1,695 MHz against 2,520),
    against 36 us on NCCL's curve, which is what a node not stated gets."""
    timings = col.p2p_timings(aic_data.read_committed_allreduce())
    assert {t.gpu.name for t in timings} == {"l40s"}
    assert {t.ranks for t in timings} == {2}
    coef = col.pcie_p2p_backend_coefficients()
    assert coef.link_eff[ab.CUSTOM_ONE_SHOT] == pytest.approx(0.6, abs=0.05)
    rows = aic_data.read_committed_allreduce()
    g = _node("a10g", True)
    err = [float(col.tp_allreduce_s(float(b), 2, g)) * 1e6 / us - 1
           for b, us in _table_us(rows, "l40s", 2).items()]
    assert float(np.median(np.abs(err))) < 0.10
    assert float(col.tp_allreduce_s(256.0, 2, g)) < 6.5e-6
    assert float(col.tp_allreduce_s(256.0, 2, resolve_gpu("a10g"))) > 30e-6
    # above two ranks with a path and no table: NCCL as before
    assert float(col.tp_allreduce_s(1e6, 4, g)) == pytest.approx(
        float(col.tp_allreduce_s(1e6, 4, resolve_gpu("a10g"))))


@pytest.mark.skipif(not SHARED.is_dir(), reason="raw data not beside this checkout")
def test_committed_host_memory_table_matches_raw_data():
    raw = aic_kernels.read_no_p2p_allreduce(SHARED)
    committed = aic_data.read_committed_allreduce(aic_data.NO_P2P_ALLREDUCE_PATH)
    assert [(r.gpu, r.ranks, r.nbytes) for r in raw] == [
        (r.gpu, r.ranks, r.nbytes) for r in committed]
    for a, b in zip(raw, committed, strict=True):
        assert a.us == pytest.approx(b.us, rel=1e-3)
    assert {(r.gpu, r.ranks) for r in raw} == {("rtx-pro-6000", 2), ("l40s", 4),
                                               ("l40s", 8)}
    # what tells these boxes apart (aic_data.NO_P2P_TABLES): the smallest message at two
    # ranks and the bytes each way at the largest, against the boxes with a path
    host = {(r.gpu, r.ranks, r.nbytes): r.us for r in raw}
    p2p = {(r.gpu, r.ranks, r.nbytes): r.us for r in aic_data.read_committed_allreduce()}
    assert host[("rtx-pro-6000", 2, 256)] > 1.8 * p2p[("rtx-pro-6000", 2, 256)]
    big = max(r.nbytes for r in raw)
    assert big / host[("l40s", 4, big)] < 0.2 * big / p2p[("l40s", 2, big)]


def test_a_data_parallel_dispatch_follows_the_nodes_peer_to_peer_path():
    """The all-gather and reduce-scatter of vLLM's data-parallel dispatch and combine over
    PCIe: on NCCL's curve where the node's path is not stated (or stated), through host memory
    (an all-reduce's bytes, the latency twice) where it is stated to have none."""
    s = np.array([1e4, 1e6, 64.0 * 2**20])
    c = col.collective_coefficients()
    unstated = col.nccl_gather_scatter_s(s, 2, resolve_gpu("rtx-pro-6000"))
    assert np.allclose(col.nccl_gather_scatter_s(s, 2, _node("rtx-pro-6000", True)), unstated)
    without = col.nccl_gather_scatter_s(s, 2, _node("rtx-pro-6000", False))
    g = _node("rtx-pro-6000", False)
    assert np.allclose(without, c.latency_s + col.host_memory_allreduce_s(s, 2, g))
    assert (without[1:] > unstated[1:]).all()
