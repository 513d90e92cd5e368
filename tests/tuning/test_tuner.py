"""The tuning loop on the simulated backend: baseline first, infeasible points learned,
constraints, pruning, Pareto output, duplicates, budget accounting."""

from __future__ import annotations

import asyncio

import optuna
import pytest

from chunktune.backends.simulated import SimulatedBackend
from chunktune.core.errors import SpecError
from chunktune.tuning import study as st
from chunktune.tuning.results.model import collect
from chunktune.tuning.results.text import format_results
from chunktune.tuning.tuner import Tuner


def run(tuning, storage, **kw):
    tuner = Tuner(tuning, SimulatedBackend(), str(storage), **kw)
    why = asyncio.run(tuner.run())
    return tuner, why


def test_baseline_is_trial_zero_with_vllm_defaults(make_tuning, tmp_path):
    tuner, why = run(make_tuning(), tmp_path / "s.journal")
    first = tuner.study.trials[0]
    assert first.number == 0 and first.user_attrs[st.ATTR_BASELINE]
    # H100 serve defaults: budget 8192, threshold 0 (docs/vllm-behaviour.md §2)
    assert st.point_of(first) == {"max-num-batched-tokens": 8192,
                                  "long-prefill-token-threshold": 0}
    res = collect(tuner.study, tuner.objectives, tuner.constraints)
    assert res.baseline == 0
    assert why == "budget" and tuner.counted() == 8
    text = format_results(res)
    assert "baseline = trial 0" in text and "flags: --max-num-batched-tokens" in text


def test_finds_better_than_baseline_within_constraints(make_tuning, tmp_path):
    tuner, _ = run(make_tuning(budget={"maxTrials": 16}), tmp_path / "s.journal")
    res = collect(tuner.study, tuner.objectives, tuner.constraints)
    best, base = res.best_trial, res.baseline_trial
    assert best is not None and best.number != 0
    assert best.metrics["chat.ttft_p99"] < 0.5 * base.metrics["chat.ttft_p99"]
    assert best.metrics["chat.itl_p99"] <= 0.060 and best.metrics["error_rate"] <= 0.01
    assert res.improvement().startswith("-")
    # constraints are Optuna constraints, not penalties: every complete trial has them
    for t in tuner.study.trials:
        if st.trial_state(t) == "COMPLETE":
            assert set(t.constraints) == {"engine_starts", "chat.itl_p99", "error_rate"}


def test_startup_oom_is_infeasible_and_learned(make_tuning, tmp_path):
    # On a 24 GB L4 an 8B model only starts with a small budget: above ~16k tokens the
    # activation peak leaves no KV cache (or one too small for max_model_len).
    tuning = make_tuning(
        engine={"kind": "sim", "model": "llama-3.1-8b", "gpu": {"type": "l4"},
                "args": ["--max-model-len", "8192"]},
        searchSpace=[{"name": "max-num-batched-tokens", "type": "int", "low": 1024,
                      "high": 65536, "step": 1024},
                     {"name": "max-num-seqs", "choices": [32, 64, 128]}],
        workload={"profile": "chat", "duration": "30s", "warmup": "2s", "rate": 2},
        objectives=[{"metric": "ttft_p99"}], constraints=["error_rate <= 1%"],
        budget={"maxTrials": 24, "prescreen": False},
    )
    tuner, _ = run(tuning, tmp_path / "s.journal")
    trials = [t for t in tuner.study.trials if st.trial_state(t) != "SKIPPED"]
    infeasible = [t for t in trials if st.trial_state(t) == "INFEASIBLE"]
    assert infeasible, "no start-up failure was hit"
    for t in infeasible:
        assert t.user_attrs[st.ATTR_REASON] in ("KVCacheTooSmall", "MaxModelLenTooLarge",
                                                "EngineOOM")
        assert "ValueError" in t.user_attrs[st.ATTR_MESSAGE] or "OutOfMemory" in \
            t.user_attrs[st.ATTR_MESSAGE]
        assert t.constraints["engine_starts"] > 0  # told through the constraint
    # learned: the second half proposes fewer failing points than the first
    half = len(trials) // 2
    early = sum(st.trial_state(t) == "INFEASIBLE" for t in trials[1:half])
    late = sum(st.trial_state(t) == "INFEASIBLE" for t in trials[half:])
    assert late < early, (early, late)
    best = collect(tuner.study, tuner.objectives, tuner.constraints).best_trial
    assert best is not None and best.params["max-num-batched-tokens"] < 20000


def test_prescreen_skips_predicted_failures_without_counting(make_tuning, tmp_path):
    tuning = make_tuning(
        engine={"kind": "sim", "model": "llama-3.1-8b", "gpu": {"type": "l4"},
                "args": ["--max-model-len", "8192"]},
        searchSpace=[{"name": "max-num-batched-tokens", "type": "int", "low": 1024,
                      "high": 65536, "step": 1024}],
        workload={"profile": "chat", "duration": "20s", "warmup": "2s", "rate": 2},
        objectives=[{"metric": "ttft_p99"}], constraints=[],
        budget={"maxTrials": 10, "prescreen": True},
    )
    tuner, _ = run(tuning, tmp_path / "s.journal")
    c = tuner.counts()
    assert c["SKIPPED"] > 0 and c["INFEASIBLE"] == 0
    assert tuner.counted() == 10
    skipped = [t for t in tuner.study.trials if st.trial_state(t) == "SKIPPED"
               and t.user_attrs[st.ATTR_REASON] != "Duplicate"]
    assert all(t.user_attrs[st.ATTR_REASON].startswith("Predicted") for t in skipped)


def test_refused_combinations_are_never_launched(make_tuning, tmp_path):
    tuning = make_tuning(
        searchSpace=[{"name": "max-num-batched-tokens", "choices": [256, 512, 4096]},
                     {"name": "max-num-seqs", "choices": [128, 1024]}],
        workload={"profile": "smoke", "duration": "10s", "warmup": "1s"},
        constraints=[], budget={"maxTrials": 4, "prescreen": False},
        sampler={"name": "grid", "seed": 0})
    launched = []

    class Spy(SimulatedBackend):
        async def run_trial(self, plan, report=None):
            launched.append(plan.params)
            return await super().run_trial(plan, report)

    tuner = Tuner(tuning, Spy(), str(tmp_path / "s.journal"))
    asyncio.run(tuner.run())
    assert all(p["max-num-batched-tokens"] >= p["max-num-seqs"] for p in launched)
    rejected = [t for t in tuner.study.trials if t.user_attrs.get(st.ATTR_REASON)
                == "ConfigRejected"]
    assert rejected and all("must be greater than or equal to max_num_seqs" in
                            t.user_attrs[st.ATTR_MESSAGE] for t in rejected)


def test_pruned_trials_are_recorded(make_tuning, tmp_path):
    tuning = make_tuning(
        budget={"maxTrials": 14}, pruner={"name": "median", "warmupWindows": 2},
        workload={"profile": "mixed", "duration": "80s", "warmup": "5s"})
    tuner, _ = run(tuning, tmp_path / "s.journal")
    pruned = [t for t in tuner.study.trials if t.state == optuna.trial.TrialState.PRUNED]
    assert pruned, "nothing was pruned"
    for t in pruned:
        assert st.trial_state(t) == "PRUNED" and t.intermediate_values
        assert t.user_attrs[st.ATTR_METRICS]  # what it measured before it was stopped


def test_pareto_front_for_two_objectives(make_tuning, tmp_path):
    tuning = make_tuning(objectives=[{"metric": "ttft_p99", "class": "chat"},
                                     {"metric": "ttft_p99", "class": "long-context"}],
                         constraints=["error_rate <= 1%"], budget={"maxTrials": 12},
                         sampler={"name": "nsga2", "seed": 0})
    tuner, _ = run(tuning, tmp_path / "s.journal")
    res = collect(tuner.study, tuner.objectives, tuner.constraints)
    assert len(res.pareto) >= 2
    pts = {n: (res.trial(n).metrics["chat.ttft_p99"], res.trial(n).metrics[
        "long-context.ttft_p99"]) for n in res.pareto}
    for a, va in pts.items():  # nobody on the front dominates anybody else on it
        for b, vb in pts.items():
            if a != b:
                assert not (vb[0] <= va[0] and vb[1] <= va[1] and vb != va)
    assert "Pareto front" in format_results(res)


def test_duplicates_are_not_relaunched(make_tuning, tmp_path):
    tuning = make_tuning(searchSpace=[{"name": "long-prefill-token-threshold",
                                       "choices": [0, 512]}],
                         workload={"profile": "smoke", "duration": "10s", "warmup": "1s"},
                         budget={"maxTrials": 3})
    launched = []

    class Spy(SimulatedBackend):
        async def run_trial(self, plan, report=None):
            launched.append(dict(plan.params))
            return await super().run_trial(plan, report)

    tuner = Tuner(tuning, Spy(), str(tmp_path / "s.journal"))
    why = asyncio.run(tuner.run())
    assert why == "exhausted"  # only two distinct points exist
    assert len(launched) == len({tuple(sorted(p.items())) for p in launched})


def test_storage_with_another_search_is_refused(make_tuning, tmp_path):
    run(make_tuning(budget={"maxTrials": 2}), tmp_path / "s.journal")
    other = make_tuning(objectives=[{"metric": "e2e_p99"}], budget={"maxTrials": 2})
    with pytest.raises(SpecError, match="different engine, search space"):
        Tuner(other, SimulatedBackend(), str(tmp_path / "s.journal"))


def test_rerun_continues_the_study(make_tuning, tmp_path):
    storage = tmp_path / "s.journal"
    run(make_tuning(budget={"maxTrials": 4}), storage)
    t2, _ = run(make_tuning(budget={"maxTrials": 7}), storage)
    assert t2.counted() == 7
    numbers = [t.number for t in t2.study.trials]
    assert numbers == sorted(set(numbers))
    assert sum(bool(t.user_attrs.get(st.ATTR_BASELINE)) for t in t2.study.trials) == 1


def test_max_failed_trials_stops_the_study(make_tuning, tmp_path):
    class Broken(SimulatedBackend):
        async def run_trial(self, plan, report=None):
            raise RuntimeError("node lost")

    tuning = make_tuning(budget={"maxTrials": 10, "maxFailedTrials": 2})
    tuner = Tuner(tuning, Broken(), str(tmp_path / "s.journal"))
    assert asyncio.run(tuner.run()) == "failures"
    assert tuner.counts()["FAIL"] == 2
    assert tuner.study.trials[0].user_attrs[st.ATTR_MESSAGE] == "RuntimeError: node lost"


def test_patience_converges(make_tuning, tmp_path):
    tuning = make_tuning(budget={"maxTrials": 40, "patience": 4, "minImprovement": 0.05})
    tuner, why = run(tuning, tmp_path / "s.journal")
    assert why == "converged" and tuner.counted() < 40


def test_grid_runs_to_exhaustion(make_tuning, tmp_path):
    tuning = make_tuning(searchSpace=[{"name": "long-prefill-token-threshold",
                                       "choices": [0, 512, 1024]}],
                         workload={"profile": "smoke", "duration": "8s", "warmup": "1s"},
                         sampler={"name": "grid", "seed": 0}, budget={"maxTrials": 10})
    tuner, why = run(tuning, tmp_path / "s.journal")
    assert why == "exhausted"
    measured = {st.point_of(t)["long-prefill-token-threshold"] for t in tuner.study.trials
                if st.trial_state(t) == "COMPLETE"}
    assert measured == {0, 512, 1024}


def test_infrastructure_faults_are_not_results(make_tuning, tmp_path, monkeypatch):
    """A backend whose infrastructure fails (the cluster API unreachable) neither fails the
    trial nor spends budget: the trial is re-adopted once the backend answers again."""
    from chunktune.core.errors import InfrastructureFault
    from chunktune.tuning import recovery

    monkeypatch.setattr(recovery, "FAULT_RETRY_FIRST", 0.01)

    class Flaky(SimulatedBackend):
        def __init__(self):
            super().__init__()
            self.faults = 0
            self.adopted: list[int] = []

        async def run_trial(self, plan, report=None):
            if plan.number == 1 and not self.faults:
                self.faults += 1
                raise InfrastructureFault("the API server does not answer")
            return await super().run_trial(plan, report)

        async def recover(self, plan, report=None):
            if self.faults < 3:
                self.faults += 1
                raise InfrastructureFault("still no answer")
            self.adopted.append(plan.number)
            return await super().run_trial(plan, report)  # the trial went on meanwhile

    backend = Flaky()
    seen = []
    tuner = Tuner(make_tuning(budget={"maxTrials": 3, "maxFailedTrials": 1}), backend,
                  str(tmp_path / "s.journal"), on_fault=lambda n, m: seen.append((n, m)))
    assert asyncio.run(tuner.run()) == "budget"
    assert tuner.counts()["FAIL"] == 0 and tuner.counts()["COMPLETE"] == 3
    assert [t.number for t in tuner.study.trials] == [0, 1, 2]  # trial 1 kept its number
    assert backend.adopted == [1] and tuner.faults == 3
    assert [n for n, m in seen if m is None] == [1] and len(seen) == 4


def test_a_simulated_study_says_what_its_cost_model_was_fitted_on(make_tuning):
    """`chunktune tune` and the status carry one line on the GPU's step-time model: its own
    measured kernels, or borrowed (and from which GPU); none for a real engine. The study's
    model is the one the tuner resolved once (``context.model``)."""
    from chunktune.tuning import space
    from chunktune.tuning.runner import cost_model, target_from_spec

    def line_of(tuning):  # type: ignore[no-untyped-def]
        return cost_model(tuning, space.EngineContext.build(target_from_spec(tuning)).model)

    line = line_of(make_tuning())
    assert line is not None and line.startswith("h100-sxm: fitted on measured kernels of h100")
    b300 = line_of(make_tuning(engine={"kind": "sim", "model": "llama-3.1-8b",
                                       "gpu": {"type": "b300"}}))
    assert b300 is not None and "b300: no measured kernels; borrowed from b200" in b300
    assert b300.endswith("end to end: no real serving runs of this GPU to check it against")
    # the study's model's own end-to-end figures where the GPU has real runs of it
    oss = line_of(make_tuning(engine={"kind": "sim", "model": "gpt-oss-120b",
                                      "gpu": {"type": "h100-sxm"}}))
    assert oss is not None and (
        "real vLLM serving runs of this model (gpt-oss-120b mxfp4); GPUStack's published runs "
        "of this model on this GPU") in oss
    assert "no real serving runs of this model on this GPU (other dense models'" in line
    real = make_tuning(engine={"kind": "vllm", "model": "meta-llama/Llama-3.1-8B",
                               "image": "vllm/vllm-openai:v0.32.0",
                               "gpu": {"type": "h100-sxm", "count": 1}})
    assert line_of(real) is None


def test_the_engines_start_up_figures_are_kept_with_the_trial(make_tuning, tmp_path):
    """What a real engine's start-up log says it ran with (``server["engine"]``, a nested
    record) is stored with the trial, not dropped with the values a study cannot keep."""
    engine = {"vllm_version": "0.32.0", "max_num_batched_tokens": 8192, "kv_cache_tokens": 4096}

    class Logged(SimulatedBackend):
        async def run_trial(self, plan, report=None):
            result = await super().run_trial(plan, report)
            result.server["engine"] = dict(engine)
            result.server["not_json"] = object()
            return result

    tuner = Tuner(make_tuning(budget={"maxTrials": 1}), Logged(), str(tmp_path / "s.journal"))
    asyncio.run(tuner.run())
    server = tuner.study.trials[0].user_attrs[st.ATTR_SERVER]
    assert server["engine"] == engine and "not_json" not in server


def test_parallel_trials_never_run_the_same_point_at_once(make_tuning, tmp_path):
    """A point the sampler proposes while this writer's own trial of it still runs is not
    launched again (only another writer's running trial was looked for): SKIPPED Duplicate,
    naming the trial that runs it."""
    tuning = make_tuning(
        searchSpace=[{"name": "max-num-batched-tokens", "choices": [2048, 4096]}],
        workload={"profile": "smoke", "duration": "10s", "warmup": "1s"},
        constraints=[], budget={"maxTrials": 6, "parallelism": 3},
        sampler={"name": "random", "seed": 3})
    in_flight: list[str] = []
    overlaps: list[str] = []

    class Spy(SimulatedBackend):
        async def run_trial(self, plan, report=None):
            key = repr(sorted(plan.params.items()))
            if key in in_flight:
                overlaps.append(key)
            in_flight.append(key)
            try:
                return await super().run_trial(plan, report)
            finally:
                in_flight.remove(key)

    tuner = Tuner(tuning, Spy(max_parallel=3), str(tmp_path / "s.journal"))
    asyncio.run(tuner.run())
    assert overlaps == []
    dupes = [t for t in tuner.study.trials if t.user_attrs.get(st.ATTR_REASON) == "Duplicate"]
    assert dupes  # two points, three at once: the sampler did propose a running one
    assert any("runs the same configuration" in t.user_attrs[st.ATTR_MESSAGE] for t in dupes)


def test_two_writers_asking_the_budgets_last_trial_at_once_run_one(make_tuning, tmp_path):
    """Two writers that both saw room for one more trial both ask one (the check and the ask
    are not one step across processes): the later-numbered steps back, SKIPPED ``Budget``,
    not counted and said, and the earlier runs (PostgreSQL's two ``chunktune tune``
    processes once ran 13 trials of 12)."""
    tuning = make_tuning(workload={"profile": "smoke", "duration": "10s", "warmup": "1s"},
                         constraints=[], budget={"maxTrials": 1})
    storage = str(tmp_path / "s.journal")
    a, b = Tuner(tuning, SimulatedBackend(), storage), Tuner(tuning, SimulatedBackend(), storage)
    events = []
    b.on_event = events.append
    first, second = a.study.ask(), b.study.ask()  # both saw no trial: room for one
    assert (first.number, second.number) == (0, 1)
    assert not a._over_budget(first)
    assert b._over_budget(second)
    b._withdraw(second)
    assert b.counted() == 0 and a.counts()["SKIPPED"] == 1
    (withdrawn,) = [t for t in a.trials() if t.number == 1]
    assert st.trial_state(withdrawn) == "SKIPPED"
    assert withdrawn.user_attrs[st.ATTR_REASON] == "Budget"
    assert events[-1].reason == "Budget" and "another writer" in events[-1].message


def test_a_switch_is_searched_on_and_off(make_tuning, tmp_path):
    """A switch named alone in the search space: the grid measures both settings beside the
    other parameter's values, each trial's engine gets ``--async-scheduling`` or
    ``--no-async-scheduling``, the values stay booleans, and trial 0 runs the engine's
    default (on, as vLLM since 0.14)."""
    tuning = make_tuning(searchSpace=[{"name": "async-scheduling"},
                                      {"name": "long-prefill-token-threshold",
                                       "choices": [0, 512]}],
                         workload={"profile": "smoke", "duration": "8s", "warmup": "1s"},
                         sampler={"name": "grid", "seed": 0}, budget={"maxTrials": 10})
    tuner, why = run(tuning, tmp_path / "s.journal")
    assert why == "exhausted"
    points = [st.point_of(t) for t in tuner.study.trials if st.trial_state(t) == "COMPLETE"]
    assert {(p["async-scheduling"], p["long-prefill-token-threshold"]) for p in points} == \
        {(False, 0), (False, 512), (True, 0), (True, 512)}
    assert all(type(p["async-scheduling"]) is bool for p in points)
    assert st.point_of(tuner.study.trials[0])["async-scheduling"] is True
    # the engines differed: without async scheduling each step waits for the host
    itl = {(st.point_of(t)["async-scheduling"], st.point_of(t)["long-prefill-token-threshold"]):
           t.user_attrs[st.ATTR_METRICS]["itl_p50"] for t in tuner.study.trials
           if st.trial_state(t) == "COMPLETE"}
    assert itl[(False, 0)] > itl[(True, 0)] and itl[(False, 512)] > itl[(True, 512)]
