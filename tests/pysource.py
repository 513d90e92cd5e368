"""The package's source read as syntax trees, for the tests that check rules in the code.

CPython 3.11 keeps one recursion counter for building ``ast`` objects per interpreter, not per
thread (python/cpython gh-106905): an ``ast.parse`` while another thread of the test process
builds a tree can fail with ``SystemError: AST constructor recursion depth mismatch`` though
the source is sound (seen once in a full run under load). :func:`parse` tries that again; any
other error is the source's and is raised.
"""

from __future__ import annotations

import ast
from pathlib import Path

#: How many times a tree is built before the race above is taken for a real failure.
ATTEMPTS = 3


def parse(path: Path) -> ast.Module:
    """The syntax tree of the Python file ``path``."""
    text = path.read_text()
    for attempt in range(ATTEMPTS):
        try:
            return ast.parse(text, filename=str(path))
        except SystemError as e:
            if "recursion depth mismatch" not in str(e) or attempt == ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")
