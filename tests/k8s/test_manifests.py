"""The pure builders of trial objects (no server): snapshot-ish assertions, each object checked
against Kubernetes 1.32's schemas in strict mode (unknown fields rejected); the load Job's log
format and its reader; the Deployment-args patcher."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from chunktune.backends import deployment as dp
from chunktune.backends import manifests as mf
from chunktune.core.trials import CpuTarget, EngineTarget, TrialPlan
from chunktune.core.workload import load_profile

K8S_VERSION = "1.32"
OWNER = mf.Owner(name="llama-tune", namespace="ml", uid="0f5c3d3e-1111-2222-3333-444455556666")
OPTIONS = mf.TrialOptions(load_image="ghcr.io/chunktune/chunktune:0.1.0",
                          image_pull_policy="IfNotPresent", sim_load_time=0.5)
PROFILE = load_profile("smoke").with_overrides(duration=30, warmup=5)
VLLM = EngineTarget(
    kind="vllm", model="meta-llama/Llama-3.1-8B-Instruct", served_model_name="llama",
    gpu="h100-sxm", gpu_count=2, tensor_parallel_size=2, image="vllm/vllm-openai:v0.11.0",
    fixed_args=("--tensor-parallel-size", "2", "--max-model-len", "32768"),
    env=({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
         {"name": "VLLM_LOGGING_LEVEL", "value": "INFO"}),
    port=8000, startup_timeout=600)
SIM = EngineTarget(kind="sim", model="llama-3.1-8b", served_model_name="llama-3.1-8b",
                   gpu="l4", fixed_args=("--tensor-parallel-size", "1"), startup_timeout=60,
                   hf_config={"architectures": ["LlamaForCausalLM"], "hidden_size": 4096})


def plan(target: EngineTarget = VLLM, number: int = 7, **kw: Any) -> TrialPlan:
    return TrialPlan(number=number, target=target, profile=PROFILE, name=f"x-t{number}",
                     params={"max-num-batched-tokens": 4096,
                             "long-prefill-token-threshold": 512}, **kw)


def valid(obj: dict[str, Any]) -> dict[str, Any]:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    return obj


def test_cpu_vllm_engine_pod() -> None:
    """vLLM's CPU build: module entry point, KV space and thread binding from engine.cpu,
    offline, no GPU request or toleration; sub-GiB KV space goes to the flag."""
    target = EngineTarget(kind="vllm", model="/models/tiny", served_model_name="tiny",
                          image="vllm-cpu:test", fixed_args=("--load-format", "dummy"),
                          cpu=CpuTarget(kv_cache_bytes=2 * 2**30, omp_threads_bind="0"),
                          env=({"name": "HF_HUB_OFFLINE", "value": "0"},))
    (c,) = valid(mf.engine_pod(plan(target), OWNER, OPTIONS))["spec"]["containers"]
    assert c["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert c["args"][:2] == ["--model", "/models/tiny"]
    assert c["args"][-1] == "--enable-logging-iteration-details"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2" and env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert env["HF_HUB_OFFLINE"] == "0"  # the manifest's own value wins
    assert [e["name"] for e in c["env"]].count("HF_HUB_OFFLINE") == 1
    assert "nvidia.com/gpu" not in json.dumps(c.get("resources", {}))
    pod = mf.engine_pod(plan(target), OWNER, OPTIONS)
    assert "tolerations" not in pod["spec"]
    small = EngineTarget(kind="vllm", model="/m", served_model_name="m", image="x",
                         cpu=CpuTarget(kv_cache_bytes=64 * 2**20))
    (c,) = mf.engine_pod(plan(small), OWNER, OPTIONS)["spec"]["containers"]
    assert "--kv-cache-memory-bytes" in c["args"]
    assert "VLLM_CPU_KVCACHE_SPACE" not in {e["name"] for e in c["env"]}


def test_vllm_engine_pod() -> None:
    pod = valid(mf.engine_pod(plan(), OWNER, OPTIONS, {"requests": {"cpu": "8", "memory":
                                                                     "64Gi"}}))
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == "llama-tune-t7" and meta["namespace"] == "ml"
    assert meta["labels"] == {
        "app.kubernetes.io/managed-by": "chunktune", "app.kubernetes.io/part-of": "chunktune",
        "app.kubernetes.io/component": "engine", "chunktune.dev/tuning": "llama-tune",
        "chunktune.dev/tuning-uid": OWNER.uid, "chunktune.dev/trial": "7"}
    assert meta["ownerReferences"] == [{
        "apiVersion": "chunktune.dev/v1alpha1", "kind": "ChunkedPrefillTuning",
        "name": "llama-tune", "uid": OWNER.uid, "controller": True,
        "blockOwnerDeletion": True}]
    assert meta["annotations"]["chunktune.dev/flags"] == \
        "--max-num-batched-tokens 4096 --long-prefill-token-threshold 512"
    assert spec["restartPolicy"] == "Never"
    (c,) = spec["containers"]
    assert c["image"] == "vllm/vllm-openai:v0.11.0" and c["imagePullPolicy"] == "IfNotPresent"
    assert c["command"] == ["vllm", "serve"]
    assert c["args"] == [
        "meta-llama/Llama-3.1-8B-Instruct", "--host", "0.0.0.0", "--port", "8000",
        "--served-model-name", "llama", "--tensor-parallel-size", "2", "--max-model-len",
        "32768", "--max-num-batched-tokens", "4096", "--long-prefill-token-threshold", "512",
        "--enable-logging-iteration-details"]  # the trial's per-step log
    assert c["resources"] == {  # quantities as strings: the kubernetes client refuses numbers
        "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "2"},
        "limits": {"nvidia.com/gpu": "2"}}
    # the secret stays a reference: no value is ever copied
    hf = next(e for e in c["env"] if e["name"] == "HF_TOKEN")
    assert hf == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf",
                                                                     "key": "token"}}}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}} in \
        spec["volumes"]
    for probe in (c["startupProbe"], c["readinessProbe"]):
        assert probe["httpGet"] == {"path": "/health", "port": "http"}
    startup = c["startupProbe"]
    assert startup["failureThreshold"] * startup["periodSeconds"] >= VLLM.startup_timeout
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"


def test_sim_engine_pod_runs_chunktune_sim_serve_without_gpus() -> None:
    pod = valid(mf.engine_pod(plan(SIM, 3), OWNER, OPTIONS))
    (c,) = pod["spec"]["containers"]
    assert c["image"] == OPTIONS.load_image  # the manifest gave no image: the chunktune one
    assert c["command"] == ["chunktune", "sim", "serve"]
    assert c["args"] == [
        "--model", "llama-3.1-8b", "--gpu", "l4", "--host", "0.0.0.0", "--port", "8000",
        "--served-model-name", "llama-3.1-8b", "--load-time", "0.5",
        "--model-config", "/etc/chunktune/model-config.json", "--tensor-parallel-size", "1",
        "--max-num-batched-tokens", "4096", "--long-prefill-token-threshold", "512",
        "--enable-logging-iteration-details"]  # its step log, as a vLLM engine's
    assert "resources" not in c and "tolerations" not in pod["spec"]
    assert {"name": "workload", "configMap": {"name": "llama-tune-t3-workload"}} in \
        pod["spec"]["volumes"]
    cm = valid(mf.workload_configmap(plan(SIM, 3), OWNER))
    assert json.loads(cm["data"]["model-config.json"])["hidden_size"] == 4096


def test_workload_configmap_carries_the_profile() -> None:
    cm = valid(mf.workload_configmap(plan(), OWNER))
    assert cm["metadata"]["name"] == "llama-tune-t7-workload"
    assert cm["metadata"]["labels"]["app.kubernetes.io/component"] == "workload"
    assert yaml.safe_load(cm["data"]["profile.yaml"]) == PROFILE.to_dict()
    assert set(cm["data"]) == {"profile.yaml"}


def test_load_job() -> None:
    p = plan(window_seconds=5.0, slos={"chat": {"ttft": 0.5, "tpot": 0.05}, "*": {"e2e": 10.0}})
    job = valid(mf.load_job(p, OWNER, OPTIONS, "http://10.1.2.3:8000"))
    assert job["metadata"]["name"] == "llama-tune-t7-load"
    spec = job["spec"]
    assert spec["backoffLimit"] == 0
    assert spec["activeDeadlineSeconds"] >= PROFILE.duration + p.drain_timeout
    pod = spec["template"]["spec"]
    assert spec["template"]["metadata"]["labels"]["chunktune.dev/trial"] == "7"
    assert pod["restartPolicy"] == "Never"
    (c,) = pod["containers"]
    assert c["image"] == OPTIONS.load_image
    assert c["command"] == ["/bin/sh", "-c", mf.LOAD_SCRIPT, "chunktune-load"]
    assert c["args"] == [
        "/var/run/chunktune/summary.json", "--target", "http://10.1.2.3:8000",
        "--profile", "/etc/chunktune/profile.yaml", "--model", "llama", "--drain-timeout",
        "60s", "--windows", "5s", "--slo", "chat:ttft=0.5", "--slo", "chat:tpot=0.05",
        "--slo", "e2e=10.0"]
    assert {"name": "workload", "configMap": {"name": "llama-tune-t7-workload"}} in \
        pod["volumes"]
    assert {"name": "workload", "mountPath": "/etc/chunktune", "readOnly": True} in \
        c["volumeMounts"]


def test_distributed_load_is_a_master_service_and_a_worker_job() -> None:
    """``workload.loadWorkers``: the load Job's pod is Locust's master behind a Service; a
    worker Job runs that many ``chunktune load worker`` pods at once, pointed at it."""
    p = plan(load_workers=3)
    job = valid(mf.load_job(p, OWNER, OPTIONS, "http://10.1.2.3:8000"))
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert c["args"][-7:] == ["--workers", "3", "--master-bind", "0.0.0.0", "--master-port",
                              str(mf.MASTER_PORT), "--external-workers"]
    svc = valid(mf.load_master_service(p, OWNER))
    assert svc["metadata"]["name"] == "llama-tune-t7-lm"
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    # the Service selects the load Job's pod (the Job controller adds job-name to its pods)
    assert {k: v for k, v in svc["spec"]["selector"].items() if k != "job-name"}.items() <= \
        pod_labels.items() and svc["spec"]["selector"]["job-name"] == job["metadata"]["name"]
    assert svc["spec"]["ports"][0]["port"] == mf.MASTER_PORT
    workers = valid(mf.load_workers_job(p, OWNER, OPTIONS))
    assert workers["metadata"]["name"] == "llama-tune-t7-lw"
    assert workers["spec"]["parallelism"] == workers["spec"]["completions"] == 3
    wpod = workers["spec"]["template"]["spec"]
    (w,) = wpod["containers"]
    assert w["command"] == ["chunktune", "load", "worker"]
    assert w["args"] == ["--master", f"llama-tune-t7-lm.ml.svc:{mf.MASTER_PORT}"]
    assert w["securityContext"] == c["securityContext"]
    assert [v["name"] for v in wpod["volumes"]] == ["tmp"]
    # nothing distributed by default
    (c0,) = mf.load_job(plan(), OWNER, OPTIONS, "http://x")["spec"]["template"]["spec"][
        "containers"]
    assert "--workers" not in c0["args"]


def test_names_fit_kubernetes_limits() -> None:
    long = "a" * 200
    names = mf.trial_names(long, 12345)
    assert len(names.job) <= 63 and names.job.endswith("-t12345-load")
    assert names.pod == names.job.removesuffix("-load")
    assert mf.trial_names(long, 1) != mf.trial_names("a" * 199, 1)
    assert len(mf.label_value(long)) <= 63
    assert mf.label_value("short.name") == "short.name"
    owner = mf.Owner(name=long, namespace="ns", uid="u")
    valid(mf.engine_pod(plan(), owner, OPTIONS))


def test_parse_load_log_ignores_other_lines() -> None:
    window = {"index": 0, "start": 0.0, "end": 5.0, "warmup": True, "overall": {}}
    summary = {"schema": "chunktune.dev/load-summary/v1", "overall": {"requests": {}}}
    log = "\n".join([
        "chunktune load run: smoke (poisson 6 req/s, 30s, warm-up 5s) against http://x",
        json.dumps(window),
        "[   5.0s/30s] sent 30  done 28  in flight 2  failed 0  TTFT p99 (last 10s) 3.1 ms",
        json.dumps({**window, "index": 1, "warmup": False}),
        json.dumps(window),  # a repeated line is one window
        '{"index": 2, "start": 10.0, "end"',  # cut short while being written
        '{"not": "a window"}',
        f"{mf.SUMMARY_MARKER} {json.dumps(summary)}",
        "  trial report table ...",
    ])
    parsed = mf.parse_load_log(log)
    assert [w["index"] for w in parsed.windows] == [0, 1]
    assert parsed.summary == summary
    assert mf.parse_load_log(f"{mf.SUMMARY_MARKER} {{\"schema\": \"other\"}}").summary is None
    assert mf.parse_load_log("").summary is None


def test_load_script_prints_the_summary_on_one_line(tmp_path: Path) -> None:
    """The Job's shell program, with a stand-in ``chunktune`` that writes an indented summary
    (as ``chunktune load run --out`` does) and one window line."""
    fake = tmp_path / "chunktune"
    fake.write_text("#!/bin/sh\n"
                    'while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done\n'
                    "echo '{\"index\":0,\"start\":0,\"end\":1,\"warmup\":false,\"overall\":{}}'\n"
                    'printf \'{\\n  "schema": "chunktune.dev/load-summary/v1",\\n'
                    '  "text": "a\\\\nb"\\n}\\n\' > "$out"\n'
                    "echo progress >&2\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "summary.json"
    run = subprocess.run(["/bin/sh", "-c", mf.LOAD_SCRIPT, "chunktune-load", str(out),
                          "--target", "http://x"], capture_output=True, text=True,
                         env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert run.returncode == 3  # the run's own status
    parsed = mf.parse_load_log(run.stdout + run.stderr)
    assert parsed.summary == {"schema": "chunktune.dev/load-summary/v1", "text": "a\nb"}
    assert [w["index"] for w in parsed.windows] == [0]


@pytest.mark.parametrize(("args", "expected"), [
    (["serve", "m", "--max-num-batched-tokens", "2048", "--x"],
     ["serve", "m", "--max-num-batched-tokens", "4096", "--x",
      "--long-prefill-token-threshold", "512"]),
    (["--max_num_batched_tokens=1024", "--long-prefill-token-threshold", "0"],
     ["--max_num_batched_tokens=4096", "--long-prefill-token-threshold", "512"]),
    ([], ["--max-num-batched-tokens", "4096", "--long-prefill-token-threshold", "512"]),
    (["vllm serve mistralai/Mistral-7B --trust-remote-code --max_num_batched_tokens 1024"],
     ["vllm serve mistralai/Mistral-7B --trust-remote-code --max_num_batched_tokens 4096 "
      "--long-prefill-token-threshold 512"]),
])
def test_set_flags(args: list[str], expected: list[str]) -> None:
    assert dp.set_flags(args, {"max-num-batched-tokens": 4096,
                               "long-prefill-token-threshold": 512}) == expected


def test_output_configmap() -> None:
    best = {"number": 3, "params": {"max-num-batched-tokens": 4096}}
    cm = valid(mf.output_configmap("best", OWNER, "--max-num-batched-tokens 4096", best, []))
    assert cm["data"]["flags"] == "--max-num-batched-tokens 4096"
    assert json.loads(cm["data"]["best.json"]) == best
    assert json.loads(cm["data"]["pareto.json"]) == []
    assert "ownerReferences" not in cm["metadata"]  # the result outlives the tuning


@pytest.mark.parametrize("name", ["vllm-llama8b-h100.yaml", "sim-cluster.yaml"])
def test_examples_make_valid_trial_objects(name: str) -> None:
    from chunktune.api.reader import load_manifest
    from chunktune.tuning.runner import target_from_spec

    path = Path(__file__).resolve().parents[2] / "examples" / name
    t = load_manifest(path)
    target = target_from_spec(t)
    p = TrialPlan(number=0, params={"max-num-batched-tokens": 2048}, target=target,
                  profile=t.spec.workload.resolve(), window_seconds=5.0)
    owner = mf.Owner(t.metadata.name, t.metadata.namespace or "default", "uid-1")
    resources = t.spec.engine.resources.model_dump(mode="json", exclude_none=True) \
        if t.spec.engine.resources else None
    pod = valid(mf.engine_pod(p, owner, OPTIONS, resources))
    valid(mf.load_job(p, owner, OPTIONS, "http://10.0.0.1:8000"))
    valid(mf.workload_configmap(p, owner))
    (c,) = pod["spec"]["containers"]
    if target.kind == "vllm":
        assert c["command"] == ["vllm", "serve"] and c["image"].startswith("vllm/vllm-openai:v")
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"  # a string: see below
        hf = next(e for e in c["env"] if e["name"] == "HF_TOKEN")
        assert hf["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}
    else:
        assert c["command"] == ["chunktune", "sim", "serve"]
        assert "nvidia.com/gpu" not in json.dumps(c)


# ---- least privilege ----------------------------------------------------------------------


def _pod_specs(engine_plan: TrialPlan, security: dict[str, Any] | None = None
               ) -> dict[str, dict[str, Any]]:
    return {"engine": valid(mf.engine_pod(engine_plan, OWNER, OPTIONS, None, security))["spec"],
            "load": valid(mf.load_job(engine_plan, OWNER, OPTIONS, "http://10.0.0.1:8000"))[
                "spec"]["template"]["spec"]}


def test_the_checker_catches_each_restricted_control() -> None:
    from tests.k8s import pss

    good = _pod_specs(plan(SIM, 3))["engine"]
    assert pss.violations(good) == []
    broken = json.loads(json.dumps(good))
    c = broken["containers"][0]["securityContext"]
    c.update(allowPrivilegeEscalation=True, privileged=True,
             capabilities={"add": ["SYS_ADMIN"], "drop": []})
    broken["securityContext"] = {"runAsUser": 0, "seccompProfile": {"type": "Unconfined"}}
    broken["hostNetwork"] = True
    broken["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    found = "\n".join(pss.violations(broken))
    for control in ("hostNetwork", "hostPath", "privileged", "allowPrivilegeEscalation",
                    "runAsNonRoot", "runAsUser must not be 0", "seccompProfile",
                    "drop must include ALL", "capabilities.add"):
        assert control in found, control


def test_load_jobs_and_simulated_engines_meet_the_restricted_profile() -> None:
    from tests.k8s import pss

    for kind, spec in _pod_specs(plan(SIM, 3)).items():
        assert pss.violations(spec) == [], kind
        assert pss.read_only_root(spec) == [], kind
        mounts = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
        assert "/tmp" in mounts, kind  # writable scratch with a read-only root
        assert spec["securityContext"]["runAsUser"] == mf.CHUNKTUNE_UID
    load = _pod_specs(plan(SIM, 3))["load"]
    assert "/var/run/chunktune" in {m["mountPath"] for m in load["containers"][0]["volumeMounts"]}


def test_vllm_engines_get_the_strictest_context_vllm_runs_with() -> None:
    from tests.k8s import pss

    spec = _pod_specs(plan())["engine"]
    sc = spec["containers"][0]["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["readOnlyRootFilesystem"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # the one documented looser control: the image's user (vllm/vllm-openai runs as root)
    assert pss.violations(spec) == [
        "spec.containers[0].securityContext.runAsNonRoot must be true (here or in "
        "spec.securityContext)"]
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["HOME"] == mf.CACHE_DIR and env["HF_HOME"].startswith(mf.CACHE_DIR)
    mounts = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    assert {mf.CACHE_DIR, "/tmp", "/dev/shm"} <= mounts
    # per tuning: fully restricted as a non-root user ...
    strict = _pod_specs(plan(), {"runAsNonRoot": True, "runAsUser": 1000,
                                 "runAsGroup": 1000, "fsGroup": 1000})["engine"]
    assert pss.violations(strict) == []
    assert strict["securityContext"]["runAsUser"] == 1000
    # ... or looser where an image needs it: a writable root file system, IPC_LOCK for RDMA
    loose = _pod_specs(plan(), {"readOnlyRootFilesystem": False,
                                "addCapabilities": ["IPC_LOCK"]})["engine"]
    lsc = loose["containers"][0]["securityContext"]
    assert lsc["readOnlyRootFilesystem"] is False
    assert lsc["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert lsc["allowPrivilegeEscalation"] is False


def test_a_cache_variable_the_manifest_sets_wins() -> None:
    from dataclasses import replace

    p = plan()
    target = replace(p.target, env=(*p.target.env, {"name": "HF_HOME", "value": "/models"}))
    spec = mf.engine_pod(replace(p, target=target), OWNER, OPTIONS)["spec"]
    homes = [e for e in spec["containers"][0]["env"] if e["name"] == "HF_HOME"]
    assert homes == [{"name": "HF_HOME", "value": "/models"}]


def test_a_simulated_trials_pod_runs_on_the_stated_peer_to_peer_path() -> None:
    """``spec.engine.gpu.peerToPeer`` of a manifest reaches the trial's target and the
    ``chunktune sim serve`` its Pod runs; left out, no flag (the engine's default)."""
    from chunktune.api.reader import load_manifest
    from chunktune.tuning.runner import target_from_spec

    path = Path(__file__).resolve().parents[2] / "examples" / "sim-cluster.yaml"
    t = load_manifest(path)
    assert target_from_spec(t).gpu_peer_to_peer is None
    t.spec.engine.gpu.type = "l40s"
    t.spec.engine.gpu.peer_to_peer = False
    target = target_from_spec(t)
    assert target.gpu_peer_to_peer is False
    p = TrialPlan(number=0, params={"max-num-batched-tokens": 2048}, target=target,
                  profile=t.spec.workload.resolve())
    (c,) = valid(mf.engine_pod(p, OWNER, OPTIONS, None))["spec"]["containers"]
    args = c["args"]
    assert args[args.index("--gpu") + 1] == "l40s"
    assert "--no-gpu-peer-to-peer" in args and "--gpu-peer-to-peer" not in args
