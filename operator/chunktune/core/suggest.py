"""Hints ("did you mean ...?") for misspelt names."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable


def to_camel(name: str) -> str:
    """``max_trials`` / ``max-trials`` -> ``maxTrials``."""
    head, *rest = re.split(r"[_-]", name)
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def closest(name: str, choices: Iterable[str]) -> str | None:
    """The choice ``name`` most likely meant, or ``None`` when nothing is close.

    Spelling variants count first (``max_trials`` or ``maxtrials`` for ``maxTrials``), then
    edit similarity."""
    options = list(choices)
    folded = {re.sub(r"[-_]", "", c).lower(): c for c in options}
    key = re.sub(r"[-_]", "", name).lower()
    if key in folded:
        return folded[key]
    camel = to_camel(name)
    if camel in options:
        return camel
    prefixed = [c for c in options if c.lower().startswith(name.lower())]
    if len(name) >= 3 and len(prefixed) == 1:
        return prefixed[0]
    hits = difflib.get_close_matches(name, options, n=1, cutoff=0.75)
    if not hits:
        lower = {c.lower(): c for c in options}
        hits = [lower[h] for h in difflib.get_close_matches(name.lower(), lower, n=1, cutoff=0.7)]
    return hits[0] if hits else None
