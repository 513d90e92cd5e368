"""Fault injection for the operator tests: an API outage, error storms, a dead Prometheus.

* :class:`ApiProxy`: a TCP proxy between the operator and the emulator, in its own thread and
  event loop (like a network path to another host). :meth:`ApiProxy.cut` is an outage as the
  operator sees one: every open connection (watch streams included) is dropped and new ones
  are refused, until :meth:`ApiProxy.restore`. The cluster itself goes on (the fake kubelet
  runs the pods and Jobs through the emulator's store), as nodes do when the control plane
  is unreachable.
* :func:`error_storm`: the next ``len(statuses)`` matching requests are answered with those
  HTTP errors (a kmock reaction that raises the API server's ``Status`` error, then steps
  aside), e.g. 409 and 500 on status patches.
* :func:`dead_url`: an http URL on loopback where nothing listens (Prometheus down).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kmock

from chunktune.backends.manifests import TRIAL, TUNING
from chunktune.tuning.study import ATTR_METRICS, ATTR_REASON, point_of, trial_state
from tests.k8s.conftest import (
    journal_of,
    operator_settings,
    running_operator,
    status_of,
    study_in,
    trial_objects,
    tuning,
    wait_phase,
)
from tests.kube.emulator import KubeEmulator
from tests.kube.objects import api_error

#: Trial states that count against maxTrials.
COUNTED = ("COMPLETE", "PRUNED", "INFEASIBLE", "FAIL")


class ApiProxy:
    """``url`` forwards to ``target`` (``host:port``) until :meth:`cut`."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = _free_port()
        self.cuts = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="api-proxy")
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ApiProxy:
        self._thread.start()
        self._run(self._listen())
        return self

    def __exit__(self, *_: Any) -> None:
        self._run(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def cut(self) -> None:
        """The outage begins: open connections drop, new ones are refused."""
        self.cuts += 1
        self._run(self._close())

    def restore(self) -> None:
        """The API answers again."""
        self._run(self._listen())

    async def _listen(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._pipe, "127.0.0.1", self.port,
                                                      reuse_address=True)

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._writers):
            with contextlib.suppress(Exception):
                w.transport.abort()
        self._writers.clear()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(Exception):
                dst.transport.abort()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))
        self._writers -= {writer, up_writer}


class Storm:
    """Counts what an :func:`error_storm` answered."""

    def __init__(self, statuses: Iterable[int]) -> None:
        self.pending = list(statuses)
        self.answered: list[int] = []
        self.first: float | None = None
        """``time.monotonic()`` of the first error answered."""

    def __call__(self, request: kmock.Request) -> Any:
        if not self.pending:
            raise NotImplementedError  # spent: the emulator answers as usual
        status = self.pending.pop(0)
        self.answered.append(status)
        if self.first is None:
            self.first = time.monotonic()
        reason = {409: "Conflict", 429: "TooManyRequests", 500: "InternalError",
                  503: "ServiceUnavailable"}.get(status, "InternalError")
        raise api_error(status, reason, f"injected fault ({status})")


def error_storm(kube: KubeEmulator, method: str, statuses: Iterable[int],
                subresource: str | None = None) -> Storm:
    """Answer the next matching requests (``method``, and ``subresource`` if given) with
    ``statuses``, one each, in order."""
    storm = Storm(statuses)
    if subresource is None:
        kube.server[method] << storm
    else:
        kube.server[method, kmock.subresource(subresource)] << storm
    return storm


def dead_url() -> str:
    """An http URL on loopback where nothing listens."""
    return f"http://127.0.0.1:{_free_port()}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])




# ---- scenarios (shared by tests/k8s/test_faults.py and bench/faults.py) ----------------------


@dataclass
class Outcome:
    """What a fault did to a study: the figures ``bench/faults.py`` prints, the tests assert."""

    fault: str
    phase: str
    lost: int
    """Trials whose measurement the fault destroyed (not recorded as measured)."""
    duplicated: int
    """Points measured more than once."""
    budget: int
    """Counted trials (against maxTrials) that are faults, not results of their flags."""
    recover_s: float | None
    """Seconds from the fault's end until the study recorded progress again."""
    left: list[str]
    """Trial objects still there after the study ended (or the resource was deleted)."""
    rows: list[tuple[int, str, str | None]] = field(default_factory=list)
    """(trial, state, reason) of every trial in the study."""
    detail: dict[str, Any] = field(default_factory=dict)


def load_running(kube: KubeEmulator, job: str, namespace: str = "default") -> bool:
    """The Job's pod runs and the load driver has started (its first log line is out)."""
    pods = kube.objects("pods", namespace, label_selector=f"job-name={job}")
    return any((p.get("status") or {}).get("phase") == "Running" and
               "chunktune load run" in kube.pod_log(namespace, p["metadata"]["name"])
               for p in pods)


def trial_loading(kube: KubeEmulator, name: str, after: int = -1,
                  namespace: str = "default") -> int | None:
    """The number of a trial later than ``after`` whose load is under way."""
    for job in kube.objects("jobs", namespace, label_selector=f"{TUNING}={name},{TRIAL}"):
        number = int(job["metadata"]["labels"][TRIAL])
        if number > after and load_running(kube, job["metadata"]["name"], namespace):
            return number
    return None


def small_tuning(name: str, trials: int = 3, duration: str = "5s", **spec: Any) -> dict[str, Any]:
    """A study of ``trials`` distinct points (a grid, so no point is drawn twice)."""
    base = {"searchSpace": [{"name": "max-num-batched-tokens",
                             "choices": [1024, 2048, 4096, 8192][:max(trials, 2)]}],
            "workload": {"profile": "smoke", "duration": duration, "warmup": "1s"},
            "budget": {"maxTrials": trials, "parallelism": 1, "maxFailedTrials": 1},
            "sampler": {"name": "grid", "seed": 1}, "pruner": {"name": "none"}}
    base.update(spec)
    return tuning(name, **base)


def outcome(kube: KubeEmulator, state_dir: Path, name: str, fault: str,
            faulted: set[int] | None = None, expected: frozenset[str] = frozenset(),
            recover_s: float | None = None, namespace: str = "default") -> Outcome:
    """Figures of a finished study. ``faulted``: trials that ran while the fault hit (lost
    unless measured); ``expected``: failure reasons that are the scenario's genuine results
    (an engine that really crashed)."""
    status = status_of(kube, name, namespace)
    study = study_in(journal_of(kube, state_dir, name, namespace), name, namespace)
    rows = [(t.number, trial_state(t), t.user_attrs.get(ATTR_REASON)) for t in study.trials]
    counted = [t for t in study.trials if trial_state(t) in COUNTED]
    # measured: a measurement was recorded (a failed point run again is not measured twice)
    measured = [t for t in counted if trial_state(t) == "INFEASIBLE" or
                (trial_state(t) in ("COMPLETE", "PRUNED") and t.user_attrs.get(ATTR_METRICS))]
    points = [json.dumps(point_of(t), sort_keys=True) for t in measured]
    budget = sum(1 for t in counted if trial_state(t) in ("FAIL", "INFEASIBLE")
                 and t.user_attrs.get(ATTR_REASON) not in expected)
    by_number = {t.number: t for t in study.trials}

    def kept(n: int) -> bool:
        t = by_number.get(n)
        if t is None:
            return False
        if t.user_attrs.get(ATTR_REASON) in expected:
            return True  # the failure is the trial's recorded result
        return trial_state(t) == "COMPLETE" and bool(t.user_attrs.get(ATTR_METRICS))

    lost = sum(1 for n in faulted or set() if not kept(n))
    return Outcome(fault=fault, phase=str(status.get("phase")), lost=lost,
                   duplicated=len(points) - len(set(points)), budget=budget,
                   recover_s=recover_s, left=trial_objects(kube, name), rows=rows,
                   detail={"status": status, "study": study})


def _progress(kube: KubeEmulator, name: str) -> int:
    return int(status_of(kube, name).get("trialsCompleted") or 0)


async def _recovered(kube: KubeEmulator, name: str, before: int, since: float,
                     timeout: float = 120.0) -> float:
    await kube.until(lambda: _progress(kube, name) > before, timeout=timeout, interval=0.1,
                     message=f"{name} making progress after the fault")
    return time.monotonic() - since


async def api_outage(kube: KubeEmulator, state_dir: Path, retry_seconds: float,
                     seconds: float = 12.0, name: str = "outage") -> Outcome:
    """The API server is unreachable for ``seconds`` while trial 0's load runs (and ends)."""
    kube.create("cpt", small_tuning(name), "default")
    settings = operator_settings(state_dir).with_overrides(api_retry_seconds=retry_seconds)
    with ApiProxy("127.0.0.1", kube.port) as proxy:
        async with running_operator(kube, settings, server=proxy.url):
            await kube.until(lambda: trial_loading(kube, name) == 0, timeout=60,
                             message="trial 0 under load")
            before = _progress(kube, name)
            proxy.cut()
            await asyncio.sleep(seconds)
            proxy.restore()
            restored = time.monotonic()
            took = await _recovered(kube, name, before, restored)
            await wait_phase(kube, name, ("Succeeded", "Failed"), timeout=120)
            await kube.until(lambda: not trial_objects(kube, name), timeout=30,
                             message="trial objects deleted")
    return outcome(kube, state_dir, name, f"API outage {seconds:g} s mid-load "
                   f"(retry bound {retry_seconds:g} s)", faulted={0}, recover_s=took)


async def status_storm(kube: KubeEmulator, state_dir: Path, name: str = "storm",
                       statuses: tuple[int, ...] = (409,) * 4 + (500,) * 4) -> Outcome:
    """Status patches answered with 409s and 500s in a row while trial 0 runs."""
    kube.create("cpt", small_tuning(name, trials=2, duration="4s"), "default")
    async with running_operator(kube, operator_settings(state_dir)):
        await kube.until(lambda: trial_loading(kube, name) == 0, timeout=60,
                         message="trial 0 under load")
        before = _progress(kube, name)
        storm = error_storm(kube, "patch", statuses, subresource="status")
        await _recovered(kube, name, before, time.monotonic(), timeout=60)
        took = time.monotonic() - (storm.first or time.monotonic())  # from the first error
        await wait_phase(kube, name, ("Succeeded", "Failed"), timeout=60)
        await kube.until(lambda: not trial_objects(kube, name), timeout=30,
                         message="trial objects deleted")
    out = outcome(kube, state_dir, name, f"{len(statuses)} status patch errors "
                  f"({', '.join(str(s) for s in sorted(set(statuses)))})", faulted={0},
                  recover_s=took)
    out.detail["answered"] = list(storm.answered)
    return out


async def prometheus_down(kube: KubeEmulator, state_dir: Path,
                          name: str = "noprom") -> Outcome:
    """``spec.metrics.prometheusURL`` names a Prometheus that does not answer."""
    kube.create("cpt", small_tuning(name, trials=2, duration="4s", metrics={
        "prometheusURL": dead_url(), "scrapeInterval": "1s"}), "default")
    since = time.monotonic()
    async with running_operator(kube, operator_settings(state_dir)):
        await wait_phase(kube, name, ("Succeeded", "Failed"), timeout=90)
        await kube.until(lambda: not trial_objects(kube, name), timeout=30,
                         message="trial objects deleted")
    out = outcome(kube, state_dir, name, "Prometheus unreachable", faulted={0, 1})
    out.recover_s = 0.0 if out.phase == "Succeeded" else None
    out.detail["events"] = events_of(kube, name)
    out.detail["took"] = time.monotonic() - since
    return out


async def operator_restarts(kube: KubeEmulator, state_dir: Path, restarts: int = 3,
                            name: str = "restarts") -> Outcome:
    """The operator is stopped mid-load ``restarts`` times; each successor adopts the trial.
    Time to recover: the slowest successor's start until it recorded the adopted trial."""
    kube.create("cpt", small_tuning(name, trials=restarts + 1), "default")
    settings = operator_settings(state_dir)
    faulted: list[int] = []
    took = 0.0
    for i in range(restarts + 1):
        before, since = _progress(kube, name), time.monotonic()
        async with running_operator(kube, settings):
            if i:
                took = max(took, await _recovered(kube, name, before, since, timeout=90))
            if i == restarts:
                await wait_phase(kube, name, ("Succeeded", "Failed"), timeout=120)
                await kube.until(lambda: not trial_objects(kube, name), timeout=30,
                                 message="trial objects deleted")
                break
            faulted.append(await kube.until(
                lambda last=faulted[-1] if faulted else -1: trial_loading(kube, name, last),
                timeout=90, message="the next trial under load"))
    return outcome(kube, state_dir, name, f"operator stopped mid-load {restarts} times",
                   faulted=set(faulted), recover_s=took)


async def deleted_during_outage(kube: KubeEmulator, state_dir: Path,
                                name: str = "gone") -> Outcome:
    """The resource is deleted mid-trial while the API is unreachable for the operator."""
    kube.create("cpt", small_tuning(name, duration="30s"), "default")
    settings = operator_settings(state_dir).with_overrides(api_retry_seconds=2.0)
    with ApiProxy("127.0.0.1", kube.port) as proxy:
        async with running_operator(kube, settings, server=proxy.url):
            await kube.until(lambda: trial_loading(kube, name) == 0, timeout=60,
                             message="trial 0 under load")
            journal = journal_of(kube, state_dir, name)
            proxy.cut()
            kube.delete("cpt", "default", name)
            await asyncio.sleep(5.0)
            proxy.restore()
            since = time.monotonic()
            await kube.until(lambda: kube.get("cpt", "default", name) is None, timeout=60,
                             message="the finalizer let the resource go")
            took = time.monotonic() - since
    left = trial_objects(kube, name)
    return Outcome(fault="resource deleted mid-trial during an outage", phase="Deleted",
                   lost=0, duplicated=0, budget=0, recover_s=took, left=left,
                   detail={"journal_left": journal.exists()})


def events_of(kube: KubeEmulator, name: str) -> list[dict[str, Any]]:
    return [e for e in kube.objects("events", "default")
            if (e.get("involvedObject") or {}).get("name") == name]


# ---- engine and load faults: a ``chunktune`` wrapper first on the pods' PATH ----------------

WRAPPER = '''#!{python}
"""chunktune, except for the pods named here: their engine crashes, or their load fails."""
import os, subprocess, sys, time
REAL = {real!r}
args, host = sys.argv[1:], os.environ.get("HOSTNAME", "")
if args[:2] == ["sim", "serve"] and host in {crash!r}:
    engine = subprocess.Popen([REAL, *args])
    time.sleep({crash_after})
    engine.kill()
    print("INFO engine.py:88 step 412 done", flush=True)
    print("Traceback (most recent call last):", file=sys.stderr)
    print('  File "engine.py", line 97, in step', file=sys.stderr)
    print("RuntimeError: CUDA error: an illegal memory access was encountered (injected)",
          file=sys.stderr)
    print("INFO shutdown.py:20 releasing the KV cache", flush=True)
    sys.exit(1)
if args[:2] == ["load", "run"] and any(host.startswith(j + "-") for j in {fail!r}):
    print("chunktune load run: starting", flush=True)
    time.sleep(1)
    print("error: injected load failure: the load driver lost its target", file=sys.stderr)
    sys.exit(2)
os.execv(REAL, [REAL, *args])
'''


def fault_path(folder: Path, bin_dir: str, crash: tuple[str, ...] = (),
               fail_jobs: tuple[str, ...] = (), crash_after: float = 3.0) -> dict[str, str]:
    """``extra_env`` for a :class:`~tests.kube.kubelet.FakeKubelet` whose pods run the
    wrapper: engine pods named in ``crash`` die ``crash_after`` s after they start, with a
    traceback; load pods of the Jobs in ``fail_jobs`` fail."""
    import os
    import sys

    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "chunktune"
    script.write_text(WRAPPER.format(python=sys.executable, real=str(Path(bin_dir) / "chunktune"),
                                     crash=set(crash), fail=list(fail_jobs),
                                     crash_after=crash_after))
    script.chmod(0o755)
    return {"PATH": os.pathsep.join([str(folder), bin_dir, os.environ.get("PATH", "")])}


async def engine_crash(kube: KubeEmulator, state_dir: Path, name: str = "crash") -> Outcome:
    """Trial 1's engine crashes with a traceback during its load (needs a kubelet running the
    :func:`fault_path` wrapper with ``crash=("crash-t1",)``)."""
    kube.create("cpt", small_tuning(name, budget={"maxTrials": 3, "parallelism": 1,
                                                  "maxFailedTrials": 3}), "default")
    since = time.monotonic()
    async with running_operator(kube, operator_settings(state_dir)):
        await wait_phase(kube, name, ("Succeeded", "Failed"), timeout=120)
        await kube.until(lambda: not trial_objects(kube, name), timeout=30,
                         message="trial objects deleted")
    out = outcome(kube, state_dir, name, "engine crash mid-load (traceback)", faulted={1},
                  expected=frozenset({"EngineCrashed"}), recover_s=0.0)
    out.detail["events"] = events_of(kube, name)
    out.detail["took"] = time.monotonic() - since
    return out


async def load_failure(kube: KubeEmulator, state_dir: Path, name: str = "loadfail") -> Outcome:
    """Trial 1's load Job fails (needs a kubelet running the :func:`fault_path` wrapper with
    ``fail_jobs=("loadfail-t1-load",)``)."""
    kube.create("cpt", small_tuning(name, budget={"maxTrials": 3, "parallelism": 1,
                                                  "maxFailedTrials": 3}), "default")
    async with running_operator(kube, operator_settings(state_dir)):
        await wait_phase(kube, name, ("Succeeded", "Failed"), timeout=120)
        await kube.until(lambda: not trial_objects(kube, name), timeout=30,
                         message="trial objects deleted")
    out = outcome(kube, state_dir, name, "load Job fails", faulted={1},
                  expected=frozenset({"LoadFailed"}), recover_s=0.0)
    out.detail["events"] = events_of(kube, name)
    return out
