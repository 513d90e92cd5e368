"""Numeric flags: finite and within what makes sense, refused at once with one line naming the
flag (:mod:`chunktune.core.bounds`), never a run toward a billion requests or a traceback."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chunktune.cli import main
from chunktune.core.bounds import MAX_RATE, bounded
from chunktune.core.errors import SpecError

PROM = ["workload", "from-prometheus", "--url", "http://127.0.0.1:9", "--selector", '{a="b"}']
LOAD = ["load", "run", "--target", "http://127.0.0.1:9", "--model", "m", "--profile", "smoke"]


@pytest.mark.parametrize(("argv", "flag"), [
    (["sim", "run", "--workload", "smoke", "--rate", "nan"], "--rate"),
    (["sim", "run", "--workload", "smoke", "--rate", "inf"], "--rate"),
    (["sim", "run", "--workload", "smoke", "--rate", "-3"], "--rate"),
    (["sim", "run", "--workload", "smoke", "--duration", "inf"], "--duration"),
    (["sim", "run", "--workload", "smoke", "--duration", "nan"], "--duration"),
    (["sim", "run", "--workload", "smoke", "--drain-timeout", "1e300"], "--drain-timeout"),
    (["sim", "run", "--workload", "smoke", "--rate", "90000", "--duration", "1h"], "--rate"),
    (["sim", "run", "--workload", "smoke", "--concurrency", "0"], "--concurrency"),
    ([*PROM, "--at", "nan"], "--at"),
    ([*PROM, "--at", "inf"], "--at"),
    ([*PROM, "--window", "inf"], "--window"),
    ([*PROM, "--timeout", "nan"], "--timeout"),
    ([*PROM, "--timeout", "0"], "--timeout"),
    ([*PROM, "--long-prompt-tokens", "-5"], "--long-prompt-tokens"),
    ([*LOAD, "--rate", "nan"], "--rate"),
    ([*LOAD, "--duration", "inf"], "--duration"),
    ([*LOAD, "--concurrency", "-1"], "--concurrency"),
    ([*LOAD, "--rate", "1000", "--duration", "300h"], "--rate"),
    ([*LOAD, "--workers", "2", "--master-port", "70000"], "--master-port"),
    (["calibrate", "--log", "x.log", "--gpu", "cpu", "--out", "p.json", "--step-gap", "nan"],
     "--step-gap"),
    (["calibrate", "--log", "x.log", "--gpu", "cpu", "--out", "p.json",
      "--server-overhead", "inf"], "--server-overhead"),
])
def test_a_nonsense_number_is_refused_at_once_naming_the_flag(argv, flag, capsys):
    t0 = time.monotonic()
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and flag in lines[0], err
    assert "Traceback" not in err
    assert time.monotonic() - t0 < 30  # refused before any work (generous on a busy machine)


def test_tune_max_trials_must_be_positive(capsys):
    assert main(["tune", "examples/quickstart.yaml", "--max-trials", "0"]) == 1
    assert "--max-trials" in capsys.readouterr().err


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_bounded_accepts_exactly_the_finite_numbers_in_range(x):
    ok = math.isfinite(x) and 0 < x <= MAX_RATE
    try:
        got = bounded(x, "--rate", low=0, low_open=True, high=MAX_RATE)
    except SpecError as e:
        assert not ok
        assert e.problems[0][0] == "--rate" and "must be a number > 0" in e.problems[0][1]
    else:
        assert ok and got == x


@given(st.one_of(st.text(max_size=20), st.integers(), st.none(), st.booleans()))
def test_bounded_never_raises_anything_but_a_spec_error(v):
    try:
        bounded(v, "N", low=1, high=10, integral=True)
    except SpecError as e:
        assert e.problems[0][0] == "N"
