"""The ``spec.engine`` part of a ChunkedPrefillTuning: the inference server each trial starts
(re-exported by :mod:`chunktune.api.v1alpha1`)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from chunktune import __version__
from chunktune.api._types import Duration, Model, Quantity

#: The image that runs the simulated engine (``engine.kind: sim``) by default.
DEFAULT_SIM_IMAGE = f"ghcr.io/chunktune/chunktune:{__version__}"

EngineKind = Literal["vllm", "sim", "sglang"]

_ENV_NAME_RE = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")


class KeyRef(Model):
    """A key of a Secret or ConfigMap in the same namespace."""

    name: str = Field(min_length=1, max_length=253)
    """Name of the Secret or ConfigMap."""
    key: str = Field(min_length=1, max_length=253)
    """Key inside it."""
    optional: bool | None = None
    """Start even when the key is missing."""


class EnvVarSource(Model):
    """Where an environment variable's value comes from (only references are stored)."""

    secret_key_ref: KeyRef | None = None
    """A key of a Secret (e.g. an ``HF_TOKEN``); the value itself is never copied."""
    config_map_key_ref: KeyRef | None = None
    """A key of a ConfigMap."""


class EnvVar(Model):
    """An environment variable of the engine container, as in a Kubernetes pod."""

    name: str = Field(min_length=1, max_length=256)
    """Variable name."""
    value: str | None = None
    """A literal value."""
    value_from: EnvVarSource | None = None
    """A reference to a Secret or ConfigMap key, instead of ``value``."""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _ENV_NAME_RE.fullmatch(v):
            raise ValueError(f"must be a valid environment variable name (got {v!r})")
        return v


class GPUSpec(Model):
    """The accelerators each trial's engine gets."""

    type: str | None = Field(default=None, min_length=1, max_length=128)
    """GPU model (``h100-sxm``, ``a100-80g``, ``l4``, ...; see ``chunktune.core.gpus``). Required
    for engine kind sim; for vLLM it enables the memory prescreen."""
    count: int | None = Field(default=None, ge=1, le=64)
    """GPUs per trial. Default: ``tensorParallelSize``."""


class ResourceList(Model):
    """CPU and memory amounts."""

    cpu: Quantity | None = None
    """CPU cores (``4``, ``500m``)."""
    memory: Quantity | None = None
    """Memory (``64Gi``)."""


class Resources(Model):
    """Extra CPU and memory for the engine container (GPUs come from ``gpu``)."""

    requests: ResourceList | None = None
    """Guaranteed amounts."""
    limits: ResourceList | None = None
    """Upper bounds."""


class EngineSpec(Model):
    """The inference server each trial starts."""

    kind: EngineKind = "vllm"
    """``vllm`` (a real vLLM server), ``sim`` (chunktune's simulated vLLM, no GPU needed) or
    ``sglang`` (accepted in manifests; the tuner may not run it yet)."""
    image: str | None = Field(default=None, min_length=1, max_length=1024)
    """Container image. Required for vllm and sglang; for sim the chunktune image."""
    model: str = Field(min_length=1, max_length=512)
    """Hugging Face repo id or local path; for sim a catalog name (``llama-3.1-8b``)."""
    hf_config: dict[str, Any] | None = Field(default=None, alias="modelConfig")
    """Sim only: the model's Hugging Face ``config.json`` inline, for models outside the
    catalog."""
    served_model_name: str | None = Field(default=None, min_length=1, max_length=512)
    """The model name clients send. Default: ``model``."""
    gpu: GPUSpec = Field(default_factory=GPUSpec)
    """Accelerators per trial."""
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    """``--tensor-parallel-size``."""
    args: list[str] = Field(default_factory=list, max_length=128)
    """Extra engine flags every trial uses, e.g. ``["--max-model-len", "32768"]``. Quote
    numbers. A searched flag must not appear here."""
    env: list[EnvVar] = Field(default_factory=list, max_length=64)
    """Environment variables of the engine container."""
    port: int = Field(default=8000, ge=1, le=65535)
    """Port the engine serves its OpenAI API and ``/metrics`` on."""
    startup_timeout: Duration = 900.0
    """How long a trial's engine may take to become ready. Default: 15m."""
    resources: Resources | None = None
    """Extra CPU/memory requests and limits for the engine container."""

    @model_validator(mode="after")
    def _defaults(self) -> EngineSpec:
        if self.served_model_name is None:
            self.served_model_name = self.model
        if self.gpu.count is None:
            self.gpu.count = self.tensor_parallel_size
        if self.image is None and self.kind == "sim":
            self.image = DEFAULT_SIM_IMAGE
        return self
