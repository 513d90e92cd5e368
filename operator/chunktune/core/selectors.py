"""Prometheus label selectors as a user writes them (``{model_name="llama"}``): parsed and
checked once, for the manifest (``spec.workload.fromPrometheus.selector``, whose CRD pattern is
:data:`SELECTOR_PATTERN`) and for the queries (:mod:`chunktune.metrics.promql`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_LABEL = r"[A-Za-z_][A-Za-z0-9_]*"
_VALUE = r'"(?:[^"\\]|\\.)*"' + "|" + r"'(?:[^'\\]|\\.)*'"
_MATCHER = re.compile(rf"\s*({_LABEL})\s*(=~|!~|!=|=)\s*({_VALUE})\s*(?:,|$)")
_ONE = rf" *{_LABEL} *(=~|!~|!=|=) *({_VALUE}) *"
#: The forms a selector may take, for the CRD: matchers separated by commas, with or without
#: braces (a trailing comma allowed).
SELECTOR_PATTERN = rf"^ *(\{{({_ONE}(,{_ONE})*,? *)?\}}|{_ONE}(,{_ONE})*,?) *$"


@dataclass(frozen=True)
class LabelSelector:
    """A user's label matchers (``{model_name="llama",namespace=~"prod|canary"}``), checked
    and kept in their PromQL form."""

    matchers: tuple[tuple[str, str, str], ...] = ()
    """``(label, operator, quoted value)`` each."""

    @classmethod
    def parse(cls, text: str) -> LabelSelector:
        """Matchers with or without braces; raises ``ValueError`` naming what is wrong."""
        body = text.strip()
        if body.startswith("{") != body.endswith("}"):
            raise ValueError(f"unbalanced braces in {text!r}; write it as "
                             '{model_name="llama"}')
        body = body.removeprefix("{").removesuffix("}").strip()
        parts: list[tuple[str, str, str]] = []
        pos = 0
        while pos < len(body):
            m = _MATCHER.match(body, pos)
            if m is None:
                raise ValueError(f"cannot read the label matchers {text!r} at "
                                 f"{body[pos:pos + 20]!r}; write them as PromQL does: "
                                 'label="value", label=~"regex", label!="value"')
            if m.group(1) == "__name__":
                raise ValueError(f"must not match __name__ (got {text!r}): the metric names "
                                 "are vLLM's, chosen by chunktune")
            parts.append((m.group(1), m.group(2), m.group(3)))
            pos = m.end()
        return cls(tuple(parts))

    def labels(self) -> list[str]:
        """The label names matched, in order, once each."""
        return list(dict.fromkeys(label for label, _, _ in self.matchers))

    def text(self) -> str:
        return ",".join(f"{label}{op}{value}" for label, op, value in self.matchers)

    def __str__(self) -> str:
        return "{" + self.text() + "}"


__all__ = ["SELECTOR_PATTERN", "LabelSelector"]
