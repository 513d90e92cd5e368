"""Pure builders of the Kubernetes objects a trial runs as, and readers of what they report.

Nothing here does I/O: every function takes plain data (a :class:`~.base.TrialPlan`, the
owning ``ChunkedPrefillTuning``'s identity, :class:`TrialOptions`) and returns a manifest
mapping, so each is snapshot-tested without a cluster (``tests/k8s/test_manifests.py``).
:mod:`chunktune.backends.kubernetes` does the I/O.

One trial is three objects, all labelled with the tuning and the trial and owned by the
``ChunkedPrefillTuning`` (the garbage collector is the second net behind the operator's own
clean-up):

* a **ConfigMap** ``<base>-workload`` holding the workload profile (``profile.yaml``), a
  trace's requests (``trace.csv``, which the profile names) and, for a simulated engine with an
  inline ``modelConfig``, ``model-config.json``;
* the engine **Pod** ``<base>``: ``vllm serve <model> --host 0.0.0.0 --port <port>
  --served-model-name <name> <flags>`` (``engine.kind: vllm``) or ``chunktune sim serve --model
  <model> --gpu <type> ...`` (``engine.kind: sim``), with ``nvidia.com/gpu`` requests = limits
  (vLLM only), a memory ``emptyDir`` on ``/dev/shm``, the engine's environment as given
  (Secret references stay references), startup and readiness probes on ``/health`` and
  ``restartPolicy: Never``;
* the load **Job** ``<base>-load`` running ``chunktune load run`` against the pod's IP, with the
  profile mounted from the ConfigMap. Its log carries the intermediate windows as JSON lines
  (``--windows``) and, last, the summary on one line after :data:`SUMMARY_MARKER`
  (:data:`LOAD_SCRIPT`); :func:`parse_load_log` reads both back and ignores everything else.

A distributed load (``workload.loadWorkers`` N) adds two: the load Job's pod is Locust's
master (``--workers N --external-workers``), the **Service** ``<base>-lm`` leads to it, and
the worker **Job** ``<base>-lw`` runs N pods of ``chunktune load worker`` at once.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from chunktune.backends import vllm
from chunktune.core.errors import SpecError
from chunktune.core.flags import flags_line
from chunktune.core.trials import TrialPlan
from chunktune.core.workload import Profile

#: Label keys (``app.kubernetes.io/*`` plus ours).
MANAGED_BY = "app.kubernetes.io/managed-by"
COMPONENT = "app.kubernetes.io/component"
PART_OF = "app.kubernetes.io/part-of"
TUNING = "chunktune.dev/tuning"
TUNING_UID = "chunktune.dev/tuning-uid"
TRIAL = "chunktune.dev/trial"
#: Annotations on trial objects (informative; the operator never reads them back).
FLAGS_ANNOTATION = "chunktune.dev/flags"
TUNING_NAME_ANNOTATION = "chunktune.dev/tuning-name"

ENGINE_CONTAINER = "engine"
LOAD_CONTAINER = "load"
WORKLOAD_DIR = "/etc/chunktune"
PROFILE_FILE = "profile.yaml"
#: A trace's requests (the generic CSV), beside the profile that names it.
TRACE_FILE = "trace.csv"
#: What a ConfigMap's data may hold: Kubernetes refuses objects over 1 MiB; the rest is left
#: to the metadata.
CONFIGMAP_DATA_LIMIT = 1_000_000
MODEL_CONFIG_FILE = "model-config.json"
#: A simulated engine's calibration profile (spec.engine.calibration), in the workload ConfigMap
#: when given as a file, else mounted from the user's ConfigMap under CALIBRATION_DIR.
CALIBRATION_FILE = "calibration.json"
CALIBRATION_DIR = "/etc/chunktune-calibration"
RESULTS_DIR = "/var/run/chunktune"
SUMMARY_PATH = f"{RESULTS_DIR}/summary.json"
SHM_DIR = "/dev/shm"
TMP_DIR = "/tmp"
#: The writable home of a vLLM/SGLang engine whose root file system is read-only: HOME and the
#: model, compile and kernel caches point here (an ``emptyDir``).
CACHE_DIR = "/var/cache/engine"
GPU_RESOURCE = "nvidia.com/gpu"
#: The chunktune image's user and group (the Dockerfile's numeric ``USER``).
CHUNKTUNE_UID = 10001

# ---- security contexts (the restricted Pod Security profile) ------------------------------------
#
# Load Jobs and simulated engines run the chunktune image and meet the restricted profile:
# non-root (uid 10001), RuntimeDefault seccomp, no privilege escalation, every capability
# dropped, and a read-only root file system with emptyDirs where they write (/tmp, the load's
# results, /dev/shm).
#
# vLLM and SGLang engines get the same, with two differences documented in the chart README:
# the user is the image's own (vllm/vllm-openai runs as root, so runAsNonRoot is not set unless
# spec.engine.securityContext asks for it, e.g. runAsNonRoot: true with runAsUser: 1000), and
# HOME plus the Hugging Face, vLLM, Triton and XDG cache variables point at an emptyDir
# (CACHE_DIR), since vLLM downloads the model and compiles kernels into them.

#: Environment of a vLLM/SGLang engine with a read-only root file system: every cache vLLM and
#: its libraries write goes under :data:`CACHE_DIR` (a variable the manifest's env sets wins).
ENGINE_CACHE_ENV: tuple[tuple[str, str], ...] = (
    ("HOME", CACHE_DIR),
    ("XDG_CACHE_HOME", f"{CACHE_DIR}/.cache"),
    ("XDG_CONFIG_HOME", f"{CACHE_DIR}/.config"),
    ("HF_HOME", f"{CACHE_DIR}/huggingface"),
    ("VLLM_CACHE_ROOT", f"{CACHE_DIR}/vllm"),
    ("VLLM_CONFIG_ROOT", f"{CACHE_DIR}/.config/vllm"),
    ("TRITON_CACHE_DIR", f"{CACHE_DIR}/triton"),
    ("TORCHINDUCTOR_CACHE_DIR", f"{CACHE_DIR}/torchinductor"),
)


def restricted_pod_security(uid: int | None = CHUNKTUNE_UID) -> dict[str, Any]:
    """The pod-level security context of the restricted profile (``uid``: None keeps the
    image's user and does not require non-root)."""
    out: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if uid is not None:
        out = {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, **out}
    return out


def restricted_container_security(read_only: bool = True) -> dict[str, Any]:
    """The container-level security context of the restricted profile, with a read-only root
    file system."""
    return {"allowPrivilegeEscalation": False, "privileged": False,
            "readOnlyRootFilesystem": read_only, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}}


def engine_security(kind: str, override: Mapping[str, Any] | None = None
                    ) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(pod securityContext, container securityContext)`` of an engine. A simulated engine
    runs the chunktune image under the restricted profile (``override`` is refused for it by
    the manifest's checks); vLLM/SGLang get the strictest context they run with, loosened or
    tightened by ``spec.engine.securityContext`` (``override``, camelCase keys)."""
    if kind == "sim":
        return restricted_pod_security(), restricted_container_security()
    o = dict(override or {})
    pod = restricted_pod_security(uid=None)
    for key in ("runAsUser", "runAsGroup", "fsGroup"):
        if o.get(key) is not None:
            pod[key] = o[key]
    if o.get("runAsNonRoot") is not None:
        pod["runAsNonRoot"] = bool(o["runAsNonRoot"])
    container = restricted_container_security(
        read_only=o.get("readOnlyRootFilesystem") is not False)
    if o.get("addCapabilities"):
        container["capabilities"]["add"] = list(o["addCapabilities"])
    return pod, container

#: Start of the log line that carries the load run's summary JSON (one line).
SUMMARY_MARKER = "chunktune.dev/load-summary:"
#: The load container's program (``/bin/sh -c LOAD_SCRIPT chunktune-load SUMMARY ARGS...``):
#: run ``chunktune load run ARGS --out SUMMARY``, then print the summary as one line after
#: :data:`SUMMARY_MARKER` (JSON has no raw newlines inside strings, so deleting them keeps it
#: valid) and exit with the run's status.
LOAD_SCRIPT = (
    'out="$1"; shift\n'
    'chunktune load run "$@" --out "$out"\n'
    "rc=$?\n"
    'if [ -s "$out" ]; then printf "%s " "' + SUMMARY_MARKER + '"; tr -d "\\n" < "$out"; '
    "echo; fi\n"
    "exit $rc\n"
)

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
#: Longest name of a Job (its name becomes the ``job-name`` label of its pods: 63 at most).
_MAX_JOB_NAME = 63


@dataclass(frozen=True)
class Owner:
    """The ``ChunkedPrefillTuning`` a trial's objects belong to."""

    name: str
    namespace: str
    uid: str
    api_version: str = "chunktune.dev/v1alpha1"
    kind: str = "ChunkedPrefillTuning"

    def reference(self) -> dict[str, Any]:
        """An ``ownerReferences`` item: the controller, blocking the owner's deletion."""
        return {"apiVersion": self.api_version, "kind": self.kind, "name": self.name,
                "uid": self.uid, "controller": True, "blockOwnerDeletion": True}

    def selector(self, number: int | None = None) -> str:
        """The label selector of this tuning's trial objects (of one trial if ``number``)."""
        sel = f"{MANAGED_BY}=chunktune,{TUNING_UID}={self.uid}"
        return sel if number is None else f"{sel},{TRIAL}={number}"


@dataclass(frozen=True)
class TrialOptions:
    """Cluster-side choices the manifest does not make (from the operator's settings)."""

    load_image: str
    """The chunktune image that runs ``chunktune load run`` (and ``chunktune sim serve``
    when the manifest gives no image)."""
    image_pull_policy: str | None = None
    service_account: str | None = None
    """Service account of trial pods (none of them talks to the API)."""
    shm_size: str = "8Gi"
    """``sizeLimit`` of the memory ``emptyDir`` on ``/dev/shm``."""
    sim_load_time: float | None = None
    """``--load-time`` of simulated engines (None: the simulator's default)."""
    load_resources: Mapping[str, Any] = field(
        default_factory=lambda: {"requests": {"cpu": "1", "memory": "512Mi"}})
    """Resources of the load container."""
    job_ttl_seconds: int = 86400
    """``ttlSecondsAfterFinished`` of load Jobs (a net for Jobs the operator never deletes)."""
    gpu_tolerations: bool = True
    """Tolerate the ``nvidia.com/gpu`` NoSchedule taint on GPU pods."""
    sim_requests_gpus: bool = False
    """Simulated engines request (and tolerate) the ``nvidia.com/gpu`` they simulate, as a
    vLLM engine would: a rehearsal of the cluster's GPU scheduling (parallel trials waiting for
    capacity) with simulated engines."""
    tmp_size: str = "1Gi"
    """``sizeLimit`` of the ``/tmp`` ``emptyDir`` of trial containers (their root file system
    is read-only)."""


@dataclass(frozen=True)
class TrialNames:
    """The names of one trial's objects."""

    pod: str
    job: str
    configmap: str
    workers: str = ""
    """The worker Job of a distributed load (``workload.loadWorkers``), and the Service that
    leads its pods to the load Job's pod, Locust's master."""
    master: str = ""


def label_value(text: str) -> str:
    """``text`` as a label value: at most 63 characters (a hash suffix when cut)."""
    if len(text) <= 63 and _LABEL_VALUE.match(text):
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    head = re.sub(r"[^-A-Za-z0-9_.]", "-", text)[:54].strip("-_.")
    return f"{head}-{digest}" if head else digest


def trial_names(tuning: str, number: int) -> TrialNames:
    """Deterministic object names: ``<tuning>-t<number>`` (cut with a hash suffix so that the
    Job name, ``<base>-load``, stays within 63 characters)."""
    suffix = f"-t{number}"
    base = f"{tuning}{suffix}"
    if len(base) + len("-load") > _MAX_JOB_NAME:
        digest = hashlib.sha256(tuning.encode()).hexdigest()[:6]
        keep = _MAX_JOB_NAME - len("-load") - len(suffix) - len(digest) - 1
        base = f"{tuning[:keep].rstrip('-.')}-{digest}{suffix}"
    return TrialNames(pod=base, job=f"{base}-load", configmap=f"{base}-workload",
                      workers=f"{base}-lw", master=f"{base}-lm")


def labels(owner: Owner, number: int, component: str) -> dict[str, str]:
    return {
        MANAGED_BY: "chunktune",
        PART_OF: "chunktune",
        COMPONENT: component,
        TUNING: label_value(owner.name),
        TUNING_UID: owner.uid,
        TRIAL: str(number),
    }


def _metadata(owner: Owner, name: str, number: int, component: str,
              plan: TrialPlan | None = None) -> dict[str, Any]:
    annotations = {TUNING_NAME_ANNOTATION: owner.name}
    if plan is not None:
        annotations[FLAGS_ANNOTATION] = flags_line(plan.params)
    return {"name": name, "namespace": owner.namespace,
            "labels": labels(owner, number, component), "annotations": annotations,
            "ownerReferences": [owner.reference()]}


# ---- the workload ConfigMap ---------------------------------------------------------------------


def workload_files(profile: Profile) -> dict[str, str]:
    """The profile (overrides applied) as ``profile.yaml``; a trace's requests beside it as
    ``trace.csv``, which the profile names. Raises :class:`SpecError` when they would not fit
    a ConfigMap."""
    import yaml

    doc = profile.to_dict()
    files: dict[str, str] = {}
    if "trace" in doc:
        trace = dict(doc["trace"])
        files[TRACE_FILE] = trace.pop("data")
        doc["trace"] = {"file": TRACE_FILE, **trace}
    files[PROFILE_FILE] = yaml.safe_dump(doc, sort_keys=False)
    size = sum(len(v.encode()) for v in files.values())
    if size > CONFIGMAP_DATA_LIMIT:
        n = len(profile.trace) if profile.trace is not None else 0
        raise SpecError(f"the load Job's workload ({n:,} trace requests, {size / 1e6:.2f} MB) "
                        f"does not fit a ConfigMap ({CONFIGMAP_DATA_LIMIT / 1e6:g} MB); replay "
                        "a shorter window of the trace (trace.start, trace.end)",
                        field="spec.workload.trace")
    return files


def workload_configmap(plan: TrialPlan, owner: Owner) -> dict[str, Any]:
    """The trial's workload files (:func:`workload_files`); ``model-config.json`` when a
    simulated engine's model comes inline."""
    names = trial_names(owner.name, plan.number)
    data = workload_files(plan.profile)
    if plan.target.kind == "sim" and plan.target.hf_config:
        data[MODEL_CONFIG_FILE] = json.dumps(plan.target.hf_config, sort_keys=True)
    if plan.target.kind == "sim" and plan.target.calibration:
        data[CALIBRATION_FILE] = json.dumps(plan.target.calibration, sort_keys=True)
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _metadata(owner, names.configmap, plan.number, "workload"),
            "data": data}


# ---- the engine Pod -----------------------------------------------------------------------------


def engine_command(plan: TrialPlan, options: TrialOptions) -> tuple[list[str], list[str]]:
    """``(command, args)`` of the engine container."""
    t = plan.target
    served = ["--served-model-name", t.served_model_name]
    where = ["--host", "0.0.0.0", "--port", str(t.port)]
    if t.kind == "sim":
        extra: list[str] = []
        if options.sim_load_time is not None:
            extra += ["--load-time", f"{options.sim_load_time:g}"]
        if t.vllm_version:
            extra += ["--vllm-version", t.vllm_version]
        if t.hf_config:
            extra += ["--model-config", f"{WORKLOAD_DIR}/{MODEL_CONFIG_FILE}"]
        if t.calibration:
            extra += ["--calibration", f"{WORKLOAD_DIR}/{CALIBRATION_FILE}"]
        elif t.calibration_ref is not None:
            extra += ["--calibration", f"{CALIBRATION_DIR}/{CALIBRATION_FILE}"]
        flags = plan.engine_flags()
        return (["chunktune", "sim", "serve"],
                ["--model", t.model, *t.sim_gpu_args(), *where, *served, *extra,
                 *vllm.with_step_log(flags), *vllm.sim_acceptance(flags, plan.profile)])
    flags = vllm.with_step_log(plan.engine_flags())
    if t.cpu is not None:
        # vLLM's CPU build: the module entry point works in every vLLM image, while the
        # CPU wheel's ``vllm`` console command does not (backends.vllm).
        return (["python3", "-m", vllm.API_SERVER_MODULE],
                ["--model", t.model, *where, *served, *vllm.cpu_env_and_flags(t.cpu)[1],
                 *flags])
    return ["vllm", "serve"], [t.model, *where, *served, *flags]


def _probe(period: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": period,
            "timeoutSeconds": 5, "failureThreshold": failures, "successThreshold": 1}


def startup_failure_threshold(startup_timeout: float, period: int = 10) -> int:
    """Startup-probe failures allowed, so that ``failureThreshold * period`` is at least the
    engine's ``startupTimeout`` plus one period (the operator's own timeout fires first and
    reports ``StartupTimeout`` instead of a killed container)."""
    return max(1, math.ceil(startup_timeout / period) + 1)


def requests_gpus(plan: TrialPlan, options: TrialOptions) -> bool:
    """The engine pod asks for ``nvidia.com/gpu``: a vLLM engine on GPUs, or a simulated one
    when :attr:`TrialOptions.sim_requests_gpus`."""
    t = plan.target
    return t.cpu is None and (t.kind != "sim" or options.sim_requests_gpus)


def _resources(plan: TrialPlan, extra: Mapping[str, Any] | None,
               gpus: bool) -> dict[str, Any]:
    """Requests and limits, every quantity a string (the ``kubernetes`` client refuses a
    number where the API takes a quantity)."""
    out: dict[str, dict[str, Any]] = {}
    for part in ("requests", "limits"):
        given = (extra or {}).get(part) or {}
        values = {k: str(v) for k, v in given.items() if v is not None}
        if gpus:
            values[GPU_RESOURCE] = str(plan.target.gpu_count)
        if values:
            out[part] = values
    return out


def engine_pod(plan: TrialPlan, owner: Owner, options: TrialOptions,
               resources: Mapping[str, Any] | None = None,
               security: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The engine Pod of a trial. ``resources``: ``engine.resources`` (``{"requests": {"cpu":
    ..., "memory": ...}, "limits": {...}}``); GPUs come from the target. ``security``:
    ``engine.securityContext`` (see :func:`engine_security`)."""
    t = plan.target
    names = trial_names(owner.name, plan.number)
    command, args = engine_command(plan, options)
    image = t.image or options.load_image
    pod_security, container_security = engine_security(t.kind, security)
    given = {v.get("name") for v in t.env}
    env: list[dict[str, Any]] = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    if t.cpu is not None:
        cpu_env = vllm.cpu_env_and_flags(t.cpu)[0]
        env += [{"name": k, "value": v} for k, v in cpu_env.items() if v is not None]
        env.append({"name": "HF_HUB_OFFLINE", "value": "1"})
    env = [v for v in env if v["name"] not in given or v["name"] == "PYTHONUNBUFFERED"]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": SHM_DIR},
                                    {"name": "tmp", "mountPath": TMP_DIR}]
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": options.shm_size}},
        {"name": "tmp", "emptyDir": {"sizeLimit": options.tmp_size}}]
    if t.kind != "sim":
        env += [{"name": k, "value": v} for k, v in ENGINE_CACHE_ENV if k not in given]
        mounts.append({"name": "cache", "mountPath": CACHE_DIR})
        volumes.append({"name": "cache", "emptyDir": {}})
    env += [dict(v) for v in t.env if v.get("name") != "PYTHONUNBUFFERED"]
    if t.kind == "sim" and (t.hf_config or t.calibration):
        mounts.append({"name": "workload", "mountPath": WORKLOAD_DIR, "readOnly": True})
        volumes.append({"name": "workload", "configMap": {"name": names.configmap}})
    if t.kind == "sim" and t.calibration_ref is not None and not t.calibration:
        cm, key = t.calibration_ref
        mounts.append({"name": "calibration", "mountPath": CALIBRATION_DIR, "readOnly": True})
        volumes.append({"name": "calibration", "configMap": {
            "name": cm, "items": [{"key": key, "path": CALIBRATION_FILE}]}})
    container: dict[str, Any] = {
        "name": ENGINE_CONTAINER, "image": image, "command": command, "args": args,
        "ports": [{"name": "http", "containerPort": t.port, "protocol": "TCP"}],
        "env": env,
        "volumeMounts": mounts,
        "startupProbe": _probe(10, startup_failure_threshold(t.startup_timeout)),
        "readinessProbe": _probe(5, 3),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security,
    }
    if options.image_pull_policy:
        container["imagePullPolicy"] = options.image_pull_policy
    gpus = requests_gpus(plan, options)
    res = _resources(plan, resources, gpus)
    if res:
        container["resources"] = res
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 30,
        "securityContext": pod_security,
        "containers": [container],
        "volumes": volumes,
    }
    if options.service_account:
        spec["serviceAccountName"] = options.service_account
    if gpus and options.gpu_tolerations:
        spec["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists",
                                "effect": "NoSchedule"}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": _metadata(owner, names.pod, plan.number, "engine", plan),
            "spec": spec}


# ---- the load Job -------------------------------------------------------------------------------


def load_args(plan: TrialPlan, target_url: str) -> list[str]:
    """The arguments of ``chunktune load run`` for a trial (without ``--out``)."""
    args = ["--target", target_url, "--profile", f"{WORKLOAD_DIR}/{PROFILE_FILE}",
            "--model", plan.target.served_model_name,
            "--drain-timeout", f"{plan.drain_timeout:g}s"]
    if plan.window_seconds:
        args += ["--windows", f"{plan.window_seconds:g}s"]
    for cls, slo in plan.slos.items():
        for metric, value in slo.items():
            args += ["--slo", f"{'' if cls == '*' else cls + ':'}{metric}={value!r}"]
    if plan.load_workers:
        args += ["--workers", str(plan.load_workers), "--master-bind", "0.0.0.0",
                 "--master-port", str(MASTER_PORT), "--external-workers"]
    return args


#: The port of a distributed load's Locust master (in the load Job's pod).
MASTER_PORT = 5557


def load_master_service(plan: TrialPlan, owner: Owner) -> dict[str, Any]:
    """The Service in front of the load Job's pod (Locust's master) that the worker Job's pods
    connect to (``workload.loadWorkers``)."""
    names = trial_names(owner.name, plan.number)
    meta = _metadata(owner, names.master, plan.number, "load-master", plan)
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": {
        "selector": {**labels(owner, plan.number, "load"), "job-name": names.job},
        "ports": [{"name": "locust", "port": MASTER_PORT, "targetPort": MASTER_PORT,
                   "protocol": "TCP"}],
        "publishNotReadyAddresses": True}}


def load_workers_job(plan: TrialPlan, owner: Owner, options: TrialOptions) -> dict[str, Any]:
    """The worker Job of a distributed load: ``workload.loadWorkers`` pods at once, each
    ``chunktune load worker`` connected to the master's Service; bounded like the load Job."""
    names = trial_names(owner.name, plan.number)
    job = load_job(plan, owner, options, "")
    meta = _metadata(owner, names.workers, plan.number, "load-worker", plan)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    container.update(name="load-worker", command=["chunktune", "load", "worker"],
                     args=["--master", f"{names.master}.{owner.namespace}.svc:{MASTER_PORT}"])
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] == "tmp"]
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] == "tmp"]
    job.update(metadata=meta)
    job["spec"].update(parallelism=plan.load_workers, completions=plan.load_workers,
                       template={"metadata": {"labels": dict(meta["labels"])}, "spec": pod})
    return job


def load_job(plan: TrialPlan, owner: Owner, options: TrialOptions,
             target_url: str) -> dict[str, Any]:
    """The load Job of a trial: one pod, no retries, bounded by the profile's duration."""
    names = trial_names(owner.name, plan.number)
    container: dict[str, Any] = {
        "name": LOAD_CONTAINER, "image": options.load_image,
        "command": ["/bin/sh", "-c", LOAD_SCRIPT, "chunktune-load"],
        "args": [SUMMARY_PATH, *load_args(plan, target_url)],
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
        "volumeMounts": [
            {"name": "workload", "mountPath": WORKLOAD_DIR, "readOnly": True},
            {"name": "results", "mountPath": RESULTS_DIR},
            {"name": "tmp", "mountPath": TMP_DIR},
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": restricted_container_security(),
    }
    if options.image_pull_policy:
        container["imagePullPolicy"] = options.image_pull_policy
    if options.load_resources:
        container["resources"] = json.loads(json.dumps(options.load_resources))
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 10,
        "securityContext": restricted_pod_security(),
        "containers": [container],
        "volumes": [{"name": "workload", "configMap": {"name": names.configmap}},
                    {"name": "results", "emptyDir": {"sizeLimit": "64Mi"}},
                    {"name": "tmp", "emptyDir": {"sizeLimit": options.tmp_size}}],
    }
    if options.service_account:
        pod_spec["serviceAccountName"] = options.service_account
    deadline = plan.profile.duration + plan.drain_timeout + 300
    meta = _metadata(owner, names.job, plan.number, "load", plan)
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": math.ceil(deadline),
            "ttlSecondsAfterFinished": options.job_ttl_seconds,
            "template": {"metadata": {"labels": dict(meta["labels"])}, "spec": pod_spec},
        },
    }


# ---- reading the load Job's log -----------------------------------------------------------------


@dataclass
class LoadLog:
    """What a load Job's log says: the windows so far (by index) and, once done, the
    summary."""

    windows: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] | None = None


_WINDOW_KEYS = frozenset({"index", "start", "end", "overall"})


def parse_load_log(text: str) -> LoadLog:
    """Windows (JSON lines with ``index``, ``start``, ``end``, ``overall``) and the summary
    (after :data:`SUMMARY_MARKER`) from a load container's log. Other lines — progress,
    Locust's warnings, a line cut short while being written — are ignored."""
    out = LoadLog()
    seen: set[int] = set()
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith(SUMMARY_MARKER):
            doc = _json(line[len(SUMMARY_MARKER):])
            if isinstance(doc, dict) and str(doc.get("schema", "")).startswith(
                    "chunktune.dev/load-summary/"):
                out.summary = doc
        elif line.startswith("{") and line.endswith("}"):
            doc = _json(line)
            if isinstance(doc, dict) and doc.keys() >= _WINDOW_KEYS and \
                    isinstance(doc["index"], int) and doc["index"] not in seen:
                seen.add(doc["index"])
                out.windows.append(doc)
    out.windows.sort(key=lambda w: w["index"])
    return out


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


# ---- outputs ------------------------------------------------------------------------------------


def output_configmap(name: str, owner: Owner, flags: str, best: Mapping[str, Any] | None,
                     pareto: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``spec.output.configMap``: ``flags`` (ready to paste), ``best.json``, ``pareto.json``.
    Not owned by the tuning: the result outlives it."""
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": owner.namespace,
                     "labels": {MANAGED_BY: "chunktune", TUNING: label_value(owner.name)},
                     "annotations": {TUNING_NAME_ANNOTATION: owner.name}},
        "data": {"flags": flags,
                 "best.json": json.dumps(best, indent=2, sort_keys=True) + "\n",
                 "pareto.json": json.dumps(list(pareto), indent=2, sort_keys=True) + "\n"},
    }


__all__ = [
    "CACHE_DIR",
    "CHUNKTUNE_UID",
    "ENGINE_CACHE_ENV",
    "LOAD_SCRIPT",
    "SUMMARY_MARKER",
    "LoadLog",
    "Owner",
    "TrialNames",
    "TrialOptions",
    "engine_command",
    "engine_pod",
    "engine_security",
    "label_value",
    "labels",
    "load_args",
    "load_job",
    "output_configmap",
    "parse_load_log",
    "restricted_container_security",
    "restricted_pod_security",
    "startup_failure_threshold",
    "trial_names",
    "workload_configmap",
    "workload_files",
]
