"""The bytes gpt-oss's MXFP4 experts take on a rank once vLLM has loaded them, per release and GPU
family (nothing here is measured: each rule is read from that release's code).

:meth:`chunktune.core.models.ModelConfig.weight_bytes` counts the routed experts as the
checkpoint stores them (4-bit weights and an e8m0 scale per 32, unpadded, no biases). vLLM's
``Mxfp4MoEMethod`` stores them as the MoE backend it picks for the GPU wants them, and "Model
loading took" (``DeviceMemoryProfiler``: ``torch.cuda.max_memory_allocated`` after a reset, once
``process_weights_after_loading`` has run) and the memory profile count what it keeps.

The backend (``Mxfp4MoEMethod._should_use_marlin`` in 0.10-0.11, ``get_mxfp4_backend`` in
0.12-0.14, ``select_mxfp4_moe_backend`` from 0.15 on):

- SM < 9.0 (A100, L40S): ``MARLIN`` in every release (the Triton kernels need SM90-SM10x);
- Hopper (SM90): ``MARLIN`` before 0.12.0, ``TRITON`` (OAI ``triton_kernels`` ``matmul_ogs``)
  from 0.12.0: the 0.10.x wheels require torch 2.7.1 / 2.8.0 and neither they nor 0.11 ship
  ``triton_kernels``, which ``has_triton_kernels()`` needs; 0.12.0 vendors it
  (``vllm/third_party/triton_kernels``, torch 2.9.0). Assumed: a pip install of the wheel (an
  image that adds ``triton_kernels`` to 0.10.2-0.11 runs Triton);
- Blackwell (SM100): FlashInfer's TRT-LLM MXFP4 MoE (``SM100_FI_MXFP4_BF16`` /
  ``FLASHINFER_TRTLLM_MXFP4_BF16``, or its MXFP8 variant under
  ``VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1``: the same layout). Assumed: FlashInfer installed
  (vLLM's images; without it 0.10-0.14 run Triton).

What each backend stores, a layer of ``E`` local experts, hidden ``H`` and intermediate ``I`` a
partition (``I`` split over the MoE's tensor-parallel ranks, ``tp x dp`` without
``--enable-expert-parallel``; whole experts split over them with it):

- the padding of ``create_weights`` (``mxfp4_round_up_hidden_size_and_intermediate_size`` from
  0.15): MARLIN ``I`` to 128, ``H`` to 256; TRITON ``I`` to 64; TRT-LLM ``I`` to 256 before
  0.27.0 and to 128 from 0.27.0, ``H`` to 256. Weights ``E x 3 x H x I / 2`` bytes, scales
  ``E x 3 x H x I / 32``, biases ``E x (2I + H)`` in bf16 (gpt-oss's experts have biases);
- MARLIN (``prepare_moe_fp4_layer_for_marlin`` / ``prepare_moe_mxfp4_layer_for_marlin``):
  repacked, same bytes; scales stay e8m0, biases bf16;
- TRT-LLM (``shuffle_matrix_a`` / ``nvfp4_block_scale_interleave`` on already-aligned shapes):
  same bytes, biases to float32;
- TRITON (``_swizzle_mxfp4``; ``triton_kernels`` identical from 0.14 to 0.33): biases to float32;
  the weights in ``HopperMXValueLayout`` (rows to 16, bytes to 32: no padding for gpt-oss); the
  scales copied into ``HopperMXScaleLayout`` (rows to ``2 x num_warps x 2 x 8`` = 256, scale
  groups to even; from 0.26.0 vLLM first pads the groups to 0 mod 4, the "Patches #47303" of
  ``_swizzle_mxfp4``). Before 0.25.0 the checkpoint-layout scales stay registered on the layer
  beside the swizzled copy the kernel reads; 0.25.0 deletes them (PR #46549, "Free unused
  MXFP4 scales in OAI Triton Backend"). Blackwell's Triton layouts are not derived.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from chunktune.core.engine_args import ResolvedConfig
from chunktune.core.models import ModelConfig
from chunktune.core.vllm_release import CURRENT, Version
from chunktune.sim.cost.step_time import mxfp4_marlin_asked

MARLIN, TRITON, TRTLLM = "MARLIN", "TRITON", "FLASHINFER_TRTLLM"

#: vLLM 0.12.0: the wheel vendors ``triton_kernels`` (and needs torch 2.9.0); before, Hopper
#: ran Marlin for want of the package
HOPPER_TRITON = (0, 12, 0)
#: vLLM 0.25.0: the Triton backend deletes the checkpoint-layout scales (PR #46549)
TRITON_FREES_SCALES = (0, 25, 0)
#: vLLM 0.26.0: ``_swizzle_mxfp4`` pads the scale groups to 0 mod 4 on SM90 (#47303's patch)
TRITON_SCALE_GROUPS_4 = (0, 26, 0)
#: vLLM 0.27.0: TRT-LLM MXFP4 pads the intermediate size to 128 (256 before)
TRTLLM_INTERMEDIATE_128 = (0, 27, 0)
#: ``_swizzle_mxfp4``'s ``num_warps`` (8 unless a batched all-to-all, not modelled)
NUM_WARPS = 8
MXFP4_BLOCK = 32


def _up(x: int, m: int) -> int:
    return -(-x // m) * m


#: Blackwell GPUs of compute capability 12.0 (no TRT-LLM MoE, Triton excluded: Marlin)
SM120 = frozenset({"rtx-pro-6000"})


#: vLLM 0.31.0: ``VLLM_MXFP4_USE_MARLIN`` no longer read (0.13-0.19 read here)
MARLIN_FLAG_GONE = (0, 31, 0)


def mxfp4_backend(family: str, version: Version | None, gpu: str = "",
                  vllm_env: Mapping[str, str] | None = None) -> str:
    """The MXFP4 MoE backend vLLM ``version`` (None: :data:`CURRENT`) picks on the GPU
    ``gpu`` of ``family`` (``chunktune.core.gpus.GPU``) under the server's vLLM environment
    variables ``vllm_env``; "" where not derived (the CPU). On Hopper
    ``VLLM_MXFP4_USE_MARLIN=1`` asks for Marlin (0.13-0.19 ``get_mxfp4_backend``, unless
    FlashInfer's SM90 BF16 kernel is asked for; the kernel the step time then runs too,
    :func:`chunktune.sim.cost.step_time.moe_weight_format`)."""
    v = version or CURRENT
    if gpu == "cpu":
        return ""
    if family in ("ampere", "ada") or gpu in SM120:
        return MARLIN
    if family == "hopper":
        if v < MARLIN_FLAG_GONE and mxfp4_marlin_asked(gpu, vllm_env):
            return MARLIN
        return TRITON if v >= HOPPER_TRITON else MARLIN
    if family == "blackwell":
        return TRTLLM
    return ""


def padded_sizes(backend: str, version: Version | None, hidden: int,
                 intermediate: int) -> tuple[int, int]:
    """(hidden, intermediate a partition) after ``create_weights``' padding."""
    v = version or CURRENT
    if backend == MARLIN:
        return _up(hidden, 256), _up(intermediate, 128)
    if backend == TRTLLM:
        return _up(hidden, 256), _up(intermediate, 128 if v >= TRTLLM_INTERMEDIATE_128 else 256)
    if backend == TRITON:
        return hidden, _up(intermediate, 64)
    return hidden, intermediate


def _local(m: ModelConfig, tp: int, dp: int, expert_parallel: bool) -> tuple[int, int]:
    """(experts a rank holds, intermediate size a partition) as ``FusedMoEParallelConfig``
    splits them: whole experts under expert parallelism, else every expert split by width
    over the ``tp x dp`` ranks."""
    ranks = tp * dp
    if expert_parallel and ranks > 1:
        return math.ceil(m.num_experts / ranks), m.moe_intermediate_size
    return m.num_experts, m.moe_intermediate_size // ranks


def mxfp4_layer_bytes(m: ModelConfig, backend: str, version: Version | None, tp: int = 1,
                      dp: int = 1, expert_parallel: bool = False) -> int:
    """Bytes one MoE layer's experts hold on a rank after ``process_weights_after_loading``
    (module docstring)."""
    e, inter = _local(m, tp, dp, expert_parallel)
    h, i = padded_sizes(backend, version, m.hidden_size, inter)
    v = version or CURRENT
    rows13, rows2 = 2 * i, h
    weights = e * (rows13 * h // 2 + rows2 * i // 2)
    scales = e * (rows13 * h // MXFP4_BLOCK + rows2 * i // MXFP4_BLOCK)
    bias_bytes = 2 if backend == MARLIN or not backend else 4
    biases = e * (rows13 + rows2) * bias_bytes
    if backend != TRITON:
        return weights + scales + biases
    align_m, groups = 2 * NUM_WARPS * 2 * 8, 4 if v >= TRITON_SCALE_GROUPS_4 else 2
    swizzled_w = e * (_up(rows13, 16) * _up(h // 2, 32) + _up(rows2, 16) * _up(i // 2, 32))
    swizzled_s = e * (_up(rows13, align_m) * _up(h // MXFP4_BLOCK, groups)
                      + _up(rows2, align_m) * _up(i // MXFP4_BLOCK, groups))
    kept = scales if v < TRITON_FREES_SCALES else 0
    return swizzled_w + swizzled_s + kept + biases


def counted_expert_bytes(m: ModelConfig, tp: int = 1, dp: int = 1) -> float:
    """What ``ModelConfig.weight_bytes`` counts for one layer's routed experts on a rank."""
    return m.expert_params() * m.module_weight_bytes("experts") / (tp * dp)


def mxfp4_layout_bytes(cfg: ResolvedConfig, vllm_env: Mapping[str, str] | None = None
                       ) -> float:
    """Bytes a rank's MXFP4 experts hold beyond what ``ModelConfig.weight_bytes`` counts:
    the backend's padding, biases, swizzled and kept copies (module docstring) under the
    server's vLLM environment variables ``vllm_env``; 0 for other formats, or where the
    backend is not derived."""
    m = cfg.model
    if m.quantization != "mxfp4" or not m.is_moe:
        return 0.0
    backend = mxfp4_backend(cfg.gpu.family, cfg.vllm_version, cfg.gpu.name, vllm_env)
    if not backend:
        return 0.0
    tp, dp = cfg.tensor_parallel_size, cfg.data_parallel_size
    held = mxfp4_layer_bytes(m, backend, cfg.vllm_version, tp, dp, cfg.enable_expert_parallel)
    return m.num_moe_layers * (held - counted_expert_bytes(m, tp, dp))
