"""Failover time of two operator replicas, in the Kubernetes emulator.

Runs ``tests/k8s/ha.py``'s scenario ``--runs`` times: two ``chunktune operator run
--leader-elect`` processes on one Lease (duration 3 s, renew deadline 2 s, retry period 0.5 s),
the leader SIGKILLed while trial 1 is under load (simulated engine, real Locust Job, 5 s of the
smoke profile). Prints per run: from the SIGKILL to the standby holding the Lease (bounded by
the lease duration plus a jittered retry period, 3 + 0.6 s, after the last renewal), and to the
adopted trial's result; engine pods and load Jobs per trial (1 each: nothing run twice).

    python bench/operator_failover.py [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "operator"), str(ROOT)]


async def run(ns: argparse.Namespace) -> int:
    from tests.k8s.conftest import POD_ENV
    from tests.k8s.ha import LEASE, failover
    from tests.kube.emulator import KubeEmulator
    from tests.kube.kubelet import FakeKubelet

    from chunktune.api.crd import build_crd

    print(f"two replicas, lease {LEASE['CHUNKTUNE_LEASE_DURATION']} s, renew deadline "
          f"{LEASE['CHUNKTUNE_LEASE_RENEW_DEADLINE']} s, retry period "
          f"{LEASE['CHUNKTUNE_LEASE_RETRY_PERIOD']} s; the Kubernetes emulator, not a cluster")
    print(f"{'run':>3} {'phase':>9} {'takeover s':>10} {'trial adopted s':>15} "
          f"{'engine pods/trial':>17} {'load Jobs/trial':>15}")
    takeovers, ok = [], True
    for i in range(ns.runs):
        with KubeEmulator() as kube, FakeKubelet(kube, extra_env=POD_ENV):
            kube.create("crd", build_crd())
            seen = await failover(kube, Path(tempfile.mkdtemp(prefix="chunktune-ha-")))
        pods, jobs = set(seen.engine_pods.values()), set(seen.load_jobs.values())
        ok &= seen.status.get("phase") == "Succeeded" and pods == jobs == {1}
        takeovers.append(seen.takeover_s)
        print(f"{i + 1:>3} {seen.status.get('phase', '?'):>9} {seen.takeover_s:>10.2f} "
              f"{seen.adopted_s:>15.2f} {','.join(map(str, sorted(pods))):>17} "
              f"{','.join(map(str, sorted(jobs))):>15}")
    print(f"takeover: median {statistics.median(takeovers):.2f} s, max {max(takeovers):.2f} s")
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=textwrap.dedent(__doc__ or "").split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    ns = p.parse_args()
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    return asyncio.run(run(ns))


if __name__ == "__main__":
    sys.exit(main())
