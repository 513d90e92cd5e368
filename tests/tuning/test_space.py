"""The tuner's view of the engine before any launch: fixed arguments, defaults, feasibility."""

from __future__ import annotations

from chunktune.api.v1alpha1 import Parameter
from chunktune.core.trials import EngineTarget
from chunktune.tuning.space import EngineContext


def test_vllm_target_keeps_what_only_the_simulator_refuses():
    """The tuner's pre-launch checks for a real vLLM engine apply vLLM's rules, not the
    simulator's: prefix caching and a float16 KV cache are fine there."""
    target = EngineTarget(kind="vllm", model="llama-3.1-8b", served_model_name="m",
                          gpu="h100-sxm", fixed_args=("--tensor-parallel-size", "1",
                                                      "--enable-prefix-caching",
                                                      "--kv-cache-dtype", "float16"))
    ctx = EngineContext.build(target)
    assert ctx.fixed.enable_prefix_caching is True and ctx.fixed.kv_cache_dtype == "float16"
    assert ctx.feasibility({"max-num-batched-tokens": 4096, "max-num-seqs": 256},
                           prescreen=True) is None
    assert ctx.feasibility({"max-num-batched-tokens": 128, "max-num-seqs": 256},
                           prescreen=True).reason == "ConfigRejected"


def test_default_point_is_vllms_for_the_gpu():
    target = EngineTarget(kind="vllm", model="llama-3.1-8b", served_model_name="m",
                          gpu="a100-sxm", fixed_args=("--max-num-seqs", "128"))
    ctx = EngineContext.build(target)
    params = [Parameter(name=n, choices=[1]) for n in
              ("max-num-batched-tokens", "max-num-seqs", "long-prefill-token-threshold",
               "gpu-memory-utilization", "max-model-len")]
    assert ctx.default_point(params) == {
        "max-num-batched-tokens": 2048, "max-num-seqs": 128, "long-prefill-token-threshold": 0,
        "gpu-memory-utilization": 0.92, "max-model-len": 131072}


def test_sglang_default_chunk_size_by_gpu_memory():
    params = [Parameter(name="chunked-prefill-size", choices=[1024])]
    target = EngineTarget(kind="sglang", model="m", served_model_name="m", gpu="h100-sxm")
    assert EngineContext.build(target).default_point(params) == {"chunked-prefill-size": 8192}
    target = EngineTarget(kind="sglang", model="m", served_model_name="m", gpu="l4",
                          fixed_args=("--mem-fraction-static", "0.8"))
    assert EngineContext.build(target).default_point(params) == {"chunked-prefill-size": 4096}
