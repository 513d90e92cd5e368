"""The trial-backend protocol and the plain data a trial goes in and comes out with.

A backend turns a :class:`TrialPlan` (engine flags, model, GPU, workload) into a
:class:`TrialResult`. Start-up failures are results (``INFEASIBLE`` with the engine's reason
and message), not exceptions; an exception from a backend means the trial itself broke
(``FAIL``). Backends may report intermediate windows through ``report``; when it returns
True the trial is cut short and comes back ``PRUNED``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from chunktune.load.summary import LoadSummary
from chunktune.sim.workload import Profile

TrialState = Literal["COMPLETE", "INFEASIBLE", "FAIL", "PRUNED"]

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
    tensor_parallel_size: int = 1
    image: str | None = None
    fixed_args: tuple[str, ...] = ()
    env: tuple[dict[str, Any], ...] = ()
    hf_config: dict[str, Any] | None = None
    port: int = 8000
    startup_timeout: float = 900.0


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

    def engine_flags(self) -> list[str]:
        """The trial's flags as ``vllm serve`` takes them, fixed args first."""
        out = list(self.target.fixed_args)
        for name, value in self.params.items():
            out += [f"--{name}", _fmt(value)]
        if self.target.tensor_parallel_size > 1 and "--tensor-parallel-size" not in out:
            out += ["--tensor-parallel-size", str(self.target.tensor_parallel_size)]
        return out


def _fmt(v: Any) -> str:
    if isinstance(v, float) and v.is_integer() and abs(v) >= 1:
        return str(int(v))
    return str(v)


def flags_line(params: dict[str, Any]) -> str:
    """``--max-num-batched-tokens 4096 --long-prefill-token-threshold 512``: ready to paste."""
    return " ".join(f"--{k} {_fmt(v)}" for k, v in params.items())


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


class TrialBackend(abc.ABC):
    """Runs trials. Implementations: simulated, local, kubernetes."""

    name: str = "base"

    #: How many trials this backend can run at once (the runner caps parallelism at it).
    max_parallel: int = 1

    @abc.abstractmethod
    async def run_trial(self, plan: TrialPlan, report: Reporter | None = None) -> TrialResult:
        """Start the engine with the plan's flags, wait until it serves (or record why it
        could not start), drive the workload, read metrics, clean up."""

    async def recover(self, plan: TrialPlan, report: Reporter | None = None
                      ) -> TrialResult | None:
        """Re-attach to a trial a previous process left running (restart safety), or one whose
        infrastructure failed for a while (:class:`~chunktune.errors.InfrastructureFault`).
        The default cannot: the caller re-runs the plan. Kubernetes adopts the trial's
        objects."""
        return None

    async def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release anything the backend holds (processes, clients)."""
