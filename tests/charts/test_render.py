"""The chart renders, lints clean and produces valid Kubernetes 1.32 objects for every value set
we support."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest

from tests.charts import CHART_DIR, KUBE_VERSION, NAMESPACE, RELEASE
from tests.charts.helpers import Render, RenderFiles, kinds, load_values, only

#: The value sets the chart is tested with: the defaults, ci/ci-values.yaml and the
#: interesting corners (namespaced RBAC, no persistence, an existing claim, PodMonitor, every
#: optional pod field set).
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "ci": load_values("ci/ci-values.yaml"),
    "one-namespace": {"watchNamespaces": ["ml"]},
    "no-persistence": {"persistence": {"enabled": False}},
    "existing-claim": {"persistence": {"existingClaim": "my-studies"}},
    "storage-class-none": {"persistence": {"storageClass": "-", "size": "5Gi",
                                           "annotations": {"helm.sh/resource-policy": "keep"}}},
    "pod-monitor": {"metrics": {"podMonitor": {"enabled": True, "labels": {"release": "kps"},
                                               "scrapeTimeout": "4s"}},
                    "prometheus": {"url": "http://prometheus-operated.monitoring:9090"}},
    "pod-monitor-namespaced": {"watchNamespaces": ["ml", "batch"],
                               "metrics": {"podMonitor": {"enabled": True,
                                                          "namespace": "monitoring"}}},
    "ha": {"replicaCount": 2, "persistence": {"accessModes": ["ReadWriteMany"]},
           "leaderElection": {"leaseDuration": 20, "renewDeadline": 12.5, "retryPeriod": 2},
           "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"},
                                          "interval": "15s", "scrapeTimeout": "10s"},
                       "service": {"annotations": {"prometheus.io/scrape": "true"}},
                       "dashboard": {"enabled": True, "namespace": "monitoring",
                                     "annotations": {"grafana_folder": "chunktune"}}}},
    "ha-database": {"replicaCount": 3, "persistence": {"enabled": False},
                    "storage": {"allowDatabaseURLs": True}, "watchNamespaces": ["ml"]},
    "no-rbac-existing-sa": {"rbac": {"create": False},
                            "serviceAccount": {"create": False, "name": "ops"}},
    "everything": {
        "fullnameOverride": "tuner",
        "image": {"repository": "registry.example/chunktune", "tag": "0.2.0-rc.1",
                  "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "serviceAccount": {"name": "tuner-sa", "annotations": {"iam": "role"}},
        "operator": {"logLevel": "WARNING", "healthPort": 9090, "extraArgs": ["--verbose"],
                     "extraEnv": [{"name": "CHUNKTUNE_POLL_INTERVAL", "value": "2"},
                                  {"name": "NODE", "valueFrom": {
                                      "fieldRef": {"fieldPath": "spec.nodeName"}}}]},
        "trials": {"imagePullPolicy": "IfNotPresent", "serviceAccountName": "trials",
                   "shmSize": "16Gi", "keepObjects": True},
        "podAnnotations": {"a": "b"}, "podLabels": {"team": "ml"},
        "priorityClassName": "system-cluster-critical",
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops",
                         "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}},
        "terminationGracePeriodSeconds": 60,
    },
}

#: Objects of CRDs that kubernetes-validate has no schema for, with the fields we check.
FOREIGN = {("monitoring.coreos.com/v1", "PodMonitor"),
           ("monitoring.coreos.com/v1", "ServiceMonitor")}


@pytest.fixture(params=sorted(VALUE_SETS), scope="module")
def value_set(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return request.param, VALUE_SETS[request.param]


def test_chart_metadata(chart: helm.Chart) -> None:
    meta = chart.metadata
    assert (meta["apiVersion"], meta["name"], meta["version"], meta["appVersion"]) == (
        "v2", "chunktune", "0.1.0", "0.1.0")
    assert meta["kubeVersion"] == ">=1.27.0-0"
    assert meta["description"] and meta["keywords"]


def test_app_version_is_the_package_version(chart: helm.Chart) -> None:
    from chunktune import __version__

    assert chart.metadata["appVersion"] == __version__


def test_lint_has_no_errors(value_set: tuple[str, dict[str, Any]]) -> None:
    name, values = value_set
    report = helm.lint(CHART_DIR, values, strict=True, namespace=NAMESPACE,
                       kube_version=KUBE_VERSION)
    errors = [m for m in report["messages"] if m["severity"] >= 3]
    assert not errors and not report["errors"], f"{name}: {errors or report['errors']}"
    # strict: warnings would be errors too; only "icon is recommended" (info) may remain
    assert all(m["severity"] <= 1 for m in report["messages"]), report["messages"]


def test_objects_validate_strictly(render: Render, value_set: tuple[str, dict[str, Any]]
                                   ) -> None:
    name, values = value_set
    objects = render(values)
    assert objects
    for obj in objects:
        where = f"{name}: {obj['kind']} {obj['metadata'].get('name')}"
        if (obj["apiVersion"], obj["kind"]) in FOREIGN:
            continue
        try:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{where}: {e.message} at {'.'.join(map(str, e.path))}")


def test_every_object_is_labelled_and_namespaced(render: Render,
                                                 value_set: tuple[str, dict[str, Any]]
                                                 ) -> None:
    _, values = value_set
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding"}
    for obj in render(values):
        meta = obj["metadata"]
        labels = meta["labels"]
        assert labels["app.kubernetes.io/name"] == "chunktune"
        assert labels["app.kubernetes.io/instance"] == "chunktune"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"] == "chunktune-0.1.0"
        assert len(meta["name"]) <= 63
        if obj["kind"] in cluster_scoped:
            assert "namespace" not in meta
        else:
            assert meta.get("namespace"), f"{obj['kind']} {meta['name']} has no namespace"


def test_default_objects(render: Render) -> None:
    objects = render()
    assert kinds(objects) == ["ClusterRole", "ClusterRoleBinding", "Deployment",
                              "PersistentVolumeClaim", "Service", "ServiceAccount"]
    assert all(o["metadata"]["name"].startswith("chunktune") for o in objects)


def test_names_follow_the_release(render: Render) -> None:
    objects = render(name="tuner", namespace="ops")
    assert only(objects, "Deployment")["metadata"]["name"] == "tuner-chunktune"
    assert only(objects, "Deployment")["metadata"]["namespace"] == "ops"
    binding = only(objects, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tuner-chunktune",
                                    "namespace": "ops"}]


def test_chart_labels_win_over_pod_labels(render: Render) -> None:
    """podLabels may not override the selector labels (the Deployment selector is immutable)."""
    deployment = only(render({"podLabels": {"app.kubernetes.io/name": "other", "team": "ml"}}),
                      "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "chunktune"
    assert labels["team"] == "ml"
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector == {"app.kubernetes.io/name": "chunktune",
                        "app.kubernetes.io/instance": "chunktune"}
    assert selector.items() <= labels.items()


def test_persistence(render: Render) -> None:
    claim = only(render(), "PersistentVolumeClaim")
    assert claim["spec"] == {"accessModes": ["ReadWriteOnce"],
                             "resources": {"requests": {"storage": "1Gi"}}}
    claim = only(render({"persistence": {"storageClass": "fast", "size": "5Gi"}}),
                 "PersistentVolumeClaim")
    assert claim["spec"]["storageClassName"] == "fast"
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    claim = only(render({"persistence": {"storageClass": "-"}}), "PersistentVolumeClaim")
    assert claim["spec"]["storageClassName"] == ""
    assert "PersistentVolumeClaim" not in kinds(render({"persistence": {"enabled": False}}))
    assert "PersistentVolumeClaim" not in kinds(
        render({"persistence": {"existingClaim": "mine"}}))


def test_pod_monitor(render: Render) -> None:
    assert "PodMonitor" not in kinds(render())
    monitor = only(render(VALUE_SETS["pod-monitor"]), "PodMonitor")
    assert monitor["metadata"]["namespace"] == NAMESPACE
    assert monitor["metadata"]["labels"]["release"] == "kps"
    spec = monitor["spec"]
    # the labels the operator puts on trial engine pods (chunktune.backends.manifests)
    engine_labels = {"app.kubernetes.io/managed-by": "chunktune",
                     "app.kubernetes.io/component": "engine"}
    assert spec["selector"] == {"matchLabels": engine_labels}
    try:
        from chunktune.backends import manifests
    except ImportError:
        pass
    else:
        assert engine_labels == \
            {manifests.MANAGED_BY: "chunktune", manifests.COMPONENT: "engine"}
    assert spec["namespaceSelector"] == {"any": True}
    assert spec["podMetricsEndpoints"] == [{"port": "http", "path": "/metrics",
                                            "interval": "5s", "scrapeTimeout": "4s"}]
    monitor = only(render(VALUE_SETS["pod-monitor-namespaced"]), "PodMonitor")
    assert monitor["metadata"]["namespace"] == "monitoring"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["ml", "batch"]}


def test_notes(render_files: RenderFiles) -> None:
    notes = render_files()["chunktune/templates/NOTES.txt"]
    assert "kubectl get cpt -A -w" in notes
    assert "examples/sim-cluster.yaml" in notes
    assert "status.best" in notes
    assert "every namespace" in notes
    assert "WARNING" not in notes
    notes = render_files(VALUE_SETS["ci"])["chunktune/templates/NOTES.txt"]
    assert "chunktune-ci, chunktune-ci-2" in notes
    assert "kubectl apply -n chunktune-ci -f" in notes
    assert "WARNING: persistence.enabled=false" in notes
    assert "starts over" in notes
    notes = render_files(VALUE_SETS["pod-monitor"])["chunktune/templates/NOTES.txt"]
    assert "prometheusURL: http://prometheus-operated.monitoring:9090" in notes


def test_an_install_without_an_image_says_how_to_make_one(chart: helm.Chart) -> None:
    """No chunktune image is published: ``helm install`` without ``image.repository`` stops
    before rendering anything, naming the value and how to build, push and point at an image."""
    with pytest.raises(helm.HelmRenderError, match=r"image\.repository is required") as caught:
        chart.render({}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    text = str(caught.value)
    assert "docker build -t REGISTRY/chunktune:0.1.0 ." in text, text
    assert "--set image.repository=REGISTRY/chunktune --set image.tag=0.1.0" in text, text
    with pytest.raises(helm.HelmRenderError, match=r"image\.repository is required"):
        chart.render({"image": {"repository": ""}}, name=RELEASE, namespace=NAMESPACE,
                     is_install=True)


def test_notes_name_what_a_first_install_needs(render_files: RenderFiles) -> None:
    notes = render_files()["chunktune/templates/NOTES.txt"]
    assert "the chunktune image (registry.example/chunktune:0.1.0, built from the" in notes
    assert "storage class" in notes and "the cluster's default" in notes
    assert "GPU node" in notes and "engine.kind: vllm" in notes
    assert "--set policy.allowedSecrets={hf-token}" in notes
    notes = render_files({"image": {"repository": "registry.example.com/ml/chunktune",
                                    "tag": "0.1.0"},
                          "persistence": {"storageClass": "fast-ssd"},
                          "policy": {"allowedSecrets": ["hf-token"]}})[
        "chunktune/templates/NOTES.txt"]
    assert "class fast-ssd" in notes and "allowed: hf-token" in notes


def test_readmes_explain_the_cluster_path() -> None:
    from tests.charts import CHART_DIR

    for readme in (CHART_DIR.parents[1] / "README.md", CHART_DIR / "README.md"):
        text = readme.read_text()
        assert "docker build -t REGISTRY/chunktune:" in text, readme
        assert "--set image.repository=REGISTRY/chunktune --set image.tag=" in text, readme
        assert "GPU node" in text and "storage class" in text, readme
        assert "policy.allowedSecrets" in text, readme


def test_crds_come_separately(chart: helm.Chart, render_files: RenderFiles) -> None:
    """The CRD sits in crds/ (installed before the templates, never templated)."""
    assert [c["filename"] for c in chart.crds] == [
        "chunktune/crds/chunkedprefilltunings.chunktune.dev.yaml"]
    assert not any("CustomResourceDefinition" in text for text in render_files().values())


def test_the_validator_catches_unknown_fields(render: Render) -> None:
    """Strict validation is not a no-op: a misspelt field in a rendered object fails."""
    deployment = only(render(), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSION, strict=True)
