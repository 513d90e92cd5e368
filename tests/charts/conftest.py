"""Fixtures that render the chart offline (helm-python-sdk runs Helm's own Go code: no helm
binary, no cluster)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.charts import CHART_DIR, NAMESPACE, RELEASE, REPOSITORY
from tests.charts.helpers import Objects, Render, RenderFiles


@pytest.fixture(scope="session")
def chart() -> Iterator[helm.Chart]:
    c = helm.Chart.load(CHART_DIR)
    yield c
    c.close()


@pytest.fixture(scope="session")
def render_files(chart: helm.Chart) -> RenderFiles:
    """Values -> {template path: rendered text}, as ``helm install chunktune -n chunktune
    --set image.repository=REPOSITORY`` renders them (the values are checked against
    values.schema.json first; ``image.repository`` is :data:`REPOSITORY` unless they name
    one)."""
    def render(values: dict[str, Any] | None = None, *, name: str = RELEASE,
               namespace: str = NAMESPACE) -> dict[str, str]:
        values = dict(values or {})
        image = values.get("image")
        if not isinstance(image, dict) or "repository" not in image:
            values["image"] = {"repository": REPOSITORY,
                               **(image if isinstance(image, dict) else {})}
        return chart.render(values, name=name, namespace=namespace, is_install=True)
    return render


@pytest.fixture(scope="session")
def render(render_files: RenderFiles) -> Render:
    """Values -> the rendered Kubernetes objects (NOTES.txt and empty documents left out)."""
    def objects(values: dict[str, Any] | None = None, **kw: str) -> Objects:
        out: Objects = []
        for path, text in sorted(render_files(values, **kw).items()):
            if not path.endswith("NOTES.txt"):
                out.extend(doc for doc in yaml.safe_load_all(text) if doc)
        return out
    return objects
