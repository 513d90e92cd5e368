"""vLLM's defaults and start-up validation rules (docs/vllm-behaviour.md §2), and what the
simulator refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chunktune.core.engine_args import EngineArgs, EngineStartupError, resolve
from chunktune.core.errors import SpecError
from chunktune.core.flags import batch_defaults
from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.sim.engine.virtual import build_engine

ROOT = Path(__file__).resolve().parents[2]

M = resolve_model("llama-3.1-8b")


def res(gpu="h100-sxm", **kw):
    return resolve(EngineArgs(**kw), M, resolve_gpu(gpu))


@pytest.mark.parametrize(("gpu", "budget", "seqs"), [
    ("h100-sxm", 8192, 1024), ("h200", 8192, 1024), ("a100-sxm", 2048, 256),
    ("l4", 2048, 256), ("a10g", 2048, 256), ("l40s", 2048, 256),
])
def test_serve_defaults_by_gpu(gpu, budget, seqs):
    assert batch_defaults(resolve_gpu(gpu)) == (budget, seqs)
    cfg = res(gpu)
    assert (cfg.max_num_batched_tokens, cfg.max_num_seqs) == (budget, seqs)
    assert cfg.max_model_len == 131072 and cfg.gpu_memory_utilization == 0.92


def test_max_num_seqs_default_capped_by_budget():
    assert res(max_num_batched_tokens=512).max_num_seqs == 512


def test_no_chunked_prefill_budget_is_max_model_len():
    assert res(enable_chunked_prefill=False, max_model_len=16384).max_num_batched_tokens == 16384


@pytest.mark.parametrize(("kw", "text"), [
    (dict(max_num_batched_tokens=128, max_num_seqs=256),
     "Value error, max_num_batched_tokens (128) must be greater than or equal to max_num_seqs "
     "(256). [type=value_error, "),
    (dict(enable_chunked_prefill=False, max_num_batched_tokens=4096, max_model_len=8192),
     "Value error, max_num_batched_tokens (4096) is smaller than max_model_len (8192)."),
    (dict(max_num_partial_prefills=2), "Concurrent Partial Prefill is not supported"),
    (dict(max_model_len=200_000), "User-specified max_model_len (200000) is greater than the "
                                  "derived max_model_len"),
    (dict(tensor_parallel_size=3), "Total number of attention heads (32) must be divisible by "
                                   "tensor parallel size (3)."),
])
def test_config_rejected_like_vllm(kw, text):
    with pytest.raises(EngineStartupError) as e:
        res(**kw)
    assert e.value.reason == "ConfigRejected"
    assert text in e.value.message


def test_config_dataclass_rules_print_pydantic_s_validation_error():
    """vLLM 0.32 validates SchedulerConfig/ModelConfig with pydantic: the traceback ends in a
    ValidationError naming the config class and the "Value error, ..." line."""
    with pytest.raises(EngineStartupError) as e:
        res(max_num_batched_tokens=128, max_num_seqs=256)
    first, second, third = e.value.lines
    assert first == ("pydantic_core._pydantic_core.ValidationError: 1 validation error for "
                     "SchedulerConfig")
    assert second == "  " + e.value.message
    assert second.endswith("input_type=ArgsKwargs]")
    assert third.startswith("    For further information visit https://errors.pydantic.dev/")
    with pytest.raises(EngineStartupError) as e:
        res(max_model_len=200_000)
    assert e.value.lines[0].endswith("1 validation error for ModelConfig")


@pytest.mark.parametrize(("kw", "field"), [
    (dict(max_num_batched_tokens=0), "--max-num-batched-tokens"),
    (dict(max_num_seqs=-1), "--max-num-seqs"),
    (dict(long_prefill_token_threshold=-5), "--long-prefill-token-threshold"),
    (dict(gpu_memory_utilization=1.5), "--gpu-memory-utilization"),
    (dict(block_size=17), "--block-size"),
])
def test_bad_values_name_the_flag(kw, field):
    with pytest.raises(SpecError) as e:
        res(**kw)
    assert e.value.problems[0][0] == field


def test_to_cli_round_trip():
    args = EngineArgs(max_num_batched_tokens=4096, long_prefill_token_threshold=512,
                      enable_chunked_prefill=False)
    assert args.to_cli() == ["--max-num-batched-tokens", "4096",
                             "--long-prefill-token-threshold", "512",
                             "--no-enable-chunked-prefill"]


def test_cudagraph_sizes_follow_vllm():
    cfg = res(max_num_seqs=64, max_num_batched_tokens=2048)
    assert cfg.cudagraph_capture_sizes[:4] == (1, 2, 4, 8) and max(cfg.cudagraph_capture_sizes) \
        == 128
    assert res(enforce_eager=True).cudagraph_capture_sizes == ()


# ---- what vLLM takes but the simulator does not model: refused, never ignored ---------------


@pytest.mark.parametrize(("kw", "field", "text"), [
    (dict(max_model_len=-1), "--max-model-len", "auto (-1) fits the length to the KV cache"),
    (dict(kv_cache_dtype="float16"), "--kv-cache-dtype", "the simulator models auto, bfloat16"),
])
def test_simulator_refuses_what_it_does_not_model(kw, field, text):
    args = EngineArgs(**kw)
    args.check()  # vLLM takes it
    with pytest.raises(SpecError) as e:
        args.check_simulated()
    assert e.value.problems[0][0] == field and text in e.value.problems[0][1]
    with pytest.raises(SpecError):
        build_engine(args, M, resolve_gpu("h100-sxm"))


def test_prefix_caching_defaults_off_in_the_simulator_and_is_reported_as_such():
    cfg = res()
    assert cfg.enable_prefix_caching is False and EngineArgs().enable_prefix_caching is False
    assert res(enable_prefix_caching=False).enable_prefix_caching is False


def test_scheduling_policy_reaches_the_scheduler():
    assert res(scheduling_policy="priority").scheduling_policy == "priority"
    engine = build_engine(EngineArgs(scheduling_policy="priority"), M, resolve_gpu("h100-sxm"))
    assert engine.scheduler.priority


# ---- quantization ------------------------------------------------------------------------------


def test_quantization_resolves_like_vllm():
    """vLLM 0.32 ModelConfig._verify_quantization: a checkpoint's method and --quantization
    must agree (ModelOpt FP8 overrides the flag); a bf16 checkpoint is quantized online."""
    h100 = resolve_gpu("h100-sxm")
    qwen = resolve_model("qwen3-32b-fp8")
    assert resolve(EngineArgs(), qwen, h100).quantization == "fp8"
    assert resolve(EngineArgs(quantization="fp8"), qwen, h100).model.weight_dtype == "fp8"
    with pytest.raises(EngineStartupError) as e:
        resolve(EngineArgs(quantization="compressed-tensors"), qwen, h100)
    assert e.value.reason == "ConfigRejected"
    assert ("Quantization method specified in the model config (fp8) does not match the "
            "quantization method specified in the `quantization` argument "
            "(compressed-tensors).") in e.value.message
    modelopt = resolve_model("llama-3.1-8b-fp8")
    assert resolve(EngineArgs(quantization="fp8"), modelopt, h100).quantization == "modelopt"
    online = resolve(EngineArgs(quantization="fp8_per_block"), M, h100)
    assert (online.quantization, online.model.weight_dtype, online.kv_cache_dtype) == \
        ("fp8_per_block", "fp8", "auto")
    assert res().quantization is None and res().model.weight_bytes() == M.weight_bytes()
    with pytest.raises(SpecError, match=r"--quantization.*for a checkpoint without "
                                        r"quantization \(got 'modelopt'\)"):
        resolve(EngineArgs(quantization="modelopt"), M, h100)
    with pytest.raises(SpecError, match=r"--quantization.*models FP8.*\(got 'awq'\)"):
        EngineArgs(quantization="awq").check_simulated()


@pytest.mark.parametrize(("qc", "field", "text"), [
    ({"quant_method": "awq", "bits": 4}, "quantization_config.quant_method",
     "'awq' is not modelled"),
    ({"quant_method": "modelopt", "quantization": {"quant_algo": "W4A8_AWQ"}},
     "quantization_config.quant_algo", "ModelOpt W4A8_AWQ is not modelled"),
    ({"quant_method": "compressed-tensors",
      "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}}},
     "quantization_config.config_groups", "other than 8-bit float"),
    (["fp8"], "quantization_config", "must be a mapping"),
])
def test_quantized_checkpoints_the_simulator_does_not_model_are_refused(qc, field, text):
    from chunktune.core.models import CATALOG_HF, from_hf_config

    with pytest.raises(SpecError) as e:
        from_hf_config({**CATALOG_HF["llama-3.1-8b"], "quantization_config": qc})
    assert any(field in p and text in m for p, m in e.value.problems), e.value.problems


def test_a_modelopt_kv_cache_scheme_resolves_auto_to_fp8():
    """vLLM (0.15-0.33 ``get_kv_cache_quant_algo_string``) reads a ModelOpt checkpoint's
    ``kv_cache_scheme`` before ``kv_cache_quant_algo``: static 8-bit float is an FP8 cache
    (NVIDIA's Kimi-K2.5-NVFP4 config.json writes only that form), anything else ``auto``."""
    from chunktune.core.models import CATALOG_HF, from_hf_config

    def kv(qc: dict[str, object]) -> str:
        return from_hf_config({**CATALOG_HF["llama-3.1-8b"], "quantization_config": {
            "quant_method": "modelopt", "quant_algo": "NVFP4", **qc}}).kv_cache_dtype

    fp8 = {"dynamic": False, "num_bits": 8, "type": "float"}
    assert kv({"kv_cache_scheme": fp8}) == "fp8_e4m3"
    assert kv({"kv_cache_scheme": {**fp8, "dynamic": True}}) == "auto"
    assert kv({"kv_cache_quant_algo": "FP8"}) == "fp8_e4m3"
    assert kv({}) == "auto"
    kimi = from_hf_config(json.loads((ROOT / "bench" / "data" / "e2e" / "model-configs" /
                                      "nvidia--Kimi-K2.5-NVFP4_config.json").read_text()),
                          "kimi")
    assert (kimi.weight_dtype, kimi.kv_cache_dtype) == ("nvfp4", "fp8_e4m3")


def test_fp8_checkpoints_read_from_their_config():
    from chunktune.core.models import CATALOG_HF, from_hf_config

    nested = {"quant_method": "modelopt", "producer": {"name": "modelopt"},
              "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None}}
    m = from_hf_config({**CATALOG_HF["llama-3.1-8b"], "quantization_config": nested})
    assert (m.quantization, m.weight_dtype, m.kv_cache_dtype) == ("modelopt", "fp8", "auto")
    for name, kv in (("llama-3.1-8b-fp8", "fp8_e4m3"), ("llama-3.1-70b-fp8", "auto"),
                     ("qwen3-32b-fp8", "auto")):
        m = resolve_model(name)
        assert (m.weight_dtype, m.kv_cache_dtype, m.dtype) == ("fp8", kv, "bfloat16")
    assert resolve_model("Qwen/Qwen3-32B-FP8").name == "qwen3-32b-fp8"
    assert resolve_model("neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8").name == \
        "llama-3.1-70b-fp8"
