"""Nothing outlives ``chunktune load run``: its Locust child (in its own session, so a
terminal's signals miss it) and a distributed run's workers die with the command when it is
killed with SIGTERM, even when they are too busy to notice (the kernel's parent-death signal,
``prctl(PR_SET_PDEATHSIG)``); a child building a huge prompt used to outlive it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.load.fake_openai import FakeServer

ROOT = Path(__file__).resolve().parents[2]


def _children() -> dict[int, int]:
    """pid -> parent pid of every live (not zombie) process."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z":
            out[int(d.name)] = int(fields[1])
    return out


def _descendants(root: int) -> set[int]:
    parents = _children()
    found, frontier = set(), {root}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found


def _wait(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout:g} s: {what}")


@pytest.mark.parametrize("workers", [0, 2])
def test_sigterm_to_load_run_leaves_no_child(workers, tmp_path):
    with FakeServer() as srv:
        env = {**os.environ, "PYTHONPATH": f"{ROOT / 'operator'}:{ROOT}"}
        cli = subprocess.Popen(
            [sys.executable, "-m", "chunktune", "load", "run", "--target", srv.url,
             "--model", "m", "--profile", "smoke", "--duration", "10m", "--quiet",
             "--workers", str(workers), "--out", str(tmp_path / "s.json")],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        kids: set[int] = set()
        try:
            # the Locust child (and the master's workers) up and sending
            kids = _wait(lambda: (d := _descendants(cli.pid)) and len(d) >= 1 + workers
                         and srv.proc is not None and d, 90, "the load child starting")
            time.sleep(1.0)  # let the workers connect and start sending
            kids = _descendants(cli.pid) | kids
            # a child that handles nothing (one busy building a huge prompt runs no signal
            # handler and writes no event that would find the pipe broken): stopped here
            for pid in kids:
                os.kill(pid, signal.SIGSTOP)
            cli.send_signal(signal.SIGTERM)
            cli.wait(timeout=60)
            alive = _wait(lambda: not (set(_children()) & kids) or None, 30,
                          f"the children {sorted(kids)} ending")
            assert alive
        finally:
            if cli.poll() is None:
                cli.kill()
                cli.wait()
            for pid in (kids | _descendants(cli.pid)) & set(_children()):
                os.kill(pid, signal.SIGKILL)  # only what this test started
    assert cli.returncode != 0
