"""values.schema.json is strict and complete, and values.yaml documents every value.

Strict: every chart-defined object is closed (``additionalProperties: false``), every key has a
type and a description, and a bad value fails ``helm install`` with a message naming the key.
The exceptions are values that are whole Kubernetes API objects (affinity, the security
contexts, an EnvVar's valueFrom); the API server validates those, and the render tests check
the defaults with kubernetes-validate.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import helm_python as helm
import pytest

from tests.charts import CHART_DIR
from tests.charts.helpers import Render, load_values

SCHEMA = json.loads((CHART_DIR / "values.schema.json").read_text())
#: Values that are Kubernetes API objects, passed through as they are.
KUBERNETES_OBJECTS = {"affinity", "podSecurityContext", "securityContext",
                      "operator.extraEnv[].valueFrom"}


def nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for key, sub in node.get("properties", {}).items():
        yield from nodes(sub, f"{path}.{key}" if path else key)
    if isinstance(node.get("items"), dict):
        yield from nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from nodes(node["additionalProperties"], f"{path}.*")


def leaves(node: dict[str, Any] = SCHEMA, path: str = "") -> Iterator[str]:
    """The keys a user sets: properties whose node is not a closed object of properties."""
    for key, sub in node.get("properties", {}).items():
        sub_path = f"{path}.{key}" if path else key
        if "properties" in sub and sub_path != "resources" and sub_path not in KUBERNETES_OBJECTS:
            yield from leaves(sub, sub_path)
        else:
            yield sub_path


def test_every_node_has_a_type_and_every_key_a_description() -> None:
    for path, node in nodes(SCHEMA):
        assert "type" in node, f"{path or '<root>'}: no type"
        if path.endswith(".*"):
            continue  # the values of a map (labels, resources)
        assert isinstance(node.get("description"), str) and node["description"].strip(), \
            f"{path or '<root>'}: no description"


def test_every_object_is_closed() -> None:
    for path, node in nodes(SCHEMA):
        types = node["type"] if isinstance(node["type"], list) else [node["type"]]
        if "object" not in types or path in KUBERNETES_OBJECTS:
            continue
        extra = node.get("additionalProperties")
        assert extra is False or isinstance(extra, dict), \
            f"{path or '<root>'}: objects must set additionalProperties (false, or a value type)"
        if "properties" in node:
            assert extra is False, f"{path or '<root>'}: additionalProperties must be false"


def test_defaults_pass(chart: helm.Chart) -> None:
    chart.validate_schema(load_values("values.yaml"))
    chart.validate_schema(load_values("ci/ci-values.yaml"))
    chart.validate_schema({})


def _flatten(value: Any, path: str = "") -> Iterator[str]:
    if isinstance(value, dict) and path not in {"resources", *KUBERNETES_OBJECTS} and \
            not path.endswith(("annotations", "labels", "Labels", "Annotations", "Selector")):
        for key, sub in value.items():
            yield from _flatten(sub, f"{path}.{key}" if path else key)
    else:
        yield path


def test_values_yaml_sets_every_key_of_the_schema() -> None:
    """Every value has its default in values.yaml, and values.yaml has nothing else."""
    assert set(_flatten(load_values("values.yaml"))) == set(leaves())


def test_values_yaml_documents_every_value() -> None:
    """A comment sits right above every value in values.yaml."""
    wanted = set(leaves())
    stack: list[tuple[int, str]] = []
    previous = ""
    undocumented = []
    for line in (CHART_DIR / "values.yaml").read_text().splitlines():
        m = re.match(r"^( *)([A-Za-z][\w.-]*):", line)
        if m:
            indent = len(m.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            path = ".".join([k for _, k in stack] + [m.group(2)])
            stack.append((indent, m.group(2)))
            if path in wanted and not previous.lstrip().startswith("#"):
                undocumented.append(path)
        if line.strip():
            previous = line
    assert not undocumented


def test_chart_readme_lists_every_value() -> None:
    readme = (CHART_DIR / "README.md").read_text()
    missing = [key for key in leaves() if f"| `{key}` |" not in readme]
    assert not missing


BAD_VALUES = [
    ({"bogus": 1}, "", "'bogus' not allowed"),
    ({"image": {"tga": "x"}}, "/image", "'tga' not allowed"),
    ({"image": {"tag": 1.0}}, "/image/tag", "want string"),
    ({"image": {"pullPolicy": "always"}}, "/image/pullPolicy", "must be one of"),
    ({"watchNamespaces": "ml"}, "/watchNamespaces", "want array"),
    ({"watchNamespaces": ["ML_team"]}, "/watchNamespaces/0", "does not match pattern"),
    ({"watchNamespaces": ["ml", "ml"]}, "/watchNamespaces", "items at 0 and 1 are equal"),
    ({"serviceAccount": {"create": "yes"}}, "/serviceAccount/create", "want boolean"),
    ({"operator": {"logLevel": "TRACE"}}, "/operator/logLevel", "must be one of"),
    ({"operator": {"healthPort": 0}}, "/operator/healthPort", "minimum"),
    ({"operator": {"extraArgs": "--verbose"}}, "/operator/extraArgs", "want array"),
    ({"operator": {"extraEnv": [{"value": "x"}]}}, "/operator/extraEnv/0", "name"),
    ({"operator": {"extraEnv": [{"name": "A", "vaule": "x"}]}}, "/operator/extraEnv/0",
     "'vaule' not allowed"),
    ({"trials": {"keepObjects": "true"}}, "/trials/keepObjects", "want boolean"),
    ({"trials": {"shmSize": "lots"}}, "/trials/shmSize", "does not match pattern"),
    ({"persistence": {"enabled": "yes"}}, "/persistence/enabled", "want boolean"),
    ({"persistence": {"size": 1}}, "/persistence/size", "want string"),
    ({"persistence": {"accessModes": ["ReadWriteAlways"]}}, "/persistence/accessModes/0",
     "must be one of"),
    ({"resources": {"limits": {"memory": "lots"}}}, "/resources/limits/memory",
     "does not match pattern"),
    ({"resources": {"cpu": "1"}}, "/resources", "'cpu' not allowed"),
    ({"nodeSelector": {"disk": True}}, "/nodeSelector/disk", "want string"),
    ({"tolerations": [{"key": "a", "efect": "NoSchedule"}]}, "/tolerations/0",
     "'efect' not allowed"),
    ({"terminationGracePeriodSeconds": "30"}, "/terminationGracePeriodSeconds",
     "want integer"),
    ({"metrics": {"serviceMonitors": {"enabled": True}}}, "/metrics",
     "'serviceMonitors' not allowed"),
    ({"replicaCount": 0}, "/replicaCount", "minimum"),
    ({"leaderElection": {"leaseDuration": "15s"}}, "/leaderElection/leaseDuration",
     "want number"),
    ({"metrics": {"podMonitor": {"interval": "5 seconds"}}}, "/metrics/podMonitor/interval",
     "does not match pattern"),
    ({"prometheus": {"url": "prometheus:9090"}}, "/prometheus/url", "does not match pattern"),
    ({"prometheus": {"selectBy": "ip"}}, "/prometheus/selectBy", "must be one of"),
    ({"policy": {"allowedSecrets": "hf-token"}}, "/policy/allowedSecrets", "want array"),
    ({"policy": {"allowedSecrets": ["HF_TOKEN"]}}, "/policy/allowedSecrets/0",
     "does not match pattern"),
    ({"policy": {"allowedRegistries": ["https://docker.io"]}}, "/policy/allowedRegistries/0",
     "does not match pattern"),
    ({"policy": {"secretOptInLabel": "yes"}}, "/policy/secretOptInLabel", "want boolean"),
    # a privileged or root operator only with securityContext.allowRoot: true
    ({"securityContext": {"privileged": True}}, "/securityContext/privileged",
     "value must be false"),
    ({"securityContext": {"runAsUser": 0}}, "/securityContext/runAsUser", "minimum"),
    ({"securityContext": {"runAsNonRoot": False}}, "/securityContext/runAsNonRoot",
     "value must be true"),
    ({"securityContext": {"allowPrivilegeEscalation": True}},
     "/securityContext/allowPrivilegeEscalation", "value must be false"),
    ({"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}},
     "/securityContext/capabilities/add", "maxItems"),
    ({"podSecurityContext": {"runAsUser": 0}}, "/podSecurityContext/runAsUser", "minimum"),
    ({"podSecurityContext": {"runAsNonRoot": False}}, "/podSecurityContext/runAsNonRoot",
     "value must be true"),
    ({"securityContext": {"allowRoot": "yes"}}, "/securityContext/allowRoot", "want boolean"),
]


@pytest.mark.parametrize(("values", "where", "message"), BAD_VALUES,
                         ids=[w.strip("/") or "root" for _, w, _ in BAD_VALUES])
def test_bad_values_are_rejected_naming_the_key(chart: helm.Chart, values: dict[str, Any],
                                                where: str, message: str) -> None:
    with pytest.raises(helm.HelmValuesError) as caught:
        chart.validate_schema(values)
    text = str(caught.value)
    assert f"at '{where}'" in text, text
    assert message in text, text


def test_install_refuses_bad_values(render: Render) -> None:
    """`helm install` checks the schema before rendering anything."""
    with pytest.raises(helm.HelmValuesError, match="'bogus' not allowed"):
        render({"persistence": {"bogus": True}})


def test_root_operator_only_when_explicitly_requested(chart: helm.Chart, render: Render
                                                      ) -> None:
    root = {"securityContext": {"allowRoot": True, "runAsNonRoot": False, "runAsUser": 0},
            "podSecurityContext": {"runAsNonRoot": False, "runAsUser": 0}}
    chart.validate_schema({**load_values("values.yaml"), **root})
    from tests.charts.helpers import container

    sc = container(render(root))["securityContext"]
    assert sc["runAsUser"] == 0 and "allowRoot" not in sc
    assert "allowRoot" not in container(render())["securityContext"]
