"""The contract every trial backend meets, as a reusable suite (Optuna's
``StorageTestCase`` pattern): subclass :class:`BackendContract` and provide ``backend``."""

from __future__ import annotations

import asyncio
from typing import Any

from chunktune.backends.base import TrialBackend
from chunktune.core.trials import EngineTarget, TrialPlan
from chunktune.core.workload import load_profile

PROFILE = load_profile("smoke").with_overrides(duration=8, warmup=1, rate=6)
TARGET = EngineTarget(kind="sim", model="llama-3.1-8b", served_model_name="llama",
                      gpu="h100-sxm", fixed_args=("--max-model-len", "16384"),
                      startup_timeout=60)


def plan(number: int = 1, target: EngineTarget = TARGET, **params: Any) -> TrialPlan:
    return TrialPlan(number=number, params=params or {"max-num-batched-tokens": 2048},
                     target=target, profile=PROFILE, name=f"contract-{number}",
                     drain_timeout=20)


class BackendContract:
    """Assertions every backend must pass. ``backend`` is a fixture yielding the backend."""

    def run(self, backend: TrialBackend, p: TrialPlan, report: Any = None):
        return asyncio.run(backend.run_trial(p, report))

    def test_feasible_trial_is_complete_with_metrics(self, backend):
        r = self.run(backend, plan(1, **{"max-num-batched-tokens": 4096,
                                         "long-prefill-token-threshold": 512}))
        assert r.state == "COMPLETE", (r.reason, r.message)
        for key in ("ttft_p99", "itl_p99", "e2e_p99", "throughput_tokens_per_s", "error_rate",
                    "chat.ttft_p99", "long-context.ttft_p50", "kv_cache_usage_peak",
                    "preemptions_per_minute"):
            assert key in r.metrics, key
        assert 0 < r.metrics["ttft_p50"] <= r.metrics["ttft_p99"]
        assert r.metrics["error_rate"] == 0
        assert r.summary is not None and set(r.summary.classes) == {"long-context", "chat"}
        assert r.summary.overall.requests.ok > 20
        assert r.startup_seconds is not None and r.load_seconds is not None

    def test_refused_configuration_is_infeasible(self, backend):
        r = self.run(backend, plan(2, **{"max-num-batched-tokens": 128, "max-num-seqs": 256}))
        assert r.state == "INFEASIBLE"
        assert r.reason == "ConfigRejected"
        assert "must be greater than or equal to max_num_seqs" in r.message

    def test_out_of_memory_at_startup_is_infeasible(self, backend):
        small = EngineTarget(kind="sim", model="llama-3.1-8b", served_model_name="llama",
                             gpu="l4", fixed_args=("--max-model-len", "8192"),
                             startup_timeout=60)
        r = self.run(backend, plan(3, small, **{"max-num-batched-tokens": 65536}))
        assert r.state == "INFEASIBLE"
        assert r.reason in ("KVCacheTooSmall", "MaxModelLenTooLarge", "EngineOOM")
        assert "ValueError" in r.message or "OutOfMemoryError" in r.message

    def test_reports_windows_and_can_be_pruned(self, backend):
        seen: list[int] = []

        def report(index: int, metrics: dict[str, float]) -> bool:
            seen.append(index)
            # a window's latencies are those of the requests it saw finish: a window in which
            # none finished (a slow engine on a busy machine) carries its counters only
            assert "request_rate" in metrics
            assert "ttft_p99" in metrics or metrics["request_rate"] == 0, metrics
            return len(seen) >= 2

        p = plan(4, **{"max-num-batched-tokens": 2048})
        p = TrialPlan(**{**p.__dict__, "window_seconds": 2.0})
        r = self.run(backend, p, report)
        assert r.state == "PRUNED" and r.reason == "Pruned"
        assert len(seen) >= 2 and seen == sorted(seen)
        assert r.pruned_at == seen[-1]

