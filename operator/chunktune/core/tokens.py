"""The project's one token-counting rule.

The simulator has no tokenizer, so chunktune defines what "N prompt tokens" means once, here, and
both sides use it: the load driver (:mod:`chunktune.load.prompts`) synthesizes prompts of exactly
N tokens under :func:`count_tokens` / :func:`count_chat_tokens`, and the simulator counts the
prompts it receives with the same functions (a token-id list counts as its length).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "CHAT_TOKENS_BASE",
    "CHAT_TOKENS_PER_MESSAGE",
    "content_text",
    "count_chat_tokens",
    "count_tokens",
    "min_chat_tokens",
]

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")

#: Template tokens each chat message adds (role markers and separators).
CHAT_TOKENS_PER_MESSAGE = 4
#: Template tokens a chat prompt adds once (the assistant turn's header).
CHAT_TOKENS_BASE = 3


def count_tokens(text: str) -> int:
    """Tokens in ``text`` under chunktune's rule: one per word, one per punctuation character.

    A word is a maximal run of word characters (``\\w+``: letters, digits, underscore); every
    other non-space character is a token of its own. So ``"Hello, world!"`` is 4 tokens and
    ``"a.b"`` is 3. Exactly ``len(re.findall(r"\\w+|[^\\w\\s]", text))``.
    """
    return len(_TOKEN_RE.findall(text))


def content_text(content: Any) -> str:
    """A message's text as the rule counts it: a string, or the text parts of an OpenAI
    content list joined with spaces."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):  # OpenAI content parts: [{"type": "text", "text": ...}]
        return " ".join(str(p.get("text", "")) for p in content
                        if isinstance(p, Mapping) and p.get("type", "text") == "text")
    return str(content)


def count_chat_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """Prompt tokens of a chat request: the messages' contents plus the chat template.

    ``sum(count_tokens(m["content"]) for m in messages) + 4 * len(messages) + 3``: each message
    costs :data:`CHAT_TOKENS_PER_MESSAGE` (4) template tokens on top of its content, and the
    prompt as a whole :data:`CHAT_TOKENS_BASE` (3). Content may be a string or a list of OpenAI
    text parts (``{"type": "text", "text": ...}``, joined with spaces); roles and names are not
    counted.
    """
    return (sum(count_tokens(content_text(m.get("content"))) for m in messages)
            + CHAT_TOKENS_PER_MESSAGE * len(messages) + CHAT_TOKENS_BASE)


def min_chat_tokens() -> int:
    """The shortest single-message chat prompt (one content token plus the template): 8."""
    return 1 + CHAT_TOKENS_PER_MESSAGE + CHAT_TOKENS_BASE
