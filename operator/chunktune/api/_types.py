"""Field types shared by the manifest models: the base model (camelCase aliases, unknown fields
forbidden, no type coercion), durations, numbers and Kubernetes quantities.

Strictness matters: the API server checks the same manifest against the CRD schema, which
coerces nothing, so a value this model accepts must also pass there (``"5"`` is not an
integer, ``32768`` is not a string).
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, PlainSerializer, PlainValidator, WithJsonSchema
from pydantic.alias_generators import to_camel

from chunktune.core.errors import SpecError
from chunktune.core.workload import parse_duration


class Model(BaseModel):
    """Base of every manifest model."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_alias=True,
        validate_by_name=True,
        serialize_by_alias=True,
        extra="forbid",
        strict=True,
        use_attribute_docstrings=True,
    )


def _duration(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | str):
        raise ValueError(f"must be a duration such as 60, '90s' or '10m' (got {v!r})")
    try:
        return parse_duration(v, "")
    except SpecError as e:
        raise ValueError(e.problems[0][1]) from None


def _duration_out(v: float) -> int | str:
    return int(v) if float(v).is_integer() else f"{v:g}s"


#: Seconds, written as an integer (``60``) or a string (``"90s"``, ``"10m"``, ``"1h30m"``,
#: ``"250ms"``). Fractional seconds need the string form (``"1.5s"``): the CRD types durations
#: as int-or-string.
Duration = Annotated[
    float,
    PlainValidator(_duration),
    PlainSerializer(_duration_out),
    WithJsonSchema({"x-kubernetes-int-or-string": True}),
]


def _number(v: Any) -> int | float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValueError(f"must be a number (got {v!r})")
    return v


#: An int or a float, kept as given (``512`` stays an int).
Number = Annotated[int | float, PlainValidator(_number), WithJsonSchema({"type": "number"})]

#: Kubernetes' quantity syntax (``500m``, ``16Gi``, ``2``).
QUANTITY_RE = re.compile(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


def _quantity(v: Any) -> int | str:
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return v
    if isinstance(v, str) and QUANTITY_RE.match(v):
        return v
    raise ValueError(f"must be a Kubernetes quantity such as 2, '500m' or '16Gi' (got {v!r})")


Quantity = Annotated[
    int | str,
    PlainValidator(_quantity),
    WithJsonSchema({"x-kubernetes-int-or-string": True, "pattern": QUANTITY_RE.pattern}),
]

_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def check_object_name(v: str, what: str = "name") -> str:
    """Kubernetes object names: DNS-1123 subdomains (lower case, digits, '-', '.')."""
    if len(v) > 253 or not _DNS1123_SUBDOMAIN.match(v):
        raise ValueError(f"must be a valid Kubernetes {what}: lower-case letters, digits, '-' "
                         f"and '.', starting and ending with a letter or digit (got {v!r})")
    return v


def check_label_name(v: str, what: str = "name") -> str:
    """DNS-1123 labels (namespaces, container names): at most 63 characters, no dots."""
    if len(v) > 63 or not _DNS1123_LABEL.match(v):
        raise ValueError(f"must be a valid Kubernetes {what}: at most 63 lower-case letters, "
                         f"digits and '-', starting and ending with a letter or digit "
                         f"(got {v!r})")
    return v
