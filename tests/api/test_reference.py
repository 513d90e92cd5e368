"""docs/reference.md is what the schema says: regenerated here and compared, so a field added,
removed or re-described in the models without regenerating the page fails CI."""

from __future__ import annotations

from pathlib import Path

from chunktune.api.cli import main_crd, reference_text
from chunktune.api.crd import openapi_schema
from chunktune.api.reference import collect_examples, render_reference

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference.md"
REGENERATE = "chunktune crd --reference --examples examples -o docs/reference.md"


def test_the_committed_reference_is_what_the_schema_renders() -> None:
    assert PAGE.read_text() == reference_text(ROOT / "examples"), (
        f"docs/reference.md is stale: run `{REGENERATE}`")


def test_every_spec_field_of_the_schema_has_an_entry() -> None:
    text = render_reference()

    def paths(node: dict, path: str) -> list[str]:
        out = []
        for name, field in (node.get("properties") or {}).items():
            out.append(f"{path}.{name}")
            inner = field.get("items") if field.get("type") == "array" else field
            suffix = "[]" if field.get("type") == "array" else ""
            if isinstance(inner, dict) and inner.get("properties"):
                out += paths(inner, f"{path}.{name}{suffix}")
        return out

    spec = paths(openapi_schema()["properties"]["spec"], "spec")
    assert len(spec) > 100
    missing = [p for p in spec if f"`{p}`" not in text]
    assert missing == []


def test_an_entry_gives_type_limits_example_and_description() -> None:
    examples = collect_examples([("examples/x.yaml", {"spec": {
        "budget": {"maxTrials": 20}, "searchSpace": [{"name": "max-num-seqs"}]}})])
    assert examples["spec.budget.maxTrials"] == (20, "examples/x.yaml")
    assert examples["spec.searchSpace[].name"] == ("max-num-seqs", "examples/x.yaml")
    text = render_reference(examples)
    entry = text.split("`spec.budget.maxTrials`", 1)[1].split("\n#", 1)[0]
    assert "*integer*" in entry and "Range >= 1" in entry
    assert "Example: `20` (examples/x.yaml)" in entry
    assert "trials" in entry.lower()  # the model's own description


def test_the_command_writes_the_page_and_refuses_a_missing_folder(tmp_path: Path,
                                                                 capsys: object) -> None:
    out = tmp_path / "ref.md"
    assert main_crd(out, reference=True, examples=ROOT / "examples") == 0
    assert out.read_text() == PAGE.read_text()
    assert main_crd(tmp_path / "x.md", reference=True, examples=tmp_path / "nope") == 1
    assert not (tmp_path / "x.md").exists()
