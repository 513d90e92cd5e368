"""Every file reader refuses the hostile corpus (``tests/core/hostile.py``) with a one-line
error naming the file and the line or field, fast, never echoing the file's text (issue 34);
the command line does so in bounded memory and without blocking on a FIFO; the shipped files
still read; and fuzzed bytes give each reader a result or a refusal, never a traceback."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chunktune.api.cli import main_validate
from chunktune.core import trace as trace_mod
from chunktune.core import yamlsafe
from chunktune.core.errors import ChunktuneError
from chunktune.core.steps import read_step_log
from chunktune.core.workload import load_profile, trace_profile
from chunktune.sim.calibration.profile import read_profile
from chunktune.sim.calibration.step_fit import check_steps
from chunktune.tuning.storage import open_storage
from tests.core.hostile import HOSTILE, SECRET, SUFFIX, SURFACES, Hostile

ROOT = Path(__file__).resolve().parents[2]
#: A hostile input costs at most this much CPU time beyond start-up (issue 34) ...
LIMIT_S = 2.0
#: ... and the command at most this much memory.
LIMIT_RSS = 500 * 2**20


def refusal(surface: str, path: Path | str) -> str | None:
    """What the reader of ``surface`` says about ``path``: its error, or None if it took it."""
    try:
        if surface == "manifest":
            err = io.StringIO()
            rc = main_validate(path, out=io.StringIO(), err=err)
            return err.getvalue().strip() if rc else None
        if surface == "profile":
            load_profile(path)
        elif surface == "trace":
            trace_profile(path)
        elif surface == "calibration":
            read_profile(path)
        elif surface == "steps":
            records, meta = read_step_log(path)
            check_steps(records, meta, True, str(path))
        else:
            open_storage(f"sqlite:///{path}" if str(path).endswith(".db") else str(path))
    except ChunktuneError as e:
        return str(e)
    return None


def place(h: Hostile, tmp: Path) -> Path:
    """The hostile input as a path: its file in ``tmp`` (beside the files it names), or the
    special path."""
    (tmp / "ok.csv").write_text("arrival,prompt_tokens,output_tokens\n0,5,1\n1,5,1\n")
    (tmp / "classes.csv").write_text(f"arrival,prompt_tokens,output_tokens,class\n0,5,1,a\n"
                                     f"1,5,1,{SECRET}\n")
    path = tmp / f"h{h.suffix or SUFFIX[h.surface]}"
    if h.special == "fifo":
        os.mkfifo(path)
    elif h.special == "dir":
        path.mkdir()
    elif h.special == "link-environ":
        path.symlink_to("/proc/self/environ")
    elif h.special is not None:
        return Path(h.special)
    else:
        assert h.content is not None
        path.write_bytes(h.content)
    return path


def test_the_corpus_covers_every_surface() -> None:
    assert len({h.id for h in HOSTILE}) == len(HOSTILE)
    for s in SURFACES:
        assert sum(h.surface == s for h in HOSTILE) >= 10, s
    assert len(HOSTILE) >= 100


@pytest.mark.parametrize("h", HOSTILE, ids=[h.id for h in HOSTILE])
def test_every_reader_refuses_its_hostile_files(h: Hostile, tmp_path: Path) -> None:
    path = place(h, tmp_path)
    start = time.process_time()
    message = refusal(h.surface, path)
    spent = time.process_time() - start
    assert message is not None, f"{h.id} was accepted"
    assert SECRET[:12] not in message, message
    assert "Traceback" not in message and len(message) < 1000, message
    assert len(message.splitlines()) == 1, message
    for word in h.expect:
        assert word in message, (word, message)
    if not message.startswith("spec."):  # a field of the manifest, not its bytes
        assert path.stem in message or path.name in message, message
    assert spent < LIMIT_S, f"{h.id}: {spent:.2f}s of CPU"


# ---- the command line: bounded, not blocking, one line ------------------------------------


#: Runs ``argv[2:]`` under a 4 GiB address-space limit and writes its peak resident KiB and CPU
#: seconds to ``argv[1]``. A process forked from pytest starts its peak at pytest's own size;
#: one spawned from this small launcher does not.
LAUNCHER = """
import resource, subprocess, sys
resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))
rc = subprocess.run(sys.argv[2:], stdin=subprocess.DEVNULL).returncode
r = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(sys.argv[1], "w") as f:
    f.write(f"{r.ru_maxrss} {r.ru_utime + r.ru_stime}")
sys.exit(rc if rc >= 0 else 128 - rc)
"""


def _run(args: list[str], cwd: Path) -> tuple[int, str, float, int]:
    """``chunktune ARGS`` as a process (4 GiB of address space at most): its exit status, its
    output, the CPU seconds and the peak resident bytes it took."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'operator'}{os.pathsep}{ROOT}"}
    usage = cwd / "usage.txt"
    usage.unlink(missing_ok=True)
    with (cwd / "out.txt").open("w+") as out:
        proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(usage), sys.executable,
                                 "-m", "chunktune", *args], cwd=cwd, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"chunktune {' '.join(args)} ran for 120 s")
        out.seek(0)
        text = out.read()
    rss_kib, cpu = usage.read_text().split()
    return rc, text, float(cpu), int(rss_kib) * 1024


def _files(tmp: Path) -> dict[str, Path]:
    """The representative hostile files of the command-line check."""
    os.mkfifo(tmp / "fifo.yaml")
    out = {"fifo": tmp / "fifo.yaml"}
    for h in HOSTILE:
        if h.id in ("manifest-huge-line", "manifest-deep", "manifest-huge-int",
                    "trace-jsonl-1e308", "trace-csv-10e23", "steps-1e308-time",
                    "calibration-1e308"):
            out[h.id] = tmp / f"{h.id}{h.suffix or SUFFIX[h.surface]}"
            out[h.id].write_bytes(b"" if h.content is None else h.content)
    rows = tmp / "rows.csv"  # 3,000,000 rows: refused at the 200,001st, while streaming
    with rows.open("w") as f:
        f.write("arrival,prompt_tokens,output_tokens\n")
        for k in range(3000):
            f.write("".join(f"{k}.{i:03d},5,1\n" for i in range(1000)))
    out["rows"] = rows
    line = tmp / "line.csv"  # one line of 64 MiB
    with line.open("wb") as f:
        f.write(b"arrival,prompt_tokens,output_tokens\n0,")
        for _ in range(64):
            f.write(SECRET.encode() * (2**20 // len(SECRET)))
        f.write(b",1\n")
    out["line"] = line
    return out


CLI = [
    ("validate", ["validate", "{fifo}"]),
    ("validate-dev-zero", ["validate", "/dev/zero"]),
    ("validate-huge-line", ["validate", "{manifest-huge-line}"]),
    ("validate-deep", ["validate", "{manifest-deep}"]),
    ("validate-huge-int", ["validate", "{manifest-huge-int}"]),
    ("sim-trace-rows", ["sim", "run", "--trace", "{rows}"]),
    ("sim-trace-line", ["sim", "run", "--trace", "{line}"]),
    ("sim-trace-1e308", ["sim", "run", "--trace", "{trace-jsonl-1e308}"]),
    ("load-trace-10e23", ["load", "run", "--trace", "{trace-csv-10e23}", "--target",
                          "http://127.0.0.1:9", "--model", "tiny"]),
    ("sim-workload-dev-zero", ["sim", "run", "--workload", "/dev/zero"]),
    ("sim-workload-fifo", ["sim", "run", "--workload", "{fifo}"]),
    ("sim-calibration-dev-zero", ["sim", "run", "--calibration", "/dev/zero"]),
    ("sim-calibration-1e308", ["sim", "run", "--model", "tiny", "--gpu", "cpu",
                               "--calibration", "{calibration-1e308}"]),
    ("calibrate-dev-zero", ["calibrate", "--log", "/dev/zero", "--gpu", "cpu", "--model",
                            "tiny", "--out", "p.json"]),
    ("calibrate-1e308", ["calibrate", "--log", "{steps-1e308-time}", "--gpu", "cpu", "--model",
                         "tiny", "--out", "p.json"]),
    ("results-dev-zero", ["results", "/dev/zero"]),
    ("results-fifo", ["results", "{fifo}"]),
]


@pytest.fixture(scope="module")
def cli_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path], float]:
    tmp = tmp_path_factory.mktemp("hostile-cli")
    files = _files(tmp)
    cpu = min(_run(["validate", "absent.yaml"], tmp)[2] for _ in range(2))  # start-up
    return tmp, files, cpu


@pytest.mark.parametrize(("name", "args"), CLI, ids=[n for n, _ in CLI])
def test_the_command_line_refuses_in_one_line_fast_and_bounded(
        name: str, args: list[str], cli_files: tuple[Path, dict[str, Path], float],
        capsys: pytest.CaptureFixture[str]) -> None:
    tmp, files, startup = cli_files
    argv = [a.format(**{k: str(v) for k, v in files.items()}) for a in args]
    rc, out, cpu, rss = _run(argv, tmp)
    with capsys.disabled():
        print(f"\n{name}: exit {rc}, {cpu - startup:+.2f}s of CPU beyond start-up "
              f"({startup:.2f}s), {rss / 2**20:.0f} MiB peak")
    lines = [x for x in out.splitlines() if x.strip()]
    assert rc not in (0, -9), (rc, out)
    assert "Traceback" not in out and SECRET[:12] not in out, out[-2000:]
    assert len(lines) == 1 and len(lines[0]) < 1000, out[-2000:]
    assert rss < LIMIT_RSS, f"{name}: {rss / 2**20:.0f} MiB"
    assert cpu - startup < LIMIT_S, f"{name}: {cpu - startup:.2f}s of CPU beyond start-up"


# ---- the valid controls ------------------------------------------------------------------


SHIPPED_PROFILES = sorted((ROOT / "loadtest" / "profiles").glob("*.yaml")) + sorted(
    (ROOT / "operator" / "chunktune" / "profiles").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED_PROFILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shipped_profiles_still_load(path: Path) -> None:
    assert load_profile(path).classes


def test_shipped_traces_and_examples_still_read() -> None:
    for t in sorted((ROOT / "examples" / "traces").glob("*.csv")):
        assert len(trace_profile(t).trace or ()) > 0, t
    for m in sorted((ROOT / "examples").glob("*.yaml")):
        err = io.StringIO()
        assert main_validate(m, out=io.StringIO(), err=err) == 0, (m, err.getvalue())


def test_a_bom_and_crlf_line_ends_are_read(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_bytes(b"\xef\xbb\xbfarrival,prompt_tokens,output_tokens\r\n0,5,1\r\n2,7,1\r\n")
    assert trace_profile(trace).trace.prompt_tokens == (5, 7)  # type: ignore[union-attr]
    profile = tmp_path / "p.yaml"
    profile.write_bytes(b"\xef\xbb\xbfarrival: {mode: poisson, rate: 2}\r\nduration: 30\r\n"
                        b"classes: [{name: a, prompt_tokens: 10, output_tokens: 10}]\r\n")
    assert load_profile(profile).duration == 30


def test_a_trace_is_refused_while_streaming(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    """The row past max_requests ends the reading: rows after it are never parsed (a broken
    row there is not reached), and the window's end stops it too."""
    rows = "arrival,prompt_tokens,output_tokens\n" + "".join(f"{i},5,1\n" for i in range(50))
    (tmp_path / "t.csv").write_text(rows + "99,broken,1\n")
    (tmp_path / "p.yaml").write_text("trace: {file: t.csv, max_requests: 20}\n")
    with pytest.raises(ChunktuneError, match="line 22: more than 20 requests"):
        load_profile(tmp_path / "p.yaml")
    (tmp_path / "p.yaml").write_text("trace: {file: t.csv, end: 10}\n")
    assert len(load_profile(tmp_path / "p.yaml").trace or ()) == 10
    monkeypatch.setattr(trace_mod, "MAX_TRACE_BYTES", 100)
    (tmp_path / "p.yaml").write_text("trace: {file: t.csv}\n")
    with pytest.raises(ChunktuneError, match=r"t\.csv is over the 100 bytes"):
        load_profile(tmp_path / "p.yaml")


# ---- fuzzing every reader ------------------------------------------------------------------


SEEDS = {
    "manifest": (ROOT / "examples" / "quickstart.yaml").read_bytes(),
    "profile": (ROOT / "loadtest" / "profiles" / "mixed.yaml").read_bytes(),
    "trace": (ROOT / "examples" / "traces" / "azure-conv-sample.csv").read_bytes()[:2000],
    "calibration": b'{"kind": "chunktune-calibration", "version": 1, "model": "tiny", '
                   b'"gpu": "cpu", "coefficients": {"linear_scale": 1.0}}',
    "steps": b'{"iteration": 0, "context_requests": 1, "context_tokens": 10, '
             b'"generation_requests": 0, "generation_tokens": 0, "elapsed_ms": 10.5}\n',
    "storage": b'{"op_code": 0, "worker_id": "w", "study_name": "s", "directions": [1]}\n',
}
#: Pieces a mutation splices in: the secret, numbers past every bound, markup.
PIECES = [SECRET, "1e308", "NaN", "-1", ".inf", "9" * 400, "[[[[", "{", "\r", "\x00", "\ufeff",
          "&a", "*a", ": ", ",", "\n", '"', "1.9", "0001-01-01 00:00:00"]


def _mutated(surface: str) -> st.SearchStrategy[bytes]:
    seed = SEEDS[surface]

    @st.composite
    def mutate(draw: Callable[..., object]) -> bytes:
        data = bytearray(seed)
        for _ in range(draw(st.integers(1, 6))):  # type: ignore[call-overload]
            at = draw(st.integers(0, len(data)))  # type: ignore[call-overload]
            cut = draw(st.integers(0, 20))  # type: ignore[call-overload]
            piece = draw(st.sampled_from(PIECES)).encode()  # type: ignore[attr-defined]
            data[at:at + cut] = piece
        return bytes(data)

    return st.one_of(mutate(), st.binary(max_size=300))


def _fuzz(surface: str, data: bytes, tmp: Path) -> None:
    path = tmp / f"f{SUFFIX[surface]}"
    path.write_bytes(data)
    message = refusal(surface, path)  # anything but a ChunktuneError fails the test
    if message is not None:
        assert "Traceback" not in message
        assert SECRET[:12] not in message or surface in ("manifest", "profile"), message


FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@pytest.mark.parametrize("surface", SURFACES)
def test_fuzzed_files_get_a_result_or_a_refusal(surface: str, tmp_path: Path) -> None:
    @FUZZ
    @given(data=_mutated(surface))
    def check(data: bytes) -> None:
        _fuzz(surface, data, tmp_path)

    check()


@FUZZ
@given(text=st.text(max_size=200))
def test_fuzzed_yaml_text_gets_a_document_or_a_refusal(text: str) -> None:
    try:
        yamlsafe.load(text, "f.yaml")
    except ChunktuneError as e:
        assert str(e).startswith("f.yaml: ")


@pytest.mark.parametrize(("journal", "says"), [
    ('{"op_code": 0, "worker_id": "w", "study_name": "s", "directions": [1]}\n',
     "holds no ChunkedPrefillTuning spec"),
    ('{"op_code": 0, "worker_id": "w", "study_name": "s", "directions": [1]}\n'
     '{"op_code": 99}\n', "not a study storage Optuna can read"),
], ids=["no-spec", "not-optuna-records"])
def test_results_of_a_journal_chunktune_did_not_write(
        journal: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from chunktune.tuning.cli import cmd_results

    path = tmp_path / "study.log"
    path.write_text(journal)
    ns = argparse.Namespace(source=str(path), storage=None, trials=False, out=None)
    assert cmd_results(ns) == 1
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err
