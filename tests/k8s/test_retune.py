"""Re-tuning end to end (``spec.retune``): the real operator against the emulator, trials run by
the fake kubelet, and a "production" deployment that is a real ``chunktune sim serve`` driven by
the load driver and scraped by a real Prometheus.

The study derives its workload from Prometheus (short prompts), tunes, and patches the
Deployment. While the load stays the same, the checks find no drift and nothing starts. Then
the load switches to long prompts: drift is detected, a re-tune runs with the running
configuration as its baseline, and the Deployment is patched with the new best only after the
confirmation trial, which comes after it in time. The operator is restarted in the middle of
the re-tune and picks it up where its study is.

The flip is built into the engine, not left to chance: with a budget of one trial the first
study answers the engine's default step budget (8192 tokens), whose long prefill steps stall
the decodes of a long-prompt load past the ``engine_itl_p99`` bound (in ``chunktune sim run``
of the derived long load, 3 req/s of 5k-10k-token prompts: an ITL p99 of 224 ms at 8192 against
24 ms at 512, for three seeds of 4 s each); with short prompts both are far inside it. The
workload replays the window's peak rate (``rate: peak``): the window's mean depends on where the
switch falls in it, and at the 1.4 req/s a half-switched window gave, decodes rarely overlap a
long prefill, both met the bound and 8192 kept the lower TTFT (4 of 5 runs failed that way)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from bench.serve_overhead import start_server

from chunktune.metrics.cli import from_prometheus
from chunktune.metrics.derive import WorkloadUnavailable
from tests.k8s.conftest import (
    journal_of,
    operator_settings,
    running_operator,
    status_of,
    tuning,
    wait_phase,
)
from tests.kube.emulator import KubeEmulator
from tests.kube.kubelet import FakeKubelet
from tests.kube.objects import Listener, WatchEvent
from tests.metrics.prometheus import HAVE_PROMETHEUS, MISSING, free_port, prometheus

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

SELECTOR = '{model_name="prod"}'
WINDOW = 8.0


def _profile(rate: float, prompt: tuple[int, int], output: int) -> dict[str, Any]:
    return {"name": "production", "arrival": {"mode": "constant", "rate": rate},
            "duration": 600, "warmup": 0,
            "classes": [{"name": "all", "api": "completions",
                         "prompt_tokens": {"dist": "uniform", "min": prompt[0], "max": prompt[1]},
                         "output_tokens": {"dist": "constant", "value": output}}]}


SHORT = _profile(4.0, (220, 480), 16)
LONG = _profile(3.0, (6000, 8000), 16)


class Load:
    """The load driver against the production server, until :meth:`stop`."""

    def __init__(self, tmp: Path, url: str, profile: dict[str, Any]) -> None:
        path = tmp / f"load-{time.monotonic_ns()}.yaml"
        path.write_text(yaml.safe_dump(profile))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "chunktune", "load", "run", "--target", url, "--profile",
             str(path), "--out", str(path.with_suffix(".json")), "--quiet", "--token-ids",
             "--drain-timeout", "1s"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def events(kube: KubeEmulator, name: str) -> list[dict[str, Any]]:
    return [e for e in kube.objects("v1/events", "default")
            if (e.get("involvedObject") or {}).get("name") == name]


def reasons(kube: KubeEmulator, name: str) -> list[str]:
    return [e["reason"] for e in events(kube, name)]


def deployment_args(kube: KubeEmulator) -> list[str]:
    deploy = kube.get("deployments", "default", "prod") or {}
    return list(deploy["spec"]["template"]["spec"]["containers"][0]["args"])


def retune_status(kube: KubeEmulator) -> dict[str, Any]:
    return dict(status_of(kube, "keep").get("retune") or {})


def _watch_deployment(kube: KubeEmulator, seen: list[tuple[float, list[str]]]) -> Listener:
    """Record when the Deployment's args change (wall clock, at each committed change: a
    poller can miss the last patch, which lands just before the status that the test waits
    for)."""
    def on_change(event: WatchEvent) -> None:
        obj = event.object
        if event.resource.plural != "deployments" or event.name != "prod" or \
                event.type == "DELETED":
            return
        args = [str(a) for a in obj["spec"]["template"]["spec"]["containers"][0]["args"]]
        if not seen or seen[-1][1] != args:
            seen.append((time.time(), args))

    kube.server.add_listener(on_change)
    return on_change


@pytest.mark.timeout(600)
@pytest.mark.skipif(not HAVE_PROMETHEUS, reason=MISSING)
async def test_drift_starts_a_retune_that_patches_only_after_confirmation(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path) -> None:
    with start_server("llama-3.1-8b", ["--max-model-len", "16384", "--served-model-name",
                                       "prod"]) as srv, \
            prometheus(tmp_path / "prom", [srv.url.removeprefix("http://")]) as prom:
        seen: list[tuple[float, list[str]]] = []
        watcher = _watch_deployment(kube, seen)
        kube.create("deployments", {"metadata": {"name": "prod", "annotations": {
            "chunktune.dev/allow-patch": "keep"}}, "spec": {
            "replicas": 0, "selector": {"matchLabels": {"app": "prod"}}, "template": {
                "metadata": {"labels": {"app": "prod"}}, "spec": {"containers": [
                    {"name": "engine", "image": "vllm/vllm-openai:v0.11.0",
                     "args": ["--model", "llama", "--max-num-batched-tokens", "2048"]}]}}}},
            "default")
        spec = tuning("keep", searchSpace=[{"name": "max-num-batched-tokens",
                                            "choices": [512, 8192]}],
                      workload={"fromPrometheus": {"url": prom, "selector": SELECTOR,
                                                   "window": f"{WINDOW:g}s",
                                                   # the busiest stretch: where in the change
                                                   # from SHORT to LONG the window ends does
                                                   # not set the re-tune's rate
                                                   "rate": "peak"},
                                "duration": "5s", "warmup": "1s"},
                      constraints=["engine_itl_p99 <= 50ms"],
                      budget={"maxTrials": 1},
                      output={"patchDeployment": {"name": "prod", "container": "engine"}},
                      retune={"interval": "2s", "drift": {"promptLength": 1.0},
                              "slo": False, "minRequests": 5, "consecutiveChecks": 2,
                              "strategy": "real", "maxTrials": 2, "confirmTrials": 1})
        state = tmp_path / "state"
        load = Load(tmp_path, srv.url, SHORT)
        try:
            # a full window of the short load before the study derives it
            await kube.until(lambda: _requests(prom) >= 0.8 * 4 * WINDOW, timeout=90,
                             interval=0.5, message="a window of traffic in Prometheus")
            kube.create("cpt", spec, "default")
            async with running_operator(kube, operator_settings(state)):
                status = await wait_phase(kube, "keep", ("Succeeded", "Failed"), timeout=120)
                assert status["phase"] == "Succeeded", status.get("message")
                conds = {c["type"]: c for c in status["conditions"]}
                assert conds["WorkloadDerived"]["status"] == "True", conds
                derived = status["workload"]
                assert derived["selector"] == SELECTOR and derived["window"] == WINDOW
                assert derived["rate"] == pytest.approx(4.0, rel=0.25)
                assert derived["promptTokens"]["p50"] == pytest.approx(350)  # (200, 500]
                first = deployment_args(kube)
                assert first[first.index("--max-num-batched-tokens") + 1] == "8192"
                # the same load: checks, no drift, nothing starts
                await kube.until(lambda: retune_status(kube).get("checks", 0) >= 3,
                                 timeout=60, interval=0.2, message="three checks")
                rs = retune_status(kube)
                assert rs["round"] == 0 and not rs.get("history"), rs
                assert not rs["lastCheck"].get("drift") and rs["drifting"] == 0, rs
                assert "RetuneStarted" not in reasons(kube, "keep")
                assert "DriftDetected" not in reasons(kube, "keep")
                # the load changes under the tuned deployment
                load.stop()
                load = Load(tmp_path, srv.url, LONG)
                await kube.until(lambda: "RetuneStarted" in reasons(kube, "keep"),
                                 timeout=120, interval=0.2, message="a re-tune starting")
            # the operator restarts in the middle of the re-tune, which goes on
            async with running_operator(kube, operator_settings(state)):
                entry = await kube.until(
                    lambda: next((h for h in retune_status(kube).get("history") or []
                                  if h.get("outcome") not in (None, "Running")), None),
                    timeout=300, interval=0.2, message="the re-tune deciding")
        finally:
            load.stop()
            kube.server.remove_listener(watcher)
    # the re-tune's study: the running configuration, the other one, its confirmation
    import optuna

    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(
        str(journal_of(kube, state, "keep"))))
    study = optuna.load_study(study_name="default/keep#retune-1", storage=storage)
    measured = [t for t in study.trials
                if t.user_attrs.get("chunktune_state") in ("COMPLETE", "INFEASIBLE")]
    rs = retune_status(kube)
    assert entry["outcome"] == "Applied", "; ".join(
        f"{t.number} {t.user_attrs['point']} {t.user_attrs.get('chunktune_state')} " + " ".join(
            f"{k}={v:.4f}" for k, v in sorted((t.user_attrs.get("metrics") or {}).items())
            if k in ("ttft_p99", "ttft_p50", "engine_itl_p99", "error_rate", "request_rate"))
        for t in study.trials) + f" | entry={entry} | workload=" + json.dumps(
            status_of(kube, "keep").get("workload")) + " | attrs=" + json.dumps(
            {k: v for k, v in study.user_attrs.items() if "workload" in k or "profile" in k},
            default=str)[:3000]
    assert entry["round"] == 1 and len(rs["history"]) == 1 and rs["round"] == 1
    assert any("prompt length" in r for r in entry["reasons"]), entry
    assert entry["running"] == {"max-num-batched-tokens": 8192}
    assert entry["best"] == {"max-num-batched-tokens": 512}
    assert entry["metric"] == "ttft_p99" and "confirmedBy" in entry
    args = deployment_args(kube)
    assert args[args.index("--max-num-batched-tokens") + 1] == "512"
    assert {"DriftDetected", "RetuneStarted", "RetuneApplied"} <= set(reasons(kube, "keep"))
    points = [t.user_attrs["point"]["max-num-batched-tokens"] for t in measured]
    assert sorted(points) == [512, 512, 8192], points
    assert sorted(entry["confirmedBy"]) == sorted(t.number for t in measured
                                                  if t.user_attrs["point"][
                                                      "max-num-batched-tokens"] == 512)
    # patched once by the first study (8192) and once by the re-tune (512), the second only
    # after the confirmation trial ended
    changes = [(t, a[a.index("--max-num-batched-tokens") + 1]) for t, a in seen]
    assert [v for _, v in changes] == ["2048", "8192", "512"], changes
    confirmed = max(t.datetime_complete.timestamp() for t in measured
                    if t.datetime_complete is not None)
    assert changes[-1][0] >= confirmed - 0.5, (changes, confirmed)


async def test_a_workload_that_cannot_be_derived_keeps_the_study_pending(
        kube: KubeEmulator, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # no Prometheus there
    kube.create("cpt", tuning("blind", workload={"fromPrometheus": {
        "url": url, "selector": SELECTOR}, "duration": "4s"}), "default")
    async with running_operator(kube, operator_settings(tmp_path / "state")):
        status = await kube.until(
            lambda: (s := status_of(kube, "blind")).get("phase") == "Pending" and any(
                c["type"] == "WorkloadDerived" for c in s.get("conditions", [])) and s,
            timeout=60, interval=0.2, message="Pending with WorkloadDerived")
        await kube.until(lambda: "PrometheusUnreachable" in reasons(kube, "blind"),
                         timeout=30, interval=0.2, message="the warning event")
    (cond,) = [c for c in status["conditions"] if c["type"] == "WorkloadDerived"]
    assert cond["status"] == "False" and cond["reason"] == "PrometheusUnreachable"
    assert SELECTOR in cond["message"] and url in cond["message"], cond
    assert SELECTOR in status["message"] and not status.get("trials")  # nothing ran
    (event,) = [e for e in events(kube, "blind") if e["reason"] == "PrometheusUnreachable"]
    assert SELECTOR in event["message"]


def _requests(prom: str) -> float:
    try:
        return from_prometheus(prom, SELECTOR, WINDOW, timeout=5).stats.requests
    except WorkloadUnavailable:
        return 0.0


def _store_derived(state: Path, body: dict[str, Any], rounds: int) -> None:
    """What the operator keeps in the study storage by the time a re-tune runs: the first
    study and re-tune study ``rounds``, each with the workload derived for it stored (a
    chat-sized observation: no Prometheus is asked)."""
    from chunktune.k8s import locations
    from chunktune.k8s.state import parse
    from chunktune.metrics.derive import Buckets, Observation
    from chunktune.tuning import retune as rt
    from chunktune.tuning import study as st
    from chunktune.tuning import workload_source
    from chunktune.tuning.objectives import ObjectiveDef

    tuned, problems = parse(body)
    assert tuned is not None and tuned.spec.retune is not None, problems
    url = locations.resolve(None, state, body["metadata"]["uid"], allow_database_urls=False)
    counts = {"128.0": 0.0, "512.0": 40.0, "1024.0": 60.0, "+Inf": 60.0}
    obs = Observation(url="http://prom:9090", selector=SELECTOR, window=WINDOW,
                      at=time.time(), peak_window=WINDOW, requests=60.0, peak_rate=None,
                      prompt=Buckets.from_le(counts), output=Buckets.from_le(
                          {"16.0": 60.0, "+Inf": 60.0}), prompt_sum=25_000.0, output_sum=960.0)
    for round_ in range(rounds + 1):
        t = tuned if round_ == 0 else rt.retune_tuning(tuned, tuned.spec.retune, round_, False)
        directions = [ObjectiveDef.from_spec(o).direction for o in t.spec.objectives]
        study = st.open_study(t, st.open_storage(url), directions,
                              st.make_sampler(t, len(directions), bool(t.spec.constraints)),
                              st.make_pruner(t, len(directions)),
                              name=rt.study_name(tuned, round_))
        study.set_user_attr(workload_source.ATTR_WORKLOAD,
                            workload_source.derive_for(t, obs).to_dict())


async def test_a_retune_during_a_prometheus_outage_says_so(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path) -> None:
    """A re-tune whose trials meet a Prometheus that does not answer (``spec.metrics.
    prometheusURL``) reports it as the study does: ``PrometheusReachable=False`` and a
    ``PrometheusUnreachable`` Warning naming the fallback. The operator starts with re-tune 1
    in flight (as one restarted in its middle does), its studies and derived workloads in the
    storage, so no drift has to be produced first."""
    from tests.k8s.faults import dead_url

    state = tmp_path / "state"
    created = kube.create("cpt", tuning(
        "outage", searchSpace=[{"name": "max-num-batched-tokens", "choices": [512, 8192]}],
        workload={"fromPrometheus": {"url": dead_url(), "selector": SELECTOR,
                                     "window": f"{WINDOW:g}s"},
                  "duration": "3s", "warmup": "1s"},
        metrics={"prometheusURL": dead_url(), "scrapeInterval": "1s"},
        budget={"maxTrials": 1},
        retune={"interval": "600s", "window": "600s", "slo": False, "strategy": "real",
                "maxTrials": 2, "confirmTrials": 1}), "default")
    _store_derived(state, created, rounds=1)
    kube.patch("cpt", "default", "outage", {"status": {
        "phase": "Succeeded", "observedGeneration": created["metadata"].get("generation", 1),
        "message": "re-tune 1 running", "retune": {
            "state": "Retuning", "round": 1, "checks": 2, "drifting": 0,
            "lastCheck": {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
            "history": [{"round": 1, "study": "default/outage#retune-1",
                         "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                         "reasons": ["prompt length p50 350 -> 7000"], "outcome": "Running",
                         "running": {"max-num-batched-tokens": 8192}}]}}},
               subresource="status")
    async with running_operator(kube, operator_settings(state)):
        cond = await kube.until(
            lambda: next((c for c in status_of(kube, "outage").get("conditions", [])
                          if c["type"] == "PrometheusReachable"), None),
            timeout=120, interval=0.2, message="the PrometheusReachable condition")
        (event, *_) = await kube.until(
            lambda: [e for e in events(kube, "outage")
                     if e["reason"] == "PrometheusUnreachable"],
            timeout=30, interval=0.2, message="the PrometheusUnreachable event")
    assert cond["status"] == "False" and cond["reason"] == "PrometheusUnreachable", cond
    assert "direct /metrics scrape" in cond["message"], cond
    assert event["type"] == "Warning" and "direct /metrics scrape" in event["message"]
    (entry,) = status_of(kube, "outage")["retune"]["history"]
    assert entry["study"] == "default/outage#retune-1"  # the re-tune's trials said it
