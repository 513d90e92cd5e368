"""How ``chunktune sim serve`` counts prompt tokens: with the model's real tokenizer, as vLLM
does, or — only when none is given — with the word rule.

vLLM tokenizes a completion prompt with the model's tokenizer (special tokens added as the
tokenizer's post-processor adds them) and a chat request by rendering the model's chat template
(``tokenizer_config.json``'s ``chat_template``, Jinja, with ``add_generation_prompt``) and
tokenizing the result without adding special tokens again. :class:`HFTokenizer` does the same
with the ``tokenizers`` library (``tokenizer.json``) and a sandboxed Jinja environment set up
as transformers sets it up for chat templates, so clients that count with the model's tokenizer
(``vllm bench serve``, GuideLLM, inference-perf) see the prompt sizes they asked for, and
``/tokenize`` and ``/detokenize`` answer as vLLM's do.

:class:`WordCounter` is the fallback: :func:`chunktune.core.tokens.count_tokens` (one token per
word, one per punctuation mark) and stable fake ids; it cannot detokenize. Token-id prompts are
counted exactly by both.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chunktune.core import infile
from chunktune.core.errors import SpecError
from chunktune.core.models import MAX_CONFIG_BYTES
from chunktune.core.tokens import content_text, count_chat_tokens, count_tokens


class WordCounter:
    """Today's rule: one token per word or punctuation mark (no tokenizer given)."""

    can_decode = False

    def __init__(self, vocab_size: int = 32000) -> None:
        self.vocab = max(vocab_size, 2000)

    def describe(self) -> str:
        return ("prompt tokens counted one per word or punctuation mark (no tokenizer given: "
                "pass --tokenizer DIR|tokenizer.json, or a model directory, to count as vLLM "
                "does)")

    def count(self, text: str) -> int:
        return count_tokens(text)

    def count_chat(self, messages: list[dict[str, Any]]) -> int:
        return count_chat_tokens(messages)

    def encode(self, text: str) -> list[int]:
        return [self._piece_id(p) for p in _pieces(text)]

    def encode_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        ids: list[int] = []
        for m in messages:  # the text count_chat_tokens counts, text parts included
            ids += self.encode(content_text(m.get("content")))
        # count_chat_tokens adds per-message overhead; pad with a fixed id so counts agree.
        return ids + [1] * (self.count_chat(messages) - len(ids))

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError("the word rule cannot detokenize")

    def _piece_id(self, piece: str) -> int:
        return 1000 + zlib.crc32(piece.encode()) % (self.vocab - 1000)


def _pieces(text: str) -> list[str]:
    import re

    return re.findall(r"\w+|[^\w\s]", text)


class HFTokenizer:
    """A Hugging Face fast tokenizer (``tokenizer.json``) plus the model's chat template."""

    can_decode = True

    def __init__(self, tokenizer_file: Path, config: dict[str, Any] | None = None) -> None:
        from tokenizers import Tokenizer

        self.path = tokenizer_file
        self.tok = Tokenizer.from_file(str(tokenizer_file))
        self.config = config or {}
        template = self.config.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        self.chat_template: str | None = template if isinstance(template, str) else None
        self._template: Any = None  # a jinja2 Template, compiled on first use

    @classmethod
    def load(cls, path: str | Path, field: str = "--tokenizer") -> HFTokenizer:
        """A model directory holding ``tokenizer.json`` (and usually ``tokenizer_config.json``
        with the chat template), or a ``tokenizer.json`` file. Raises :class:`SpecError` naming
        ``field``."""
        p = Path(path)
        if p.is_dir():
            file = p / "tokenizer.json"
            if not file.is_file():
                raise SpecError(f"{str(p)!r} has no tokenizer.json (only fast tokenizers are "
                                "read); give a directory holding one or the file itself",
                                field=field)
        elif p.is_file():
            file = p
        else:
            raise SpecError(f"{str(p)!r} does not exist; give a model directory holding "
                            "tokenizer.json or a tokenizer.json file", field=field)
        config: dict[str, Any] = {}
        cfg_file = file.parent / "tokenizer_config.json"
        if cfg_file.is_file():
            config = infile.json_value(
                infile.read_text(cfg_file, field=field, max_bytes=MAX_CONFIG_BYTES,
                                 name=str(cfg_file)), where=str(cfg_file), field=field)
        try:
            return cls(file, config)
        except Exception as e:  # tokenizers raises a plain Exception for a broken file
            raise SpecError(f"{str(file)!r} is not a tokenizer.json the tokenizers library "
                            f"reads: {e}", field=field) from e

    def describe(self) -> str:
        chat = "its chat template" if self.chat_template else "no chat template (chat messages " \
            "are joined as 'role: content' lines)"
        return (f"prompt tokens counted with the tokenizer {self.path} "
                f"(vocab {self.tok.get_vocab_size()}), chat prompts through {chat}")

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def render_chat(self, messages: list[dict[str, Any]],
                    add_generation_prompt: bool = True) -> str:
        if self.chat_template is None:
            text = "".join(f"{m.get('role', '')}: {_content_text(m.get('content'))}\n"
                           for m in messages)
            return text + ("assistant: " if add_generation_prompt else "")
        if self._template is None:
            from jinja2.exceptions import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message: str) -> None:
                raise TemplateError(message)

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = raise_exception
            self._template = env.from_string(self.chat_template)
        specials = {k: _token_text(self.config.get(k)) for k in
                    ("bos_token", "eos_token", "unk_token", "pad_token")}
        msgs = [{**m, "content": _content_text(m.get("content"))} for m in messages]
        rendered: str = self._template.render(
            messages=msgs, add_generation_prompt=add_generation_prompt, **specials)
        return rendered

    def encode_chat(self, messages: list[dict[str, Any]],
                    add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.render_chat(messages, add_generation_prompt),
                           add_special_tokens=False)

    def count_chat(self, messages: list[dict[str, Any]]) -> int:
        return len(self.encode_chat(messages))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)


def _token_text(v: Any) -> str:
    if isinstance(v, dict):  # {"content": "<s>", "__type": "AddedToken", ...}
        return str(v.get("content", ""))
    return "" if v is None else str(v)


def _content_text(content: Any) -> str:
    """A message's text: a string, or the text parts of an OpenAI content list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content
                       if isinstance(p, dict) and p.get("type") == "text")
    return ""


PromptCounter = WordCounter | HFTokenizer


def resolve_tokenizer(tokenizer: str | None, model: str | None,
                      vocab_size: int = 32000) -> PromptCounter:
    """``--tokenizer`` if given; else the positional model when it is a directory holding a
    ``tokenizer.json``; else the word rule."""
    if tokenizer:
        return HFTokenizer.load(tokenizer)
    if model and Path(model).is_dir() and (Path(model) / "tokenizer.json").is_file():
        return HFTokenizer.load(model, field="MODEL")
    return WordCounter(vocab_size)
