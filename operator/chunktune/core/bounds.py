"""Numbers a user gives (command-line flags, manifest fields): finite and within what makes
sense, checked in one place.

``float("nan")``, ``float("inf")`` and ``1e308`` all parse, and each then runs somewhere it
should not (a workload toward a billion requests, ``math.ceil(nan)`` deep in a client): every
numeric flag and field goes through :func:`bounded`, which refuses them with a
:class:`~chunktune.core.errors.SpecError` naming the flag.

The limits below are what makes sense for chunked-prefill tuning, not what a computer can
hold: a year is longer than any load test or trace window, 100,000 requests per second is
beyond any one vLLM deployment.
"""

from __future__ import annotations

import math
from typing import Any

from chunktune.core.errors import SpecError

#: The longest duration (a load test, an arrival window, a look-back window, an offset into
#: a trace), in seconds: a year.
MAX_DURATION_S = 366 * 24 * 3600.0
#: The highest arrival rate, requests per second.
MAX_RATE = 100_000.0
#: The most requests kept in flight by a closed loop.
MAX_CONCURRENCY = 100_000
#: The most requests one simulated or generated workload may hold (rate times duration).
MAX_REQUESTS = 2_000_000
#: The longest timeout of one network call, in seconds.
MAX_TIMEOUT_S = 3600.0
#: The most tokens one prompt may have (above every supported model's context).
MAX_TOKENS = 10_000_000


def _show(v: float) -> str:
    return f"{int(v):,}" if v == int(v) and abs(v) < 1e15 else f"{v:g}"


def bounded(value: Any, field: str, *, low: float | None = None, high: float | None = None,
            low_open: bool = False, integral: bool = False, unit: str = "") -> float:
    """``value`` as a finite number in ``[low, high]`` (``(low, high]`` with ``low_open``),
    an integer with ``integral``; else a :class:`SpecError` naming ``field`` with the range."""
    what = "an integer" if integral else "a number"
    rng = []
    if low is not None:
        rng.append(f"{'>' if low_open else '>='} {_show(low)}{unit}")
    if high is not None:
        rng.append(f"<= {_show(high)}{unit}")
    want = f"must be {what}" + (f" {' and '.join(rng)}" if rng else "")
    if isinstance(value, bool):
        raise SpecError(f"{want} (got {value!r})", field=field)
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError) as e:
        raise SpecError(f"{want} (got {value!r})", field=field) from e
    if not math.isfinite(x):
        raise SpecError(f"{want} (got {value!r})", field=field)
    if integral and x != int(x):
        raise SpecError(f"{want} (got {value!r})", field=field)
    if low is not None and (x <= low if low_open else x < low):
        raise SpecError(f"{want} (got {value!r})", field=field)
    if high is not None and x > high:
        raise SpecError(f"{want} (got {value!r})", field=field)
    return x


def rate_bound(rate: float | None, duration: float, field: str) -> None:
    """Refuse an open-loop ``rate`` (req/s) that over ``duration`` seconds would send more than
    :data:`MAX_REQUESTS` requests (a SpecError naming ``field``)."""
    if rate is not None and not rate * duration <= MAX_REQUESTS:
        raise SpecError(f"{rate:g} requests/s for {duration:g}s is {rate * duration:.3g} "
                        f"requests, over the {MAX_REQUESTS:,} one run may send; lower the "
                        "rate or the duration", field=field)


__all__ = ["MAX_CONCURRENCY", "MAX_DURATION_S", "MAX_RATE", "MAX_REQUESTS", "MAX_TIMEOUT_S",
           "MAX_TOKENS", "bounded", "rate_bound"]
