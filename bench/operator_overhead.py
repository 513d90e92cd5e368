"""Control-plane overhead of one operator trial, measured against the Kubernetes emulator.

Runs the real operator (kopf + the official client, in process) on a ``ChunkedPrefillTuning``
of ``--trials`` trials, one at a time, against ``tests/kube``'s emulator and fake kubelet. The
engine and the load driver are stand-ins (a ``chunktune`` stub first on the pods' PATH): the
engine sleeps ``--engine-delay`` seconds, then serves ``/health`` and ``/metrics``; the load
"run" sleeps ``--load-seconds`` and writes a canned ``load-summary/v1``. So everything else a
trial costs is the operator's: creating the ConfigMap, Pod and Job, watching them, reading the
Job's log, scraping ``/metrics``, deleting the objects, telling Optuna, patching the status,
asking for the next trial — plus the emulated kubelet's own latency (process spawn, probes).

Per trial: ``cycle`` = the next trial's ask minus this one's (Optuna's ``datetime_start``,
microseconds), and ``overhead`` = ``cycle - engine_delay - load_seconds``. Prints each trial,
then the median and the maximum. Target: at most 2 s per trial.

    python bench/operator_overhead.py [--trials 8] [--engine-delay 2] [--load-seconds 3]
                                      [--poll-interval 1.0]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "operator"), str(ROOT)]

STUB = '''#!{python}
"""A stand-in for the chunktune image's command: `sim serve` and `load run`."""
import http.server, json, shutil, signal, sys, time
args = sys.argv[1:]
def opt(name):
    return args[args.index(name) + 1]
if args[:2] == ["sim", "serve"]:
    time.sleep({engine_delay})
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"" if self.path == "/health" else (
                b'vllm:num_preemptions_total{{engine="0"}} 0.0\\n'
                b'vllm:kv_cache_usage_perc{{engine="0"}} 0.25\\n')
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a):
            pass
    server = http.server.ThreadingHTTPServer((opt("--host"), int(opt("--port"))), H)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    server.serve_forever()
elif args[:2] == ["load", "run"]:
    print("chunktune load run: stub", flush=True)
    time.sleep({load_seconds})
    shutil.copy("{summary}", opt("--out"))
'''


def canned_summary() -> dict[str, Any]:
    from chunktune.core.aggregate import RunInfo, build_summary
    from chunktune.core.records import RequestRecord
    from chunktune.core.summary import ArrivalInfo

    records = [RequestRecord(rid=i, cls="chat", arrival=i * 0.1, start=i * 0.1,
                             prompt_tokens=200, max_tokens=16, ok=True, ttft=0.02 + i * 1e-3,
                             e2e=0.2, output_tokens=16, itl=[0.01] * 15) for i in range(30)]
    now = time.time()
    info = RunInfo(target="http://stub", model="m", profile="smoke",
                   arrival=ArrivalInfo("poisson", 6.0), seed=0, class_names=("chat",),
                   started_wall=now, ended_wall=now + 3.5, configured=3.0, warmup=0.0,
                   dispatch_end=3.0, drain=0.5)
    return build_summary(records, info).to_dict()


async def run(ns: argparse.Namespace) -> int:
    import kopf
    import optuna
    from tests.kube.emulator import KubeEmulator
    from tests.kube.kubelet import FakeKubelet

    from chunktune.api.crd import build_crd
    from chunktune.k8s import runtime
    from chunktune.k8s.settings import Settings
    from chunktune.tuning.study import trial_state

    tmp = Path(tempfile.mkdtemp(prefix="chunktune-overhead-"))
    summary = tmp / "summary.json"
    summary.write_text(json.dumps(canned_summary()))
    stub = tmp / "bin" / "chunktune"
    stub.parent.mkdir()
    stub.write_text(STUB.format(python=sys.executable, engine_delay=ns.engine_delay,
                                load_seconds=ns.load_seconds, summary=summary))
    stub.chmod(0o755)
    path = os.pathsep.join([str(stub.parent), os.environ.get("PATH", "")])
    settings = Settings.from_env({}, state_dir=tmp / "state", standalone=True, trials={
        "image": "chunktune:bench", "poll_interval": ns.poll_interval,
        "kv_sample_interval": 1.0})
    body = {"apiVersion": "chunktune.dev/v1alpha1", "kind": "ChunkedPrefillTuning",
            "metadata": {"name": "bench"}, "spec": {
                "engine": {"kind": "sim", "model": "llama-3.1-8b", "gpu": {"type": "h100-sxm"}},
                "searchSpace": [{"name": "max-num-batched-tokens", "type": "int",
                                 "low": 512, "high": 65536, "step": 512}],
                "workload": {"profile": "smoke", "duration": "3s", "warmup": "0s"},
                "budget": {"maxTrials": ns.trials, "parallelism": 1},
                "pruner": {"name": "none"}, "sampler": {"name": "random", "seed": 0}}}
    with KubeEmulator() as kube, FakeKubelet(kube, extra_env={"PATH": path}):
        kube.create("crd", build_crd())

        def login(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=kube.url, token=kube.token)

        registry, op = runtime.build(settings, kube.api_client(), login)
        stop, ready = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(kopf.operator(registry=registry, clusterwide=True,
                                                 standalone=True, stop_flag=stop,
                                                 ready_flag=ready))
        await asyncio.wait_for(ready.wait(), 30)
        t0 = time.monotonic()
        kube.create("cpt", body, "default")
        status = await kube.until(
            lambda: ((kube.get("cpt", "default", "bench") or {}).get("status") or {}).get(
                "phase") in ("Succeeded", "Failed") and kube.get("cpt", "default", "bench"),
            timeout=ns.trials * (ns.engine_delay + ns.load_seconds + 30), interval=0.05)
        total = time.monotonic() - t0
        stop.set()
        await asyncio.wait_for(task, 60)
        await op.api.close()
    phase = status["status"]["phase"]
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(
        str(tmp / "state" / "default-bench.journal")))
    study = optuna.load_study(study_name="default/bench", storage=storage)
    launched = [t for t in study.trials if trial_state(t) not in ("SKIPPED", "WAITING")]
    print(f"operator overhead per trial: {len(launched)} trials, engine start-up stand-in "
          f"{ns.engine_delay:g} s, load stand-in {ns.load_seconds:g} s, poll interval "
          f"{ns.poll_interval:g} s; study {phase} in {total:.1f} s")
    print(f"{'trial':>5} {'cycle s':>8} {'overhead s':>10}  state")
    overheads = []
    for a, b in itertools.pairwise(launched):
        assert a.datetime_start is not None and b.datetime_start is not None
        cycle = (b.datetime_start - a.datetime_start).total_seconds()
        over = cycle - ns.engine_delay - ns.load_seconds
        overheads.append(over)
        print(f"{a.number:>5} {cycle:>8.3f} {over:>10.3f}  {trial_state(a)}")
    if not overheads:
        print("not enough trials to measure")
        return 1
    med, worst = statistics.median(overheads), max(overheads)
    print(f"median {med:.3f} s, max {worst:.3f} s (target <= 2 s): "
          f"{'OK' if worst <= 2.0 else 'OVER'}")
    return 0 if phase == "Succeeded" else 1


def main() -> int:
    p = argparse.ArgumentParser(description=textwrap.dedent(__doc__ or "").split("\n\n")[0])
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--engine-delay", type=float, default=2.0,
                   help="seconds the engine stand-in takes to become ready")
    p.add_argument("--load-seconds", type=float, default=3.0,
                   help="seconds the load stand-in runs")
    p.add_argument("--poll-interval", type=float, default=1.0,
                   help="the operator's CHUNKTUNE_POLL_INTERVAL (its default: 1)")
    ns = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    return asyncio.run(run(ns))


if __name__ == "__main__":
    sys.exit(main())
