"""Pydantic's validation errors as ``(field path, message)`` problems: the one validation
mechanism of the manifest and the workload profile.

Paths use the fields' names (the manifest's camelCase aliases) with list indices in brackets
(``spec.searchSpace[1].low``); messages are short and name the expected value, with a
"did you mean" hint for unknown fields and misspelt choices, and never a pydantic URL. In a
discriminated union (``Field(discriminator="dist")``) pydantic puts the member's tag into the
error location; paths leave it out (``prompt_tokens.max``, not ``prompt_tokens.uniform.max``),
a missing field says which member needs it (``is required for dist uniform``), and a bad or
missing tag is reported at the discriminator field (``prompt_tokens.dist``).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from chunktune.core.suggest import closest

Problem = tuple[str, str]


def format_path(loc: Sequence[str | int]) -> str:
    """``("spec", "searchSpace", 1, "low")`` -> ``spec.searchSpace[1].low``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def problems_from(err: ValidationError, root: type[BaseModel],
                  prefix: Sequence[str | int] = ()) -> list[Problem]:
    """Every error of ``err`` (raised validating ``root``) as a problem, paths under
    ``prefix``."""
    out: list[Problem] = []
    for e in err.errors(include_url=False):
        loc, tag = _untagged(root, tuple(e["loc"]))
        kind = e["type"]
        if kind in ("union_tag_invalid", "union_tag_not_found"):
            ctx = e.get("ctx") or {}
            field = str(ctx.get("discriminator", "")).strip("'")
            expected = [t.strip().strip("'") for t in str(ctx.get("expected_tags", "")).split(",")
                        if t.strip()] or _tags_at(root, loc, field)
            got = ctx.get("tag")
            msg = (f"must be one of {', '.join(expected)} (got {got!r})" if got is not None
                   else f"is required: one of {', '.join(expected)}")
            hint = closest(str(got), expected) if isinstance(got, str) else None
            out.append((format_path((*prefix, *loc, field)),
                        msg + (f"; did you mean {hint!r}?" if hint else "")))
            continue
        in_member = tag is not None and loc[:-1] == tag[0]
        if kind == "extra_forbidden" and tag is not None and in_member:
            allowed = sorted(n for n in tag[3].model_fields if n != tag[1])
            msg = f"is not a field of {tag[1]} {tag[2]}; allowed: {', '.join(allowed)}"
        else:
            msg = _message(e, root, loc)
        if kind == "missing" and tag is not None and in_member:
            msg += f" for {tag[1]} {tag[2]}"
        out.append((format_path((*prefix, *loc)), msg))
    return _dedupe(out)


#: A discriminated-union member in an error location: (its location, discriminator, tag, model).
_Tag = tuple[tuple[str | int, ...], str, str, type[BaseModel]]


def _untagged(root: type[BaseModel], loc: tuple[str | int, ...]
              ) -> tuple[tuple[str | int, ...], _Tag | None]:
    """``loc`` without the tags pydantic inserts after a discriminated-union field, and the
    last such member as ``(its location, discriminator field, tag)``."""
    out: list[str | int] = []
    tag: _Tag | None = None
    cls: type[BaseModel] | None = root
    i = 0
    while i < len(loc):
        part = loc[i]
        out.append(part)
        i += 1
        if isinstance(part, int) or cls is None:
            continue
        field = next((f for n, f in cls.model_fields.items() if (f.alias or n) == part), None)
        if field is None:
            cls = None
            continue
        disc = field.discriminator if isinstance(field.discriminator, str) else None
        members = _tagged_members(field.annotation, disc) if disc else {}
        while i < len(loc) and isinstance(loc[i], int):  # list items of the field
            out.append(loc[i])
            i += 1
        if members and i < len(loc) and loc[i] in members:
            cls = members[str(loc[i])]
            tag = (tuple(out), str(disc), str(loc[i]), cls)
            i += 1
        else:
            cls = _model_in(field.annotation)
    return tuple(out), tag


def _tags_at(root: type[BaseModel], loc: tuple[str | int, ...], disc: str) -> list[str]:
    """The tags of the discriminated union at ``loc`` (an untagged location)."""
    cls: type[BaseModel] | None = root
    members: dict[str, type[BaseModel]] = {}
    for part in loc:
        if isinstance(part, int) or cls is None:
            continue
        field = next((f for n, f in cls.model_fields.items() if (f.alias or n) == part), None)
        if field is None:
            return []
        members = _tagged_members(field.annotation, disc)
        cls = _model_in(field.annotation)
    return list(members)


def _tagged_members(tp: Any, disc: str) -> dict[str, type[BaseModel]]:
    """The members of a discriminated union by tag."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _tagged_members(typing.get_args(tp)[0], disc)
    if origin not in (typing.Union, types.UnionType):
        return {}
    out: dict[str, type[BaseModel]] = {}
    for arg in typing.get_args(tp):
        if isinstance(arg, type) and issubclass(arg, BaseModel) and disc in arg.model_fields:
            for tag in typing.get_args(arg.model_fields[disc].annotation):
                out[str(tag)] = arg
    return out


def _message(e: Any, root: type[BaseModel], loc: tuple[str | int, ...]) -> str:
    kind: str = e["type"]
    ctx: dict[str, Any] = e.get("ctx") or {}
    got = e.get("input")
    if kind == "extra_forbidden":
        allowed = _fields_at(root, loc[:-1])
        hint = closest(str(loc[-1]), allowed) if allowed else None
        if hint:
            return f"unknown field; did you mean {hint!r}?"
        return "unknown field" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
    if kind == "missing":
        return "is required"
    if kind in ("value_error", "assertion_error"):
        msg = str(ctx.get("error", e["msg"]))
        for p in ("Value error, ", "Assertion failed, "):
            msg = msg.removeprefix(p)
        return msg
    if kind == "literal_error":
        expected = [x.strip().strip("'") for x in
                    str(ctx.get("expected", "")).replace(" or ", ", ").split(",")]
        msg = (f"must be {expected[0]}" if len(expected) == 1
               else f"must be one of {', '.join(expected)}") + f" (got {got!r})"
        hint = closest(str(got), expected) if isinstance(got, str) else None
        return msg + (f"; did you mean {hint!r}?" if hint else "")
    simple = {
        "int_type": "must be an integer",
        "int_from_float": "must be an integer",
        "float_type": "must be a number",
        "bool_type": "must be true or false",
        "dict_type": "must be a mapping",
        "model_type": "must be a mapping of fields",
        "model_attributes_type": "must be a mapping of fields",
        "list_type": "must be a list",
    }
    if kind == "string_type":
        quote = "; quote it" if isinstance(got, int | float) and not isinstance(got, bool) else ""
        return f"must be a string (got {_show(got)}{quote})"
    if kind in simple:
        return f"{simple[kind]} (got {_show(got)})"
    bounds = {"greater_than_equal": ("ge", ">="), "greater_than": ("gt", ">"),
              "less_than_equal": ("le", "<="), "less_than": ("lt", "<")}
    if kind in bounds:
        key, op = bounds[kind]
        return f"must be {op} {ctx.get(key)} (got {_show(got)})"
    if kind == "too_short":
        n = ctx.get("min_length", 1)
        return "must not be empty" if n == 1 else f"must have at least {n} items"
    if kind == "too_long":
        return f"must have at most {ctx.get('max_length')} items"
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters"
    if kind == "string_pattern_mismatch":
        return f"must match {ctx.get('pattern')} (got {_show(got)})"
    msg = str(e["msg"])
    return msg[:1].lower() + msg[1:]


def _show(v: Any) -> str:
    if isinstance(v, dict):
        return "a mapping"
    if isinstance(v, list):
        return "a list"
    text = repr(v)  # cut: a 1 MB value must not become a 1 MB message, event or condition
    return text if len(text) <= 200 else f"{text[:200]}... ({len(text)} characters)"


def _dedupe(problems: list[Problem]) -> list[Problem]:
    seen: set[Problem] = set()
    out = []
    for p in problems:
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


def _fields_at(root: type[BaseModel], loc: Sequence[str | int]) -> list[str]:
    """The field names (aliases) of the model found at ``loc`` below ``root``."""
    cls: type[BaseModel] | None = root
    for part in loc:
        if cls is None:
            return []
        if isinstance(part, int):
            continue
        field = next((f for n, f in cls.model_fields.items() if (f.alias or n) == part), None)
        if field is None:
            return []
        cls = _model_in(field.annotation)
    if cls is None:
        return []
    return [f.alias or n for n, f in cls.model_fields.items()]


def _model_in(tp: Any) -> type[BaseModel] | None:
    """The model class inside an annotation (``X | None``, ``list[X]``, ``Annotated[...]``)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _model_in(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType, list, tuple):
        for arg in typing.get_args(tp):
            found = _model_in(arg)
            if found is not None:
                return found
    return None
