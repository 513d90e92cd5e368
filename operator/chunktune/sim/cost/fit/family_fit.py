"""Each operator family of the step-time model fitted to, and predicted on, one GPU's
measured kernels.

Every fit is least squares on the log ratio predicted/measured (every measured set weighted
equally), with efficiencies as fractions of the GPU's own data sheet, so that a GPU without
data can borrow them (:mod:`chunktune.sim.cost.coefficients`). The forms are the step-time
model's own functions (:mod:`chunktune.sim.cost.step_time`), evaluated on arrays.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from chunktune.core.gpus import GPU, resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.sim.cost import aic_data
from chunktune.sim.cost.coefficients import GROUPS, KernelCoefficients
from chunktune.sim.cost.collectives import vllm_allreduce_s
from chunktune.sim.cost.fit import aic_kernels
from chunktune.sim.cost.fit import kernel_data as kd
from chunktune.sim.cost.fit.measurements import Measurements, attention_kind, attention_points
from chunktune.sim.cost.step_time import (
    AttentionShape,
    attention_grid_time,
    gemm_form,
    linear_op_times,
    moe_form,
)

#: Coefficients not fitted here, by GPU family, with where they come from.
FIXED = {
    # vLLM V1: "the GPU part of a Llama-8B step on H100 is as low as ~5 ms" and the CPU work
    # is overlapped or CUDA-graphed; ~1 ms per step plus a few us per request remains.
    "step_overhead_s": {"ampere": 0.0012, "hopper": 0.001, "ada": 0.0012, "blackwell": 0.001},
    "per_request_overhead_s": {"ampere": 6e-6, "hopper": 5e-6, "ada": 6e-6, "blackwell": 5e-6},
    # --enforce-eager: ~10 kernels per layer launched from Python at ~4 us each.
    "eager_launch_overhead_per_layer_s": {"ampere": 4e-5, "hopper": 4e-5, "ada": 4e-5,
                                          "blackwell": 4e-5},
}
#: Where each fitted group starts (and its scale for the optimiser).
START: dict[str, tuple[float, float]] = {
    "gemm_compute_eff": (0.8, 0.1), "gemm_memory_eff": (0.8, 0.1),
    "gemm_overhead_s": (5e-6, 1e-6), "gemm_smoothness": (1.5, 0.3),
    "fp8_compute_eff": (0.7, 0.1), "fp8_memory_eff": (0.8, 0.1), "fp8_overhead_s": (5e-6, 1e-6),
    "fp8_smoothness": (1.5, 0.3), "fp8_quant_memory_eff": (0.5, 0.1),
    "elementwise_memory_eff": (0.6, 0.1), "elementwise_overhead_s": (2e-6, 1e-6),
    "elementwise_l2_bytes_per_sm_cycle": (8.0, 2.0),
    "attn_overhead_s": (7e-6, 1e-6), "attn_per_decode_s": (1e-7, 1e-7),
    "attn_compute_eff": (0.6, 0.1), "attn_cta_cycles_per_flop": (1.5e-3, 5e-4),
    "attn_tile_memory_eff": (1.0, 0.3), "attn_mixed_memory_eff": (1.0, 0.3),
    "attn_reread_l2_bytes_per_sm_s": (1e10, 3e9), "attn_smoothness": (4.0, 1.0),
    "attn_per_wave_s": (1e-6, 1e-6), "attn_decode_alone_overhead_s": (4e-6, 1e-6),
    "attn_decode_memory_eff": (0.85, 0.1), "attn_kv_fp8_bytes": (1.0, 0.1),
    "attn_kv_fp8_overhead_s": (1e-6, 1e-6), "attn_kv_fp8_per_decode_s": (1e-7, 1e-7),
    "allreduce_latency_s": (1e-5, 1e-5), "allreduce_link_eff": (0.5, 0.1),
    "moe_compute_eff": (0.5, 0.1), "moe_memory_eff": (0.6, 0.1), "moe_overhead_s": (2e-5, 1e-5),
    "moe_smoothness": (2.0, 0.5),
}
#: Fitted as their excess over 1 (soft-maximum exponents).
_ABOVE_ONE = ("gemm_smoothness", "fp8_smoothness", "attn_smoothness", "moe_smoothness")
#: Fractions of a data-sheet peak that cannot exceed 1.
_CAPPED = ("attn_compute_eff", "gemm_compute_eff", "fp8_compute_eff", "moe_compute_eff")
#: The GEMM fit's shapes: both widths at least 256, at most 16,384 tokens, and weights of at
#: least a quarter of the L2 (smaller ones stayed in L2 between the grid's repeated calls).
MIN_WIDTH = 256
MAX_TOKENS = 16384


def _fit(fields: Sequence[str], resid: Any) -> dict[str, float]:
    """Least squares over ``fields`` (``resid(values) -> residual array``)."""
    from scipy.optimize import least_squares

    def values(x: np.ndarray) -> dict[str, float]:
        v = {f: float(abs(xi)) + 1e-12 for f, xi in zip(fields, x, strict=True)}
        for f in fields:
            if f in _ABOVE_ONE:
                v[f] += 1.0
            if f in _CAPPED:
                v[f] = min(v[f], 1.0)
        return v

    x0 = np.array([START[f][0] - (1.0 if f in _ABOVE_ONE else 0.0) for f in fields])
    res = least_squares(lambda x: resid(values(x)), x0,
                        x_scale=np.array([START[f][1] for f in fields]))
    return {k: float(f"{v:.6g}") for k, v in values(res.x).items()}


def with_values(c: KernelCoefficients, values: dict[str, float]) -> KernelCoefficients:
    return replace(c, **values)


# ---- GEMMs -------------------------------------------------------------------------------

def _gemm_arrays(points: list[aic_data.GemmPoint]) -> tuple[np.ndarray, ...]:
    return tuple(np.array([getattr(p, a) for p in points], dtype=np.float64)
                 for a in ("m", "n", "k", "us"))


def gemm_pred_us(c: KernelCoefficients, gpu: GPU, points: list[aic_data.GemmPoint],
                 dtype: str) -> np.ndarray:
    """The fitted form's microseconds for measured GEMMs (never the GPU's own table)."""
    m, n, k, _ = _gemm_arrays(points)
    out: np.ndarray = gemm_form(m, k, n, gpu, c, dtype) * 1e6
    return out


def gemm_fit_points(points: list[aic_data.GemmPoint], gpu: GPU, dtype: str
                    ) -> list[aic_data.GemmPoint]:
    wb = 1.0 if dtype == "fp8" else 2.0
    l2 = gpu.l2_mib * 2**20
    return [p for p in points if p.n >= MIN_WIDTH and p.k >= MIN_WIDTH and p.m <= MAX_TOKENS
            and p.n * p.k * wb >= l2 / 4]


def fit_gemm(base: KernelCoefficients, points: list[aic_data.GemmPoint], gpu: GPU,
             dtype: str) -> dict[str, float]:
    """The ``gemm`` (bf16) or ``gemm-fp8`` group on one GPU's GEMMs."""
    pts = gemm_fit_points(points, gpu, dtype)
    us = _gemm_arrays(pts)[3]

    def resid(v: dict[str, float]) -> np.ndarray:
        out: np.ndarray = np.log(gemm_pred_us(with_values(base, v), gpu, pts, dtype) / us)
        return out

    return _fit(GROUPS["gemm-fp8" if dtype == "fp8" else "gemm"], resid)


# ---- elementwise kernels -----------------------------------------------------------------

def elementwise_pred_ms(c: KernelCoefficients, points: list[kd.LinearPoint]) -> np.ndarray:
    out = np.empty(len(points))
    by: dict[tuple[str, str, int], list[int]] = defaultdict(list)
    for i, p in enumerate(points):
        by[(p.gpu, p.model, p.tp)].append(i)
    for (g, m, tp), idx in by.items():
        tok = np.array([points[i].tokens for i in idx], dtype=np.float64)
        out[idx] = linear_op_times(resolve_model(m), resolve_gpu(g), tp, tok, c,
                                   use_table=False)["elementwise"] * 1e3
    return out


def fit_elementwise(base: KernelCoefficients, points: list[kd.LinearPoint]) -> dict[str, float]:
    ms = np.array([p.ops[-1] for p in points])

    def resid(v: dict[str, float]) -> np.ndarray:
        out: np.ndarray = np.log(elementwise_pred_ms(with_values(base, v), points) / ms)
        return out

    return _fit(GROUPS["elementwise"], resid)


# ---- attention ---------------------------------------------------------------------------

AttentionMeasurement = kd.AttentionPoint | aic_kernels.AttentionRow


def attention_arrays(points: Sequence[AttentionMeasurement]) -> dict[str, np.ndarray]:
    """Columns of :func:`chunktune.sim.cost.step_time.attention_grid_time` for measured
    batches of either source: LLMServingSim's mixed grid (one chunk beside decodes) and
    AIConfigurator's prefills (``batch`` prompts from scratch) and decodes."""
    cols: dict[str, list[float]] = defaultdict(list)
    shapes: dict[tuple[str, int], AttentionShape] = {}
    for p in points:
        g = resolve_gpu(p.gpu)
        if isinstance(p, kd.AttentionPoint):
            if (p.model, p.tp) not in shapes:
                shapes[(p.model, p.tp)] = AttentionShape.of(resolve_model(p.model), p.tp)
            s = shapes[(p.model, p.tp)]
            heads, kv, hd = s.heads, s.kv_heads, s.head_dim
            chunk, computed, pre, dec, ctx = (p.chunk, p.kv_prefill, 1.0, p.decodes,
                                              p.decodes * p.kv_decode)
            fp8 = 0.0
        else:
            heads, kv, hd = p.heads, p.kv_heads, aic_kernels.HEAD_DIM
            fp8 = float(p.kind == "decode-fp8")
            if p.kind == "prefill":
                chunk, computed, pre, dec, ctx = p.prompt, 0, p.batch, 0, 0
            else:
                chunk, computed, pre, dec, ctx = 0, 0, 0.0, p.batch, p.batch * (p.history + 1)
        for name, v in (("heads", heads), ("kv_heads", kv), ("head_dim", hd),
                        ("sm", g.sm_count), ("peak", g.bf16_tflops * 1e12),
                        ("hbm", g.hbm_tb_s * 1e12), ("l2", g.l2_mib * 2**20),
                        ("clock", g.boost_mhz * 1e6), ("fa3", g.flash_attention >= 3),
                        ("chunk", chunk), ("computed", computed), ("prefills", pre),
                        ("decodes", dec), ("ctx", ctx), ("kv_fp8", fp8), ("us", p.us)):
            cols[name].append(float(v))
    return {k: np.array(v, dtype=np.float64) for k, v in cols.items()}


def attention_pred_us(c: KernelCoefficients, a: dict[str, np.ndarray]) -> np.ndarray:
    """The model's microseconds for :func:`attention_arrays`' batches: a bf16 KV cache at 2
    bytes per element, an FP8 one at ``attn_kv_fp8_bytes`` plus ``attn_kv_fp8_overhead_s``
    and ``attn_kv_fp8_per_decode_s`` for each decode (as
    :class:`chunktune.sim.cost.step_time.StepCostModel` costs it)."""
    coef: dict[str, Any] = {k: getattr(c, k) for f in ("attention-prefill", "attention-decode",
                                                       "attention-mixed") for k in GROUPS[f]}
    fp8 = a["kv_fp8"] > 0
    coef["attn_per_decode_s"] = np.where(fp8, c.attn_kv_fp8_per_decode_s, c.attn_per_decode_s)
    out: np.ndarray = (attention_grid_time(
        a["heads"], a["kv_heads"], a["head_dim"], np.where(fp8, c.attn_kv_fp8_bytes, 2.0),
        a["sm"], a["peak"], a["hbm"], a["l2"], a["clock"], coef, a["chunk"], a["computed"],
        a["decodes"], a["ctx"], a["fa3"] > 0, a["prefills"])
        + np.where(fp8, c.attn_kv_fp8_overhead_s, 0.0)) * 1e6
    return out


def _set_key(p: AttentionMeasurement) -> tuple[Any, ...]:
    if isinstance(p, kd.AttentionPoint):
        return ("llmss", p.model, p.tp)
    return ("aic", p.kind, p.heads, p.kv_heads)


def fit_attention(base: KernelCoefficients, points: Sequence[AttentionMeasurement],
                  families: Sequence[str], held: Sequence[str] = ()) -> dict[str, float]:
    """The attention groups ``families`` on one GPU's measured batches, the other attention
    groups (and the fields ``held``) held at ``base`` (borrowed where the GPU has no such
    batches)."""
    a = attention_arrays(points)
    keys = [_set_key(p) for p in points]
    ids = {k: i for i, k in enumerate(sorted(set(keys), key=str))}
    grp = np.array([ids[k] for k in keys])
    w = 1.0 / np.sqrt(np.bincount(grp)[grp])
    log_us = np.log(a["us"])

    def resid(v: dict[str, float]) -> np.ndarray:
        out: np.ndarray = (np.log(attention_pred_us(with_values(base, v), a)) - log_us) * w
        return out

    return _fit([f for fam in families for f in GROUPS[fam] if f not in held], resid)


def attention_families(points: Sequence[AttentionMeasurement]) -> list[str]:
    kinds = {attention_kind(p) for p in points}
    return [f for f in ("attention-prefill", "attention-decode", "attention-mixed",
                        "attention-kv-fp8") if f in kinds]


# ---- all-reduce and MoE ------------------------------------------------------------------

def allreduce_pred_us(c: KernelCoefficients, gpu: GPU,
                      rows: list[aic_data.AllReduceRow]) -> np.ndarray:
    out = np.empty(len(rows))
    for i, r in enumerate(rows):
        out[i] = float(vllm_allreduce_s(np.array(float(r.nbytes)), r.ranks, gpu,
                                        c.allreduce_latency_s, c.allreduce_link_eff)) * 1e6
    return out


def fit_allreduce(base: KernelCoefficients, gpu: GPU,
                  rows: list[aic_data.AllReduceRow]) -> dict[str, float]:
    us = np.array([r.us for r in rows])

    def resid(v: dict[str, float]) -> np.ndarray:
        out: np.ndarray = np.log(allreduce_pred_us(with_values(base, v), gpu, rows) / us)
        return out

    return _fit(GROUPS["all-reduce"], resid)


def moe_pred_us(c: KernelCoefficients, gpu: GPU, rows: list[aic_kernels.MoeRow]) -> np.ndarray:
    col = {a: np.array([getattr(r, a) for r in rows], dtype=np.float64)
           for a in ("tokens", "hidden", "inter", "topk", "experts", "tp")}
    out: np.ndarray = moe_form(col["tokens"], col["hidden"], col["inter"] / col["tp"],
                               col["topk"], col["experts"], 3.0, gpu, c) * 1e6
    return out


def fit_moe(base: KernelCoefficients, gpu: GPU,
            rows: list[aic_kernels.MoeRow]) -> dict[str, float]:
    us = np.array([r.us for r in rows])

    def resid(v: dict[str, float]) -> np.ndarray:
        out: np.ndarray = np.log(moe_pred_us(with_values(base, v), gpu, rows) / us)
        return out

    return _fit(GROUPS["moe"], resid)


# ---- a pool of GPUs fitted together ------------------------------------------------------

def fit_pooled(family: str, members: Sequence[str],
               coef: Callable[[str], KernelCoefficients], meas: Measurements
               ) -> dict[str, float]:
    """An attention ``family``'s group (``coefficients.POOLED``) fitted on the timings of
    every GPU of ``members`` together: each at its own data sheet and its own coefficients for
    the other groups, the measured sets weighted equally within a GPU (as
    :func:`fit_attention`) and each GPU weighted equally."""
    data = []
    for g in members:
        pts = [p for p in attention_points(meas, g) if attention_kind(p) == family]
        keys = [_set_key(p) for p in pts]
        ids = {k: i for i, k in enumerate(sorted(set(keys), key=str))}
        grp = np.array([ids[k] for k in keys])
        w = 1.0 / np.sqrt(np.bincount(grp)[grp]) / np.sqrt(len(ids))
        a = attention_arrays(pts)
        data.append((coef(g), a, np.log(a["us"]), w))

    def resid(v: dict[str, float]) -> np.ndarray:
        out: np.ndarray = np.concatenate([
            (np.log(attention_pred_us(with_values(c, v), a)) - log_us) * w
            for c, a, log_us, w in data])
        return out

    return _fit(GROUPS[family], resid)
