"""What a tuning may make the operator do with the operator's own rights (no confused deputy).

Whoever may create a ChunkedPrefillTuning gets Pods in its namespace through the operator's
service account, so the operator holds each tuning to rules a namespace owner controls:

* **Secrets**: a trial's engine may reference a Secret (``engine.env[].valueFrom.secretKeyRef``)
  only when the Secret is on the operator's allow-list (chart value ``policy.allowedSecrets``,
  ``CHUNKTUNE_ALLOWED_SECRETS``), or, when ``policy.secretOptInLabel`` is on, carries the
  label :data:`ALLOW_REFERENCE_LABEL` ``"true"`` (the chart then grants ``get`` on Secrets,
  of which the operator reads only the labels). Both are empty/off by default: no Secret may be
  referenced until an admin says which;
* **images**: when ``policy.allowedRegistries`` (``CHUNKTUNE_ALLOWED_REGISTRIES``) lists
  registries or repositories, an engine image must come from one of them (the operator's own
  chunktune image always may);
* **output.configMap** creates a ConfigMap, or updates one this tuning wrote before (same
  tuning name, written by chunktune) or one labelled :data:`ALLOW_OUTPUT_LABEL` ``"true"``;
* **output.patchDeployment** patches only a Deployment annotated :data:`ALLOW_PATCH_ANNOTATION`
  with ``"true"`` (any tuning of its namespace) or a comma-separated list of tuning names.

Every refusal is a :class:`Refusal` naming the field and the fix; the study controller turns
the trial ones into a ``PolicyAllowed=False`` condition (the study waits, re-checking), the
output ones into ``OutputAllowed=False`` at the start (a warning: the study runs) and
``OutputWritten=False`` at the end. The checks are pure functions of the objects read;
:func:`check_trials` does the reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from chunktune.api.v1alpha1 import ChunkedPrefillTuning
from chunktune.backends import manifests as mf
from chunktune.backends.cluster import ClusterApiError
from chunktune.k8s.settings import PolicySettings

ALLOW_REFERENCE_LABEL = "chunktune.dev/allow-reference"
ALLOW_OUTPUT_LABEL = "chunktune.dev/allow-output"
ALLOW_PATCH_ANNOTATION = "chunktune.dev/allow-patch"
#: Seconds between re-checks of a refused tuning (a label added to a Secret changes no spec).
RECHECK_SECONDS = 30.0
CONDITION = "PolicyAllowed"
#: The condition that warns, at the start, that ``spec.output`` would be refused.
OUTPUT_CONDITION = "OutputAllowed"


@dataclass(frozen=True)
class Refusal:
    """Why the operator will not do what a tuning asks, and how to fix it."""

    field: str
    reason: str
    message: str
    secret: str | None = None
    """The Secret whose creation or label would lift the refusal (the operator looks at it
    again when it changes), if it is one."""

    def text(self) -> str:
        return f"{self.field} {self.message}"


class Reader(Protocol):
    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None: ...


# ---- pure checks ------------------------------------------------------------------------------


def secret_refs(tuning: ChunkedPrefillTuning) -> list[tuple[str, str, bool]]:
    """``(field path of the name, Secret name, optional)`` of every Secret the engine
    references."""
    out = []
    for i, v in enumerate(tuning.spec.engine.env):
        ref = v.value_from.secret_key_ref if v.value_from else None
        if ref is not None:
            out.append((f"spec.engine.env[{i}].valueFrom.secretKeyRef.name", ref.name,
                        bool(ref.optional)))
    return out


def secrets_read(policy: PolicySettings, tuning: ChunkedPrefillTuning) -> list[str]:
    """The Secrets :func:`check_trials` reads (for their labels): those the engine references
    that are not allow-listed, when Secrets must opt in."""
    if not policy.secret_opt_in_label:
        return []
    return [name for _, name, _ in secret_refs(tuning) if name not in policy.allowed_secrets]


def secret_refusal(field: str, name: str, namespace: str, secret: Mapping[str, Any] | None,
                   policy: PolicySettings, optional: bool = False) -> Refusal | None:
    """Whether a tuning may reference Secret ``name`` (``secret``: the object read, None when
    absent; only consulted when the name is not allow-listed)."""
    if name in policy.allowed_secrets:
        return None
    fix_list = f"add {name!r} to the operator's allow-list (chart value policy.allowedSecrets)"
    if not policy.secret_opt_in_label:
        return Refusal(field, "SecretNotAllowed", f"names Secret {name!r}, which the operator "
                       f"does not allow trials to reference; {fix_list}")
    label = f"kubectl -n {namespace} label secret {name} {ALLOW_REFERENCE_LABEL}=true"
    if secret is None:
        if optional:
            return None
        return Refusal(field, "SecretNotFound", f"names Secret {name!r}, which does not exist "
                       f"in namespace {namespace}; create it with the label "
                       f"{ALLOW_REFERENCE_LABEL}: \"true\", or {fix_list}", secret=name)
    labels = (secret.get("metadata") or {}).get("labels") or {}
    if labels.get(ALLOW_REFERENCE_LABEL) == "true":
        return None
    return Refusal(field, "SecretNotAllowed", f"names Secret {name!r}, which has not opted in "
                   f"to being referenced by tunings; label it ({label}), or {fix_list}",
                   secret=name)


def normalize_image(image: str) -> str:
    """An image reference with its registry made explicit (``vllm/vllm-openai:v1`` ->
    ``docker.io/vllm/vllm-openai:v1``, ``ubuntu`` -> ``docker.io/library/ubuntu``)."""
    first, sep, _ = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return image
    return f"docker.io/{image}" if sep else f"docker.io/library/{image}"


def _repository(image: str) -> str:
    ref = normalize_image(image).split("@", 1)[0]
    head, _, last = ref.rpartition("/")
    return f"{head}/{last.split(':', 1)[0]}"


def image_refusal(image: str | None, policy: PolicySettings, own_image: str | None,
                  field: str = "spec.engine.image") -> Refusal | None:
    """Whether an engine image comes from an allowed registry or repository."""
    if image is None or not policy.allowed_registries or image == own_image:
        return None
    repo = _repository(image)
    for allowed in policy.allowed_registries:
        prefix = allowed.rstrip("/")
        if "/" not in prefix and "." not in prefix and ":" not in prefix and \
                prefix != "localhost":
            prefix = f"docker.io/{prefix}"  # a Docker Hub namespace such as 'vllm'
        if repo == prefix or repo.startswith(prefix + "/"):
            return None
    return Refusal(field, "ImageNotAllowed", f"{image!r} is not from a registry this operator "
                   f"allows ({', '.join(policy.allowed_registries)}); use an image from one "
                   "of them, or ask the operator's admin to add its registry (chart value "
                   "policy.allowedRegistries)")


def configmap_refusal(name: str, existing: Mapping[str, Any] | None, owner: mf.Owner
                      ) -> Refusal | None:
    """Whether ``spec.output.configMap`` may write ConfigMap ``name`` (``existing``: it as
    read, None when absent: then it is created)."""
    if existing is None:
        return None
    meta = existing.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    if labels.get(ALLOW_OUTPUT_LABEL) == "true":
        return None
    ours = labels.get(mf.MANAGED_BY) == "chunktune" and \
        annotations.get(mf.TUNING_NAME_ANNOTATION) == owner.name and \
        not meta.get("ownerReferences")
    if ours:
        return None
    return Refusal("spec.output.configMap", "ConfigMapNotOwned", f"names ConfigMap {name!r}, "
                   "which exists and is not this tuning's output; name a new ConfigMap, or "
                   f"let chunktune overwrite it: kubectl -n {owner.namespace} label configmap "
                   f"{name} {ALLOW_OUTPUT_LABEL}=true")


def deployment_refusal(name: str, deploy: Mapping[str, Any], owner: mf.Owner
                       ) -> Refusal | None:
    """Whether ``spec.output.patchDeployment`` may patch Deployment ``name``."""
    annotations = (deploy.get("metadata") or {}).get("annotations") or {}
    allowed = annotations.get(ALLOW_PATCH_ANNOTATION, "")
    names = {n.strip() for n in allowed.split(",")}
    if allowed.strip() in ("true", "*") or owner.name in names:
        return None
    return Refusal("spec.output.patchDeployment.name", "DeploymentNotAllowed",
                   f"names Deployment {name!r}, which does not allow chunktune to patch it; "
                   f"annotate it: kubectl -n {owner.namespace} annotate deployment {name} "
                   f"{ALLOW_PATCH_ANNOTATION}={owner.name} (or =true for any tuning of the "
                   "namespace)")


# ---- the reads --------------------------------------------------------------------------------


async def check_trials(api: Reader, policy: PolicySettings, tuning: ChunkedPrefillTuning,
                       owner: mf.Owner, own_image: str | None) -> list[Refusal]:
    """Every refusal of what the tuning's trials would reference: Secrets and the engine
    image. Reads each referenced Secret (its labels) unless it is allow-listed."""
    out: list[Refusal] = []
    refusal = image_refusal(tuning.spec.engine.image, policy, own_image)
    if refusal is not None:
        out.append(refusal)
    read = secrets_read(policy, tuning)
    for field, name, optional in secret_refs(tuning):
        secret = None
        if name in read:
            try:
                secret = await api.get("secrets", owner.namespace, name)
            except ClusterApiError as e:
                if e.status != 403:
                    raise
                out.append(Refusal(field, "SecretNotReadable", f"names Secret {name!r}, whose "
                                   f"labels the operator may not read ({e.message}); add it "
                                   "to the chart value policy.allowedSecrets"))
                continue
        refusal = secret_refusal(field, name, owner.namespace, secret, policy, optional)
        if refusal is not None:
            out.append(refusal)
    return out


async def check_outputs(api: Reader, tuning: ChunkedPrefillTuning, owner: mf.Owner
                        ) -> list[Refusal]:
    """The refusals ``spec.output`` would meet if the study ended now (checked again when it
    does): said at the start, so that nobody learns it after hours of trials."""
    out: list[Refusal] = []
    output = tuning.spec.output
    if output.config_map:
        existing = await api.get("configmaps", owner.namespace, output.config_map)
        refusal = configmap_refusal(output.config_map, existing, owner)
        if refusal is not None:
            out.append(refusal)
    if output.patch_deployment is not None:
        name = output.patch_deployment.name
        deploy = await api.get("deployments", owner.namespace, name)
        if deploy is not None:
            refusal = deployment_refusal(name, deploy, owner)
            if refusal is not None:
                out.append(refusal)
    return out


def refused_text(refusals: Sequence[Refusal]) -> str:
    return "; ".join(r.text() for r in refusals)


__all__ = ["ALLOW_OUTPUT_LABEL", "ALLOW_PATCH_ANNOTATION", "ALLOW_REFERENCE_LABEL",
           "CONDITION", "OUTPUT_CONDITION", "RECHECK_SECONDS", "PolicySettings", "Refusal",
           "check_outputs", "check_trials", "configmap_refusal", "deployment_refusal",
           "image_refusal", "normalize_image", "refused_text", "secret_refs", "secret_refusal"]
