"""A study's end says what happened: a study in which no trial produced a result exits non-zero
and says why (each classified reason counted, and the hint of the most frequent), in the CLI
and in ``result.json``."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from chunktune.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _manifest(tmp_path: Path, **engine: object) -> Path:
    doc = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
    doc["spec"]["engine"].update(engine)
    doc["spec"]["budget"]["maxTrials"] = 3
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_study_where_no_trial_can_start_exits_nonzero_and_says_why(tmp_path, capsys):
    """A 70B model on one L4: every point is predicted out of memory (the weights alone do not
    fit). The study used to end "exhausted", exit 0, the reason nowhere."""
    path = _manifest(tmp_path, model="llama-3.1-70b", gpu={"type": "l4"})
    out = tmp_path / "out"
    rc = main(["tune", str(path), "--storage", str(tmp_path / "s.journal"), "--out", str(out),
               "-q"])
    text = capsys.readouterr()
    assert rc == 1
    err = [x for x in text.err.splitlines() if x.startswith("error: ")]
    assert len(err) == 1, text.err
    assert "no trial produced a result: " in err[0]
    assert " SKIPPED PredictedEngineOOM" in err[0]
    # the hint matches the cause: the weights alone, not the activations of the flags tuned
    assert "weights alone" in err[0] and "lower either" not in err[0]
    doc = json.loads((out / "result.json").read_text())
    n = sum(1 for t in doc["trials"] if t["reason"] == "PredictedEngineOOM")
    assert n >= 1 and f"{n} SKIPPED PredictedEngineOOM" in doc["no_result"]
    assert doc["best"] is None


def test_a_study_with_results_has_no_such_line(tmp_path, capsys):
    path = _manifest(tmp_path)
    out = tmp_path / "out"
    rc = main(["tune", str(path), "--storage", str(tmp_path / "s.journal"), "--out", str(out),
               "-q", "--max-trials", "2"])
    text = capsys.readouterr()
    assert rc == 0, text.err
    assert "no trial produced a result" not in text.out + text.err
    assert "no_result" not in json.loads((out / "result.json").read_text())


def test_the_memory_hint_says_when_the_weights_alone_do_not_fit(capsys):
    assert main(["sim", "run", "--model", "llama-3.1-70b", "--gpu", "l4", "--workload",
                 "smoke"]) == 1
    err = capsys.readouterr().err
    assert "engine start-up failed (EngineOOM): the model's weights alone" in err
    # the activations' hint stays for a model whose weights fit
    assert main(["sim", "run", "--model", "llama-3.1-8b", "--gpu", "l4", "--workload", "smoke",
                 "--max-num-batched-tokens", "1000000", "--max-num-seqs", "1024",
                 "--max-model-len", "8192"]) == 1
    err = capsys.readouterr().err
    assert "weights alone" not in err and "does not fit: lower either" in err
