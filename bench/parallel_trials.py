"""Wall time of a study at ``budget.parallelism`` 1 and N on a node with fewer GPUs than N, in the
Kubernetes emulator.

Runs the real operator (kopf + the official client, in process) against ``tests/kube``'s
emulator and fake kubelet, whose node has ``--gpus`` GPUs (``FakeKubelet(capacity=...)``);
simulated engines request one GPU each (``CHUNKTUNE_SIM_REQUEST_GPUS``), so with parallelism
above ``--gpus`` the extra engine pods wait ``Unschedulable`` for capacity. For each
parallelism: the study's wall time (created to ``Succeeded``), trials completed and failed,
trials that waited and their mean wait, the mean engine start-up.

``--engine stub``: a stand-in ``chunktune`` (``bench/operator_overhead.py``'s): the engine is
ready after ``--engine-delay`` s, the load takes ``--load-seconds`` s, so the figures are the
operator's and the scheduling's alone. ``--engine sim``: ``chunktune sim serve`` engines and
real Locust load Jobs for ``--load-seconds`` s of the smoke profile, every process on this
machine's cores (on 2 cores, N engines and N Locust processes slow each other: not a GPU
cluster's figure).

    python bench/parallel_trials.py [--engine stub|sim] [--trials 8] [--gpus 4]
                                    [--parallelism 1 8] [--engine-delay 2] [--load-seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "operator"), str(ROOT), str(ROOT / "bench")]


def manifest(trials: int, parallelism: int, load_seconds: float) -> dict[str, Any]:
    return {"apiVersion": "chunktune.dev/v1alpha1", "kind": "ChunkedPrefillTuning",
            "metadata": {"name": "par"}, "spec": {
                "engine": {"kind": "sim", "model": "llama-3.1-8b", "gpu": {"type": "h100-sxm"},
                           "args": ["--max-model-len", "16384"]},
                "searchSpace": [{"name": "max-num-batched-tokens", "type": "int",
                                 "low": 512, "high": 65536, "step": 512}],
                "workload": {"profile": "smoke", "duration": f"{load_seconds:g}s",
                             "warmup": "1s"},
                "budget": {"maxTrials": trials, "parallelism": parallelism},
                "pruner": {"name": "none"}, "sampler": {"name": "random", "seed": 0}}}


def pod_path(ns: argparse.Namespace, tmp: Path) -> str:
    """PATH of the pods: a stand-in ``chunktune`` first (stub), else this interpreter's."""
    bin_dir = Path(sys.executable).parent
    if ns.engine == "stub":
        from operator_overhead import STUB, canned_summary

        summary = tmp / "summary.json"
        summary.write_text(json.dumps(canned_summary()))
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        stub = bin_dir / "chunktune"
        stub.write_text(STUB.format(python=sys.executable, engine_delay=ns.engine_delay,
                                    load_seconds=ns.load_seconds, summary=summary))
        stub.chmod(0o755)
    return os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])


async def one(ns: argparse.Namespace, parallelism: int) -> dict[str, Any]:
    import kopf
    from tests.kube.emulator import KubeEmulator
    from tests.kube.kubelet import FakeKubelet

    from chunktune.api.crd import build_crd
    from chunktune.k8s import runtime
    from chunktune.k8s.settings import Settings

    tmp = Path(tempfile.mkdtemp(prefix="chunktune-parallel-"))
    settings = Settings.from_env({}, state_dir=tmp / "state", standalone=True, trials={
        "image": "chunktune:bench", "poll_interval": 0.5, "kv_sample_interval": 2.0,
        "sim_load_time": 0.1, "sim_requests_gpus": True})
    with KubeEmulator() as kube, FakeKubelet(kube, extra_env={"PATH": pod_path(ns, tmp)},
                                             capacity={"nvidia.com/gpu": ns.gpus}):
        kube.create("crd", build_crd())

        def login(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=kube.url, token=kube.token)

        built = runtime.build(settings, kube.api_client(), login)
        op = built[1]
        stop, ready = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(runtime.run(settings, built=built, stop_flag=stop,
                                               ready_flag=ready))
        await asyncio.wait_for(ready.wait(), 60)
        t0 = time.monotonic()
        kube.create("cpt", manifest(ns.trials, parallelism, ns.load_seconds), "default")
        most_waiting = 0

        def done() -> Any:
            nonlocal most_waiting
            most_waiting = max(most_waiting, op.metrics.study("default", "par").waiting)
            status = (kube.get("cpt", "default", "par") or {}).get("status") or {}
            return status if status.get("phase") in ("Succeeded", "Failed") else None

        status = await kube.until(done, timeout=ns.trials * (ns.load_seconds + 120),
                                  interval=0.1)
        wall = time.monotonic() - t0
        stop.set()
        await asyncio.wait_for(task, 60)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in op.metrics.registry.collect() for s in f.samples}

    def total(name: str) -> float:
        return sum(v for (n, _), v in samples.items() if n == name)

    waits = total("chunktune_trial_capacity_wait_seconds_count")
    return {"parallelism": parallelism, "phase": status["phase"], "wall": wall,
            "completed": status["counts"].get("completed", 0),
            "failed": status["counts"].get("failed", 0), "most_waiting": most_waiting,
            "waited": int(waits),
            "mean_wait": total("chunktune_trial_capacity_wait_seconds_sum") / waits
            if waits else 0.0,
            "mean_startup": total("chunktune_trial_startup_seconds_sum")
            / max(1.0, total("chunktune_trial_startup_seconds_count"))}


async def run(ns: argparse.Namespace) -> int:
    rows = [await one(ns, p) for p in ns.parallelism]
    what = (f"stand-in engines ({ns.engine_delay:g} s start-up) and loads ({ns.load_seconds:g} s)"
            if ns.engine == "stub" else f"chunktune sim serve engines and Locust loads "
            f"({ns.load_seconds:g} s of the smoke profile) on {os.cpu_count()} cores")
    print(f"{ns.trials} trials on a node with {ns.gpus} GPUs, one GPU per engine, {what}; "
          f"the Kubernetes emulator, not a cluster")
    print(f"{'parallelism':>11} {'phase':>9} {'wall s':>7} {'done':>4} {'failed':>6} "
          f"{'waiting at once':>15} {'waited':>6} {'mean wait s':>11} {'mean start-up s':>15}")
    for r in rows:
        print(f"{r['parallelism']:>11} {r['phase']:>9} {r['wall']:>7.1f} {r['completed']:>4} "
              f"{r['failed']:>6} {r['most_waiting']:>15} {r['waited']:>6} "
              f"{r['mean_wait']:>11.1f} {r['mean_startup']:>15.1f}")
    base = rows[0]["wall"]
    for r in rows[1:]:
        print(f"parallelism {r['parallelism']}: {base / r['wall']:.2f}x faster than "
              f"parallelism {rows[0]['parallelism']}")
    return 0 if all(r["phase"] == "Succeeded" and not r["failed"] for r in rows) else 1


def main() -> int:
    p = argparse.ArgumentParser(description=textwrap.dedent(__doc__ or "").split("\n\n")[0])
    p.add_argument("--engine", choices=("stub", "sim"), default="stub")
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--parallelism", type=int, nargs="+", default=[1, 8])
    p.add_argument("--engine-delay", type=float, default=2.0)
    p.add_argument("--load-seconds", type=float, default=5.0)
    ns = p.parse_args()
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    return asyncio.run(run(ns))


if __name__ == "__main__":
    sys.exit(main())
