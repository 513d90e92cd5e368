"""Where a finished study's result goes besides the status: ``spec.output``.

* ``configMap``: a ConfigMap with ``flags`` (``--max-num-batched-tokens 4096
  --long-prefill-token-threshold 512``), ``best.json`` and ``pareto.json``; created, or
  updated when this tuning wrote it before or it carries the ``chunktune.dev/allow-output:
  "true"`` label (:func:`chunktune.k8s.policy.configmap_refusal`); not owned by the tuning
  (the result outlives it);
* ``patchDeployment``: the best flags set on a Deployment's container (by name, or the
  first): existing values of those flags replaced, missing ones appended
  (:mod:`chunktune.backends.deployment`), so the Deployment rolls out with them;
  only a Deployment annotated ``chunktune.dev/allow-patch`` (``"true"`` or this tuning's
  name) is touched.

Each returns a problem message instead of raising: a missing Deployment must not turn a
finished study into a failed one; the handler records it as a condition and a warning event.
"""

from __future__ import annotations

from typing import Any

from chunktune.api.v1alpha1 import OutputSpec
from chunktune.backends import deployment as dp
from chunktune.backends import manifests as mf
from chunktune.backends.cluster import ClusterApiError
from chunktune.core.flags import flags_line
from chunktune.k8s import policy
from chunktune.k8s.kube import KubeApi
from chunktune.tuning.results.files import to_json
from chunktune.tuning.results.model import Results

#: Annotations set on a patched Deployment.
TUNED_BY = "chunktune.dev/tuned-by"
TUNED_FLAGS = "chunktune.dev/flags"


async def write_outputs(api: KubeApi, owner: mf.Owner, output: OutputSpec,
                        results: Results) -> list[str]:
    """Write every configured output; returns the problems (empty when all went well)."""
    best = results.best_trial
    if best is None:
        return []
    problems: list[str] = []
    doc = to_json(results)
    flags = flags_line(dict(best.params))
    if output.config_map:
        problem = await write_configmap(api, owner, mf.output_configmap(
            output.config_map, owner, flags, doc["best"], doc["pareto_front"]))
        if problem:
            problems.append(problem)
    if output.patch_deployment is not None:
        problem = await patch_deployment(api, owner, output.patch_deployment.name,
                                         output.patch_deployment.container, dict(best.params))
        if problem:
            problems.append(problem)
    return problems


async def write_configmap(api: KubeApi, owner: mf.Owner, body: dict[str, Any]) -> str | None:
    """Create the output ConfigMap, or update it when the policy allows
    (:func:`chunktune.k8s.policy.configmap_refusal`); a problem message, or None."""
    name = body["metadata"]["name"]
    try:
        existing = await api.get("configmaps", owner.namespace, name)
        refusal = policy.configmap_refusal(name, existing, owner)
        if refusal is not None:
            return refusal.text()
        await api.apply_configmap(owner.namespace, body)
    except ClusterApiError as e:
        return f"ConfigMap {name}: {e.message}"
    return None


async def patch_deployment(api: KubeApi, owner: mf.Owner, name: str, container: str | None,
                           params: dict[str, Any]) -> str | None:
    """Set ``params`` as flags of a Deployment's container; a problem message, or None."""
    try:
        deploy = await api.get("deployments", owner.namespace, name)
    except ClusterApiError as e:
        return f"Deployment {name}: {e.message}"
    if deploy is None:
        return f"Deployment {name} not found in namespace {owner.namespace}"
    refusal = policy.deployment_refusal(name, deploy, owner)
    if refusal is not None:
        return refusal.text()
    target = dp.engine_container(deploy, container)
    if target is None:
        return f"Deployment {name} has no container {container or ''}".rstrip()
    field, args = dp.flags_field(target)
    new = dp.set_flags(args, params)
    patch = {
        "metadata": {"annotations": {TUNED_BY: f"{owner.namespace}/{owner.name}",
                                     TUNED_FLAGS: flags_line(params)}},
        "spec": {"template": {"spec": {"containers": [{"name": target["name"], field: new}]}}},
    }
    try:
        await api.patch("deployments", owner.namespace, name, patch)
    except ClusterApiError as e:
        return f"Deployment {name}: {e.message}"
    return None


__all__ = ["TUNED_BY", "TUNED_FLAGS", "patch_deployment", "write_configmap", "write_outputs"]
