"""The tuner's view of the engine before any launch: fixed arguments, defaults, feasibility."""

from __future__ import annotations

from optuna.distributions import CategoricalDistribution

from chunktune.api.v1alpha1 import Parameter
from chunktune.core.trials import EngineTarget
from chunktune.tuning.space import EngineContext, distribution


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


def test_a_threshold_beyond_the_tiny_models_context_is_refused_before_launch(tmp_path):
    """The CPU example's space has long-prefill-token-threshold 16384, which vLLM refuses for
    the tiny model (8192 positions, no --max-model-len): the all-real reference study spent 5
    of its 24 real trials starting engines that refused it. The tuner now knows the tiny (or
    any local) model's context length and skips such points without a launch."""
    from chunktune.modelgen.tiny import write_tiny_model

    where = tmp_path / "tiny"
    write_tiny_model(where)
    for model in (f"tiny:{where}", str(where), "tiny:" + str(tmp_path / "absent")):
        target = EngineTarget(kind="vllm", model=model, served_model_name="tiny",
                              fixed_args=("--enforce-eager",))
        ctx = EngineContext.build(target)
        assert ctx.model is not None and ctx.model.max_position_embeddings == 8192, model
        why = ctx.feasibility({"max-num-batched-tokens": 512,
                               "long-prefill-token-threshold": 16384}, prescreen=False)
        assert why is not None and why.reason == "ConfigRejected"
        assert "(16384) cannot be greater than the max_model_len (8192)" in why.message
        assert ctx.feasibility({"max-num-batched-tokens": 512,
                                "long-prefill-token-threshold": 512}, prescreen=False) is None
    # --max-model-len given: that is the limit
    target = EngineTarget(kind="vllm", model=f"tiny:{where}", served_model_name="tiny",
                          fixed_args=("--max-model-len", "4096"))
    why = EngineContext.build(target).feasibility({"long-prefill-token-threshold": 8192},
                                                  prescreen=False)
    assert why is not None and "(4096)" in why.message
    # a model nobody here knows: the rule is left to the engine
    target = EngineTarget(kind="vllm", model="org/unknown-model", served_model_name="m")
    assert EngineContext.build(target).feasibility({"long-prefill-token-threshold": 16384},
                                                   prescreen=False) is None


def test_the_twin_names_how_to_give_a_model_it_does_not_know():
    import pytest

    from chunktune.tuning.strategies.twin_fit import TwinError, twin_model

    target = EngineTarget(kind="vllm", model="org/unknown-model", served_model_name="m")
    with pytest.raises(TwinError, match=r"spec\.engine\.modelConfig"):
        twin_model(target)
    tiny = EngineTarget(kind="vllm", model="tiny:", served_model_name="tiny")
    assert twin_model(tiny).max_position_embeddings == 8192


def test_a_switch_is_off_and_on_with_the_engines_default_first():
    switch = Parameter(name="scheduler-reserve-full-isl")
    assert switch.is_switch and switch.is_finite and switch.grid_values() == [False, True]
    assert distribution(switch) == CategoricalDistribution([False, True])
    target = EngineTarget(kind="vllm", model="llama-3.1-8b", served_model_name="m",
                          gpu="h100-sxm", vllm_version="0.11.0")
    params = [Parameter(name="async-scheduling"), switch,
              Parameter(name="gpu-memory-utilization", choices=[0.9])]
    # trial 0 is the named release's defaults: vLLM 0.11 ran without async scheduling and at
    # 0.9 of the GPU (before 0.21); the gate's default (on) is what 0.19+ starts from
    assert EngineContext.build(target).default_point(params) == {
        "async-scheduling": False, "scheduler-reserve-full-isl": True,
        "gpu-memory-utilization": 0.9}
