"""``chunktune sim serve MODEL_DIR``: the model directory gives the model's shape
(``config.json``) and the tokenizer prompts are counted with; ``--tokenizer`` names one for a
catalog model. Real vLLM's answers for the same tokenizer: tests/conformance/test_metrics.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from bench.serve_overhead import ServerProc, start_server

from chunktune.sim.serving.tokenizer import HFTokenizer

TEXT = "Long prompts are split into chunks of the token budget."
CHAT = [{"role": "user", "content": "How long is this?"}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("CHUNKTUNE_TINY_MODEL")  # an existing `chunktune model tiny` dir
    if given:
        return Path(given)
    from chunktune.modelgen import write_tiny_model

    return Path(write_tiny_model(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def served(tiny: Path) -> Iterator[ServerProc]:
    with start_server(str(tiny), ["--max-model-len", "2048", "--served-model-name", "tiny"]) \
            as srv:
        yield srv


def test_counts_with_the_model_directorys_tokenizer(served, tiny):
    tok = HFTokenizer.load(tiny)
    assert any("counted with the tokenizer" in line for line in served.lines)
    r = requests.post(served.url + "/v1/completions", timeout=30,
                      json={"model": "tiny", "prompt": TEXT, "max_tokens": 1})
    assert r.json()["usage"]["prompt_tokens"] == tok.count(TEXT)
    r = requests.post(served.url + "/v1/chat/completions", timeout=30,
                      json={"model": "tiny", "messages": CHAT, "max_tokens": 1})
    assert r.json()["usage"]["prompt_tokens"] == tok.count_chat(CHAT)
    t = requests.post(served.url + "/tokenize", timeout=30,
                      json={"model": "tiny", "prompt": TEXT}).json()
    assert t["tokens"] == tok.encode(TEXT) and t["count"] == len(t["tokens"])
    d = requests.post(served.url + "/detokenize", timeout=30,
                      json={"model": "tiny", "tokens": t["tokens"]}).json()
    assert d == {"prompt": tok.decode(t["tokens"])}


def test_tokenizer_flag_for_a_catalog_model(tiny):
    with start_server("llama-3.1-8b", ["--tokenizer", str(tiny / "tokenizer.json"),
                                       "--max-model-len", "4096"]) as srv:
        assert any("counted with the tokenizer" in line for line in srv.lines)
        t = requests.post(srv.url + "/tokenize", timeout=30, json={"prompt": TEXT}).json()
        assert t["count"] == HFTokenizer.load(tiny).count(TEXT)


def test_without_a_tokenizer_it_says_it_counts_words():
    with start_server("llama-3.1-8b", ["--max-model-len", "4096"]) as srv:
        assert any("one per word" in line for line in srv.lines)


def test_a_missing_tokenizer_is_an_error_naming_the_flag(tmp_path):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(root / "operator")}
    proc = subprocess.run([sys.executable, "-m", "chunktune", "sim", "serve", "llama-3.1-8b",
                           "--port", "0", "--load-time", "0", "--tokenizer",
                           str(tmp_path / "missing")],
                          capture_output=True, text=True, timeout=60, env=env, check=False)
    assert proc.returncode == 2
    assert "--tokenizer" in proc.stderr and "does not exist" in proc.stderr
