"""The chart's CRD is exactly what ``chunktune crd`` generates from the spec models.

Regenerate it after changing the models with::

    chunktune crd -o charts/chunktune/crds/chunkedprefilltunings.chunktune.dev.yaml
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from chunktune.api.crd import CRD_NAME, crd_yaml, to_json_schema
from tests.charts import CHART_DIR, KUBE_VERSION, REPO

CRD_FILE = CHART_DIR / "crds" / f"{CRD_NAME}.yaml"
REGENERATE = f"chunktune crd -o {CRD_FILE.relative_to(REPO)}"


def test_crd_file_is_the_generated_crd() -> None:
    shipped, generated = CRD_FILE.read_text(), crd_yaml()
    if shipped != generated:
        diff = "".join(list(difflib.unified_diff(
            shipped.splitlines(True), generated.splitlines(True),
            "charts (shipped)", "chunktune crd (generated)"))[:60])
        pytest.fail(f"{CRD_FILE.name} is out of date; regenerate it with\n\n    {REGENERATE}\n\n"
                    f"{diff}")


def test_the_documented_command_regenerates_it(tmp_path: Path) -> None:
    from chunktune.cli import main

    out = tmp_path / CRD_FILE.name
    assert main(["crd", "-o", str(out)]) == 0
    assert out.read_bytes() == CRD_FILE.read_bytes()


def test_the_chart_readme_documents_the_command() -> None:
    assert REGENERATE in (CHART_DIR / "README.md").read_text()


def test_crd_file_is_one_valid_crd() -> None:
    docs = [d for d in yaml.safe_load_all(CRD_FILE.read_text()) if d]
    assert len(docs) == 1
    crd = docs[0]
    kubernetes_validate.validate(crd, KUBE_VERSION, strict=True)
    assert crd["metadata"]["name"] == CRD_NAME
    assert crd["spec"]["names"]["shortNames"] == ["cpt"]  # kubectl get cpt


def _manifests() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted((REPO / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "ChunkedPrefillTuning":
                out.append((path.name, doc))
    return out


@pytest.mark.parametrize(("name", "manifest"), _manifests(), ids=[n for n, _ in _manifests()])
def test_examples_fit_the_shipped_crd(name: str, manifest: dict[str, Any]) -> None:
    """What `kubectl apply -f examples/...` sends passes the shipped CRD's schema (CEL rules
    are not evaluated here; chunktune validate checks those)."""
    crd = yaml.safe_load(CRD_FILE.read_text())
    (version,) = crd["spec"]["versions"]
    assert manifest["apiVersion"] == f"{crd['spec']['group']}/{version['name']}"
    schema = to_json_schema(version["schema"]["openAPIV3Schema"])
    errors = sorted(jsonschema.Draft4Validator(schema).iter_errors(manifest), key=str)
    assert not errors, f"{name}: " + "; ".join(
        f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)
