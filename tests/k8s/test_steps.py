"""The Kubernetes backend keeps each trial engine's step log (``Iteration(N)`` lines): in the
trial's result and, with ``steps_dir``, as a file; a log it cannot read leaves the steps empty
and the trial as it was. The end-to-end cases run a ``sim serve`` engine pod (with
``--enable-logging-iteration-details``) through the emulator and the fake kubelet."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path
from typing import Any

import pytest

from chunktune.backends.cluster import ClusterApiError
from chunktune.backends.kubernetes import BackendSettings, KubernetesBackend
from chunktune.backends.manifests import ENGINE_CONTAINER, TrialOptions, trial_names
from chunktune.core.steps import StepRecord, format_line, read_step_log
from chunktune.core.trials import TrialResult, TrialState
from chunktune.k8s import locations
from chunktune.k8s.kube import KubeApi
from tests.contract.backends import PROFILE, plan
from tests.k8s.conftest import make_owner
from tests.kube.emulator import KubeEmulator
from tests.kube.kubelet import FakeKubelet

OPTIONS = TrialOptions(load_image="chunktune", sim_load_time=0.2)
START = ("INFO 12-03 01:00:00 [core.py] Initializing a V1 LLM engine (v0.32.0) with config: "
         "model='llama-3.1-8b', tensor_parallel_size=1\n"
         "INFO 12-03 01:00:01 [gpu_worker.py] GPU KV cache size: 130,944 tokens\n")


def iteration(i: int) -> str:
    return ("INFO 12-03 01:00:02 [loggers.py:199] "
            + format_line(StepRecord(i, 1, 256, 3, 3, 12.5, kv_usage_pct=4.0)) + "\n")


class LogApi:
    """Only ``pod_log``: a given text (cut at ``limit_bytes`` as the API server does), or an
    error."""

    def __init__(self, text: str = "", error: Exception | None = None) -> None:
        self.text, self.error = text, error
        self.calls: list[dict[str, Any]] = []

    async def pod_log(self, namespace: str, name: str, container: str | None = None,
                      tail_lines: int | None = None, limit_bytes: int | None = None) -> str:
        self.calls.append({"name": name, "container": container, "limit_bytes": limit_bytes})
        if self.error is not None:
            raise self.error
        data = self.text.encode()
        return (data[:limit_bytes] if limit_bytes else data).decode(errors="replace")


def backend(api: Any, steps_dir: Path | None, **settings: Any) -> KubernetesBackend:
    from chunktune.backends.manifests import Owner

    return KubernetesBackend(api, Owner("tune", "default", "u1"), BackendSettings(
        options=OPTIONS, steps_dir=steps_dir, **settings))


def keep(b: KubernetesBackend, result: TrialResult) -> TrialResult:
    asyncio.run(b._keep_steps(plan(5), "tune-t5", result))
    return result


def test_steps_of_the_engine_log_go_to_the_result_and_a_file(tmp_path: Path) -> None:
    api = LogApi(START + "".join(iteration(i) for i in range(4)) + "INFO: 10.0.0.2 - POST\n")
    r = keep(backend(api, tmp_path / "steps"), TrialResult(TrialState.COMPLETE))
    assert api.calls == [{"name": "tune-t5", "container": ENGINE_CONTAINER,
                          "limit_bytes": BackendSettings(options=OPTIONS).step_log_limit_bytes}]
    assert [s.iteration for s in r.steps] == [0, 1, 2, 3]
    assert r.state == TrialState.COMPLETE
    assert r.steps_file == str(tmp_path / "steps" / "contract-5-5.steps.jsonl")
    records, meta = read_step_log(r.steps_file)
    assert records == r.steps
    assert meta.model == "llama-3.1-8b" and meta.kv_cache_tokens == 130944
    raw = Path(r.steps_file).with_suffix(".log").read_text().splitlines()
    assert len(raw) == 4 and all("Iteration(" in x for x in raw)


def test_without_a_steps_dir_the_steps_are_in_the_result_only(tmp_path: Path) -> None:
    r = keep(backend(LogApi(START + iteration(0)), None), TrialResult(TrialState.COMPLETE))
    assert len(r.steps) == 1 and r.steps_file is None


@pytest.mark.parametrize("api", [
    LogApi(error=ClusterApiError(500, "the log is gone")),
    LogApi(error=OSError("connection reset")),
    LogApi(""),  # a pod that is gone: the client answers ""
])
def test_a_missing_or_unreadable_log_leaves_the_steps_empty(
        api: LogApi, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    r = keep(backend(api, tmp_path / "steps"), TrialResult(TrialState.COMPLETE, reason="x"))
    assert r.state == TrialState.COMPLETE and r.reason == "x"
    assert r.steps == [] and r.steps_file is None
    assert not (tmp_path / "steps").exists()
    if api.error is not None:
        assert "cannot read the engine's log" in caplog.text


def test_a_log_over_the_limit_keeps_its_first_whole_lines(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    text = START + "".join(iteration(i) for i in range(50))
    limit = len((START + "".join(iteration(i) for i in range(10))).encode()) + 40
    r = keep(backend(LogApi(text), tmp_path, step_log_limit_bytes=limit),
             TrialResult(TrialState.COMPLETE))
    assert [s.iteration for s in r.steps] == list(range(10))  # the 11th line is cut: dropped
    assert "truncated to the first 10 steps" in caplog.text
    assert len(read_step_log(r.steps_file or "")[0]) == 10


def test_an_unwritable_steps_dir_keeps_the_steps_in_the_result(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "file").write_text("")
    r = keep(backend(LogApi(START + iteration(0)), tmp_path / "file" / "steps"),
             TrialResult(TrialState.PRUNED))
    assert len(r.steps) == 1 and r.steps_file is None
    assert "cannot write its step log" in caplog.text


def test_the_operator_keeps_steps_beside_the_default_journal_else_by_uid(tmp_path: Path) -> None:
    journal = locations.resolve(None, tmp_path, "u1", allow_database_urls=False)
    assert locations.steps_dir(journal, tmp_path, "u1") == tmp_path / "u1.journal.steps"
    shared = locations.resolve("shared.journal", tmp_path, "u1", allow_database_urls=False)
    assert locations.steps_dir(shared, tmp_path, "u1") == tmp_path / "u1.steps"
    assert locations.steps_dir("postgresql://db/x", tmp_path, "u1") == tmp_path / "u1.steps"


# ---- through the emulator and the fake kubelet: a sim serve engine pod ----------------------


def short_plan(number: int) -> Any:
    return dataclasses.replace(plan(number, **{"max-num-batched-tokens": 2048}),
                               profile=PROFILE.with_overrides(duration=3, warmup=1, rate=6))


@pytest.mark.slow
def test_a_sim_trial_returns_its_engine_steps_and_writes_the_file(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path) -> None:
    async def go() -> TrialResult:
        api = KubeApi(kube.api_client())
        b = KubernetesBackend(api, make_owner(kube), BackendSettings(
            options=OPTIONS, poll_interval=0.1, kv_sample_interval=0.5,
            steps_dir=tmp_path / "steps"))
        try:
            return await b.run_trial(short_plan(11))
        finally:
            await b.close()
            assert await b.remaining() == []
            await api.close()

    r = asyncio.run(go())
    assert r.state == TrialState.COMPLETE, (r.reason, r.message)
    _check_steps(r, tmp_path / "steps" / "contract-11-11.steps.jsonl")


@pytest.mark.slow
def test_an_engine_that_logs_its_steps_is_scraped_rarely_during_the_load(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its KV-usage peak comes from the step log; /metrics during the load is only a fallback,
    sampled every STEPS_KV_SAMPLE_INTERVAL (a scrape stalls the API server's event loop), while
    the engine is still checked for a crash every kv_sample_interval."""
    import time

    from chunktune.backends import kubernetes as k8s_backend
    from chunktune.core.steps import kv_usage_peak

    scrapes: list[float] = []
    checks: list[float] = []
    real_scrape = KubernetesBackend._scrape
    real_gone = KubernetesBackend._engine_gone

    async def scrape(self: KubernetesBackend, url: str) -> Any:
        scrapes.append(time.monotonic())
        return await real_scrape(self, url)

    async def gone(self: KubernetesBackend, pod: str) -> Any:
        checks.append(time.monotonic())
        return await real_gone(self, pod)

    monkeypatch.setattr(KubernetesBackend, "_scrape", scrape)
    monkeypatch.setattr(KubernetesBackend, "_engine_gone", gone)
    monkeypatch.setattr(k8s_backend, "STEPS_KV_SAMPLE_INTERVAL", 60.0)

    async def go() -> TrialResult:
        api = KubeApi(kube.api_client())
        b = KubernetesBackend(api, make_owner(kube), BackendSettings(
            options=OPTIONS, poll_interval=0.1, kv_sample_interval=0.3))
        try:
            return await b.run_trial(short_plan(13))
        finally:
            await b.close()
            await api.close()

    r = asyncio.run(go())
    assert r.state == TrialState.COMPLETE, (r.reason, r.message)
    assert r.load_seconds is not None and r.load_seconds > 2
    # before the load, once as it starts (the fallback's sample), after it; never in between
    assert len(scrapes) <= 3, [round(t - scrapes[0], 2) for t in scrapes]
    assert len(checks) >= 3  # the crash watch kept its own pace
    peak = kv_usage_peak(r.steps)
    assert peak is not None and peak > 0
    assert r.metrics["kv_cache_usage_peak"] == pytest.approx(peak)


@pytest.mark.slow
def test_an_adopted_trial_returns_its_engine_steps(
        kube: KubeEmulator, kubelet: FakeKubelet, tmp_path: Path) -> None:
    """A trial left running by an operator that exited is adopted by the next one, which
    reads the engine's log (the whole trial's steps) before deleting the pod."""
    owner = make_owner(kube)
    p = short_plan(12)
    names = trial_names(owner.name, p.number)

    async def go() -> TrialResult:
        api = KubeApi(kube.api_client())
        settings = BackendSettings(options=OPTIONS, poll_interval=0.1, kv_sample_interval=0.5,
                                   steps_dir=tmp_path / "steps")
        first = KubernetesBackend(api, owner, settings)
        task = asyncio.create_task(first.run_trial(p))
        await kube.until(lambda: kube.get("jobs", "default", names.job), timeout=60,
                         interval=0.1, message="the load Job")
        first.detached = True  # the operator exits: its trial's objects stay
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not (tmp_path / "steps").exists()
        second = KubernetesBackend(api, owner, settings)
        try:
            r = await second.recover(p)
            assert r is not None
            return r
        finally:
            await second.close()
            assert await second.remaining() == []
            await api.close()

    r = asyncio.run(go())
    assert r.state == TrialState.COMPLETE, (r.reason, r.message)
    _check_steps(r, tmp_path / "steps" / "contract-12-12.steps.jsonl")


def _check_steps(r: TrialResult, path: Path) -> None:
    assert r.steps_file == str(path)
    assert len(r.steps) > 10
    assert [s.iteration for s in r.steps] == list(range(len(r.steps)))  # from the first step
    assert all(s.elapsed_ms > 0 for s in r.steps)
    assert r.summary is not None
    # every measured request's output was generated by some step (warm-up ones too)
    assert sum(s.generation_tokens + s.context_requests for s in r.steps) >= \
        r.summary.overall.requests.ok
    records, meta = read_step_log(path)
    assert records == r.steps
    assert meta.model == "llama-3.1-8b" and meta.device == "GPU"
    assert meta.kv_cache_tokens and meta.kv_cache_tokens > 0
