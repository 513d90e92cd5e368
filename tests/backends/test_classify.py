"""Start-up failures classified from vLLM's own messages (docs/vllm-behaviour.md §5)."""

from __future__ import annotations

import pytest

from chunktune.backends.classify import classify

LOGS = {
    "EngineOOM": "INFO ... Memory profiling\ntorch.OutOfMemoryError: CUDA out of memory. Tried to "
                 "allocate 224.00 MiB. GPU 0 has a total capacity of 11.53 GiB of which 187.75 "
                 "MiB is free.",
    "KVCacheTooSmall": "INFO Available KV cache memory: -0.3 GiB\nValueError: No available "
                       "memory for the cache blocks. Try increasing `gpu_memory_utilization` "
                       "when initializing the engine.",
    "MaxModelLenTooLarge": "ValueError: To serve at least one request with the models's max seq "
                           "len (8192), (0.35 GiB KV cache is needed, which is larger than the "
                           "available KV cache memory (0.29 GiB). Based on the available "
                           "memory, the estimated maximum model length is 6656.",
    "ConfigRejected": "ValueError: max_num_batched_tokens (128) must be greater than or equal "
                      "to max_num_seqs (256).",
    "InsufficientFreeMemory": "ValueError: Free memory on device (37.95/79.25 GiB) on startup "
                              "is less than desired GPU memory utilization (0.9, 71.33 GiB).",
}


@pytest.mark.parametrize("reason", sorted(LOGS))
def test_vllm_messages(reason):
    f = classify(1, "INFO starting\n" + LOGS[reason] + "\nINFO shutting down")
    assert f.reason == reason
    assert f.message in LOGS[reason]  # the matching line, not the whole log
    assert f.infeasible == (reason != "InsufficientFreeMemory")


def test_sampler_warmup_oom_and_v0_kv_message():
    assert classify(1, "RuntimeError: CUDA out of memory occurred when warming up sampler with "
                       "256 dummy requests.").reason == "EngineOOM"
    assert classify(1, "ValueError: The model's max seq len (131072) is larger than the maximum "
                       "number of tokens that can be stored in KV cache (37696).").reason \
        == "MaxModelLenTooLarge"


def test_unknown_crash_is_a_failure_not_infeasible():
    f = classify(139, "Segmentation fault\n")
    assert f.reason == "EngineCrashed" and not f.infeasible
    assert "exit code 139" in f.message
    assert classify(137, "", oom_killed=True).reason == "HostOOMKilled"
