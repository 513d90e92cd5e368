"""Helpers shared by the chart tests: values files and lookups in rendered objects."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

from tests.charts import CHART_DIR

Objects = list[dict[str, Any]]
#: The ``render_files`` fixture: values -> {template path: rendered text}.
RenderFiles = Callable[..., dict[str, str]]
#: The ``render`` fixture: values -> rendered objects.
Render = Callable[..., Objects]


def load_values(name: str) -> dict[str, Any]:
    """A values file of the chart (``values.yaml``, ``ci/ci-values.yaml``)."""
    data = yaml.safe_load((CHART_DIR / name).read_text())
    return data or {}


def only(objects: Objects, kind: str, name: str | None = None) -> dict[str, Any]:
    """The one object of ``kind`` (and ``name``)."""
    found = [o for o in objects if o["kind"] == kind
             and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def of_kind(objects: Objects, kind: str) -> Objects:
    return [o for o in objects if o["kind"] == kind]


def kinds(objects: Objects) -> list[str]:
    return sorted(o["kind"] for o in objects)


def pod_spec(objects: Objects) -> dict[str, Any]:
    """The pod template's spec of the operator Deployment."""
    return dict(only(objects, "Deployment")["spec"]["template"]["spec"])


def container(objects: Objects) -> dict[str, Any]:
    """The operator container of the Deployment."""
    pod = pod_spec(objects)
    assert [c["name"] for c in pod["containers"]] == ["operator"]
    return dict(pod["containers"][0])


def env_of(c: dict[str, Any]) -> dict[str, str]:
    """A container's literal environment (``valueFrom`` entries as empty strings)."""
    return {e["name"]: e.get("value", "") for e in c.get("env", [])}
