"""Prompt counting in ``chunktune sim serve``: the model's tokenizer when given, else the word
rule. Uses the tiny model's offline-trained tokenizer (``chunktune model tiny``); the counts
real vLLM gives for the same tokenizer are pinned in tests/conformance/test_metrics.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from chunktune.core.errors import SpecError
from chunktune.sim.serving.tokenizer import HFTokenizer, WordCounter, resolve_tokenizer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("CHUNKTUNE_TINY_MODEL")  # an existing `chunktune model tiny` dir
    if given:
        return Path(given)
    from chunktune.modelgen import write_tiny_model

    return Path(write_tiny_model(tmp_path_factory.mktemp("tiny")))


def test_model_directory_or_tokenizer_file_or_the_word_rule(tiny):
    assert isinstance(resolve_tokenizer(None, str(tiny)), HFTokenizer)
    assert isinstance(resolve_tokenizer(str(tiny / "tokenizer.json"), "llama-3.1-8b"),
                      HFTokenizer)
    words = resolve_tokenizer(None, "llama-3.1-8b")
    assert isinstance(words, WordCounter)
    assert "one per word" in words.describe()
    assert "counted with the tokenizer" in resolve_tokenizer(None, str(tiny)).describe()


def test_counts_round_trips_and_chat_template(tiny):
    tok = HFTokenizer.load(tiny)
    text = "The scheduler splits long prompts into chunks of the token budget."
    ids = tok.encode(text)
    assert tok.count(text) == len(ids) > 0
    assert tok.decode(ids).strip() == text
    # The chat template renders role and content between the specials; the prompt is the
    # rendered text tokenized without adding specials again (as vLLM does).
    messages = [{"role": "user", "content": "hello there"}]
    rendered = tok.render_chat(messages)
    assert rendered == "<s>user: hello there</s>\n<s>assistant: "
    assert tok.encode_chat(messages) == tok.encode(rendered, add_special_tokens=False)
    assert tok.count_chat(messages) == len(tok.encode_chat(messages))
    # Content given as OpenAI parts counts its text parts.
    parts = [{"role": "user", "content": [{"type": "text", "text": "hello there"}]}]
    assert tok.encode_chat(parts) == tok.encode_chat(messages)


def test_no_chat_template_falls_back_to_role_lines(tiny, tmp_path):
    (tmp_path / "tokenizer.json").write_bytes((tiny / "tokenizer.json").read_bytes())
    tok = HFTokenizer.load(tmp_path)
    assert tok.chat_template is None
    assert tok.render_chat([{"role": "user", "content": "hi"}]) == "user: hi\nassistant: "
    assert "no chat template" in tok.describe()


@pytest.mark.parametrize(("setup", "message"), [
    (lambda d: None, "has no tokenizer.json"),
    (lambda d: (d / "tokenizer.json").write_text("{not json"), "is not a tokenizer.json"),
    (lambda d: ((d / "tokenizer.json").write_text(json.dumps({"x": 1}))), "is not a tokenizer"),
])
def test_bad_tokenizer_names_the_flag(tmp_path, setup, message):
    setup(tmp_path)
    with pytest.raises(SpecError) as e:
        HFTokenizer.load(tmp_path)
    assert "--tokenizer" in str(e.value) and message in str(e.value)
    with pytest.raises(SpecError, match="does not exist"):
        HFTokenizer.load(tmp_path / "missing")


def test_word_rule_cannot_detokenize():
    w = WordCounter()
    assert w.count("two words.") == 3
    assert len(w.encode("two words.")) == 3
    with pytest.raises(NotImplementedError):
        w.decode([1, 2])


def test_the_word_rule_encodes_the_text_it_counts() -> None:
    """A chat message's text parts are encoded, not only counted: two prompts that differ
    only there get different ids (the prefix cache keys blocks by them), of the counted
    length."""
    w = WordCounter()

    def parts(text: str) -> list[dict[str, object]]:
        return [{"role": "user", "content": [{"type": "text", "text": text}]}]

    a, b = w.encode_chat(parts("alpha beta gamma")), w.encode_chat(parts("delta epsilon zeta"))
    assert a != b and len(a) == w.count_chat(parts("alpha beta gamma")) == len(b)
    assert a[:3] == w.encode("alpha beta gamma")
