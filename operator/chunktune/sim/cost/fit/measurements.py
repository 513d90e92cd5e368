"""Every measured kernel timing the step-time model is fitted and checked on, by GPU and
operator family.

Sources (readers: :mod:`.aic_kernels` and :mod:`.kernel_data`):
AIConfigurator's vLLM kernels (A100, H100, H200, L40S, RTX PRO 6000, B200: GEMMs in bf16 and fp8,
prefill and decode attention, all-reduce, fused MoE), LLMServingSim's vLLM 0.19 profiles (RTX
4090, RTX PRO 6000: per-operator linear layers and mixed chunked-prefill attention) and Vidur's
(A100, H100, A40: per-operator linear layers). Read from the raw data beside the checkout
(``../shared/data``) or from the committed derived tables.

Where two sources time the same kernels on one GPU, the fit trusts AIConfigurator's (vLLM's own
layers, timed by vLLM 0.14-0.24; ``TRUSTED``): Vidur's H100 and A100 GEMMs (2023) agree with it
where they are memory-bound and are 13-34% slower where they are compute-bound, and
LLMServingSim's RTX PRO 6000 GEMMs (vLLM 0.19) agree with AIConfigurator's vLLM 0.24 grid within
2-7% (median by model and TP). ``kernel_fit report`` prints both checks; the tests hold them.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.sim.cost import aic_data
from chunktune.sim.cost.coefficients import KERNEL_MATCHED, NEAREST
from chunktune.sim.cost.fit import aic_kernels
from chunktune.sim.cost.fit import kernel_data as kd
from chunktune.sim.cost.step_time import layer_gemms

#: The operator families the report holds each GPU out of.
FAMILIES = ("gemm", "gemm-fp8", "attention-prefill", "attention-decode", "attention-mixed",
            "attention-kv-fp8", "all-reduce", "moe", "elementwise")
#: Which source a GPU's GEMMs are fitted on when several timed them.
TRUSTED = "AIConfigurator (vLLM's own layers, vLLM 0.14-0.24) over Vidur and LLMServingSim"
GEMM_OPS = ("qkv", "o", "up", "down")


@dataclass
class Measurements:
    """Everything measured, raw (``../shared/data``) or from the committed tables."""

    vidur: list[kd.LinearPoint]
    llmss_linear: list[kd.LinearPoint]
    llmss_attention: list[kd.AttentionPoint]
    gemm: list[aic_data.GemmPoint]
    attention: list[aic_kernels.AttentionRow]
    allreduce: list[aic_data.AllReduceRow]
    moe: list[aic_kernels.MoeRow]
    #: vLLM version per (GPU, dtype, kernel) of the GEMM grid (raw data only)
    gemm_versions: dict[tuple[str, str, str], str] = field(default_factory=dict)
    raw: bool = False


def load(root: Path | None) -> Measurements:
    """From the shared data folder ``root`` (the whole attention grids), or (None) from the
    committed derived tables (their sub-grids)."""
    if root is None:
        att, lin = kd.read_points()
        aic_att, moe = aic_kernels.read_points()
        return Measurements(kd.read_vidur(), lin, att, aic_data.read_committed_gemm(),
                            [r for r in aic_att if engine_regime(r)],
                            aic_data.read_committed_allreduce(), moe)
    gemm, versions = aic_kernels.read_gemm(root)
    return Measurements(kd.derive_vidur(root / "vidur-profiling"), kd.read_llmss_linear(root),
                        kd.read_attention(root), aic_kernels.gemm_grid(gemm),
                        [r for r in aic_kernels.read_attention(root) if engine_regime(r)],
                        aic_kernels.read_allreduce(root), aic_kernels.read_moe(root), versions,
                        raw=True)


def op_gemms(points: list[kd.LinearPoint]) -> list[aic_data.GemmPoint]:
    """The four GEMMs of per-operator linear timings (Vidur, LLMServingSim: bf16) as GEMM
    points, their shapes from the model."""
    out = []
    for p in points:
        if len(p.ops) != len(kd.LINEAR_FIT_OPS):
            continue
        shapes = layer_gemms(resolve_model(p.model), p.tp)
        for (k, n), ms in zip(shapes, p.ops, strict=False):
            out.append(aic_data.GemmPoint(p.gpu, "bf16", p.tokens, round(n), round(k),
                                          ms * 1e3))
    return out


def gemm_points(meas: Measurements, dtype: str = "bf16") -> dict[str, list[aic_data.GemmPoint]]:
    """Per GPU, the GEMMs its fitted form is fitted on: AIConfigurator's grid where it has
    one (``TRUSTED``), else LLMServingSim's operators (RTX 4090), else Vidur's (A40)."""
    out: dict[str, list[aic_data.GemmPoint]] = defaultdict(list)
    for p in meas.gemm:
        if p.dtype == dtype:
            out[p.gpu].append(p)
    if dtype == "bf16":
        aic = {q.gpu for q in meas.gemm}
        for p in op_gemms(meas.llmss_linear + meas.vidur):
            if p.gpu not in aic:
                out[p.gpu].append(p)
    return dict(out)


def elementwise_points(meas: Measurements) -> dict[str, list[kd.LinearPoint]]:
    out: dict[str, list[kd.LinearPoint]] = defaultdict(list)
    for p in meas.vidur + meas.llmss_linear:
        if len(p.ops) == len(kd.LINEAR_FIT_OPS):
            out[p.gpu].append(p)
    return dict(out)


#: AIConfigurator's attention rows the model is fitted and checked on: at least 4 query heads
#: and 16-token prompts per rank (fewer are no model's shape), and decodes whose KV is either
#: under ``WARM_KV_MIN`` or beyond twice the L2. The benchmark calls one layer again and again,
#: so a decode batch's KV that fits the L2 is read from it; in an engine step every other
#: layer's weights and KV pass through the L2 between two calls of a layer, so it is not
#: (RTX PRO 6000, 64 decodes of 255 tokens: measured twice as fast as its HBM allows).
MIN_HEADS = 4
MIN_PROMPT = 16
WARM_KV_MIN = 2**20


def engine_regime(r: aic_kernels.AttentionRow) -> bool:
    """Whether an AIConfigurator attention row times what an engine step would."""
    if r.heads < MIN_HEADS:
        return False
    if r.kind == "prefill":
        return r.prompt >= MIN_PROMPT
    kv = (r.batch * (r.history + 1) * r.kv_heads * aic_kernels.HEAD_DIM * 2
          * (1 if r.kind == "decode-fp8" else 2))
    l2 = resolve_gpu(r.gpu).l2_mib * 2**20
    return not WARM_KV_MIN < kv < 2 * l2


def attention_kind(p: kd.AttentionPoint | aic_kernels.AttentionRow) -> str:
    """The family a measured attention batch belongs to."""
    if isinstance(p, aic_kernels.AttentionRow):
        return {"prefill": "attention-prefill", "decode": "attention-decode",
                "decode-fp8": "attention-kv-fp8"}[p.kind]
    if p.decodes == 0:
        return "attention-prefill"
    return "attention-decode" if p.chunk == 0 else "attention-mixed"


def attention_points(meas: Measurements, gpu: str | None = None
                     ) -> list[kd.AttentionPoint | aic_kernels.AttentionRow]:
    """Every measured attention batch of both sources (of ``gpu`` only, when given)."""
    out: list[kd.AttentionPoint | aic_kernels.AttentionRow] = [*meas.attention,
                                                             *meas.llmss_attention]
    return out if gpu is None else [p for p in out if p.gpu == gpu]


def families_with_data(meas: Measurements) -> dict[str, set[str]]:
    """Per family, the GPUs whose own timings have it."""
    fam: dict[str, set[str]] = defaultdict(set)
    for dtype, name in (("bf16", "gemm"), ("fp8", "gemm-fp8")):
        fam[name] |= set(gemm_points(meas, dtype))
    fam["elementwise"] |= set(elementwise_points(meas))
    for a in attention_points(meas):
        fam[attention_kind(a)].add(a.gpu)
    fam["all-reduce"] |= {r.gpu for r in meas.allreduce}
    fam["moe"] |= {r.gpu for r in meas.moe if r.dtype == "bf16"}
    return {f: fam.get(f, set()) for f in FAMILIES}


def borrow_source(gpu: str, family: str, have: dict[str, set[str]]) -> str | None:
    """The nearest other GPU (``coefficients.NEAREST``) whose own data has ``family`` (for
    all-reduces, on the same kind of link; for a family of ``coefficients.KERNEL_MATCHED``, an
    FP8 KV cache's terms or MoE layers, running the same kernel where one does): where a GPU
    without such data takes that family from, and what holding ``gpu`` out predicts it from."""
    g = resolve_gpu(gpu)
    found = [o for o in NEAREST.get(gpu, ()) if o in have[family]
             and (family != "all-reduce" or resolve_gpu(o).nvlink == g.nvlink)]
    kernel = KERNEL_MATCHED.get(family)
    if kernel is not None:
        found = [o for o in found if kernel(resolve_gpu(o)) == kernel(g)] or found
    return found[0] if found else None
