"""``chunktune sim serve --enable-prefix-caching``: prompts are read, keyed by block and
looked up as vLLM does. The load driver's shared openings (``tests/openings.py``) give the
counters real vLLM gives for the same requests (``tests/metrics/test_from_prometheus.py``),
and a cached opening shortens the prefill the engine schedules."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
from bench.serve_overhead import start_server

from tests import openings

pytestmark = pytest.mark.slow  # a server and the load driver


def test_shared_openings_count_as_real_vllm_counts_them(tmp_path: Path) -> None:
    with start_server("llama-3.1-8b", [
            "--enable-prefix-caching", "--block-size", str(openings.BLOCK), "--max-model-len",
            "2048", "--served-model-name", "sim-tiny"]) as srv:
        run = openings.send(srv.url, "sim-tiny", tmp_path)
        assert run.returncode == 0, run.stderr
        text = requests.get(srv.url + "/metrics", timeout=30).text
    n = int(openings.counter(text, "request_success_total"))
    assert n >= 3
    queries, hits = openings.expected(n)
    assert (openings.counter(text, "prefix_cache_queries_total"),
            openings.counter(text, "prefix_cache_hits_total")) == (queries, hits)
    # where the prompt tokens came from, and the cache's configuration, as vLLM shows them
    assert openings.counter(text, "prompt_tokens_cached_total") == hits
    by_source = {line.split('source="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
                 for line in text.splitlines()
                 if line.startswith("vllm:prompt_tokens_by_source_total{")}
    assert by_source["local_cache_hit"] == hits
    assert by_source["local_compute"] == queries - hits
    assert 'enable_prefix_caching="True"' in text


def test_without_the_flag_nothing_is_looked_up(tmp_path: Path) -> None:
    with start_server("llama-3.1-8b", ["--block-size", str(openings.BLOCK), "--max-model-len",
                                       "2048", "--served-model-name", "sim-tiny"]) as srv:
        run = openings.send(srv.url, "sim-tiny", tmp_path)
        assert run.returncode == 0, run.stderr
        text = requests.get(srv.url + "/metrics", timeout=30).text
    assert openings.counter(text, "request_success_total") >= 3
    assert openings.counter(text, "prefix_cache_queries_total") == 0
    assert openings.counter(text, "prefix_cache_hits_total") == 0
    assert 'enable_prefix_caching="False"' in text
