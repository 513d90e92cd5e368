"""Step by step: each checked vLLM release's own scheduler against the simulator's.

For every release of :data:`chunktune.core.vllm_release.SCHEDULERS`, the release's wheel
(downloaded once into a cache, ``wheels.py``) drives its ``vllm.v1.core.sched.scheduler.
Scheduler`` in a subprocess of its own (``vllm_scheduler.py``) through the cases of
``cases.py``; the simulator, set to that release, runs the same cases. Per case the per-step
iteration counts, the preemptions and the draft tokens verified per step and the completion
order must be equal.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chunktune.core.vllm_release import SCHEDULERS, Version, text
from tests.sim.releases.cases import CASES, RANDOM, ReleaseCase, sim_trace
from tests.sim.releases.wheels import vllm_extract

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

HERE = Path(__file__).parent
RELEASES = [r.version for r in SCHEDULERS]
PAIRS = [(v, c) for v in RELEASES for c in CASES if c.runs_on(v)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from chunktune.modelgen import write_tiny_model

    return Path(write_tiny_model(tmp_path_factory.mktemp("tiny-model")))


class Releases:
    """Each release's traces, driven on first use (one subprocess per release)."""

    def __init__(self, tiny: Path, tmp: Path) -> None:
        self.tiny = tiny
        self.tmp = tmp
        self.done: dict[Version, dict[str, dict[str, Any]]] = {}

    def __call__(self, version: Version, case: str) -> dict[str, Any]:
        if version not in self.done:
            self.done[version] = self._drive(version)
        return self.done[version][case]

    def _drive(self, version: Version) -> dict[str, dict[str, Any]]:
        try:
            extract = vllm_extract(text(version))
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            pytest.fail(f"vLLM {text(version)}'s wheel: {e}", pytrace=False)
        spec = self.tmp / f"spec-{text(version)}.json"
        out = self.tmp / f"out-{text(version)}.json"
        spec.write_text(json.dumps({"cases": [c.spec() for c in CASES
                                              if c.runs_on(version)]}))
        try:
            proc = subprocess.run(
                [sys.executable, str(HERE / "vllm_scheduler.py"), str(extract), str(self.tiny),
                 str(spec), str(out)], capture_output=True, text=True, timeout=900,
                check=False)
        except subprocess.TimeoutExpired:
            pytest.fail(f"vLLM {text(version)}'s scheduler did not finish in 900 s",
                        pytrace=False)
        if proc.returncode != 0 or not out.is_file():
            pytest.fail(f"vLLM {text(version)}'s scheduler exited {proc.returncode}\n"
                        f"{(proc.stdout + proc.stderr)[-3000:]}", pytrace=False)
        result = json.loads(out.read_text())
        assert result["version"] == text(version), "the extract is of another release"
        return {c["name"]: c for c in result["cases"]}


@pytest.fixture(scope="module")
def vllm(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Releases:
    return Releases(tiny, tmp_path_factory.mktemp("releases"))


def _first_difference(a: list, b: list) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"first difference at step {i}: vLLM {x}, simulator {y}"
    return f"lengths differ: vLLM {len(a)} steps, simulator {len(b)}"


@pytest.mark.parametrize(("version", "case"), PAIRS,
                         ids=[f"{text(v)}-{c.name}" for v, c in PAIRS])
def test_release_scheduler_and_simulator_take_the_same_steps(
        vllm: Releases, tiny: Path, version: Version, case: ReleaseCase) -> None:
    real = vllm(version, case.name)
    sim = sim_trace(case, version, tiny / "config.json")
    steps = [tuple(s) for s in real["steps"]]
    assert steps == sim.steps, _first_difference(steps, sim.steps)
    assert real["preempted"] == sim.preempted
    assert real["drafts"] == sim.drafts, _first_difference(real["drafts"], sim.drafts)
    assert real["finished"] == sim.finished


def test_the_cases_exercise_what_they_are_named_for(vllm: Releases) -> None:
    """Each named case shows, on vLLM's side, the release difference it exists for; the
    random ones cover arrivals mid-run, prefix caching on and off, preemptions, priority
    and chunked prefill off; the speculative ones verify drafts in steps that also carry
    prefill chunks, and preempt where the KV cache is tight."""
    v18, v19, v23, v28, v31, v32, v33, v34 = RELEASES

    def steps(v: Version, name: str) -> list[list[int]]:
        return vllm(v, name)["steps"]

    # the cadence: a no-op without DP before 0.33, holding prefill since
    assert steps(v32, "prefill_schedule_interval_4") == steps(v32, "prefill_schedule_interval_1")
    assert steps(v33, "prefill_schedule_interval_4") != steps(v32, "prefill_schedule_interval_4")
    assert any(s[1] == 0 and s[3] > 0 for s in steps(v33, "prefill_schedule_interval_4"))
    assert steps(v33, "priority_self_preemption") != steps(v32, "priority_self_preemption")
    assert steps(v34, "threshold_without_chunking") != steps(v33, "threshold_without_chunking")
    assert max(s[1] for s in steps(v32, "adaptive_threshold")) > 16
    assert steps(v34, "cache_aware_admission") != steps(v34, "cache_aware_admission_off")
    # the whole-sequence gate: 0.18 admits the long prompt on its first chunk and preempts
    # for its later ones; 0.19 holds it back until it fits, and preempts nothing
    assert sum(vllm(v18, "full_sequence_admission")["preempted"]) > 0
    assert sum(vllm(v19, "full_sequence_admission")["preempted"]) == 0
    assert steps(v19, "full_sequence_admission") == steps(v31, "full_sequence_admission")
    # --no-scheduler-reserve-full-isl: 0.19+ admit as 0.18 did
    for v in (v19, v34):
        assert steps(v, "full_sequence_admission_off") == steps(v18, "full_sequence_admission")
    # the threshold on a lone request: held to 32 tokens a step before 0.31, not since
    assert max(s[1] for s in steps(v28, "lone_request_threshold")) == 32
    assert max(s[1] for s in steps(v31, "lone_request_threshold")) == 128
    # draft slots: cut once from the budget (max_num_seqs x 1) before 0.28, a request's each
    assert steps(v23, "spec_draft_k2") != steps(v28, "spec_draft_k2")
    assert sum(vllm(v19, "admission_lookahead")["preempted"]) > 0
    assert sum(vllm(v23, "admission_lookahead")["preempted"]) == 0
    # a preempted request comes back without its lookahead slots before 0.23 (with 0.18's
    # chunk-only admission: at once, to be preempted again)
    assert steps(v18, "spec_draft_k4_tight_kv") != steps(v19, "spec_draft_k4_tight_kv")
    assert steps(v31, "prefill_schedule_interval_4") == steps(v32, "prefill_schedule_interval_4")
    # hybrid KV-cache groups: the gate reserves a windowed group's cap (0.20+); with it off,
    # Gemma-4's layout of five sliding groups to a full one preempts as 0.18 did
    assert sum(vllm(v34, "hybrid_gemma_like")["preempted"]) < \
        sum(vllm(v34, "hybrid_gemma_like_gate_off")["preempted"])
    # (0.34's log counts a resumed request as context: compared on 0.33)
    assert steps(v33, "hybrid_gemma_like_gate_off") == steps(v18, "hybrid_gemma_like")
    # a window sized for two batches in flight with async scheduling from 0.26 (not in 0.23)
    assert steps(v28, "hybrid_sliding_async") != steps(v28, "hybrid_sliding")
    assert steps(v23, "hybrid_sliding_async") == steps(v23, "hybrid_sliding")
    # the opening is found over both groups: fewer prompt tokens computed
    for v in (v18, v34):
        assert sum(s[1] for s in steps(v, "hybrid_sliding_prefix_cache")) < \
            sum(s[1] for s in steps(v, "hybrid_sliding"))
    assert any(c.arrivals and max(c.arrivals) > 0 for c in RANDOM)
    assert {c.enable_prefix_caching for c in RANDOM} == {True, False}
    assert {c.enable_chunked_prefill for c in RANDOM} == {True, False}
    assert any(c.scheduling_policy == "priority" for c in RANDOM)
    assert any(sum(vllm(v34, c.name)["preempted"]) for c in RANDOM)
    spec = [c for c in CASES if c.speculative and c.name.startswith("spec_")]
    assert {c.speculative[0] for c in spec if c.speculative} == {"ngram", "draft_model"}
    for v in RELEASES:
        for c in spec:
            real = vllm(v, c.name)
            # drafts verified beside prefill chunks (a step with context tokens and drafts)
            assert any(s[1] > 0 and d > 0 for s, d in zip(real["steps"], real["drafts"],
                                                           strict=True)), (v, c.name)
            assert ("tight_kv" in c.name) == (sum(real["preempted"]) > 0), (v, c.name)
