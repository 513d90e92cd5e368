"""``spec.engine.calibration``: validated with field paths, read by the tuner, used by the
simulated backend, carried to the local ``sim serve`` and the cluster's engine pod."""

from __future__ import annotations

import json

import pytest

from chunktune.api.reader import parse_manifest, validate
from chunktune.backends import manifests
from chunktune.backends.simulated import SimulatedBackend
from chunktune.core.errors import SpecError
from chunktune.core.trials import TrialState
from chunktune.core.workload import load_profile
from chunktune.sim.calibration import profile as profiles
from chunktune.tuning.runner import target_from_spec
from tests.tuning.conftest import manifest


def h100_profile(tmp_path, slowdown: float, overhead: float | None = None):
    """A profile of an engine whose steps cost ``slowdown`` x the unscaled H100 model."""
    prof = profiles.CalibrationProfile(
        model="llama-3.1-8b", gpu="h100-sxm",
        coefficients={**{k: slowdown for k in profiles.SCALES}, **{k: 0.0 for k in
        profiles.DIRECT}}, fit={"num_steps": 100}, fitted_on={"files": [], "steps": 100},
        server_overhead_s=overhead)
    return profiles.write_profile(tmp_path / f"p{slowdown}.json", prof)


def with_calibration(cal):
    m = manifest()
    m["spec"]["engine"]["calibration"] = cal
    return m


@pytest.mark.parametrize(("cal", "kind", "message"), [
    ({}, "sim", "give exactly one of file"),
    ({"file": "a.json", "configMapKeyRef": {"name": "cm", "key": "k"}}, "sim",
     "give exactly one of file"),
    ({"file": "a.json"}, "vllm", "is only used by engine kind sim"),
])
def test_bad_calibration_fields(cal, kind, message):
    m = with_calibration(cal)
    m["spec"]["engine"]["kind"] = kind
    m["spec"]["engine"]["image"] = "vllm/vllm-openai:v0.11.0"
    problems = validate(m)
    assert any(path == "spec.engine.calibration" and message in msg for path, msg in problems), \
        problems


def test_unknown_calibration_field_is_named():
    problems = validate(with_calibration({"path": "a.json"}))
    assert any(path.startswith("spec.engine.calibration") for path, _ in problems), problems


def test_profile_file_is_read_and_checked(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(SpecError) as e:
        target_from_spec(parse_manifest(with_calibration({"file": str(bad)})))
    assert e.value.problems[0][0] == "spec.engine.calibration.file"
    assert "not a calibration profile" in str(e.value)
    with pytest.raises(SpecError) as e:
        target_from_spec(parse_manifest(with_calibration({"file": str(tmp_path / "no.json")})))
    assert "does not exist" in str(e.value)


def test_simulated_backend_costs_steps_with_the_profile(tmp_path):
    """A 2x slower engine's profile doubles the simulated step times and its server overhead
    replaces the default one."""
    results = {}
    for slowdown, overhead in ((1.0, None), (2.0, 0.25)):
        tuning = parse_manifest(with_calibration(
            {"file": str(h100_profile(tmp_path, slowdown, overhead))}))
        target = target_from_spec(tuning)
        assert target.calibration is not None
        from chunktune.core.trials import TrialPlan
        profile = load_profile("chat").with_overrides(duration=30, warmup=5, rate=2)
        plan = TrialPlan(0, {"max-num-batched-tokens": 2048}, target, profile)
        res = SimulatedBackend().run_sync(plan)
        assert res.state == TrialState.COMPLETE, res.message
        results[slowdown] = res.metrics
    assert results[2.0]["ttft_p50"] > results[1.0]["ttft_p50"] + 0.2
    assert results[2.0]["itl_p50"] == pytest.approx(2 * results[1.0]["itl_p50"], rel=0.15)


def test_profile_of_another_engine_is_infeasible_naming_the_field(tmp_path):
    p = h100_profile(tmp_path, 1.0)
    d = json.loads(p.read_text())
    d["gpu"] = "a100-sxm"
    p.write_text(json.dumps(d))
    target = target_from_spec(parse_manifest(with_calibration({"file": str(p)})))
    from chunktune.core.trials import TrialPlan
    plan = TrialPlan(0, {}, target, load_profile("chat").with_overrides(duration=10, warmup=1))
    res = SimulatedBackend().run_sync(plan)
    assert res.state == TrialState.INFEASIBLE
    assert "spec.engine.calibration" in (res.message or "") and "a100-sxm" in (res.message or "")


def test_cluster_engine_pod_gets_the_profile(tmp_path):
    from chunktune.core.trials import TrialPlan
    owner = manifests.Owner("t", "test", "uid-1")
    opts = manifests.TrialOptions(load_image="chunktune:test")
    prof = load_profile("chat").with_overrides(duration=10, warmup=1)
    # a file: copied into the trial's ConfigMap, passed to sim serve
    target = target_from_spec(parse_manifest(with_calibration(
        {"file": str(h100_profile(tmp_path, 1.5))})))
    plan = TrialPlan(0, {}, target, prof)
    cm = manifests.workload_configmap(plan, owner)
    assert json.loads(cm["data"][manifests.CALIBRATION_FILE])["coefficients"]["linear_scale"] \
        == 1.5
    pod = manifests.engine_pod(plan, owner, opts)
    args = pod["spec"]["containers"][0]["args"]
    assert args[args.index("--calibration") + 1] == \
        f"{manifests.WORKLOAD_DIR}/{manifests.CALIBRATION_FILE}"
    # a ConfigMap key: mounted from the user's ConfigMap
    target = target_from_spec(parse_manifest(with_calibration(
        {"configMapKeyRef": {"name": "twin", "key": "cpu.json"}})))
    pod = manifests.engine_pod(TrialPlan(0, {}, target, prof), owner, opts)
    args = pod["spec"]["containers"][0]["args"]
    assert args[args.index("--calibration") + 1] == \
        f"{manifests.CALIBRATION_DIR}/{manifests.CALIBRATION_FILE}"
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols["calibration"]["configMap"] == {
        "name": "twin", "items": [{"key": "cpu.json", "path": manifests.CALIBRATION_FILE}]}
    # the simulated backend cannot read a ConfigMap: it says so, naming the field
    res = SimulatedBackend().run_sync(TrialPlan(0, {}, target, prof))
    assert res.state == TrialState.INFEASIBLE
    assert "spec.engine.calibration.configMapKeyRef" in (res.message or "")
