"""The MoE and MLA buffers of vLLM 0.33's memory-profiling pass, as its own code sizes them.

``Worker.determine_available_memory`` -> ``GPUModelRunner.profile_run`` -> ``_dummy_run`` of
``max_num_batched_tokens`` tokens (no attention metadata), then ``_dummy_sampler_run``; the
torch allocator's peak, with what stays allocated, comes off the KV cache (``memory_profiling``).
Every pinned figure is vLLM 0.33.0's own, computed by ``bench/vllm_activation_reference.py``
from the model class built on the meta device with the faked Hopper GPU of
``bench/vllm_weights_reference.py`` (budget 8192, 1024 sequences):

- the fused-MoE workspace: ``FusedMoEKernel._allocate_buffers`` -> ``WorkspaceManager.
  get_simultaneous`` with the shapes of ``<experts class>.workspace_shapes`` (the class the
  layer's quantization method picked, ``quant_method.experts_cls``; its ``moe_problem_size``
  on the layer's weights; ``workspace_dtype``), the bytes the manager allocates;
- the gpt-oss MXFP4 experts (``OAITritonMxfp4ExpertsMonolithic``, no workspace):
  ``triton_kernel_fused_experts``'s own (M x topk, N/2) intermediate;
- MLA: ``MLAAttention.forward``'s profiling tensor of
  (``chunked_prefill_workspace_size``, heads a rank, qk_nope_head_dim + v_head_dim).

Derived from vLLM's code, not measured on a GPU: the caching allocator's fragmentation,
non-torch memory (NCCL, CUDA context) and CUDA-graph memory are not computed here (they stay the
dense models' calibration, ``sim/engine/memory.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chunktune.core.engine_args import EngineArgs, resolve
from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.sim.engine.activation import (
    mla_chunked_prefill_rows,
    mla_profile_bytes,
    moe_experts_class,
    moe_transient_bytes,
    moe_workspace_bytes,
)
from chunktune.sim.engine.memory import plan_memory

CONFIGS = Path(__file__).resolve().parents[4] / "shared" / "data" / "aiconfigurator-vllm" \
    / "model-configs"
pytestmark = pytest.mark.skipif(not CONFIGS.is_dir(),
                                reason="model configs not beside this checkout")

#: (model config, GPU, TP, vLLM 0.33.0's experts class on SM90, its workspace bytes, the MoE
#: transient, MLA's profiling tensor) from ``bench/vllm_activation_reference.py``
VLLM_0_33 = [
    # TritonExperts.workspace_shapes: (M, topk, max(N/2, K)) and (M, topk, max(N, K)), bf16
    ("deepseek-ai--DeepSeek-V3", "h200", 8, "TritonExperts", 1_879_048_192, 0, 536_870_912),
    # MarlinExperts.workspace_shapes: (M x topk, max(N, K)) and (M x topk x max(2N, K),)
    ("moonshotai--Kimi-K2.5", "h200", 8, "MarlinExperts", 1_879_048_192, 0, 268_435_456),
    # triton_kernel_fused_experts: (1, M x topk, N // 2) bf16 inside the call
    ("openai--gpt-oss-120b", "h100-sxm", 1, "OAITritonMxfp4ExpertsMonolithic", 0, 188_743_680,
     0),
    ("Qwen--Qwen3-235B-A22B-FP8", "h200", 4, "TritonExperts", 1_073_741_824, 0, 0),
    ("google--gemma-4-26B-A4B", "h100-sxm", 1, "TritonExperts", 738_197_504, 0, 0),
    ("meta-llama--Llama-4-Scout-17B-16E-Instruct", "h100-sxm", 4, "TritonExperts",
     167_772_160, 0, 0),
]


def config(name, gpu, tp, version=None, **kw):
    model = resolve_model(config_path=CONFIGS / f"{name}_config.json", name=name)
    args = EngineArgs(**{"tensor_parallel_size": tp, "max_num_batched_tokens": 8192,
                         "max_num_seqs": 1024, **kw})
    return resolve(args, model, resolve_gpu(gpu), version=version)


@pytest.mark.parametrize(("name", "gpu", "tp", "experts", "workspace", "transient", "mla"),
                         VLLM_0_33, ids=[c[0] for c in VLLM_0_33])
def test_profile_run_moe_and_mla_buffers_are_what_vllm_0_33_allocates(
        name, gpu, tp, experts, workspace, transient, mla):
    cfg = config(name, gpu, tp)
    assert moe_experts_class(cfg) == experts
    assert moe_workspace_bytes(cfg) == workspace
    assert moe_transient_bytes(cfg) == transient
    assert mla_profile_bytes(cfg) == mla


@pytest.mark.parametrize(("name", "gpu", "tp", "experts", "workspace", "transient", "mla"),
                         VLLM_0_33, ids=[c[0] for c in VLLM_0_33])
def test_the_moe_workspace_stays_allocated_under_the_sampler_warm_up(
        name, gpu, tp, experts, workspace, transient, mla):
    """``WorkspaceManager`` keeps its buffer after ``_dummy_run``: ``_dummy_sampler_run`` runs
    with it allocated, and ``memory_profiling`` counts it (``total_consumed``) with the peak of
    whichever pass is larger, as it counts Model Runner V2's penalty state (allocated when
    the model is loaded, ``test_sampler_memory.py``); MoE/MLA transients add to the forward
    pass's peak only."""
    # Llama-4 Scout's own 10M-token context does not fit four H100s: 131,072 as in the KV tests
    mml = 131072 if "Scout" in name else None
    plan = plan_memory(config(name, gpu, tp, version=(0, 33, 0), max_model_len=mml))
    assert plan.moe_workspace == workspace
    assert plan.activation_peak == workspace + plan.sampler_state + max(
        plan.forward_activation, plan.sampler_activation)
    # vLLM 0.33's sampler warm-up (1024 rows x a 129k-262k vocabulary, 14 B a logit) is larger
    # than the forward pass
    assert plan.sampler_activation > plan.forward_activation


def test_deepseek_v3_kv_cache_gives_up_the_moe_workspace():
    """8 x H200, budget 8192, 1024 sequences, vLLM 0.33: TritonExperts' 2 x 8192 x 8 x 7168
    bf16 (1.75 GiB) come off the KV cache with the sampler warm-up and penalty state
    (``test_sampler_memory.py``): 642,688 tokens (649,920 with the 0.19-calibrated sampler
    warm-up; the blocks vLLM 0.33's planning cuts from these bytes, ``test_kv_layout.py``)."""
    plan = plan_memory(config("deepseek-ai--DeepSeek-V3", "h200", 8, version=(0, 33, 0)))
    assert plan.moe_workspace == 2 * 8192 * 8 * 7168 * 2
    assert plan.activation_peak == pytest.approx(plan.moe_workspace + plan.sampler_state
                                                 + plan.sampler_activation)
    assert plan.kv_cache_tokens == 642_688


def test_mla_chunked_prefill_rows_follow_vllm_0_33():
    """``MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size``: max(8 x
    max_model_len, 4 x max_num_seqs x block_size), at most 64k rows, rounded up to the block
    (``align_mla_chunked_context_workspace_size``)."""
    name = "deepseek-ai--DeepSeek-V3"
    assert mla_chunked_prefill_rows(config(name, "h200", 8)) == 65536
    short = config(name, "h200", 8, max_model_len=1000, max_num_seqs=64)
    assert mla_chunked_prefill_rows(short) == 8000  # 8 x 1000 > 4 x 64 x 16, a multiple of 16
    odd = config(name, "h200", 8, max_model_len=1001, max_num_seqs=64)
    assert mla_chunked_prefill_rows(odd) == 8016
    # the tensor: rows x 16 heads a rank x (128 + 128) x bf16, in the forward pass only
    assert mla_profile_bytes(short) == 8000 * 16 * 256 * 2
    plan = plan_memory(short)
    assert plan.forward_activation > mla_profile_bytes(short)


def test_dense_models_and_other_gpu_families_take_no_derived_buffer():
    """Dense models keep the calibrated figures (Llama-3.1-8B's 135 KB a token); on Blackwell
    vLLM 0.33 picks FlashInfer's MoE kernels, whose buffers are not derived: nothing added."""
    dense = config("meta-llama--Meta-Llama-3.1-8B", "h100-sxm", 1)
    assert moe_workspace_bytes(dense) == mla_profile_bytes(dense) == 0
    assert plan_memory(dense).forward_activation == pytest.approx(135e3 * 8192, rel=0.03)
    b200 = config("deepseek-ai--DeepSeek-V3", "b200", 8)
    assert moe_experts_class(b200) == "" and moe_workspace_bytes(b200) == 0


def test_data_parallel_experts_see_every_rank_batch():
    """vLLM 0.33's default all-to-all (``allgather_reducescatter``) hands each rank's experts
    the batch of every DP rank, and EP keeps each local expert whole (N = 2 x intermediate)."""
    tp8 = config("moonshotai--Kimi-K2.5", "h200", 8)
    dep = config("moonshotai--Kimi-K2.5", "h200", 1, data_parallel_size=8,
                 enable_expert_parallel=True)
    # MarlinExperts: max(2N, K) is K = 7168 either way (N 256 or 2048); M x 8 ranks
    assert moe_workspace_bytes(dep) == 8 * moe_workspace_bytes(tp8)
    # block FP8 under EP: _get_priority_backends puts FlashInfer CUTLASS first on SM90, whose
    # buffers are not derived
    fp8 = config("deepseek-ai--DeepSeek-V3", "h200", 1, data_parallel_size=8,
                 enable_expert_parallel=True)
    assert moe_experts_class(fp8) == "" and moe_workspace_bytes(fp8) == 0
