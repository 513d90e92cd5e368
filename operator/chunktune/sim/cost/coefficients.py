"""Per-GPU coefficients of the step-time model, and where each GPU's came from.

Every GPU with measured kernels has its own coefficients, fitted on its own data only
(:mod:`chunktune.sim.cost.fit.kernel_fit`), in groups by operator family (``GROUPS``). A group a
GPU has no data for is taken from the nearest GPU that has it (``NEAREST``: the same chip
first, then the same architecture, then the nearest other); a GPU with no data at all takes
every group that way. :func:`chunktune.sim.cost.provenance.provenance` says which, with the
leave-one-GPU-out error the same rule makes on the GPUs that were measured (stored with the
fit): a borrowed figure is never presented as a measured one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from chunktune.core.gpus import GPU, resolve_gpu

COEFFICIENTS_PATH = Path(__file__).with_name("data") / "step_time_coefficients.json"

#: The fitted coefficients by operator family: a GPU's group is fitted on that GPU's own data
#: or borrowed whole from its nearest GPU that has data for the family.
GROUPS: dict[str, tuple[str, ...]] = {
    "gemm": ("gemm_compute_eff", "gemm_memory_eff", "gemm_overhead_s", "gemm_smoothness"),
    "gemm-fp8": ("fp8_compute_eff", "fp8_memory_eff", "fp8_overhead_s", "fp8_smoothness",
                 "fp8_quant_memory_eff"),
    "elementwise": ("elementwise_memory_eff", "elementwise_overhead_s",
                    "elementwise_l2_bytes_per_sm_cycle"),
    "attention-prefill": ("attn_overhead_s", "attn_compute_eff", "attn_cta_cycles_per_flop",
                          "attn_tile_memory_eff", "attn_smoothness", "attn_per_wave_s"),
    "attention-decode": ("attn_per_decode_s", "attn_decode_alone_overhead_s",
                         "attn_decode_memory_eff"),
    "attention-mixed": ("attn_mixed_memory_eff", "attn_reread_l2_bytes_per_sm_s"),
    "attention-kv-fp8": ("attn_kv_fp8_bytes", "attn_kv_fp8_overhead_s",
                         "attn_kv_fp8_per_decode_s"),
    "all-reduce": ("allreduce_latency_s", "allreduce_link_eff"),
    "moe": ("moe_compute_eff", "moe_memory_eff", "moe_overhead_s", "moe_smoothness"),
}
#: Not fitted (``fit.family_fit.FIXED`` says where each comes from).
FIXED_FIELDS = ("step_overhead_s", "per_request_overhead_s", "eager_launch_overhead_per_layer_s")

#: Where a GPU borrows a group it has no data for: the first of these that has it. Same chip
#: or board family first, then the same architecture, then the nearest datacenter or
#: workstation part (a judgement, recorded here; ``kernel_fit report`` measures it by holding
#: out each measured GPU and predicting it this way).
NEAREST: dict[str, tuple[str, ...]] = {
    "a100-sxm": ("a100-pcie", "a100-40g", "a40", "h100-sxm", "l40s", "rtx4090"),
    "a100-pcie": ("a100-sxm", "a100-40g", "a40", "h100-sxm", "l40s"),
    "a100-40g": ("a100-sxm", "a100-pcie", "a40", "h100-sxm", "l40s"),
    "a40": ("a10g", "a100-sxm", "l40s", "rtx4090", "h100-sxm"),
    "a10g": ("a40", "a100-sxm", "l4", "l40s", "rtx4090"),
    "h100-sxm": ("h200", "h100-pcie", "b200", "a100-sxm", "rtx-pro-6000"),
    "h100-pcie": ("h100-sxm", "h200", "b200", "a100-sxm"),
    "h200": ("h100-sxm", "h100-pcie", "b200", "a100-sxm"),
    "b200": ("b300", "gb200", "h100-sxm", "h200", "rtx-pro-6000", "a100-sxm"),
    "b300": ("b200", "gb200", "h200", "h100-sxm"),
    "gb200": ("b200", "b300", "h200", "h100-sxm"),
    "l40s": ("rtx4090", "l4", "rtx-pro-6000", "a40", "a100-sxm"),
    "l4": ("l40s", "rtx4090", "rtx-pro-6000", "a40"),
    "rtx4090": ("l40s", "l4", "rtx-pro-6000", "a40"),
    "rtx-pro-6000": ("l40s", "rtx4090", "b200", "h100-sxm"),
    "cpu": ("a100-sxm",),
}

#: Families a GPU without data for them takes from a pool of measured GPUs, the group fitted
#: on all of their timings together (each at its own data sheet, each GPU weighted equally:
#: ``fit.family_fit.fit_pooled``), rather than from its nearest measured GPU alone, where
#: holding out each measured GPU says the pool predicts it better (``kernel_fit report``;
#: ``docs/simulator.md`` has the figures). ``flash-attention``: the GPUs that run the same
#: FlashAttention generation (:attr:`chunktune.core.gpus.GPU.flash_attention`; where none
#: does, the nearest generation's): a decode's fixed cost and the HBM fraction it reaches
#: are the kernel's (FA2's decode-only batches cost 7-9 us more per call than FA3's and
#: FA4's on every measured GPU), more than the chip's.
POOLED: dict[str, str] = {"attention-decode": "flash-attention"}


def kv_fp8_kernel(gpu: GPU) -> str:
    """The kernel vLLM decodes from an FP8 KV cache with on ``gpu`` (``--kv-cache-dtype fp8``),
    whose cost the ``attention-kv-fp8`` group measures: ``flash-attention-3`` on Hopper, the
    only GPUs where vLLM's FLASH_ATTN backend reads an FP8 cache
    (``fa_utils.flash_attn_supports_kv_cache_dtype``: FA3 on SM 9.0, FA4 on SM 10.x, where
    FLASHINFER comes first in ``platforms/cuda.py``'s priorities), else ``flashinfer``, the
    next backend vLLM tries (AIConfigurator's FP8-cache decodes: ``vllm_flash_attn_fa3`` on
    the H100 and H200, FlashInfer on the B200, L40S and RTX PRO 6000, whose bf16 decodes
    run FlashAttention 2). A GPU without FP8-cache data borrows the group from the nearest
    GPU running the same kernel
    (:func:`chunktune.sim.cost.fit.measurements.borrow_source`)."""
    return "flash-attention-3" if gpu.flash_attention == 3 else "flashinfer"


def moe_kernel(gpu: GPU) -> str:
    """The kernel vLLM 0.33 runs a bf16 MoE layer's routed experts with on ``gpu``, whose cost
    the ``moe`` group and the GPU's MoE table measure: ``flashinfer`` on Blackwell (SM 10.x and
    12.x: ``fused_moe/oracle/unquantized.py`` tries FlashInfer's TRT-LLM kernel, SM 10.x only,
    then its CUTLASS kernel, which runs on SM 9.0, 10.x and 12.x, then Triton), else
    ``triton`` (Triton's ``fused_moe``: Ampere and Ada have no FlashInfer MoE kernel, and on
    SM 9.0 the oracle moves FlashInfer behind Triton). AIConfigurator's bf16 MoE rows agree
    (``kernel_source``): FlashInfer TRT-LLM and CUTLASS on the B200, CUTLASS on the RTX PRO
    6000, Triton on the H100, H200, L40S and A100. A GPU without MoE data borrows the group
    and the table from the nearest GPU running the same kernel (:data:`KERNEL_MATCHED`)."""
    return "flashinfer" if gpu.family == "blackwell" else "triton"


def elementwise_memory(gpu: GPU) -> str:
    """What the ``elementwise`` group's rates are fractions of on ``gpu``: its memory's kind
    (:attr:`chunktune.core.gpus.GPU.memory`). The kernels stream what does not stay in L2
    (:func:`chunktune.sim.cost.step_time.elementwise_time`) at a fraction of the data sheet's
    bandwidth that is the memory's more than the SMs': 0.42 and 0.45 of HBM on the H100 and
    A100 (Vidur's profiles), 0.68 of GDDR6 on the A40 (same profiler, the A100's architecture).
    A GPU borrows the group from the nearest of the same memory (:data:`KERNEL_MATCHED`)."""
    return gpu.memory


#: Families whose cost is one kernel's that vLLM picks per GPU (or, for the elementwise
#: kernels, the memory they stream: :func:`elementwise_memory`): a GPU without data for one
#: borrows it from the first of ``NEAREST`` whose own data has it and that runs the same
#: kernel (where none does, from where it takes the rest), and holding out each measured GPU
#: predicts it the same way (:func:`chunktune.sim.cost.fit.measurements.borrow_source`).
KERNEL_MATCHED: dict[str, Callable[[GPU], str]] = {"attention-kv-fp8": kv_fp8_kernel,
                                                    "moe": moe_kernel,
                                                    "elementwise": elementwise_memory}


def bf16_decode_kernel(gpu: GPU) -> str:
    """The kernel vLLM 0.33 decodes from a bf16 KV cache with on ``gpu``: FlashInfer on SM 10.x
    (``platforms/cuda.py`` puts FLASHINFER first there), else FLASH_ATTN in the GPU's
    FlashAttention generation (AIConfigurator's bf16 decodes: ``vllm_flash_attn_fa3`` on the
    H100 and H200, ``vllm_flash_attn_fa2`` on the L40S and RTX PRO 6000,
    ``vllm_flashinfer_trtllmdecode`` on the B200, as its FP8-cache decodes)."""
    return "flashinfer" if gpu.flash_attention >= 4 else f"flash-attention-{gpu.flash_attention}"


def kv_fp8_own_decode_cost(gpu: GPU) -> bool:
    """Whether an FP8 cache's decodes on ``gpu`` run another kernel than a bf16 cache's
    (:func:`kv_fp8_kernel` against :func:`bf16_decode_kernel`: FlashInfer beside FlashAttention
    2 on the Ampere, Ada and SM 12.0 GPUs), so that the ``attention-kv-fp8`` group has a cost
    per decode of its own (``attn_kv_fp8_per_decode_s``, fitted on the FP8 rows and borrowed
    with them from a GPU running the same kernel: the L40S's and RTX PRO 6000's FlashInfer
    decodes cost 11.9k and 12.0k SM cycles each, their FlashAttention 2 decodes 15.0k and
    14.8k) rather than the bf16 cache's (Hopper's FA3 and SM 10.x's FlashInfer read both)."""
    return kv_fp8_kernel(gpu) != bf16_decode_kernel(gpu)


def pool_key(gpu: GPU, family: str) -> str:
    """Which pool of ``family`` (:data:`POOLED`) ``gpu`` borrows from."""
    assert POOLED[family] == "flash-attention"
    return f"fa{gpu.flash_attention}"


def pool_members(gpu: GPU, family: str, have: set[str] | list[str]) -> list[str]:
    """The GPUs among ``have`` (measured with ``family``; ``gpu`` itself left out) whose
    timings ``gpu``'s pool of ``family`` is fitted on: those of its FlashAttention
    generation, else of the nearest one."""
    assert POOLED[family] == "flash-attention"
    others = sorted(g for g in have if g != gpu.name)
    if not others:
        return []
    gap = {g: abs(resolve_gpu(g).flash_attention - gpu.flash_attention) for g in others}
    return [g for g in others if gap[g] == min(gap.values())]


@dataclass(frozen=True)
class KernelCoefficients:
    """One GPU's step-time coefficients (``data/step_time_coefficients.json``)."""

    gemm_compute_eff: float
    gemm_memory_eff: float
    gemm_overhead_s: float
    gemm_smoothness: float
    #: the same for FP8 weights and activations (vLLM's per-tensor scaled GEMMs), against the
    #: FP8 peak; on a GPU without FP8 tensor cores, unused (weight-only: the bf16 terms)
    fp8_compute_eff: float
    fp8_memory_eff: float
    fp8_overhead_s: float
    fp8_smoothness: float
    #: HBM fraction of the activation's on-the-fly quantisation (read bf16, write fp8)
    fp8_quant_memory_eff: float
    #: elementwise kernels (:func:`chunktune.sim.cost.step_time.elementwise_time`): the HBM
    #: fraction of their bytes beyond the L2, a fixed cost per kernel, and the bytes per SM
    #: clock cycle of those the L2 holds
    elementwise_memory_eff: float
    elementwise_overhead_s: float
    elementwise_l2_bytes_per_sm_cycle: float
    attn_overhead_s: float
    attn_per_decode_s: float
    #: fraction of the bf16 peak the varlen kernel's (padded) FLOPs run at, all CTAs together
    attn_compute_eff: float
    #: SM clock cycles per (padded) FLOP that the longest CTA spends beside its MMAs (softmax,
    #: loads, rescaling); its MMAs run at one SM's share of the bf16 peak
    attn_cta_cycles_per_flop: float
    #: HBM fraction for the K/V each query tile and query head reads (above 1: L2 hits)
    attn_tile_memory_eff: float
    #: effective HBM fraction for a mixed batch's decode KV (first read of each KV head)
    attn_mixed_memory_eff: float
    #: L2 bytes/s per SM for the re-reads of a KV head by its other query heads
    attn_reread_l2_bytes_per_sm_s: float
    #: exponent of the soft maximum of compute and memory time (1: they add)
    attn_smoothness: float
    #: fixed seconds per wave of CTAs (``ceil(CTAs / SMs)``): a CTA's prologue and epilogue
    attn_per_wave_s: float
    attn_decode_alone_overhead_s: float
    attn_decode_memory_eff: float
    #: an FP8 KV cache (``--kv-cache-dtype fp8``): the bytes one KV element costs the attention
    #: kernels at the bf16 cache's rates (its size is 1; the FP8 kernels read it slower: H100's
    #: FlashAttention 3 and B200's FlashInfer decode 4k+ KV tokens in ~0.58x the bf16 time,
    #: not 0.5x), and the fixed seconds per layer it adds (the query's quantisation)
    attn_kv_fp8_bytes: float
    attn_kv_fp8_overhead_s: float
    #: the seconds per decode of an FP8 cache's kernel, in place of ``attn_per_decode_s``
    #: (:meth:`for_kv_fp8`): fitted on the FP8 rows where vLLM reads the FP8 cache with
    #: another kernel than the bf16 one (FlashInfer beside FlashAttention 2,
    #: :func:`kv_fp8_own_decode_cost`), the bf16 cache's own where one kernel reads both
    attn_kv_fp8_per_decode_s: float
    #: routed experts of a fused MoE layer: fractions of the data sheet's peak and HBM, a fixed
    #: cost per layer and the exponent of the soft maximum of compute and memory
    moe_compute_eff: float
    moe_memory_eff: float
    moe_overhead_s: float
    moe_smoothness: float
    step_overhead_s: float
    per_request_overhead_s: float
    eager_launch_overhead_per_layer_s: float
    #: vLLM's all-reduce where no measured table covers the GPU and ranks: a latency and the
    #: fraction of the link's per-direction data-sheet bandwidth its ring bytes reach
    allreduce_latency_s: float
    allreduce_link_eff: float

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KernelCoefficients:
        return cls(**{k: float(d[k]) for k in cls.__dataclass_fields__})

    def to_dict(self) -> dict[str, float]:
        return {k: float(getattr(self, k)) for k in self.__dataclass_fields__}

    def for_kv_fp8(self) -> KernelCoefficients:
        """These coefficients as an FP8 KV cache's attention runs them: its kernel's cost per
        decode (``attn_kv_fp8_per_decode_s``) in place of the bf16 cache's."""
        return replace(self, attn_per_decode_s=self.attn_kv_fp8_per_decode_s)


@lru_cache(maxsize=1)
def load_document() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(COEFFICIENTS_PATH.read_text())
    return doc


def measured_gpus() -> list[str]:
    """The GPUs with coefficients of their own (at least one family fitted on their data)."""
    return sorted(load_document()["gpus"])


def source_gpu(gpu: str) -> str:
    """The GPU whose coefficients ``gpu`` uses: itself when it was measured, else the first
    of ``NEAREST[gpu]`` that was."""
    gpus = load_document()["gpus"]
    if gpu in gpus:
        return gpu
    for other in NEAREST.get(gpu, ()):
        if other in gpus:
            return other
    raise KeyError(f"GPU {gpu!r} has no measured kernels and no measured GPU in "
                   f"chunktune.sim.cost.coefficients.NEAREST[{gpu!r}]; add one there")


def _pools(gpu: str | GPU) -> dict[str, dict[str, Any]]:
    """Per pooled family, the pool (``gpus``, ``coefficients``) an unmeasured ``gpu`` takes
    it from (``pooled`` in the coefficients document); empty for a measured GPU (its own
    fit already took the pool for each pooled family its data lacks)."""
    doc = load_document()
    g = resolve_gpu(gpu) if isinstance(gpu, str) else gpu
    if g.name in doc["gpus"]:
        return {}
    out = {}
    for fam, pools in doc.get("pooled", {}).items():
        pool = pools.get(pool_key(g, fam))
        if pool is not None:
            out[fam] = pool
    return out


#: How a GPU that borrows the prefill attention group carries the lender's rate of reading
#: K/V tiles (``attn_tile_memory_eff``, a fraction of HBM) over to its own data sheet:
#: ``data-sheet`` keeps the fraction (the rate scales with HBM bandwidth), ``sm-clock`` keeps
#: the bytes per SM clock cycle where the two run the same FlashAttention generation (it
#: re-reads each K/V tile once per query tile of the same head, from L2 and shared memory,
#: whose bandwidth scales with SMs x clock: the H100 and H200, one chip with 3.35 and 4.8
#: TB/s of HBM, fit 12.1 and 12.3 TB/s) and the fraction across generations (another
#: kernel: FA4 on the B200 reaches 106 bytes per SM cycle, FA3 on the H100 46).
#: ``prefill_borrowing`` in the coefficients document says which (``kernel_fit`` holds out
#: each measured GPU under both).
TILE_RATE_RULES = ("data-sheet", "sm-clock")


def tile_rule() -> str:
    """The committed rule of :data:`TILE_RATE_RULES` (``data-sheet`` without a decision)."""
    rule: str = load_document().get("prefill_borrowing", {}).get("use", "data-sheet")
    return rule


def lent_tile_memory_eff(eff: float, lender: GPU, gpu: GPU, rule: str) -> float:
    """``lender``'s fitted ``attn_tile_memory_eff`` as ``gpu`` borrows it under ``rule``
    (:data:`TILE_RATE_RULES`)."""
    if (rule == "data-sheet" or lender.name == gpu.name
            or lender.flash_attention != gpu.flash_attention):
        return eff
    assert rule == "sm-clock", rule
    return (eff * lender.hbm_tb_s / gpu.hbm_tb_s * (gpu.sm_count * gpu.boost_mhz)
            / (lender.sm_count * lender.boost_mhz))


#: How a GPU that borrows the FP8 GEMM group carries the lender's rate of quantizing the
#: activations (``fp8_quant_memory_eff``, a fraction of HBM: read bf16, write fp8, one pass
#: before each FP8 GEMM) over to its own data sheet: ``data-sheet`` keeps the fraction,
#: ``sm-clock`` keeps the bytes per SM clock cycle. The quantization is one elementwise
#: kernel, the same code on every architecture (no tensor cores), and the rates fitted on
#: the measured GPUs follow their SMs x clock, not their HBM: 0.76-1.3 TB/s on GPUs of
#: 0.86-8 TB/s (L40S 0.76, RTX PRO 6000 0.78, H200 0.95, H100 1.03, B200 1.30).
#: ``fp8_quant_borrowing`` in the coefficients document says which (``kernel_fit`` holds out
#: each measured GPU under both).
QUANT_RATE_RULES = ("data-sheet", "sm-clock")


def quant_rule() -> str:
    """The committed rule of :data:`QUANT_RATE_RULES` (``data-sheet`` without a decision)."""
    rule: str = load_document().get("fp8_quant_borrowing", {}).get("use", "data-sheet")
    return rule


def lent_quant_memory_eff(eff: float, lender: GPU, gpu: GPU, rule: str) -> float:
    """``lender``'s fitted ``fp8_quant_memory_eff`` as ``gpu`` borrows it under ``rule``
    (:data:`QUANT_RATE_RULES`); a GPU without FP8 tensor cores (which runs FP8 weight-only,
    without the term) keeps it as it is."""
    if (rule == "data-sheet" or lender.name == gpu.name or gpu.fp8_tflops <= 0
            or lender.fp8_tflops <= 0):
        return eff
    assert rule == "sm-clock", rule
    return (eff * lender.hbm_tb_s / gpu.hbm_tb_s * (gpu.sm_count * gpu.boost_mhz)
            / (lender.sm_count * lender.boost_mhz))


def kernel_source(gpu: GPU, fam: str, src: str) -> str:
    """Where a GPU without measured kernels takes a family of :data:`KERNEL_MATCHED` from
    (an FP8 KV cache's group, ``attention-kv-fp8``; the MoE group and table, ``moe``): the
    first of ``NEAREST`` whose own data has it and that runs the same kernel, else ``src``,
    the GPU it takes the rest from."""
    gpus = load_document()["gpus"]
    kernel = KERNEL_MATCHED[fam]
    return next((o for o in NEAREST.get(gpu.name, ()) if o in gpus
                 and gpus[o]["sources"].get(fam) == o
                 and kernel(resolve_gpu(o)) == kernel(gpu)), src)


def coefficients(gpu: str | GPU) -> KernelCoefficients:
    """The coefficients the step-time model uses for ``gpu`` (its own, or borrowed: from its
    nearest measured GPU, an FP8 KV cache's group and the MoE group from the nearest running
    the same kernel (:data:`KERNEL_MATCHED`),
    the :data:`POOLED` families from their pools, the prefill tile rate carried over by
    :func:`tile_rule`, the FP8 activations' quantization rate by :func:`quant_rule`)."""
    g = resolve_gpu(gpu) if isinstance(gpu, str) else gpu
    src = source_gpu(g.name)
    doc = load_document()["gpus"]
    vals = dict(doc[src]["coefficients"])
    if src != g.name:
        for fam in KERNEL_MATCHED:
            lender = doc[kernel_source(g, fam, src)]["coefficients"]
            vals.update({k: lender[k] for k in GROUPS[fam]})
    for pool in _pools(g).values():
        vals.update(pool["coefficients"])
    if src != g.name:
        vals["attn_tile_memory_eff"] = lent_tile_memory_eff(
            float(vals["attn_tile_memory_eff"]), resolve_gpu(src), g, tile_rule())
        vals["fp8_quant_memory_eff"] = lent_quant_memory_eff(
            float(vals["fp8_quant_memory_eff"]), resolve_gpu(src), g, quant_rule())
    if not kv_fp8_own_decode_cost(g):
        vals["attn_kv_fp8_per_decode_s"] = vals["attn_per_decode_s"]
    return KernelCoefficients.from_dict(vals)


def group_sources(gpu: str) -> dict[str, str]:
    """Per family: the GPU whose measurements it was fitted on (``gpu`` itself where its own
    data has the family; a pool's GPUs joined by ``+``)."""
    src = source_gpu(gpu)
    out = dict(load_document()["gpus"][src]["sources"])
    if src != gpu:
        for fam in KERNEL_MATCHED:
            lender = kernel_source(resolve_gpu(gpu), fam, src)
            if lender != src:
                out[fam] = lender
    out.update({f: "+".join(p["gpus"]) for f, p in _pools(gpu).items()})
    return out
