"""Two operator replicas against the emulator, the leader SIGKILLed mid-trial: the scenario of
``test_ha.py`` and ``bench/operator_failover.py``.

Each replica is ``chunktune operator run --leader-elect`` as its own process (as two pods of the
chart's ``replicaCount: 2`` would be), sharing one state directory (the chart's volume) and a
Lease with short timings. :func:`failover` starts replica ``a``, waits until it leads, starts
``b`` (the standby), waits until trial ``1`` is under load, kills ``a`` with SIGKILL and
follows ``b`` taking the Lease, adopting the trial and finishing the study; it records every
engine pod and load Job created, per trial, and when each step happened.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chunktune.backends.manifests import COMPONENT, TRIAL, TUNING
from tests.k8s.conftest import POD_ENV, tuning, wait_phase
from tests.k8s.test_lifecycle import load_running
from tests.kube.emulator import PODS, KubeEmulator, WatchEvent

#: Lease timings of the scenario: a standby takes over 3 s after the last renewal it saw.
LEASE = {"CHUNKTUNE_LEASE_DURATION": "3", "CHUNKTUNE_LEASE_RENEW_DEADLINE": "2",
         "CHUNKTUNE_LEASE_RETRY_PERIOD": "0.5"}
#: The same on a busy 2-core machine, where tests, both replicas and the kubelet share the
#: cores: a leader that cannot renew within 2 s gives the Lease up (as it must) before the
#: scenario kills it; 10 s / 6 s keep the leader the one the scenario kills. What the takeover
#: costs is ``bench/operator_failover.py``'s (:data:`LEASE`), not the test's.
BUSY_HOST_LEASE = {"CHUNKTUNE_LEASE_DURATION": "10", "CHUNKTUNE_LEASE_RENEW_DEADLINE": "6",
                   "CHUNKTUNE_LEASE_RETRY_PERIOD": "0.5"}
LEASE_NAME = "chunktune-operator"
#: The replicas import this checkout's chunktune (not another installed one).
PYTHONPATH = os.pathsep.join([str(Path(__file__).resolve().parents[2] / "operator"),
                              os.environ.get("PYTHONPATH", "")])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Replica:
    """One ``chunktune operator run --leader-elect`` process."""

    identity: str
    proc: subprocess.Popen[bytes]
    port: int

    def get(self, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as rsp:
            return str(rsp.read().decode())

    def metric(self, name: str) -> float | None:
        """One unlabelled sample of the replica's ``/metrics`` (None: not served yet)."""
        try:
            text = self.get("/metrics")
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None


def start_replica(kube: KubeEmulator, state_dir: Path, identity: str,
                  **env: str) -> Replica:
    port = free_port()
    environ = {**os.environ, **POD_ENV, **LEASE, **env, "KUBECONFIG": str(kube.kubeconfig_path),
               "CHUNKTUNE_IMAGE": "ghcr.io/chunktune/chunktune:test",
               "CHUNKTUNE_SIM_LOAD_TIME": "0.1", "CHUNKTUNE_POLL_INTERVAL": "0.2",
               "CHUNKTUNE_KV_SAMPLE_INTERVAL": "1", "CHUNKTUNE_LOG_LEVEL": "WARNING",
               "CHUNKTUNE_LEASE_NAMESPACE": "default", "CHUNKTUNE_LEADER_IDENTITY": identity,
               "PYTHONPATH": PYTHONPATH}
    proc = subprocess.Popen(
        [sys.executable, "-m", "chunktune", "operator", "run", "--standalone",
         "--all-namespaces", "--state-dir", str(state_dir), "--leader-elect",
         "--metrics-address", f"127.0.0.1:{port}"],
        env=environ, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return Replica(identity, proc, port)


def holder(kube: KubeEmulator) -> str | None:
    return ((kube.get("leases", "default", LEASE_NAME) or {}).get("spec") or {}).get(
        "holderIdentity")


@dataclass
class Failover:
    """What :func:`failover` saw."""

    status: dict[str, Any] = field(default_factory=dict)
    engine_pods: collections.Counter[int] = field(default_factory=collections.Counter)
    """Engine pods created, per trial number."""
    load_jobs: collections.Counter[int] = field(default_factory=collections.Counter)
    trial_in_flight: int = 1
    standby_said: str = ""
    """The standby's ``/healthz`` before the failover."""
    standby_leader_gauge: float | None = None
    new_leader_gauge: float | None = None
    new_leader_transitions: float | None = None
    exit_code: int | None = None
    """The new leader's, after SIGTERM at the end (0: a clean stop)."""
    holder_after: str | None = "?"
    """The Lease's holder after that stop (None: released)."""
    takeover_s: float = 0.0
    """From the SIGKILL to the standby holding the Lease."""
    adopted_s: float = 0.0
    """From the SIGKILL to the trial in flight's result in the study."""


async def failover(kube: KubeEmulator, state_dir: Path, name: str = "ha",
                   trials: int = 3, lease: dict[str, str] | None = None) -> Failover:
    """The scenario of the module docstring, its replicas on ``lease``'s timings (default
    :data:`LEASE`)."""
    out = Failover()
    timings = LEASE if lease is None else lease

    def count(event: WatchEvent) -> None:
        labels = event.object.get("metadata", {}).get("labels") or {}
        if event.type != "ADDED" or labels.get(TUNING) != name or TRIAL not in labels:
            return
        if event.resource == PODS and labels.get(COMPONENT) == "engine":
            out.engine_pods[int(labels[TRIAL])] += 1
        elif event.resource.plural == "jobs":
            out.load_jobs[int(labels[TRIAL])] += 1

    kube.server.add_listener(count)
    kube.create("cpt", tuning(name, budget={"maxTrials": trials},
                              workload={"profile": "smoke", "duration": "5s", "warmup": "1s"},
                              pruner={"name": "none"}), "default")
    replicas: list[Replica] = []
    try:
        a = start_replica(kube, state_dir, "a", **timings)
        replicas.append(a)
        await kube.until(lambda: holder(kube) == "a", timeout=60, message="a leads")
        b = start_replica(kube, state_dir, "b", **timings)
        replicas.append(b)
        out.standby_said = await kube.until(lambda: _try(b.get, "/healthz"), timeout=60,
                                            message="the standby answers")
        out.standby_leader_gauge = b.metric("chunktune_leader")
        await kube.until(lambda: load_running(kube, f"{name}-t{out.trial_in_flight}-load"),
                         timeout=90, message="trial 1 under load")
        assert holder(kube) == "a"
        a.proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        a.proc.wait(10)
        await kube.until(lambda: holder(kube) == "b", timeout=60, interval=0.05,
                         message="b takes the lease")
        out.takeover_s = time.monotonic() - killed
        await kube.until(lambda: _trial_done(kube, name, out.trial_in_flight), timeout=90,
                         interval=0.1, message="the adopted trial's result")
        out.adopted_s = time.monotonic() - killed
        out.status = await wait_phase(kube, name, ("Succeeded", "Failed"), timeout=120)
        out.new_leader_gauge = b.metric("chunktune_leader")
        out.new_leader_transitions = b.metric("chunktune_leader_transitions_total")
        b.proc.send_signal(signal.SIGTERM)
        out.exit_code = await asyncio.to_thread(b.proc.wait, 60)
        out.holder_after = holder(kube)
    finally:
        kube.server.remove_listener(count)
        for r in replicas:
            if r.proc.poll() is None:
                r.proc.kill()
                r.proc.wait(10)
    return out


def _try(fn: Any, *args: Any) -> Any:
    with contextlib.suppress(OSError):
        return fn(*args)
    return None


def _trial_done(kube: KubeEmulator, name: str, number: int) -> bool:
    """The status lists trial ``number`` as ended."""
    status = (kube.get("cpt", "default", name) or {}).get("status") or {}
    return any(t.get("number") == number and t.get("state") != "RUNNING"
               for t in status.get("trials") or [])
