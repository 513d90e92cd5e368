"""The API server's admission of a ChunkedPrefillTuning, offline: the generated CRD's schema
(as JSON Schema, with jsonschema) plus every CEL rule (``x-kubernetes-validations``, with
cel-python) on each node the object has — what ``kubectl apply`` meets before the operator
sees anything. Update rules (``oldSelf``) are left out: these are creations.

Two API-server behaviours are emulated: ``type: number`` values reach CEL as doubles, and a
rule that fails to evaluate (a type or overflow error) refuses the object, as the API server
does.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import celpy
import jsonschema

from chunktune.api.crd import openapi_schema, to_json_schema


@cache
def _schema() -> dict[str, Any]:
    return openapi_schema()


@cache
def _validator() -> jsonschema.Draft4Validator:
    return jsonschema.Draft4Validator(to_json_schema(_schema()))


_ENV = celpy.Environment()
_PROGRAMS: dict[str, Any] = {}


def _program(rule: str) -> Any:
    if rule not in _PROGRAMS:
        _PROGRAMS[rule] = _ENV.program(_ENV.compile(rule))
    return _PROGRAMS[rule]


def cel_value(node: dict[str, Any], value: Any) -> Any:
    """A value as the API server hands it to CEL: ``type: number`` fields become doubles."""
    if node.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, dict):
        props = node.get("properties", {})
        extra = node.get("additionalProperties")
        return {k: cel_value(props.get(k, extra if isinstance(extra, dict) else {}), v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [cel_value(node.get("items", {}), v) for v in value]
    return value


def cel_errors(node: dict[str, Any], value: Any, path: str = "") -> list[tuple[str, str]]:
    """``(path, message)`` of every CEL rule that refuses ``value`` at ``node`` or below."""
    out: list[tuple[str, str]] = []
    for r in node.get("x-kubernetes-validations", []):
        if "oldSelf" in r["rule"]:
            continue
        try:
            result = _program(r["rule"]).evaluate({"self": celpy.json_to_cel(
                cel_value(node, value))})
            ok = not isinstance(result, celpy.CELEvalError) and bool(result)
        except (celpy.CELEvalError, TypeError, ValueError, RecursionError):
            ok = False
        if not ok:
            out.append((path, r["message"]))
    if isinstance(value, dict):
        props = node.get("properties", {})
        extra = node.get("additionalProperties")
        for k, v in value.items():
            sub = props.get(k, extra if isinstance(extra, dict) else None)
            if sub is not None:
                out += cel_errors(sub, v, f"{path}.{k}" if path else k)
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for i, v in enumerate(value):
            out += cel_errors(node["items"], v, f"{path}[{i}]")
    return out


def schema_errors(obj: Any) -> list[tuple[str, str]]:
    """``(path, message)`` of every schema violation."""
    out = []
    for e in _validator().iter_errors(obj):
        path = ""
        for p in e.absolute_path:
            path += f"[{p}]" if isinstance(p, int) else (f".{p}" if path else str(p))
        out.append((path, e.message[:200]))
    return out


def refusals(obj: Any, field: str | None = None) -> list[tuple[str, str]]:
    """Why the API server refuses ``obj`` (empty: it is admitted). With ``field``, the CEL
    rules (slow in cel-python) run only when the schema alone refuses nothing about it."""
    errors = schema_errors(obj)
    if field is not None and any(names(p, field) for p, _ in errors):
        return errors
    if isinstance(obj, dict):
        errors += cel_errors(_schema(), obj)
    return errors


def names(path: str, field: str) -> bool:
    """Whether a refusal at ``path`` is about ``field`` (the same, one inside the other)."""
    return bool(path) and (path == field or path.startswith((field + ".", field + "["))
                           or field.startswith((path + ".", path + "[")))
