"""Prompt synthesis under the project's one token-counting rule (:mod:`chunktune.core.tokens`).

The load driver synthesizes prompts of exactly N tokens under :func:`count_tokens` /
:func:`count_chat_tokens`, the same functions the simulator counts the prompts it receives with.

Synthesized prompts are deterministic for ``(seed, key)`` (``key`` is the request id), and two
keys differ from their first words on, so a prefix cache never matches between requests of a run
unless they are given the same opening (``prefix``: a key and a length, a traffic class's
``shared_prefix``): then their first tokens are that opening's, the same in every request
that names it, and the rest their own.
The words are common English words and the punctuation is ``,``/``.``-like, which most BPE
tokenizers encode as one token each with a leading space; against a real vLLM the count under the
model's tokenizer is therefore close to N (typically within 10-30 %), not exact. Use
:meth:`PromptSynth.token_ids` (``--token-ids``) when the exact count matters on a real server.
"""

from __future__ import annotations

import random

from chunktune.core.tokens import CHAT_TOKENS_BASE, CHAT_TOKENS_PER_MESSAGE

__all__ = ["PromptSynth"]

# Common English words that BPE vocabularies hold as single tokens (with a leading space).
_WORD_TEXT = (
    "the of and to in is was for that on as with by he at from his it an were are which this be "
    "has had one not but have they or first new their after all time two who can also into been "
    "more other only its when over year most some years three she her may such many city would "
    "there during where under people world four then about made known part him up used state "
    "while between these both them well five through than later because until no before school "
    "being will like second each did called work life any what out since film long same great "
    "way group day end our back high name small early much family old several against around "
    "book game form team line number water house place music point power order story country "
    "field light river road south north east west white black green market land center course "
    "change report system value model level study table plan price room sound color letter voice "
    "paper party board heart child night money month week today maybe often never always again "
    "still ever every very quite rather simply just even almost already quickly slowly together "
    "above below along among behind beyond inside outside within without across toward upon "
    "make take give find keep tell show hear play move live bring write stand learn build stay "
    "open close start turn carry hold watch follow speak read spend grow offer share reach"
)
_WORDS = tuple(_WORD_TEXT.split())
_PUNCT = (",", ",", ",", ".", ".", ";", ":", "?")
_POOL_SIZE = 1 << 16
_HEAD_WORDS = 8  # fresh random words per prompt: 256**8 openings, so no two requests share one
#: Token ids of ``--token-ids`` prompts: ordinary tokens in any vocabulary of 4096 ids or more
#: (the tiny test model's is 4096; real models' 32k-256k).
_IDS = (1000, 4000)


def _build_pool(seed: int) -> tuple[str, list[int], list[int]]:
    """A long word stream: pieces of exactly one token each, as text (doubled, for wrap-around
    slicing), the character offset where each piece starts, and one token id per piece."""
    rng = random.Random(seed)
    pieces: list[str] = []
    prev_punct = True
    for _ in range(_POOL_SIZE):
        if not prev_punct and rng.random() < 0.09:
            pieces.append(rng.choice(_PUNCT))  # attached to the word before: its own token
            prev_punct = True
        else:
            pieces.append(" " + rng.choice(_WORDS))
            prev_punct = False
    text = "".join(pieces) * 2
    offsets = [0]
    for p in pieces * 2:
        offsets.append(offsets[-1] + len(p))
    ids = [rng.randrange(*_IDS) for _ in range(_POOL_SIZE)] * 2
    return text, offsets, ids


_POOL: tuple[str, list[int], list[int]] | None = None


def _pool() -> tuple[str, list[int], list[int]]:
    global _POOL
    if _POOL is None:
        _POOL = _build_pool(0x5EED)
    return _POOL


class PromptSynth:
    """Deterministic prompts of an exact length under :func:`count_tokens`.

    ``PromptSynth(seed).text(n, key)`` is the same string on every call and in every process;
    different keys (request ids) give different openings. Building a 32k-token prompt takes
    well under a millisecond (a slice of a pre-built word stream), so it can run inside the
    load generator's event loop without stalling other requests' timing.
    """

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        _pool()

    def _rng(self, key: int) -> random.Random:
        return random.Random(f"chunktune-prompt:{self.seed}:{key}")

    def _text(self, n: int, rng: random.Random) -> str:
        """``n`` tokens (``n >= 1``) from ``rng``: fresh words, then a slice of the stream."""
        head = " ".join(rng.choice(_WORDS) for _ in range(min(n, _HEAD_WORDS)))
        rest = n - min(n, _HEAD_WORDS)
        if not rest:
            return head
        text, offsets, _ = _pool()
        parts = [head]
        start = rng.randrange(_POOL_SIZE)
        while rest:
            m = min(rest, _POOL_SIZE)
            parts.append(text[offsets[start]:offsets[start + m]])
            rest -= m
            start = 0
        return "".join(parts)

    def _ids(self, n: int, rng: random.Random) -> list[int]:
        head = [rng.randrange(*_IDS) for _ in range(min(n, _HEAD_WORDS))]
        rest = n - len(head)
        _, _, ids = _pool()
        start = rng.randrange(_POOL_SIZE)
        while rest:
            m = min(rest, _POOL_SIZE)
            head.extend(ids[start:start + m])
            rest -= m
            start = 0
        return head

    def _split(self, n: int, key: int, prefix: tuple[str, int] | None
               ) -> tuple[tuple[random.Random, int] | None, tuple[random.Random, int] | None]:
        """The opening's generator and length (None without one), and the request's own."""
        if n < 1:
            raise ValueError(f"a prompt needs at least one token (got {n})")
        shared = min(max(prefix[1], 0), n) if prefix is not None else 0
        opening = (random.Random(f"chunktune-prefix:{self.seed}:{prefix[0]}"), shared) \
            if prefix is not None and shared else None
        own = (self._rng(key), n - shared) if n > shared else None
        return opening, own

    def text(self, n: int, key: int = 0, prefix: tuple[str, int] | None = None) -> str:
        """A text of exactly ``n`` tokens (``n >= 1``); with ``prefix`` (an opening's key and
        length) its first tokens are that opening's."""
        return " ".join(self._text(k, rng) for rng, k in
                        (part for part in self._split(n, key, prefix) if part is not None))

    def messages(self, n: int, key: int = 0,
                 prefix: tuple[str, int] | None = None) -> list[dict[str, str]]:
        """One user message whose chat prompt is ``n`` tokens under :func:`count_chat_tokens`.

        A chat prompt cannot be shorter than :func:`min_chat_tokens` (8); smaller ``n`` gives
        that minimum. An opening (``prefix``) starts the message's content: the template's
        tokens before it are the same in every request too.
        """
        content = max(1, n - CHAT_TOKENS_PER_MESSAGE - CHAT_TOKENS_BASE)
        return [{"role": "user", "content": self.text(content, key, prefix)}]

    def token_ids(self, n: int, key: int = 0,
                  prefix: tuple[str, int] | None = None) -> list[int]:
        """``n`` token ids in [1000, 4000), for servers that take ``prompt`` as ids (exact);
        with ``prefix``, the opening's ids first."""
        out: list[int] = []
        for part in self._split(n, key, prefix):
            if part is not None:
                out.extend(self._ids(part[1], part[0]))
        return out
