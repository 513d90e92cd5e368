"""``sim serve`` with ``--speculative-config``: the drafts' counters on ``/metrics`` as vLLM
0.32 exports them (``SpecDecodingProm``), several tokens a step on the stream, and
``--max-num-queued-reqs`` answered with vLLM's 503."""

from __future__ import annotations

import json

import pytest
import requests
from bench.serve_overhead import start_server

from chunktune.core.speculative import expected_accepted
from tests.sim.serving.conftest import metric_samples, post, value, wait_for

MODEL = "sim-llama"
K = 4
FLAGS = ["--max-model-len", "8192", "--served-model-name", MODEL,
         "--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": K}),
         "--spec-acceptance", "0.8", "--max-num-queued-reqs", "2"]


@pytest.fixture(scope="module")
def spec_sim():
    with start_server("llama-3.1-8b", FLAGS) as srv:
        yield srv


def test_spec_decode_counters_and_tokens(spec_sim):
    r = post(spec_sim, "/v1/completions", {"model": MODEL, "prompt": list(range(50)),
                                           "max_tokens": 200})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 200
    m = metric_samples(spec_sim)
    drafts = value(m, "vllm:spec_decode_num_drafts_total")
    draft_tokens = value(m, "vllm:spec_decode_num_draft_tokens_total")
    accepted = value(m, "vllm:spec_decode_num_accepted_tokens_total")
    per_pos = [value(m, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
               for i in range(K)]
    assert draft_tokens == K * drafts and sum(per_pos) == accepted
    assert per_pos == sorted(per_pos, reverse=True)  # acceptance stops at the first rejection
    # one token a verification plus the accepted drafts: 200 tokens in fewer steps
    assert value(m, "vllm:generation_tokens_total") == 200
    assert drafts + accepted >= 199
    assert accepted / drafts == pytest.approx(expected_accepted(0.8, K), abs=0.05)
    # one inter-token gap per step that gave the request tokens, as vLLM observes them
    assert value(m, "vllm:inter_token_latency_seconds_count") == pytest.approx(
        drafts, abs=1)


def test_max_num_queued_reqs_answers_503(spec_sim):
    """Two long requests in the system; a third is refused with vLLM's 503 and counted in
    ``vllm:admission_rejections_total``."""
    before = metric_samples(spec_sim)
    body = {"model": MODEL, "prompt": list(range(20)), "max_tokens": 4000, "stream": True}
    streams = [requests.post(spec_sim.url + "/v1/completions", json=body, stream=True,
                             timeout=60) for _ in range(2)]
    try:
        assert wait_for(lambda: value(metric_samples(spec_sim), "vllm:num_requests_running")
                        == 2, timeout=20)
        r = post(spec_sim, "/v1/completions", {"model": MODEL, "prompt": [1, 2, 3],
                                               "max_tokens": 4})
        assert r.status_code == 503
        assert r.json()["error"]["message"].startswith(
            "The engine is currently busy and cannot accept new requests.")
        after = metric_samples(spec_sim)
        key = ("vllm:admission_rejections_total",
               (("model_name", MODEL), ("reason", "max_num_queued_reqs")))
        assert after[key] - before.get(key, 0.0) == 1
    finally:
        for s in streams:
            s.close()
    assert wait_for(lambda: value(metric_samples(spec_sim), "vllm:num_requests_running") == 0,
                    timeout=20)
    assert post(spec_sim, "/v1/completions", {"model": MODEL, "prompt": [1, 2, 3],
                                              "max_tokens": 4}).status_code == 200


def test_speculative_config_needs_an_acceptance():
    proc_flags = [f for f in FLAGS if f not in ("--spec-acceptance", "0.8")]
    with pytest.raises(RuntimeError, match="--speculative-config and --spec-acceptance go "
                       "together"), start_server("llama-3.1-8b", proc_flags, timeout=60):
        pass
