"""``load run`` end to end against the fake server: timing, arrivals, warm-up, failures, drain.

Each run starts a real Locust child process; durations are a few seconds.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from chunktune.core.summary import SUMMARY_JSON_SCHEMA, LoadSummary, Window
from chunktune.core.workload import generate, parse_profile
from chunktune.load.cli import main
from chunktune.load.config import DriverConfig
from chunktune.load.launcher import LoadRunError, Progress, run_load
from tests.load.conftest import profile_dict
from tests.load.fake_openai import FakeServer
from tests.timing import SchedulingNoise, retry_timing, timing

pytestmark = pytest.mark.slow


def cfg_for(server: FakeServer, profile: dict, **kw: object) -> DriverConfig:
    return DriverConfig(target=server.url, model="fake-model", profile=profile,
                        **kw)  # type: ignore[arg-type]


def at(x: float | None) -> float:
    assert x is not None
    return x


def q(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p))]


TICK = 0.01


class TickLateness:
    """How late the driver's own progress ticker woke (it sleeps until ``t + TICK``): the
    wake-up delay that the driver process itself suffered in the same run, from its own event
    loop and the machine. Used as ``on_progress`` with ``tick=TICK``."""

    def __init__(self) -> None:
        self.elapsed: list[float] = []

    def __call__(self, p: Progress) -> None:
        self.elapsed.append(p.elapsed)

    def q(self, p: float) -> float:
        late = [max(0.0, b - a - TICK) for a, b in itertools.pairwise(self.elapsed)]
        return q(late, p) if late else 0.0


def test_open_loop_timing_arrivals_and_warmup(server: FakeServer) -> None:
    retry_timing(lambda: _open_loop_run(server))


def _open_loop_run(server: FakeServer) -> None:
    server.reset()
    server.control(ttft=0.03, itl=0.004)
    prof = profile_dict(rate=40.0, duration=4.0, warmup=1.0)
    windows: list[Window] = []
    # Every bound below is a budget plus the wake-up delay the same processes showed in the
    # same seconds (about 0 when idle): the driver's own ticker for the driver, and a probe
    # process for the fake server's. A busy CPU delays them all alike; a burst that hits the
    # run but not them is what the bounded retry of the timing checks is for.
    ticks = TickLateness()
    with SchedulingNoise() as probe:
        s = run_load(cfg_for(server, prof, window=1.0, tick=TICK), raw=True,
                     on_window=windows.append, on_progress=ticks)
    n50, n95 = (max(probe.q(p), ticks.q(p)) for p in (0.5, 0.95))
    # The longest the driver itself was stalled (its ticker's worst wake-up): every request due
    # in such a stall is sent that much late, so the lag's tail can be no better.
    stall = ticks.q(1.0)
    # A token's way from the server to the client crosses both processes' wake-ups.
    d90, d99 = (probe.q(p) + ticks.q(p) for p in (0.9, 0.99))
    noise = (f"driver ticks late p50/p90/p95 {ticks.q(0.5) * 1e3:.2f}/{ticks.q(0.9) * 1e3:.2f}/"
             f"{ticks.q(0.95) * 1e3:.2f} ms over {len(ticks.elapsed)} ticks; {probe}")
    specs = generate(parse_profile(prof))
    srv = {r["rid"]: r for r in server.stats()["requests"]}
    assert s.raw is not None
    raw = {r.rid: r for r in s.raw}

    # Every scheduled request was sent once, on time, and only those.
    assert sorted(raw) == [sp.rid for sp in specs] == sorted(srv)
    lags = [r.start - at(r.arrival) for r in raw.values()]
    assert min(lags) >= -1e-4  # never early
    timing(q(lags, 0.95) < 0.005 + max(n95, stall), q(lags, 0.95), stall, noise)
    # Poisson: the server saw the scheduled arrivals (up to jitter) at about the asked rate.
    offset = statistics.median(srv[i]["arrival"] - at(raw[i].arrival) for i in raw)
    drift = [abs(srv[i]["arrival"] - at(raw[i].arrival) - offset) for i in raw]
    timing(q(drift, 0.95) < 0.008 + 2 * max(n95, stall), q(drift, 0.95), stall, noise)
    n = len(specs)
    assert abs(n - 40 * 4) < 4 * (40 * 4) ** 0.5
    gaps = [at(b.arrival) - at(a.arrival) for a, b in itertools.pairwise(specs)]
    cv = statistics.pstdev(gaps) / statistics.mean(gaps)
    assert 0.75 < cv < 1.25  # exponential inter-arrivals
    measured = [sp for sp in specs if at(sp.arrival) >= 1.0]
    assert s.overall.throughput.sent_rate == pytest.approx(len(measured) / 3.0)

    # Warm-up: arrivals before 1 s are in raw but not in the results.
    assert s.overall.requests.sent == len(measured) == s.overall.requests.ok
    assert {r.rid for r in s.raw if r.warmup} == {sp.rid for sp in specs if at(sp.arrival) < 1}
    assert s.classes["long"].requests.sent + s.classes["chat"].requests.sent == len(measured)

    # Request bodies and lengths: what was drawn is what was asked for and counted.
    for sp in specs:
        r, sv = raw[sp.rid], srv[sp.rid]
        assert r.ok, (r.reason, r.error)
        assert sv["max_tokens"] == sv["min_tokens"] == sp.output_tokens == r.output_tokens
        assert sv["ignore_eos"] is True and sv["stream"] is True
        assert sv["stream_options"] == {"include_usage": True}
        assert sv["path"] == ("/v1/chat/completions" if r.cls == "chat" else "/v1/completions")
        expect = max(sp.prompt_tokens, 8) if r.cls == "chat" else sp.prompt_tokens
        assert sv["prompt_tokens"] == r.prompt_tokens == expect

    # Client timing agrees with the server's within a few ms.
    ttft_err = [at(raw[i].ttft) - srv[i]["ttft"] for i in raw]
    timing(statistics.median(ttft_err) < 0.003 + d90, statistics.median(ttft_err), noise)
    # (The server stamps a token after its write returns, so a server descheduled right then can
    # even make the client look faster: only the bulk is checked, not the extremes.)
    timing(q(ttft_err, 0.9) < 0.006 + d99 and q(ttft_err, 0.05) > -0.001 - n50,
           q(ttft_err, 0.9), q(ttft_err, 0.05), noise)
    itl_err = []
    for i in raw:
        tt = srv[i]["token_times"]
        itl_err += [abs(c - (b - a)) for c, a, b in zip(raw[i].itl, tt[:-1], tt[1:], strict=True)]
    timing(statistics.median(itl_err) < 0.001 + d90 and q(itl_err, 0.9) < 0.003 + d99, noise)
    assert s.overall.itl is not None and s.overall.tpot is not None
    assert s.overall.ttft is not None
    timing(abs(s.overall.itl.p50 - 0.004) <= 0.001 + d90, s.overall.itl.p50, noise)
    timing(abs(s.overall.tpot.p50 - 0.004) <= 0.001 + d90, s.overall.tpot.p50, noise)
    timing(abs(s.overall.ttft.p50 - 0.03) <= 0.004 + d90, s.overall.ttft.p50, noise)

    # Windows: one per second of the arrival window; together they hold the ok requests
    # that ended before its end.
    assert [(w.start, w.end) for w in windows] == [(0.0, 1.0), (1.0, 2.0), (2.0, 3.0),
                                                   (3.0, 4.0)]
    assert s.windows == windows and windows[0].warmup and not windows[1].warmup
    assert sum(w.overall.requests.ok for w in windows) == sum(
        1 for r in s.raw if r.end < 4.0)
    assert sum(w.overall.requests.sent for w in windows) == len(specs)
    assert s.complete
    timing(s.duration.drain < 1.0, s.duration.drain)


def test_concurrency_holds_n_in_flight(server: FakeServer) -> None:
    retry_timing(lambda: _concurrency_run(server))


def _concurrency_run(server: FakeServer) -> None:
    server.reset()
    server.control(ttft=0.01, itl=0.003)
    prof = profile_dict(rate=None, concurrency=6, duration=2.5, warmup=0.5)
    ticks = TickLateness()
    with SchedulingNoise() as probe:
        s = run_load(cfg_for(server, prof, tick=TICK), raw=True, on_progress=ticks)
    st = server.stats()
    assert st["max_inflight"] == 6
    reqs = st["requests"]
    t0 = min(r["arrival"] for r in reqs)
    # Time-averaged requests in flight over the steady part of the run: a slot is empty only
    # for the client's and server's per-request overhead (~2 ms of each ~50 ms request here;
    # up to 8 ms allowed), plus the wake-up delays of the driver and the server processes
    # measured meanwhile (about 0 when idle).
    lo, hi = t0 + 0.3, t0 + 2.2
    busy = sum(max(0.0, min(r["end"], hi) - max(r["arrival"], lo)) for r in reqs)
    cycle = statistics.median(r["end"] - r["arrival"] for r in reqs)
    gap = 0.008 + 2 * (ticks.q(0.9) + probe.q(0.9))
    timing(busy / (hi - lo) > 6 * cycle / (cycle + gap), busy / (hi - lo), cycle, gap)
    assert s.raw is not None
    assert all(r.arrival is None for r in s.raw)
    # Warm-up is decided when the driver dispatches a request; ``start`` is when it was sent,
    # a little later on a busy machine: a request sent before 0.5 s is warm-up, and one
    # marked warm-up was sent soon after 0.5 s at the latest.
    warm = {r.rid for r in s.raw if r.warmup}
    assert {r.rid for r in s.raw if r.start < 0.5} <= warm
    assert all(r.start < 0.75 for r in s.raw if r.warmup)
    assert s.overall.requests.sent == sum(1 for r in s.raw if not r.warmup)
    assert s.overall.requests.failed == 0
    assert s.arrival.mode == "concurrency" and s.arrival.concurrency == 6
    # Class mix is per request, by weight (0.3 / 0.7).
    share = s.classes["long"].requests.sent / s.overall.requests.sent
    assert 0.15 < share < 0.45


def test_failure_reasons_and_drain_timeout(server: FakeServer) -> None:
    retry_timing(lambda: _failures_run(server))


def _failures_run(server: FakeServer) -> None:
    server.reset()
    server.control(ttft=0.01, itl=0.005, fail_every=5, close_every=7, close_after=2,
                   hang_every=11, hang_itl=30.0, short_every=13)
    prof = profile_dict(rate=25.0, duration=2.0)
    t = time.perf_counter()
    s = run_load(cfg_for(server, prof, drain_timeout=1.0), raw=True)
    took = time.perf_counter() - t
    assert s.raw is not None
    for r in s.raw:
        if r.rid % 5 == 0:
            assert r.reason == "http_400" and r.status == 400
            assert r.error == f"fake failure for request {r.rid}"
        elif r.rid % 7 == 0:
            assert r.reason == "connection_error", (r.rid, r.reason, r.error)
            assert "mid-stream" in (r.error or "")
        elif r.rid % 11 == 0:
            assert r.reason == "timeout" and "drain timeout" in (r.error or "")
        elif r.rid % 13 == 0:
            assert r.reason == "short_response"
        else:
            assert r.ok, (r.rid, r.reason, r.error)
    f = s.overall.failures
    n = len(s.raw)
    assert f["http_400"].count == len([i for i in range(n) if i % 5 == 0])
    assert s.overall.requests.failed == sum(v.count for v in f.values())
    assert s.duration.drain >= 1.0 - 0.05, s.duration.drain  # it waited for the timeout
    timing(s.duration.drain < 1.0 + 0.3, s.duration.drain)  # and no longer
    # Arrival window + drain + process start and teardown (seconds on a busy machine): far
    # below the 30 s that the hanging requests would take without the drain timeout.
    assert took < 2.0 + 1.0 + 10.0


def test_unreachable_target_fails_requests_not_the_run() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cfg = DriverConfig(target=f"http://127.0.0.1:{port}", model="m",
                       profile=profile_dict(rate=10.0, duration=0.5))
    s = run_load(cfg)
    assert s.overall.requests.ok == 0 and s.overall.requests.sent > 0
    assert set(s.overall.failures) == {"connection_error"}


def test_stop_early_from_a_window(server: FakeServer) -> None:
    prof = profile_dict(rate=20.0, duration=30.0)
    t = time.perf_counter()
    s = run_load(cfg_for(server, prof, window=0.5), on_window=lambda w: w.index < 1)
    assert time.perf_counter() - t < 15.0  # of a 30 s run (process start: seconds if busy)
    assert not s.complete and len(s.windows) == 2
    assert s.duration.measured < 5.0


def test_bad_profile_is_reported() -> None:
    cfg = DriverConfig(target="http://127.0.0.1:9", model="m", profile={"classes": []})
    with pytest.raises(Exception, match="classes"):
        run_load(cfg)


def test_cli_run_writes_a_valid_summary(server: FakeServer, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump(profile_dict(rate=10.0, duration=5.0)))
    out, wout = tmp_path / "out" / "r.json", tmp_path / "w.jsonl"
    rc = main(["load", "run", "--target", server.url, "--profile", str(prof),
               "--duration", "2s", "--warmup", "500ms", "--rate", "15", "--seed", "3",
               "--out", str(out), "--windows", "1", "--windows-out", str(wout), "--raw",
               "--slo", "ttft=0.5", "--slo", "long:e2e=0.001"])
    assert rc == 0
    d = json.loads(out.read_text())
    jsonschema.validate(d, SUMMARY_JSON_SCHEMA)
    s = LoadSummary.from_dict(d)
    assert s.model == "fake-model"  # from GET /v1/models
    assert s.arrival.rate == 15.0 and s.seed == 3 and s.duration.configured == 2.0
    assert s.duration.warmup == 0.5 and s.raw is not None
    assert s.goodput is not None and s.goodput.classes["long"].fraction == 0.0
    assert s.goodput.classes["chat"].fraction == 1.0
    lines = [json.loads(x) for x in wout.read_text().splitlines()]
    assert [w["index"] for w in lines] == [0, 1]
    assert [Window.from_dict(w) for w in lines] == s.windows
    err = capsys.readouterr().err
    assert "TTFT p50" in err and "summary written to" in err


def test_cli_argument_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--target", "http://127.0.0.1:9", "--profile", "smoke",
                 "--duration", "5s", "--warmup", "5s"]) == 2
    assert "--warmup" in capsys.readouterr().err
    assert main(["run", "--target", "http://127.0.0.1:9", "--profile", "nope"]) == 2
    assert main(["run", "--target", "http://127.0.0.1:9", "--slo", "ttft"]) == 2
    # Nothing listens on port 9: model discovery fails before any load.
    assert main(["run", "--target", "http://127.0.0.1:9", "--profile", "smoke"]) == 1
    assert "cannot list models" in capsys.readouterr().err


def test_load_run_error_type() -> None:
    assert issubclass(LoadRunError, Exception)


def test_locustfile_headless(server: FakeServer, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    import chunktune

    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump(profile_dict(rate=10.0, duration=1.5)))
    out = tmp_path / "lf.json"
    env = {**os.environ, "PYTHONPATH": str(Path(chunktune.__file__).parents[1]),
           "CHUNKTUNE_PROFILE": str(prof)}
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "locust", "-f", str(root / "loadtest" / "locustfile.py"),
         "--headless", "-u", "1", "-r", "1", "--host", server.url, "--only-summary",
         "--chunktune-out", str(out), "--csv", str(tmp_path / "csv")],
        env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = LoadSummary.from_dict(json.loads(out.read_text()))
    assert s.overall.requests.ok == len(generate(parse_profile(profile_dict(rate=10.0,
                                                                            duration=1.5))))
    stats = (tmp_path / "csv_stats.csv").read_text()
    assert "ttft" in stats and "e2e" in stats and "chat" in stats


KILLED_DRIVER = """
import json, os, signal, sys, threading
from chunktune.load.config import DriverConfig
from chunktune.load.launcher import run_load

cfg = DriverConfig.from_dict(json.loads(sys.argv[1]))
running = threading.Event()
threading.Thread(target=run_load, args=(cfg,), kwargs={"on_progress": lambda p: running.set()},
                 daemon=True).start()
if not running.wait(120):
    sys.exit(3)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_driver_killed_mid_run_leaves_nothing_on_disk(server: FakeServer, tmp_path: Path
                                                         ) -> None:
    """An operator pod or a CLI killed with SIGKILL runs no clean-up: the run's configuration
    reaches the Locust child on its stdin, so no file of the run is left in the temporary
    directory (it left one per run when it was a file)."""
    server.reset()
    server.control(ttft=0.01, itl=0.005)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    cfg = cfg_for(server, profile_dict(rate=5.0, duration=60.0))
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TMPDIR": str(tmp),
           "PYTHONPATH": os.pathsep.join([str(repo / "operator"), str(repo)])}
    r = subprocess.run([sys.executable, "-c", KILLED_DRIVER, json.dumps(cfg.to_dict())],
                       env=env, timeout=180)
    assert r.returncode == -9  # it got as far as a running load, then was killed
    assert list(tmp.iterdir()) == []
