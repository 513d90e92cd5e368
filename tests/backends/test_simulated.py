"""The simulated backend and ``chunktune sim run`` give one answer for one replay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chunktune.backends.simulated import SimulatedBackend
from chunktune.cli import main
from chunktune.core.trials import EngineTarget, TrialPlan, TrialState
from chunktune.core.workload import load_profile, trace_profile

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "traces" / "azure-conv-sample.csv"
TARGET = EngineTarget(kind="sim", model="llama-3.1-8b", served_model_name="llama",
                      gpu="h100-sxm")
FLAGS = {"max-num-batched-tokens": 2048, "max-num-seqs": 64}


def sim_run(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    out = tmp_path / "sim.json"
    assert main(["sim", "run", "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
                 "--max-num-batched-tokens", "2048", "--max-num-seqs", "64", *args,
                 "--json", str(out)]) == 0
    capsys.readouterr()
    return json.loads(out.read_text())


@pytest.mark.parametrize("workload", ["closed loop", "trace"])
def test_sim_run_and_the_simulated_backend_count_alike(tmp_path, capsys, workload):
    """16 requests kept in flight on an idle engine: the wave still running when the window
    ends drains in both, not an error; a trace: the same requests, the same latencies."""
    if workload == "closed loop":
        profile = load_profile("chat").with_overrides(concurrency=16, duration=20, warmup=2)
        args = ["--workload", "chat", "--concurrency", "16", "--duration", "20", "--warmup",
                "2"]
    else:
        profile = trace_profile(SAMPLE).with_overrides(warmup=5)
        args = ["--trace", str(SAMPLE), "--warmup", "5"]
    sim = sim_run(tmp_path, capsys, *args)
    res = SimulatedBackend().run_sync(TrialPlan(0, FLAGS, TARGET, profile))
    assert res.state == TrialState.COMPLETE and res.summary is not None
    tuned = res.summary.to_dict()
    assert sim["overall"]["requests"]["failed"] == tuned["overall"]["requests"]["failed"] == 0
    for key in ("overall", "classes", "duration"):
        assert sim[key] == tuned[key], key
    assert res.metrics["error_rate"] == 0.0


def test_requests_still_running_after_the_drain_timeout_are_timeouts(tmp_path, capsys):
    """What the load driver records for a request its drain timeout cut off, sim run records
    too: reason ``timeout``, counted failed."""
    sim = sim_run(tmp_path, capsys, "--workload", "long-context", "--rate", "4",
                  "--duration", "10", "--warmup", "0", "--drain-timeout", "1s")
    failures = sim["overall"]["failures"]
    assert set(failures) == {"timeout"} and failures["timeout"]["count"] > 0
    assert "when the drain timeout expired" in failures["timeout"]["example"]
    assert sim["overall"]["requests"]["failed"] == failures["timeout"]["count"]
    assert sim["duration"]["drain"] == pytest.approx(1.0, abs=0.5)
