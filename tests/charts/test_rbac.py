"""The operator gets exactly the permissions it needs: cluster-wide when it watches every
namespace, per namespace otherwise, never Secrets and never wildcards."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.charts import CHART_DIR, NAMESPACE
from tests.charts.helpers import Render, kinds, of_kind, only

Rule = tuple[str, str, frozenset[str]]


def rule(group: str, resource: str, *verbs: str) -> Rule:
    return group, resource, frozenset(verbs)


#: Rules on namespaced resources (a ClusterRole's, or every watched namespace's Role).
NAMESPACED = {
    rule("chunktune.dev", "chunkedprefilltunings", "get", "list", "watch", "patch", "update"),
    rule("chunktune.dev", "chunkedprefilltunings/status", "get", "patch", "update"),
    rule("chunktune.dev", "chunkedprefilltunings/finalizers", "update"),
    rule("", "pods", "get", "list", "watch", "create", "delete", "patch"),
    rule("", "pods/log", "get"),
    rule("batch", "jobs", "get", "list", "watch", "create", "delete"),
    rule("", "services", "get", "list", "create", "delete"),
    rule("", "configmaps", "get", "list", "watch", "create", "update", "patch", "delete"),
    rule("", "events", "create", "patch"),
    rule("apps", "deployments", "get", "list", "patch"),
}
#: Rules on cluster-scoped resources, always in a ClusterRole.
CLUSTER = {
    rule("", "namespaces", "list", "watch"),
    rule("apiextensions.k8s.io", "customresourcedefinitions", "get", "list", "watch"),
}


def rules(role: dict[str, Any]) -> set[Rule]:
    """A role's rules, one (group, resource, verbs) per resource; no duplicates allowed."""
    out: list[Rule] = []
    for r in role["rules"]:
        assert set(r) == {"apiGroups", "resources", "verbs"}, r  # no resourceNames etc.
        for group in r["apiGroups"]:
            for resource in r["resources"]:
                out.append((group, resource, frozenset(r["verbs"])))
    assert len(out) == len({(g, res) for g, res, _ in out}), "a resource appears twice"
    return set(out)


def subject(name: str = "chunktune") -> list[dict[str, str]]:
    return [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]


def test_all_namespaces_gets_one_cluster_role(render: Render) -> None:
    objects = render()
    role = only(objects, "ClusterRole")
    assert rules(role) == NAMESPACED | CLUSTER
    binding = only(objects, "ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": role["metadata"]["name"]}
    assert binding["subjects"] == subject()
    assert not of_kind(objects, "Role") and not of_kind(objects, "RoleBinding")


@pytest.mark.parametrize("namespaces", [["ml"], ["ml", "team-b", "chunktune"]])
def test_listed_namespaces_get_a_role_each(render: Render, namespaces: list[str]) -> None:
    objects = render({"watchNamespaces": namespaces})
    cluster_role = only(objects, "ClusterRole")
    assert rules(cluster_role) == CLUSTER
    assert only(objects, "ClusterRoleBinding")["subjects"] == subject()
    roles = of_kind(objects, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(namespaces)
    for role in roles:
        assert rules(role) == NAMESPACED
    bindings = of_kind(objects, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == sorted(namespaces)
    for b in bindings:
        role = next(
            r for r in roles if r["metadata"]["namespace"] == b["metadata"]["namespace"])
        assert b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                "name": role["metadata"]["name"]}
        assert b["subjects"] == subject()


@pytest.mark.parametrize("values", [{}, {"watchNamespaces": ["ml"]}], ids=["cluster", "ns"])
def test_least_privilege(render: Render, values: dict[str, Any]) -> None:
    for role in [*of_kind(render(values), "ClusterRole"), *of_kind(render(values), "Role")]:
        for group, resource, verbs in rules(role):
            assert "*" not in (group, resource) and "*" not in verbs
            assert resource != "secrets", "the operator must not read Secrets"
            assert not verbs & {"escalate", "bind", "impersonate", "deletecollection"}


def test_rbac_can_be_left_out(render: Render) -> None:
    objects = render({"rbac": {"create": False}, "serviceAccount": {"create": False,
                                                                    "name": "ops"}})
    assert kinds(objects) == ["Deployment", "PersistentVolumeClaim", "Service"]


def test_bindings_follow_the_service_account_name(render: Render) -> None:
    objects = render({"serviceAccount": {"name": "ops-sa"}, "watchNamespaces": ["ml"]})
    assert only(objects, "RoleBinding")["subjects"] == subject("ops-sa")
    assert only(objects, "ClusterRoleBinding")["subjects"] == subject("ops-sa")


def test_the_chart_readme_documents_the_same_rules() -> None:
    """The README's permissions table is the rule set the tests pin."""
    table: set[Rule] = set()
    for line in (CHART_DIR / "README.md").read_text().splitlines():
        m = re.match(r"^\| (`[\w.]+`|core) \| `([\w/]+)` \| ([a-z, ]+) \|", line)
        if m:
            group = "" if m.group(1) == "core" else m.group(1).strip("`")
            table.add(rule(group, m.group(2), *(v.strip() for v in m.group(3).split(","))))
    assert table == NAMESPACED | CLUSTER


@pytest.mark.parametrize("values", [{}, {"watchNamespaces": ["ml"]}], ids=["cluster", "ns"])
def test_secrets_are_read_only_with_database_urls_allowed(render: Render,
                                                          values: dict[str, Any]) -> None:
    """``storage.allowDatabaseURLs`` adds exactly ``get`` on Secrets (for
    ``spec.storageFrom``), in the role that holds the namespaced rules."""
    objects = render({**values, "storage": {"allowDatabaseURLs": True}})
    found = [(group, resource, verbs) for role in [*of_kind(objects, "ClusterRole"),
                                                   *of_kind(objects, "Role")]
             for group, resource, verbs in rules(role) if resource == "secrets"]
    assert found == [("", "secrets", {"get"})] * (len(values.get("watchNamespaces", [])) or 1)


def test_secret_labels_are_read_only_when_opted_in(render: Render) -> None:
    [role] = of_kind(render({"policy": {"secretOptInLabel": True}}), "ClusterRole")
    assert rule("", "secrets", "get") in rules(role)
    assert rules(role) - {rule("", "secrets", "get")} == NAMESPACED | CLUSTER
    [role] = of_kind(render(), "ClusterRole")
    assert not any(res == "secrets" for _, res, _ in rules(role))
