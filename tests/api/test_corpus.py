"""Admission refuses what it can know: the corpus of bad manifests (``tests/api/corpus.py``)
against the generated CRD (schema + CEL, as the API server checks them) and against ``chunktune
validate``. Targets (issue 12): at least 90 manifests; at least 90% refused by the CRD; every one
refused by ``chunktune validate`` with the field named; nothing crashes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from chunktune.api.cli import main_validate
from chunktune.api.reader import validate
from tests.api.admission import names, refusals
from tests.api.corpus import CORPUS, YAML_BOMBS, Bad, BadYaml, alias_bomb

pytest.importorskip("celpy")


def test_corpus_is_big_and_distinct() -> None:
    assert len(CORPUS) >= 90
    assert len({b.id for b in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize("bad", CORPUS, ids=[b.id for b in CORPUS])
def test_validate_refuses_naming_the_field(bad: Bad) -> None:
    problems = validate(bad.manifest())
    assert any(names(path, bad.field) for path, _ in problems), problems


def test_crd_refuses_at_least_90_percent(capsys: pytest.CaptureFixture[str]) -> None:
    found = {b.id: refusals(b.manifest(), b.field) for b in CORPUS}
    admitted = [b.id for b in CORPUS if not found[b.id]]
    on_field = sum(any(names(p, b.field) for p, _ in found[b.id]) for b in CORPUS)
    n = len(CORPUS)
    with capsys.disabled():
        print(f"\ncorpus: {n} bad manifests; CRD schema+CEL refuses {n - len(admitted)} "
              f"({(n - len(admitted)) / n:.0%}), {on_field} on the named field; admitted: "
              f"{', '.join(admitted) or 'none'}")
    assert (n - len(admitted)) / n >= 0.9, admitted


REVIEW = [b for b in CORPUS if b.id.startswith("review-")]


@pytest.mark.parametrize("bad", REVIEW, ids=[b.id for b in REVIEW])
def test_the_reviews_examples_are_refused_by_both(bad: Bad) -> None:
    """Findings 7 and 8 of issue 12, one by one."""
    why = refusals(bad.manifest(), bad.field)
    assert any(names(p, bad.field) for p, _ in why), why
    assert any(names(p, bad.field) for p, _ in validate(bad.manifest()))


@pytest.mark.parametrize("depth", [100, 5000])
def test_deeply_nested_yaml_is_a_clear_error(tmp_path: Path, depth: int) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("apiVersion: chunktune.dev/v1alpha1\nkind: ChunkedPrefillTuning\n"
                    "metadata: {name: x}\nspec:\n  engine:\n    modelConfig: "
                    + "[" * depth + "]" * depth + "\n")
    result = subprocess.run([sys.executable, "-m", "chunktune", "validate", str(path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and "RecursionError" not in result.stderr
    assert "nested" in result.stderr and ("spec.engine.modelConfig" in result.stderr
                                          or str(path) in result.stderr)


def test_yaml_nesting_is_bounded_before_the_scanner_spends_time_on_it() -> None:
    """A run of opening brackets is refused before PyYAML scans it (its scanner's time grows
    with the square of the open levels: about a second of CPU for one such line, a flaky
    hostile-file test on a busy machine); nesting interleaved with values is refused while
    composing past MAX_DEPTH; nesting below it loads."""
    import time

    from chunktune.core import yamlsafe
    from chunktune.core.errors import SpecError

    start = time.process_time()
    for text in ("x: " + "[" * 20_000 + "]" * 20_000 + "\n",
                 "x: " + "{a: " * 5_000 + "1" + "}" * 5_000 + "\n",
                 "x: " + "[ \n" * 150 + "]" * 150 + "\n"):
        with pytest.raises(SpecError, match="nested too deeply to read"):
            yamlsafe.load(text, "deep.yaml")
    assert time.process_time() - start < 0.5
    interleaved = "x: " + "[1, " * (yamlsafe.MAX_DEPTH + 1) + "]" * (yamlsafe.MAX_DEPTH + 1)
    with pytest.raises(SpecError, match="nested too deeply to read"):
        yamlsafe.load_all(interleaved, "deep.yaml")
    ok = yamlsafe.load("x: " + "[" * 90 + "1" + "]" * 90 + "\n", "ok.yaml")
    ok = ok["x"]
    for _ in range(90):
        ok = ok[0]
    assert ok == 1


def test_deeply_nested_mapping_is_refused_without_recursion() -> None:
    deep: dict[str, object] = {}
    node = deep
    for _ in range(50_000):
        node["a"] = {}
        node = node["a"]  # type: ignore[assignment]
    m = CORPUS[0].manifest()
    m["spec"]["engine"]["modelConfig"] = deep
    [(path, message)] = validate(m)
    assert path == "spec.engine.modelConfig" and "nested more than 64 levels" in message


def test_validate_prints_the_field_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    import yaml

    bad = next(b for b in CORPUS if b.id == "review-newline-served-name")
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(bad.manifest()))
    assert main_validate(path) == 1
    err = capsys.readouterr().err
    assert "spec.engine.servedModelName must be a model name" in err
    assert "'llama\\nINJECTED'" in err


def _valid_manifests() -> list[tuple[str, dict[str, object]]]:
    import yaml

    from chunktune.api.reader import parse_manifest
    from tests.api.factories import EXAMPLES, quickstart, vllm_manifest

    out: list[tuple[str, dict[str, object]]] = [("quickstart", quickstart()),
                                                ("vllm", vllm_manifest())]
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "ChunkedPrefillTuning":
                out.append((path.name, doc))
    # (relative files, such as a trace's, are the examples' own)
    out += [(f"{name} (defaults filled in)", parse_manifest(m, EXAMPLES).to_manifest())
            for name, m in list(out) if not validate(m, EXAMPLES)]
    return out


@pytest.mark.parametrize(("name", "manifest"), _valid_manifests(),
                         ids=[n for n, _ in _valid_manifests()])
def test_valid_manifests_pass_schema_and_cel(name: str, manifest: dict[str, object]) -> None:
    """No rule refuses a manifest the validator accepts: the examples as written and with
    every default filled in (what the operator writes back)."""
    from tests.api.factories import EXAMPLES

    assert validate(manifest, EXAMPLES) == []
    assert refusals(manifest) == []


WEIRD: list[object] = [None, [], {}, "", "x" * 100_000, -1, 2**70, 1e308, float("nan"), True,
                       {"a": [{"b": None}]}, ["--flag"] * 3, "\x00\n\t", "../../etc/passwd"]


def _paths(value: object, path: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    out = [path] if path else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*path, i))
    return out


def test_no_value_anywhere_crashes_validate() -> None:
    """Every field of two valid manifests, replaced by each of a set of hostile values: the
    validator reports problems (or accepts), never raises."""
    import copy

    from tests.api.factories import quickstart, vllm_manifest

    checked = 0
    for base in (quickstart(), vllm_manifest()):
        for path in _paths(base):
            for value in WEIRD:
                m = copy.deepcopy(base)
                node = m
                for key in path[:-1]:
                    node = node[key]  # type: ignore[index]
                node[path[-1]] = copy.deepcopy(value)  # type: ignore[index]
                problems = validate(m)
                assert all(isinstance(p, str) and isinstance(msg, str) and len(msg) < 2000
                           for p, msg in problems), (path, value)
                checked += 1
    assert checked > 500


@pytest.mark.parametrize("bad", YAML_BOMBS, ids=[b.id for b in YAML_BOMBS])
def test_alias_bombs_are_refused_naming_the_file(bad: BadYaml, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 25: a billion laughs is refused while it is read (the test's timeout would catch
    the minutes that expanding it takes); ``bench/faults.py --yaml`` times it."""
    path = tmp_path / "bomb.yaml"
    path.write_text(bad.text)
    if bad.kind == "manifest":
        assert main_validate(path) == 1
        err = capsys.readouterr().err
        assert bad.words in err and str(path) in err, err
        return
    from chunktune.core.errors import SpecError
    from chunktune.core.workload import load_profile

    with pytest.raises(SpecError, match=bad.words) as info:
        load_profile(path)
    assert info.value.problems[0][0] == "--workload" and "bomb.yaml" in str(info.value)


def test_tune_refuses_an_alias_bomb(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(YAML_BOMBS[0].text)
    result = subprocess.run([sys.executable, "-m", "chunktune", "tune", str(path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "alias bomb" in result.stderr and "Traceback" not in result.stderr


def test_aliases_in_moderation_still_load() -> None:
    from chunktune.core import yamlsafe

    text = "base: &b {a: 1, b: [1, 2]}\nx: *b\ny: [*b, *b]\n" + alias_bomb(levels=3, fanout=9)
    doc = yamlsafe.load(text, "ok.yaml")
    assert doc["y"][1] == {"a": 1, "b": [1, 2]} and len(doc["l2"]) == 9
