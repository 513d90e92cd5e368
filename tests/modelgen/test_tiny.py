"""``chunktune model tiny``: the files, the tokenizer offline, determinism."""

from __future__ import annotations

import json

import pytest

from chunktune.cli import main
from chunktune.modelgen.tiny import (
    FILES,
    SPECIAL_TOKENS,
    TINY,
    TinyModelSpec,
    digest,
    is_tiny_model_dir,
    write_tiny_model,
)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def test_cli_writes_every_file(tmp_path, capsys):
    out = tmp_path / "a" / "b"
    assert main(["model", "tiny", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)
    assert is_tiny_model_dir(out)


def test_cli_refuses_a_file_as_directory(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["model", "tiny", str(f)]) == 1
    err = capsys.readouterr().err
    assert "cannot write the tiny model" in err and str(f) in err


def test_config_is_the_measured_llama(tiny_dir):
    cfg = json.loads((tiny_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["head_dim"], cfg["intermediate_size"],
            cfg["vocab_size"], cfg["max_position_embeddings"], cfg["torch_dtype"]) == (
        256, 4, 4, 2, 64, 512, 4096, 8192, "bfloat16")
    # heads x head_dim must equal hidden for a Llama attention block
    assert cfg["num_attention_heads"] * cfg["head_dim"] == cfg["hidden_size"]


def test_tokenizer_loads_with_tokenizers(tiny_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    assert tok.get_vocab_size() == TINY.vocab_size
    assert [tok.id_to_token(i) for i in range(4)] == list(SPECIAL_TOKENS)
    text = "Brai stoung 4211 tham, chiol?"
    ids = tok.encode(text).ids
    assert ids and max(ids) < TINY.vocab_size
    assert tok.decode(ids) == text


def test_tokenizer_loads_with_transformers_offline(tiny_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_dir))
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id) == (
        1, 2, 0, 3)
    ids = tok("hello tiny model")["input_ids"]
    assert tok.decode(ids) == "hello tiny model"
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert chat == "<s>user: hi</s>\n<s>assistant: "


def test_deterministic(tiny_dir, tmp_path):
    again = write_tiny_model(tmp_path / "again")
    assert digest(again) == digest(tiny_dir)


def test_seed_changes_the_tokenizer_only(tiny_dir, tmp_path):
    other = write_tiny_model(tmp_path / "other", TinyModelSpec(seed=1, corpus_sentences=500))
    assert (other / "config.json").read_bytes() == (tiny_dir / "config.json").read_bytes()
    assert (other / "tokenizer.json").read_bytes() != (tiny_dir / "tokenizer.json").read_bytes()


def test_rewrite_keeps_other_files(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "notes.txt").write_text("mine")
    write_tiny_model(d)
    assert (d / "notes.txt").read_text() == "mine"
    assert not list(d.glob(".*.tmp"))


def test_driver_prompts_count_as_asked(tiny_dir):
    """The load driver's synthetic English prompts encode at ~1 token per word with the tiny
    tokenizer, so a real server sees about the prompt sizes a profile asks for."""
    from tokenizers import Tokenizer

    from chunktune.core.tokens import count_tokens
    from chunktune.load.prompts import PromptSynth

    tok = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    synth = PromptSynth(seed=3)
    for n in (50, 500, 3000):
        for key in range(3):
            text = synth.text(n, key=key)
            assert count_tokens(text) == n
            real = len(tok.encode(text).ids)
            assert n <= real <= n * 1.05 + 2, (n, real)
