"""Timing checks that hold on a busy machine: measure the machine's scheduling noise over the
same window as the timed work, and let a timing bound grow by what the machine itself showed.

:class:`SchedulingNoise` runs a probe process that sleeps ``interval`` seconds in a loop and
records how late each wake-up is — what any process on this machine (a load driver, a
server, a client) suffers over the same seconds from the CPUs being busy. On an idle machine
its quantiles are tens of microseconds, so a bound ``budget + noise.q(0.95)`` is the budget
itself; on a loaded one it grows by exactly the delay the machine imposed, no more.

Usage::

    with SchedulingNoise() as noise:
        lags = run_the_timed_work()
    assert q(lags, 0.95) < 0.005 + noise.q(0.95), (q(lags, 0.95), noise)

When even that is not enough (a burst of load that hits the work but not the probe), a test may
mark its timing bounds with :func:`timing` and run under :func:`retry_timing`: a bounded retry
of the timing only, never of a wrong result.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

T = TypeVar("T")

#: The probe: sleep ``interval`` repeatedly until stdin closes, then print the lateness
#: samples (seconds) as JSON. A separate process, like the programs under test.
_PROBE = r"""
import json, sys, threading, time
interval = float(sys.argv[1])
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
late = []
while not stop.is_set() and len(late) < 2_000_000:
    t = time.perf_counter()
    time.sleep(interval)
    late.append(max(0.0, time.perf_counter() - t - interval))
print(json.dumps(late))
"""


class SchedulingNoise:
    """Wake-up lateness of a probe process over a ``with`` block (see module doc)."""

    def __init__(self, interval: float = 0.001, timeout: float = 30.0) -> None:
        self.interval = interval
        self.timeout = timeout
        self.samples: list[float] = []
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> SchedulingNoise:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _PROBE, str(self.interval)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        proc, self._proc = self._proc, None
        assert proc is not None
        try:
            out, _ = proc.communicate("", timeout=self.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        self.samples = sorted(json.loads(out)) if out.strip() else []

    def q(self, p: float) -> float:
        """The ``p`` quantile of the probe's wake-up lateness (s); 0 without samples."""
        s = self.samples
        return s[min(len(s) - 1, int(len(s) * p))] if s else 0.0

    def __repr__(self) -> str:
        return (f"SchedulingNoise({len(self.samples)} wake-ups: p50 {self.q(0.5) * 1e3:.2f} ms, "
                f"p95 {self.q(0.95) * 1e3:.2f} ms, p99 {self.q(0.99) * 1e3:.2f} ms)")


class TimingMiss(AssertionError):
    """A timing bound missed (as opposed to a wrong result): :func:`retry_timing` may retry."""


def timing(ok: bool, *detail: object) -> None:
    """``assert ok`` for a timing bound: raises :class:`TimingMiss` with ``detail``."""
    if not ok:
        raise TimingMiss(*detail)


def retry_timing(run: Callable[[], T], attempts: int = 3) -> T:
    """Run ``run()`` up to ``attempts`` times while only its timing bounds miss (a burst of
    load elsewhere on the machine); a wrong result fails at once, and the last miss is raised.
    """
    for _ in range(attempts - 1):
        try:
            return run()
        except TimingMiss:
            pass
    return run()
