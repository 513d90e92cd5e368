"""``GET /metrics`` read with a plain Prometheus text parser: vLLM's family names, types, labels
and bucket boundaries; the counts move after requests; always text format 1.0.0 (vLLM 0.32's).
The full family and label sets are checked against a real vLLM scrape in
tests/conformance/test_metrics.py."""

from __future__ import annotations

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from chunktune.sim.serving.metrics import (
    ITERATION_TOKEN_BUCKETS,
    ITL_BUCKETS,
    REQUEST_TIME_BUCKETS,
    TTFT_BUCKETS,
    build_1_2_5_buckets,
)
from tests.sim.serving.conftest import MODEL, metric_samples, post, value, wait_for

pytestmark = pytest.mark.slow  # a real sim serve process

FAMILIES = {
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram",
    "vllm:request_inference_time_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:iteration_tokens_total": "histogram",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
    "vllm:request_params_max_tokens": "histogram",
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:cache_config_info": "gauge",
    "vllm:num_preemptions": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:request_num_preemptions": "histogram",
    "vllm:request_prefill_kv_computed_tokens": "histogram",
    "vllm:prompt_tokens_by_source": "counter",
    "vllm:num_requests_waiting_by_reason": "gauge",
    "chunktune_sim_info": "gauge",
    "chunktune_sim_step_overhead_seconds": "histogram",
}


def _families(sim, accept: str | None = None):
    headers = {"Accept": accept} if accept else {}
    r = requests.get(sim.url + "/metrics", headers=headers, timeout=10)
    assert r.status_code == 200
    return r, {f.name: f for f in text_string_to_metric_families(r.text)}


def _bounds(fam, sample: str) -> list[float]:
    return [float(s.labels["le"]) for s in fam.samples
            if s.name == sample and s.labels["le"] != "+Inf"]


def test_text_format_1_0_0_even_when_openmetrics_is_asked_for(sim):
    accept = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
              "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
    r, _ = _families(sim, accept)
    assert r.headers["Content-Type"] == "text/plain; version=1.0.0; charset=utf-8"
    assert "vllm:time_to_first_token_seconds_bucket{" in r.text
    assert "vllm_time_to_first_token" not in r.text
    assert "# EOF" not in r.text
    assert "vllm:num_preemptions_total{" in r.text


def test_families_labels_and_buckets(sim):
    _, fams = _families(sim)
    for name, kind in FAMILIES.items():
        assert name in fams, name
        assert fams[name].type == kind, name
    for name in FAMILIES:
        if name.startswith("vllm:") and name != "vllm:cache_config_info":
            for s in fams[name].samples:
                assert s.labels["model_name"] == MODEL, (name, s.labels)
                assert s.labels["engine"] == "0", (name, s.labels)
    assert _bounds(fams["vllm:time_to_first_token_seconds"],
                   "vllm:time_to_first_token_seconds_bucket") == list(TTFT_BUCKETS)
    assert TTFT_BUCKETS[:4] == (0.001, 0.005, 0.01, 0.02) and TTFT_BUCKETS[-1] == 2560.0
    assert _bounds(fams["vllm:inter_token_latency_seconds"],
                   "vllm:inter_token_latency_seconds_bucket") == list(ITL_BUCKETS)
    assert ITL_BUCKETS[0] == 0.01 and ITL_BUCKETS[-1] == 80.0
    for name in ("vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
                 "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
                 "vllm:request_inference_time_seconds"):
        assert _bounds(fams[name], name + "_bucket") == list(REQUEST_TIME_BUCKETS)
    assert REQUEST_TIME_BUCKETS[0] == 0.3 and REQUEST_TIME_BUCKETS[-1] == 7680.0
    assert _bounds(fams["vllm:iteration_tokens_total"],
                   "vllm:iteration_tokens_total_bucket") == list(ITERATION_TOKEN_BUCKETS)
    lens = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]  # 1-2-5 up to max_model_len 4096
    assert build_1_2_5_buckets(4096) == lens
    for name in ("vllm:request_prompt_tokens", "vllm:request_generation_tokens",
                 "vllm:request_params_max_tokens"):
        assert _bounds(fams[name], name + "_bucket") == lens
    reasons = {s.labels["finished_reason"] for s in fams["vllm:request_success"].samples
               if s.name == "vllm:request_success_total"}
    assert {"stop", "length", "abort"} <= reasons
    (info,) = fams["vllm:cache_config_info"].samples
    assert info.value == 1
    assert info.labels["block_size"] == "16"
    assert info.labels["gpu_memory_utilization"] == "0.92"
    assert int(info.labels["num_gpu_blocks"]) > 0
    # the flag's value: the simulator runs with prefix caching off unless it is given
    assert info.labels["enable_prefix_caching"] == "False"
    assert info.labels["engine"] == "0"
    (sim_info,) = fams["chunktune_sim_info"].samples
    assert sim_info.labels["max_num_batched_tokens"] == "8192"
    assert sim_info.labels["max_num_seqs"] == "16"
    assert sim_info.labels["max_model_len"] == "4096"
    assert sim_info.labels["gpu"] == "h100-sxm"


def test_counts_move_after_requests(sim):
    before = metric_samples(sim)
    sizes = [(11, 4), (200, 7), (3, 1)]
    for prompt, out in sizes:
        r = post(sim, "/v1/completions", {"model": MODEL, "prompt": list(range(prompt)),
                                          "max_tokens": out})
        assert r.status_code == 200
    after = metric_samples(sim)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    n = len(sizes)
    assert delta("vllm:request_success_total", finished_reason="length") == n
    assert delta("vllm:prompt_tokens_total") == sum(p for p, _ in sizes)
    assert delta("vllm:generation_tokens_total") == sum(o for _, o in sizes)
    assert delta("vllm:time_to_first_token_seconds_count") == n
    assert delta("vllm:e2e_request_latency_seconds_count") == n
    assert delta("vllm:request_queue_time_seconds_count") == n
    assert delta("vllm:inter_token_latency_seconds_count") == sum(o - 1 for _, o in sizes)
    # vLLM observes every finished request's mean time per output token (0 for one token).
    assert delta("vllm:request_time_per_output_token_seconds_count") == n
    assert delta("vllm:request_prompt_tokens_sum") == sum(p for p, _ in sizes)
    assert delta("vllm:request_generation_tokens_sum") == sum(o for _, o in sizes)
    assert delta("vllm:request_params_max_tokens_sum") == sum(o for _, o in sizes)
    assert delta("vllm:prompt_tokens_by_source_total", source="local_compute") == sum(
        p for p, _ in sizes)
    assert delta("vllm:request_num_preemptions_count") == n
    assert delta("vllm:request_prefill_kv_computed_tokens_sum") == sum(p for p, _ in sizes)
    # vLLM 0.32: one observation per step that produced a token, holding the prompt of a
    # prefill that finished in it plus the tokens generated. Each request ran alone with its
    # prompt in one step: o observations, p + 1 then o - 1 single tokens.
    assert delta("vllm:iteration_tokens_total_count") == sum(o for _, o in sizes)
    assert delta("vllm:iteration_tokens_total_sum") == sum(p + o for p, o in sizes)
    assert delta("chunktune_sim_step_overhead_seconds_count") == delta(
        "vllm:iteration_tokens_total_count")
    assert delta("vllm:time_to_first_token_seconds_sum") > 0
    assert wait_for(lambda: value(metric_samples(sim), "vllm:num_requests_running") == 0)
    assert value(after, "vllm:kv_cache_usage_perc") == 0.0
    assert value(after, "vllm:num_requests_waiting") == 0.0
