"""The one way chunktune reads YAML: PyYAML's safe loader, with a bound on alias expansion.

A YAML alias refers to an anchored node instead of repeating it. PyYAML builds the shared node
once, so nine anchors of nine aliases each (the "billion laughs") load in microseconds, into a
document that *expands* to 9**9 nodes: whatever walks it next (validation, a copy, a dump) runs
for minutes. :func:`load` and :func:`load_all` count, while composing, how many nodes every alias
stands for and refuse a document past :data:`MAX_ALIAS_NODES` with a :class:`SpecError`
naming the file and the fix, before anything walks it. Ordinary use of aliases (a shared
block of settings, a few times) stays far below the bound. Nesting too deep to read is refused
the same way. Manifests, workload profiles, traces and calibration files all come through
here.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, SequenceNode

from chunktune.core.errors import ChunktuneError, SpecError

#: The most nodes the aliases of one document may stand for, all expansions together.
MAX_ALIAS_NODES = 100_000


class AliasBomb(ChunktuneError, yaml.YAMLError):
    """The aliases of a document expand past :data:`MAX_ALIAS_NODES` (a :class:`yaml.YAMLError`
    too, raised while composing; :func:`load` turns it into a :class:`SpecError`)."""


class _BoundedLoader(yaml.SafeLoader):
    """:class:`yaml.SafeLoader` that keeps each node's expanded size and refuses a document
    whose aliases stand for more than :data:`MAX_ALIAS_NODES` nodes."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._sizes: dict[int, int] = {}
        self._aliased = 0

    def compose_document(self) -> Node | None:
        self._sizes.clear()
        self._aliased = 0
        return super().compose_document()

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        if self.check_event(AliasEvent):
            mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
            node = super().compose_node(parent, index)
            # NOTE: an alias of a node still being composed (a recursive document) counts 1
            self._aliased += self._sizes.get(id(node), 1)
            if self._aliased > MAX_ALIAS_NODES:
                raise AliasBomb(f"its aliases expand to more than {MAX_ALIAS_NODES} nodes "
                                f"(at line {mark.line + 1}): an alias bomb is refused; write "
                                "the values out, or use fewer aliases")
            return node
        node = super().compose_node(parent, index)
        if isinstance(node, SequenceNode):
            size = 1 + sum(self._sizes.get(id(c), 1) for c in node.value)
        elif isinstance(node, MappingNode):
            size = 1 + sum(self._sizes.get(id(k), 1) + self._sizes.get(id(v), 1)
                           for k, v in node.value)
        else:
            size = 1
        if node is not None:
            self._sizes[id(node)] = min(size, MAX_ALIAS_NODES + 1)
        return node


def _refusal(e: yaml.YAMLError, source: str) -> SpecError:
    if isinstance(e, AliasBomb):
        return SpecError(str(e), field=source)
    return SpecError(f"is not valid YAML: {e}", field=source)


def _too_deep(source: str) -> SpecError:
    return SpecError("is nested too deeply to read", field=source)


def load(text: str, source: str) -> Any:
    """The one document in ``text``; ``source`` (a file, a field) is named in a
    :class:`SpecError` for YAML that is invalid, nested too deeply or an alias bomb."""
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # a SafeLoader
    except yaml.YAMLError as e:
        raise _refusal(e, source) from e
    except RecursionError:  # its traceback (the parser's thousand frames) is dropped
        raise _too_deep(source) from None


def load_all(text: str, source: str) -> list[Any]:
    """Every document in ``text`` (empty ones left out), as :func:`load` reads one."""
    try:
        return [d for d in yaml.load_all(text, Loader=_BoundedLoader) if d is not None]
    except yaml.YAMLError as e:
        raise _refusal(e, source) from e
    except RecursionError:  # its traceback (the parser's thousand frames) is dropped
        raise _too_deep(source) from None


__all__ = ["MAX_ALIAS_NODES", "AliasBomb", "load", "load_all"]
