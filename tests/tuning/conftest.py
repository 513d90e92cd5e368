"""Manifests for tuner tests: small, fast (simulated backend, short workloads)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from chunktune.api.reader import parse_manifest

BASE: dict[str, Any] = {
    "apiVersion": "chunktune.dev/v1alpha1",
    "kind": "ChunkedPrefillTuning",
    "metadata": {"name": "t", "namespace": "test"},
    "spec": {
        "engine": {"kind": "sim", "model": "llama-3.1-8b", "gpu": {"type": "h100-sxm"},
                   "args": ["--max-model-len", "32768"]},
        "searchSpace": [
            {"name": "max-num-batched-tokens", "type": "int", "low": 1024, "high": 16384,
             "step": 1024},
            {"name": "long-prefill-token-threshold", "choices": [0, 512, 1024, 2048]},
        ],
        "workload": {"profile": "mixed", "duration": "60s", "warmup": "5s"},
        "objectives": [{"metric": "ttft_p99", "class": "chat"}],
        "constraints": ["chat.itl_p99 <= 60ms", "error_rate <= 1%"],
        "budget": {"maxTrials": 8},
        "sampler": {"name": "tpe", "seed": 1},
        "pruner": {"name": "none"},
    },
}


def manifest(**spec_overrides: Any) -> dict[str, Any]:
    m = copy.deepcopy(BASE)
    for k, v in spec_overrides.items():
        if v is None:
            m["spec"].pop(k, None)
        else:
            m["spec"][k] = v
    return m


@pytest.fixture
def make_tuning():
    def make(**kw: Any):
        return parse_manifest(manifest(**kw))
    return make
