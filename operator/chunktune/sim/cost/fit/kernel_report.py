"""The step-time model's error on measured kernels: per operator family and GPU, in sample and
with the GPU held out, the cross-checks between sources, and the held-out datasets.

Holding a GPU out predicts its timings exactly as a GPU without data is predicted: with the
coefficients of its nearest other GPU whose data has the family
(:func:`chunktune.sim.cost.fit.measurements.borrow_source`; an FP8 KV cache's terms and MoE
layers from the nearest running the same kernel, ``coefficients.KERNEL_MATCHED``), the decode
attention terms
fitted on the pool of the other GPUs running its FlashAttention generation
(``coefficients.POOLED``), the prefill tile rate and the FP8 activations' quantization rate
carried over by the committed rules (``coefficients.tile_rule``, ``coefficients.quant_rule``),
vLLM's all-reduce from the measured table of another GPU on the same interconnect where there
is one (``collectives.measured_allreduce_source``, as the engine borrows it), and its own data
sheet; GEMMs and MoE layers from that GPU's measured table scaled by the data sheets where the
engine would borrow it (``loo-gpu``: a same-architecture neighbour's GEMM grid, the
committed MoE table of the nearest GPU on the same MoE kernel, as the fit decided; MoE layers
scored on what the GPU's own committed table makes the engine run, :func:`moe_targets`), and
that table alone on every GPU (``loo-table``). A family a GPU has no data for is listed as
such (``missing``), never filled in. Relative error is ``|predicted / measured - 1|``; each
row gives its median and p90.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import ModelConfig, resolve_model
from chunktune.sim.cost import aic_data, gemm_table, moe_table
from chunktune.sim.cost import allreduce_backends as ab
from chunktune.sim.cost import collectives as col
from chunktune.sim.cost.coefficients import (
    GROUPS,
    NEAREST,
    POOLED,
    QUANT_RATE_RULES,
    TILE_RATE_RULES,
    KernelCoefficients,
    coefficients,
    kv_fp8_own_decode_cost,
    lent_quant_memory_eff,
    lent_tile_memory_eff,
    pool_members,
    quant_rule,
    tile_rule,
)
from chunktune.sim.cost.fit import aic_kernels, mla_derive, nccl_fit
from chunktune.sim.cost.fit import family_fit as ff
from chunktune.sim.cost.fit import kernel_data as kd
from chunktune.sim.cost.fit.measurements import (
    FAMILIES,
    Measurements,
    attention_kind,
    attention_points,
    borrow_source,
    elementwise_points,
    families_with_data,
    gemm_points,
    load,
    op_gemms,
)
from chunktune.sim.cost.gemm_table import DTYPE, GemmTable
from chunktune.sim.cost.mla_table import (
    STEPS,
    Key,
    lent_decode_us,
    lent_prefill_us,
    stream_bytes,
)
from chunktune.sim.cost.step_time import (
    gemm_form,
    lent_moe_seconds,
    linear_layer_time,
    moe_form,
)


@dataclass(frozen=True)
class ErrorRow:
    dataset: str
    slice: str
    mode: str
    n: int
    median_rel_err: float
    p90_rel_err: float

    @classmethod
    def of(cls, dataset: str, slice_: str, mode: str, err: np.ndarray) -> ErrorRow:
        err = np.asarray(err, dtype=np.float64)
        return cls(dataset, slice_, mode, len(err), float(np.median(err)),
                   float(np.percentile(err, 90)))


@dataclass(frozen=True)
class CrossCheck:
    """Two sources' timings of the same kernels on one GPU: the ratio other / trusted."""

    name: str
    n: int
    median_ratio: float
    p10_ratio: float
    p90_ratio: float

    @classmethod
    def of(cls, name: str, ratio: np.ndarray) -> CrossCheck:
        r = np.asarray(ratio, dtype=np.float64)
        return cls(name, len(r), float(np.median(r)), float(np.percentile(r, 10)),
                   float(np.percentile(r, 90)))


# ---- per family and GPU ------------------------------------------------------------------

def family_errors(family: str, gpu: str, c: KernelCoefficients, meas: Measurements
                  ) -> np.ndarray | None:
    """|relative error| of ``c`` (with ``gpu``'s data sheet) on ``gpu``'s own timings of
    ``family``; None where it has none. GEMMs: the fitted form on the shapes it is fitted on
    (the engine interpolates a measured GPU's own table, :func:`gemm_cross_checks`)."""
    g = resolve_gpu(gpu)
    if family in ("gemm", "gemm-fp8"):
        dtype = "fp8" if family == "gemm-fp8" else "bf16"
        pts = ff.gemm_fit_points(gemm_points(meas, dtype).get(gpu, []), g, dtype)
        if not pts:
            return None
        gemm: np.ndarray = np.abs(ff.gemm_pred_us(c, g, pts, dtype)
                                  / np.array([p.us for p in pts]) - 1)
        return gemm
    if family == "elementwise":
        lin = elementwise_points(meas).get(gpu, [])
        if not lin:
            return None
        ew: np.ndarray = np.abs(ff.elementwise_pred_ms(c, lin)
                                / np.array([p.ops[-1] for p in lin]) - 1)
        return ew
    if family.startswith("attention"):
        att = [p for p in attention_points(meas, gpu) if attention_kind(p) == family]
        if not att:
            return None
        a = ff.attention_arrays(att)
        out: np.ndarray = np.abs(ff.attention_pred_us(c, a) / a["us"] - 1)
        return out
    if family == "all-reduce":
        ar = [r for r in meas.allreduce if r.gpu == gpu]
        if not ar:
            return None
        allr: np.ndarray = np.abs(ff.allreduce_pred_us(c, g, ar)
                                  / np.array([r.us for r in ar]) - 1)
        return allr
    if family == "moe":
        moe = [r for r in meas.moe if r.gpu == gpu and r.dtype == "bf16"]
        if not moe:
            return None
        moe_err: np.ndarray = np.abs(ff.moe_pred_us(c, g, moe)
                                     / np.array([r.us for r in moe]) - 1)
        return moe_err
    raise ValueError(f"unknown family {family!r}")


def family_report(meas: Measurements, coef: Callable[[str], KernelCoefficients],
                  rule: str | None = None, quant: str | None = None) -> list[ErrorRow]:
    """Per family and GPU: in sample (its own coefficients), held out (``loo-gpu``: its
    nearest other measured GPU's, the attention groups of ``coefficients.POOLED`` fitted on
    their pool without it, :func:`held_out`; all-reduces as the engine borrows them,
    :func:`held_out_allreduce_errors`; for GEMMs also ``loo-table``: that GPU's measured
    table scaled by the data sheets, :func:`lent_table_errors`), and ``missing`` rows for GPUs
    without data. Where the engine would run the neighbour's measured GEMM or MoE table scaled
    (:func:`borrows_table`), the ``loo-gpu`` row is that table on the shapes it has and the
    fitted form on the rest (:func:`lent_or_form_errors`). ``rule``: how a borrowed prefill
    tile rate carries over (``coefficients.TILE_RATE_RULES``; default the committed one);
    ``quant``: how a borrowed FP8 activation quantization rate does
    (``coefficients.QUANT_RATE_RULES``)."""
    rule = tile_rule() if rule is None else rule
    quant = quant_rule() if quant is None else quant
    have = families_with_data(meas)
    everyone = sorted(set().union(*have.values()))
    rows = []
    cache: dict[tuple[str, tuple[str, ...]], dict[str, float]] = {}
    decisions = {"gemm": gemm_borrowing(meas, coef, quant), "moe": moe_borrowing(meas, coef)}
    for fam in FAMILIES:
        for g in everyone:
            if g not in have[fam]:
                rows.append(ErrorRow(fam, f"{g} (no data)", "missing", 0, float("nan"),
                                     float("nan")))
                continue
            own = family_errors(fam, g, coef(g), meas)
            assert own is not None
            rows.append(ErrorRow.of(fam, g, "in-sample", own))
            if fam == "all-reduce":
                lender, held_ar = held_out_allreduce_errors(g, coef, meas)
                rows.append(ErrorRow.of(fam, f"{g} from {lender}", "loo-gpu", held_ar))
                continue
            src = borrow_source(g, fam, have)
            if src is not None:
                held = family_errors(fam, g, held_out(g, fam, src, coef, meas, have, cache,
                                                      rule, quant), meas)
                assert held is not None
                frm = ("+".join(pool_members(resolve_gpu(g), fam, have[fam])) if fam in POOLED
                       else src)
                if borrows_table(g, src, fam, decisions, meas):
                    held = lent_or_form_errors(g, src, fam, coef(src),
                                               borrowed(g, src, fam, coef(src), quant), meas)
                    frm += " (engine: table)"
                elif fam == "moe" and moe_table.has_table(g):
                    form_err = moe_form_errors(g, coef(src))
                    assert form_err is not None
                    held = np.abs(form_err)
                rows.append(ErrorRow.of(fam, f"{g} from {frm}", "loo-gpu", held))
                lent = (lent_table_errors(g, src, "fp8" if fam == "gemm-fp8" else "bf16",
                                          coef(src), meas, borrowed(g, src, fam, coef(src), quant))
                        if fam in ("gemm", "gemm-fp8")
                        else lent_moe_errors(g, src, coef(src)) if fam == "moe"
                        else None)
                if lent is not None:
                    rows.append(ErrorRow.of(fam, f"{g} from {src}'s table", "loo-table",
                                            np.abs(lent)))
    return rows


def pooled_fit(fam: str, members: list[str], coef: Callable[[str], KernelCoefficients],
               meas: Measurements, cache: dict[tuple[str, tuple[str, ...]], dict[str, float]]
               ) -> dict[str, float]:
    """:func:`family_fit.fit_pooled`, once per pool (``cache``); a pool of one GPU is that
    GPU's own group, as fitted on its data."""
    key = (fam, tuple(members))
    if key not in cache:
        cache[key] = (ff.fit_pooled(fam, members, coef, meas) if len(members) > 1
                      else {k: getattr(coef(members[0]), k) for k in GROUPS[fam]})
    return cache[key]


def held_out(gpu: str, fam: str, src: str, coef: Callable[[str], KernelCoefficients],
             meas: Measurements, have: dict[str, set[str]],
             cache: dict[tuple[str, tuple[str, ...]], dict[str, float]],
             rule: str, quant: str) -> KernelCoefficients:
    """What predicts ``gpu``'s ``fam`` with ``gpu`` held out, as a GPU without data is
    predicted: its nearest other measured GPU ``src``'s coefficients, and for the attention
    families every pooled group (``coefficients.POOLED``) from its pool without ``gpu`` and
    the lender's prefill tile rate carried over by ``rule``
    (``coefficients.lent_tile_memory_eff``), its FP8 quantization rate by ``quant``
    (:func:`borrowed`). An FP8 KV cache's group comes from ``src``, the nearest GPU running
    the same FP8-cache kernel (:func:`borrow_source`), the rest from the nearest GPU with
    FP8-cache data whatever its kernel (what a GPU without data takes whole,
    ``coefficients.coefficients``)."""
    lender = (src if fam != "attention-kv-fp8"
              else next(o for o in NEAREST.get(gpu, ()) if o in have[fam]))
    c = coef(lender)
    if not fam.startswith("attention"):
        return borrowed(gpu, src, fam, c, quant)
    c = ff.with_values(c, {"attn_tile_memory_eff": lent_tile_memory_eff(
        c.attn_tile_memory_eff, resolve_gpu(lender), resolve_gpu(gpu), rule)})
    if lender != src:
        c = ff.with_values(c, {k: getattr(coef(src), k) for k in GROUPS[fam]})
    for pf in POOLED:
        members = pool_members(resolve_gpu(gpu), pf, have[pf])
        if members:
            c = ff.with_values(c, pooled_fit(pf, members, coef, meas, cache))
    if not kv_fp8_own_decode_cost(resolve_gpu(gpu)):
        c = ff.with_values(c, {"attn_kv_fp8_per_decode_s": c.attn_per_decode_s})
    return c


def held_out_allreduce_errors(gpu: str, coef: Callable[[str], KernelCoefficients],
                              meas: Measurements) -> tuple[str, np.ndarray]:
    """(what predicts it, |relative error|) on ``gpu``'s measured vLLM all-reduces with its
    own table removed, the engine's path (:func:`collectives.tp_allreduce_s`) on the other
    GPUs' measurements: on NVLink the table of the nearest measured GPU on the same
    interconnect (:func:`collectives.measured_allreduce_source`; where vLLM runs another
    backend on it, that backend priced as on the lender:
    :func:`allreduce_backends.borrowed_allreduce_s`), else each message priced by
    the backend vLLM runs for it with the backends fitted on the other NVLink GPUs' tables
    (:func:`allreduce_backends.fit_backends`); over PCIe NCCL's curve at 2 ranks and above
    them NCCL's graphed latency measured on the other PCIe GPUs
    (:func:`pcie_allreduce_errors`). ``coef`` is not used: no per-GPU coefficient enters."""
    g = resolve_gpu(gpu)
    others = {r.gpu for r in meas.allreduce} - {gpu}
    mine = [r for r in meas.allreduce if r.gpu == gpu]
    us = np.array([r.us for r in mine])
    src = col.measured_allreduce_source(g, others) if g.nvlink else None
    train = col.nvlink_timings(r for r in meas.allreduce if r.gpu != gpu)
    if src is not None:
        tables = col.allreduce_tables(r for r in meas.allreduce if r.gpu == src)
        lender, lent = ab.fit_backends(col.table_timings(tables, src)), ab.fit_backends(train)
        pred = np.array([float(ab.borrowed_allreduce_s(
            col.table_allreduce_s(tables[(src, r.ranks)], np.array([float(r.nbytes)])),
            [float(r.nbytes)], r.ranks, g, resolve_gpu(src), lender, lent)[0])
            for r in mine]) * 1e6
        tab: np.ndarray = np.abs(pred / us - 1)
        return f"{src}'s table", tab
    if g.nvlink and train:
        fitted = ab.fit_backends(train)
        by_n = [ab.backend_allreduce_s([float(r.nbytes)], r.ranks, g, fitted) for r in mine]
        if all(p is not None for p in by_n):
            pred_us = np.array([float(p[0]) for p in by_n if p is not None]) * 1e6
            lenders = "+".join(sorted({t.gpu.name for t in train}))
            form: np.ndarray = np.abs(pred_us / us - 1)
            return f"backends of {lenders}", form
    pcie = pcie_lenders(gpu, meas)
    return f"pcie-nccl of {'+'.join(pcie) or 'none'}", pcie_allreduce_errors(gpu, meas)


def borrowed(gpu: str, src: str, fam: str, c: KernelCoefficients, quant: str
             ) -> KernelCoefficients:
    """``src``'s coefficients ``c`` as ``gpu`` borrows ``fam`` from it: for FP8 GEMMs the
    activations' quantization rate carried over by ``quant``
    (``coefficients.lent_quant_memory_eff``), else as they are."""
    if fam != "gemm-fp8":
        return c
    return ff.with_values(c, {"fp8_quant_memory_eff": lent_quant_memory_eff(
        c.fp8_quant_memory_eff, resolve_gpu(src), resolve_gpu(gpu), quant)})


def borrows_table(gpu: str, src: str, fam: str, decisions: dict[str, Any],
                  meas: Measurements) -> bool:
    """Whether ``gpu``, held out, runs ``src``'s measured ``fam`` table (``src`` has one) as
    the engine would a GPU without data (:func:`chunktune.sim.cost.gemm_table.lends_table`,
    :func:`chunktune.sim.cost.moe_table.lends_table`, under the fit's ``decisions``:
    ``gemm_borrowing`` and ``moe_borrowing`` as :func:`gemm_borrowing` and
    :func:`moe_borrowing` make them)."""
    if fam in ("gemm", "gemm-fp8"):
        if not any(p.gpu == src and p.dtype == DTYPE[fam] for p in meas.gemm):
            return False
        return gemm_table.lends_table(resolve_gpu(gpu), resolve_gpu(src), fam,
                                      decisions["gemm"])
    return (fam == "moe" and moe_table.has_table(src)
            and moe_table.lends_table(decisions["moe"]))


def lent_or_form_errors(gpu: str, src: str, fam: str, c: KernelCoefficients,
                        held: KernelCoefficients, meas: Measurements) -> np.ndarray:
    """|relative error| on ``gpu``'s ``fam`` timings (those :func:`family_errors` scores) of
    what the engine runs borrowing ``src``'s table: the table scaled
    (:func:`lent_table_errors`, :func:`lent_moe_errors`: ``src``'s form under ``c`` on its
    sheet, ``gpu``'s under ``held``, ``c`` as borrowed) where it has the shape, the fitted
    form (``held``) where it does not."""
    form = family_errors(fam, gpu, held, meas) if fam != "moe" else moe_form_errors(gpu, held)
    assert form is not None
    lent = (_lent_table(gpu, src, DTYPE[fam], c, meas, held) if fam in ("gemm", "gemm-fp8")
            else _lent_moe(gpu, src, c))
    form = np.abs(form)
    out: np.ndarray = np.where(np.isnan(lent), form, np.abs(lent))
    return out


def pcie_gpus(meas: Measurements) -> list[str]:
    """The PCIe GPUs with measured all-reduces in ``meas``."""
    return sorted({g for g in {r.gpu for r in meas.allreduce} if not resolve_gpu(g).nvlink})


def pcie_lenders(gpu: str, meas: Measurements) -> list[str]:
    """The PCIe GPUs other than ``gpu`` with measured all-reduces in ``meas``: whose graphed
    NCCL latencies price ``gpu`` held out (:func:`pcie_allreduce_errors`)."""
    return [g for g in pcie_gpus(meas) if g != gpu]


def pcie_allreduce_errors(gpu: str, meas: Measurements) -> np.ndarray:
    """|relative error| of what the engine runs over PCIe (:func:`collectives.
    pcie_allreduce_s`: NCCL's curve fitted on Vidur's collectives at 2 ranks, above them
    NCCL's graphed latency per rank count from the other PCIe GPUs' measured tables and the
    ring's bytes at Vidur's PCIe efficiency) on a PCIe GPU's measured vLLM all-reduces, one
    per row of ``meas.allreduce`` of ``gpu``."""
    g = resolve_gpu(gpu)
    ar = [r for r in meas.allreduce if r.gpu == gpu]
    lenders = set(pcie_lenders(gpu, meas))
    lat = col.pcie_nccl_latencies(col.allreduce_tables(
        r for r in meas.allreduce if r.gpu in lenders))
    pred = np.array([float(col.pcie_allreduce_s(float(r.nbytes), r.ranks, g, latencies=lat))
                     for r in ar])
    out: np.ndarray = np.abs(pred * 1e6 / np.array([r.us for r in ar]) - 1)
    return out


#: The message ranges the PCIe all-reduce's held-out error is split by
#: (:func:`pcie_allreduce_report`): decode steps' messages (a few tokens to a few hundred of
#: hidden states) and prefill chunks'.
DECODE_MESSAGE_MAX_BYTES = 4 * 1024 * 1024


def pcie_allreduce_ranges(gpu: str, meas: Measurements) -> dict[str, np.ndarray]:
    """:func:`pcie_allreduce_errors` of ``gpu`` split where the engine prices it differently:
    TP 2 (NCCL's curve) and above (graphed NCCL), there at most and above
    ``DECODE_MESSAGE_MAX_BYTES``."""
    ar = [r for r in meas.allreduce if r.gpu == gpu]
    err = pcie_allreduce_errors(gpu, meas)
    tp2 = np.array([r.ranks == 2 for r in ar])
    small = np.array([r.nbytes <= DECODE_MESSAGE_MAX_BYTES for r in ar])
    return {"TP 2": err[tp2], "TP > 2": err[~tp2],
            "TP > 2, <= 4 MiB": err[~tp2 & small], "TP > 2, > 4 MiB": err[~tp2 & ~small]}


def pcie_allreduce_report(meas: Measurements) -> list[ErrorRow]:
    """Each PCIe GPU's held-out all-reduce (:func:`pcie_allreduce_ranges`) per rank range and
    message range: dataset ``all-reduce-pcie``."""
    return [ErrorRow.of("all-reduce-pcie", f"{g} {rng}", "loo-gpu", err)
            for g in pcie_gpus(meas)
            for rng, err in pcie_allreduce_ranges(g, meas).items() if len(err)]


def allreduce_backends_report(meas: Measurements) -> list[ErrorRow]:
    """vLLM's all-reduce backends fitted on every measured NVLink GPU's table at once
    (:func:`allreduce_backends.fit_backends`: each backend's own latency at the SM clock, its
    link crossings, its bytes over the link), scored on each GPU's own timings: dataset
    ``all-reduce-backends``, in sample (the form a NVLink GPU without a table is priced by;
    ``all-reduce`` ``loo-gpu`` holds each GPU out of it)."""
    nvlink = col.nvlink_timings(meas.allreduce)
    fitted = ab.fit_backends(nvlink)
    rows = []
    for g in sorted({t.gpu.name for t in nvlink}):
        mine = [t for t in nvlink if t.gpu.name == g]
        pred = [ab.backend_allreduce_s([float(t.nbytes)], t.ranks, t.gpu, fitted)
                for t in mine]
        err = np.abs(np.array([np.nan if p is None else float(p[0]) for p in pred])
                     / np.array([t.seconds for t in mine]) - 1)
        rows.append(ErrorRow.of("all-reduce-backends", g, "in-sample", err))
    return rows


def loo_gpu_summary(meas: Measurements, coef: dict[str, KernelCoefficients], rule: str,
                    quant: str) -> tuple[dict[str, float], dict[str, float]]:
    """Per family, the median over GPUs of the held-out median error (stored with the fit),
    a borrowed prefill tile rate carried over by ``rule``, an FP8 quantization rate by
    ``quant``; and the all-reduce's per way the engine prices a GPU without a table
    (:func:`allreduce_loo_by_path`)."""
    rows = family_report(meas, lambda g: coef[g], rule, quant)
    fams = {k[0]: float(f"{v:.4g}") for k, v in summarize(rows).items() if k[1] == "loo-gpu"}
    by_path = allreduce_loo_by_path(rows)
    above = [float(np.median(pcie_allreduce_ranges(g, meas)["TP > 2"]))
             for g in pcie_gpus(meas)]
    if above:
        by_path["pcie-tp>2"] = float(np.median(above))
    return fams, {k: float(f"{v:.4g}") for k, v in by_path.items()}


def _lent_table(gpu: str, src: str, dtype: str, c: KernelCoefficients, meas: Measurements,
                held: KernelCoefficients | None = None) -> np.ndarray:
    """Signed relative error of ``src``'s table scaled (:func:`lent_table_errors`) on each of
    ``gpu``'s fitted GEMMs, NaN where the table does not cover the shape."""
    held = c if held is None else held
    g, s = resolve_gpu(gpu), resolve_gpu(src)
    pts = ff.gemm_fit_points(gemm_points(meas, dtype).get(gpu, []), g, dtype)
    table = [p for p in meas.gemm if p.gpu == src and p.dtype == dtype]
    out = np.full(len(pts), np.nan)
    if not table:
        return out
    t = GemmTable(table)
    for i, p in enumerate(pts):
        if t.covers(p.n, p.k):
            m = np.array([float(p.m)])
            scale = (gemm_form(m, p.k, p.n, g, held, dtype)
                     / gemm_form(m, p.k, p.n, s, c, dtype))
            out[i] = float(t.seconds(m, p.n, p.k)[0] * scale[0]) * 1e6 / p.us - 1.0
    return out


def lent_table_errors(gpu: str, src: str, dtype: str, c: KernelCoefficients,
                      meas: Measurements, held: KernelCoefficients | None = None
                      ) -> np.ndarray | None:
    """Signed relative error on ``gpu``'s GEMMs (the shapes the fit uses) of ``src``'s
    measured table scaled by the ratio of the fitted form on the two data sheets (``c``,
    ``src``'s coefficients, on its own; ``held``, as ``gpu`` borrows them, default ``c``, on
    ``gpu``'s): what ``gpu`` would run borrowing ``src``'s table
    (:func:`chunktune.sim.cost.gemm_table.lent`). None where either has no grid in
    ``dtype``."""
    out = _lent_table(gpu, src, dtype, c, meas, held)
    out = out[~np.isnan(out)]
    return out if len(out) else None


def moe_targets(gpu: str) -> list[tuple[tuple[int, int, int, int, int], np.ndarray]]:
    """What the engine runs for ``gpu``'s bf16 MoE layers from its own data, which a held-out
    GPU's MoE prediction is scored against: its committed table's curves
    (:mod:`chunktune.sim.cost.moe_table`: power-law routing, as the engine assumes real routers
    skew tokens, the fastest backend, the newest release with the curve), per shape (hidden,
    width, experts, top-k, TP; no expert parallelism), microseconds at ``moe_table.TOKENS``.
    The balanced rows the form is fitted on (``family_errors``) route every expert an even
    share and run slower: scored on them, a lender's power-law table looks worse than the
    form fitted to them for routing alone."""
    return sorted((k[:5], us) for k, us in moe_table.curves(gpu, "bf16").items() if k[5] == 1)


def moe_form_errors(gpu: str, c: KernelCoefficients) -> np.ndarray | None:
    """Signed relative error of the fitted form (:func:`step_time.moe_form` under ``c``) on
    :func:`moe_targets`; None where ``gpu`` has no committed table."""
    g = resolve_gpu(gpu)
    t = np.array(moe_table.TOKENS, dtype=np.float64)
    errs = [moe_form(t, h, i / tp, k, e, 3, g, c) * 1e6 / us - 1.0
            for (h, i, e, k, tp), us in moe_targets(gpu)]
    return np.concatenate(errs) if errs else None


def _lent_moe(gpu: str, src: str, c: KernelCoefficients) -> np.ndarray:
    """Signed relative error of ``src``'s committed MoE table scaled (:func:`lent_moe_errors`)
    on :func:`moe_targets` of ``gpu``, NaN where that table lacks the shape."""
    g, s = resolve_gpu(gpu), resolve_gpu(src)
    t = np.array(moe_table.TOKENS, dtype=np.float64)
    out = []
    for (h, i, e, k, tp), us in moe_targets(gpu):
        pred = lent_moe_seconds(g, s, c, "bf16", "bf16", h, i, e, k, tp, 1, t)
        out.append(np.full(len(t), np.nan) if pred is None else pred * 1e6 / us - 1.0)
    return np.concatenate(out) if out else np.array([])


def lent_moe_errors(gpu: str, src: str, c: KernelCoefficients) -> np.ndarray | None:
    """Signed relative error on ``gpu``'s bf16 MoE layers of ``src``'s committed MoE table
    (:mod:`chunktune.sim.cost.moe_table`: power-law routing, the fastest backend, the newest
    release with the curve) of the same shapes, scaled by the ratio of the fitted form under
    ``c``, ``src``'s coefficients, on the two data sheets: what a GPU without an MoE table
    runs borrowing ``src``'s (:func:`chunktune.sim.cost.step_time.lent_moe_seconds`, the
    engine's code), scored on what ``gpu``'s own table makes the engine run
    (:func:`moe_targets`); None where the table has none of ``gpu``'s shapes."""
    out = _lent_moe(gpu, src, c)
    out = out[~np.isnan(out)]
    return out if len(out) else None


def moe_borrowing(meas: Measurements, coef: Callable[[str], KernelCoefficients]
                  ) -> dict[str, Any]:
    """Over the measured GPUs with MoE layers: the held-out median error of borrowing the
    nearest other one running the same MoE kernel (``coefficients.moe_kernel``)'s committed
    MoE table scaled per regime (``table``, :func:`lent_moe_errors`) against borrowing its
    fitted form (``form``), both on what the GPU's own table makes the engine run
    (:func:`moe_targets`), and the one to ``use`` (:func:`chunktune.sim.cost.moe_table.lent`)."""
    have = families_with_data(meas)
    tab, form, held = [], [], []
    for g in sorted(have["moe"]):
        src = borrow_source(g, "moe", have)
        lent = None if src is None else lent_moe_errors(g, src, coef(src))
        if src is None or lent is None:
            continue
        fitted = moe_form_errors(g, coef(src))
        assert fitted is not None
        tab.append(float(np.median(np.abs(lent))))
        form.append(float(np.median(np.abs(fitted))))
        held.append(f"{g} from {src}")
    t, f = float(np.median(tab)), float(np.median(form))
    return {"table": float(f"{t:.4g}"), "form": float(f"{f:.4g}"),
            "use": "table" if t < f else "form", "held_out": ", ".join(held)}


def gemm_borrowing(meas: Measurements, coef: Callable[[str], KernelCoefficients],
                   quant: str | None = None) -> dict[str, dict[str, Any]]:
    """Per GEMM family, over the measured GPUs whose nearest other measured GPU is of the same
    architecture and has a grid: the held-out median error of borrowing that GPU's table
    scaled by the data sheets (``table``) against borrowing its fitted form (``form``), and
    the one to ``use`` (:func:`chunktune.sim.cost.gemm_table.lent`); per architecture where
    one has such pairs (``by_family``), else over all of them. The coefficients as the
    held-out GPU borrows them (:func:`borrowed`, ``quant``: default the committed rule)."""
    quant = quant_rule() if quant is None else quant
    have = families_with_data(meas)
    out: dict[str, dict[str, Any]] = {}

    def decide(tab: list[float], form: list[float], held: list[str]) -> dict[str, Any]:
        t, f = float(np.median(tab)), float(np.median(form))
        return {"table": float(f"{t:.4g}"), "form": float(f"{f:.4g}"),
                "use": "table" if t < f else "form", "held_out": ", ".join(held)}

    for fam, dtype in (("gemm", "bf16"), ("gemm-fp8", "fp8")):
        pairs: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
        for g in sorted(have[fam]):
            src = borrow_source(g, fam, have)
            arch = resolve_gpu(g).family
            if src is None or resolve_gpu(src).family != arch:
                continue
            held = borrowed(g, src, fam, coef(src), quant)
            lent = lent_table_errors(g, src, dtype, coef(src), meas, held)
            if lent is None:
                continue
            fitted = family_errors(fam, g, held, meas)
            assert fitted is not None
            pairs[arch].append((float(np.median(np.abs(lent))), float(np.median(fitted)),
                                f"{g} from {src}"))
        every = [p for ps in pairs.values() for p in ps]
        if every:
            out[fam] = decide(*map(list, zip(*every, strict=True)))
            out[fam]["by_family"] = {a: decide(*map(list, zip(*ps, strict=True)))
                                     for a, ps in sorted(pairs.items())}
    return out


def prefill_borrowing(meas: Measurements, coef: Callable[[str], KernelCoefficients]
                      ) -> dict[str, Any]:
    """Over the measured GPUs with prefill attention: the held-out median error (median over
    GPUs, as ``loo-gpu``) of borrowing the nearest other one's prefill group under each rule
    of ``coefficients.TILE_RATE_RULES``, and the one to ``use`` (the lower; ties keep
    ``data-sheet``)."""
    have = families_with_data(meas)
    fam = "attention-prefill"
    cache: dict[tuple[str, tuple[str, ...]], dict[str, float]] = {}
    med: dict[str, float] = {}
    held = []
    for rule in TILE_RATE_RULES:
        errs = []
        for g in sorted(have[fam]):
            src = borrow_source(g, fam, have)
            if src is None:
                continue
            e = family_errors(fam, g, held_out(g, fam, src, coef, meas, have, cache, rule,
                                               QUANT_RATE_RULES[0]),
                              meas)
            assert e is not None
            errs.append(float(np.median(e)))
            if rule == TILE_RATE_RULES[0]:
                held.append(f"{g} from {src}")
        med[rule] = float(f"{float(np.median(errs)):.4g}")
    use = min(TILE_RATE_RULES, key=lambda r: (med[r], TILE_RATE_RULES.index(r)))
    return {**med, "use": use, "held_out": ", ".join(held)}


def fp8_quant_borrowing(meas: Measurements, coef: Callable[[str], KernelCoefficients]
                        ) -> dict[str, Any]:
    """Over the measured GPUs with FP8 GEMMs: the held-out median error (median over GPUs, as
    ``loo-gpu``: the neighbour's table where the engine borrows it, else its form) with the
    activations' quantization rate carried over under each rule of
    ``coefficients.QUANT_RATE_RULES``, and the one to ``use`` (the lower; ties keep
    ``data-sheet``)."""
    fam = "gemm-fp8"
    have = families_with_data(meas)
    med: dict[str, float] = {}
    held = []
    for rule in QUANT_RATE_RULES:
        decisions = {"gemm": gemm_borrowing(meas, coef, rule)}
        errs = []
        for g in sorted(have[fam]):
            src = borrow_source(g, fam, have)
            if src is None:
                continue
            c = borrowed(g, src, fam, coef(src), rule)
            e = (lent_or_form_errors(g, src, fam, coef(src), c, meas)
                 if borrows_table(g, src, fam, decisions, meas)
                 else family_errors(fam, g, c, meas))
            assert e is not None
            errs.append(float(np.median(e)))
            if rule == QUANT_RATE_RULES[0]:
                held.append(f"{g} from {src}")
        med[rule] = float(f"{float(np.median(errs)):.4g}")
    use = min(QUANT_RATE_RULES, key=lambda r: (med[r], QUANT_RATE_RULES.index(r)))
    return {**med, "use": use, "held_out": ", ".join(held)}


def mla_report(curves: dict[Key, list[float]]) -> list[ErrorRow]:
    """The MLA module (DeepSeek-V3 attention) held out per GPU, on the curves the engine reads
    (:func:`chunktune.sim.cost.fit.mla_derive.served_curves`: the committed grids, the fastest
    backend, the H100's and H200's less the native norm chain): each GPU's curves predicted
    from its nearest other GPU with them (``coefficients.NEAREST``), scaled by the two data
    sheets by the rule the engine borrows a table by for a GPU without one
    (:meth:`chunktune.sim.cost.mla_table.MlaTable.lent`; the engine lends only within a
    compute capability family and memory kind, so the B200 from the H100 here, 13.5% on
    decode, is a harder case than any it runs): the neighbour's fastest curve point
    of the same formats and heads (one decode at the shortest context, a one-token prefill:
    launch-bound) is its floor; a decode is :func:`~chunktune.sim.cost.mla_table
    .lent_decode_us`, a prefill :func:`~chunktune.sim.cost.mla_table.lent_prefill_us`."""
    out = []
    for kind, name in (("gen", "decode"), ("ctx", "prefill")):
        have = {k[0] for k in curves if k[1] == kind}
        for g in sorted(have):
            src = next((o for o in NEAREST.get(g, ()) if o in have), None)
            if src is None:
                continue
            G, S = resolve_gpu(g), resolve_gpu(src)
            # per formats and heads: the lender's fastest point and what that call reads
            floor: dict[tuple[str, str, int], tuple[float, float]] = {}
            for key, us in curves.items():
                if key[:2] != (src, kind):
                    continue
                i = int(np.argmin(us))
                if us[i] < floor.get(key[2:5], (math.inf, 0.0))[0]:
                    floor[key[2:5]] = (us[i], stream_bytes(
                        key[2], key[3], key[4], key[5], STEPS[i]) if kind == "gen" else 0.0)
            err = []
            for key, us in curves.items():
                other = curves.get((src, *key[1:]))
                if key[:2] != (g, kind) or other is None:
                    continue
                f, fb = floor[key[2:5]]
                if kind == "ctx":
                    err += [abs(lent_prefill_us(o, f, key[2], S, G) / u - 1.0)
                            for o, u in zip(other, us, strict=True)]
                    continue
                for step, o, u in zip(STEPS, other, us, strict=True):
                    b = stream_bytes(key[2], key[3], key[4], key[5], step)
                    err.append(abs(lent_decode_us(o, f, fb, b, S, G) / u - 1.0))
            if err:
                out.append(ErrorRow.of(f"mla-{name}", f"{g} from {src}'s table", "loo-table",
                                       np.array(err)))
    return out


def mla_borrowing(curves: dict[Key, list[float]]) -> dict[str, Any]:
    """The committed ``mla_borrowing``: the MLA module held out per GPU as the engine borrows
    a table (:func:`mla_report`), median over GPUs for decode and prefill, and who was held
    out from whom."""
    rows = mla_report(curves)
    summary = summarize(rows)
    held = sorted({r.slice.replace("'s table", "") for r in rows})
    return {"decode": float(f"{summary[('mla-decode', 'loo-table')]:.4g}"),
            "prefill": float(f"{summary[('mla-prefill', 'loo-table')]:.4g}"),
            "held_out": ", ".join(held)}


# ---- cross-checks between sources --------------------------------------------------------

def _band(m: int) -> str:
    return "m<=64" if m <= 64 else "m 65-1024" if m <= 1024 else "m>1024"


def gemm_cross_checks(meas: Measurements) -> list[CrossCheck]:
    """Vidur's (A100, H100) and LLMServingSim's (RTX PRO 6000) per-operator GEMMs against
    AIConfigurator's grid on the same GPU (interpolated: the table the engine uses)."""
    tables: dict[str, GemmTable] = {}
    for g in {p.gpu for p in meas.gemm}:
        tables[g] = GemmTable([p for p in meas.gemm if p.gpu == g and p.dtype == "bf16"])
    out = []
    for name, pts in (("Vidur", meas.vidur), ("LLMServingSim", meas.llmss_linear)):
        ratios: dict[tuple[str, str], list[float]] = defaultdict(list)
        for p in op_gemms(pts):
            t = tables.get(p.gpu)
            if t is None or not t.covers(p.n, p.k) or p.m > aic_data.M_GRID[-1]:
                continue
            ratios[(p.gpu, _band(p.m))].append(p.us / float(t.seconds(
                np.array([p.m]), p.n, p.k)[0] * 1e6))
        for (g, band), r in sorted(ratios.items()):
            out.append(CrossCheck.of(f"gemm {g} {name}/AIConfigurator {band}", np.array(r)))
    return out


def attention_cross_checks(meas: Measurements) -> list[CrossCheck]:
    """LLMServingSim's RTX PRO 6000 prefills alone (one prompt from scratch) and decodes alone
    against AIConfigurator's same batches on the same card."""
    aic = {(r.gpu, r.kind, r.batch, r.prompt, r.history, r.heads, r.kv_heads): r.us
           for r in meas.attention}
    ratios: dict[str, list[float]] = defaultdict(list)
    for p in meas.llmss_attention:
        m = resolve_model(p.model)
        h, kv = m.num_attention_heads // p.tp, max(1, m.num_key_value_heads // p.tp)
        if m.head_dim != aic_kernels.HEAD_DIM:
            continue
        if p.decodes == 0 and p.kv_prefill == 0:
            key = (p.gpu, "prefill", 1, p.chunk, 0, h, kv)
            kind = "prefill alone"
        elif p.chunk == 0 and p.kv_decode > 0:
            key = (p.gpu, "decode", p.decodes, 1, p.kv_decode - 1, h, kv)
            kind = "decodes alone"
        else:
            continue
        if key in aic:
            ratios[f"attention {p.gpu} LLMServingSim/AIConfigurator {kind}"].append(
                p.us / aic[key])
    return [CrossCheck.of(k, np.array(v)) for k, v in sorted(ratios.items())]


def linear_layer_report(meas: Measurements) -> list[ErrorRow]:
    """The engine's per-layer linear time (a measured GPU's own GEMM table, else the fitted
    form, plus the elementwise kernels) against Vidur's and LLMServingSim's per-layer sums."""
    rows = []
    for name, pts in (("vidur-linear", meas.vidur), ("llmss-linear", meas.llmss_linear)):
        by: dict[tuple[str, str, int], list[kd.LinearPoint]] = defaultdict(list)
        for p in pts:
            by[(p.gpu, p.model, p.tp)].append(p)
        errs: dict[str, list[np.ndarray]] = defaultdict(list)
        for (g, m, tp), sel in sorted(by.items()):
            tok = np.array([p.tokens for p in sel], dtype=np.float64)
            pred = linear_layer_time(resolve_model(m), resolve_gpu(g), tp, tok,
                                     coefficients(g)) * 1e3
            errs[g].append(np.abs(pred / np.array([p.per_layer_ms for p in sel]) - 1))
        rows += [ErrorRow.of(name, g, "engine", np.concatenate(e)) for g, e in errs.items()]
    return rows


# ---- held-out datasets -------------------------------------------------------------------

def nccl_report(pts: list[kd.AllReducePoint]) -> list[ErrorRow]:
    """Vidur's NCCL all-reduces per (topology, ranks): the committed curve in sample, then each
    GPU generation predicted from a fit to the other's machines and its own data sheet (its
    NVSwitch unseen: the NVLink bridges' efficiency)."""
    ds = "vidur-nccl"
    c = col.collective_coefficients()
    rows = []
    sweeps = sorted({(p.topology, p.workers) for p in pts})

    def err(coef: col.CollectiveCoefficients, sel: list[kd.AllReducePoint]) -> np.ndarray:
        out: np.ndarray = np.abs(nccl_fit.allreduce_pred_ms(coef, sel)
                                 / np.array([p.ms for p in sel]) - 1.0)
        return out

    for topo, n in sweeps:
        sel = [p for p in pts if (p.topology, p.workers) == (topo, n)]
        rows.append(ErrorRow.of(ds, f"{topo} n{n}", "in-sample", err(c, sel)))
    gens = sorted({p.gpu for p in pts})
    for g in gens if len(gens) > 1 else []:
        other = nccl_fit.fit_allreduce([p for p in pts if p.gpu != g])
        seen = {col.VIDUR_TOPOLOGIES[p.topology].bottleneck(p.workers)[1]
                for p in pts if p.gpu != g}
        eff = {k: other.link_eff[k if k in seen else "nvlink-bridge"] for k in col.LINK_KINDS}
        held = col.CollectiveCoefficients(other.latency_s, other.chunk_bytes, eff,
                                          other.host_floor_s, other.smoothness)
        for topo, n in sweeps:
            if topo.split("_")[0] == g:
                sel = [p for p in pts if (p.topology, p.workers) == (topo, n)]
                rows.append(ErrorRow.of(ds, f"{topo} n{n}", "loo-gpu", err(held, sel)))
    return rows


def splitwise_report(pts: list[kd.SplitwisePoint]) -> list[ErrorRow]:
    """The step-time model on Splitwise's Llama-2-70B static batches (a 2023 engine without
    CUDA graphs): decode iterations at the mean context, prefills of the batch."""
    from chunktune.sim.cost.step_time import StepCostModel

    model = resolve_model("llama-2-70b")
    seen: dict[tuple[str, int, int, int, int], kd.SplitwisePoint] = {}
    for p in pts:  # one row per static-batch shape: token_time does not depend on token_size
        seen.setdefault((p.gpu, p.tp, p.prompt, p.batch, p.generated), p)
    out: dict[tuple[str, int, str], list[float]] = defaultdict(list)
    cms: dict[tuple[str, int], StepCostModel] = {}
    for p in seen.values():
        cm = cms.get((p.gpu, p.tp))
        if cm is None:
            cm = cms[(p.gpu, p.tp)] = StepCostModel(model, resolve_gpu(p.gpu), p.tp)
        b, ctx = p.batch, p.prompt + p.generated // 2
        dec = cm.step_time(b, b, b, [], b, b * ctx) * 1e3
        out[(p.gpu, p.tp, "decode")].append(abs(dec / p.token_ms - 1))
        pre = cm.step_time(b * p.prompt, b, b, [(p.prompt, 0)] * b, 0, 0) * 1e3
        out[(p.gpu, p.tp, "prefill")].append(abs(pre / p.prompt_ms - 1))
    return [ErrorRow.of("splitwise-llama2-70b", f"{g} tp{tp} {kind}", "held-out", np.array(e))
            for (g, tp, kind), e in sorted(out.items())]


def unseen_report(vidur_dir: Path) -> list[ErrorRow]:
    """Vidur timings of models the catalog does not carry (``unseen/``: Qwen-72B,
    InternLM-20B, phi-2 on A100/H100/A40), each model built from the dimensions in its rows,
    per-layer sums through the engine's linear model."""
    acc: dict[tuple[str, str, int], dict[int, list[float]]] = defaultdict(
        lambda: defaultdict(list))
    shapes: dict[str, ModelConfig] = {}
    for f in sorted((vidur_dir / "unseen").glob("*__*.mlp.csv")):
        gpu, name = f.name.removesuffix(".mlp.csv").split("__")
        if name in kd.VIDUR_MODELS:
            continue  # a catalog model: the A40's own fit is made on it
        with f.open() as fh:
            for r in csv.DictReader(fh):
                if name not in shapes:
                    h, heads = int(r["n_embd"]), int(r["n_head"])
                    shapes[name] = ModelConfig(
                        name, h, 1, heads, int(r["n_kv_head"]), h // heads,
                        int(r["n_expanded_embd"]), int(r["vocab_size"]), 4096,
                        gated_mlp=r["use_gated_mlp"] == "True")
                # phi-2 (attention and MLP in parallel) has no post-attention norm column
                ms = sum(float(r.get(f"time_stats.{op}.median") or 0.0) for op in kd.VIDUR_OPS)
                acc[(kd.VIDUR_GPUS[gpu], name, int(r["num_tensor_parallel_workers"]))][
                    int(r["num_tokens"])].append(ms)
    by_slice: dict[tuple[str, str], list[np.ndarray]] = defaultdict(list)
    for (g, name, tp), by_tok in sorted(acc.items()):
        tok = np.array(sorted(by_tok), float)
        meas = np.array([statistics.fmean(by_tok[int(t)]) for t in tok])
        pred = linear_layer_time(shapes[name], resolve_gpu(g), tp, tok, coefficients(g)) * 1e3
        by_slice[(g, name)].append(np.abs(pred / meas - 1.0))
    return [ErrorRow.of("vidur-unseen", f"{g} {name}", "held-out", np.concatenate(errs))
            for (g, name), errs in sorted(by_slice.items())]


# ---- the whole report --------------------------------------------------------------------

def full_report(data_root: Path | None, held_out: bool = True
                ) -> tuple[list[ErrorRow], list[CrossCheck]]:
    """Every family and check: from the raw data under ``data_root`` when given, else the
    committed derived tables."""
    meas = load(data_root)
    rows = family_report(meas, coefficients)
    rows += linear_layer_report(meas)
    rows += pcie_allreduce_report(meas)
    rows += allreduce_backends_report(meas)
    rows += nccl_report(kd.read_allreduce(data_root) if data_root is not None
                        else kd.read_committed_vidur_allreduce())
    if data_root is not None:
        rows += mla_report(mla_derive.served_curves(data_root))
    if data_root is not None and held_out:
        rows += unseen_report(data_root / "vidur-profiling")
        rows += splitwise_report(kd.read_splitwise(data_root))
    return rows, gemm_cross_checks(meas) + attention_cross_checks(meas)


def summarize(rows: list[ErrorRow]) -> dict[tuple[str, str], float]:
    """Median over slices of the median error, per (dataset, mode); ``missing`` rows left
    out."""
    acc: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in rows:
        if r.mode != "missing":
            acc[(r.dataset, r.mode)].append(r.median_rel_err)
    return {k: float(np.median(v)) for k, v in sorted(acc.items())}


def allreduce_link_split(rows: list[ErrorRow]) -> dict[str, float]:
    """The all-reduce ``loo-gpu`` figure over the NVLink GPUs alone and the PCIe GPUs alone
    (median over GPUs of the held-out median error; shown beside the family's figure, which
    stays the median over every GPU)."""
    acc: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r.dataset == "all-reduce" and r.mode == "loo-gpu":
            acc["NVLink" if resolve_gpu(r.slice.split()[0]).nvlink else "PCIe"].append(
                r.median_rel_err)
    return {k: float(np.median(v)) for k, v in sorted(acc.items())}


#: How the engine prices the all-reduce of a GPU without a table of its own
#: (:func:`held_out_allreduce_errors`), as the report's held-out slices name it.
ALLREDUCE_PATHS = {"table": "'s table", "backends": "from backends of ", "pcie": "pcie-nccl"}


def allreduce_loo_by_path(rows: list[ErrorRow]) -> dict[str, float]:
    """The all-reduce ``loo-gpu`` figure per way the engine prices a GPU without a table
    (``ALLREDUCE_PATHS``: another measured GPU's table on the same interconnect, per vLLM
    backend from the NVLink GPUs' tables, NCCL's curve over PCIe), median over the GPUs held
    out that way of their held-out median error: what ``provenance`` quotes for a GPU
    priced that way (the family's figure mixes the three)."""
    acc: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r.dataset == "all-reduce" and r.mode == "loo-gpu":
            path = next(k for k, tag in ALLREDUCE_PATHS.items() if tag in r.slice)
            acc[path].append(r.median_rel_err)
    return {k: float(np.median(v)) for k, v in sorted(acc.items())}


def format_rows(rows: list[ErrorRow]) -> str:
    out = [f"{'dataset':20} {'slice':40} {'mode':10} {'n':>6} {'median':>7} {'p90':>7}"]
    for r in rows:
        if r.mode == "missing":
            out.append(f"{r.dataset:20} {r.slice:40} {'missing':10} {'-':>6} {'-':>7} {'-':>7}")
        else:
            out.append(f"{r.dataset:20} {r.slice:40} {r.mode:10} {r.n:>6} "
                       f"{r.median_rel_err:>7.1%} {r.p90_rel_err:>7.1%}")
    return "\n".join(out)


def format_checks(checks: list[CrossCheck]) -> str:
    out = [f"{'cross-check (ratio other / trusted)':62} {'n':>6} {'median':>7} "
           f"{'p10':>6} {'p90':>6}"]
    out += [f"{c.name:62} {c.n:>6} {c.median_ratio:>7.3f} {c.p10_ratio:>6.3f} "
            f"{c.p90_ratio:>6.3f}" for c in checks]
    return "\n".join(out)


def format_report(rows: list[ErrorRow], checks: list[CrossCheck]) -> str:
    parts = ["Step-time model: relative error per family (or dataset) and slice",
             format_rows(rows), "", format_checks(checks), "",
             "Median over slices (loo-gpu: each GPU predicted as a GPU without data is, from "
             "its nearest other measured GPU, the decode terms from the pool of the others "
             "running its FlashAttention generation; loo-table: the nearest GPU's measured "
             "table scaled by the data sheets):"]
    parts += [f"  {ds:20} {mode:10} {v:6.1%}" for (ds, mode), v in summarize(rows).items()]
    split = allreduce_link_split(rows)
    if split:
        parts.append("  all-reduce loo-gpu by link (not the family's figure): " + ", ".join(
            f"{k} only {v:.1%}" for k, v in split.items()))
    return "\n".join(parts)
