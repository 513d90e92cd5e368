"""From raw request records to summaries, windows and goodput (pure functions).

The population rules are documented once, in :mod:`chunktune.core.summary`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from chunktune import __version__
from chunktune.core.records import RequestRecord
from chunktune.core.stats import summarize
from chunktune.core.summary import (
    ArrivalInfo,
    ClassSummary,
    Durations,
    FailureStat,
    Goodput,
    GoodputClass,
    LoadSummary,
    RequestCounts,
    ScheduleLag,
    Slo,
    Throughput,
    TokenCounts,
    Window,
)

__all__ = ["RunInfo", "build_summary", "build_window", "class_summary", "goodput", "iso_utc"]

_EXAMPLE_CHARS = 300


def iso_utc(wall: float) -> str:
    """``2026-12-02T10:00:00.123Z`` for a ``time.time()`` value."""
    t = dt.datetime.fromtimestamp(wall, dt.UTC)
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def class_summary(measured: Sequence[RequestRecord], completed: Iterable[RequestRecord],
                  span: float, sent: int | None = None) -> ClassSummary:
    """Summarize one population.

    ``measured``: the requests whose counts, failures and latencies are reported;
    ``completed``: the requests that ended inside the interval (their ok ones make the
    throughput); ``span``: the interval's length; ``sent``: the requests sent in it (default
    ``len(measured)``).
    """
    ok = [r for r in measured if r.ok]
    failures: dict[str, list[str]] = {}
    for r in measured:
        if not r.ok:
            failures.setdefault(r.reason or "client_error", []).append(r.error or "")
    done = [r for r in completed if r.ok]
    n_sent = len(measured) if sent is None else sent
    per_s = 1.0 / span if span > 0 else 0.0
    out_done = sum(r.output_tokens for r in done)
    return ClassSummary(
        requests=RequestCounts(sent=n_sent, ok=len(ok), failed=len(measured) - len(ok)),
        failures={k: FailureStat(len(v), v[0][:_EXAMPLE_CHARS])
                  for k, v in sorted(failures.items())},
        ttft=summarize(r.ttft for r in ok if r.ttft is not None),
        itl=summarize(x for r in ok for x in r.itl),
        e2e=summarize(r.e2e for r in ok if r.e2e is not None),
        tpot=summarize(t for r in ok if (t := r.tpot) is not None),
        tokens=TokenCounts(prompt=sum(r.prompt_tokens for r in ok),
                           output=sum(r.output_tokens for r in ok)),
        throughput=Throughput(
            request_rate=len(done) * per_s,
            sent_rate=n_sent * per_s,
            output_tokens_per_s=out_done * per_s,
            total_tokens_per_s=(out_done + sum(r.prompt_tokens for r in done)) * per_s,
        ),
    )


def _by_class(records: Iterable[RequestRecord], names: Sequence[str]
              ) -> dict[str, list[RequestRecord]]:
    out: dict[str, list[RequestRecord]] = {n: [] for n in names}
    for r in records:
        out.setdefault(r.cls, []).append(r)
    return out


def build_window(records: Iterable[RequestRecord], index: int, start: float, end: float, *,
                 warmup: float, class_names: Sequence[str],
                 sent: Mapping[str, int] | None = None) -> Window:
    """A window over the requests that ended in ``[start, end)``; ``sent`` gives the requests
    sent in it per class (unknown to a reader of finished records alone; default: ended)."""
    ended = [r for r in records if start <= r.end < end]
    span = end - start
    groups = _by_class(ended, class_names)
    classes = {n: class_summary(rs, rs, span, None if sent is None else sent.get(n, 0))
               for n, rs in groups.items()}
    overall = class_summary(ended, ended, span,
                            None if sent is None else sum(sent.values()))
    return Window(index=index, start=start, end=end, warmup=start < warmup, overall=overall,
                  classes=classes)


@dataclass(frozen=True)
class RunInfo:
    """What a summary says about the run besides its records."""

    target: str
    model: str
    profile: str
    arrival: ArrivalInfo
    seed: int
    class_names: tuple[str, ...]
    started_wall: float
    ended_wall: float
    configured: float
    """The arrival window D."""
    warmup: float
    dispatch_end: float
    """When sending stopped: D, or earlier when the run was stopped."""
    drain: float
    complete: bool = True
    """False when the run was stopped before the end of the arrival window."""


def goodput(records: Iterable[RequestRecord], slos: Mapping[str, Slo], *, start: float,
            end: float, class_names: Sequence[str] = ()) -> Goodput:
    """Goodput under per-class SLOs (key ``"*"``: the default for unnamed classes).

    ``request_rate``: SLO-meeting requests that ended in ``[start, end)`` per second;
    ``fraction``: the share of non-warm-up requests (failed ones included) meeting their SLO.
    A class with no SLO (and no ``"*"``) counts every ok request as good.
    """
    records = list(records)
    span = end - start

    def slo_for(name: str) -> Slo:
        return slos.get(name) or slos.get("*") or Slo()

    def stat(rs: list[RequestRecord]) -> GoodputClass:
        measured = [r for r in rs if not r.warmup]
        good = sum(1 for r in measured if slo_for(r.cls).met_by(r))
        rate_n = sum(1 for r in rs if start <= r.end < end and slo_for(r.cls).met_by(r))
        return GoodputClass(request_rate=rate_n / span if span > 0 else 0.0,
                            fraction=good / len(measured) if measured else 0.0)

    groups = _by_class(records, class_names)
    overall = stat(records)
    return Goodput(slos=dict(slos), request_rate=overall.request_rate,
                   fraction=overall.fraction,
                   classes={n: stat(rs) for n, rs in groups.items()})


def build_summary(records: Sequence[RequestRecord], info: RunInfo, *,
                  windows: Sequence[Window] = (), slos: Mapping[str, Slo] | None = None,
                  include_raw: bool = False) -> LoadSummary:
    """The run's summary; see :mod:`chunktune.core.summary` for what counts where."""
    w, d = info.warmup, info.dispatch_end
    span = max(0.0, d - w)
    measured = [r for r in records if not r.warmup]
    completed = [r for r in records if w <= r.end < d]
    mgroups = _by_class(measured, info.class_names)
    cgroups = _by_class(completed, info.class_names)
    classes = {n: class_summary(mgroups[n], cgroups.get(n, []), span) for n in mgroups}
    return LoadSummary(
        target=info.target, model=info.model, profile=info.profile, arrival=info.arrival,
        seed=info.seed, started=iso_utc(info.started_wall), ended=iso_utc(info.ended_wall),
        duration=Durations(configured=info.configured, warmup=w, measured=span,
                           elapsed=max(0.0, info.ended_wall - info.started_wall),
                           drain=info.drain),
        complete=info.complete,
        overall=class_summary(measured, completed, span),
        classes=classes,
        windows=list(windows),
        goodput=None if not slos else goodput(records, slos, start=w, end=d,
                                               class_names=info.class_names),
        schedule=ScheduleLag(send_lag=summarize(r.start - r.arrival for r in records
                                                if r.arrival is not None)),
        raw=sorted(records, key=lambda r: r.rid) if include_raw else None,
        tool={"name": "chunktune", "version": __version__},
    )
