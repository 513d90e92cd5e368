"""The ``spec.engine`` part of a ChunkedPrefillTuning: the inference server each trial starts
(re-exported by :mod:`chunktune.api.v1alpha1`)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from chunktune.api._types import (
    DNS1123_SUBDOMAIN,
    IMAGE_REF,
    MODEL_NAME,
    PRINTABLE,
    Duration,
    Model,
    Quantity,
    pattern_str,
)
from chunktune.core import gpus as _gpus
from chunktune.core import vllm_release as _vllm_release
from chunktune.core.errors import SpecError

EngineKind = Literal["vllm", "sim", "sglang"]

_ENV_NAME_RE = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")

#: The GPU names a manifest may give: the simulator's catalogue and its aliases, exactly as
#: listed (the CRD's enum; ``chunktune validate`` suggests the closest for anything else).
GPU_TYPES: tuple[str, ...] = tuple(sorted({*_gpus.gpu_names(),
                                          *getattr(_gpus, "_ALIASES", {})}))

#: One engine argument: printable text, no control characters (a newline in an argument
#: would forge lines in the engine's log and in events).
EngineArg = pattern_str(PRINTABLE, 1024, "printable text without control characters",
                        min_length=0)
#: Capabilities an engine container may add back (everything else stays dropped).
AddCapability = Literal["IPC_LOCK", "SYS_NICE"]


class KeyRef(Model):
    """A key of a Secret or ConfigMap in the same namespace."""

    name: pattern_str(DNS1123_SUBDOMAIN, 253,  # type: ignore[valid-type]
                      "a Secret or ConfigMap name (lower-case letters, digits, '-', '.')")
    """Name of the Secret or ConfigMap."""
    key: pattern_str(r"^[-._a-zA-Z0-9]+$", 253,  # type: ignore[valid-type]
                     "a key of letters, digits, '-', '_' or '.'")
    """Key inside it."""
    optional: bool | None = None
    """Start even when the key is missing."""


class EnvVarSource(Model):
    """Where an environment variable's value comes from (only references are stored)."""

    model_config = Model.model_config | {"json_schema_extra": {"x-kubernetes-validations": [
        {"rule": "has(self.secretKeyRef) != has(self.configMapKeyRef)",
         "message": "give exactly one of secretKeyRef or configMapKeyRef"}]}}

    secret_key_ref: KeyRef | None = None
    """A key of a Secret (e.g. an ``HF_TOKEN``); the value itself is never copied."""
    config_map_key_ref: KeyRef | None = None
    """A key of a ConfigMap."""


class EnvVar(Model):
    """An environment variable of the engine container, as in a Kubernetes pod."""

    model_config = Model.model_config | {"json_schema_extra": {"x-kubernetes-validations": [
        {"rule": "has(self.value) != has(self.valueFrom)",
         "message": "give exactly one of value or valueFrom"}]}}

    name: str = Field(min_length=1, max_length=256,
                      json_schema_extra={"pattern": "^" + _ENV_NAME_RE.pattern + "$"})
    """Variable name."""
    value: str | None = Field(default=None, max_length=32768)
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

    type: str | None = Field(default=None, min_length=1, max_length=128,
                             json_schema_extra={"enum": list(GPU_TYPES)})
    """GPU model (``h100-sxm``, ``a100-80g``, ``l4``, ...; see ``chunktune.core.gpus``). Required
    for engine kind sim; for vLLM it enables the memory prescreen."""
    count: int | None = Field(default=None, ge=1, le=64)
    """GPUs per trial. Default: ``tensorParallelSize``."""
    peer_to_peer: bool | None = None
    """Whether the node's PCIe GPUs reach each other peer to peer (``nvidia-smi topo -p2p r``
    shows ``OK`` between every two a trial uses; cloud VMs often show ``NS``). It decides
    vLLM's all-reduce over PCIe (its own kernel at two GPUs, NCCL's peer-to-peer or
    host-memory path) and so the simulator's step time. Unset: not known, priced as
    docs/simulator.md says. GPUs on NVLink always have it: ``false`` is refused for them."""


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


#: Binary and decimal suffixes of a Kubernetes quantity, as byte multipliers.
_QUANTITY_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
                    "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
                    "Pi": 2**50, "Ei": 2**60}
_BYTES_RE = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([kMGTPE]i?|Ki)?$")
GIB = 2**30


def quantity_bytes(v: int | str) -> int:
    """Bytes of a memory quantity (``1Gi``, ``512Mi``, ``2G``, ``1073741824``)."""
    if isinstance(v, int):
        return v
    m = _BYTES_RE.match(v)
    if m is None:
        raise ValueError(f"must be an amount of memory such as '1Gi', '512Mi' or a number of "
                         f"bytes (got {v!r})")
    return int(float(m[1]) * _QUANTITY_SUFFIX[m[2] or ""])


class CPUSpec(Model):
    """Settings of vLLM's CPU build (``engine.kind: vllm`` without a GPU). Their defaults
    work on a 2-core, 24 GiB machine with a small model (``chunktune model tiny``)."""

    kv_cache_space: Quantity = "1Gi"
    """Memory for the KV cache. Whole GiB go to ``VLLM_CPU_KVCACHE_SPACE``; other amounts to
    ``--kv-cache-memory-bytes`` (vLLM's variable only takes whole GiB and overrides the
    flag). Without either vLLM's CPU build asks for 92% of the node and fails to start."""
    omp_threads_bind: str = Field(default="auto", min_length=1, max_length=256)
    """``VLLM_CPU_OMP_THREADS_BIND``: ``auto`` binds the engine worker to the cores of one
    NUMA node but one (on 2 cores: core 0, leaving core 1 to the API server), ``all`` uses
    every core unbound, or a core list such as ``0-3``."""

    @field_validator("kv_cache_space")
    @classmethod
    def _kv(cls, v: int | str) -> int | str:
        n = quantity_bytes(v)
        if n < 2**20:
            raise ValueError(f"must be at least 1Mi (got {v!r}): the KV cache holds the "
                             f"requests' tokens")
        return v

    @field_validator("omp_threads_bind")
    @classmethod
    def _bind(cls, v: str) -> str:
        if v not in ("auto", "all", "nobind") and not re.fullmatch(
                r"[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*(\|[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*)*",
                v):
            raise ValueError(f"must be auto, all, nobind or a core list such as '0-3' or "
                             f"'0,2' (got {v!r})")
        return v

    @property
    def kv_cache_bytes(self) -> int:
        return quantity_bytes(self.kv_cache_space)
class SecurityContext(Model):
    """Where a vLLM or SGLang engine container may be looser than the default (see
    :func:`chunktune.backends.manifests.engine_security`). The default already drops every
    capability, forbids privilege escalation, uses the RuntimeDefault seccomp profile and a
    read-only root file system (with writable cache, ``/tmp`` and ``/dev/shm`` volumes), and
    runs as the image's user. Privileged containers and privilege escalation cannot be asked
    for."""

    model_config = Model.model_config | {"json_schema_extra": {"x-kubernetes-validations": [
        {"rule": "!(has(self.runAsNonRoot) && self.runAsNonRoot && has(self.runAsUser) && "
                 "self.runAsUser == 0)",
         "message": "runAsNonRoot: true cannot run as user 0"}]}}

    run_as_non_root: bool | None = None
    """Require a non-root user (the restricted Pod Security profile). Needs an image whose
    user is not root, or ``runAsUser``."""
    run_as_user: int | None = Field(default=None, ge=0, le=2147483647)
    """User id of the engine process (e.g. 1000 to run the root-user vLLM image as
    non-root)."""
    run_as_group: int | None = Field(default=None, ge=0, le=2147483647)
    """Group id of the engine process."""
    fs_group: int | None = Field(default=None, ge=0, le=2147483647)
    """Group that owns the pod's volumes."""
    read_only_root_filesystem: bool | None = None
    """Default true: HOME and the model caches point at a writable ``emptyDir``. Set false
    for an image that writes elsewhere."""
    add_capabilities: list[AddCapability] = Field(
        default_factory=list, max_length=2, json_schema_extra={"x-kubernetes-list-type": "set"})
    """Capabilities to add back: ``IPC_LOCK`` (pinned memory for RDMA), ``SYS_NICE``."""


class CalibrationSpec(Model):
    """A calibration profile (``chunktune calibrate``: the step-time model fitted to a real
    engine's step log) the simulated engine costs its steps with. Give exactly one source."""

    file: str | None = Field(default=None, min_length=1, max_length=1024)
    """A profile JSON file, read where the study runs (``chunktune tune``'s local and
    simulated backends; relative paths from the working directory)."""
    config_map_key_ref: KeyRef | None = None
    """A key of a ConfigMap in the study's namespace holding the profile JSON (the
    kubernetes backend mounts it into each simulated engine)."""


class EngineSpec(Model):
    """The inference server each trial starts."""

    model_config = Model.model_config | {"json_schema_extra": {"x-kubernetes-validations": [
        {"rule": "(has(self.kind) && self.kind == 'sim') || has(self.image)",
         "message": "image is required for engine kinds vllm and sglang (the server image, "
                    "e.g. vllm/vllm-openai:v0.11.0)"},
        {"rule": "!has(self.modelConfig) || (has(self.kind) && self.kind == 'sim')",
         "message": "modelConfig is only used by engine kind sim"},
        {"rule": "!has(self.kind) || self.kind != 'sim' || (has(self.gpu) && "
                 "has(self.gpu.type))",
         "message": "gpu.type is required for engine kind sim (the simulated GPU)"},
        {"rule": "!has(self.gpu) || !has(self.gpu.count) || self.gpu.count >= "
                 "(has(self.tensorParallelSize) ? self.tensorParallelSize : 1)",
         "message": "gpu.count must be >= tensorParallelSize"},
        {"rule": "!has(self.securityContext) || !has(self.kind) || self.kind != 'sim'",
         "message": "securityContext applies to vllm and sglang engines; simulated engines "
                    "always run with the restricted profile"},
        {"rule": "!has(self.args) || self.args.all(a, !a.matches("
                 "'^--(model|port|tensor-parallel-size|served-model-name)(=.*)?$'))",
         "message": "args must not set --model, --port, --tensor-parallel-size or "
                    "--served-model-name: the manifest's own fields set them"},
        {"rule": "!has(self.env) || self.env.all(e, self.env.exists_one(f, f.name == e.name))",
         "message": "env names must be unique"},
    ]}}

    kind: EngineKind = "vllm"
    """``vllm`` (a real vLLM server), ``sim`` (chunktune's simulated vLLM, no GPU needed) or
    ``sglang`` (accepted in manifests; the tuner may not run it yet)."""
    image: pattern_str(IMAGE_REF, 512,  # type: ignore[valid-type]
                       "a container image such as vllm/vllm-openai:v0.11.0") | None = None
    """Container image. Required for vllm and sglang; for sim the chunktune image."""
    vllm_version: pattern_str(  # type: ignore[valid-type]
        r"^v?[0-9]+\.[0-9]+(\.[0-9]+)?([.+-]?[A-Za-z0-9]*)?$", 32,
        "a vLLM version such as 0.11.0") | None = None
    """The vLLM whose start-up defaults the trials get (batch budget and sequences,
    ``--gpu-memory-utilization``, CUDA-graph memory). Default: the one ``image``'s tag names
    (``vllm/vllm-openai:v0.11.0``), else the current (0.32). For sim, the vLLM simulated."""
    model: pattern_str(MODEL_NAME, 512,  # type: ignore[valid-type]
                       "a model id or path of letters, digits and _ . / @ : + - (no spaces)")
    """Hugging Face repo id or local path; for sim a catalog name (``llama-3.1-8b``)."""
    hf_config: dict[str, Any] | None = Field(default=None, alias="modelConfig",
                                             json_schema_extra={"maxProperties": 512})
    """Sim only: the model's Hugging Face ``config.json`` inline, for models outside the
    catalog."""
    served_model_name: pattern_str(  # type: ignore[valid-type]
        MODEL_NAME, 256, "a model name of letters, digits and _ . / @ : + - (no spaces or "
        "control characters)") | None = None
    """The model name clients send. Default: ``model``."""
    gpu: GPUSpec = Field(default_factory=GPUSpec)
    """Accelerators per trial."""
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    """``--tensor-parallel-size``."""
    args: list[EngineArg] = Field(default_factory=list, max_length=128)  # type: ignore[valid-type]
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
    calibration: CalibrationSpec | None = None
    """Sim only: a calibration profile fitted to a real engine (see docs/simulator.md)."""
    cpu: CPUSpec | None = None
    """Run vLLM's CPU build (``pip install 'chunktune[cpu]'``): its KV space and thread
    binding. ``cpu: {}`` takes the defaults. Only for engine kind vllm without a GPU."""
    security_context: SecurityContext | None = None
    """vLLM/SGLang only: where the engine container may be looser (or stricter) than the
    default security context."""

    @field_validator("vllm_version")
    @classmethod
    def _modelled_version(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                _vllm_release.parse_version(v)
            except SpecError as e:
                raise ValueError(e.problems[0][1]) from e
        return v

    def effective_vllm_version(self) -> _vllm_release.Version | None:
        """The vLLM whose defaults apply: ``vllmVersion``, else ``image``'s tag (vllm engines),
        else None (the current)."""
        if self.vllm_version is not None:
            return _vllm_release.parse_version(self.vllm_version, "spec.engine.vllmVersion")
        return _vllm_release.image_version(self.image) if self.kind == "vllm" else None

    @model_validator(mode="after")
    def _defaults(self) -> EngineSpec:
        if self.served_model_name is None:
            self.served_model_name = self.model
        if self.gpu.count is None:
            self.gpu.count = self.tensor_parallel_size
        return self
