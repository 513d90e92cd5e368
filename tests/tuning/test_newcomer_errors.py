"""A newcomer's first hour: each mistake ends with one clear line naming what to fix and a
non-zero exit, before any work and without a traceback."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from chunktune.cli import main

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "examples" / "quickstart.yaml")


def _one_error(capsys: pytest.CaptureFixture[str], *words: str) -> None:
    text = capsys.readouterr()
    assert "Traceback" not in text.err
    lines = [x for x in text.err.splitlines() if x.strip()]
    assert len(lines) == 1, text.err
    for w in words:
        assert w in lines[0], lines[0]


@pytest.fixture()
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    return tmp_path


@pytest.mark.parametrize(("args", "words"), [
    (["--out", "afile"], ["--out", "'afile' is a file"]),
    (["--out", "afile/x"], ["--out", "'afile' is a file"]),
    (["--storage", "adir"], ["--storage", "'adir' is a directory", "adir/study.journal"]),
    (["--storage", "afile/s.journal"], ["--storage", "'afile' is a file, not a directory"]),
    (["--storage", "sqlite:///afile/s.db"], ["--storage", "'afile' is a file"]),
    (["--storage", "mysql://u@localhost/db"],
     ["--storage", "needs the mysql driver 'MySQLdb'", "pip install mysqlclient"]),
    (["--storage", "nosuch://h/db"], ["--storage", "not a database URL"]),
    (["--name", "nope"], ["has no ChunkedPrefillTuning named 'nope'", "named quickstart"]),
])
def test_tune_refuses_before_the_study_runs(here, capsys, args, words):
    t0 = time.monotonic()
    assert main(["tune", QUICKSTART, "--max-trials", "2", "-q", *args]) == 1
    _one_error(capsys, *words)
    assert time.monotonic() - t0 < 30  # before any trial (a study takes longer)
    assert not list(here.glob("**/*.journal")) and not (here / ".chunktune").exists()


def test_results_reads_a_database_url(here, capsys):
    """``results sqlite:///x.db`` read the URL as a path (``sqlite:/x.db``)."""
    assert main(["tune", QUICKSTART, "--max-trials", "2", "-q",
                 "--storage", "sqlite:///x.db"]) == 0
    capsys.readouterr()
    assert main(["results", "sqlite:///x.db"]) == 0
    out = capsys.readouterr().out
    assert "study default/quickstart" in out and "best configuration: trial" in out
    # one that is not there is not created
    assert main(["results", "sqlite:///nothere.db"]) == 1
    _one_error(capsys, "no study storage")
    assert not (here / "nothere.db").exists()
    assert main(["results", "mysql://u@localhost/db"]) == 1
    _one_error(capsys, "needs the mysql driver")


def test_operator_run_without_a_cluster_says_so(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "no"),
           "CHUNKTUNE_IMAGE": "example.org/chunktune:test",
           "PYTHONPATH": f"{ROOT / 'operator'}:{ROOT}"}
    p = subprocess.run([sys.executable, "-m", "chunktune", "operator", "run", "--standalone",
                        "--state-dir", str(tmp_path / "state")],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    assert "Traceback" not in p.stderr
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "no Kubernetes cluster to talk to" in lines[0], p.stderr
