"""The token-counting rule and prompt synthesis: exact lengths, deterministic, no shared prefix
(unless given one)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

import chunktune
from chunktune.core.tokens import (
    CHAT_TOKENS_BASE,
    CHAT_TOKENS_PER_MESSAGE,
    count_chat_tokens,
    count_tokens,
    min_chat_tokens,
)
from chunktune.load.prompts import PromptSynth


@pytest.mark.parametrize(("text", "n"), [
    ("", 0), ("hello", 1), ("Hello, world!", 4), ("a.b", 3), ("  spaced   out  ", 2),
    ("don't", 3), ("x1_y2 z", 2), ("...", 3), ("naïve café", 2), ("(1+2)=3", 7),
])
def test_count_tokens(text: str, n: int) -> None:
    assert count_tokens(text) == n


def test_count_chat_tokens() -> None:
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    assert count_chat_tokens(msgs) == 3 + 2 + 2 * CHAT_TOKENS_PER_MESSAGE + CHAT_TOKENS_BASE
    parts = [{"role": "user", "content": [{"type": "text", "text": "one two"},
                                          {"type": "image_url", "image_url": {"url": "x"}}]}]
    assert count_chat_tokens(parts) == 2 + 4 + 3
    assert count_chat_tokens([]) == CHAT_TOKENS_BASE
    assert count_chat_tokens([{"role": "assistant", "content": None}]) == 4 + 3


def test_text_has_exact_length() -> None:
    s = PromptSynth(seed=7)
    rng = random.Random(1)
    for n in [*range(1, 40), 100, 511, 4096, 32000, 70000, rng.randint(1, 20000)]:
        assert count_tokens(s.text(n, key=n)) == n


def test_chat_and_token_ids_have_exact_length() -> None:
    s = PromptSynth(seed=1)
    for n in (8, 9, 50, 1000):
        assert count_chat_tokens(s.messages(n, key=3)) == n
    assert count_chat_tokens(s.messages(3, key=3)) == min_chat_tokens() == 8
    for n in (1, 8, 9, 70000):
        ids = s.token_ids(n, key=5)
        assert len(ids) == n and all(1000 <= i < 4000 for i in ids)
    with pytest.raises(ValueError):
        s.text(0)


def test_deterministic_and_varied() -> None:
    a, b = PromptSynth(seed=3), PromptSynth(seed=3)
    assert a.text(300, key=9) == b.text(300, key=9)
    assert a.token_ids(300, key=9) == b.token_ids(300, key=9)
    # Different requests (keys) or seeds differ from their first words on: no prefix sharing.
    heads = {" ".join(a.text(300, key=k).split()[:8]) for k in range(500)}
    assert len(heads) == 500
    assert a.text(300, key=1) != PromptSynth(seed=4).text(300, key=1)
    # Shorter prompts of the same request are not prefixes of longer ones past the opening.
    assert a.text(20, key=1).split()[:8] == a.text(2000, key=1).split()[:8]


def test_same_text_in_another_process() -> None:
    code = ("from chunktune.load.prompts import PromptSynth; "
            "print(PromptSynth(11).text(64, key=5))")
    env = {**os.environ, "PYTHONPATH": str(Path(chunktune.__file__).parents[1])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env).stdout.strip()
    assert out == PromptSynth(11).text(64, key=5)


def _tokens(text: str) -> list[str]:
    import re

    return re.findall(r"\w+|[^\w\s]", text)


def test_a_shared_opening_is_the_same_tokens_in_every_prompt_that_names_it() -> None:
    """Prompts given one opening (a key and a length) agree on exactly those first tokens,
    differ right after, and keep their exact lengths; another opening's key shares nothing;
    a prompt shorter than the opening is all opening."""
    s = PromptSynth(seed=5)
    a, b = s.text(500, 1, ("0/1", 200)), s.text(300, 2, ("0/1", 200))
    ta, tb = _tokens(a), _tokens(b)
    assert (len(ta), len(tb)) == (500, 300) == (count_tokens(a), count_tokens(b))
    assert ta[:200] == tb[:200] and ta[200:208] != tb[200:208]
    other = _tokens(s.text(500, 1, ("0/2", 200)))
    assert other[:8] != ta[:8]
    assert _tokens(s.text(150, 3, ("0/1", 200))) == ta[:150]
    # no opening: what the request alone gives
    assert s.text(300, 2) == s.text(300, 2, None) and _tokens(s.text(300, 2))[:8] != tb[:8]
    ids = [s.token_ids(n, k, ("x", 128)) for n, k in ((500, 1), (400, 2))]
    assert [len(x) for x in ids] == [500, 400] and ids[0][:128] == ids[1][:128]
    assert ids[0][128:136] != ids[1][128:136]
    chats = [s.messages(100, k, ("c", 50)) for k in (1, 2)]
    assert [count_chat_tokens(m) for m in chats] == [100, 100]
    heads = [_tokens(m[0]["content"]) for m in chats]
    assert heads[0][:50] == heads[1][:50] and heads[0][50:58] != heads[1][50:58]
