"""``chunktune workload from-prometheus`` against a real Prometheus scraping ``chunktune sim
serve`` driven by the load driver with a known profile: the derived rate is within 5% of the
profile's, the length percentiles fall in the histogram bucket of the true ones, and the long
share matches what was sent. A selector that matches nothing is an error naming it (and the
values its label has); no Prometheus at all is in test_derive.py."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from bench.serve_overhead import start_server

from chunktune.core.distributions import Histogram
from chunktune.core.workload import Profile, load_profile
from chunktune.metrics.cli import from_prometheus
from chunktune.metrics.derive import WorkloadUnavailable
from tests.metrics.prometheus import HAVE_PROMETHEUS, MISSING, prometheus

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not HAVE_PROMETHEUS, reason=MISSING)]

RATE = 10.0
DURATION = 30.0
#: The window derived over: inside the load, so that it sees steady traffic (a window that
#: starts with the traffic counts the requests still in flight at its end, and not those in
#: flight at its start, which the traffic's start did not have).
WINDOW = (4.0, 26.0)
#: Two classes far apart: the long share is what was sent, whatever the bucket bound.
PROFILE = {
    "name": "known", "arrival": {"mode": "constant", "rate": RATE}, "duration": DURATION,
    "warmup": 0, "seed": 3,
    "classes": [
        {"name": "chat", "weight": 0.75, "api": "completions",
         "prompt_tokens": {"dist": "uniform", "min": 100, "max": 900},
         "output_tokens": {"dist": "uniform", "min": 10, "max": 60}},
        {"name": "docs", "weight": 0.25, "api": "completions",
         "prompt_tokens": {"dist": "uniform", "min": 2500, "max": 7000},
         "output_tokens": {"dist": "uniform", "min": 20, "max": 80}},
    ]}
SELECTOR = '{model_name="prod-llama"}'


def true_quantile(values: list[int], q: float) -> float:
    s = sorted(values)
    return float(s[max(0, math.ceil(q * len(s)) - 1)])


def test_derived_workload_matches_the_load_that_was_sent(tmp_path: Path) -> None:
    profile = tmp_path / "known.yaml"
    profile.write_text(yaml.safe_dump(PROFILE))
    with start_server("llama-3.1-8b", ["--max-model-len", "16384",
                                       "--served-model-name", "prod-llama"]) as srv, \
            prometheus(tmp_path / "prom", [srv.url.removeprefix("http://")]) as prom:
        out = tmp_path / "summary.json"
        run = subprocess.run(
            [sys.executable, "-m", "chunktune", "load", "run", "--target", srv.url,
             "--profile", str(profile), "--out", str(out), "--raw", "--quiet",
             "--token-ids"], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        summary = json.loads(out.read_text())
        start = datetime.fromisoformat(summary["started"].replace("Z", "+00:00")).timestamp()
        end = start + WINDOW[1]
        window = WINDOW[1] - WINDOW[0]
        derived_file = tmp_path / "derived.yaml"
        cli = subprocess.run(
            [sys.executable, "-m", "chunktune", "workload", "from-prometheus", "--url", prom,
             "--selector", SELECTOR, "--window", f"{window:g}s", "--at", f"{end:.3f}",
             "--out", str(derived_file)], capture_output=True, text=True, timeout=120)
        assert cli.returncode == 0, cli.stderr
        derived = from_prometheus(prom, SELECTOR, window, at=end)
        # a selector that matches nothing: the error names it and the values that exist
        with pytest.raises(WorkloadUnavailable, match=r'model_name="other".*prod-llama') as e:
            from_prometheus(prom, '{model_name="other"}', window, at=end)
        assert e.value.reason == "NoMatchingSeries"
    # what was sent in the window (the server's own token counts)
    ok = [r for r in summary["raw"] if r["ok"]]
    assert len(ok) >= 0.95 * RATE * DURATION, summary["overall"]["requests"]
    sent = [r for r in ok if WINDOW[0] <= r["start"] < WINDOW[1]]
    stats = derived.stats
    assert stats.rate == pytest.approx(RATE, rel=0.05), stats
    assert stats.peak_rate is not None and stats.peak_rate >= 0.9 * stats.rate, stats
    # the percentiles are right to the histogram's resolution: off by at most the width of the
    # bucket that holds the true one (one request more or less on either side of a bound moves
    # a percentile near it into the next bucket)
    for key, figures, values in (
            ("prompt", stats.prompt, [r["prompt_tokens"] for r in sent]),
            ("output", stats.output, [r["output_tokens"] for r in sent])):
        for q in (0.5, 0.9, 0.99):
            truth = true_quantile(values, q)
            got = figures[f"p{round(q * 100)}"]
            lo, hi = _bucket(truth)
            assert abs(got - truth) <= hi - lo, (key, q, truth, got)
    # and the profile's prompt lengths have what was sent below every bucket bound
    written = load_profile(derived_file)
    prompts = [r["prompt_tokens"] for r in sent]
    for bound in BOUNDS[:14]:
        truth = sum(p <= bound for p in prompts) / len(prompts)
        assert _share_at_most(written, bound) == pytest.approx(truth, abs=0.03), bound
    long_truth = sum(r["prompt_tokens"] > 2000 for r in sent) / len(sent)
    assert stats.long_threshold == 2000  # 2048 moved to vLLM's bucket bound
    assert stats.long_share == pytest.approx(long_truth, abs=0.03)
    # the profile: Poisson at the derived rate, the short and long classes with their shares
    assert written.arrival.mode == "poisson"
    assert written.arrival.rate == pytest.approx(stats.rate, rel=1e-3)
    short, long_ = written.classes
    assert (short.name, long_.name) == ("short", "long")
    assert long_.weight == pytest.approx(stats.long_share, abs=1e-3)
    assert isinstance(short.prompt_tokens, Histogram)
    assert short.prompt_tokens.edges[-1] <= 2000 < long_.prompt_tokens.edges[-1]
    # and what it prints names the selector and the window
    assert SELECTOR in cli.stdout and "22s ending" in cli.stdout, cli.stdout


#: vLLM's token-count bucket bounds (1-2-5), up to 500k.
BOUNDS = [m * 10**e for e in range(6) for m in (1, 2, 5)]


def _bucket(v: float) -> tuple[float, float]:
    """The bucket ``(lower, upper]`` of vLLM's token histograms holding ``v``."""
    i = next(i for i, b in enumerate(BOUNDS) if v <= b)
    return (BOUNDS[i - 1] if i else 0.0), BOUNDS[i]


def _share_at_most(profile: Profile, bound: float) -> float:
    """The share of a derived profile's prompts of at most ``bound`` tokens (a bucket bound)."""
    total = sum(c.weight for c in profile.classes)
    share = 0.0
    for c in profile.classes:
        h = c.prompt_tokens
        assert isinstance(h, Histogram)
        inside = sum(w for w, upper in zip(h.weights, h.edges[1:], strict=True) if upper <= bound)
        share += c.weight / total * inside / sum(h.weights)
    return share


def test_a_real_vllms_prefix_cache_hit_rate_is_read(tmp_path: Path) -> None:
    """``chunktune load run`` of a class with shared openings against real vLLM (CPU build,
    prefix caching on as by default), scraped by a real Prometheus: each request after the
    first of its opening finds the opening's four blocks cached, vLLM's counters say exactly
    that, and the derived stats give the share and what it means for trials."""
    pytest.importorskip("vllm", reason="needs vLLM's CPU build: pip install -e '.[cpu]'")
    import requests

    from chunktune.modelgen.tiny import write_tiny_model
    from tests import openings
    from tests.conformance.conftest import RealServer

    server = RealServer(write_tiny_model(tmp_path / "tiny"), [
        "--served-model-name", "prod-tiny", "--max-model-len", "2048", "--block-size",
        str(openings.BLOCK), "--kv-cache-memory-bytes", str(64 * 2**20)], tmp_path / "vllm.log")
    try:
        with prometheus(tmp_path / "prom", [server.url.removeprefix("http://")]) as prom:
            run = openings.send(server.url, "prod-tiny", tmp_path)
            assert run.returncode == 0, run.stderr
            text = requests.get(server.url + "/metrics", timeout=30).text
            n = int(openings.counter(text, "request_success_total"))
            assert n >= 3, (run.stderr[-3000:], (tmp_path / "vllm.log").read_text()[-3000:])
            queries, hits = openings.expected(n)
            assert (openings.counter(text, "prefix_cache_queries_total"),
                    openings.counter(text, "prefix_cache_hits_total")) == (queries, hits)
            deadline = time.monotonic() + 60
            while True:  # until Prometheus has scraped the last request's counts
                r = requests.get(prom + "/api/v1/query", timeout=10, params={
                    "query": '{__name__=~"vllm(:|_)prefix_cache_queries_total"}'}).json()
                scraped = [float(x["value"][1]) for x in r["data"]["result"]]
                if scraped == [queries]:
                    break
                assert time.monotonic() < deadline, scraped
                time.sleep(0.5)
            derived = from_prometheus(prom, '{model_name="prod-tiny"}', 600.0, at=time.time())
    finally:
        server.stop()
    rate = hits / queries
    assert derived.stats.prefix_hit_rate == pytest.approx(rate, rel=0.02)
    assert f"{100 * rate:.1f}% of prompt tokens found cached" in derived.describe()
    assert f"trials prefill {1 / (1 - rate):.1f}x the prompt tokens" in derived.describe()


def test_the_draft_acceptance_is_derived_from_a_served_engines_counters(tmp_path: Path) -> None:
    """``sim serve`` with ngram speculation (K=4) at a known draft acceptance exports vLLM's
    spec-decode counters; Prometheus scrapes them and the derivation recovers the acceptance
    (to the rounding of the last verification of each request)."""
    import requests

    flags = ["--max-model-len", "8192", "--served-model-name", "spec-llama",
             "--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 4}),
             "--spec-acceptance", "0.7"]
    with start_server("llama-3.1-8b", flags) as srv, \
            prometheus(tmp_path / "prom", [srv.url.removeprefix("http://")]) as prom:
        for i in range(8):
            r = requests.post(srv.url + "/v1/completions", timeout=60, json={
                "model": "spec-llama", "prompt": list(range(100 + i)), "max_tokens": 300})
            assert r.status_code == 200
        text = requests.get(srv.url + "/metrics", timeout=10).text
        drafts = next(float(line.split()[-1]) for line in text.splitlines()
                      if line.startswith("vllm:spec_decode_num_drafts_total{"))
        deadline = time.monotonic() + 60
        while True:  # until Prometheus has scraped the last request's counts
            r = requests.get(prom + "/api/v1/query", timeout=10, params={
                "query": '{__name__=~"vllm(:|_)spec_decode_num_drafts_total"}'}).json()
            if [float(x["value"][1]) for x in r["data"]["result"]] == [drafts]:
                break
            assert time.monotonic() < deadline, r
            time.sleep(0.5)
        derived = from_prometheus(prom, '{model_name="spec-llama"}', 600.0, at=time.time())
    assert derived.stats.spec_acceptance == pytest.approx(0.7, abs=0.02)
    assert {c.spec_acceptance for c in derived.profile.classes} == \
        {derived.stats.spec_acceptance}
