"""Import rules of the operator (style guide, example 1): ``kopf`` is imported only in
``chunktune/k8s/``; the ``kubernetes`` client only there and in ``backends/kubernetes.py``."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.pysource import parse

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "chunktune"
ALLOWED = {"kopf": ("k8s/",), "kubernetes": ("k8s/", "backends/kubernetes.py")}


def _imports(path: Path) -> set[str]:
    tree = parse(path)
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def test_kopf_and_the_kubernetes_client_stay_in_their_layer() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for module, allowed in ALLOWED.items():
            if module in _imports(path) and not rel.startswith(allowed):
                offenders.append(f"{rel} imports {module}")
    assert offenders == []


def test_no_package_marker_in_the_source_root() -> None:
    assert not (PACKAGE.parent / "__init__.py").exists()
