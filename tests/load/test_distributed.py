"""Distributed load (``chunktune load run --workers N``, ``workload.loadWorkers``): one arrival
schedule split across Locust workers gives the summary one process gives."""

from __future__ import annotations

import bisect
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bench.serve_overhead import start_server

from chunktune.core.stats import summarize
from chunktune.core.workload import generate, parse_profile
from chunktune.load import shards
from chunktune.load.launcher import child_env
from tests.load.conftest import profile_dict
from tests.load.test_against_sim import TTFT_BUCKETS


def test_shards_deal_one_schedule_round_robin() -> None:
    specs = generate(parse_profile(profile_dict(rate=50, duration=20, seed=4), source="t"))
    parts = [shards.shard(specs, i, 3) for i in range(3)]
    merged = sorted((s for p in parts for s in p), key=lambda s: s.rid)
    assert merged == list(specs)  # every request once, its arrival, id and sizes kept
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    for p in parts:  # each share is in arrival order
        assert [s.arrival for s in p] == sorted(s.arrival for s in p)  # type: ignore[misc]
    assert [shards.clients(10, i, 4) for i in range(4)] == [3, 3, 2, 2]
    with pytest.raises(ValueError, match="worker 3 of 3"):
        shards.shard(specs, 3, 3)


#: A Locust process: the master and one worker that registers chunktune's messages a second
#: after Locust connected it (as a worker slowed by a busy machine does).
LATE_WORKER = """
import json, sys
import gevent, gevent.event
from locust.env import Environment
from chunktune.load import distributed
from chunktune.load.config import DriverConfig

cfg = DriverConfig(target="http://127.0.0.1:9", model="m", profile=json.loads(sys.argv[1]),
                   load_workers=1, spawn_workers=False)
master = distributed.Master(cfg, lambda ev: None, "")
run = gevent.spawn(master.run)
worker = Environment(user_classes=[]).create_worker_runner("127.0.0.1", master.port)
gevent.sleep(1.0)  # Locust has acked the worker; the master must not send its share yet
share = gevent.event.AsyncResult()
worker.register_message(distributed.MSG_START, lambda environment, msg, **_: share.set(msg.data))
worker.send_message(distributed.MSG_HELLO, {})
data = share.get(timeout=30)
print(json.dumps({"index": data["index"], "count": data["count"]}))
run.kill()
worker.quit()
master.runner.quit()
"""


def test_a_worker_slow_to_listen_still_gets_its_share() -> None:
    run = subprocess.run([sys.executable, "-c", LATE_WORKER, json.dumps(profile_dict())],
                         capture_output=True, text=True, timeout=120, env=child_env())
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {"index": 0, "count": 1}
    assert "Unknown message type" not in run.stderr


def _run(url: str, out: Path, workers: int) -> dict[str, Any]:
    run = subprocess.run(
        [sys.executable, "-m", "chunktune", "load", "run", "--target", url, "--profile", "smoke",
         "--duration", "8s", "--warmup", "0", "--seed", "11", "--windows", "2s", "--raw",
         "--quiet", "--out", str(out), "--workers", str(workers)],
        capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr
    return dict(json.loads(out.read_text()))


def _bucket(v: float) -> int:
    return bisect.bisect_left(TTFT_BUCKETS, v)


@pytest.mark.slow  # Locust's master and two workers against a real sim serve process
def test_two_workers_give_one_process_summary(tmp_path: Path) -> None:
    with start_server("llama-3.1-8b", ["--max-model-len", "16384",
                                       "--served-model-name", "llama"]) as srv:
        one = _run(srv.url, tmp_path / "one.json", 0)
        two = _run(srv.url, tmp_path / "two.json", 2)
    # the same schedule: every request, its class, arrival time and sizes
    def schedule(s: dict[str, Any]) -> list[tuple[Any, ...]]:
        return sorted((r["rid"], r["cls"], r["arrival"], r["prompt_tokens"], r["max_tokens"])
                      for r in s["raw"])

    assert schedule(two) == schedule(one) and len(schedule(one)) > 20
    # sent when the schedule said (open loop held across workers): never early
    assert all(r["start"] >= r["arrival"] - 1e-6 for r in two["raw"])
    # counts exact, per class and per window
    assert two["overall"]["requests"] == one["overall"]["requests"]
    for name, c in one["classes"].items():
        assert two["classes"][name]["requests"] == c["requests"]
        assert two["classes"][name]["tokens"]["prompt"] == c["tokens"]["prompt"]
    assert [w["classes"][n]["requests"]["sent"] for w in two["windows"]
            for n in sorted(w["classes"])] == \
        [w["classes"][n]["requests"]["sent"] for w in one["windows"] for n in sorted(w["classes"])]
    # the merged percentiles are those of all the workers' records together, not averages
    for name, c in two["classes"].items():
        ttfts = [r["ttft"] for r in two["raw"] if r["cls"] == name and r["ok"]]
        exact = summarize(ttfts)
        assert exact is not None and c["ttft"]["p90"] == exact.p90
        assert c["ttft"]["count"] == len(ttfts)
    # and they match one process's within the histogram's resolution (vLLM's TTFT buckets)
    for q in ("p50", "p90"):
        a, b = one["overall"]["ttft"][q], two["overall"]["ttft"][q]
        assert abs(_bucket(a) - _bucket(b)) <= 1, (q, a, b)
