"""The one way chunktune reads YAML: PyYAML's safe loader, with a bound on alias expansion.

A YAML alias refers to an anchored node instead of repeating it. PyYAML builds the shared node
once, so nine anchors of nine aliases each (the "billion laughs") load in microseconds, into a
document that *expands* to 9**9 nodes: whatever walks it next (validation, a copy, a dump) runs
for minutes. :func:`load` and :func:`load_all` count, while composing, how many nodes every alias
stands for and refuse a document past :data:`MAX_ALIAS_NODES` with a :class:`SpecError`
naming the file and the fix, before anything walks it. Ordinary use of aliases (a shared
block of settings, a few times) stays far below the bound. Nesting too deep to read is refused
the same way, and so are a document of more than :data:`MAX_NODES` nodes, a key given twice in
one mapping (YAML would keep the last silently), ``.inf`` and ``.nan`` (no setting takes them)
and integers too long to read. Errors name the line and column, never the text there (PyYAML's
own messages quote the line). Manifests, workload profiles, traces and calibration files all
come through here, the files through :mod:`chunktune.core.infile`.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from chunktune.core import infile
from chunktune.core.errors import ChunktuneError, SpecError

#: The most nodes the aliases of one document may stand for, all expansions together.
MAX_ALIAS_NODES = 100_000
#: The most nodes one document may have (the largest shipped manifest has a few hundred, a
#: derived profile about a thousand); PyYAML composes this many in about a third of a second.
MAX_NODES = 10_000
#: The largest YAML file (manifest, profile) chunktune reads; the API server stores objects of
#: at most about 1.5 MiB.
MAX_YAML_BYTES = 2 * 2**20
#: The deepest nesting of collections a document may have (a manifest nests about six deep);
#: deeper is refused while composing, before Python's recursion gives out (~340 levels).
MAX_DEPTH = 100
#: More than :data:`MAX_DEPTH` flow collections opened in a row (``[[[[...``), found before
#: PyYAML scans them: its scanner keeps a possible key per open flow level within 1024
#: characters and walks them all at every token, about a second of CPU for such a line.
_FLOW_RUN = re.compile(r"[\[{](?:[ \t\r\n]*[\[{])*")


def _opens_too_deep(text: str) -> bool:
    """Whether ``text`` opens more than :data:`MAX_DEPTH` flow collections in a row (one
    linear pass: each run is matched whole, once)."""
    return any(len(m.group()) > MAX_DEPTH
               and m.group().count("[") + m.group().count("{") > MAX_DEPTH
               for m in _FLOW_RUN.finditer(text))


class AliasBomb(ChunktuneError, yaml.YAMLError):
    """The aliases of a document expand past :data:`MAX_ALIAS_NODES` (a :class:`yaml.YAMLError`
    too, raised while composing; :func:`load` turns it into a :class:`SpecError`)."""


class TooDeep(ChunktuneError, yaml.YAMLError):
    """The document nests collections deeper than :data:`MAX_DEPTH` (raised while composing;
    :func:`load` turns it into a :class:`SpecError`)."""


class _BoundedLoader(yaml.SafeLoader):
    """:class:`yaml.SafeLoader` that keeps each node's expanded size and refuses a document
    whose aliases stand for more than :data:`MAX_ALIAS_NODES` nodes."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._sizes: dict[int, int] = {}
        self._aliased = 0
        self._nodes = 0
        self._depth = 0

    def compose_document(self) -> Node | None:
        self._sizes.clear()
        self._aliased = 0
        self._nodes = 0
        self._depth = 0
        return super().compose_document()

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise TooDeep(f"nests deeper than {MAX_DEPTH} levels")
            return self._compose_bounded(parent, index)
        finally:
            self._depth -= 1

    def _compose_bounded(self, parent: Node | None, index: int) -> Node | None:
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
        self._nodes += 1
        if self._nodes > MAX_NODES:
            mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
            raise AliasBomb(f"has more than {MAX_NODES} values (at line {mark.line + 1}); "
                            "give a smaller document")
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


    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key, _ in node.value:
            if isinstance(key, ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                k = self.construct_object(key)
                try:
                    dup = k in seen
                    seen.add(k)
                except TypeError:  # an unhashable key: PyYAML refuses it itself
                    continue
                if dup:
                    raise ConstructorError(None, None, "a key given twice in one mapping "
                                           "(YAML would keep only the last)", key.start_mark)
        return super().construct_mapping(node, deep)

    def construct_yaml_float(self, node: ScalarNode) -> float:
        value: float = super().construct_yaml_float(node)
        if not math.isfinite(value):
            raise ConstructorError(None, None, "not a finite number (.inf and .nan are taken "
                                   "nowhere)", node.start_mark)
        return value

    def construct_yaml_int(self, node: ScalarNode) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError as e:  # more digits than Python reads (4300)
            raise ConstructorError(None, None, "an integer too long to read",
                                   node.start_mark) from e


_BoundedLoader.add_constructor("tag:yaml.org,2002:float",
                               _BoundedLoader.construct_yaml_float)
_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)

#: A quoted text in PyYAML's message (an alias or tag name, a found token): not echoed.
_QUOTED = re.compile(r"'[^'\s]{2,}'|\"[^\"\s]{2,}\"")


def _refusal(e: yaml.YAMLError, source: str) -> SpecError:
    if isinstance(e, TooDeep):
        return _too_deep(source)
    if isinstance(e, AliasBomb):
        return SpecError(str(e), field=source)
    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        what = _QUOTED.sub("...", e.problem or e.context or "a syntax error")
        return SpecError(f"is not valid YAML{where}: {what}", field=source)
    if isinstance(e, yaml.reader.ReaderError):
        return SpecError(f"is not valid YAML (character {e.position + 1}): a control "
                         "character YAML does not allow", field=source)
    return SpecError(f"is not valid YAML: {type(e).__name__}", field=source)


def _too_deep(source: str) -> SpecError:
    return SpecError("is nested too deeply to read", field=source)


def load(text: str, source: str) -> Any:
    """The one document in ``text``; ``source`` (a file, a field) is named in a
    :class:`SpecError` for YAML that is invalid, nested too deeply or an alias bomb."""
    if _opens_too_deep(text):
        raise _too_deep(source)
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # a SafeLoader
    except yaml.YAMLError as e:
        raise _refusal(e, source) from e
    except RecursionError:  # its traceback (the parser's thousand frames) is dropped
        raise _too_deep(source) from None


def load_all(text: str, source: str) -> list[Any]:
    """Every document in ``text`` (empty ones left out), as :func:`load` reads one."""
    if _opens_too_deep(text):
        raise _too_deep(source)
    try:
        return [d for d in yaml.load_all(text, Loader=_BoundedLoader) if d is not None]
    except yaml.YAMLError as e:
        raise _refusal(e, source) from e
    except RecursionError:  # its traceback (the parser's thousand frames) is dropped
        raise _too_deep(source) from None


def read(path: str | Path, *, every: bool = False) -> Any:
    """The document (``every``: the list of documents, as :func:`load_all`) of the YAML file
    ``path``, read through :func:`chunktune.core.infile.read_text` (a regular file, at most
    :data:`MAX_YAML_BYTES`, UTF-8); every error names the path."""
    source = str(path)
    text = infile.read_text(path, field="", max_bytes=MAX_YAML_BYTES, name=source)
    return load_all(text, source) if every else load(text, source)


__all__ = ["MAX_ALIAS_NODES", "MAX_NODES", "MAX_YAML_BYTES", "AliasBomb", "load", "load_all",
           "read"]
