"""A corpus of bad ChunkedPrefillTuning manifests, each with the field it must be refused on.

Every entry starts from a valid manifest (the quickstart's simulated engine, ``q``, or a small
vLLM one, ``v``) and breaks one thing: wrong types, wrong units, bombs (huge numbers, huge
lists, a grid of billions of points), injections (control characters in names and arguments),
traversal (``..`` and absolute paths), out-of-range values and cross-field rules. ``field`` is
the path ``chunktune validate`` must name (a prefix of the problem's path). The review of issue
12 found the CRD refusing 47 of 94 such manifests; its examples are here too (``review-*``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.api.factories import quickstart, vllm_manifest

Edit = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Bad:
    id: str
    base: str
    edit: Edit
    field: str

    def manifest(self) -> dict[str, Any]:
        m = quickstart() if self.base == "q" else vllm_manifest()
        self.edit(m)
        return m


def put(path: str, value: Any) -> Edit:
    """Set ``spec.<path>`` (dots, ``[i]`` for list items)."""
    def edit(m: dict[str, Any]) -> None:
        node: Any = m["spec"]
        keys = _keys(path)
        for k in keys[:-1]:
            if isinstance(k, str) and k not in node:
                node[k] = {}
            node = node[k]
        node[keys[-1]] = value
    return edit


def drop(path: str) -> Edit:
    def edit(m: dict[str, Any]) -> None:
        node: Any = m["spec"]
        keys = _keys(path)
        for k in keys[:-1]:
            node = node[k]
        del node[keys[-1]]
    return edit


def both(*edits: Edit) -> Edit:
    def edit(m: dict[str, Any]) -> None:
        for e in edits:
            e(m)
    return edit


def _keys(path: str) -> list[str | int]:
    out: list[str | int] = []
    for part in path.split("."):
        name, _, rest = part.partition("[")
        if name:
            out.append(name)
        while rest:
            idx, _, rest = rest.partition("]")
            out.append(int(idx))
            rest = rest.removeprefix("[")
    return out


MNBT = "max-num-batched-tokens"
SS0 = "searchSpace[0]"


def _range(**kw: Any) -> Edit:
    return put(SS0, {"name": MNBT, "type": "int", "low": 512, "high": 4096, **kw})


#: A ``spec.workload.fromPrometheus`` that is fine.
_PROM = {"url": "http://prometheus.monitoring:9090", "selector": '{model_name="llama"}'}

CORPUS: list[Bad] = [
    # ---- the review's examples (issue 12, findings 7 and 8) ----------------------------------
    Bad("review-50-ms", "q", put("workload.duration", "50 ms"), "spec.workload.duration"),
    Bad("review-3x", "q", put("workload.duration", "3x"), "spec.workload.duration"),
    Bad("review-any-constraint", "q", put("constraints[0]", "latency should be low"),
        "spec.constraints[0]"),
    Bad("review-file-url", "q", put("metrics.prometheusURL", "file:///etc/passwd"),
        "spec.metrics.prometheusURL"),
    Bad("review-trial-timeout-0", "q", put("budget.trialTimeout", 0), "spec.budget.trialTimeout"),
    Bad("review-warmup-longer", "q", put("workload.warmup", "5m"), "spec.workload.warmup"),
    Bad("review-duplicate-parameter", "q",
        put("searchSpace[1]", {"name": MNBT, "choices": [1024, 2048]}), "spec.searchSpace[1]"),
    Bad("review-unknown-gpu", "q", put("engine.gpu.type", "h100-sxm6"), "spec.engine.gpu.type"),
    Bad("review-high-1e40", "q", _range(high=1e40), "spec.searchSpace[0].high"),
    Bad("review-99999999999h", "q", put("workload.duration", "99999999999h"),
        "spec.workload.duration"),
    Bad("review-storage-traversal", "q", put("storage", "../../etc/cron.d/x"), "spec.storage"),
    Bad("review-newline-served-name", "v", put("engine.servedModelName", "llama\nINJECTED"),
        "spec.engine.servedModelName"),
    # ---- types ------------------------------------------------------------------------------
    Bad("type-maxtrials-string", "q", put("budget.maxTrials", "20"), "spec.budget.maxTrials"),
    Bad("type-maxtrials-float", "q", put("budget.maxTrials", 2.5), "spec.budget.maxTrials"),
    Bad("type-parallelism-bool", "q", put("budget.parallelism", True), "spec.budget.parallelism"),
    Bad("type-engine-list", "q", put("engine", ["sim"]), "spec.engine"),
    Bad("type-args-string", "v", put("engine.args", "--max-model-len 4096"), "spec.engine.args"),
    Bad("type-args-number", "v", put("engine.args", ["--max-model-len", 4096]),
        "spec.engine.args[1]"),
    Bad("type-port-string", "v", put("engine.port", "8000"), "spec.engine.port"),
    Bad("type-low-string", "q", _range(low="512"), "spec.searchSpace[0].low"),
    Bad("type-choices-strings", "q", put(SS0, {"name": MNBT, "choices": ["1k", "2k"]}),
        "spec.searchSpace[0].choices"),
    Bad("type-duration-float", "q", put("workload.duration", 1.5), "spec.workload.duration"),
    Bad("type-duration-bool", "q", put("workload.duration", True), "spec.workload.duration"),
    Bad("type-rate-string", "q", put("workload.rate", "4/s"), "spec.workload.rate"),
    Bad("type-suspend-string", "q", put("suspend", "yes"), "spec.suspend"),
    Bad("type-objectives-map", "q", put("objectives", {"metric": "ttft_p99"}), "spec.objectives"),
    Bad("type-env-map", "v", put("engine.env", {"HF_TOKEN": "x"}), "spec.engine.env"),
    Bad("type-seed-string", "q", put("sampler.seed", "0"), "spec.sampler.seed"),
    Bad("unknown-field-engine", "q", put("engine.imgae", "x"), "spec.engine.imgae"),
    Bad("unknown-field-spec", "q", put("trials", 5), "spec.trials"),
    Bad("unknown-field-budget", "q", put("budget.maxTrial", 5), "spec.budget.maxTrial"),
    # ---- units ------------------------------------------------------------------------------
    Bad("unit-duration-words", "q", put("workload.duration", "2 minutes"),
        "spec.workload.duration"),
    Bad("unit-duration-days", "q", put("workload.duration", "2d"), "spec.workload.duration"),
    Bad("unit-duration-negative", "q", put("workload.duration", "-5s"), "spec.workload.duration"),
    Bad("unit-duration-inf", "q", put("workload.duration", "inf"), "spec.workload.duration"),
    Bad("unit-duration-nan", "q", put("workload.duration", "nan"), "spec.workload.duration"),
    Bad("unit-duration-exponent", "q", put("workload.duration", "1e9"),
        "spec.workload.duration"),
    Bad("unit-duration-unitless-string", "q", put("workload.duration", "120"),
        "spec.workload.duration"),
    Bad("unit-startup-minutes-word", "v", put("engine.startupTimeout", "15 min"),
        "spec.engine.startupTimeout"),
    Bad("unit-quantity-words", "v", put("engine.resources", {"requests": {"memory": "lots"}}),
        "spec.engine.resources.requests.memory"),
    Bad("unit-quantity-negative", "v", put("engine.resources", {"limits": {"cpu": "-2"}}),
        "spec.engine.resources.limits.cpu"),
    Bad("unit-quantity-gb", "v", put("engine.resources", {"limits": {"memory": "16GB"}}),
        "spec.engine.resources.limits.memory"),
    Bad("unit-constraint-ms-space", "q", put("constraints[0]", "chat.itl_p99 <= 60 ms"),
        "spec.constraints[0]"),
    Bad("unit-constraint-percent-latency", "q", put("constraints[0]", "chat.itl_p99 <= 5%"),
        "spec.constraints[0]"),
    Bad("unit-constraint-op", "q", put("constraints[0]", "chat.itl_p99 < 60ms"),
        "spec.constraints[0]"),
    Bad("unit-constraint-unknown-metric", "q", put("constraints[0]", "chat.latency <= 60ms"),
        "spec.constraints[0]"),
    Bad("unit-constraint-fraction-over", "q", put("constraints[1]", "error_rate <= 150%"),
        "spec.constraints[1]"),
    Bad("unit-scrape-interval-2h", "q", put("metrics.scrapeInterval", "2h"),
        "spec.metrics.scrapeInterval"),
    # ---- bombs ------------------------------------------------------------------------------
    Bad("bomb-maxtrials", "q", put("budget.maxTrials", 10**9), "spec.budget.maxTrials"),
    Bad("bomb-parallelism", "q", put("budget.parallelism", 10**6), "spec.budget.parallelism"),
    Bad("bomb-maxfailed", "q", put("budget.maxFailedTrials", 10**12),
        "spec.budget.maxFailedTrials"),
    Bad("bomb-choices-1000", "q", put(SS0, {"name": MNBT, "choices": list(range(1, 1001))}),
        "spec.searchSpace[0].choices"),
    Bad("bomb-search-space-20", "q", put("searchSpace", [
        {"name": MNBT, "choices": [512 * (i + 1)]} for i in range(20)]), "spec.searchSpace"),
    Bad("bomb-grid-step-1", "q", both(_range(low=1, high=16_000_000, step=1),
                                      put("sampler.name", "grid")), "spec.searchSpace[0]"),
    Bad("bomb-args-200", "v", put("engine.args", ["--enforce-eager"] * 200), "spec.engine.args"),
    Bad("bomb-env-100", "v", put("engine.env", [{"name": f"V{i}", "value": "x"}
                                                for i in range(100)]), "spec.engine.env"),
    Bad("bomb-long-arg", "v", put("engine.args", ["--x", "a" * 5000]), "spec.engine.args[1]"),
    Bad("bomb-long-model", "v", put("engine.model", "m" * 2000), "spec.engine.model"),
    Bad("bomb-long-storage", "q", put("storage", "a" * 5000), "spec.storage"),
    Bad("bomb-objectives-20", "q", put("objectives", [{"metric": "ttft_p99"}] * 20),
        "spec.objectives"),
    Bad("bomb-constraints-50", "q", put("constraints", ["error_rate <= 1%"] * 50),
        "spec.constraints"),
    Bad("bomb-rate", "q", put("workload.rate", 1e12), "spec.workload.rate"),
    Bad("bomb-concurrency", "q", put("workload.concurrency", 10**9), "spec.workload.concurrency"),
    Bad("bomb-tp-1024", "v", put("engine.tensorParallelSize", 1024),
        "spec.engine.tensorParallelSize"),
    Bad("bomb-gpu-count", "v", put("engine.gpu.count", 4096), "spec.engine.gpu.count"),
    Bad("bomb-max-duration", "q", put("budget.maxDuration", "9999999h"),
        "spec.budget.maxDuration"),
    Bad("bomb-trial-timeout-year", "q", put("budget.trialTimeout", 31_536_000),
        "spec.budget.trialTimeout"),
    Bad("bomb-quantity-digits", "v", put("engine.resources", {"limits": {"memory": "9" * 40}}),
        "spec.engine.resources.limits.memory"),
    Bad("bomb-sampler-seed", "q", put("sampler.seed", 2**40), "spec.sampler.seed"),
    Bad("bomb-inline-classes", "q", both(drop("workload.profile"), put("workload.inline", {
        "classes": [{"name": f"c{i}", "prompt_tokens": 10, "output_tokens": 10}
                    for i in range(100)]})), "spec.workload.inline.classes"),
    # ---- injections -------------------------------------------------------------------------
    Bad("inject-model-newline", "v", put("engine.model", "meta-llama/x\n--trust-remote-code"),
        "spec.engine.model"),
    Bad("inject-model-space", "v", put("engine.model", "x --trust-remote-code"),
        "spec.engine.model"),
    Bad("inject-served-name-quote", "v", put("engine.servedModelName", "a\"b"),
        "spec.engine.servedModelName"),
    Bad("inject-served-name-nul", "v", put("engine.servedModelName", "a\x00b"),
        "spec.engine.servedModelName"),
    Bad("inject-arg-newline", "v", put("engine.args", ["--max-model-len", "4096\nEVIL"]),
        "spec.engine.args[1]"),
    Bad("inject-image-space", "v", put("engine.image", "vllm/vllm-openai:v0.11.0 --privileged"),
        "spec.engine.image"),
    Bad("inject-image-semicolon", "v", put("engine.image", "vllm;rm -rf /"),
        "spec.engine.image"),
    Bad("inject-env-name", "v", put("engine.env", [{"name": "A=B;C", "value": "x"}]),
        "spec.engine.env[0].name"),
    Bad("inject-configmap-name", "q", put("output.configMap", "../kube-system/x"),
        "spec.output.configMap"),
    Bad("inject-deployment-name", "q", put("output.patchDeployment", {"name": "Prod Deploy"}),
        "spec.output.patchDeployment.name"),
    Bad("inject-container-name", "q",
        put("output.patchDeployment", {"name": "vllm", "container": "engine\n"}),
        "spec.output.patchDeployment.container"),
    Bad("inject-secret-name", "v", put("engine.env", [{"name": "HF_TOKEN", "valueFrom": {
        "secretKeyRef": {"name": "../other", "key": "token"}}}]), "spec.engine.env[0]"),
    Bad("inject-secret-key", "v", put("engine.env", [{"name": "HF_TOKEN", "valueFrom": {
        "secretKeyRef": {"name": "hf", "key": "a/b"}}}]), "spec.engine.env[0]"),
    Bad("inject-class", "q", put("objectives[0].class", "long context"),
        "spec.objectives[0].class"),
    Bad("inject-prom-userinfo", "q", put("metrics.prometheusURL", "http://u:p@prom:9090"),
        "spec.metrics.prometheusURL"),
    Bad("inject-prom-gopher", "q", put("metrics.prometheusURL", "gopher://prom:70"),
        "spec.metrics.prometheusURL"),
    Bad("inject-prom-no-scheme", "q", put("metrics.prometheusURL", "prometheus:9090"),
        "spec.metrics.prometheusURL"),
    Bad("inject-prom-newline", "q", put("metrics.prometheusURL", "http://prom:9090\nHost: x"),
        "spec.metrics.prometheusURL"),
    # ---- traversal --------------------------------------------------------------------------
    Bad("traverse-storage-absolute", "q", put("storage", "/etc/passwd"), "spec.storage"),
    Bad("traverse-storage-middle", "q", put("storage", "studies/../../x.journal"),
        "spec.storage"),
    Bad("traverse-storage-sqlite-absolute", "q", put("storage", "sqlite:////var/lib/x.db"),
        "spec.storage"),
    Bad("traverse-storage-sqlite-dotdot", "q", put("storage", "sqlite:///../x.db"),
        "spec.storage"),
    Bad("traverse-storage-scheme", "q", put("storage", "redis://db:6379"), "spec.storage"),
    Bad("traverse-storage-password", "q", put("storage", "postgresql://u:secret@db/optuna"),
        "spec.storage"),
    Bad("traverse-profile-absolute", "q", put("workload.profile", "/etc/shadow"),
        "spec.workload.profile"),
    Bad("traverse-profile-dotdot", "q", put("workload.profile", "../../etc/passwd"),
        "spec.workload.profile"),
    Bad("traverse-profile-hidden", "q", put("workload.profile", ".secrets/p.yaml"),
        "spec.workload.profile"),
    Bad("traverse-trace-absolute", "q", both(drop("workload.profile"),
                                             put("workload.trace", {"file": "/etc/shadow"})),
        "spec.workload.trace.file"),
    Bad("traverse-trace-dotdot", "q", both(drop("workload.profile"),
                                           put("workload.trace", {"file": "../t.csv"})),
        "spec.workload.trace.file"),
    # ---- bounds -----------------------------------------------------------------------------
    Bad("bound-maxtrials-0", "q", put("budget.maxTrials", 0), "spec.budget.maxTrials"),
    Bad("bound-parallelism-0", "q", put("budget.parallelism", 0), "spec.budget.parallelism"),
    Bad("bound-port-0", "v", put("engine.port", 0), "spec.engine.port"),
    Bad("bound-port-70000", "v", put("engine.port", 70000), "spec.engine.port"),
    Bad("bound-low-negative", "q", _range(low=-512), "spec.searchSpace[0].low"),
    Bad("bound-seqs-huge", "q", put(SS0, {"name": "max-num-seqs", "choices": [64, 10**6]}),
        "spec.searchSpace[0].choices[1]"),
    Bad("bound-gpu-util-over-1", "q", put(SS0, {"name": "gpu-memory-utilization",
                                                "type": "float", "low": 0.8, "high": 1.5}),
        "spec.searchSpace[0].high"),
    Bad("bound-gpu-util-0", "q", put(SS0, {"name": "gpu-memory-utilization",
                                           "choices": [0, 0.9]}),
        "spec.searchSpace[0].choices[0]"),
    Bad("bound-int-fraction", "q", _range(low=512.5), "spec.searchSpace[0].low"),
    Bad("bound-int-flag-float-type", "q", _range(type="float"), "spec.searchSpace[0].type"),
    Bad("bound-step-0", "q", _range(step=0), "spec.searchSpace[0].step"),
    Bad("bound-step-negative", "q", _range(step=-512), "spec.searchSpace[0].step"),
    Bad("bound-log-low-0", "q", put(SS0, {"name": "long-prefill-token-threshold", "type": "int",
                                          "low": 0, "high": 4096, "log": True}),
        "spec.searchSpace[0].low"),
    Bad("bound-rate-0", "q", put("workload.rate", 0), "spec.workload.rate"),
    Bad("bound-duration-0", "q", put("workload.duration", "0s"), "spec.workload.duration"),
    Bad("bound-startup-0", "v", put("engine.startupTimeout", 0), "spec.engine.startupTimeout"),
    Bad("bound-min-improvement-1", "q", put("budget.minImprovement", 1.0),
        "spec.budget.minImprovement"),
    Bad("bound-sampler-seed-negative", "q", put("sampler.seed", -1), "spec.sampler.seed"),
    Bad("bound-max-model-len-huge", "q", put(SS0, {
        "name": "max-model-len", "choices": [4096, 2**30]}), "spec.searchSpace[0].choices[1]"),
    # ---- enums ------------------------------------------------------------------------------
    Bad("enum-kind", "q", put("engine.kind", "tgi"), "spec.engine.kind"),
    Bad("enum-sampler", "q", put("sampler.name", "tpee"), "spec.sampler.name"),
    Bad("enum-pruner", "q", put("pruner", {"name": "sometimes"}), "spec.pruner.name"),
    Bad("enum-metric", "q", put("objectives[0].metric", "ttft_p98"),
        "spec.objectives[0].metric"),
    Bad("enum-direction", "q", put("objectives[0].direction", "down"),
        "spec.objectives[0].direction"),
    Bad("enum-flag", "q", put(SS0, {"name": "chunk-size", "choices": [512]}),
        "spec.searchSpace[0].name"),
    Bad("enum-gpu-uppercase", "q", put("engine.gpu.type", "H100"), "spec.engine.gpu.type"),
    Bad("enum-inline-api", "q", both(drop("workload.profile"), put("workload.inline", {
        "classes": [{"name": "c", "api": "embeddings", "prompt_tokens": 10,
                     "output_tokens": 10}]})), "spec.workload.inline.classes[0].api"),
    # ---- cross-field rules ------------------------------------------------------------------
    Bad("cross-low-gt-high", "q", _range(low=8192, high=4096), "spec.searchSpace[0].low"),
    Bad("cross-choices-and-range", "q", put(SS0, {"name": MNBT, "choices": [512], "low": 1}),
        "spec.searchSpace[0]"),
    Bad("cross-range-without-type", "q", put(SS0, {"name": MNBT, "low": 1, "high": 2}),
        "spec.searchSpace[0]"),
    Bad("cross-log-with-step", "q", _range(log=True, step=512), "spec.searchSpace[0].log"),
    Bad("cross-profile-and-inline", "q", put("workload.inline", {"classes": [
        {"name": "c", "prompt_tokens": 10, "output_tokens": 10}]}), "spec.workload"),
    Bad("cross-no-profile", "q", drop("workload.profile"), "spec.workload"),
    Bad("cross-rate-and-concurrency", "q", both(put("workload.rate", 2),
                                                put("workload.concurrency", 4)),
        "spec.workload.concurrency"),
    Bad("cross-warmup-eq-duration", "q", put("workload.warmup", "120s"),
        "spec.workload.warmup"),
    Bad("cross-inline-warmup", "q", both(drop("workload.profile"), drop("workload.duration"),
                                         drop("workload.warmup"), put("workload.inline", {
        "duration": "10s", "warmup": "20s", "classes": [
            {"name": "c", "prompt_tokens": 10, "output_tokens": 10}]})),
        "spec.workload.inline.warmup"),
    Bad("cross-parallelism-gt-trials", "q", put("budget.parallelism", 25),
        "spec.budget.parallelism"),
    Bad("cross-vllm-no-image", "v", drop("engine.image"), "spec.engine.image"),
    Bad("cross-sim-no-gpu-type", "q", drop("engine.gpu.type"), "spec.engine.gpu.type"),
    Bad("cross-model-config-vllm", "v", put("engine.modelConfig", {"hidden_size": 4096}),
        "spec.engine.modelConfig"),
    Bad("cross-gpu-count-lt-tp", "v", both(put("engine.tensorParallelSize", 4),
                                           put("engine.gpu.count", 2)),
        "spec.engine.gpu.count"),
    Bad("cross-managed-flag", "v", put("engine.args", ["--port", "9000"]),
        "spec.engine.args[0]"),
    Bad("cross-managed-flag-eq", "v", put("engine.args", ["--served-model-name=x"]),
        "spec.engine.args[0]"),
    Bad("cross-searched-and-fixed", "q", put("engine.args", ["--max-num-seqs", "128"]),
        "spec.searchSpace[2].name"),
    Bad("cross-env-value-and-from", "v", put("engine.env", [{"name": "A", "value": "x",
        "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]), "spec.engine.env[0]"),
    Bad("cross-env-empty", "v", put("engine.env", [{"name": "A"}]), "spec.engine.env[0]"),
    Bad("cross-env-two-refs", "v", put("engine.env", [{"name": "A", "valueFrom": {
        "secretKeyRef": {"name": "s", "key": "k"}, "configMapKeyRef": {"name": "c",
                                                                       "key": "k"}}}]),
        "spec.engine.env[0].valueFrom"),
    Bad("cross-env-duplicate", "v", put("engine.env", [{"name": "A", "value": "1"},
                                                       {"name": "A", "value": "2"}]),
        "spec.engine.env[1].name"),
    Bad("cross-security-context-sim", "q", put("engine.securityContext", {"runAsUser": 1000}),
        "spec.engine.securityContext"),
    Bad("cross-security-root-nonroot", "v", put("engine.securityContext", {
        "runAsNonRoot": True, "runAsUser": 0}), "spec.engine.securityContext"),
    Bad("cross-security-privileged", "v", put("engine.securityContext", {"privileged": True}),
        "spec.engine.securityContext.privileged"),
    Bad("cross-security-capability", "v", put("engine.securityContext", {
        "addCapabilities": ["SYS_ADMIN"]}), "spec.engine.securityContext.addCapabilities"),
    Bad("cross-trace-and-profile", "q", put("workload.trace", {"file": "t.csv"}),
        "spec.workload"),
    Bad("cross-trace-with-rate", "q", both(drop("workload.profile"), put("workload.trace", {
        "file": "t.csv"}), put("workload.rate", 4)), "spec.workload"),
    Bad("cross-trace-file-and-configmap", "q", both(drop("workload.profile"), put(
        "workload.trace", {"file": "t.csv", "configMapKeyRef": {"name": "t", "key": "k"}})),
        "spec.workload.trace"),
    Bad("cross-trace-and-prom", "q", both(drop("workload.profile"), put("workload.trace", {
        "file": "t.csv"}), put("workload.fromPrometheus", _PROM)), "spec.workload"),
    Bad("cross-trace-no-source", "q", both(drop("workload.profile"),
                                           put("workload.trace", {"speedup": 2})),
        "spec.workload.trace"),
    Bad("bound-trace-speedup-0", "q", both(drop("workload.profile"), put("workload.trace", {
        "file": "t.csv", "speedup": 0})), "spec.workload.trace.speedup"),
    Bad("bound-trace-classes", "q", both(drop("workload.profile"), put("workload.trace", {
        "file": "t.csv", "classes": [{"name": f"c{i}"} for i in range(33)]})),
        "spec.workload.trace.classes"),
    # ---- a workload derived from Prometheus, re-tuning --------------------------------------
    Bad("prom-and-profile", "q", put("workload.fromPrometheus", _PROM), "spec.workload"),
    Bad("prom-selector-unquoted", "q", both(drop("workload.profile"), put(
        "workload.fromPrometheus", {**_PROM, "selector": "{model_name=llama}"})),
        "spec.workload.fromPrometheus.selector"),
    Bad("prom-selector-injection", "q", both(drop("workload.profile"), put(
        "workload.fromPrometheus", {**_PROM, "selector": '{a="b"}) or vector(1'})),
        "spec.workload.fromPrometheus.selector"),
    Bad("prom-url-credentials", "q", both(drop("workload.profile"), put(
        "workload.fromPrometheus", {**_PROM, "url": "http://u:p@prom:9090"})),
        "spec.workload.fromPrometheus.url"),
    Bad("prom-window-zero", "q", both(drop("workload.profile"), put(
        "workload.fromPrometheus", {**_PROM, "window": "0s"})),
        "spec.workload.fromPrometheus.window"),
    Bad("retune-long-share", "q", both(drop("workload.profile"), put(
        "workload.fromPrometheus", _PROM), put("retune", {"drift": {"longShare": 2}})),
        "spec.retune.drift.longShare"),
    Bad("retune-max-trials", "q", both(drop("workload.profile"), put(
        "workload.fromPrometheus", _PROM), put("retune", {"maxTrials": 1})),
        "spec.retune.maxTrials"),
]


# ---- YAML that is bad before it is a manifest: alias bombs -----------------------------------


def alias_bomb(indent: str = "", levels: int = 9, fanout: int = 9, mapping: bool = False) -> str:
    """The "billion laughs": ``levels`` anchors, each ``fanout`` aliases of the previous (a
    document of ~100 nodes that expands to ``fanout ** levels``), as YAML lines at
    ``indent``; ``mapping``: each level a mapping of aliases instead of a list."""
    lines = [f"{indent}l0: &l0 [" + ", ".join(['"lol"'] * fanout) + "]"]
    for i in range(1, levels):
        if mapping:
            body = ", ".join(f"k{j}: *l{i - 1}" for j in range(fanout))
            lines.append(f"{indent}l{i}: &l{i} {{{body}}}")
        else:
            lines.append(f"{indent}l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * fanout) + "]")
    return "\n".join(lines) + "\n"


def _manifest_with(bomb: str) -> str:
    import yaml

    from tests.api.factories import quickstart

    return yaml.safe_dump(quickstart(), sort_keys=False) + "bomb:\n" + bomb


@dataclass(frozen=True)
class BadYaml:
    """A YAML text that must be refused, before it is read as a ``kind`` (a manifest or a
    workload profile), with ``words`` in the error."""

    id: str
    kind: str
    text: str
    words: str = "alias bomb"


YAML_BOMBS = [
    BadYaml("alias-bomb-manifest", "manifest", _manifest_with(alias_bomb("  "))),
    BadYaml("alias-bomb-manifest-mappings", "manifest",
            _manifest_with(alias_bomb("  ", mapping=True))),
    BadYaml("alias-bomb-second-document", "manifest",
            _manifest_with("  x: 1\n") + "---\n" + alias_bomb()),
    BadYaml("alias-bomb-wide", "manifest", _manifest_with(alias_bomb("  ", levels=4,
                                                                     fanout=40))),
    BadYaml("alias-bomb-profile", "profile", alias_bomb()),
]
