"""``/metrics`` and the token endpoints: a real vLLM 0.32 API server against ``chunktune sim
serve`` with the same flags and the same tiny model, given the same requests one at a time.

Compared: the Content-Type; every ``vllm:`` family, its type and label names; the values of the
enumerated labels (``finished_reason``, ``source``, ``reason``, ``sleep_state``); histogram
buckets; ``cache_config_info``'s labels and values; and, after the same requests, the counts and
sums that do not depend on timing (``iteration_tokens_total`` as vLLM records it, prompt tokens
by source, per-request preemptions, ...). Then ``/tokenize`` (text and chat), ``/detokenize`` and
the prompt-token usage of a text prompt, counted with the model's tokenizer.

Deliberate exceptions: none among the ``vllm:`` families. The page's non-``vllm:`` families
differ (vLLM's ``python_*``/``process_*``/``http_*`` collectors; the simulator's own
``chunktune_sim_*``), and so do the values of time histograms (CPU vs simulated GPU time).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from bench.serve_overhead import ServerProc, start_server
from prometheus_client.parser import text_string_to_metric_families

from tests.conformance.conftest import RealServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MODEL = "tiny"
FLAGS = ["--max-num-batched-tokens", "64", "--long-prefill-token-threshold", "32",
         "--max-num-seqs", "4", "--max-model-len", "2048", "--block-size", "128",
         "--num-gpu-blocks-override", "256", "--kv-cache-memory-bytes", str(64 * 2**20),
         "--no-enable-prefix-caching", "--served-model-name", MODEL]
#: (prompt tokens, output tokens), sent one at a time; the 1000-token prompt is chunked
#: (15 x 64 + 40: the threshold does not apply to a lone request).
REQUESTS = [(10, 5), (1000, 3), (37, 1), (64, 8)]
TEXT = "The quick brown fox jumps over the lazy dog while the scheduler splits long prompts."
CHAT = [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "How many tokens is this question?"}]


def _exercise(url: str) -> dict[str, Any]:
    """The same requests and token calls against either server; returns what they answered."""
    got: dict[str, Any] = {"usage": []}
    for i, (prompt, out) in enumerate(REQUESTS):
        ids = [(7 * i + 13 * k) % 3000 + 100 for k in range(prompt)]
        r = requests.post(url + "/v1/completions", timeout=120, json={
            "model": MODEL, "prompt": ids, "max_tokens": out, "min_tokens": out,
            "ignore_eos": True, "temperature": 0})
        assert r.status_code == 200, r.text
        got["usage"].append(r.json()["usage"])
    r = requests.post(url + "/v1/completions", timeout=120, json={
        "model": MODEL, "prompt": TEXT, "max_tokens": 2, "min_tokens": 2, "ignore_eos": True})
    assert r.status_code == 200, r.text
    got["text_usage"] = r.json()["usage"]
    got["tokenize"] = requests.post(url + "/tokenize", timeout=30,
                                    json={"model": MODEL, "prompt": TEXT}).json()
    got["tokenize_chat"] = requests.post(url + "/tokenize", timeout=30,
                                         json={"model": MODEL, "messages": CHAT}).json()
    got["detokenize"] = requests.post(url + "/detokenize", timeout=30, json={
        "model": MODEL, "tokens": got["tokenize"]["tokens"]}).json()
    m = requests.get(url + "/metrics", timeout=30)
    assert m.status_code == 200
    got["content_type"] = m.headers["Content-Type"]
    got["metrics"] = m.text
    return got


@pytest.fixture(scope="module")
def real(vllm_installed: None, tiny_model: Path,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    server = RealServer(tiny_model, FLAGS, tmp_path_factory.mktemp("real") / "vllm.log")
    try:
        yield _exercise(server.url)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def sim(tiny_model: Path) -> Iterator[dict[str, Any]]:
    srv: ServerProc = start_server(str(tiny_model), FLAGS)
    try:
        yield {**_exercise(srv.url), "log": "\n".join(srv.lines)}
    finally:
        srv.stop()


def _families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)
            if f.name.startswith("vllm:")}


def _label_names(fam: Any) -> set[str]:
    return {k for s in fam.samples for k in s.labels if k != "le"}


def _label_values(fam: Any, label: str) -> set[str]:
    return {s.labels[label] for s in fam.samples if label in s.labels}


def _buckets(fam: Any) -> list[str]:
    return [s.labels["le"] for s in fam.samples if s.name.endswith("_bucket")]


def _sample(fam: Any, name: str, **labels: str) -> float:
    for s in fam.samples:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            return float(s.value)
    raise AssertionError(f"no sample {name} {labels} in {fam.name}")


def test_content_type(real, sim):
    assert real["content_type"] == sim["content_type"]
    assert sim["content_type"] == "text/plain; version=1.0.0; charset=utf-8"


def test_same_families_types_labels_and_buckets(real, sim):
    r, s = _families(real["metrics"]), _families(sim["metrics"])
    assert sorted(r) == sorted(s), (sorted(set(r) - set(s)), sorted(set(s) - set(r)))
    assert len([n for n in r if not n.endswith("_created")]) >= 38
    for name, fam in r.items():
        assert s[name].type == fam.type, name
        assert _label_names(s[name]) == _label_names(fam), name
        for label in ("finished_reason", "source", "reason", "sleep_state"):
            assert _label_values(s[name], label) == _label_values(fam, label), (name, label)
        if fam.type == "histogram":
            assert _buckets(s[name]) == _buckets(fam), name


def test_cache_config_info_labels_of_0_32(real, sim):
    (r,) = _families(real["metrics"])["vllm:cache_config_info"].samples
    (s,) = _families(sim["metrics"])["vllm:cache_config_info"].samples
    assert set(s.labels) == set(r.labels)
    assert "swap_space" not in s.labels and "kv_cache_size_tokens" in s.labels
    # Same values, except where the engine type shows: the CPU backend keeps the SSM cache in
    # float32 (the simulator is a GPU engine and says vLLM's default "auto").
    differ = {k for k in r.labels if r.labels[k] != s.labels[k]}
    assert differ <= {"mamba_ssm_cache_dtype"}, {k: (r.labels[k], s.labels[k]) for k in differ}


def test_same_counts_after_the_same_requests(real, sim):
    r, s = _families(real["metrics"]), _families(sim["metrics"])
    checks = [
        ("vllm:iteration_tokens_total", "vllm:iteration_tokens_total_count", {}),
        ("vllm:iteration_tokens_total", "vllm:iteration_tokens_total_sum", {}),
        ("vllm:prompt_tokens", "vllm:prompt_tokens_total", {}),
        ("vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total", {}),
        ("vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total", {}),
        ("vllm:generation_tokens", "vllm:generation_tokens_total", {}),
        ("vllm:num_preemptions", "vllm:num_preemptions_total", {}),
        ("vllm:request_success", "vllm:request_success_total", {"finished_reason": "length"}),
        ("vllm:request_num_preemptions", "vllm:request_num_preemptions_count", {}),
        ("vllm:request_num_preemptions", "vllm:request_num_preemptions_sum", {}),
        ("vllm:request_prefill_kv_computed_tokens",
         "vllm:request_prefill_kv_computed_tokens_sum", {}),
        ("vllm:request_prompt_tokens", "vllm:request_prompt_tokens_sum", {}),
        ("vllm:request_generation_tokens", "vllm:request_generation_tokens_sum", {}),
        ("vllm:request_params_max_tokens", "vllm:request_params_max_tokens_sum", {}),
        ("vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count", {}),
        ("vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_count", {}),
        ("vllm:request_time_per_output_token_seconds",
         "vllm:request_time_per_output_token_seconds_count", {}),
        ("vllm:e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds_count", {}),
    ]
    checks += [("vllm:prompt_tokens_by_source", "vllm:prompt_tokens_by_source_total",
                {"source": src}) for src in ("local_compute", "local_cache_hit",
                                             "external_kv_transfer")]
    diffs = {}
    for fam, sample, labels in checks:
        a, b = _sample(r[fam], sample, **labels), _sample(s[fam], sample, **labels)
        if a != b:
            diffs[(sample, tuple(labels.items()))] = (a, b)
    assert not diffs, diffs
    # The 1000-token prompt is one observation of 1001 (its prompt and first token), not 16.
    assert _sample(r["vllm:iteration_tokens_total"], "vllm:iteration_tokens_total_bucket",
                   le="1024.0") - _sample(r["vllm:iteration_tokens_total"],
                                          "vllm:iteration_tokens_total_bucket", le="512.0") == 1


def test_token_endpoints_and_prompt_counts_match_the_tokenizer(real, sim):
    assert "counted with the tokenizer" in sim["log"]
    assert sim["usage"] == real["usage"]
    assert sim["text_usage"]["prompt_tokens"] == real["text_usage"]["prompt_tokens"]
    for key in ("tokenize", "tokenize_chat"):
        assert sim[key]["tokens"] == real[key]["tokens"], key
        assert sim[key]["count"] == real[key]["count"], key
        assert sim[key]["max_model_len"] == real[key]["max_model_len"], key
    assert sim["detokenize"] == real["detokenize"]
