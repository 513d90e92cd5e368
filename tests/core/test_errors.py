"""Every error class of the package derives from :class:`chunktune.core.errors.ChunktuneError`
(read from the source: importing every module would start Locust's monkey-patching)."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import chunktune
from tests.pysource import parse

PACKAGE = Path(chunktune.__file__).parent
BUILTIN_ERRORS = {n for n, v in vars(builtins).items()
                  if isinstance(v, type) and issubclass(v, BaseException)}


def _base_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def error_classes() -> dict[str, list[str]]:
    """Class name -> its base names, for every class of the package that derives from an
    exception (directly or through another class of the package)."""
    classes: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = [_base_name(b) for b in node.bases]
    errors: dict[str, list[str]] = {}
    grew = True
    while grew:
        grew = False
        for name, bases in classes.items():
            if name not in errors and any(b in BUILTIN_ERRORS or b in errors for b in bases):
                errors[name] = bases
                grew = True
    return errors


def test_every_error_derives_from_the_base() -> None:
    errors = error_classes()
    assert {"TwinError", "ClusterApiError", "PrometheusError", "FlagValueError", "ApiError",
            "LoadFailure", "SchemaError", "SpecError"} <= set(errors)
    rooted = {"ChunktuneError"}
    grew = True
    while grew:
        grew = False
        for name, bases in errors.items():
            if name not in rooted and any(b in rooted for b in bases):
                rooted.add(name)
                grew = True
    assert set(errors) - rooted == set(), "errors that do not derive from ChunktuneError"


def test_causes_are_kept() -> None:
    """``raise ... from None`` drops the cause; only a RecursionError's (a parser's thousand
    frames) is dropped, with the reason beside it."""
    dropped = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if "from None" in line and "RecursionError" not in " ".join(lines[max(0, i - 3):i]):
                dropped.append(f"{path.relative_to(PACKAGE)}:{i + 1}")
    assert dropped == []
