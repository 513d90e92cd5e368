"""Hostile Prometheus answers and scrapes (issue 34): bucket bounds that are no numbers, NaN and
negative counts, JSON nested past any parser, are refused with a ``WorkloadUnavailable`` or left
out, never a traceback and never a derived profile that nothing can load (``classes: []``).
The answers come from a real HTTP server on loopback that answers what a broken or hostile
Prometheus would."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chunktune.core.selectors import LabelSelector
from chunktune.core.workload import parse_profile
from chunktune.metrics import promql
from chunktune.metrics.cli import from_prometheus
from chunktune.metrics.derive import Buckets, Observation, WorkloadUnavailable, derive
from chunktune.metrics.promtext import Scrape, le_bound

SELECTOR = '{model_name="m"}'
WINDOW, PEAK = 600.0, 75.0


def _vector(samples: list[tuple[dict[str, str], str]]) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": m, "value": [1.8e9, v]} for m, v in samples]}}


@contextmanager
def prometheus_answering(answer: Callable[[str], bytes]) -> Iterator[str]:
    """An HTTP server on loopback answering every ``/api/v1/query`` with ``answer(query)``."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._answer(parse_qs(urlparse(self.path).query).get("query", [""])[0])

        def do_POST(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            self._answer(parse_qs(self.rfile.read(n).decode()).get("query", [""])[0])

        def _answer(self, query: str) -> None:
            body = answer(query)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _answers(buckets: list[tuple[dict[str, str], str]]) -> Callable[[str], bytes]:
    """A Prometheus whose selector matches, with 100 requests and these bucket samples for
    both length histograms."""
    q = promql.workload_queries(LabelSelector.parse(SELECTOR), WINDOW, PEAK)

    def answer(query: str) -> bytes:
        if query in (q["prompt_buckets"], q["output_buckets"]):
            return json.dumps(_vector(buckets)).encode()
        if query in (q["series"], q["requests"]):
            return json.dumps(_vector([({}, "100")])).encode()
        return json.dumps(_vector([])).encode()
    return answer


@pytest.mark.parametrize("buckets", [
    [({"le": "abc"}, "50"), ({"le": "+Inf"}, "100")],
    [({"le": "100"}, "NaN"), ({"le": "1000"}, "-5"), ({"le": "+Inf"}, "NaN")],
    [({"le": "-10"}, "50"), ({"le": "NaN"}, "60"), ({"le": "+Inf"}, "100")],
], ids=["le-abc", "nan-and-negative-counts", "negative-and-nan-bounds"])
def test_unusable_buckets_are_refused_not_derived(buckets: list[tuple[dict[str, str], str]]
                                                  ) -> None:
    with prometheus_answering(_answers(buckets)) as url, \
            pytest.raises(WorkloadUnavailable) as e:
        from_prometheus(url, SELECTOR, WINDOW, peak_window=PEAK, at=1.8e9, timeout=10)
    assert e.value.reason == "NoRequests" and SELECTOR in str(e.value)


def test_a_deeply_nested_answer_is_an_error_naming_the_selector() -> None:
    deep = b'{"status": "success", "data": {"resultType": "vector", "result": ' + \
        b"[" * 100_000 + b"]" * 100_000 + b"}}"
    with prometheus_answering(lambda q: deep) as url, pytest.raises(WorkloadUnavailable) as e:
        from_prometheus(url, SELECTOR, WINDOW, peak_window=PEAK, at=1.8e9, timeout=10)
    assert e.value.reason == "PrometheusUnreachable" and "nested too deeply" in str(e.value)


def test_a_huge_number_in_an_answer_is_no_number() -> None:
    answer = _answers([({"le": "10"}, "40"), ({"le": "+Inf"}, "100")])
    with prometheus_answering(lambda q: answer(q).replace(b'"100"', b"1" + b"0" * 400)) as url, \
            pytest.raises(WorkloadUnavailable):  # 100 requests read as none
        from_prometheus(url, SELECTOR, WINDOW, peak_window=PEAK, at=1.8e9, timeout=10)


def test_a_scrape_with_bounds_that_are_no_numbers_leaves_them_out() -> None:
    text = ('# TYPE vllm:request_prompt_tokens histogram\n'
            'vllm:request_prompt_tokens_bucket{le="abc"} 3\n'
            'vllm:request_prompt_tokens_bucket{le="10.0"} 2\n'
            'vllm:request_prompt_tokens_bucket{le="-1"} 1\n'
            'vllm:request_prompt_tokens_bucket{le="+Inf"} NaN\n'
            'vllm:request_prompt_tokens_bucket{le="+Inf"} 4\n'
            'vllm:request_prompt_tokens_count 4\nvllm:request_prompt_tokens_sum 20\n')
    assert Scrape.parse(text).buckets("vllm:request_prompt_tokens") == [(10.0, 2.0),
                                                                        (math.inf, 4.0)]


def test_buckets_keep_only_bounds_and_counts() -> None:
    b = Buckets.from_le({"abc": 3.0, "-5": 2.0, "NaN": 1.0, "10": 2.0, "20": math.nan,
                         "+Inf": 4.0})
    assert b.bounds == (10.0, math.inf) and b.cumulative == (2.0, 4.0)


def test_every_observation_above_the_last_bound_derives_nothing() -> None:
    only_inf = Buckets.from_le({"+Inf": 100.0})  # no finite bound at all
    obs = Observation(url="http://p", selector=SELECTOR, window=WINDOW, at=1.8e9,
                      peak_window=PEAK, requests=100.0, peak_rate=None, prompt=only_inf,
                      output=only_inf)
    with pytest.raises(WorkloadUnavailable, match="no observation in a finite bucket"):
        derive(obs)


labels = st.one_of(st.text(max_size=12), st.sampled_from(["+Inf", "inf", "NaN", "-1", "1e400",
                                                          "0", "10", "2.5", "1" * 80]))
counts = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, 10**6))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(by_le=st.dictionaries(labels, counts, max_size=8))
def test_fuzzed_buckets_give_a_profile_every_reader_takes_or_none(by_le: dict[str, float]
                                                                  ) -> None:
    for le in by_le:
        b = le_bound(le)
        assert b is None or (b >= 0 and not math.isnan(b))
    buckets = Buckets.from_le({k: float(v) for k, v in by_le.items()})
    obs = Observation(url="http://p", selector=SELECTOR, window=WINDOW, at=1.8e9,
                      peak_window=PEAK, requests=buckets.total, peak_rate=None, prompt=buckets,
                      output=buckets)
    try:
        derived = derive(obs)
    except WorkloadUnavailable:
        return
    assert derived.profile.classes
    parse_profile(derived.profile.to_dict(), "derived")  # what a later reader checks
