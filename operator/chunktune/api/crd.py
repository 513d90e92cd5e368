"""The ChunkedPrefillTuning CustomResourceDefinition, generated from the pydantic models.

:func:`build_crd` turns the models' JSON Schema into a *structural* OpenAPI v3 schema, the form
Kubernetes requires: ``$ref``/``$defs`` inlined, every node typed (or marked
``x-kubernetes-int-or-string`` / ``x-kubernetes-preserve-unknown-fields``), no ``anyOf`` for
optional fields, OpenAPI 3.0 ``exclusiveMinimum`` booleans, and no ``default`` (the operator
applies the models' defaults, which depend on other fields; each description says the
default). The models carry the CEL rules (``x-kubernetes-validations``) for the cross-field
checks CEL can express and for the fields that may not change under a running study.

Admission refuses what it can know, so that a bad manifest fails at ``kubectl apply`` rather
than later in the operator: patterns for durations (``90s``, ``1h30m``; no spaces, no unknown
units, at most seven digits), quantities (no negatives), image references, model and served
model names (no spaces or control characters), engine arguments (no control characters),
http(s) URLs without credentials, the storage forms (a relative journal path without ``..``,
``sqlite:///relative.db``, or an RDB URL without a password), the constraint grammar (per
metric unit) and Kubernetes names; bounds on every number (ranges within the flags' values up
to 2^24 tokens, seeds within numpy's 32 bits); enums for flags, metrics and GPUs; CEL for the
rules between fields (low <= high, choices xor a range, the flags' own limits, a duplicated
parameter, warm-up < duration, positive durations with a ceiling of a week (30 days for
``maxDuration``), image required for vLLM, gpu.count >= tensorParallelSize, managed flags and
searched flags not in ``args``, unique env names). ``tests/api/corpus.py`` holds 157 bad
manifests: the schema plus CEL refuses every one (``bench/admission.py``).

What stays with the operator: the classes an objective or constraint names (they come from the
workload profile), the profile file's content, the simulator's model and GPU memory checks, and
``modelConfig`` and the inline profile's token distributions (a number or a mapping, which a
structural schema cannot type; so they are ``x-kubernetes-preserve-unknown-fields``, with
``maxProperties`` on ``modelConfig``). Constraints are strings in the CRD (the compact form);
the mapping form remains for the Python API.

CEL cost: the API server estimates each rule's worst case from the sizes the schema allows and
refuses a CRD over 10^7 per rule or 10^8 in total, so every list, string and map that a rule
can read has ``maxItems``/``maxLength``/``maxProperties`` (the status too, bounded by
:data:`STATUS_BOUNDS`). The costliest rules are the pairwise ones: unique env names (64 x 64
comparisons of names up to 256 characters) and searched flags not fixed in ``args`` (16
parameters x 128 arguments of at most 1024 characters), each a few 10^5 cost units;
``tests/api/test_crd.py`` keeps every rule under 10^6 and the sum under 10^7 by a conservative
estimate.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import yaml

from chunktune.api._types import DURATION_CEILING, DURATION_PATTERN, duration_rule
from chunktune.api.status import MAX_LISTED, MAX_TEXT, Status
from chunktune.api.v1alpha1 import API_GROUP, API_VERSION, KIND, Spec
from chunktune.core.errors import ChunktuneError
from chunktune.core.workload import APIS, ARRIVAL_MODES

PLURAL = "chunkedprefilltunings"
SINGULAR = "chunkedprefilltuning"
SHORT_NAMES = ["cpt"]
CATEGORIES = ["chunktune"]
CRD_NAME = f"{PLURAL}.{API_GROUP}"

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Trials", "type": "string", "jsonPath": ".status.trialsSummary",
     "description": "Finished trials out of maxTrials"},
    {"name": "Best TTFT p99", "type": "number", "jsonPath": ".status.best.metrics.ttft_p99",
     "description": "p99 time to first token of the best trial, seconds"},
    {"name": "Budget", "type": "integer",
     "jsonPath": ".status.best.parameters.max-num-batched-tokens",
     "description": "Best --max-num-batched-tokens"},
    {"name": "Threshold", "type": "integer",
     "jsonPath": ".status.best.parameters.long-prefill-token-threshold",
     "description": "Best --long-prefill-token-threshold"},
    {"name": "Improvement", "type": "string", "jsonPath": ".status.best.improvement",
     "description": "First objective of the best trial vs the baseline"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

_DROP = {"title", "default", "examples"}


class SchemaError(ChunktuneError, ValueError):
    """The models produced a schema that cannot be made structural."""


def openapi_schema() -> dict[str, Any]:
    """The structural ``openAPIV3Schema`` of the resource."""
    spec = _structural(Spec.model_json_schema(by_alias=True, mode="validation"))
    status = _bounded(_structural(Status.model_json_schema(by_alias=True,
                                                          mode="serialization")))
    # kopf's own status field (it may touch status.kopf); everything else is typed.
    status["properties"]["kopf"] = {
        "type": "object", "description": "Written by kopf, the operator framework.",
        "maxProperties": 16, "x-kubernetes-preserve-unknown-fields": True}
    return {
        "type": "object",
        "description": "A study that tunes an inference server's chunked-prefill flags by "
                       "measuring them under a workload.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


def build_crd() -> dict[str, Any]:
    """The CustomResourceDefinition (``apiextensions.k8s.io/v1``) as a mapping."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/name": "chunktune"}},
        "spec": {
            "group": API_GROUP,
            "scope": "Namespaced",
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL,
                      "singular": SINGULAR, "shortNames": SHORT_NAMES, "categories": CATEGORIES},
            "versions": [{
                "name": API_VERSION,
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": openapi_schema()},
                "subresources": {"status": {}},
                "additionalPrinterColumns": copy.deepcopy(PRINTER_COLUMNS),
            }],
        },
    }


def crd_yaml() -> str:
    """:func:`build_crd` as YAML."""
    return str(yaml.safe_dump(build_crd(), sort_keys=False, width=99))


# ---- JSON Schema -> structural OpenAPI --------------------------------------------------------


def _structural(root: dict[str, Any]) -> dict[str, Any]:
    defs = root.get("$defs", {})
    return _node({k: v for k, v in root.items() if k != "$defs"}, defs, "")


def _node(node: dict[str, Any], defs: dict[str, Any], where: str) -> dict[str, Any]:
    node = dict(node)
    if node.get("x-chunktune-schema") == "profile":
        node = {k: v for k, v in node.items() if k not in ("x-chunktune-schema", "type",
                                                            "additionalProperties", "anyOf")}
        return {**copy.deepcopy(INLINE_PROFILE_SCHEMA), **{
            k: v for k, v in node.items() if k == "description"}}
    if "$ref" in node:
        node = _merge(defs[node.pop("$ref").rsplit("/", 1)[-1]], node)
    if "anyOf" in node:
        branches = [b for b in node.pop("anyOf") if b.get("type") != "null"]
        types = {b.get("type") for b in branches}
        if len(branches) == 1:
            node = _merge(branches[0], node)
        elif types <= {"integer", "number"}:
            node["type"] = "number"
        else:
            raise SchemaError(f"{where or '<root>'}: a union of {types} is not structural; "
                              "annotate the field with WithJsonSchema")
        return _node(node, defs, where)
    for bad in ("oneOf", "allOf", "not", "$defs", "discriminator"):
        if bad in node:
            raise SchemaError(f"{where or '<root>'}: {bad} is not allowed here")
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "properties":
            out[key] = {k: _node(v, defs, f"{where}.{k}") for k, v in value.items()}
        elif key == "items":
            out[key] = _node(value, defs, f"{where}[]")
        elif key == "additionalProperties":
            if value is True or value == {}:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif isinstance(value, dict):
                out[key] = _node(value, defs, f"{where}.*")
            # additionalProperties: false is how Kubernetes behaves anyway (unknown fields are
            # pruned, or rejected with strict field validation); it may not be written.
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "const":
            out["enum"] = [value]
        elif key == "uniqueItems":
            continue  # not allowed in CRDs; lists of scalars use x-kubernetes-list-type: set
        else:
            out[key] = copy.deepcopy(value)
    if "enum" in out and "type" not in out:
        kinds = {type(v) for v in out["enum"]}
        out["type"] = "string" if kinds == {str} else "integer" if kinds == {int} else "number"
    if out.get("type") == "object" and "properties" not in out and \
            "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    if "type" not in out and not (out.get("x-kubernetes-int-or-string")
                                  or out.get("x-kubernetes-preserve-unknown-fields")):
        raise SchemaError(f"{where or '<root>'}: no type")
    if isinstance(out.get("description"), str):
        out["description"] = _plain(out["description"])
    head: dict[str, Any] = {k: out.pop(k) for k in ("type", "description") if k in out}
    return {**head, **out}


def _plain(doc: str) -> str:
    """A docstring as one plain line: no reST roles or double backticks."""
    doc = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", doc)
    return " ".join(doc.replace("``", "").split())


def _merge(inner: dict[str, Any], outer: dict[str, Any]) -> dict[str, Any]:
    """A referenced (or the one non-null) schema with the field's own keys on top; CEL rules of
    both are kept (the type's, then the field's)."""
    out = {**inner, **outer}
    key = "x-kubernetes-validations"
    if key in inner and key in outer:
        out[key] = [*inner[key], *outer[key]]
    return out


#: Bounds given to status nodes that have none: the operator writes the status, and every
#: list, string and map has a bound so that CEL cost estimates stay finite.
STATUS_BOUNDS = {"string": ("maxLength", MAX_TEXT), "array": ("maxItems", MAX_LISTED),
                 "map": ("maxProperties", 256)}


def _bounded(node: dict[str, Any]) -> dict[str, Any]:
    """``node`` with a bound on every string, list and map that lacks one (see
    :data:`STATUS_BOUNDS`)."""
    out = dict(node)
    kind = "map" if isinstance(out.get("additionalProperties"), dict) else out.get("type")
    if kind in STATUS_BOUNDS and "enum" not in out and "format" not in out:
        key, value = STATUS_BOUNDS[kind]
        out.setdefault(key, value)
    if "properties" in out:
        out["properties"] = {k: _bounded(v) for k, v in out["properties"].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = _bounded(out[key])
    return out


# ---- the inline workload profile ----------------------------------------------------------------

_DURATION_FIELD = {"x-kubernetes-int-or-string": True, "pattern": DURATION_PATTERN,
                   "maxLength": 40, "minimum": 0, "maximum": DURATION_CEILING,
                   "x-kubernetes-validations": [duration_rule(DURATION_CEILING, False)]}
_DISTRIBUTION = {
    "description": "A token count: a number, or a mapping {dist: constant|uniform|normal|"
                   "lognormal|exponential|choice|histogram, value|min|max|mean|std|sigma|"
                   "values|weights|edges}. Checked by the operator (a structural schema cannot "
                   "type a number-or-mapping).",
    "x-kubernetes-preserve-unknown-fields": True,
}
#: The schema of ``spec.workload.inline`` (the ``loadtest/profiles`` format), so that the API
#: server checks its shape and bounds; the distributions stay untyped (number or mapping) and
#: :func:`chunktune.core.workload.parse_profile` checks them.
INLINE_PROFILE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "A profile mapping inline (classes, arrival, duration, ...).",
    "required": ["classes"],
    "properties": {
        "name": {"type": "string", "description": "Profile name.", "maxLength": 253},
        "description": {"type": "string", "description": "What the traffic is.",
                        "maxLength": 4096},
        "arrival": {
            "type": "object", "description": "How requests arrive.",
            "properties": {
                "mode": {"type": "string", "description": "Arrival process.",
                         "enum": list(ARRIVAL_MODES)},
                "rate": {"type": "number", "description": "Requests per second.",
                         "minimum": 0, "exclusiveMinimum": True, "maximum": 100000},
                "concurrency": {"type": "integer", "description": "Requests in flight.",
                                "minimum": 1, "maximum": 100000},
            },
        },
        "duration": {**_DURATION_FIELD, "description": "How long each trial sends traffic.",
                     "minimum": 1,
                     "x-kubernetes-validations": [duration_rule(DURATION_CEILING, True)]},
        "warmup": {**_DURATION_FIELD, "description": "Requests before this are not measured."},
        "seed": {"type": "integer", "description": "Random seed.", "minimum": 0,
                 "maximum": 2**32 - 1},
        "classes": {
            "type": "array", "description": "Traffic classes.", "minItems": 1, "maxItems": 32,
            "items": {
                "type": "object", "description": "One traffic class.",
                "required": ["name", "prompt_tokens", "output_tokens"],
                "properties": {
                    "name": {"type": "string", "description": "Class name.", "maxLength": 63,
                             "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]*$"},
                    "weight": {"type": "number", "description": "Share of the requests.",
                               "minimum": 0, "exclusiveMinimum": True, "maximum": 1000000},
                    "api": {"type": "string", "description": "OpenAI API.",
                            "enum": list(APIS)},
                    "prompt_tokens": {**_DISTRIBUTION},
                    "output_tokens": {**_DISTRIBUTION},
                    "spec_acceptance": {
                        "type": "number", "minimum": 0, "maximum": 1,
                        "description": "Speculative decoding: the chance a draft token is "
                                       "accepted given the ones before it were."},
                },
            },
        },
    },
    "x-kubernetes-validations": [
        {"rule": "!has(self.warmup) || !has(self.duration) || "
                 "(type(self.warmup) == string ? duration(self.warmup) : "
                 "duration(string(self.warmup) + 's')) < (type(self.duration) == string ? "
                 "duration(self.duration) : duration(string(self.duration) + 's'))",
         "message": "warmup must be shorter than duration"},
    ],
}


# ---- structural OpenAPI -> JSON Schema (for checking manifests offline) ------------------------


def to_json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """A Draft 4 JSON Schema that accepts what the API server accepts under strict field
    validation (unknown fields rejected), for checking manifests without a cluster. CEL rules
    are not evaluated."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {k: to_json_schema(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = to_json_schema(value)
        elif key.startswith("x-kubernetes-") or key == "description":
            continue
        elif key == "pattern" and value.endswith("$"):
            # Python's '$' also matches before a final newline; RE2's (the API server's)
            # does not.
            out[key] = value[:-1] + r"\Z"
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    if node.get("type") == "object" and "properties" in node and \
            not node.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)
    return out
