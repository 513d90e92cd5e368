"""The Grafana dashboard the chart ships (``dashboards/chunktune-operator.json``) loads: valid
JSON in Grafana's dashboard shape, panels laid out on the 24-column grid, every query on the
Prometheus data source variable, every metric it names one the operator exposes (and every
metric the operator exposes on some panel), and every query accepted by a real Prometheus."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chunktune.k8s.operator_metrics import METRIC_NAMES
from tests.charts import CHART_DIR

DASHBOARD = CHART_DIR / "dashboards" / "chunktune-operator.json"
METRIC = re.compile(r"\bchunktune_[a-z_]+\b")
VARIABLE = re.compile(r"\$\{?(\w+)\}?")
#: What Grafana puts for its variables when it runs a query.
SUBSTITUTE = {"$__rate_interval": "1m", "$namespace": ".*", "$tuning": ".*"}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def targets(dashboard: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            yield panel, target


def test_the_dashboard_has_grafanas_shape(dashboard: dict[str, Any]) -> None:
    assert {"title", "uid", "schemaVersion", "panels", "templating", "time"} <= set(dashboard)
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["uid"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        assert panel["type"] in {"timeseries", "stat", "table"} and panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0
        mine = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not cells & mine, f"panel {panel['title']!r} overlaps another"
        cells |= mine
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs))
    defined = {v["name"] for v in dashboard["templating"]["list"]}
    assert defined == {"datasource", "namespace", "tuning"}
    for panel, target in targets(dashboard):
        assert panel["datasource"] == target["datasource"] == {
            "type": "prometheus", "uid": "${datasource}"}
        used = set(VARIABLE.findall(target["expr"])) - {"__rate_interval"}
        assert used <= defined, (panel["title"], used)


def test_every_metric_on_the_dashboard_exists_and_every_one_is_shown(
        dashboard: dict[str, Any]) -> None:
    named = {m for _, t in targets(dashboard) for m in METRIC.findall(t["expr"])}
    for v in dashboard["templating"]["list"]:
        named |= set(METRIC.findall(json.dumps(v.get("query", ""))))
    assert named <= METRIC_NAMES, named - METRIC_NAMES
    families = {re.sub(r"_(total|bucket|sum|count|created)$", "", n) for n in METRIC_NAMES}
    shown = {re.sub(r"_(total|bucket|sum|count|created)$", "", n) for n in named}
    assert families == shown, families - shown


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if shutil.which("prometheus") is None:
        pytest.fail("no prometheus binary: apt-get install prometheus (.ci/run does)")
    tmp: Path = tmp_path_factory.mktemp("prometheus")
    (tmp / "prometheus.yml").write_text("global: {scrape_interval: 15s}\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "Prometheus did not start"
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.slow
def test_every_query_parses_in_prometheus(dashboard: dict[str, Any], prometheus: str) -> None:
    for panel, target in targets(dashboard):
        expr = target["expr"]
        for var, value in SUBSTITUTE.items():
            expr = expr.replace(var, value)
        query = urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(f"{prometheus}/api/v1/query?{query}", timeout=10) as r:
                answer = json.loads(r.read())
        except urllib.error.HTTPError as e:
            answer = json.loads(e.read())
        assert answer["status"] == "success", (panel["title"], expr, answer.get("error"))
