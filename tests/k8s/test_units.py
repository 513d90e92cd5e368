"""Unit tests without an API server: PromQL builders, the Prometheus client (against a tiny
HTTP stand-in of the query API on loopback), the settings tree, the status writer's wiring of
``render_status`` and the CLI's settings."""

from __future__ import annotations

import argparse
import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from chunktune.api.crd import PRINTER_COLUMNS
from chunktune.api.reader import parse_manifest
from chunktune.backends import manifests as mf
from chunktune.backends.simulated import SimulatedBackend
from chunktune.core.errors import SpecError
from chunktune.k8s.settings import Settings
from chunktune.k8s.state import StatusWriter, parse
from chunktune.metrics import promql
from chunktune.metrics.client import PrometheusClient
from chunktune.tuning.tuner import Tuner
from tests.k8s.conftest import tuning

SEL = promql.PodSelector(namespace="ml", pod="t-t3", ip="10.0.0.7")


# ---- PromQL ------------------------------------------------------------------------------


def test_metric_names_match_both_spellings() -> None:
    m = promql.metric_name("vllm:num_preemptions_total")
    assert m == '__name__=~"vllm(:|_)num_preemptions_total"'
    pattern = re.compile("vllm(:|_)num_preemptions_total")
    assert pattern.fullmatch("vllm:num_preemptions_total")
    assert pattern.fullmatch("vllm_num_preemptions_total")
    assert promql.metric_name("kv_cache_usage_perc") == promql.metric_name(
        "vllm_kv_cache_usage_perc")


def test_query_builders() -> None:
    assert promql.series("num_preemptions_total", SEL) == \
        '{__name__=~"vllm(:|_)num_preemptions_total",namespace="ml",pod="t-t3"}'
    assert promql.counter_increase("prompt_tokens_total", SEL, 59.6) == (
        'sum(increase({__name__=~"vllm(:|_)prompt_tokens_total",namespace="ml",pod="t-t3"}'
        '[60s]))')
    assert promql.histogram_quantile(0.99, "time_to_first_token_seconds", SEL, 30) == (
        'histogram_quantile(0.99, sum by (le) (increase({__name__=~"vllm(:|_)'
        'time_to_first_token_seconds_bucket",namespace="ml",pod="t-t3"}[30s])))')
    assert promql.gauge_max("kv_cache_usage_perc", SEL, 30) == (
        'max(max_over_time({__name__=~"vllm(:|_)kv_cache_usage_perc",namespace="ml",'
        'pod="t-t3"}[30s:1s]))')
    by_ip = promql.PodSelector("ml", "t-t3", "10.0.0.7", by="instance")
    assert by_ip.text() == r'instance=~"10\\.0\\.0\\.7(:[0-9]+)?"'
    assert promql.matchers({"pod": 'a"b'}) == r'pod="a\"b"'
    queries = promql.trial_queries(SEL, 60)
    assert set(queries) == {"preemptions", "prompt_tokens", "generation_tokens",
                            "request_success", "prefix_cache_queries", "prefix_cache_hits",
                            "queue_time_p50", "queue_time_p99",
                            "server_ttft_p50", "server_ttft_p99", "server_itl_p50",
                            "server_itl_p99", "kv_cache_usage_peak"}


def test_prometheus_client_reads_the_query_api() -> None:
    seen: list[str] = []

    async def query(request: web.Request) -> web.Response:
        q = request.query["query"]
        seen.append(q)
        if "num_preemptions" in q:
            value: Any = [1.7e9, "12"]
        elif "kv_cache_usage" in q:
            value = [1.7e9, "0.75"]
        elif "request_queue_time" in q:
            return web.json_response({"status": "error", "errorType": "bad_data",
                                      "error": "nope"}, status=400)
        elif "prompt_tokens" in q:
            value = [1.7e9, "NaN"]
        else:
            return web.json_response({"status": "success", "data": {
                "resultType": "vector", "result": []}})
        return web.json_response({"status": "success", "data": {
            "resultType": "vector", "result": [{"metric": {}, "value": value}]}})

    async def main() -> dict[str, float]:
        app = web.Application()
        app.router.add_get("/api/v1/query", query)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        client = PrometheusClient(f"http://127.0.0.1:{port}/")
        try:
            return await client.trial_metrics(SEL, 1000.0, 1060.0)
        finally:
            await client.close()
            await runner.cleanup()

    out = asyncio.run(main())
    assert out == {"preemptions": 12.0, "preemptions_per_minute": 12.0,
                   "kv_cache_usage_peak": 0.75}
    assert len(seen) == len(promql.trial_queries(SEL, 60))


# ---- settings ------------------------------------------------------------------------------

#: The operator's own image (required: none is published).
IMAGE = {"CHUNKTUNE_IMAGE": "registry.example/chunktune:0.1.0"}


def test_settings_from_env_and_overrides(tmp_path: Path) -> None:
    s = Settings.from_env({"CHUNKTUNE_NAMESPACES": "a, b", "CHUNKTUNE_POLL_INTERVAL": "0.5",
                           "CHUNKTUNE_SIM_LOAD_TIME": "0", "CHUNKTUNE_STANDALONE": "yes",
                           "CHUNKTUNE_IMAGE_PULL_POLICY": "Always", **IMAGE},
                          state_dir=tmp_path, trials={"keep_objects": True})
    assert s.namespaces == ("a", "b") and not s.clusterwide and s.standalone
    assert s.state_dir == tmp_path
    assert s.trials.poll_interval == 0.5 and s.trials.sim_load_time == 0.0
    assert s.trials.keep_objects and s.trials.image_pull_policy == "Always"
    assert s.trials.options().image_pull_policy == "Always"
    assert Settings.from_env(IMAGE).state_dir == Path("/var/lib/chunktune")
    assert Settings.from_env(IMAGE).clusterwide
    assert s.trials.options().load_image == IMAGE["CHUNKTUNE_IMAGE"]


def test_settings_without_the_chunktune_image_are_refused() -> None:
    """No chunktune image is published, so there is no default: the operator does not start
    without one, and says which variable to set and how to make the image."""
    with pytest.raises(SpecError) as e:
        Settings.from_env({})
    [message] = [m for p, m in e.value.problems if p == "CHUNKTUNE_IMAGE"]
    assert message.startswith("is not set") and "build one from the chunktune repository" in \
        message and "image.repository" in message
    with pytest.raises(SpecError) as e:
        Settings.from_env({"CHUNKTUNE_IMAGE": ""})
    assert e.value.problems == [("CHUNKTUNE_IMAGE", "must not be empty")]


def test_settings_report_every_bad_value() -> None:
    with pytest.raises(SpecError) as e:
        Settings.from_env({"CHUNKTUNE_POLL_INTERVAL": "-1", "CHUNKTUNE_STANDALONE": "maybe",
                           "CHUNKTUNE_SHM_SIZE": "lots", "CHUNKTUNE_API_THREADS": "0"})
    assert [p for p, _ in e.value.problems] == [
        "CHUNKTUNE_SHM_SIZE", "CHUNKTUNE_POLL_INTERVAL", "CHUNKTUNE_STANDALONE",
        "CHUNKTUNE_API_THREADS"]
    with pytest.raises(SpecError, match="larger than the server timeout"):
        Settings.from_env({"CHUNKTUNE_WATCH_CLIENT_TIMEOUT": "10", **IMAGE})
    with pytest.raises(SpecError, match="--liveness"):
        Settings.from_env(IMAGE, liveness="0.0.0.0:8080")


def test_cli_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from chunktune.cli import build_parser
    from chunktune.k8s.cli import settings_from

    monkeypatch.setenv("CHUNKTUNE_NAMESPACES", "x")
    monkeypatch.setenv("CHUNKTUNE_IMAGE", IMAGE["CHUNKTUNE_IMAGE"])
    parser = build_parser()
    ns = parser.parse_args(["operator", "run", "-n", "a", "-n", "b", "--state-dir",
                            str(tmp_path), "--standalone", "--liveness",
                            "http://0.0.0.0:8080/healthz"])
    s = settings_from(ns)
    assert (s.namespaces, s.state_dir, s.standalone, s.liveness) == (
        ("a", "b"), tmp_path, True, "http://0.0.0.0:8080/healthz")
    s = settings_from(parser.parse_args(["operator", "run", "--all-namespaces"]))
    assert s.clusterwide and not s.standalone
    assert isinstance(ns, argparse.Namespace)


# ---- status wiring -----------------------------------------------------------------------


class RecordingApi:
    """Stands in for the operator's API wrapper: records the status patches."""

    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []

    async def patch_tuning_status(self, namespace: str, name: str,
                                  status: dict[str, Any]) -> dict[str, Any]:
        self.patches.append(status)
        return {}


def test_status_is_rendered_from_the_study(tmp_path: Path) -> None:
    body = tuning("wired", budget={"maxTrials": 3})
    body["metadata"].update(namespace="default", uid="u-1", generation=2)
    model, problems = parse(body)
    assert problems == [] and model is not None
    tuner = Tuner(model, SimulatedBackend(), str(tmp_path / "s.journal"))
    asyncio.run(tuner.run())
    api = RecordingApi()
    writer = StatusWriter(api, mf.Owner("wired", "default", "u-1"),  # type: ignore[arg-type]
                          {"phase": "Running", "stale": "x"})
    writer.set("Succeeded", 2, "done", Complete=(True, "Completed", "done"))
    asyncio.run(writer.write(tuner))
    (patch,) = api.patches
    assert patch["stale"] is None  # a field the renderer no longer gives is removed
    assert patch["phase"] == "Succeeded" and patch["observedGeneration"] == 2
    assert patch["trialsSummary"] == "3/3" and patch["completionTime"]
    (cond,) = patch["conditions"]
    assert (cond["type"], cond["status"], cond["observedGeneration"]) == ("Complete", "True", 2)
    assert patch["best"]["flags"].startswith("--max-num-batched-tokens ")
    assert patch["baseline"]["trial"] == 0
    for col in PRINTER_COLUMNS:  # every printer column but Age reads a filled field
        path = col["jsonPath"].lstrip(".").split(".")
        if path[0] != "status" or col["name"] in ("Improvement", "Threshold"):
            continue
        value: Any = {"status": patch}
        for part in path:
            value = value[part]
        assert value is not None, col["name"]
    asyncio.run(writer.write(tuner))
    assert len(api.patches) == 1  # nothing changed: no patch


def test_parse_names_the_operator_only_limits() -> None:
    body = tuning("g", engine={"kind": "sglang", "model": "m", "image": "lmsys/sglang:v0"})
    del body["spec"]["searchSpace"]
    model, problems = parse(body)
    assert model is None and problems[0][0] == "spec.engine.kind"
    ok, none = parse(tuning("ok"))
    assert none == [] and ok == parse_manifest(tuning("ok"))


# ---- start-up failures from a pod's termination state ---------------------------------------


class PodApi:
    """Stands in for the cluster: one engine pod in a given state, with a log."""

    def __init__(self, pod: dict[str, Any], log: str) -> None:
        self.pod, self.log = pod, log

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.pod if kind == "pods" else None

    async def pod_log(self, namespace: str, name: str, container: str | None = None,
                      tail_lines: int | None = None, limit_bytes: int | None = None) -> str:
        return self.log


def _terminated(reason: str, code: int, message: str = "") -> dict[str, Any]:
    return {"metadata": {"name": "t-t1"}, "status": {"phase": "Failed", "containerStatuses": [
        {"name": "engine", "state": {"terminated": {"exitCode": code, "reason": reason,
                                                    "message": message}}}]}}


@pytest.mark.parametrize(("pod", "log", "state", "reason"), [
    (_terminated("OOMKilled", 137), "loading weights...", "FAIL", "HostOOMKilled"),
    (_terminated("Error", 1), "ValueError: No available memory for the cache blocks. Try "
     "increasing gpu_memory_utilization", "INFEASIBLE", "KVCacheTooSmall"),
    (_terminated("Error", 1), "", "INFEASIBLE", "EngineOOM"),  # from the termination message
    (_terminated("Error", 2), "Segmentation fault", "FAIL", "EngineCrashed"),
])
def test_startup_failures_are_classified(pod: dict[str, Any], log: str, state: str,
                                         reason: str) -> None:
    from chunktune.backends.kubernetes import BackendSettings, KubernetesBackend
    from tests.k8s.test_manifests import OPTIONS, SIM, plan

    if reason == "EngineOOM":
        pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = \
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    backend = KubernetesBackend(PodApi(pod, log), mf.Owner("t", "default", "u"),  # type: ignore[arg-type]
                                BackendSettings(options=OPTIONS, poll_interval=0.01))
    result = asyncio.run(backend._wait_ready(plan(SIM, 1), "t-t1", 0.0))
    assert not isinstance(result, dict)
    assert (result.state, result.reason) == (state, reason)


# ---- spec.retune: the pure parts ---------------------------------------------------------


def test_status_patches_drop_nested_keys_the_renderer_no_longer_gives() -> None:
    from chunktune.k8s.state import merge_patch

    old = {"phase": "Succeeded", "retune": {"lastCheck": {"time": "t1", "message": "few"},
                                            "history": [{"round": 1}]}, "twin": {"round": 1}}
    new = {"phase": "Succeeded", "retune": {"lastCheck": {"time": "t2", "drift": ["x"]},
                                            "history": []}}
    assert merge_patch(old, new) == {
        "phase": "Succeeded", "twin": None,
        "retune": {"lastCheck": {"time": "t2", "drift": ["x"], "message": None},
                   "history": []}}


def test_running_flags_are_read_from_the_deployment() -> None:
    from chunktune.backends import deployment as dp

    def deploy(container: dict[str, Any]) -> dict[str, Any]:
        return {"spec": {"template": {"spec": {"containers": [
            {"name": "sidecar", "args": ["--max-num-seqs", "8"]}, container]}}}}

    def flags(d: dict[str, Any], container: str | None) -> dict[str, Any] | None:
        c = dp.engine_container(d, container)
        return None if c is None else dp.read_flags(c, names)

    names = ["max-num-batched-tokens", "max-num-seqs"]
    args = deploy({"name": "vllm", "args": ["serve", "m", "--max-num-batched-tokens=4096",
                                            "--max-model-len", "8192"]})
    assert flags(args, "vllm") == {"max-num-batched-tokens": 4096}
    assert flags(args, None) == {"max-num-seqs": 8}  # the first container
    assert flags(args, "other") is None
    shell = deploy({"name": "vllm", "command": [
        "sh", "-c", "vllm serve m --max_num_batched_tokens 2048 --max-num-seqs 64"]})
    assert flags(shell, "vllm") == {"max-num-batched-tokens": 2048, "max-num-seqs": 64}


def test_production_slo_misses_come_from_the_latency_histograms() -> None:
    from chunktune.k8s.retuner import slo_bases, slo_misses
    from chunktune.metrics.derive import Buckets, Observation

    t = parse_manifest(tuning("slo", constraints=[
        "ttft_p99 <= 500ms", "itl_p50 <= 50ms", "chat.ttft_p99 <= 1s", "error_rate <= 1%"]))
    assert slo_bases(t) == ("ttft", "itl")
    empty = Buckets.from_le({})
    ttft = Buckets.from_le({"0.25": 50, "0.5": 90, "1.0": 100, "+Inf": 100})
    itl = Buckets.from_le({"0.025": 80, "0.05": 100, "+Inf": 100})
    obs = Observation(url="u", selector="{}", window=60, at=0, peak_window=10, requests=100,
                      peak_rate=None, prompt=empty, output=empty,
                      latency={"ttft": ttft, "itl": itl})
    (miss,) = slo_misses(t, obs)
    assert miss == "production ttft_p99 950ms misses ttft_p99 <= 500ms"


def test_the_derived_condition_says_what_production_served_from_its_prefix_cache() -> None:
    from types import SimpleNamespace

    from chunktune.k8s.retuner import derived_condition

    source = {"url": "http://prom:9090", "selector": '{model_name="m"}', "window": 600.0,
              "at": "2026-12-05T11:00:00Z"}

    def message(stats: dict[str, Any]) -> str:
        tuner = SimpleNamespace(derived={"source": source, "stats": stats})
        ok, reason, text = derived_condition(tuner)["WorkloadDerived"]  # type: ignore[arg-type]
        assert ok and reason == "Derived"
        return text

    plain = message({"rate": 1.0})
    assert plain == 'derived from http://prom:9090 ({model_name="m"}, 600 s ending ' \
                    '2026-12-05T11:00:00Z)'
    assert message({"rate": 1.0, "prefixCacheHitRate": 0.05}) == plain
    cached = message({"rate": 1.0, "prefixCacheHitRate": 0.75})
    assert cached.startswith(plain + "; production found 75% of its prompt tokens in vLLM's "
                             "prefix cache")
    assert "trials prefill 4.0x the prompt tokens production did" in cached
