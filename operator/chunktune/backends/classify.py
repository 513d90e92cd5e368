"""Why an engine did not start, from its exit code and the tail of its log.

vLLM's own messages (``docs/vllm-behaviour.md`` §5) map to the reasons a tuner
records. An engine that fails this way is an *infeasible point* (the configuration does not fit
or is refused), not a failed trial; anything unrecognised is ``EngineCrashed``, which is a
failure (it may be the image, the node or a bug, not the flags).
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
    ("InsufficientFreeMemory", re.compile(r"Free memory on device .* on startup is less than "
                                          r"desired GPU memory utilization", re.I)),
    ("ConfigRejected", re.compile(
        r"(must be greater than or equal to max_num_seqs|is smaller than max_model_len|"
        r"Concurrent Partial Prefill is not supported|User-specified max_model_len|"
        r"must be divisible by tensor parallel size|GPU memory utilization must be|"
        r"error: argument|unrecognized arguments|ValueError:)", re.I)),
]
#: Reasons that mean "this configuration cannot run here" (infeasible, learned by the sampler).
INFEASIBLE = {"EngineOOM", "KVCacheTooSmall", "MaxModelLenTooLarge", "ConfigRejected"}


@dataclass(frozen=True)
class StartupFailure:
    reason: str
    message: str
    """The matching log line (vLLM's message), or the last lines of the log."""

    @property
    def infeasible(self) -> bool:
        return self.reason in INFEASIBLE


def classify(exit_code: int | None, log: str, oom_killed: bool = False) -> StartupFailure:
    """Classify a start-up failure. ``oom_killed``: the kernel (or the kubelet) killed the
    container for host memory, which is an environment problem, not the flags."""
    if oom_killed:
        return StartupFailure("HostOOMKilled", "the container was OOM-killed (host memory); "
                                               "raise the pod's memory limit")
    for reason, pat in PATTERNS:
        m = pat.search(log)
        if m:
            return StartupFailure(reason, _line_of(log, m.start()))
    tail = "\n".join(log.strip().splitlines()[-5:])
    code = "" if exit_code is None else f"exit code {exit_code}"
    return StartupFailure("EngineCrashed", f"{code}: {tail}".strip(": ") or "no log")


def _line_of(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return text[start:end if end >= 0 else len(text)].strip()
