"""The operator Deployment runs ``chunktune operator run`` the way the operator expects: its
arguments, environment, state volume, probes and security settings."""

from __future__ import annotations

import argparse
import re
from typing import Any

import helm_python as helm
import pytest

from tests.charts import REPO, REPOSITORY
from tests.charts.helpers import Render, container, env_of, load_values, only, pod_spec

STATE_DIR = "/var/lib/chunktune"
METRICS = "0.0.0.0:8080"
IMAGE = f"{REPOSITORY}:0.1.0"


def test_default_args(render: Render) -> None:
    assert container(render())["args"] == [
        "operator", "run", "--all-namespaces", "--state-dir", STATE_DIR, "--standalone",
        "--metrics-address", METRICS]


def test_watched_namespaces_become_namespace_flags(render: Render) -> None:
    args = container(render(load_values("ci/ci-values.yaml")))["args"]
    assert args[:6] == ["operator", "run", "--namespace", "chunktune-ci",
                        "--namespace", "chunktune-ci-2"]
    assert "--all-namespaces" not in args
    assert args[6:] == ["--state-dir", STATE_DIR, "--standalone", "--metrics-address", METRICS]


def test_extra_args_come_last(render: Render) -> None:
    args = container(render({"operator": {"extraArgs": ["--x", "y z"]}}))["args"]
    assert args[-2:] == ["--x", "y z"]


def test_no_command_override(render: Render) -> None:
    """The image's ENTRYPOINT (chunktune) runs the args."""
    assert "command" not in container(render())


def test_image_and_chunktune_image(render: Render) -> None:
    c = container(render())
    assert c["image"] == IMAGE
    assert c["imagePullPolicy"] == "IfNotPresent"
    env = env_of(c)
    assert env["CHUNKTUNE_IMAGE"] == c["image"]
    assert env["CHUNKTUNE_IMAGE_PULL_POLICY"] == "IfNotPresent"
    c = container(render({"image": {"repository": "r.example/ct", "tag": "dev",
                                    "pullPolicy": "Always"}}))
    assert c["image"] == env_of(c)["CHUNKTUNE_IMAGE"] == "r.example/ct:dev"
    assert env_of(c)["CHUNKTUNE_IMAGE_PULL_POLICY"] == "Always"
    c = container(render({"trials": {"imagePullPolicy": "Never"}}))
    assert (c["imagePullPolicy"], env_of(c)["CHUNKTUNE_IMAGE_PULL_POLICY"]) == (
        "IfNotPresent", "Never")


def test_trial_and_operator_environment(render: Render) -> None:
    env = env_of(container(render()))
    assert env == {"POD_NAME": "", "POD_NAMESPACE": "",  # from the downward API
                   "CHUNKTUNE_IMAGE": IMAGE, "CHUNKTUNE_IMAGE_PULL_POLICY": "IfNotPresent",
                   "CHUNKTUNE_SHM_SIZE": "8Gi", "CHUNKTUNE_KEEP_TRIAL_OBJECTS": "false",
                   "CHUNKTUNE_PROMETHEUS_SELECT_BY": "pod", "CHUNKTUNE_LOG_LEVEL": "INFO",
                   "CHUNKTUNE_ALLOW_DATABASE_URLS": "false",
                   "CHUNKTUNE_ALLOWED_SECRETS": "", "CHUNKTUNE_SECRET_OPT_IN": "false",
                   "CHUNKTUNE_ALLOWED_REGISTRIES": ""}
    c = container(render({"trials": {"serviceAccountName": "trials", "shmSize": "16Gi",
                                     "keepObjects": True},
                          "operator": {"logLevel": "DEBUG",
                                       "extraEnv": [{"name": "CHUNKTUNE_POLL_INTERVAL",
                                                     "value": "2"}]},
                          "prometheus": {"selectBy": "instance"}}))
    env = env_of(c)
    assert env["CHUNKTUNE_TRIAL_SERVICE_ACCOUNT"] == "trials"
    assert env["CHUNKTUNE_SHM_SIZE"] == "16Gi"
    assert env["CHUNKTUNE_KEEP_TRIAL_OBJECTS"] == "true"
    assert env["CHUNKTUNE_LOG_LEVEL"] == "DEBUG"
    assert env["CHUNKTUNE_PROMETHEUS_SELECT_BY"] == "instance"
    assert c["env"][-1] == {"name": "CHUNKTUNE_POLL_INTERVAL", "value": "2"}


def test_policy_values_reach_the_operator(render: Render) -> None:
    from chunktune.k8s.settings import PolicySettings, Settings

    env = env_of(container(render({"policy": {
        "allowedSecrets": ["hf-token", "db"], "secretOptInLabel": True,
        "allowedRegistries": ["docker.io/vllm", "nvcr.io"]}})))
    assert Settings.from_env(env).policy == PolicySettings(
        ("hf-token", "db"), True, ("docker.io/vllm", "nvcr.io"))
    assert Settings.from_env(env_of(container(render()))).policy == PolicySettings()


@pytest.mark.parametrize("values", [{}, load_values("ci/ci-values.yaml"), {
    "trials": {"serviceAccountName": "trials", "keepObjects": True, "shmSize": "1Gi"},
    "prometheus": {"selectBy": "instance"}, "operator": {"logLevel": "ERROR"},
    "storage": {"allowDatabaseURLs": True}}],
    ids=["defaults", "ci", "custom"])
def test_the_operator_settings_accept_the_environment(render: Render,
                                                      values: dict[str, Any]) -> None:
    """``Settings.from_env`` (what the operator reads at start-up) parses every variable the
    chart sets, to the values the chart meant."""
    settings = pytest.importorskip("chunktune.k8s.settings")
    c = container(render(values))
    env = env_of(c)
    s = settings.Settings.from_env(env)
    assert s.trials.image == c["image"]
    assert s.trials.image_pull_policy == env["CHUNKTUNE_IMAGE_PULL_POLICY"]
    assert s.trials.service_account == (env.get("CHUNKTUNE_TRIAL_SERVICE_ACCOUNT") or None)
    assert s.trials.shm_size == env["CHUNKTUNE_SHM_SIZE"]
    assert s.trials.keep_objects is (env["CHUNKTUNE_KEEP_TRIAL_OBJECTS"] == "true")
    assert s.trials.prometheus_select_by == env["CHUNKTUNE_PROMETHEUS_SELECT_BY"]
    assert s.log_level == env["CHUNKTUNE_LOG_LEVEL"]
    assert s.allow_database_urls is (env["CHUNKTUNE_ALLOW_DATABASE_URLS"] == "true")
    assert s.state_dir == settings.DEFAULT_STATE_DIR
    assert str(settings.DEFAULT_STATE_DIR) == STATE_DIR


def _operator_run_parser() -> argparse.ArgumentParser | None:
    from chunktune.cli import build_parser

    def sub(p: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser | None:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction) and name in action.choices:
                return action.choices[name]  # type: ignore[no-any-return]
        return None

    operator = sub(build_parser(), "operator")
    return sub(operator, "run") if operator else None


@pytest.mark.parametrize("values", [{}, load_values("ci/ci-values.yaml")],
                         ids=["all-namespaces", "namespaces"])
def test_the_operator_cli_accepts_the_args(render: Render, values: dict[str, Any]) -> None:
    """Once ``chunktune operator run`` exists, it parses the Deployment's args; until then the
    documented flags are what the other tests pin."""
    parser = _operator_run_parser()
    if parser is None:
        pytest.skip("`chunktune operator run` is not registered yet")
    args = container(render(values))["args"]
    assert args[:2] == ["operator", "run"]
    help_text = parser.format_help()
    for flag in ("--all-namespaces", "--namespace", "--state-dir", "--standalone",
                 "--metrics-address", "--leader-elect"):
        assert flag in help_text, f"`chunktune operator run --help` lacks {flag}"
    _, unknown = parser.parse_known_args(args[2:])
    assert not unknown, f"`chunktune operator run` does not know {unknown}"


def test_probes_hit_the_operator_endpoint(render: Render) -> None:
    """/healthz and /metrics on one port, served by every replica (a standby too, which runs
    no kopf and so has no kopf liveness endpoint)."""
    for port in (8080, 9091):
        c = container(render({"operator": {"healthPort": port}}))
        assert c["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"}]
        assert c["args"][c["args"].index("--metrics-address") + 1] == f"0.0.0.0:{port}"
        assert "--liveness" not in c["args"]
        for probe in ("livenessProbe", "readinessProbe"):
            assert c[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
            assert c[probe]["failureThreshold"] >= 3


def test_single_writer_deployment(render: Render, chart: helm.Chart) -> None:
    deployment = only(render(), "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    with pytest.raises(helm.HelmValuesError, match="'replicas' not allowed"):
        chart.validate_schema({"replicas": 2})


def _mounts(c: dict[str, Any]) -> dict[str, str]:
    return {m["mountPath"]: m["name"] for m in c["volumeMounts"]}


def test_state_volume(render: Render) -> None:
    objects = render()
    assert _mounts(container(objects)) == {STATE_DIR: "state", "/tmp": "tmp"}
    volumes = {v["name"]: v for v in pod_spec(objects)["volumes"]}
    assert volumes["state"]["persistentVolumeClaim"] == {"claimName": "chunktune-state"}
    assert only(objects, "PersistentVolumeClaim")["metadata"]["name"] == "chunktune-state"
    assert volumes["tmp"]["emptyDir"] == {"sizeLimit": "256Mi"}
    volumes = {v["name"]: v for v in pod_spec(render({"persistence": {"enabled": False}}))
               ["volumes"]}
    assert volumes["state"] == {"name": "state", "emptyDir": {}}
    volumes = {v["name"]: v for v in pod_spec(
        render({"persistence": {"existingClaim": "studies"}}))["volumes"]}
    assert volumes["state"]["persistentVolumeClaim"] == {"claimName": "studies"}


def test_security_context(render: Render) -> None:
    objects = render()
    sc = container(objects)["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    pod = pod_spec(objects)["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    # the state volume is writable by the image's user
    user = re.search(r"^USER (\d+):(\d+)$", (REPO / "Dockerfile").read_text(), re.M)
    assert user, "the Dockerfile's USER must be numeric uid:gid"
    assert (pod["runAsUser"], pod["runAsGroup"], pod["fsGroup"]) == (
        int(user.group(1)), int(user.group(2)), int(user.group(2)))


def test_writable_paths_are_volumes(render: Render) -> None:
    """With a read-only root file system, every path the image writes to must be a mount."""
    mounts = _mounts(container(render()))
    dockerfile = (REPO / "Dockerfile").read_text()
    for var in ("MPLCONFIGDIR", "CHUNKTUNE_STATE_DIR"):
        m = re.search(rf"{var}=(\S+)", dockerfile)
        assert m, var
        assert any(m.group(1) == p or m.group(1).startswith(p + "/") for p in mounts), var


def test_pod_placement_and_identity(render: Render) -> None:
    values = {"nodeSelector": {"kubernetes.io/os": "linux"},
              "tolerations": [{"key": "ops", "operator": "Exists"}],
              "affinity": {"podAntiAffinity": {}}, "priorityClassName": "high",
              "imagePullSecrets": [{"name": "regcred"}],
              "serviceAccount": {"name": "ops-sa"}, "podAnnotations": {"x": "y"}}
    objects = render(values)
    pod = pod_spec(objects)
    for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName",
                "imagePullSecrets"):
        assert pod[key] == values[key]
    assert pod["serviceAccountName"] == "ops-sa"
    assert only(objects, "ServiceAccount")["metadata"]["name"] == "ops-sa"
    assert only(objects, "Deployment")["spec"]["template"]["metadata"]["annotations"] == {
        "x": "y"}
    pod = pod_spec(render())
    assert not {"nodeSelector", "tolerations", "affinity", "priorityClassName",
                "imagePullSecrets"} & pod.keys()
    assert pod["serviceAccountName"] == "chunktune"
    assert pod["automountServiceAccountToken"] is True


def test_resources(render: Render) -> None:
    assert container(render())["resources"] == {
        "requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}
