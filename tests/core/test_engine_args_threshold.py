"""vLLM 0.32's SchedulerConfig refuses a long-prefill threshold above max_model_len
(``vllm/config/scheduler.py``); the simulator and the tuner's pre-check refuse it alike."""

from __future__ import annotations

import pytest

from chunktune.core.engine_args import (
    EngineArgs,
    EngineStartupError,
    check_scheduler_rules,
    resolve,
)
from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model


def test_threshold_above_max_model_len_is_refused_with_vllms_message() -> None:
    with pytest.raises(EngineStartupError) as e:
        check_scheduler_rules(2048, 128, 8192, threshold=16384)
    assert e.value.reason == "ConfigRejected"
    assert ("long_prefill_token_threshold (16384) cannot be greater than the max_model_len "
            "(8192).") in e.value.message
    check_scheduler_rules(2048, 128, 8192, threshold=8192)  # equal is allowed
    check_scheduler_rules(2048, 128, None, threshold=16384)  # unknown length: left to vLLM


def test_the_simulated_engine_refuses_it_at_start_up() -> None:
    args = EngineArgs.from_point({"max-model-len": 4096, "long-prefill-token-threshold": 8192})
    with pytest.raises(EngineStartupError, match=r"cannot be greater than the max_model_len"):
        resolve(args, resolve_model("llama-3.1-8b"), resolve_gpu("h100-sxm"))
