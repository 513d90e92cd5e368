"""The sampler warm-up of vLLM's memory profile (``profile_run`` -> ``_dummy_sampler_run``),
derived from each read release's code (``sim/engine/activation.py``), not measured on a GPU.

The V1 runner's figures (0.17.0, 0.19.0, and 0.33.0's V1 runner) are vLLM's own code run on a
CPU under a live-bytes tracker by ``bench/vllm_sampler_reference.py``; Model Runner V2's (the
default on CUDA in 0.31-0.33) are read from ``v1/worker/gpu/model_runner.py`` and
``v1/worker/gpu/sample/`` (their Triton kernels do not run on a CPU).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from chunktune.core.engine_args import EngineArgs, resolve
from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.sim.engine.activation import (
    FLASHINFER_ROW_STATES_BYTES,
    MRV2_DEFAULT,
    MRV2_WARMUP,
    V1_NATIVE,
    padded_vocab,
    sampler_path,
    sampler_state_bytes,
    sampler_warmup_bytes,
    sampler_warmup_live_bytes,
    triton_buffer_rows,
)
from chunktune.sim.engine.memory import SAMPLER_BYTES_PER_LOGIT, GiB, plan_memory

from .test_activation import CONFIGS, VLLM_0_33, config


def cfg(model="llama-3.1-8b", gpu="h100-sxm", version=None, **kw):
    return resolve(EngineArgs(**kw), resolve_model(model), resolve_gpu(gpu), version=version)


#: ``bench/vllm_sampler_reference.py``: (release, requests, vocab, hidden, the live bytes at
#: the peak of ``GPUModelRunner._dummy_sampler_run`` run on a CPU, 132 SMs faked)
V1_RUNS = [
    ("0.19.0", 256, 4096, 512, 17_379_904),
    ("0.19.0", 256, 4000, 512, 16_999_936),  # the lm-head pads 4000 to 4032
    ("0.19.0", 64, 8192, 256, 9_505_536),  # 64 programs: a 64-row Triton buffer
    ("0.19.0", 8, 2048, 128, 299_360),
    ("0.17.0", 256, 4096, 512, 17_379_904),
    # 0.33's V1 runner (VLLM_USE_V2_MODEL_RUNNER=0): FlashInfer first (1 MiB row states kept),
    # then forward_native for the per-request generator
    ("0.33.0", 256, 4096, 512, 18_429_504),
    ("0.33.0", 8, 2048, 128, 1_347_968),
]


@pytest.mark.parametrize(("release", "reqs", "vocab", "hidden", "peak"), V1_RUNS)
def test_v1_runner_dummy_sampler_run_live_bytes_are_what_vllm_code_allocates(
        release, reqs, vocab, hidden, peak):
    """``GPUModelRunner._dummy_sampler_run``: ``rand_like`` of the rows, the padded bf16
    logits, ``Sampler.forward``'s float32 cast, ``TopKTopPSampler.forward_native``'s softmax and
    ``random_sample``'s noise, ``apply_top_k_top_p_triton``'s cached buffer; what is left
    (0.1%) are the per-request tensors (``torch.full`` of the dummy parameters, argmax)."""
    sim = sampler_warmup_live_bytes(V1_NATIVE, reqs, vocab, hidden, 2, 132)
    if release == "0.33.0":
        sim += FLASHINFER_ROW_STATES_BYTES
    assert sim == pytest.approx(peak, rel=2e-3)
    assert sim < peak  # the per-request tensors are left out, nothing else


def test_triton_buffer_rows_follow_apply_top_k_top_p_triton():
    """``min(next_power_of_2(min(SMs, rows)), SMs)`` rows of float32 x vocab."""
    assert triton_buffer_rows(1024, 132) == 132
    assert triton_buffer_rows(100, 132) == 128
    assert triton_buffer_rows(64, 132) == 64
    assert triton_buffer_rows(8, 132) == 8
    assert padded_vocab(4000) == 4032 and padded_vocab(129280) == 129280


@pytest.mark.parametrize(("model", "published"), [("llama-3.1-8b", 1.89),
                                                  ("qwen2.5-7b", 2.21)])
def test_derived_v1_warmup_reproduces_the_vllm_0_19_calibration(model, published):
    """vLLM 0.19's ``_dummy_sampler_run`` at 1024 sequences after an 8192-token forward pass on
    an H100 (132 SMs) gives the activation peaks of llm-d-planner's 0.19 start-up logs within
    2% (the calibrated 15.3 B a logit): 14 B a logit (bf16 logits, float32 cast, probabilities,
    exponential noise) + the 132-row Triton buffer + the hidden states still held."""
    c = cfg(model, version=(0, 19, 0))
    assert sampler_path(c) == V1_NATIVE
    derived = sampler_warmup_bytes(c)
    assert derived is not None
    assert derived / GiB == pytest.approx(published, rel=0.02)
    m = c.model
    plane = 1024 * m.vocab_size
    assert derived == (8192 + 2 * 1024) * m.hidden_size * 2 + 2 * plane + 12 * plane \
        + 132 * m.vocab_size * 4
    calibrated = SAMPLER_BYTES_PER_LOGIT * plane
    assert derived == pytest.approx(calibrated, rel=0.03)


def test_model_runner_v2_default_pass_holds_only_the_logits_in_0_32():
    """vLLM 0.32 runs Model Runner V2 by default on CUDA (``VllmConfig.use_v2_model_runner``:
    Triton present, no unsupported feature); its ``_dummy_sampler_run`` samples once with the
    dummy batch's default parameters: no request needs processing, top-k / top-p are off, so
    the model-dtype logits go straight to ``gumbel_sample`` (per-block partial results only).
    ``PenaltiesState`` holds ``output_bin_counts`` (rows x vocab int32) and
    ``prompt_bin_mask`` (rows x vocab/32 int32) from the model's loading."""
    c = cfg(version=(0, 32, 0))
    assert sampler_path(c) == MRV2_DEFAULT
    m = c.model
    held = (8192 + 1024) * m.hidden_size * 2 + 1024 * padded_vocab(m.vocab_size) * 2
    assert sampler_warmup_bytes(c) == held
    assert sampler_state_bytes(c) == 1024 * m.vocab_size * 4 + 1024 * math.ceil(
        m.vocab_size / 32) * 4
    assert cfg().vllm_version is None and sampler_path(cfg()) == MRV2_DEFAULT  # the default


def test_model_runner_v2_warmup_pass_of_0_33():
    """vLLM 0.33's ``_dummy_sampler_run`` samples again with ``SamplingParams.
    for_sampler_warmup()``: ``Sampler.apply_sampling_params`` copies the logits to float32,
    and FlashInfer's ``top_k_top_p_sampling_from_logits`` (``VLLM_USE_FLASHINFER_SAMPLER`` on;
    tensor top-k, so not its scalar fast path) makes ``top_k_mask_logits``' masked copy and
    ``torch.softmax``'s probabilities: 14 B a logit with the bf16 logits, and FlashInfer's
    cached 1 MiB row states."""
    c = cfg(version=(0, 33, 0))
    assert sampler_path(c) == MRV2_WARMUP
    m = c.model
    v32 = sampler_warmup_bytes(cfg(version=(0, 32, 0)))
    assert v32 is not None
    assert sampler_warmup_bytes(c) == v32 + 12 * 1024 * m.vocab_size \
        + FLASHINFER_ROW_STATES_BYTES
    assert sampler_state_bytes(c) == sampler_state_bytes(cfg(version=(0, 32, 0)))


def test_releases_not_read_keep_the_0_19_calibration():
    """0.25 (Model Runner V2's default and sampler in between not read), 0.15 (no Triton
    top-k/top-p: the sort path), speculative decoding (the V1 runner's rejection-sampler dummy
    run, Model Runner V2's draft rows), the V1 runner under 8 rows (the sort path): 15.3 B a
    logit, no state."""
    ngram = {"speculative_config": json.dumps({"method": "ngram", "num_speculative_tokens": 3})}
    for c in (cfg(version=(0, 25, 0)), cfg(version=(0, 15, 1)),
              cfg(version=(0, 19, 0), max_num_seqs=4), cfg(version=(0, 33, 0), **ngram)):
        assert sampler_path(c) == "" and sampler_warmup_bytes(c) is None
        plan = plan_memory(c)
        assert plan.sampler_activation == SAMPLER_BYTES_PER_LOGIT * c.max_num_seqs \
            * c.model.vocab_size
        assert plan.sampler_state == 0


@pytest.mark.skipif(not CONFIGS.is_dir(), reason="model configs not beside this checkout")
@pytest.mark.parametrize(("name", "gpu", "tp", "tokens_0_33", "tokens_0_32"), [
    ("deepseek-ai--DeepSeek-V3", "h200", 8, 642_688, 656_528),
    ("moonshotai--Kimi-K2.5", "h200", 8, 760_560, 785_696),
    ("openai--gpt-oss-120b", "h100-sxm", 1, 188_019, 233_059),  # MXFP4 layout: mxfp4.py
    ("Qwen--Qwen3-235B-A22B-FP8", "h200", 4, 1_477_568, 1_516_384),
    ("google--gemma-4-26B-A4B", "h100-sxm", 1, 573_460, 667_826),
    ("meta-llama--Llama-4-Scout-17B-16E-Instruct", "h100-sxm", 4, 751_564, 880_926),
])
def test_issue_32_engines_kv_tokens_with_the_derived_sampler(name, gpu, tp, tokens_0_33,
                                                             tokens_0_32):
    """Issue 32's six engines (budget 8192, 1024 sequences): the KV tokens the simulator's
    plan gives with ``_dummy_sampler_run`` and ``PenaltiesState`` as vLLM 0.33 and 0.32 (the
    simulator's default release) allocate them; the blocks are vLLM's planning of those bytes
    (``test_kv_layout.py``). 0.33's warm-up pass costs 14 B a logit more than 0.32's."""
    assert (name, gpu, tp) in {c[:3] for c in VLLM_0_33}
    mml = 131072 if "Scout" in name else None
    new = plan_memory(config(name, gpu, tp, version=(0, 33, 0), max_model_len=mml))
    old = plan_memory(replace(config(name, gpu, tp, version=(0, 33, 0), max_model_len=mml),
                              vllm_version=(0, 32, 0)))
    assert new.kv_cache_tokens == tokens_0_33
    assert old.kv_cache_tokens == tokens_0_32
    c = config(name, gpu, tp, version=(0, 33, 0), max_model_len=mml)
    assert new.sampler_activation - old.sampler_activation == \
        12 * 1024 * c.model.vocab_size + FLASHINFER_ROW_STATES_BYTES
