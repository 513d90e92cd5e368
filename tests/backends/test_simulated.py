"""The simulated backend and ``chunktune sim run`` give one answer for one replay."""

from __future__ import annotations

import dataclasses
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


def calibrated(**terms: float) -> EngineTarget:
    from chunktune.sim.calibration import profile as profiles
    prof = profiles.CalibrationProfile(
        model="llama-3.1-8b", gpu="h100-sxm", coefficients={
            k: (1.0 if k.endswith("_scale") else 0.0) for k in profiles.COEFFICIENTS},
        fit={}, fitted_on={}, **terms)
    return dataclasses.replace(TARGET, calibration=prof.to_dict())


def test_a_kept_replay_summarized_again_gives_what_a_new_replay_gives() -> None:
    """``reuse_replays``: a trial that differs from a kept replay only by its delivery stalls
    is summarized from that replay, with exactly a new replay's figures; a step gap (which the
    engine sees) is replayed anew."""
    profile = load_profile("chat").with_overrides(rate=6, duration=20, warmup=2)
    kept = SimulatedBackend(reuse_replays=4)
    terms = [{}, {"delivery_stall_prob": 0.04, "delivery_stall_s": 0.008},
             {"delivery_stall_prob": 0.01, "delivery_stall_s": 0.002}, {"step_gap_s": 0.002}]
    fresh_metrics = []
    for t in terms:
        plan = TrialPlan(0, FLAGS, calibrated(**t), profile)
        fresh = SimulatedBackend().run_sync(plan)
        again = kept.run_sync(plan)
        assert fresh.state == again.state == TrialState.COMPLETE
        assert again.metrics == fresh.metrics, t
        fresh_metrics.append(fresh.metrics)
    # the stalls changed what the clients saw, not the engine; the gap changed the engine
    assert fresh_metrics[1]["chat.itl_p99"] > fresh_metrics[0]["chat.itl_p99"]
    assert fresh_metrics[1]["engine_itl_p99"] == fresh_metrics[0]["engine_itl_p99"]
    assert fresh_metrics[3]["chat.itl_p50"] > fresh_metrics[0]["chat.itl_p50"]
    assert len(kept._replays) == 2  # one replay for the three stall settings, one for the gap


def test_a_trial_reports_the_prefix_caches_hit_rate_and_may_be_held_to_it() -> None:
    """The ``rag`` profile's openings: with ``--enable-prefix-caching`` the trial's metrics
    carry the share of prompt tokens found cached (0.4-0.5: 1,488 of 2,000-4,000 tokens,
    less each opening's first request); without, no rate. A constraint can name it."""
    from chunktune.api._goals import Constraint
    from chunktune.tuning.objectives import ConstraintDef

    profile = load_profile("rag").with_overrides(duration=20, warmup=2)
    cached = dataclasses.replace(TARGET, fixed_args=("--enable-prefix-caching",))
    res = SimulatedBackend().run_sync(TrialPlan(0, FLAGS, cached, profile))
    assert res.state == TrialState.COMPLETE
    assert 0.4 < res.metrics["prefix_cache_hit_rate"] < 0.5
    plain = SimulatedBackend().run_sync(TrialPlan(0, FLAGS, TARGET, profile))
    assert "prefix_cache_hit_rate" not in plain.metrics
    assert plain.metrics["ttft_p99"] > 1.5 * res.metrics["ttft_p99"]
    bound = ConstraintDef.from_spec(Constraint.model_validate("prefix_cache_hit_rate >= 40%"))
    assert bound.key == "prefix_cache_hit_rate" and bound.min == pytest.approx(0.4)
    assert bound.violation(res.metrics) <= 0 < bound.violation(plain.metrics)


def built_engines(monkeypatch: pytest.MonkeyPatch) -> list:
    """The engines the simulated backend builds from now on, in order."""
    from chunktune.backends import simulated

    seen: list = []
    build = simulated.build_engine

    def spy(*args, **kw):
        engine = build(*args, **kw)
        seen.append(engine)
        return engine

    monkeypatch.setattr(simulated, "build_engine", spy)
    return seen


def test_the_engine_env_picks_the_kernels_a_simulated_trial_prices(monkeypatch) -> None:
    """``spec.engine.env`` reaches the simulated engine as its vLLM release reads it:
    gpt-oss-120b on the H100 under vLLM 0.19 with ``VLLM_MXFP4_USE_MARLIN=1`` runs Marlin's
    MXFP4 experts (layout and kernel), so its decode steps cost what Marlin's do, not OpenAI's
    Triton kernel's; the current release no longer reads the variable (gone by 0.31) and runs
    Triton's; a value from a Secret is not known here and is left out; a value vLLM's
    ``int()`` refuses is refused, named by its place in the manifest."""
    from chunktune.backends import simulated
    from chunktune.core.errors import SpecError

    seen = built_engines(monkeypatch)
    profile = load_profile("chat").with_overrides(rate=2, duration=6, warmup=1)
    # (0.19's whole-sequence gate is not modelled over sliding-window layers: off here)
    oss = dataclasses.replace(TARGET, model="gpt-oss-120b", gpu="h100-sxm",
                              vllm_version="0.19.0",
                              fixed_args=("--no-scheduler-reserve-full-isl",))
    marlin = dataclasses.replace(oss, env=(
        {"name": "VLLM_MXFP4_USE_MARLIN", "value": "1"},
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}}))
    now = dataclasses.replace(marlin, vllm_version=None)
    assert simulated.target_vllm_env(marlin, (0, 19, 0)) == {"VLLM_MXFP4_USE_MARLIN": "1"}
    assert simulated.target_vllm_env(now) == {}
    for t in (oss, marlin, now):
        assert SimulatedBackend().run_sync(TrialPlan(0, FLAGS, t, profile)).state \
            == TrialState.COMPLETE
    triton, marlin_engine, current = seen
    assert marlin_engine.cost.vllm_env == {"VLLM_MXFP4_USE_MARLIN": "1"}
    assert marlin_engine.cost.linear_time(8) != triton.cost.linear_time(8)
    assert current.cost.vllm_env == {}
    bad = dataclasses.replace(oss, env=({"name": "HF_HOME", "value": "/x"},
                                        {"name": "VLLM_MXFP4_USE_MARLIN", "value": "true"}))
    with pytest.raises(SpecError, match=r"spec\.engine\.env\[1\]\.value.*give 0 or 1"):
        simulated.target_vllm_env(bad)
    res = SimulatedBackend().run_sync(TrialPlan(0, FLAGS, bad, profile))
    assert res.state == TrialState.INFEASIBLE and "VLLM_MXFP4_USE_MARLIN" in res.message


def test_the_nodes_peer_to_peer_path_reaches_the_simulated_engine(monkeypatch) -> None:
    """``spec.engine.gpu.peerToPeer`` reaches the simulated engine's all-reduce: Qwen3-32B at
    TP 4 on L40S nodes without a peer-to-peer path runs NCCL through host memory, whose
    all-reduces cost a decode step more than on nodes with one; not stated, the engine prices
    what it did before (``tests/sim/cost/test_collectives``); a path that NVLink GPUs cannot
    lack is refused, the trial infeasible, the field named."""
    seen = built_engines(monkeypatch)
    profile = load_profile("chat").with_overrides(rate=1, duration=4, warmup=1)
    base = dataclasses.replace(TARGET, model="qwen3-32b", gpu="l40s", gpu_count=4,
                               tensor_parallel_size=4)
    for p2p in (None, True, False):
        t = dataclasses.replace(base, gpu_peer_to_peer=p2p)
        assert SimulatedBackend().run_sync(TrialPlan(0, FLAGS, t, profile)).state \
            == TrialState.COMPLETE
    unstated, with_path, without = seen
    assert [e.cfg.gpu.peer_to_peer for e in seen] == [None, True, False]
    assert with_path.cost.allreduce_time(16) == pytest.approx(unstated.cost.allreduce_time(16))
    assert without.cost.allreduce_time(16) > 2 * with_path.cost.allreduce_time(16)
    nvlink = dataclasses.replace(TARGET, gpu_peer_to_peer=False)
    res = SimulatedBackend().run_sync(TrialPlan(0, FLAGS, nvlink, profile))
    assert res.state == TrialState.INFEASIBLE
    assert "spec.engine.gpu.peerToPeer" in res.message and "NVLink" in res.message


def test_sim_serve_and_sim_run_take_the_nodes_peer_to_peer_path(tmp_path, capsys) -> None:
    """The command a simulated trial's process or Pod runs carries the stated path
    (``--gpu-peer-to-peer`` / ``--no-gpu-peer-to-peer``), which ``sim run`` takes too;
    ``--no-gpu-peer-to-peer`` on an NVLink GPU is refused, exit 2."""
    assert TARGET.sim_gpu_args() == ["--gpu", "h100-sxm"]
    assert dataclasses.replace(TARGET, gpu="l40s", gpu_peer_to_peer=False).sim_gpu_args() \
        == ["--gpu", "l40s", "--no-gpu-peer-to-peer"]
    assert dataclasses.replace(TARGET, gpu="l4", gpu_peer_to_peer=True).sim_gpu_args() \
        == ["--gpu", "l4", "--gpu-peer-to-peer"]
    out = tmp_path / "sim.json"
    assert main(["sim", "run", "--model", "llama-3.1-8b", "--gpu", "l40s",
                 "--tensor-parallel-size", "2", "--no-gpu-peer-to-peer", "--workload", "chat",
                 "--duration", "3", "--warmup", "0", "--json", str(out)]) == 0
    capsys.readouterr()
    assert main(["sim", "run", "--model", "llama-3.1-8b", "--no-gpu-peer-to-peer",
                 "--workload", "chat", "--duration", "3", "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--gpu-peer-to-peer" in err and "NVLink" in err
