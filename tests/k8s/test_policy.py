"""No confused deputy: what a tuning may make the operator reference or write
(:mod:`chunktune.k8s.policy`) — the rules one by one, and each refusal and allowed path against
the emulator (a condition naming the field and the fix; nothing created)."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import pytest

from chunktune.api.reader import parse_manifest
from chunktune.backends import manifests as mf
from chunktune.k8s import outputs, policy
from chunktune.k8s.kube import KubeApi
from chunktune.k8s.live import StopCause
from chunktune.k8s.settings import PolicySettings, Settings
from tests.k8s.conftest import (
    make_owner,
    operator_settings,
    running_operator,
    status_of,
    trial_objects,
    tuning,
    wait_phase,
)
from tests.kube.emulator import KubeEmulator
from tests.kube.kubelet import FakeKubelet

OWNER = mf.Owner("llama-tune", "ml", "uid-1")
OWN_IMAGE = "ghcr.io/chunktune/chunktune:test"


def with_secret(name: str = "hf", **engine: Any) -> Any:
    m = tuning("t", engine={"kind": "vllm", "model": "m", "image": "vllm/vllm-openai:v0.11.0",
                            "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
                                "name": name, "key": "token"}}}], **engine})
    return parse_manifest(m)


# ---- the rules -------------------------------------------------------------------------------


def test_secret_rules() -> None:
    t = with_secret()
    [(field, name, optional)] = policy.secret_refs(t)
    assert (field, name, optional) == ("spec.engine.env[0].valueFrom.secretKeyRef.name", "hf",
                                       False)
    labelled = {"metadata": {"labels": {policy.ALLOW_REFERENCE_LABEL: "true"}}}
    plain = {"metadata": {"labels": {"app": "x"}}}
    assert PolicySettings().secret_opt_in_label is False  # nothing is allowed by default
    default = PolicySettings(secret_opt_in_label=True)
    assert policy.secret_refusal(field, "hf", "ml", labelled, default) is None
    r = policy.secret_refusal(field, "hf", "ml", plain, default)
    assert r is not None and r.field == field and r.reason == "SecretNotAllowed"
    assert "kubectl -n ml label secret hf chunktune.dev/allow-reference=true" in r.message
    assert "policy.allowedSecrets" in r.message
    listed = PolicySettings(allowed_secrets=("hf",))
    assert policy.secret_refusal(field, "hf", "ml", None, listed) is None
    missing = policy.secret_refusal(field, "hf", "ml", None, default)
    assert missing is not None and missing.reason == "SecretNotFound"
    assert policy.secret_refusal(field, "hf", "ml", None, default, optional=True) is None
    strict = PolicySettings(secret_opt_in_label=False)
    r = policy.secret_refusal(field, "hf", "ml", labelled, strict)
    assert r is not None and "allow-list" in r.message  # the label alone is not enough then


@pytest.mark.parametrize(("image", "allowed", "ok"), [
    ("vllm/vllm-openai:v0.11.0", ("docker.io/vllm",), True),
    ("vllm/vllm-openai:v0.11.0", ("vllm",), True),
    ("docker.io/vllm/vllm-openai@sha256:" + "a" * 64, ("docker.io/vllm",), True),
    ("nvcr.io/nvidia/vllm:24.1", ("nvcr.io",), True),
    ("vllm-evil/vllm-openai:v1", ("docker.io/vllm",), False),
    ("evil.io/vllm/vllm-openai:v1", ("docker.io/vllm",), False),
    ("nvcr.io.evil.com/x:1", ("nvcr.io",), False),
    ("ubuntu", ("docker.io/vllm",), False),
    ("anything/at:all", (), True),
    (OWN_IMAGE, ("docker.io/vllm",), True),
])
def test_image_rules(image: str, allowed: tuple[str, ...], ok: bool) -> None:
    r = policy.image_refusal(image, PolicySettings(allowed_registries=allowed), OWN_IMAGE)
    assert (r is None) == ok
    if r is not None:
        assert r.field == "spec.engine.image" and "policy.allowedRegistries" in r.message


def test_output_rules() -> None:
    ours = mf.output_configmap("best", OWNER, "--x 1", None, [])
    assert policy.configmap_refusal("best", None, OWNER) is None  # created
    assert policy.configmap_refusal("best", ours, OWNER) is None  # this tuning's own
    other = mf.output_configmap("best", mf.Owner("other", "ml", "u2"), "--x 1", None, [])
    foreign = {"metadata": {"name": "best", "labels": {"app": "prod"}}}
    for cm in (other, foreign):
        r = policy.configmap_refusal("best", cm, OWNER)
        assert r is not None and r.field == "spec.output.configMap"
        assert "kubectl -n ml label configmap best chunktune.dev/allow-output=true" in \
            r.message
    foreign["metadata"]["labels"][policy.ALLOW_OUTPUT_LABEL] = "true"
    assert policy.configmap_refusal("best", foreign, OWNER) is None
    deploy: dict[str, Any] = {"metadata": {"name": "vllm"}}
    r = policy.deployment_refusal("vllm", deploy, OWNER)
    assert r is not None and r.field == "spec.output.patchDeployment.name"
    assert "annotate deployment vllm chunktune.dev/allow-patch=llama-tune" in r.message
    for value, ok in (("true", True), ("*", True), ("a, llama-tune", True), ("other", False),
                      ("false", False)):
        deploy["metadata"]["annotations"] = {policy.ALLOW_PATCH_ANNOTATION: value}
        assert (policy.deployment_refusal("vllm", deploy, OWNER) is None) == ok, value


def test_policy_settings_from_the_environment() -> None:
    s = Settings.from_env({"CHUNKTUNE_ALLOWED_SECRETS": "hf-token, db",
                           "CHUNKTUNE_IMAGE": OWN_IMAGE, "CHUNKTUNE_SECRET_OPT_IN": "false",
                           "CHUNKTUNE_ALLOWED_REGISTRIES": "docker.io/vllm/,nvcr.io"})
    assert s.policy == PolicySettings(("hf-token", "db"), False, ("docker.io/vllm", "nvcr.io"))
    from chunktune.core.errors import SpecError

    with pytest.raises(SpecError) as e:
        Settings.from_env({"CHUNKTUNE_ALLOWED_REGISTRIES": "http://x y",
                           "CHUNKTUNE_ALLOWED_SECRETS": "Bad_Name"})
    assert {p for p, _ in e.value.problems} == {"CHUNKTUNE_ALLOWED_REGISTRIES",
                                                 "CHUNKTUNE_ALLOWED_SECRETS"}


# ---- against the emulator --------------------------------------------------------------------



@pytest.mark.asyncio
async def test_check_trials_reads_the_secrets_labels(kube: KubeEmulator) -> None:
    api = KubeApi(kube.api_client())
    try:
        owner = mf.Owner("t", "default", "u")
        t = with_secret()
        label = PolicySettings(secret_opt_in_label=True)
        [r] = await policy.check_trials(api, label, t, owner, OWN_IMAGE)
        assert r.reason == "SecretNotFound"
        kube.create("secrets", {"metadata": {"name": "hf"}, "data": {
            "token": base64.b64encode(b"x").decode()}}, "default")
        [r] = await policy.check_trials(api, label, t, owner, OWN_IMAGE)
        assert r.reason == "SecretNotAllowed"
        kube.patch("secrets", "default", "hf", {"metadata": {"labels": {
            policy.ALLOW_REFERENCE_LABEL: "true"}}})
        assert await policy.check_trials(api, label, t, owner, OWN_IMAGE) == []
        [r] = await policy.check_trials(api, PolicySettings(), t, owner, OWN_IMAGE)
        assert r.reason == "SecretNotAllowed" and "allow-list" in r.message  # label mode off
        strict = PolicySettings(allowed_registries=("nvcr.io",), allowed_secrets=("hf",))
        [r] = await policy.check_trials(api, strict, t, owner, OWN_IMAGE)
        assert r.field == "spec.engine.image"
    finally:
        await api.close()


@pytest.mark.asyncio
async def test_outputs_refuse_foreign_configmaps_and_unannotated_deployments(
        kube: KubeEmulator) -> None:
    api = KubeApi(kube.api_client())
    owner = make_owner(kube, "tune")
    try:
        kube.create("configmaps", {"metadata": {"name": "app-config"}, "data": {"a": "1"}},
                    "default")
        body = mf.output_configmap("app-config", owner, "--x 1", None, [])
        problem = await outputs.write_configmap(api, owner, body)
        assert problem and problem.startswith("spec.output.configMap names ConfigMap")
        assert kube.get("configmaps", "default", "app-config")["data"] == {"a": "1"}
        # a new one is created, and rewritten by the same tuning later
        fresh = mf.output_configmap("tune-best", owner, "--x 1", None, [])
        assert await outputs.write_configmap(api, owner, fresh) is None
        again = mf.output_configmap("tune-best", owner, "--x 2", None, [])
        assert await outputs.write_configmap(api, owner, again) is None
        assert kube.get("configmaps", "default", "tune-best")["data"]["flags"] == "--x 2"
        # opted in: overwritten
        kube.patch("configmaps", "default", "app-config", {"metadata": {"labels": {
            policy.ALLOW_OUTPUT_LABEL: "true"}}})
        assert await outputs.write_configmap(api, owner, body) is None
        assert kube.get("configmaps", "default", "app-config")["data"]["flags"] == "--x 1"

        kube.create("deployments", {"metadata": {"name": "prod"}, "spec": {
            "selector": {"matchLabels": {"app": "p"}}, "template": {
                "metadata": {"labels": {"app": "p"}}, "spec": {"containers": [
                    {"name": "engine", "image": "vllm/vllm-openai:v0.11.0",
                     "args": ["--max-num-seqs", "64"]}]}}}}, "default")
        problem = await outputs.patch_deployment(api, owner, "prod", None,
                                                 {"max-num-seqs": 128})
        assert problem and "annotate deployment prod chunktune.dev/allow-patch=tune" in problem
        containers = kube.get("deployments", "default", "prod")["spec"]["template"]["spec"][
            "containers"]
        assert containers[0]["args"] == ["--max-num-seqs", "64"]
        kube.patch("deployments", "default", "prod", {"metadata": {"annotations": {
            policy.ALLOW_PATCH_ANNOTATION: "tune"}}})
        assert await outputs.patch_deployment(api, owner, "prod", None,
                                              {"max-num-seqs": 128}) is None
        containers = kube.get("deployments", "default", "prod")["spec"]["template"]["spec"][
            "containers"]
        assert containers[0]["args"] == ["--max-num-seqs", "128"]
    finally:
        await api.close()


@pytest.mark.asyncio
async def test_outputs_are_checked_at_the_start(kube: KubeEmulator) -> None:
    api = KubeApi(kube.api_client())
    owner = make_owner(kube, "tune")
    try:
        m = tuning("tune", output={"configMap": "app-config",
                                   "patchDeployment": {"name": "prod"}})
        t = parse_manifest(m)
        assert await policy.check_outputs(api, t, owner) == []  # neither exists yet
        kube.create("configmaps", {"metadata": {"name": "app-config"}}, "default")
        kube.create("deployments", {"metadata": {"name": "prod"}, "spec": {
            "selector": {"matchLabels": {"app": "p"}}, "template": {
                "metadata": {"labels": {"app": "p"}}, "spec": {"containers": [
                    {"name": "engine", "image": "vllm/vllm-openai:v0.11.0"}]}}}}, "default")
        found = await policy.check_outputs(api, t, owner)
        assert [r.field for r in found] == ["spec.output.configMap",
                                            "spec.output.patchDeployment.name"]
    finally:
        await api.close()


@pytest.mark.asyncio
@pytest.mark.slow
async def test_refused_secret_then_labelled_runs_the_study(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A trial that would mount a Secret which has not opted in: Pending with
    PolicyAllowed=False naming the field and the fix, no trial object; labelling the Secret
    the moment the refusal is written (before the operator starts waiting) lets the study run
    (re-checked without a spec change, as soon as the Secret changes: the periodic re-check
    is set far beyond the test's waits)."""
    from chunktune.k8s import controller

    monkeypatch.setattr(policy, "RECHECK_SECONDS", 300.0)
    seen: list[dict[str, Any]] = []
    check = controller.StudyController._refused

    async def labelled_at_once(self: controller.StudyController, *args: Any) -> Any:
        refused = await check(self, *args)
        if refused and not seen:  # what the user sees, then the fix, before the wait
            seen.append(status_of(kube, "refused"))
            assert trial_objects(kube, "refused") == []
            kube.patch("secrets", "default", "hf", {"metadata": {"labels": {
                policy.ALLOW_REFERENCE_LABEL: "true"}}})
        return refused

    monkeypatch.setattr(controller.StudyController, "_refused", labelled_at_once)
    kube.create("secrets", {"metadata": {"name": "hf"}, "data": {
        "token": base64.b64encode(b"secret").decode()}}, "default")
    m = tuning("refused", budget={"maxTrials": 1, "parallelism": 1})
    m["spec"]["engine"]["env"] = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
        "name": "hf", "key": "token"}}}]
    kube.create("cpt", m, "default")
    settings = operator_settings(tmp_path).with_overrides(policy={"secret_opt_in_label": True})
    async with running_operator(kube, settings):
        await kube.until(lambda: seen, timeout=30, interval=0.1, message="PolicyAllowed=False")
        status = seen[0]
        cond = next(c for c in status["conditions"] if c["type"] == "PolicyAllowed")
        assert cond["status"] == "False" and cond["reason"] == "SecretNotAllowed"
        assert cond["message"].startswith("spec.engine.env[0].valueFrom.secretKeyRef.name ")
        assert "chunktune.dev/allow-reference=true" in cond["message"]
        assert status["phase"] == "Pending"
        # well inside the 300 s re-check: the Secret's change, not the clock, started it
        await kube.until(lambda: trial_objects(kube, "refused"), timeout=60, interval=0.1,
                         message="a trial started within 60 s of the label")
        status = await wait_phase(kube, "refused", ("Succeeded", "Failed"), timeout=90)
    assert status["phase"] == "Succeeded", status.get("message")
    cond = next(c for c in status["conditions"] if c["type"] == "PolicyAllowed")
    assert cond["status"] == "True"


class _Live:
    """The daemon's view of one resource in the emulator (no kopf), stopped by the test."""

    def __init__(self, kube: KubeEmulator, name: str) -> None:
        self.kube, self.name, self.stop = kube, name, False

    def body(self) -> dict[str, Any]:
        return self.kube.get("cpt", "default", self.name) or {}

    def stopping(self) -> StopCause | None:
        return StopCause.EXITING if self.stop else None

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(min(seconds, 0.05))


@pytest.mark.asyncio
async def test_image_from_another_registry_is_refused(
        kube: KubeEmulator, tmp_path: Path) -> None:
    """The study controller itself against the emulator: an engine image from a registry the
    operator does not allow is a PolicyAllowed=False condition and a Warning event; no pod."""
    from chunktune.k8s.controller import Operator, StudyController

    m = tuning("evil", budget={"maxTrials": 1, "parallelism": 1})
    m["spec"]["engine"]["image"] = "evil.example.com/miner:latest"
    kube.create("cpt", m, "default")
    settings = operator_settings(tmp_path).with_overrides(
        policy={"allowed_registries": ("ghcr.io/chunktune",)})
    op = Operator(settings=settings, api=KubeApi(kube.api_client()))
    events: list[tuple[str, str, str]] = []
    live = _Live(kube, "evil")
    ctrl = StudyController(op, live.body(), lambda *e: events.append(e))
    task = asyncio.create_task(ctrl.serve(live))
    try:
        status = await kube.until(
            lambda: (s := status_of(kube, "evil")) and any(
                c["type"] == "PolicyAllowed" for c in s.get("conditions", [])) and s,
            timeout=30, interval=0.05, message="PolicyAllowed condition")
    finally:
        live.stop = True
        await asyncio.wait_for(task, 30)
        await op.api.close()
    cond = next(c for c in status["conditions"] if c["type"] == "PolicyAllowed")
    assert (cond["status"], cond["reason"]) == ("False", "ImageNotAllowed")
    assert cond["message"].startswith("spec.engine.image 'evil.example.com/miner:latest'")
    assert "policy.allowedRegistries" in cond["message"]
    assert status["phase"] == "Pending"
    assert events == [("Warning", "ImageNotAllowed", cond["message"])]
    assert not kube.objects("pods", "default")
