"""Fitting the step-time model to an engine's step log (vLLM's iteration-details lines)."""

from __future__ import annotations

import numpy as np
import pytest

from chunktune.core.engine_args import EngineArgs
from chunktune.core.errors import SpecError
from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.core.workload import generate, load_profile
from chunktune.sim.calibration.step_fit import fit_step_log, parse_step_log, step_features
from chunktune.sim.engine.virtual import build_engine

LINE = ("INFO 12-03 01:02:03 [loggers.py:201] Iteration(17): 2 context requests, 2048 context "
        "tokens, 30 generation requests, 30 generation tokens, iteration elapsed time: 41.52 ms, "
        "GPU KV cache usage: 12.5%")


def _engine():
    # without async scheduling: a step is then the sum of the terms the fit scales (under it
    # the host's part hides behind the GPU's, and a fit puts its scale near 0)
    return build_engine(EngineArgs(max_num_batched_tokens=2048, max_model_len=16384,
                                   async_scheduling=False),
                        resolve_model("llama-3.1-8b"), resolve_gpu("h100-sxm"))


def _simulated_log(slowdown: float) -> list[str]:
    """A log in vLLM's format from a simulated run whose steps take ``slowdown`` x longer."""
    eng = _engine()
    res = eng.replay(generate(load_profile("mixed").with_overrides(duration=20, rate=4)))
    s = res.steps
    cap = eng.memory.num_gpu_blocks * eng.memory.block_size
    lines = [f"INFO GPU KV cache size: {cap:,} tokens"]
    for i in range(len(s)):
        ctx_tok = s.prefill_tokens[i]
        ctx_req = 1 if ctx_tok else 0
        gen = s.decodes[i]
        usage = 100 * s.kv_used_blocks[i] / eng.memory.num_gpu_blocks
        lines.append(f"INFO Iteration({i}): {ctx_req} context requests, {ctx_tok} context "
                     f"tokens, {gen} generation requests, {gen} generation tokens, iteration "
                     f"elapsed time: {1e3 * slowdown * s.duration[i]:.2f} ms, GPU KV cache "
                     f"usage: {usage:.1f}%")
    return lines


def test_parses_vllm_iteration_lines():
    log = parse_step_log(["INFO GPU KV cache size: 476,016 tokens", LINE,
                          LINE.replace("41.52 ms", "1.00 ms (dummy)"), "unrelated"])
    assert log.kv_capacity_tokens == 476_016
    assert len(log.steps) == 1  # the dummy step is dropped
    s = log.steps[0]
    assert (s.context_requests, s.context_tokens, s.generation_requests,
            s.generation_tokens) == (2, 2048, 30, 30)
    assert s.elapsed_ms == pytest.approx(41.52) and s.kv_usage_pct == pytest.approx(12.5)


@pytest.mark.parametrize(("lines", "message"), [
    ([], "is empty"),
    (["  ", ""], "is empty"),
    (["INFO 10.0.0.1 - GET /metrics 200"], "no vLLM step lines"),
])
def test_bad_logs_name_the_problem(lines, message):
    with pytest.raises(SpecError) as e:
        parse_step_log(lines, source="engine.log")
    assert message in str(e.value) and "engine.log" in str(e.value)


def test_too_few_steps_to_fit():
    log = parse_step_log([LINE] * 5)
    with pytest.raises(SpecError) as e:
        fit_step_log(log, _engine().cost, source="engine.log")
    assert "5 steps" in str(e.value) and "at least 20" in str(e.value)


def test_fit_recovers_a_slower_engine():
    """Steps 1.3x slower than the model: the fitted model predicts them within a few percent,
    in sample and on held-out steps, and the fitted total is ~1.3x the unscaled one."""
    eng = _engine()
    log = parse_step_log(_simulated_log(1.3))
    fit = fit_step_log(log, eng.cost)
    print(fit)
    assert fit.num_steps > 100
    assert fit.median_rel_err < 0.05 and fit.cross_validated_median_rel_err < 0.05
    x = step_features(log, eng.cost)
    ratio = np.median(fit.predict(x) / x.sum(axis=1))
    assert ratio == pytest.approx(1.3, rel=0.08)
