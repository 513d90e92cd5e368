"""The default search space of a ChunkedPrefillTuning, and the flags its own fields set.

The flags themselves — spellings, types, parsers, bounds, engines, the formatter — are the
registry's (:mod:`chunktune.core.flags`); the CRD's enum of searchable flags is its
:data:`~chunktune.core.flags.TUNABLE`.

vLLM has no prefill "chunk size" flag: the chunk a request gets in one step is bounded by the
per-step token budget ``--max-num-batched-tokens`` and the per-request cap
``--long-prefill-token-threshold`` (``docs/vllm-behaviour.md`` §1). SGLang's
``--chunked-prefill-size`` is listed for SGLang manifests only.

The default search space (used when ``spec.searchSpace`` is omitted), for vLLM and the
simulator:

=============================== ====================================================
``max-num-batched-tokens``      int 512..16384, step 512 (the step token budget)
``long-prefill-token-threshold`` choices 0 (no cap), 256, 512, 1024, 2048, 4096
``max-num-seqs``                choices 64, 128, 256, 512
=============================== ====================================================

plus, where the engine's release holds prefill without data parallelism (vLLM 0.33 and later,
:attr:`~chunktune.core.vllm_release.SchedulerRelease.local_prefill_cadence`; the newest checked
when the study names no release), ``prefill-schedule-interval`` choices 1, 2, 4, 8: prefill
waits until N steps have passed since the last step that carried some, so decodes run alone
in between — lower ITL for chat, later first tokens for prompts, the trade-off the threshold
makes (:func:`default_search_space`).

Every combination satisfies vLLM's start-up rule ``max_num_batched_tokens >= max_num_seqs``.
For SGLang: ``chunked-prefill-size`` choices 1024, 2048, 4096, 8192, 16384.
"""

from __future__ import annotations

from typing import Any

from chunktune.core.vllm_release import Version, scheduler_release

#: The default search space per engine kind, as manifest mappings (see the module docstring).
DEFAULT_SEARCH_SPACE: dict[str, list[dict[str, Any]]] = {
    "vllm": [
        {"name": "max-num-batched-tokens", "type": "int", "low": 512, "high": 16384,
         "step": 512},
        {"name": "long-prefill-token-threshold", "choices": [0, 256, 512, 1024, 2048, 4096]},
        {"name": "max-num-seqs", "choices": [64, 128, 256, 512]},
    ],
    "sglang": [
        {"name": "chunked-prefill-size", "choices": [1024, 2048, 4096, 8192, 16384]},
    ],
}
DEFAULT_SEARCH_SPACE["sim"] = DEFAULT_SEARCH_SPACE["vllm"]
#: Searched by default where the engine's release has it (:func:`default_search_space`).
PREFILL_CADENCE: dict[str, Any] = {"name": "prefill-schedule-interval", "choices": [1, 2, 4, 8]}


def default_search_space(kind: str, version: Version | None) -> list[dict[str, Any]]:
    """The default search space of an engine ``kind`` running vLLM ``version`` (None: the
    newest checked release, the one the simulator runs by default)."""
    space = list(DEFAULT_SEARCH_SPACE[kind])
    if kind in ("vllm", "sim") and scheduler_release(version).local_prefill_cadence:
        space.append(PREFILL_CADENCE)
    return space

#: Flags the manifest sets through its own fields; they may not appear in ``engine.args``.
MANAGED_FLAGS: dict[str, str] = {
    "model": "spec.engine.model",
    "port": "spec.engine.port",
    "tensor-parallel-size": "spec.engine.tensorParallelSize",
    "served-model-name": "spec.engine.servedModelName",
}
