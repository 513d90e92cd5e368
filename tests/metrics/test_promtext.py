"""Reading vLLM's /metrics text: both name spellings, histogram quantiles, deltas."""

from __future__ import annotations

import math

import pytest

from chunktune.metrics.promtext import Scrape, histogram_quantile, server_metrics

BEFORE = """\
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 3.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.10
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{engine="0",le="0.3",model_name="m"} 10.0
vllm:request_queue_time_seconds_bucket{engine="0",le="0.5",model_name="m"} 10.0
vllm:request_queue_time_seconds_bucket{engine="0",le="+Inf",model_name="m"} 10.0
vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 10.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 1.0
"""
AFTER = """\
# TYPE vllm_num_preemptions_total counter
vllm_num_preemptions_total{engine="0",model_name="m"} 9.0
# TYPE vllm_kv_cache_usage_perc gauge
vllm_kv_cache_usage_perc{engine="0",model_name="m"} 0.20
# TYPE vllm_request_queue_time_seconds histogram
vllm_request_queue_time_seconds_bucket{engine="0",le="0.3",model_name="m"} 60.0
vllm_request_queue_time_seconds_bucket{engine="0",le="0.5",model_name="m"} 110.0
vllm_request_queue_time_seconds_bucket{engine="0",le="+Inf",model_name="m"} 110.0
vllm_request_queue_time_seconds_count{engine="0",model_name="m"} 110.0
vllm_request_queue_time_seconds_sum{engine="0",model_name="m"} 40.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="28206"} 1.0
"""


def test_both_spellings_read_the_same():
    a, b = Scrape.parse(BEFORE), Scrape.parse(AFTER)
    assert a.total("vllm:num_preemptions_total") == 3
    assert b.total("vllm:num_preemptions_total") == 9
    assert b.total("vllm_num_preemptions_total") == 9
    assert b.total("vllm:kv_cache_usage_perc", {"model_name": "m"}) == pytest.approx(0.2)
    assert b.total("vllm:kv_cache_usage_perc", {"model_name": "other"}) == 0


def test_histogram_quantile_like_prometheus():
    buckets = [(0.1, 50.0), (0.5, 90.0), (1.0, 100.0), (math.inf, 100.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1)
    assert histogram_quantile(0.7, buckets) == pytest.approx(0.3)
    assert histogram_quantile(0.95, buckets) == pytest.approx(0.75)
    assert histogram_quantile(0.99, [(0.1, 1.0), (math.inf, 10.0)]) == 0.1
    assert histogram_quantile(0.5, []) is None


def test_server_metrics_between_scrapes():
    m = server_metrics(Scrape.parse(BEFORE), Scrape.parse(AFTER), seconds=120,
                       kv_samples=[0.35, 0.5])
    assert m["preemptions"] == 6 and m["preemptions_per_minute"] == pytest.approx(3.0)
    assert m["kv_cache_usage_peak"] == pytest.approx(0.5)
    # 100 new queue observations: 50 at <= 0.3 s, 50 in (0.3, 0.5]
    assert m["queue_time_p50"] == pytest.approx(0.3)
    assert m["queue_time_p99"] == pytest.approx(0.496)
    assert m["num_gpu_blocks"] == 28206


def test_the_prefix_caches_hit_rate_over_the_window():
    before = ('vllm:prefix_cache_queries_total{engine="0"} 1000.0\n'
              'vllm:prefix_cache_hits_total{engine="0"} 200.0\n')
    after = ('vllm_prefix_cache_queries_total{engine="0"} 5000.0\n'
             'vllm_prefix_cache_hits_total{engine="0"} 3200.0\n')
    m = server_metrics(Scrape.parse(before), Scrape.parse(after), seconds=60)
    assert (m["prefix_cache_queries"], m["prefix_cache_hits"]) == (4000, 3000)
    assert m["prefix_cache_hit_rate"] == pytest.approx(0.75)
    # nothing looked up (prefix caching off): no rate, not a rate of 0
    m = server_metrics(Scrape.parse(before), Scrape.parse(before), seconds=60)
    assert "prefix_cache_hit_rate" not in m
