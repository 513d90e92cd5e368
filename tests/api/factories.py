"""Manifests the API tests start from."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def quickstart() -> dict[str, Any]:
    """A fixed base manifest for variations (the first quickstart example, kept here so the
    tables of bad specs do not move when the example is retuned)."""
    return copy.deepcopy(yaml.safe_load((Path(__file__).with_name("quickstart-base.yaml"))
                                        .read_text()))


def vllm_manifest() -> dict[str, Any]:
    """A small valid manifest for a real vLLM server, with defaults left out."""
    return {
        "apiVersion": "chunktune.dev/v1alpha1",
        "kind": "ChunkedPrefillTuning",
        "metadata": {"name": "llama-prod", "namespace": "inference"},
        "spec": {
            "engine": {"model": "meta-llama/Llama-3.1-8B-Instruct",
                       "image": "vllm/vllm-openai:v0.11.0", "gpu": {"type": "h100-sxm"}},
            "workload": {"profile": "mixed"},
        },
    }
