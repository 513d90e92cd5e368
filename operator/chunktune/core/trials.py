"""The plain data a trial goes in and comes out with.

A backend (:mod:`chunktune.backends.base`) turns a :class:`TrialPlan` (engine flags, model,
GPU, workload) into a :class:`TrialResult`. Start-up failures are results (``INFEASIBLE`` with
the engine's reason and message), not exceptions; an exception from a backend means the trial
itself broke (``FAIL``). Backends may report intermediate windows through ``report``; when it
returns True the trial is cut short and comes back ``PRUNED``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chunktune.core.flags import argv
from chunktune.core.gpus import GPU, resolve_gpu, with_peer_to_peer
from chunktune.core.steps import StepRecord
from chunktune.core.summary import LoadSummary
from chunktune.core.workload import Profile


class TrialState(enum.StrEnum):
    """A trial's state: one spelling for backend results, the study's records (an Optuna user
    attribute), events, the CLI and the resource's status.

    Optuna's names, plus ``INFEASIBLE`` (the engine would not start with the point, or it ran and
    missed a constraint) and ``SKIPPED`` (never launched: the memory prescreen predicted a
    start-up failure, or the point was measured before). A :class:`TrialResult` is one of
    :data:`RESULT_STATES`. Members are strings (``TrialState.FAIL == "FAIL"``), so stored and
    serialized states stay plain text.
    """

    COMPLETE = "COMPLETE"
    PRUNED = "PRUNED"
    INFEASIBLE = "INFEASIBLE"
    FAIL = "FAIL"
    RUNNING = "RUNNING"
    SKIPPED = "SKIPPED"
    WAITING = "WAITING"
    """Queued in the study (the baseline, a re-run), not started."""


#: What a backend can return: the states of a trial that ran (or tried to start).
RESULT_STATES = frozenset({TrialState.COMPLETE, TrialState.PRUNED, TrialState.INFEASIBLE,
                           TrialState.FAIL})

#: ``report(window_index, metrics_so_far) -> prune?``
Reporter = Callable[[int, dict[str, float]], bool]


@dataclass(frozen=True)
class EngineTarget:
    """What every trial of a study runs: the engine, the model, the hardware."""

    kind: str  # vllm | sim
    model: str
    served_model_name: str
    gpu: str | None = None
    gpu_count: int = 1
    gpu_peer_to_peer: bool | None = None
    """Whether the node's PCIe GPUs reach each other peer to peer (``spec.engine.gpu.
    peerToPeer``; None: not stated)."""
    tensor_parallel_size: int = 1
    image: str | None = None
    fixed_args: tuple[str, ...] = ()
    env: tuple[dict[str, Any], ...] = ()
    hf_config: dict[str, Any] | None = None
    port: int = 8000
    startup_timeout: float = 900.0
    cpu: CpuTarget | None = None
    """vLLM's CPU build and its settings (``spec.engine.cpu``); None: a GPU engine."""
    calibration: dict[str, Any] | None = None
    """A simulated engine's calibration profile (``spec.engine.calibration.file``, read)."""
    calibration_ref: tuple[str, str] | None = None
    """``(ConfigMap name, key)`` of a calibration profile the cluster holds."""
    vllm_version: str | None = None
    """The vLLM whose start-up defaults apply (``spec.engine.vllmVersion`` or the image's tag;
    None: the current)."""

    def node_gpu(self, default: str = "h100-sxm") -> GPU:
        """The GPU each trial runs on (``default`` where none is given), on its node: its
        peer-to-peer path as stated (:func:`chunktune.core.gpus.with_peer_to_peer`)."""
        gpu = resolve_gpu(self.gpu or default, field="spec.engine.gpu.type")
        return with_peer_to_peer(gpu, self.gpu_peer_to_peer)

    def sim_gpu_args(self) -> list[str]:
        """The GPU as ``chunktune sim serve`` takes it: ``--gpu`` and, where stated, the node's
        peer-to-peer path."""
        out = ["--gpu", self.gpu or "h100-sxm"]
        if self.gpu_peer_to_peer is not None:
            out.append("--gpu-peer-to-peer" if self.gpu_peer_to_peer
                       else "--no-gpu-peer-to-peer")
        return out

    def literal_env(self) -> dict[str, str]:
        """The engine's environment variables whose value the manifest writes
        (``spec.engine.env[].value``); those from a Secret or ConfigMap are not known here."""
        return {v["name"]: str(v["value"]) for v in self.env if "value" in v}


@dataclass(frozen=True)
class CpuTarget:
    """``spec.engine.cpu``: KV-cache bytes and OpenMP thread binding of vLLM's CPU build."""

    kv_cache_bytes: int = 2**30
    omp_threads_bind: str = "auto"


@dataclass(frozen=True)
class TrialPlan:
    """One trial: its number in the study, the searched flags' values, and what to measure."""

    number: int
    params: dict[str, Any]
    target: EngineTarget
    profile: Profile
    name: str = ""
    """A name unique within the study (``<tuning>-t<number>``), for processes and objects."""
    window_seconds: float | None = None
    """Report cumulative metrics every this many seconds (for pruning); None: no windows."""
    drain_timeout: float = 60.0
    slos: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per-class per-request SLOs for goodput (``{"chat": {"ttft": 0.5, "tpot": 0.05}}``)."""
    load_workers: int = 0
    """Locust workers of the load run (``workload.loadWorkers``; 0: one process)."""

    def engine_flags(self) -> list[str]:
        """The trial's flags as ``vllm serve`` takes them, fixed args first."""
        out = argv(self.params, base=self.target.fixed_args)
        if self.target.tensor_parallel_size > 1 and "--tensor-parallel-size" not in out:
            out += ["--tensor-parallel-size", str(self.target.tensor_parallel_size)]
        return out


@dataclass
class TrialResult:
    state: TrialState
    metrics: dict[str, float] = field(default_factory=dict)
    """Flat metrics: ``ttft_p99``, ``chat.itl_p99``, ``preemptions_per_minute``, ..."""
    reason: str | None = None
    """Why it is not COMPLETE: ``EngineOOM``, ``KVCacheTooSmall``, ``ConfigRejected``,
    ``StartupTimeout``, ``EngineCrashed``, ``LoadFailed``, ``Pruned``, ..."""
    message: str | None = None
    summary: LoadSummary | None = None
    server: dict[str, Any] = field(default_factory=dict)
    """Server-side figures (from /metrics or Prometheus): preemptions, KV usage, ..."""
    startup_seconds: float | None = None
    load_seconds: float | None = None
    pruned_at: int | None = None
    steps: list[StepRecord] = field(default_factory=list)
    """vLLM's per-step log of this trial (``Iteration(N)`` lines, parsed), in log order."""
    steps_file: str | None = None
    """Where the backend kept that log: JSON lines of :class:`StepRecord`, with the raw
    ``Iteration`` lines next to it (same name, ``.log``)."""
