"""The step-time model fitted per GPU on that GPU's measured kernels, and its error report.

``python -m chunktune.sim.cost.fit.kernel_fit fit --data ../shared/data`` fits every GPU with
measured kernels on its own data (:mod:`.measurements`: AIConfigurator's vLLM
kernels on A100, H100, H200, L40S, RTX PRO 6000 and B200; LLMServingSim's on RTX 4090 and RTX PRO
6000; Vidur's on A100, H100 and A40), family by family (:data:`coefficients.GROUPS`). A family a
GPU has no data for is borrowed from its nearest GPU that has it (``coefficients.NEAREST``;
the attention of mixed chunked-prefill batches, measured on the two RTX cards only, is the
common case), decode attention from the pool of GPUs running its FlashAttention generation
(``coefficients.POOLED``; ``pooled`` in the document, for the GPUs without data). It rewrites
the committed tables under ``sim/cost/data/`` (``aic_*.csv``, ``kernel_points.csv``,
``vidur_linear_ms.csv``, ``vidur_allreduce_ms.csv``) and coefficients
(``step_time_coefficients.json``, with each GPU's sources, the leave-one-GPU-out error per
family, the table-or-form decisions ``gemm_borrowing`` and ``moe_borrowing``, the HBM
fraction each GPU's GEMM grids reach streaming weights beyond its L2 (``gemm_hbm_stream``,
the floor of an interpolated GEMM) and how a
borrowed prefill tile rate carries over, ``prefill_borrowing``;
``allreduce_coefficients.json``, NCCL's curve).

``python -m chunktune.sim.cost.fit.kernel_fit report [--data ../shared/data]`` prints, per family
and GPU, the error in sample and with the GPU held out (predicted as a GPU without data would
be: from its nearest measured GPU's coefficients and its own data sheet), the cross-checks
between sources that timed the same kernels, and the held-out datasets
(:mod:`chunktune.sim.cost.fit.kernel_report`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from chunktune.core.gpus import GPUS, resolve_gpu
from chunktune.sim.cost import aic_data, gemm_table
from chunktune.sim.cost import coefficients as coef_mod
from chunktune.sim.cost import collectives as col
from chunktune.sim.cost.coefficients import (
    GROUPS,
    POOLED,
    KernelCoefficients,
    kv_fp8_own_decode_cost,
    lent_quant_memory_eff,
    lent_tile_memory_eff,
    pool_key,
    pool_members,
)
from chunktune.sim.cost.fit import aic_kernels, mla_derive, nccl_fit
from chunktune.sim.cost.fit import family_fit as ff
from chunktune.sim.cost.fit import kernel_data as kd
from chunktune.sim.cost.fit import kernel_report as rep
from chunktune.sim.cost.fit.measurements import (
    Measurements,
    attention_kind,
    attention_points,
    borrow_source,
    elementwise_points,
    families_with_data,
    gemm_points,
    load,
)
from chunktune.sim.cost.mla_table import Key


def _start(gpu: str) -> KernelCoefficients:
    fam = resolve_gpu(gpu).family
    vals = {k: v[0] for k, v in ff.START.items()}
    vals.update({k: v[fam] for k, v in ff.FIXED.items()})
    return KernelCoefficients(**vals)


def fit_gpus(meas: Measurements) -> tuple[dict[str, KernelCoefficients],
                                           dict[str, dict[str, str]]]:
    """Every measured GPU's coefficients, and per family the GPU it was fitted on."""
    have = families_with_data(meas)
    gpus = sorted(set().union(*have.values()))
    coef = {g: _start(g) for g in gpus}
    own: dict[str, dict[str, str]] = {g: {} for g in gpus}
    gemm = {d: gemm_points(meas, d) for d in ("bf16", "fp8")}
    ew = elementwise_points(meas)
    for g in gpus:
        gpu = resolve_gpu(g)
        c = coef[g]
        for dtype, fam in (("bf16", "gemm"), ("fp8", "gemm-fp8")):
            if g in have[fam]:
                c = ff.with_values(c, ff.fit_gemm(c, gemm[dtype][g], gpu, dtype))
                own[g][fam] = g
        if g in have["elementwise"]:
            c = ff.with_values(c, ff.fit_elementwise(c, ew[g]))
            own[g]["elementwise"] = g
        if g in have["all-reduce"]:
            c = ff.with_values(c, ff.fit_allreduce(c, gpu, [r for r in meas.allreduce
                                                            if r.gpu == g]))
            own[g]["all-reduce"] = g
        if g in have["moe"]:
            c = ff.with_values(c, ff.fit_moe(c, gpu, [r for r in meas.moe
                                                     if r.gpu == g and r.dtype == "bf16"]))
            own[g]["moe"] = g
        coef[g] = c
    # attention: the GPUs with mixed batches first (every group free), then the others with
    # the mixed-batch group borrowed from them
    att = {g: attention_points(meas, g) for g in gpus}
    order = sorted(gpus, key=lambda g: g not in have["attention-mixed"])
    for g in order:
        if not att[g]:
            continue
        fams = ff.attention_families(att[g])
        c = coef[g]
        if "attention-mixed" not in fams:
            src = borrow_source(g, "attention-mixed", have)
            if src is not None:
                c = ff.with_values(c, {k: getattr(coef[src], k)
                                       for k in GROUPS["attention-mixed"]})
        # the bf16 cache's groups first; an FP8 cache's on top of them (its rows are decodes
        # of the same shapes, so they measure what FP8 changes and nothing else)
        fp8 = [p for p in att[g] if attention_kind(p) == "attention-kv-fp8"]
        bf16 = [p for p in att[g] if attention_kind(p) != "attention-kv-fp8"]
        if bf16:
            c = ff.with_values(c, ff.fit_attention(
                c, bf16, [f for f in fams if f != "attention-kv-fp8"]))
        if fp8:
            # where one kernel reads both caches (FA3 on Hopper, FlashInfer on SM 10.x) the
            # FP8 decodes cost the bf16 ones' per decode; their own where FlashInfer reads
            # the FP8 cache beside FlashAttention 2 (coefficients.kv_fp8_own_decode_cost)
            own_cost = kv_fp8_own_decode_cost(resolve_gpu(g))
            if not own_cost:
                c = ff.with_values(c, {"attn_kv_fp8_per_decode_s": c.attn_per_decode_s})
            c = ff.with_values(c, ff.fit_attention(
                c, fp8, ["attention-kv-fp8"],
                () if own_cost else ("attn_kv_fp8_per_decode_s",)))
        coef[g] = c
        own[g].update({f: g for f in fams})
    sources: dict[str, dict[str, str]] = {}
    for g in gpus:
        sources[g] = {}
        for fam in GROUPS:
            src = g if fam in own[g] else borrow_source(g, fam, have)
            if src is None:
                continue
            sources[g][fam] = src
            if src != g:
                coef[g] = ff.with_values(coef[g], {k: getattr(coef[src], k)
                                                   for k in GROUPS[fam]})
    # the pooled families a GPU's data lacks: from its pool rather than its nearest GPU
    cache: dict[tuple[str, tuple[str, ...]], dict[str, float]] = {}
    for fam in POOLED:
        for g in gpus:
            members = pool_members(resolve_gpu(g), fam, have[fam])
            if g in have[fam] or not members:
                continue
            coef[g] = ff.with_values(coef[g], rep.pooled_fit(fam, members, lambda d: coef[d],
                                                             meas, cache))
            sources[g][fam] = "+".join(members)
    for g in gpus:
        if not kv_fp8_own_decode_cost(resolve_gpu(g)):
            coef[g] = ff.with_values(coef[g], {"attn_kv_fp8_per_decode_s":
                                               coef[g].attn_per_decode_s})
    return coef, sources


def pools(meas: Measurements, coef: dict[str, KernelCoefficients]) -> dict[str, Any]:
    """The committed ``pooled`` groups: per pooled family and pool (``coefficients.pool_key``)
    that a catalog GPU without measured kernels borrows, its GPUs and coefficients."""
    have = families_with_data(meas)
    out: dict[str, dict[str, Any]] = {}
    cache: dict[tuple[str, tuple[str, ...]], dict[str, float]] = {}
    for fam in POOLED:
        out[fam] = {}
        for name, gpu in sorted(GPUS.items()):
            key = pool_key(gpu, fam)
            members = pool_members(gpu, fam, have[fam])
            if name in coef or key in out[fam] or not members:
                continue
            out[fam][key] = {"gpus": members, "coefficients": rep.pooled_fit(
                fam, members, lambda d: coef[d], meas, cache)}
    return out


def document(meas: Measurements, mla_curves: dict[Key, list[float]] | None = None
             ) -> dict[str, Any]:
    """The committed ``data/step_time_coefficients.json`` (``mla_curves``: every GPU's MLA
    module curves, :func:`mla_derive.served_curves`, for ``mla_borrowing``)."""
    coef, sources = fit_gpus(meas)
    # the prefill tile rate a borrower carries over: the rule that predicts the measured GPUs
    # held out better, applied to the measured GPUs that borrow the prefill group
    prefill = rep.prefill_borrowing(meas, lambda g: coef[g])
    for g, src in sources.items():
        lender = src.get("attention-prefill", g)
        if lender != g:
            coef[g] = ff.with_values(coef[g], {"attn_tile_memory_eff": lent_tile_memory_eff(
                coef[lender].attn_tile_memory_eff, resolve_gpu(lender), resolve_gpu(g),
                prefill["use"])})
    # the FP8 activations' quantization rate likewise (coefficients.QUANT_RATE_RULES)
    quant = rep.fp8_quant_borrowing(meas, lambda g: coef[g])
    for g, src in sources.items():
        lender = src.get("gemm-fp8", g)
        if lender != g:
            coef[g] = ff.with_values(coef[g], {"fp8_quant_memory_eff": lent_quant_memory_eff(
                coef[lender].fp8_quant_memory_eff, resolve_gpu(lender), resolve_gpu(g),
                quant["use"])})
    loo, loo_by_path = rep.loo_gpu_summary(meas, coef, prefill["use"], quant["use"])
    versions = aic_kernels.gemm_versions_text(meas.gemm_versions)
    return {
        "source": "per GPU, fitted on its own measured kernels "
                  "(chunktune.sim.cost.fit.kernel_fit): "
                  f"{aic_kernels.SOURCE} (Apache-2.0; GEMM versions {versions}); "
                  "casys-kaist/LLMServingSim profiler/perf/*/bf16 (vLLM 0.19, MIT); "
                  "microsoft/vidur data/profiling/compute (MIT)",
        "trusted": "where two sources timed the same GEMMs, "
                   "chunktune.sim.cost.fit.measurements.TRUSTED",
        "fixed_sources": "see chunktune.sim.cost.fit.family_fit.FIXED",
        "loo_gpu": loo,
        "allreduce_loo_by_path": loo_by_path,
        "gemm_borrowing": rep.gemm_borrowing(meas, lambda g: coef[g], quant["use"]),
        "moe_borrowing": rep.moe_borrowing(meas, lambda g: coef[g]),
        "gemm_hbm_stream": gemm_table.hbm_stream_document(meas.gemm),
        "prefill_borrowing": prefill,
        "fp8_quant_borrowing": quant,
        **({"mla_borrowing": rep.mla_borrowing(mla_curves)} if mla_curves else {}),
        "pooled": pools(meas, coef),
        "gpus": {g: {"sources": sources[g],
                     "coefficients": {k: float(f"{v:.6g}") for k, v in c.to_dict().items()}}
                 for g, c in sorted(coef.items())},
    }


def write_tables(root: Path, meas: Measurements) -> None:
    """The committed derived tables, from the raw data under ``root``."""
    kd.write_vidur(meas.vidur)
    kd.write_points(kd.committed_subset(meas.llmss_attention), meas.llmss_linear)
    aic_kernels.write_gemm(meas.gemm, meas.gemm_versions)
    aic_kernels.write_allreduce(meas.allreduce)
    aic_kernels.write_allreduce(aic_kernels.read_no_p2p_allreduce(root),
                                aic_data.NO_P2P_ALLREDUCE_PATH, aic_kernels.NO_P2P_HEADER)
    aic_kernels.write_points(*aic_kernels.committed_subset(meas.attention, meas.moe))
    ar = kd.read_allreduce(root)
    kd.write_allreduce(kd.allreduce_subsample(ar))
    col.COLLECTIVE_COEFFICIENTS_PATH.write_text(
        json.dumps(nccl_fit.allreduce_document(ar), indent=2) + "\n")


def _clear_caches() -> None:
    coef_mod.load_document.cache_clear()
    gemm_table._tables.cache_clear()
    col._load.cache_clear()
    col._measured.cache_clear()
    col._host_memory.cache_clear()
    col.pcie_p2p_backend_coefficients.cache_clear()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m chunktune.sim.cost.fit.kernel_fit")
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit", help="derive the tables and fit the coefficients")
    f.add_argument("--data", type=Path, required=True,
                   help="the shared data folder (aiconfigurator-vllm/, vidur-profiling/, ...)")
    r = sub.add_parser("report", help="print the error tables for the committed coefficients")
    r.add_argument("--data", type=Path, default=None,
                   help="the shared data folder: report on the full raw data (default: the "
                        "committed derived tables only)")
    r.add_argument("--no-held-out", action="store_true",
                   help="skip the held-out datasets (Splitwise, Vidur's unseen models)")
    a = ap.parse_args(argv)
    data: Path | None = a.data
    if data is not None:
        for sub_dir in ("vidur-profiling", "llmservingsim-vllm019", "splitwise",
                        aic_kernels.AIC_DIR):
            if not (data / sub_dir).is_dir():
                ap.error(f"--data {data}: no {sub_dir}/ folder; give the shared data folder")
    if a.cmd == "fit":
        assert data is not None
        meas = load(data)
        write_tables(data, meas)
        _clear_caches()
        coef_mod.COEFFICIENTS_PATH.write_text(json.dumps(
            document(meas, mla_derive.served_curves(data)), indent=2) + "\n")
        _clear_caches()
        print("wrote " + ", ".join(p.name for p in (
            kd.VIDUR_PATH, kd.POINTS_PATH, aic_data.GEMM_PATH, aic_data.ALLREDUCE_PATH,
            aic_data.NO_P2P_ALLREDUCE_PATH, aic_kernels.POINTS_PATH, kd.ALLREDUCE_PATH,
            col.COLLECTIVE_COEFFICIENTS_PATH, coef_mod.COEFFICIENTS_PATH)))
        return 0
    rows, checks = rep.full_report(data, held_out=not a.no_held_out)
    print(rep.format_report(rows, checks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
