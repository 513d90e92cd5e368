"""One trace, one set of requests: ``chunktune sim run`` and the load driver against
``chunktune sim serve`` replay the same requests, and every path counts a run the same way.

The bound on arrival times: the load driver sends each request at its trace arrival time, late
by no more than its own process's wake-up delays in the same run (its progress ticker's
lateness, and a probe process's for the machine), plus 5 ms: 95 % of the sends within that.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from bench.serve_overhead import start_server

from chunktune.cli import main
from chunktune.core.workload import generate, load_profile
from chunktune.load.config import DriverConfig
from chunktune.load.launcher import run_load
from tests.load.test_e2e import TICK, TickLateness, q
from tests.timing import SchedulingNoise, retry_timing, timing

pytestmark = pytest.mark.slow  # Locust against a real sim serve process

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "traces" / "azure-conv-sample.csv"
ENGINE = ["--max-model-len", "16384"]


@pytest.fixture(scope="module")
def served():
    with start_server("llama-3.1-8b", [*ENGINE, "--served-model-name", "llama"]) as srv:
        yield srv


@pytest.fixture
def trace_profile_file(tmp_path: Path) -> Path:
    """30 s of the Azure sample at twice its speed, split in a chat class (prompts up to 1024
    tokens) and a completions class with priority 1."""
    path = tmp_path / "azure.yaml"
    path.write_text(yaml.safe_dump({
        "name": "azure-sample", "warmup": "2s",
        "trace": {"file": str(SAMPLE), "end": "30s", "speedup": 2, "classes": [
            {"name": "short", "api": "chat", "max_prompt_tokens": 1024},
            {"name": "long", "priority": 1}]}}))
    return path


def rows(records: list[dict]) -> list[tuple]:
    return sorted((r["rid"], r["cls"], r["arrival"], r["prompt_tokens"], r["max_tokens"],
                   r["output_tokens"], r["ok"], r["warmup"]) for r in records)


def test_a_trace_replays_the_same_requests_in_the_simulator_and_the_load_driver(
        served, trace_profile_file, tmp_path, capsys):
    sim_json = tmp_path / "sim.json"
    assert main(["sim", "run", "--workload", str(trace_profile_file), *ENGINE, "--json",
                 str(sim_json), "--raw"]) == 0
    capsys.readouterr()
    sim = json.loads(sim_json.read_text())
    profile = load_profile(trace_profile_file)
    specs = generate(profile)

    def replay() -> dict:
        ticks = TickLateness()
        cfg = DriverConfig(target=served.url, model="llama", profile=profile.to_dict(),
                           tick=TICK)
        with SchedulingNoise() as probe:
            s = run_load(cfg, raw=True, on_progress=ticks).to_dict()
        lags = [r["start"] - r["arrival"] for r in s["raw"]]
        assert min(lags) >= -1e-4  # never early
        n95, stall = max(probe.q(0.95), ticks.q(0.95)), ticks.q(1.0)
        timing(q(lags, 0.95) < 0.005 + max(n95, stall), q(lags, 0.95), stall, probe)
        return s

    load = retry_timing(replay)
    # The same requests: ids, classes, scheduled arrivals, prompt and output tokens (the
    # prompt tokens as sim serve counted them), all finished, the same warm-up ones.
    assert len(specs) == len(sim["raw"]) == len(load["raw"]) == 135
    assert rows(sim["raw"]) == rows(load["raw"])
    assert [(r["arrival"], r["prompt_tokens"], r["max_tokens"]) for r in
            sorted(load["raw"], key=lambda r: r["rid"])] == \
        [(s.arrival, s.prompt_tokens, s.output_tokens) for s in specs]
    for summary in (sim, load):
        assert summary["arrival"]["mode"] == "trace"
        assert summary["overall"]["requests"] == sim["overall"]["requests"]
        assert summary["overall"]["requests"]["failed"] == 0
        assert {k: v["requests"] for k, v in summary["classes"].items()} == \
            {k: v["requests"] for k, v in sim["classes"].items()}
    # the simulator sends on time by construction; the load driver reports how late it sent
    assert sim["schedule"]["send_lag"]["max"] == 0.0
    assert load["schedule"]["send_lag"]["count"] == 135


def test_a_closed_loop_run_counts_in_flight_requests_alike_everywhere(served, tmp_path, capsys):
    """Requests still in flight when the arrival window ends are drained, not failed, in
    ``sim run``, in the tuner's simulated backend and in the load driver."""
    out = tmp_path / "sim.json"
    assert main(["sim", "run", "--workload", "chat", "--concurrency", "16", "--duration", "8",
                 "--warmup", "1", *ENGINE, "--json", str(out)]) == 0
    capsys.readouterr()
    sim = json.loads(out.read_text())
    assert sim["overall"]["requests"]["failed"] == 0 and sim["duration"]["drain"] > 0
    profile = load_profile("chat").with_overrides(concurrency=16, duration=4, warmup=1)
    s = run_load(DriverConfig(target=served.url, model="llama", profile=profile.to_dict()),
                 raw=True)
    assert s.raw is not None and len(s.raw) > 16
    assert s.overall.requests.failed == 0 and s.overall.requests.sent == \
        s.overall.requests.ok
    assert s.duration.drain > 0  # the last wave finished after the window, and counts


def test_trace_priorities_and_classes_reach_the_server(server, tmp_path):
    """A generic trace's class and priority columns: each request goes out with its row's
    priority (its class's where the row has none), on its class's API."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival,prompt_tokens,output_tokens,class,priority\n" + "".join(
        f"{i * 0.1:.1f},{20 + i},{2 + i % 3},{'bg' if i % 2 else 'ui'},"
        f"{'' if i % 4 == 3 else i % 3}\n" for i in range(12)))
    profile = load_profile(_profile_file(tmp_path, {
        "name": "p", "trace": {"file": str(trace), "classes": [
            {"name": "ui", "api": "chat"}, {"name": "bg", "priority": 7}]}}))
    s = run_load(DriverConfig(target=server.url, model="fake-model",
                              profile=profile.to_dict()), raw=True)
    assert s.overall.requests.failed == 0 and s.overall.requests.ok == 12
    seen = {r["rid"]: r for r in server.stats()["requests"]}
    for spec in generate(profile):
        got = seen[spec.rid]
        assert got["priority"] == (spec.priority or None)  # 0 is not sent
        assert spec.priority == (7 if spec.rid % 4 == 3 else spec.rid % 3)
        assert got["path"] == ("/v1/chat/completions" if spec.cls == 0 else "/v1/completions")
        assert got["prompt_tokens"] == spec.prompt_tokens
        assert got["max_tokens"] == spec.output_tokens


def _profile_file(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path
