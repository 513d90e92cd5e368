"""The tensor-parallel all-reduce model (chunktune.sim.cost.collectives) and its fit to Vidur's
NCCL collectives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.sim.cost import collectives as col
from chunktune.sim.cost import kernel_data, kernel_fit
from chunktune.sim.cost.step_time import StepCostModel

SHARED = Path(__file__).resolve().parents[4] / "shared" / "data"
SIZES = np.geomspace(1e3, 1e9, 200)


def test_ring_factor():
    assert col.ring_factor(1) == 0.0
    assert [float(col.ring_factor(n)) for n in (2, 4, 8)] == [1.0, 1.5, 1.75]


@pytest.mark.parametrize("gpu", ["a100-sxm", "h100-sxm", "a100-pcie", "rtx-pro-6000"])
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_allreduce_grows_with_size_above_a_latency_floor(gpu, tp):
    g = resolve_gpu(gpu)
    t = col.tp_allreduce_s(SIZES, tp, g, custom_latency_s=1e-5)
    assert np.all(np.diff(t) >= 0)
    assert t[0] >= 1e-5  # never below the smaller of the two latencies
    c = col.collective_coefficients()
    if col.gpu_interconnect(g).bottleneck(tp)[1] == "pcie":
        assert t[0] >= c.latency_s  # NCCL's latency and pipeline fill
    # large messages: bandwidth-bound, the ring's bytes at the fitted link efficiency
    link, kind = col.gpu_interconnect(g).bottleneck(tp)
    big = col.ring_factor(tp) * SIZES[-1] / (link * c.link_eff[kind])
    assert t[-1] == pytest.approx(big, rel=0.01)


def test_tensor_parallel_one_has_no_allreduce():
    g = resolve_gpu("h100-sxm")
    assert np.all(col.tp_allreduce_s(SIZES, 1, g, 1e-5) == 0.0)
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


def test_custom_allreduce_below_8_mib_on_nvlink_nccl_above():
    g = resolve_gpu("h100-sxm")
    c = col.collective_coefficients()
    small = col.CUSTOM_AR_MAX_BYTES
    t_small = float(col.tp_allreduce_s(small, 4, g, 1e-5))
    link, kind = col.gpu_interconnect(g).bottleneck(4)
    assert t_small == pytest.approx(1e-5 + 1.5 * small / (link * c.link_eff[kind]))
    t_big = float(col.tp_allreduce_s(small + 1, 4, g, 1e-5))
    assert t_big == pytest.approx(float(col.nccl_allreduce_s(small + 1, 4, link,
                                                             c.link_eff[kind], c)))
    # over PCIe every size goes through NCCL
    p = resolve_gpu("a100-pcie")
    link, kind = col.gpu_interconnect(p).bottleneck(2)
    assert kind == "pcie"
    assert float(col.tp_allreduce_s(1e4, 2, p, 1e-5)) == pytest.approx(
        float(col.nccl_allreduce_s(1e4, 2, link, c.link_eff["pcie"], c)))


def test_step_cost_model_pays_two_allreduces_per_layer():
    m = resolve_model("llama-2-70b")
    g = resolve_gpu("h100-sxm")
    cm = StepCostModel(m, g, tp=4)
    for tokens in (1, 64, 4096):
        one = float(col.tp_allreduce_s(tokens * m.hidden_size * m.dtype_bytes, 4, g,
                                       cm.c.allreduce_latency_s))
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
    pts = kernel_data.read_committed_allreduce()
    c = kernel_fit.fit_allreduce(pts)
    ref = col.collective_coefficients()
    for k in col.LINK_KINDS:
        assert c.link_eff[k] == pytest.approx(ref.link_eff[k], rel=0.1)
    assert c.latency_s == pytest.approx(ref.latency_s, rel=0.3)


@pytest.mark.skipif(not SHARED.is_dir(), reason="raw data not beside this checkout")
def test_committed_allreduce_sample_matches_raw_data():
    raw = kernel_data.allreduce_subsample(kernel_data.read_allreduce(SHARED))
    committed = kernel_data.read_committed_allreduce()
    assert len(raw) == len(committed)
    for a, b in zip(raw, committed, strict=True):
        assert (a.topology, a.gpu, a.workers, a.nbytes) == (b.topology, b.gpu, b.workers,
                                                            b.nbytes)
        assert a.ms == pytest.approx(b.ms, rel=1e-5)
    # Vidur's sizes are bytes: its largest DGX message is 4096 x 8192 fp16 elements
    assert max(p.nbytes for p in raw if p.topology == "h100_dgx") == 4096 * 8192 * 2
