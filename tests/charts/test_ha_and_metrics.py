"""``replicaCount: 2`` renders a leader-elected operator the operator accepts (args, Lease
settings, RBAC on Leases, spread over nodes) and refuses values that would break failover; the
operator's ``/metrics`` is exposed by a Service, an optional ServiceMonitor, and a Grafana
dashboard ConfigMap that ships ``dashboards/chunktune-operator.json``."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

import helm_python as helm
import pytest

from tests.charts import CHART_DIR, NAMESPACE
from tests.charts.helpers import (
    Render,
    RenderFiles,
    container,
    env_of,
    kinds,
    of_kind,
    only,
    pod_spec,
)
from tests.charts.test_rbac import rule, rules

HA: dict[str, Any] = {"replicaCount": 2, "persistence": {"accessModes": ["ReadWriteMany"]}}
SELECTOR = {"app.kubernetes.io/name": "chunktune", "app.kubernetes.io/instance": "chunktune"}


def test_two_replicas_elect_a_leader(render: Render) -> None:
    from chunktune.k8s.cli import register
    from chunktune.k8s.settings import LeaderSettings, Settings

    objects = render(HA)
    deployment = only(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    c = container(objects)
    assert "--leader-elect" in c["args"]
    # the operator parses the args and the environment into the Lease the chart grants
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="cmd"))
    ns = parser.parse_args(c["args"])
    assert ns.leader_elect and ns.metrics_address == "0.0.0.0:8080"
    settings = Settings.from_env(env_of(c), leader={"enabled": ns.leader_elect})
    assert settings.leader == LeaderSettings(
        enabled=True, lease_name="chunktune", lease_namespace=NAMESPACE, lease_duration=15.0,
        renew_deadline=10.0, retry_period=2.0)
    downward = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]
                if "valueFrom" in e}
    assert downward == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    [role] = [r for r in of_kind(objects, "Role")
              if r["metadata"]["name"].endswith("leader-election")]
    assert role["metadata"]["namespace"] == NAMESPACE
    assert rules(role) == {rule("coordination.k8s.io", "leases", "get", "create", "update")}
    binding = only(objects, "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "chunktune",
                                    "namespace": NAMESPACE}]
    spread = pod_spec(objects)["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["labelSelector"]["matchLabels"] == SELECTOR
    # one replica: no election, no Lease rights, no spreading (unless asked for)
    one = render()
    assert "--leader-elect" not in container(one)["args"]
    assert not of_kind(one, "Role") and "affinity" not in pod_spec(one)
    assert "--leader-elect" in container(render({"leaderElection": {"enabled": True}}))["args"]
    given = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "pool", "operator": "In", "values": ["ops"]}]}]}}}
    assert pod_spec(render({**HA, "affinity": given}))["affinity"] == given


@pytest.mark.parametrize(("values", "message"), [
    ({"replicaCount": 2}, "persistence.accessModes to [ReadWriteMany]"),
    ({"replicaCount": 2, "persistence": {"enabled": False}}, "would lose every journal study"),
    ({"leaderElection": {"enabled": True, "leaseDuration": 10}},
     "leaseDuration > renewDeadline > retryPeriod"),
], ids=["rwo-volume", "no-volume", "lease-timings"])
def test_values_that_break_failover_are_refused(chart: helm.Chart, values: dict[str, Any],
                                                message: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        chart.render(values, name="chunktune", namespace=NAMESPACE, is_install=True)


def test_a_service_exposes_the_operators_metrics(render: Render) -> None:
    objects = render()
    service = only(objects, "Service")
    assert service["metadata"]["name"] == "chunktune-metrics"
    assert service["spec"]["selector"] == SELECTOR
    assert service["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http",
                                         "protocol": "TCP"}]
    assert [p["name"] for p in container(objects)["ports"]] == ["http"]
    assert "Service" not in kinds(render({"metrics": {"service": {"enabled": False}}}))
    assert "ServiceMonitor" not in kinds(objects)


def test_service_monitor_scrapes_that_service(render: Render, chart: helm.Chart) -> None:
    objects = render({"metrics": {"serviceMonitor": {"enabled": True, "namespace": "mon",
                                                     "labels": {"release": "kps"}}}})
    monitor = only(objects, "ServiceMonitor")
    service = only(objects, "Service")
    assert monitor["metadata"]["namespace"] == "mon"
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert monitor["spec"]["endpoints"] == [{"port": "http", "path": "/metrics",
                                             "interval": "30s"}]
    with pytest.raises(helm.HelmRenderError, match=r"needs metrics\.service\.enabled"):
        chart.render({"metrics": {"serviceMonitor": {"enabled": True},
                                  "service": {"enabled": False}}},
                     name="chunktune", namespace=NAMESPACE, is_install=True)


def test_the_dashboard_configmap_ships_the_dashboard(render: Render) -> None:
    assert not [o for o in of_kind(render(), "ConfigMap")]
    cm = only(render({"metrics": {"dashboard": {"enabled": True,
                                                "annotations": {"grafana_folder": "ml"}}}}),
              "ConfigMap")
    assert cm["metadata"]["name"] == "chunktune-dashboard"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "ml"}
    shipped = (CHART_DIR / "dashboards" / "chunktune-operator.json").read_text()
    assert json.loads(cm["data"]["chunktune-operator.json"]) == json.loads(shipped)


def test_notes_name_the_lease_and_the_metrics(render_files: RenderFiles) -> None:
    notes = render_files(HA)["chunktune/templates/NOTES.txt"]
    assert "get lease chunktune -o jsonpath='{.spec.holderIdentity}'" in notes
    assert "http://chunktune-metrics.chunktune:8080/metrics" in notes
    assert "get lease" not in render_files()["chunktune/templates/NOTES.txt"]
