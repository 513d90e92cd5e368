"""``chunktune sim serve`` + ``chunktune load run`` end to end: the client's TTFT percentiles
agree with the server's ``vllm:time_to_first_token_seconds`` histogram within its buckets."""

from __future__ import annotations

import bisect
import json
import math
import subprocess
import sys

import pytest
import requests
from bench.serve_overhead import start_server

from chunktune.metrics.promtext import Scrape, histogram_quantile
from tests.timing import SchedulingNoise, retry_timing, timing

pytestmark = pytest.mark.slow  # Locust against a real sim serve process

#: vLLM's TTFT buckets (docs/vllm-behaviour.md §4).
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5,
                7.5, 10, 20, 40, 80, 160, 640, 2560]


def bucket_of(v: float) -> int:
    return bisect.bisect_left(TTFT_BUCKETS, v)


def test_client_ttft_matches_server_histogram(tmp_path):
    # The bounds that allow for the client's lateness are timing bounds: on a busy machine (a CI
    # runner with another test file in the second process) a burst of load can delay the client
    # more than the probe saw; those are retried, a wrong measurement fails at once.
    retry_timing(lambda: _client_against_server(tmp_path))


def _client_against_server(tmp_path):
    with start_server("llama-3.1-8b", ["--max-model-len", "16384",
                                       "--served-model-name", "llama"]) as srv:
        out = tmp_path / "summary.json"
        out.unlink(missing_ok=True)
        with SchedulingNoise() as noise:
            run = subprocess.run(
                [sys.executable, "-m", "chunktune", "load", "run", "--target", srv.url,
                 "--profile", "smoke", "--duration", "10s", "--warmup", "0", "--out", str(out),
                 "--raw", "--quiet"], capture_output=True, text=True, timeout=180)
        assert run.returncode == 0, run.stderr
        text = requests.get(srv.url + "/metrics", timeout=10).text
    summary = json.loads(out.read_text())
    overall = summary["overall"]
    assert overall["requests"]["failed"] == 0 and overall["requests"]["ok"] > 30
    scrape = Scrape.parse(text)
    buckets = scrape.buckets("vllm:time_to_first_token_seconds")
    assert buckets[-1][1] == overall["requests"]["ok"]  # the server saw every request
    assert [le for le, _ in buckets[:-1]] == TTFT_BUCKETS and math.isinf(buckets[-1][0])
    # The client sees a token after the server stamps it: later by the network and the wake-ups
    # of both processes — a few ms, or what this machine's scheduling noise was meanwhile.
    slack = 0.002 + noise.q(0.95)
    ttfts = sorted(r["ttft"] for r in summary["raw"] if r["ok"])
    # The client's TTFTs in the same buckets, so that both quantiles are computed alike (with
    # ~50 requests a tail quantile by rank and one interpolated in a bucket can differ by one).
    client_buckets = [(le, float(bisect.bisect_right(ttfts, le))) for le, _ in buckets[:-1]]
    client_buckets.append((math.inf, float(len(ttfts))))
    for q in ("p50", "p90", "p99"):
        client = histogram_quantile(int(q[1:]) / 100, client_buckets)
        server = histogram_quantile(int(q[1:]) / 100, buckets)
        assert client is not None and server is not None
        # never earlier than the server (a wrong start of the clock), at most one bucket later
        # when the client's extra time crosses an edge
        assert bucket_of(server) <= bucket_of(client), (q, client, server)
        timing(bucket_of(client - slack) - bucket_of(server) <= 1, q, client, server, noise)
    # and the whole distributions agree at every bucket edge, the client's shifted by the slack
    total = buckets[-1][1]
    for le, count in buckets[:-1]:
        server_cdf = count / total
        client_cdf = bisect.bisect_right(ttfts, le) / len(ttfts)
        client_late_cdf = bisect.bisect_right(ttfts, le + slack) / len(ttfts)
        assert client_cdf <= server_cdf + 0.1, (le, client_cdf, server_cdf)
        timing(client_late_cdf >= server_cdf - 0.1, le, client_late_cdf, server_cdf, noise)
