"""The generated CRD: structural, complete, and in agreement with the pydantic models."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from chunktune.api import parse_manifest, render_status
from chunktune.api.crd import build_crd, openapi_schema, to_json_schema
from chunktune.core.study_records import StudySummary, TrialRecord
from tests.api.factories import quickstart, vllm_manifest


def nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node with its path (properties, items, additionalProperties)."""
    yield path, node
    for k, v in node.get("properties", {}).items():
        yield from nodes(v, f"{path}.{k}")
    if isinstance(node.get("items"), dict):
        yield from nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from nodes(node["additionalProperties"], f"{path}.*")


def at(schema: dict[str, Any], path: str) -> dict[str, Any]:
    node = schema
    for part in path.split("."):
        node = node["items"] if part == "[]" else node["properties"][part]
    return node


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return build_crd()


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return openapi_schema()


def test_names_and_versions(crd: dict[str, Any]) -> None:
    s = crd["spec"]
    assert crd["metadata"]["name"] == "chunkedprefilltunings.chunktune.dev"
    assert s["group"] == "chunktune.dev" and s["scope"] == "Namespaced"
    assert s["names"] == {"kind": "ChunkedPrefillTuning", "listKind": "ChunkedPrefillTuningList",
                          "plural": "chunkedprefilltunings", "singular": "chunkedprefilltuning",
                          "shortNames": ["cpt"], "categories": ["chunktune"]}
    [v] = s["versions"]
    assert (v["name"], v["served"], v["storage"]) == ("v1alpha1", True, True)
    assert v["subresources"] == {"status": {}}


def test_printer_columns(crd: dict[str, Any]) -> None:
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    cols = {c["name"]: c["jsonPath"] for c in columns}
    assert cols == {
        "Phase": ".status.phase",
        "Trials": ".status.trialsSummary",
        "Best TTFT p99": ".status.best.metrics.ttft_p99",
        "Budget": ".status.best.parameters.max-num-batched-tokens",
        "Threshold": ".status.best.parameters.long-prefill-token-threshold",
        "Improvement": ".status.best.improvement",
        "Age": ".metadata.creationTimestamp",
    }


def test_schema_is_structural(schema: dict[str, Any]) -> None:
    forbidden = {"$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "default", "title",
                 "nullable", "const", "discriminator"}
    for path, node in nodes(schema):
        where = path or "<root>"
        assert not forbidden & set(node), f"{where}: {forbidden & set(node)}"
        assert "type" in node or node.get("x-kubernetes-int-or-string") or \
            node.get("x-kubernetes-preserve-unknown-fields"), f"{where} has no type"
        assert not ("properties" in node and "additionalProperties" in node), where
        assert node.get("uniqueItems") is not True, where
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            assert isinstance(node.get(key, True), bool), f"{where}.{key}"
        if node.get("type") == "array":
            assert "items" in node, where
        if node.get("x-kubernetes-list-type") == "map":
            keys = node["x-kubernetes-list-map-keys"]
            assert set(keys) <= set(node["items"].get("required", [])), where
    assert schema["properties"]["metadata"] == {"type": "object"}


def test_every_spec_field_is_described(schema: dict[str, Any]) -> None:
    missing = [p for p, n in nodes(schema["properties"]["spec"])
               if p and not p.endswith("[]") and not p.endswith(".*") and not n.get("description")]
    assert missing == []


def test_enums_and_bounds(schema: dict[str, Any]) -> None:
    spec = schema["properties"]["spec"]
    assert at(spec, "engine.kind")["enum"] == ["vllm", "sim", "sglang"]
    assert at(spec, "sampler.name")["enum"] == ["tpe", "gp", "nsga2", "random", "grid", "cmaes"]
    assert at(spec, "pruner.name")["enum"] == ["none", "median", "percentile", "hyperband"]
    assert "ttft_p99" in at(spec, "objectives.[].metric")["enum"]
    assert at(spec, "searchSpace.[].name")["enum"][0] == "max-num-batched-tokens"
    assert at(spec, "budget.maxTrials")["minimum"] == 1
    assert at(spec, "workload.rate").items() >= {"minimum": 0, "exclusiveMinimum": True}.items()
    assert at(spec, "workload.duration")["x-kubernetes-int-or-string"] is True
    # the inline profile has a schema; only its distributions and modelConfig are free-form
    assert "x-kubernetes-preserve-unknown-fields" not in at(spec, "workload.inline")
    assert at(spec, "workload.inline.classes.[].prompt_tokens")[
        "x-kubernetes-preserve-unknown-fields"] is True
    assert at(spec, "engine.modelConfig")["x-kubernetes-preserve-unknown-fields"] is True
    assert at(spec, "engine.modelConfig")["maxProperties"] == 512
    assert at(spec, "searchSpace")["x-kubernetes-list-type"] == "map"
    assert at(spec, "constraints.[]")["type"] == "string"
    status = schema["properties"]["status"]
    assert "x-kubernetes-preserve-unknown-fields" not in status
    assert at(status, "phase")["enum"] == ["Pending", "Running", "Succeeded", "Failed",
                                           "Suspended"]
    assert {"conditions", "observedGeneration", "trialsCompleted", "trialsSummary", "best",
            "paretoFront", "trials", "counts", "startTime", "completionTime"} <= \
        set(status["properties"])


def rules(node: dict[str, Any]) -> list[str]:
    return [r["rule"] for r in node.get("x-kubernetes-validations", [])]


def test_cel_rules(schema: dict[str, Any]) -> None:
    spec = schema["properties"]["spec"]
    item = at(spec, "searchSpace.[]")
    assert "!has(self.low) || !has(self.high) || self.low <= self.high" in rules(item)
    assert any("self.log" in r and "self.step" in r for r in rules(item))
    assert any(r.startswith("self.name in ['long-prefill-token-threshold-adaptive', "
                            "'scheduler-reserve-full-isl', 'async-scheduling'] ? ")
               and "has(self.choices) ?" in r for r in rules(item))
    assert ("(has(self.profile) ? 1 : 0) + (has(self.inline) ? 1 : 0) + (has(self.trace) ? 1 : 0) "
            "+ (has(self.fromPrometheus) ? 1 : 0) == 1") in rules(at(spec, "workload"))
    assert "!(has(self.rate) && has(self.concurrency))" in rules(at(spec, "workload"))
    assert any("self.parallelism <=" in r for r in rules(at(spec, "budget")))
    # immutability of what a running study depends on
    for field in ("searchSpace", "workload", "objectives"):
        assert "self == oldSelf" in rules(at(spec, field)), field
    assert "self.model == oldSelf.model" in rules(at(spec, "engine"))
    assert any("oldSelf.kind" in r for r in rules(at(spec, "engine")))
    assert "has(self.searchSpace) == has(oldSelf.searchSpace)" in rules(spec)
    for _, node in nodes(schema):
        for r in node.get("x-kubernetes-validations", []):
            assert r["message"] and r["rule"].count("(") == r["rule"].count(")")


def check(instance: dict[str, Any], schema: dict[str, Any]) -> None:
    jsonschema.Draft4Validator(to_json_schema(schema)).validate(instance)


@pytest.mark.parametrize("raw", [quickstart(), vllm_manifest()], ids=["quickstart", "vllm"])
def test_examples_match_the_schema(raw: dict[str, Any], schema: dict[str, Any]) -> None:
    check(raw, schema)  # as the user wrote it
    check(parse_manifest(raw).to_manifest(), schema)  # with every default filled in


def test_schema_rejects_what_the_models_reject(schema: dict[str, Any]) -> None:
    bad = quickstart()
    bad["spec"]["engine"]["imgae"] = "x"
    with pytest.raises(jsonschema.ValidationError):
        check(bad, schema)
    bad = quickstart()
    bad["spec"]["sampler"]["name"] = "tpee"
    with pytest.raises(jsonschema.ValidationError):
        check(bad, schema)
    bad = quickstart()
    bad["spec"]["budget"]["maxTrials"] = "20"
    with pytest.raises(jsonschema.ValidationError):
        check(bad, schema)


def test_rendered_status_matches_the_schema(schema: dict[str, Any]) -> None:
    trials = [TrialRecord(i, {"max-num-batched-tokens": 512 * (i + 1),
                              "async-scheduling": bool(i % 2)}, "COMPLETE",
                          metrics={"ttft_p99": 2.0 - i / 10}) for i in range(5)]
    status = render_status(StudySummary(phase="Running", trials=trials, baseline=0, best=4,
                                        max_trials=30))
    check({"apiVersion": "chunktune.dev/v1alpha1", "kind": "ChunkedPrefillTuning",
           "metadata": {"name": "x"}, "spec": quickstart()["spec"], "status": status}, schema)
    # a switch's value stays a boolean, the flags line its --no- form
    assert status["best"]["parameters"] == {"max-num-batched-tokens": 2560,
                                            "async-scheduling": False}
    assert "--no-async-scheduling" in status["best"]["flags"]


def test_crd_is_a_valid_kubernetes_object(crd: dict[str, Any]) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    kv.validate(crd, "1.32", strict=True)


def _cel_value(node: dict[str, Any], value: Any) -> Any:
    """A value as the API server hands it to CEL: ``type: number`` fields become doubles."""
    if node.get("type") == "number" and isinstance(value, int):
        return float(value)
    if isinstance(value, dict):
        props = node.get("properties", {})
        return {k: _cel_value(props.get(k, {}), v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cel_value(node.get("items", {}), v) for v in value]
    return value


MNBT = "max-num-batched-tokens"


@pytest.mark.parametrize(("path", "obj", "old", "expected"), [
    ("searchSpace.[]", {"name": MNBT, "type": "int", "low": 512, "high": 4096, "step": 512},
     None, [True, True, True]),
    ("searchSpace.[]", {"name": MNBT, "type": "int", "low": 8192, "high": 4096}, None,
     [True, False, True]),
    ("searchSpace.[]", {"name": MNBT, "choices": [1], "low": 1}, None, [False, True, True]),
    ("searchSpace.[]", {"name": MNBT, "type": "int", "low": 1, "high": 9, "log": True,
                        "step": 2}, None, [True, True, False]),
    # a switch: its name alone (both settings searched); choices or a range are refused
    ("searchSpace.[]", {"name": "async-scheduling"}, None, [True]),
    ("searchSpace.[]", {"name": "async-scheduling", "choices": [1]}, None, [False]),
    ("searchSpace.[]", {"name": "scheduler-reserve-full-isl", "type": "float", "low": 0,
                        "high": 1}, None, [False]),
    ("searchSpace.[]", {"name": MNBT}, None, [False]),
    ("workload", {"profile": "x", "inline": {}}, None, [False, True]),
    ("workload", {"profile": "x", "rate": 1.5, "concurrency": 2}, None, [True, False]),
    ("budget", {"parallelism": 31}, None, [False]),
    ("budget", {"parallelism": 4, "maxTrials": 4}, None, [True]),
    ("engine", {"model": "b"}, {"model": "a"}, [False, True]),
    ("engine", {"model": "a"}, {"model": "a", "kind": "sim"}, [True, False]),
    ("objectives", [{"metric": "itl_p99"}], [{"metric": "ttft_p99"}], [False]),
])
def test_cel_rules_evaluate(schema: dict[str, Any], path: str, obj: Any, old: Any,
                            expected: list[bool]) -> None:
    """Runs the rules with cel-python when it is installed (it is not a dependency)."""
    celpy = pytest.importorskip("celpy")
    node = at(schema["properties"]["spec"], path)
    env = celpy.Environment()
    got = []
    for r in node["x-kubernetes-validations"]:
        if ("oldSelf" in r["rule"]) != (old is not None):
            continue  # transition rules run on updates only
        act = {"self": celpy.json_to_cel(_cel_value(node, obj))}
        if old is not None:
            act["oldSelf"] = celpy.json_to_cel(_cel_value(node, old))
        got.append(bool(env.program(env.compile(r["rule"])).evaluate(act)))
    # the first rules are the ones listed; the later ones (bounds) hold for these objects
    assert got[:len(expected)] == expected
    assert all(got[len(expected):])


def _unbounded(node: dict[str, Any], path: str) -> list[str]:
    out = []
    for p, n in nodes(node, path):
        if n.get("x-kubernetes-preserve-unknown-fields") and "properties" not in n:
            if n.get("type") == "object" and "maxProperties" not in n:
                out.append(f"{p} (free-form map)")
            continue
        kind = n.get("type")
        if n.get("x-kubernetes-int-or-string"):
            kind = "string"
        if kind == "string" and "maxLength" not in n and "enum" not in n:
            out.append(f"{p} (string)")
        if kind == "array" and "maxItems" not in n:
            out.append(f"{p} (list)")
        if isinstance(n.get("additionalProperties"), dict) and "maxProperties" not in n:
            out.append(f"{p} (map)")
    return out


def test_every_list_string_and_map_is_bounded(schema: dict[str, Any]) -> None:
    """CEL cost estimates need bounded inputs: every list has maxItems, every string maxLength
    (or an enum), every map maxProperties, in the spec and in the status."""
    assert _unbounded(schema["properties"]["spec"], "spec") == []
    assert _unbounded(schema["properties"]["status"], "status") == []


def test_no_free_form_field_but_the_ones_without_a_schema(schema: dict[str, Any]) -> None:
    free = [p for p, n in nodes(schema) if n.get("x-kubernetes-preserve-unknown-fields")]
    # and the values of searched flags in the status: a number, or true / false for a switch
    # (a structural schema has no number-or-boolean type; the operator alone writes them)
    flag_values = [".status.baseline.parameters.*", ".status.best.parameters.*",
                   ".status.paretoFront[].parameters.*", ".status.trials[].parameters.*",
                   ".status.retune.history[].running.*", ".status.retune.history[].best.*"]
    assert sorted(free) == sorted([".spec.engine.modelConfig",
                                   ".spec.workload.inline.classes[].prompt_tokens",
                                   ".spec.workload.inline.classes[].output_tokens",
                                   ".status.kopf", *flag_values])


def test_cel_rules_stay_small(schema: dict[str, Any]) -> None:
    """A rough static estimate of each rule's worst case: the product of the maxItems of the
    lists it sits in and the lists it iterates (nested macros multiply), times the cost of
    reading the longest string a rule compares (1024 characters at the API server's 0.1 per
    character, plus one). The API server's limits are 10^7 per rule and 10^8 per CRD; we keep
    every rule under 10^6 and the sum under 10^7."""
    total = 0
    for path, node in nodes(schema):
        outer = 1
        for part in re.findall(r"\w+(?=\[\])", path):
            outer *= _max_items(schema, path, part)
        for r in node.get("x-kubernetes-validations", []):
            inner = 1
            for lst in re.findall(r"self(?:\.\w+)*?\.(\w+)\.(?:all|exists|exists_one)\(",
                                  r["rule"]):
                sub = node.get("properties", {}).get(lst) or _find(node, lst)
                inner *= (sub or {}).get("maxItems", 1)
            if re.search(r"(?<!\.)self\.(all|exists|exists_one)\(", r["rule"]):
                inner *= node.get("maxItems", 1)
            if re.search(r"\.(all|exists|exists_one)\(\w+, self\.", r["rule"]) and \
                    node.get("type") == "array":
                inner *= node.get("maxItems", 1)
            cost = outer * inner * 103
            assert cost < 10**6, (path, r["rule"], cost)
            total += cost
    assert total < 10**7, total


def _find(node: dict[str, Any], name: str) -> dict[str, Any] | None:
    for _, n in nodes(node):
        if name in n.get("properties", {}):
            return dict(n["properties"][name])
    return None


def _max_items(schema: dict[str, Any], path: str, name: str) -> int:
    found = _find(schema, name)
    return int((found or {}).get("maxItems", 1))


def test_a_huge_status_stays_within_the_schemas_bounds(schema: dict[str, Any]) -> None:
    """The operator's status patch must pass the bounds the CRD now has: long messages are
    cut, lists are capped."""
    trials = [TrialRecord(i, {"max-num-batched-tokens": 512}, "FAIL", reason="x" * 10_000,
                          metrics={"ttft_p99": 1.0 + i}) for i in range(1500)]
    status = render_status(StudySummary(
        phase="Failed", trials=trials, pareto=list(range(1500)), max_trials=1500,
        message="m" * 100_000, trials_limit=5000,
        conditions=[{"type": "SpecValid", "status": "False", "reason": "InvalidSpec",
                     "message": "p" * 50_000, "lastTransitionTime": "2026-01-01T00:00:00Z"}]))
    check({"apiVersion": "chunktune.dev/v1alpha1", "kind": "ChunkedPrefillTuning",
           "metadata": {"name": "x"}, "spec": quickstart()["spec"], "status": status}, schema)
    assert len(status["trials"]) == 1000 and len(status["paretoFront"]) == 1000
    assert status["message"].endswith("(cut)")
