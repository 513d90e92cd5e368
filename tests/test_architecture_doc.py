"""docs/architecture.md tells the truth about the import contracts and the package's rooms:
its contract table has a row per contract of ``.importlinter`` (and none other), each layers
contract's stack written as the configuration has it, each protected contract's allowed
importers named; its rooms name every module of their package and every error class."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import pytest

import chunktune
from tests.core.test_errors import error_classes

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(chunktune.__file__).parent
DOC = (ROOT / "docs" / "architecture.md").read_text()
PREFIX = "importlinter:contract:"


def contracts() -> dict[str, configparser.SectionProxy]:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    return {name.removeprefix(PREFIX): config[name] for name in config.sections()
            if name.startswith(PREFIX)}


def table() -> dict[str, str]:
    """Contract id -> the row's "what it says" cell (``\\|`` unescaped)."""
    start = DOC.index("### The contracts, and why")
    rows = {}
    for line in DOC[start:DOC.index("\n## ", start)].splitlines():
        m = re.match(r"\| `([\w-]+)` \| (.*?) \| .* \|$", line)
        if m:
            rows[m.group(1)] = m.group(2).replace("\\|", "|")
    return rows


def lines(value: str) -> list[str]:
    return [x.strip() for x in value.strip().splitlines() if x.strip()]


def stack(layers: list[str]) -> str:
    """The layers as the table writes them: ``a > b > (c | d)``."""
    return " > ".join(f"({x})" if "|" in x else x for x in layers)


def test_the_table_has_a_row_per_contract_and_no_other() -> None:
    assert set(table()) == set(contracts())


@pytest.mark.parametrize("name", sorted(n for n, c in contracts().items()
                                        if c.get("type") == "layers"))
def test_a_layers_row_states_the_configured_stack(name: str) -> None:
    assert f"`{stack(lines(contracts()[name]['layers']))}`" in table()[name]


@pytest.mark.parametrize("name", sorted(n for n, c in contracts().items()
                                        if c.get("type") == "protected"))
def test_a_protected_row_names_every_allowed_importer(name: str) -> None:
    for module in lines(contracts()[name]["allowed_importers"]):
        assert f"`{module.removeprefix('chunktune.')}`" in table()[name], module
    for module in lines(contracts()[name]["protected_modules"]):
        assert f"`{module}`" in table()[name], module


def test_every_acyclic_contract_covers_the_whole_package() -> None:
    acyclic = [c for c in contracts().values() if c.get("type") == "acyclic_siblings"]
    assert acyclic and any(lines(c["ancestors"]) == ["chunktune"] for c in acyclic)


def room(package: str) -> str:
    """The paragraph of docs/architecture.md about ``package`` (from its bold name on)."""
    m = re.search(rf"\*\*{package}\*\*\s+\(`{package}/`\)", DOC)
    assert m is not None, f"docs/architecture.md has no room for {package}"
    return DOC[m.start():DOC.find("\n\n", m.start())]


@pytest.mark.parametrize("package", ["core", "api", "backends", "load", "metrics", "k8s"])
def test_a_room_names_every_module_of_its_package(package: str) -> None:
    text = room(package)
    modules = sorted(p.stem for p in (PACKAGE / package).glob("*.py") if p.stem != "__init__")
    missing = [m for m in modules if f"`{m}`" not in text and f"`{m}." not in text]
    assert not missing, f"docs/architecture.md's {package} room does not name {missing}"


def test_the_error_list_names_every_error_class() -> None:
    start = DOC.index("Every error chunktune raises on purpose")
    text = DOC[start:DOC.find("\n\n", start)]
    # a module's private error (core.infile._Refused) never leaves it
    missing = sorted(e for e in error_classes() if not e.startswith("_")
                     and f"`{e}`" not in text and f"`core.errors.{e}`" not in text)
    assert not missing, f"docs/architecture.md's error list lacks {missing}"
