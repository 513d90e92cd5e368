"""The manifest reference (``docs/reference.md``), generated from the resource's schema.

One entry per field of ``spec`` and ``status``, in the order the models declare them: its path,
its type with the limits admission enforces (an enum, a range, a length, a list's size), whether
it is required, an example taken from the shipped manifests where one sets it, and the model's
own description (which says the default and what the field changes). The schema is
:func:`chunktune.api.crd.openapi_schema`, the same that ``chunktune crd`` prints, so the
reference cannot say something admission does not do; ``tests/api/test_reference.py`` fails
when the committed page differs from what this renders (``chunktune crd --reference
--examples examples -o docs/reference.md`` writes it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from chunktune.api.crd import openapi_schema

#: Enums longer than this are summarised (the GPU names) rather than listed in full.
MAX_LISTED_CHOICES = 12
#: Example values longer than this (as JSON) are left out of the page.
MAX_EXAMPLE_CHARS = 80

HEADER = """\
# Manifest reference: `ChunkedPrefillTuning` (`chunktune.dev/v1alpha1`)

Generated from the resource's schema by `chunktune crd --reference --examples examples -o
docs/reference.md`; `tests/api/test_reference.py` fails when this page and the code disagree.
Every field a manifest may set, in the order of the models: its type and the limits admission
enforces (`kubectl apply` refuses what breaks them; `chunktune validate FILE` says the same
with the field's path), an example from the shipped manifests in `examples/` where one sets it,
and what it does (its default is in its description). Fields under `status` are written by the
operator. Start from [getting-started.md](getting-started.md); the tuning concepts are in
[tuning.md](tuning.md), traffic in [traffic.md](traffic.md).
"""


def collect_examples(manifests: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[str, tuple[Any,
                                                                                          str]]:
    """``{field path: (value, source)}``: the first value each manifest sets for a field,
    by the paths :func:`render_reference` uses (``spec.searchSpace[].name``)."""
    found: dict[str, tuple[Any, str]] = {}

    def walk(value: Any, path: str, source: str) -> None:
        if isinstance(value, Mapping):
            for key, inner in value.items():
                walk(inner, f"{path}.{key}", source)
            if path not in found and value:
                found[path] = (dict(value), source)
        elif isinstance(value, list):
            for item in value:
                walk(item, f"{path}[]", source)
            if path not in found and value:
                found[path] = (list(value), source)
        elif path not in found:
            found[path] = (value, source)

    for source, body in manifests:
        spec = body.get("spec") if isinstance(body, Mapping) else None
        if isinstance(spec, Mapping):
            walk(spec, "spec", source)
    return found


def render_reference(examples: Mapping[str, tuple[Any, str]] | None = None) -> str:
    """The reference page, as markdown."""
    schema = openapi_schema()
    examples = examples or {}
    lines = [HEADER]
    for top in ("spec", "status"):
        node = schema["properties"][top]
        lines.append(f"## `{top}`\n")
        if node.get("description"):
            lines.append(f"{node['description']}\n")
        for path, field, required in _fields(node, top):
            lines.extend(_entry(path, field, required, examples.get(path)))
    return "\n".join(lines).rstrip() + "\n"


def _fields(node: Mapping[str, Any], path: str) -> Iterator[tuple[str, Mapping[str, Any], bool]]:
    required = set(node.get("required") or ())
    for name, field in (node.get("properties") or {}).items():
        here = f"{path}.{name}"
        yield here, field, name in required
        yield from _inner(field, here)


def _inner(field: Mapping[str, Any], path: str) -> Iterator[tuple[str, Mapping[str, Any], bool]]:
    if field.get("type") == "object" and "properties" in field:
        yield from _fields(field, path)
    elif field.get("type") == "array" and isinstance(field.get("items"), Mapping):
        items = field["items"]
        if items.get("type") == "object" and "properties" in items:
            yield from _fields(items, f"{path}[]")
    elif isinstance(field.get("additionalProperties"), Mapping):
        yield from _inner(field["additionalProperties"], f"{path}.*")


def _entry(path: str, field: Mapping[str, Any], required: bool,
           example: tuple[Any, str] | None) -> list[str]:
    depth = path.count(".") + path.count("[]") - 1
    heading = "###" if depth <= 1 else "####"
    out = [f"{heading} `{path}`\n", f"*{_kind(field)}*{', required' if required else ''}."
           + "".join(f" {limit}." for limit in _limits(field))]
    if example is not None and not (field.get("type") == "object" and "properties" in field):
        text = json.dumps(example[0], sort_keys=False)
        if len(text) <= MAX_EXAMPLE_CHARS:
            out[-1] += f" Example: `{text}` ({example[1]})."
    out[-1] += "\n"
    if field.get("description"):
        out.append(f"{field['description']}\n")
    rules = [str(r.get("message") or r.get("rule")).rstrip(".")
             for r in field.get("x-kubernetes-validations") or () if r.get("message")
             or r.get("rule")]
    if rules:
        out.append("What admission checks here:\n")
        out.append("".join(f"- {rule}\n" for rule in rules))
    return out


def _kind(field: Mapping[str, Any]) -> str:
    if field.get("x-kubernetes-int-or-string"):
        return "integer or string"
    kind = str(field.get("type") or "any value")
    if kind == "array" and isinstance(field.get("items"), Mapping):
        inner = field["items"]
        what = "objects" if inner.get("type") == "object" else f"{_kind(inner)}s"
        return f"list of {what}"
    if kind == "object" and isinstance(field.get("additionalProperties"), Mapping):
        return f"map of {_kind(field['additionalProperties'])}"
    if kind == "object" and field.get("x-kubernetes-preserve-unknown-fields") \
            and "properties" not in field:
        return "object (free-form)"
    return kind


def _limits(field: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    choices = field.get("enum")
    if choices:
        shown = ", ".join(f"`{c}`" for c in choices[:MAX_LISTED_CHOICES])
        more = len(choices) - MAX_LISTED_CHOICES
        out.append(f"One of {shown}" + (f" and {more} more" if more > 0 else ""))
    low, high = field.get("minimum"), field.get("maximum")
    if low is not None or high is not None:
        lo = "" if low is None else f"{'>' if field.get('exclusiveMinimum') else '>='} {low}"
        hi = "" if high is None else f"{'<' if field.get('exclusiveMaximum') else '<='} {high}"
        out.append("Range " + ", ".join(x for x in (lo, hi) if x))
    if field.get("maxLength") is not None:
        out.append(f"At most {field['maxLength']} characters")
    if field.get("maxItems") is not None:
        out.append(f"At most {field['maxItems']} items")
    if field.get("maxProperties") is not None:
        out.append(f"At most {field['maxProperties']} keys")
    return out
