"""Summaries from raw records: who counts where, round trips, the JSON Schema, goodput."""

from __future__ import annotations

import json

import pytest

from chunktune.core.aggregate import RunInfo, build_summary, build_window, goodput
from chunktune.core.records import RequestRecord
from chunktune.core.summary import (
    SCHEMA_ID,
    SUMMARY_JSON_SCHEMA,
    ArrivalInfo,
    LoadSummary,
    Slo,
)

jsonschema = pytest.importorskip("jsonschema")


def rec(rid: int, start: float, *, cls: str = "chat", ok: bool = True, ttft: float = 0.1,
        e2e: float = 1.0, out: int = 10, prompt: int = 100, warmup: bool = False,
        reason: str | None = None) -> RequestRecord:
    r = RequestRecord(rid=rid, cls=cls, arrival=start, start=start, prompt_tokens=prompt,
                      max_tokens=out, warmup=warmup, ttft=ttft, e2e=e2e, output_tokens=out,
                      itl=[(e2e - ttft) / max(1, out - 1)] * (out - 1))
    if ok:
        r.ok = True
    else:
        r.fail(reason or "http_400", f"bad request {rid}", 400)
        r.itl = []
    return r


def info(**kw: object) -> RunInfo:
    base: dict[str, object] = dict(
        target="http://x", model="m", profile="p", arrival=ArrivalInfo("poisson", rate=2.0),
        seed=0, class_names=("long", "chat"), started_wall=1_800_000_000.0,
        ended_wall=1_800_000_012.5, configured=10.0, warmup=2.0, dispatch_end=10.0, drain=1.5)
    base.update(kw)
    return RunInfo(**base)  # type: ignore[arg-type]


def records() -> list[RequestRecord]:
    return [
        rec(0, 0.5, warmup=True, e2e=2.0),                 # warm-up, ends at 2.5: throughput
        rec(1, 1.0, warmup=True, e2e=0.5),                 # warm-up, ends at 1.5: nothing
        rec(2, 3.0, ttft=0.2, e2e=1.0),                    # measured, ends 4.0
        rec(3, 4.0, cls="long", ttft=1.0, e2e=3.0, prompt=5000, out=5),   # ends 7.0
        rec(4, 5.0, ok=False, e2e=0.01),                   # measured failure
        rec(5, 6.0, ok=False, reason="connection_error", e2e=0.02),
        rec(6, 9.5, ttft=0.3, e2e=2.0),                    # ends 11.5, during the drain
    ]


def test_population_rules() -> None:
    s = build_summary(records(), info())
    o = s.overall
    assert (o.requests.sent, o.requests.ok, o.requests.failed) == (5, 3, 2)
    assert o.failures["http_400"].count == 1 and o.failures["http_400"].example == "bad request 4"
    assert o.failures["connection_error"].count == 1
    assert o.ttft is not None and o.ttft.count == 3
    assert o.ttft.p50 == pytest.approx(0.3) and o.ttft.max == pytest.approx(1.0)
    assert o.e2e is not None and o.e2e.max == pytest.approx(3.0)
    assert o.itl is not None and o.itl.count == 9 + 4 + 9
    # throughput: ok requests ending in [2, 10): rids 0, 2, 3 over 8 s
    assert o.throughput.request_rate == pytest.approx(3 / 8)
    assert o.throughput.output_tokens_per_s == pytest.approx(25 / 8)
    assert o.throughput.total_tokens_per_s == pytest.approx((25 + 5200) / 8)
    assert o.throughput.sent_rate == pytest.approx(5 / 8)
    assert o.tokens.prompt == 5200 and o.tokens.output == 25
    assert list(s.classes) == ["long", "chat"]
    assert s.classes["long"].requests.sent == 1
    assert s.classes["chat"].tpot is not None
    assert s.duration.measured == 8.0 and s.duration.elapsed == 12.5
    assert s.started == "2027-01-15T08:00:00.000Z"
    assert s.raw is None and s.goodput is None and s.complete


def test_tpot_definition() -> None:
    r = rec(0, 0.0, ttft=0.5, e2e=2.5, out=5)
    assert r.tpot == pytest.approx(0.5)
    assert rec(1, 0.0, out=1).tpot is None


def test_round_trip_and_schema() -> None:
    recs = records()
    w = build_window(recs, 0, 2.0, 6.0, warmup=2.0, class_names=["long", "chat"],
                     sent={"long": 1, "chat": 2})
    s = build_summary(recs, info(), windows=[w], slos={"*": Slo(ttft=0.25)},
                      include_raw=True)
    d = json.loads(json.dumps(s.to_dict()))
    assert d["schema"] == SCHEMA_ID
    jsonschema.validate(d, SUMMARY_JSON_SCHEMA)
    back = LoadSummary.from_dict(d)
    assert back == s
    assert back.to_dict() == d
    # A summary without optional parts validates too; a wrong schema id is refused.
    bare = build_summary([], info(), include_raw=False).to_dict()
    jsonschema.validate(bare, SUMMARY_JSON_SCHEMA)
    assert bare["overall"]["ttft"] is None
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**bare, "schema": "chunktune.dev/load-summary/v0"},
                            SUMMARY_JSON_SCHEMA)
    with pytest.raises(ValueError):
        LoadSummary.from_dict({**bare, "schema": "other"})


def test_window() -> None:
    w = build_window(records(), 3, 2.0, 7.5, warmup=2.0, class_names=["long", "chat"],
                     sent={"long": 1, "chat": 3})
    # ended in [2, 7.5): rids 0 (2.5), 2 (4.0), 3 (7.0), 4 (5.01), 5 (6.02)
    assert w.overall.requests.ok == 3 and w.overall.requests.failed == 2
    assert w.overall.requests.sent == 4 and w.classes["chat"].requests.sent == 3
    assert w.overall.throughput.request_rate == pytest.approx(3 / 5.5)
    assert not w.warmup and w.index == 3
    assert build_window(records(), 0, 0.0, 2.0, warmup=2.0, class_names=["chat"]).warmup


def test_goodput() -> None:
    recs = records()
    g = goodput(recs, {"*": Slo(ttft=0.25), "long": Slo(e2e=5.0)}, start=2.0, end=10.0,
                class_names=["long", "chat"])
    # measured: 2 (ttft .2 good), 3 (long, e2e 3 good), 4, 5 failed, 6 (ttft .3 bad)
    assert g.fraction == pytest.approx(2 / 5)
    assert g.classes["long"].fraction == 1.0
    assert g.classes["chat"].fraction == pytest.approx(1 / 4)
    # ended in [2, 10) and good: 0 (ttft .1), 2, 3
    assert g.request_rate == pytest.approx(3 / 8)
    assert Slo().met_by(recs[2]) and not Slo().met_by(recs[4])
