"""docs/getting-started.md's cluster part, run against the Kubernetes emulator: the manifest the
page applies (``kubectl apply -f examples/sim-cluster.yaml``) reaches the real operator (kopf,
the official client), its trials run as ``chunktune sim serve`` pods and Locust Jobs, and what
the page then reads (``kubectl get cpt``'s columns, the flags ConfigMap) is there. The one
change to the page's manifest: 2 trials of 4 s instead of 12 of 20 s, to keep CI short."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from chunktune.api.crd import PRINTER_COLUMNS
from tests.docs.pages import ROOT, commands, flag_values
from tests.k8s.conftest import operator_settings, running_operator, wait_phase
from tests.kube.emulator import KubeEmulator
from tests.kube.kubelet import FakeKubelet

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


def _jsonpath(obj: dict, path: str) -> object:
    """The value at a printer column's ``.a.b.c`` path (keys with dashes included)."""
    for key in path.lstrip(".").split("."):
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj


async def test_the_cluster_part_runs_as_the_page_says(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path) -> None:
    cmds = [c for c in commands("getting-started.md") if c.program == "kubectl"]
    apply = next(c for c in cmds if c.words[1] == "apply")
    manifest = yaml.safe_load((ROOT / flag_values(apply.words, "-f")[0]).read_text())
    name = manifest["metadata"]["name"]
    watch = next(c for c in cmds if c.words[1:3] == ("get", "cpt"))
    assert watch.words[3] == name
    get_cm = next(c for c in cmds if c.words[1:3] == ("get", "configmap"))
    assert get_cm.words[3] == manifest["spec"]["output"]["configMap"]
    assert flag_values(get_cm.words, "-o") == ["jsonpath={.data.flags}"]

    manifest["spec"]["budget"].update(maxTrials=2)
    manifest["spec"]["workload"].update(duration="4s", warmup="1s")
    kube.create("cpt", manifest, "default")
    async with running_operator(kube, operator_settings(tmp_path)):
        status = await wait_phase(kube, name, ("Succeeded", "Failed"), timeout=240)
    assert status["phase"] == "Succeeded", status.get("message")
    # `kubectl get cpt NAME`: every printer column but Age reads a value
    for column in PRINTER_COLUMNS:
        if column["name"] != "Age":
            assert _jsonpath({"status": status}, column["jsonPath"]) is not None, column
    # `kubectl get configmap NAME -o jsonpath={.data.flags}`: the best flags
    cm = kube.get("configmaps", "default", get_cm.words[3])
    assert cm is not None and cm["data"]["flags"] == status["best"]["flags"]
    assert cm["data"]["flags"].startswith("--max-num-batched-tokens ")
