"""vLLM's defaults and start-up validation rules (docs/vllm-behaviour.md §2)."""

from __future__ import annotations

import pytest

from chunktune.core.errors import SpecError
from chunktune.sim.config import EngineArgs, EngineStartupError, batch_defaults, resolve
from chunktune.sim.gpus import resolve_gpu
from chunktune.sim.models import resolve_model

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
     "ValueError: max_num_batched_tokens (128) must be greater than or equal to max_num_seqs "
     "(256)."),
    (dict(enable_chunked_prefill=False, max_num_batched_tokens=4096, max_model_len=8192),
     "ValueError: max_num_batched_tokens (4096) is smaller than max_model_len (8192)."),
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
