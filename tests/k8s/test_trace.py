"""A trace from a ConfigMap, end to end in the operator: read when the study starts (waited for
while it is missing), checked like the rest of the spec, and carried to every load Job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from chunktune.backends.manifests import PROFILE_FILE, TRACE_FILE, workload_files
from chunktune.core.errors import SpecError
from chunktune.core.workload import generate, load_profile, trace_profile
from chunktune.k8s import policy
from tests.k8s.conftest import operator_settings, running_operator, tuning, wait_phase
from tests.kube.emulator import KubeEmulator
from tests.kube.kubelet import FakeKubelet

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "traces" / "azure-conv-sample.csv"


def test_the_workload_files_carry_the_trace_beside_the_profile(tmp_path):
    """What the load Job mounts reads back as the same requests; a trace too large for a
    ConfigMap is refused naming the field."""
    profile = trace_profile(SAMPLE).with_overrides(duration=30, warmup=2)
    files = workload_files(profile)
    assert set(files) == {PROFILE_FILE, TRACE_FILE}
    assert yaml.safe_load(files[PROFILE_FILE])["trace"]["file"] == TRACE_FILE
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    mounted = load_profile(tmp_path / PROFILE_FILE)
    assert generate(mounted) == generate(profile) and mounted.duration == 30
    big = tmp_path / "big.csv"  # far more rows than a ConfigMap holds
    big.write_text("arrival,prompt_tokens,output_tokens\n" + "".join(
        f"{i / 7},{1000 + i % 977},{10 + i % 13}\n" for i in range(60_000)))
    with pytest.raises(SpecError) as e:
        workload_files(trace_profile(big))
    assert e.value.problems[0][0] == "spec.workload.trace"
    assert "does not fit a ConfigMap" in str(e.value)


@pytest.mark.asyncio
@pytest.mark.slow
async def test_a_configmap_trace_is_waited_for_read_and_replayed(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the ConfigMap is looked for again when it appears, not when the re-check is due
    monkeypatch.setattr(policy, "RECHECK_SECONDS", 300.0)
    trace: dict[str, Any] = {"configMapKeyRef": {"name": "azure", "key": "conv.csv"},
                             "end": "4s",
                             "classes": [{"name": "short", "maxPromptTokens": 1024},
                                         {"name": "long", "priority": 1}]}
    kube.create("cpt", tuning(
        "traced", workload={"trace": trace, "warmup": "1s"},
        objectives=[{"metric": "ttft_p99", "class": "short", "direction": "minimize"}]),
        "default")
    async with running_operator(kube, operator_settings(tmp_path)):
        status = await wait_phase(kube, "traced", ("Pending",))
        cond = await kube.until(lambda: next((
            c for c in status_of_conditions(kube) if c["type"] == "SpecValid"
            and c["reason"] == "TraceUnavailable"), None), message="TraceUnavailable")
        assert cond["status"] == "False"
        assert "spec.workload.trace.configMapKeyRef there is no ConfigMap 'azure'" in \
            cond["message"] and "kubectl create configmap azure" in cond["message"]
        kube.create("configmaps", {"metadata": {"name": "azure"},
                                   "data": {"conv.csv": SAMPLE.read_text()}}, "default")
        # the trial's load Job mounts its workload ConfigMap (deleted with the trial)
        mounted = await kube.until(lambda: next((
            o["data"] for o in kube.objects("configmaps", "default")
            if TRACE_FILE in (o.get("data") or {})), None), timeout=60,
            message="a trial ConfigMap with the trace")
        status = await wait_phase(kube, "traced", ("Succeeded", "Failed"), timeout=120)
        assert status["phase"] == "Succeeded", status.get("message")
    # the trace's requests of the window, split into the classes, with their priorities
    expected = [r for r in generate(trace_profile(SAMPLE)) if r.arrival < 4]
    assert yaml.safe_load(mounted[PROFILE_FILE])["trace"]["file"] == TRACE_FILE
    rows = mounted[TRACE_FILE].splitlines()[1:]
    assert [(float(r.split(",")[0]), int(r.split(",")[1])) for r in rows] == \
        [(e.arrival, e.prompt_tokens) for e in expected]
    assert {(r.split(",")[3], r.split(",")[4]) for r in rows} == {("short", "0"), ("long", "1")}
    assert "short.ttft_p99" in status["best"]["metrics"]


def status_of_conditions(kube: KubeEmulator) -> list[dict[str, Any]]:
    return list(((kube.get("cpt", "default", "traced") or {}).get("status") or {})
                .get("conditions") or [])
