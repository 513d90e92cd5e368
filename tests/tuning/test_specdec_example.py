"""``examples/sim-specdec.yaml``: a simulated study that searches speculative decoding's K
jointly with the budget, the threshold and max-num-seqs runs and reports the joint optimum."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from chunktune.api import parse_manifest, validate
from chunktune.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sim-specdec.yaml"


def test_the_example_is_valid_and_searches_k_with_the_budget():
    raw = yaml.safe_load(EXAMPLE.read_text())
    assert validate(raw) == []
    names = [p.name for p in parse_manifest(raw).spec.parameters]
    assert names[0] == "num-speculative-tokens" and {"max-num-batched-tokens",
                                                     "long-prefill-token-threshold",
                                                     "max-num-seqs"} <= set(names)


def test_a_joint_study_reports_the_joint_optimum(tmp_path, capsys):
    raw = yaml.safe_load(EXAMPLE.read_text())
    spec = raw["spec"]
    # a grid small enough for a test: K off or 3, two budgets; 20 simulated seconds a trial
    spec["searchSpace"] = [{"name": "num-speculative-tokens", "choices": [0, 3]},
                           {"name": "max-num-batched-tokens", "choices": [1024, 4096]},
                           {"name": "long-prefill-token-threshold", "choices": [256]},
                           {"name": "max-num-seqs", "choices": [256]}]
    spec["workload"]["duration"] = "20s"
    spec["budget"] = {"maxTrials": 5}
    spec["sampler"] = {"name": "grid"}
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    rc = main(["tune", str(path), "--storage", str(tmp_path / "s.journal"), "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    result = json.loads((out / "result.json").read_text())
    searched = [t for t in result["trials"] if t["state"] == "COMPLETE"
                and "num-speculative-tokens" in t["params"]]
    assert {t["params"]["num-speculative-tokens"] for t in searched} == {0, 3}
    assert {t["params"]["max-num-batched-tokens"] for t in searched} == {1024, 4096}
    # the best is the feasible trial with the lowest objective, over the joint space
    feasible = [t for t in searched if t["constraints_ok"]]
    best = min(feasible, key=lambda t: t["metrics"]["chat.e2e_p99"])
    assert result["best"]["number"] == best["number"]
    assert set(result["best"]["params"]) == {"num-speculative-tokens", "max-num-batched-tokens",
                                             "long-prefill-token-threshold", "max-num-seqs"}
    assert "best configuration" in text and "num_speculative_tokens" in text
    # speculative decoding (K=3 at the chat class's acceptance of 0.75) shortens a chat
    # answer's steps: what drives the optimum here
    by_k = {k: min(t["metrics"]["chat.e2e_p99"] for t in searched
                   if t["params"]["num-speculative-tokens"] == k) for k in (0, 3)}
    assert by_k[3] < by_k[0]
