"""vLLM's version: the start-up defaults that changed between versions, where a manifest names
it, and what a real engine's start-up log says it ran with."""

from __future__ import annotations

import dataclasses

import pytest

from chunktune.api import parse_manifest, validate
from chunktune.backends.base import record_engine_startup
from chunktune.core.engine_args import EngineArgs, resolve
from chunktune.core.errors import SpecError
from chunktune.core.flags import batch_defaults
from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.core.steps import parse_meta
from chunktune.core.trials import TrialResult, TrialState
from chunktune.core.vllm_release import image_version, parse_version
from chunktune.sim.engine.memory import plan_memory
from chunktune.sim.engine.virtual import build_engine
from tests.api.factories import quickstart, vllm_manifest


def test_versions_parse_and_name_their_field():
    assert parse_version("0.12.0") == (0, 12, 0)
    assert parse_version("v0.11.0") == (0, 11, 0)
    assert parse_version("0.32") == (0, 32, 0)
    assert parse_version("0.32.0rc1") == (0, 32, 0)
    with pytest.raises(SpecError, match=r"--vllm-version.*not a vLLM version"):
        parse_version("latest", "--vllm-version")
    with pytest.raises(SpecError, match=r"older than the oldest modelled, 0\.9\.0"):
        parse_version("0.6.3")
    assert image_version("vllm/vllm-openai:v0.11.0") == (0, 11, 0)
    assert image_version("registry.example:5000/vllm/vllm-openai:0.12.0") == (0, 12, 0)
    for unnamed in ("vllm/vllm-openai:latest", "vllm/vllm-openai", None,
                    "vllm/vllm-openai@sha256:" + "a" * 64, "registry.example:5000/vllm"):
        assert image_version(unnamed) is None, unnamed


def test_defaults_follow_the_version():
    """gmu 0.9 before 0.21 and the CUDA graphs outside the KV budget; the 16384-token tier
    for GPUs of >= 160 GiB from 0.28; 8192 / 1024 on an H100 in every modelled version."""
    h100, m = resolve_gpu("h100-sxm"), resolve_model("llama-3.1-8b")
    b200_like = dataclasses.replace(resolve_gpu("h200"), memory_gib=178.4)
    assert batch_defaults(b200_like, version=(0, 27, 0)) == (8192, 1024)
    assert batch_defaults(b200_like, version=(0, 28, 0)) == (16384, 1024)
    assert batch_defaults(b200_like) == (16384, 1024)
    assert batch_defaults(h100, version=(0, 12, 0)) == (8192, 1024)
    old = resolve(EngineArgs(max_model_len=8192), m, h100, (0, 12, 0))
    new = resolve(EngineArgs(max_model_len=8192), m, h100)
    assert (old.gpu_memory_utilization, new.gpu_memory_utilization) == (0.9, 0.92)
    assert resolve(EngineArgs(max_model_len=8192, gpu_memory_utilization=0.95), m, h100,
                   (0, 12, 0)).gpu_memory_utilization == 0.95
    p_old, p_new = plan_memory(old), plan_memory(new)
    # 0.12: 0.9 of the GPU, graphs captured outside it; 0.32: 0.92, graphs inside; the
    # sampler warm-up follows the version too (0.32: Model Runner V2's, derived; 0.12: the
    # calibration, tests/sim/engine/test_sampler_memory.py)
    expected = (p_new.kv_cache + p_new.cudagraph - 0.02 * h100.memory_bytes
                + p_new.activation_peak - p_old.activation_peak)
    assert p_old.kv_cache == pytest.approx(expected, rel=1e-9)
    # at a fixed fraction, the old accounting leaves the graphs' memory to the KV cache
    same = resolve(EngineArgs(max_model_len=8192, gpu_memory_utilization=0.92), m, h100,
                   (0, 20, 0))
    p_same = plan_memory(same)
    assert p_same.kv_cache == pytest.approx(p_new.kv_cache + p_new.cudagraph
                                            + p_new.activation_peak - p_same.activation_peak)


def test_async_scheduling_follows_the_version_and_the_flag():
    """On by default since 0.14 (``--no-async-scheduling`` turns it off), off before unless
    ``--async-scheduling``; the step then takes the longer of the host's part and the GPU's
    instead of their sum."""
    h100, m = resolve_gpu("h100-sxm"), resolve_model("llama-3.1-8b")
    args = EngineArgs(max_model_len=8192)
    assert resolve(args, m, h100).async_scheduling is True
    assert resolve(args, m, h100, (0, 14, 0)).async_scheduling is True
    assert resolve(args, m, h100, (0, 13, 0)).async_scheduling is False
    assert resolve(args, m, h100, (0, 12, 0)).flags()["async-scheduling"] is False
    on = dataclasses.replace(args, async_scheduling=True)
    off = dataclasses.replace(args, async_scheduling=False)
    assert resolve(on, m, h100, (0, 12, 0)).async_scheduling is True
    assert resolve(off, m, h100).async_scheduling is False
    assert EngineArgs.from_point({"async-scheduling": False}).async_scheduling is False
    with pytest.raises(SpecError, match="--async-scheduling"):
        EngineArgs.from_point({"async-scheduling": "sometimes"})
    sync = build_engine(off, m, h100).cost
    overlapped = build_engine(args, m, h100).cost
    host = sync.c.step_overhead_s + sync.c.per_request_overhead_s * 32
    step = (32, 32, 32, [], 32, 32 * 1500)
    assert overlapped.step_time(*step) == pytest.approx(sync.step_time(*step) - host)
    # a step whose GPU part is shorter than the host's takes the host's time
    tiny = dataclasses.replace(m, num_hidden_layers=1)
    one = build_engine(args, tiny, h100).cost
    host1 = one.c.step_overhead_s + one.c.per_request_overhead_s
    assert one.step_time(1, 1, 1, [], 1, 10) == pytest.approx(host1)


def test_manifest_names_the_version_or_its_image_does():
    sim = quickstart()
    sim["spec"]["engine"]["vllmVersion"] = "0.12.0"
    assert validate(sim) == []
    assert parse_manifest(sim).spec.engine.effective_vllm_version() == (0, 12, 0)
    sim["spec"]["engine"]["vllmVersion"] = "0.6.0"
    problems = validate(sim)
    assert any(path == "spec.engine.vllmVersion" and "oldest modelled" in message
               for path, message in problems), problems
    real = vllm_manifest()
    real["spec"]["engine"]["image"] = "vllm/vllm-openai:v0.11.0"
    assert parse_manifest(real).spec.engine.effective_vllm_version() == (0, 11, 0)
    real["spec"]["engine"]["image"] = "vllm/vllm-openai:latest"
    assert parse_manifest(real).spec.engine.effective_vllm_version() is None


def test_a_real_engine_s_start_up_log_is_recorded_with_its_trial():
    log = [
        "INFO 10-18 10:00:00 [api_server.py:1] non-default args: {'model': 'm', "
        "'max_num_seqs': 128, 'enable_logging_iteration_details': True}\n",
        "INFO 10-18 10:00:01 [scheduler.py:307] Chunked prefill is enabled with "
        "max_num_batched_tokens=2048.\n",
        "INFO 10-18 10:00:02 [core.py:134] Initializing a V1 LLM engine (v0.32.0) with config: "
        "model='m', speculative_config=None\n",
        "INFO 10-18 10:00:09 [kv_cache_utils.py:1] CPU KV cache size: 130,944 tokens\n",
    ]
    meta = parse_meta(log)
    assert (meta.vllm_version, meta.max_num_batched_tokens, meta.max_num_seqs,
            meta.kv_cache_tokens) == ("0.32.0", 2048, 128, 130944)
    result = TrialResult(TrialState.COMPLETE)
    record_engine_startup(result, log)
    assert result.server["engine"]["max_num_batched_tokens"] == 2048
    assert result.server["engine"]["vllm_version"] == "0.32.0"
    # a default budget is logged the same way; max_num_seqs is then not known
    assert parse_meta(log[1:]).max_num_seqs is None
    empty = TrialResult(TrialState.COMPLETE)
    record_engine_startup(empty, ["nothing here\n"])
    assert "engine" not in empty.server
