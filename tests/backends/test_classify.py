"""Start-up failures classified from vLLM's own messages (docs/vllm-behaviour.md §5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chunktune.backends.classify import classify

LOGS = {
    "EngineOOM": "INFO ... Memory profiling\ntorch.OutOfMemoryError: CUDA out of memory. Tried to "
                 "allocate 224.00 MiB. GPU 0 has a total capacity of 11.53 GiB of which 187.75 "
                 "MiB is free.",
    "KVCacheTooSmall": "INFO Available KV cache memory: -0.3 GiB\nValueError: No available "
                       "memory for the cache blocks. Try increasing `gpu_memory_utilization` "
                       "when initializing the engine.",
    "MaxModelLenTooLarge": "ValueError: To serve at least one request with the model's max seq "
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


# ---- vLLM 0.32's CPU build: real logs (tests/backends/vllm_cpu_logs/README.md) -----------------

CPU_LOGS = Path(__file__).parent / "vllm_cpu_logs"

#: file -> (exit code, reason, infeasible, words of vLLM's own message)
CPU_CASES = {
    "budget": (1, "ConfigRejected", True,
               "max_num_batched_tokens (2) must be greater than or equal to max_num_seqs (4)"),
    "maxlen": (1, "ConfigRejected", True, "User-specified max_model_len (16384)"),
    "partial": (2, "ConfigRejected", True,
                "unrecognized arguments: --max-num-partial-prefills"),
    "nochunk": (1, "ConfigRejected", True,
                "max_num_batched_tokens (64) is smaller than max_model_len (4096)"),
    "threshold": (1, "ConfigRejected", True,
                  "long_prefill_token_threshold (16384) cannot be greater than the "
                  "max_model_len (8192)"),
    "missing": (1, "ModelUnavailable", False, "Repo id must be in the form"),
    "broken": (1, "ModelUnavailable", False, "is not a valid JSON file"),
    "nokv": (1, "InsufficientFreeMemory", False,
             "Available memory on node 0 (6.82/9.09 GiB) on startup is less than desired CPU "
             "memory utilization"),
}


@pytest.mark.parametrize("name", sorted(CPU_CASES))
def test_real_cpu_build_failures(name):
    code, reason, infeasible, words = CPU_CASES[name]
    f = classify(code, (CPU_LOGS / f"{name}.log").read_text())
    assert f.reason == reason
    assert f.infeasible == infeasible
    assert words in f.message  # vLLM's own line, not the traceback around it


def test_any_pydantic_value_error_is_a_refused_configuration():
    # vLLM 0.32 wraps every config check as pydantic "Value error, ... [type=value_error"
    log = ("pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig\n"
           "  Value error, some new rule (3) is violated. [type=value_error, input_value=...]\n"
           "    For further information visit https://errors.pydantic.dev/2.14/v/value_error")
    f = classify(1, log)
    assert f.reason == "ConfigRejected"
    assert f.message.startswith("Value error, some new rule")


def test_cpu_memory_failure_says_what_to_set():
    f = classify(1, (CPU_LOGS / "nokv.log").read_text())
    assert "spec.engine.cpu.kvCacheSpace" in f.describe()
    assert f.describe().startswith(f.message)


def test_reference_kv_too_small_for_max_model_len():
    # vllm-cpu.md: "KV too small for max-model-len: rc 1 after 24-60 s"
    log = ("ValueError: To serve at least one request with the model's max seq len (4096), "
           "(0.01 GiB KV cache is needed, which is larger than the available KV cache memory "
           "(0.0 GiB). Based on the available memory, the estimated maximum model length is "
           "384. Try increasing `VLLM_CPU_KVCACHE_SPACE` or decreasing `max_model_len` when "
           "initializing the engine.\nRuntimeError: Engine core initialization failed. See "
           "root cause above. Failed core proc(s): {}")
    f = classify(1, log)
    assert (f.reason, f.infeasible) == ("MaxModelLenTooLarge", True)
    assert f.message.startswith("ValueError: To serve at least one request")


def test_environment_failures_are_not_infeasible():
    port = classify(1, "ERROR: [Errno 98] error while attempting to bind on address "
                       "('127.0.0.1', 8000): address already in use")
    assert (port.reason, port.infeasible) == ("PortInUse", False)
    sim_port = classify(1, "OSError: [Errno 98] Address already in use")
    assert sim_port.reason == "PortInUse"
    console = classify(1, "importlib.metadata.PackageNotFoundError: No package metadata was "
                          "found for vllm")
    assert (console.reason, console.infeasible) == ("EngineCommandBroken", False)
    assert "vllm.entrypoints.openai.api_server" in console.describe()


def test_fd_limit_warning_is_not_a_port_or_config_failure():
    # Every CPU start-up prints this warning; it must not decide the reason.
    warn = ("(APIServer pid=1) WARNING [system_utils.py:255] Found ulimit of 20000 and failed "
            "to automatically increase with error current limit exceeds maximum limit. This "
            "can cause fd limit errors like `OSError: [Errno 24] Too many open files`.")
    assert classify(-9, warn + "\nKilled").reason == "EngineCrashed"
