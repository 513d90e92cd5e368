"""gpt-oss's MXFP4 experts as each vLLM release's backend stores them on a rank
(``chunktune.sim.engine.mxfp4``; every rule read from that release's code, nothing measured).

Each figure names the vLLM function it follows; the published start-up logs
(``bench/data/startup_logs.csv``, "Model loading took") are the cross-checks, and the 0.33 figure
is ``bench/vllm_weights_reference.py``'s (vLLM's own ``_swizzle_mxfp4`` on the meta tensors).
"""

from __future__ import annotations

import pytest

from chunktune.core.engine_args import EngineArgs, resolve
from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.sim.engine.activation import OAI_TRITON, moe_experts_class
from chunktune.sim.engine.memory import plan_memory
from chunktune.sim.engine.mxfp4 import (
    MARLIN,
    TRITON,
    TRTLLM,
    counted_expert_bytes,
    mxfp4_backend,
    mxfp4_layer_bytes,
    mxfp4_layout_bytes,
    padded_sizes,
)

GiB = 2**30


def weights(model: str, gpu: str, version: tuple[int, int, int] | None, tp: int = 1,
            **kw: object) -> float:
    cfg = resolve(EngineArgs(tensor_parallel_size=tp, max_num_batched_tokens=8192,
                             max_model_len=8192, kv_cache_memory_bytes=8 * GiB, **kw),
                  resolve_model(model), resolve_gpu(gpu), version)
    return plan_memory(cfg).weights


def test_backend_follows_the_release_and_the_gpu():
    # A100: the Triton kernels need SM90-SM10x (``_supports_current_device``), Marlin always
    assert {mxfp4_backend("ampere", v) for v in ((0, 10, 1), (0, 19, 0), (0, 33, 0))} == {MARLIN}
    # H100: Marlin while the wheel lacks triton_kernels (0.10.1 also torch 2.7.1:
    # ``Mxfp4MoEMethod._should_use_marlin``), Triton from 0.12.0 (vendored triton_kernels)
    assert mxfp4_backend("hopper", (0, 10, 1)) == MARLIN
    assert mxfp4_backend("hopper", (0, 11, 0)) == MARLIN
    assert mxfp4_backend("hopper", (0, 12, 0)) == TRITON
    assert mxfp4_backend("hopper", None) == TRITON  # the modelled release
    # B200: FlashInfer's TRT-LLM MoE; the SM120 RTX PRO 6000: Marlin; the CPU: not derived
    assert mxfp4_backend("blackwell", None, "b200") == TRTLLM
    assert mxfp4_backend("blackwell", None, "rtx-pro-6000") == MARLIN
    assert mxfp4_backend("ampere", None, "cpu") == ""


def test_padding_of_create_weights():
    """``mxfp4_round_up_hidden_size_and_intermediate_size`` (0.15+; ``create_weights`` before)."""
    assert padded_sizes(MARLIN, (0, 10, 1), 2880, 2880) == (3072, 2944)
    assert padded_sizes(TRITON, (0, 33, 0), 2880, 2880) == (2880, 2880)
    assert padded_sizes(TRITON, (0, 33, 0), 2880, 1440) == (2880, 1472)  # TP 2
    assert padded_sizes(TRTLLM, (0, 26, 0), 2880, 2880) == (3072, 3072)
    assert padded_sizes(TRTLLM, (0, 27, 0), 2880, 2880) == (3072, 2944)


def test_one_layer_of_gpt_oss_120b_by_hand():
    m = resolve_model("gpt-oss-120b")
    e = 128
    # Marlin: 2944 / 3072 padded, e8m0 scales, bf16 biases (prepare_moe_fp4_layer_for_marlin)
    marlin = e * (5888 * 3072 // 2 + 3072 * 2944 // 2 + 5888 * 96 + 3072 * 92
                  + (5888 + 3072) * 2)
    assert mxfp4_layer_bytes(m, MARLIN, (0, 10, 1)) == marlin
    # Triton 0.14: scales swizzled (rows to 256, groups to even) beside the kept originals,
    # biases float32
    stored = e * (5760 * 1440 + 2880 * 1440)
    scales = e * (5760 * 90 + 2880 * 90)
    swizzled_0_14 = e * (5888 * 90 + 3072 * 90)
    biases32 = e * (5760 + 2880) * 4
    assert mxfp4_layer_bytes(m, TRITON, (0, 14, 1)) == stored + scales + swizzled_0_14 + biases32
    # 0.33: originals deleted (PR #46549), groups padded to 0 mod 4 first (#47303's patch)
    assert mxfp4_layer_bytes(m, TRITON, (0, 33, 0)) == \
        stored + e * (5888 * 92 + 3072 * 92) + biases32
    assert counted_expert_bytes(m) == stored + scales


def test_gpt_oss_120b_h100_0_10_1_marlin_matches_its_log():
    """vllm#23278 (0.10.1, H100, Marlin MXFP4): "Model loading took 65.97 GiB" (Marlin's
    ``create_weights`` padding: hidden to 256, intermediate to 128)."""
    w = weights("gpt-oss-120b", "h100-sxm", (0, 10, 1)) / GiB
    assert w == pytest.approx(65.97, rel=0.002)
    assert w == pytest.approx(65.928, abs=0.001)


def test_gpt_oss_120b_h100_0_14_1_triton_matches_its_log():
    """vllm#33155 (0.14.1, H100, Triton MXFP4): 64.38 GiB (``_swizzle_mxfp4``'s padded copy
    of the scales beside the checkpoint-layout ones, biases to float32)."""
    w = weights("gpt-oss-120b", "h100-sxm", (0, 14, 1)) / GiB
    assert w == pytest.approx(64.38, rel=0.002)
    assert w == pytest.approx(64.333, abs=0.001)


def test_gpt_oss_20b_a100_0_19_marlin_matches_its_log():
    """myoceane.fr (0.19.0, A100, Marlin): 13.72 GiB (``mxfp4_round_up_hidden_size_and_
    intermediate_size``'s Marlin padding)."""
    w = weights("gpt-oss-20b", "a100-sxm", (0, 19, 0)) / GiB
    assert w == pytest.approx(13.72, rel=0.002)
    assert w == pytest.approx(13.702, abs=0.001)


def test_gpt_oss_120b_h100_modelled_release_matches_vllm_0_33_after_loading():
    """vLLM 0.33 after ``process_weights_after_loading`` (``bench/vllm_weights_reference.py``:
    65,282,370,752 B built, +294,912,000 B by ``_swizzle_mxfp4`` and the float32 biases)."""
    after = 65_282_370_752 + 294_912_000
    assert weights("gpt-oss-120b", "h100-sxm", (0, 33, 0)) == pytest.approx(after, rel=1e-4)
    assert weights("gpt-oss-120b", "h100-sxm", None) == pytest.approx(after, rel=1e-4)


def test_marlin_asked_for_on_hopper_holds_marlins_layout_where_the_release_reads_the_flag():
    """``VLLM_MXFP4_USE_MARLIN=1`` (InferenceX's Hopper gpt-oss scripts, 0.13-0.18 images):
    0.13-0.19 ``get_mxfp4_backend`` returns Marlin, so the experts are padded as Marlin pads
    them (0.10.1's layout, 65.93 GiB); the flag is gone from 0.31 (``vllm/envs.py``)."""
    marlin = {"VLLM_MXFP4_USE_MARLIN": "1"}
    assert mxfp4_backend("hopper", (0, 18, 0), "h200", marlin) == MARLIN
    assert mxfp4_backend("hopper", (0, 18, 0), "h200",
                         {**marlin, "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16": "1"}) == TRITON
    assert mxfp4_backend("hopper", (0, 32, 0), "h200", marlin) == TRITON
    cfg = resolve(EngineArgs(max_num_batched_tokens=8192, max_model_len=8192,
                             kv_cache_memory_bytes=8 * GiB),
                  resolve_model("gpt-oss-120b"), resolve_gpu("h100-sxm"), (0, 14, 1))
    triton, asked = plan_memory(cfg).weights, plan_memory(cfg, marlin).weights
    assert triton / GiB == pytest.approx(64.333, abs=0.001)
    assert asked == pytest.approx(weights("gpt-oss-120b", "h100-sxm", (0, 10, 1)), rel=1e-9)
    assert moe_experts_class(cfg, marlin) != OAI_TRITON


def test_blackwell_trtllm_padding_and_its_change_in_0_27():
    before = weights("gpt-oss-120b", "b200", (0, 26, 0))
    after = weights("gpt-oss-120b", "b200", (0, 27, 0))
    # 36 layers x 128 experts x 3 x 3072 x 128 padded intermediate columns, at 0.53125 B
    # (+ their float32 biases)
    assert before - after == 36 * 128 * (3 * 3072 * 128 * 17 // 32 + 2 * 128 * 4)


def test_expert_parallel_splits_whole_experts_unpadded():
    """Under EP a rank holds whole experts (intermediate 2880: no Triton padding); under TP 4
    each expert's 720 columns are padded to 768 by Triton (``round_up(..., 64)``)."""
    m = resolve_model("gpt-oss-120b")
    ep = mxfp4_layer_bytes(m, TRITON, None, tp=4, expert_parallel=True)
    tp = mxfp4_layer_bytes(m, TRITON, None, tp=4)
    assert ep < tp
    assert padded_sizes(TRITON, None, 2880, 720) == (2880, 768)


def test_other_formats_are_unchanged():
    cfg = resolve(EngineArgs(max_model_len=8192), resolve_model("qwen3-235b-a22b-fp8"),
                  resolve_gpu("h200"))
    assert mxfp4_layout_bytes(cfg) == 0.0


def test_the_experts_class_follows_the_backend():
    """``activation.moe_experts_class``: the OAI Triton kernels on Hopper from 0.12; on the
    A100 ``MarlinExperts`` (the modular kernel's workspace) from 0.17, and before (0.14-0.15
    call ``fused_marlin_moe`` directly; its per-call caches are not derived) nothing."""
    def cls(model: str, gpu: str, version: tuple[int, int, int] | None) -> str:
        return moe_experts_class(resolve(EngineArgs(max_model_len=8192), resolve_model(model),
                                         resolve_gpu(gpu), version))
    assert cls("gpt-oss-120b", "h100-sxm", None) == OAI_TRITON
    assert cls("gpt-oss-120b", "h100-sxm", (0, 10, 1)) == ""
    assert cls("gpt-oss-20b", "a100-sxm", (0, 19, 0)) == "MarlinExperts"
    assert cls("gpt-oss-20b", "a100-sxm", (0, 15, 1)) == ""
    assert cls("gpt-oss-120b", "b200", None) == ""
