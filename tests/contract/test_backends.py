"""Every backend passes the same contract (tests/contract/backends.py)."""

from __future__ import annotations

import asyncio

import pytest

from chunktune.backends.local import LocalBackend
from chunktune.backends.simulated import SimulatedBackend, same_draw
from tests.contract.backends import BackendContract


class TestSimulated(BackendContract):
    @pytest.fixture
    def backend(self):
        return SimulatedBackend()


@pytest.mark.slow  # real sim serve processes
class TestLocal(BackendContract):
    @pytest.fixture
    def backend(self, tmp_path):
        b = LocalBackend(workdir=tmp_path, load_time=0.2)
        yield b
        asyncio.run(b.close())

    def test_sim_engine_step_log_is_kept(self, tmp_path):
        """A sim serve engine runs with --enable-logging-iteration-details, as vLLM does: the
        trial's result carries its steps and steps_dir keeps them."""
        from dataclasses import replace

        from chunktune.core.steps import read_step_log
        from tests.contract.backends import PROFILE, plan

        b = LocalBackend(workdir=tmp_path / "w", load_time=0.2, steps_dir=tmp_path / "steps")
        p = replace(plan(21), profile=PROFILE.with_overrides(duration=3, warmup=1, rate=6))
        assert "--enable-logging-iteration-details" in b.engine_command(p, 9999)
        try:
            r = self.run(b, p)
        finally:
            asyncio.run(b.close())
        assert r.state == "COMPLETE", (r.reason, r.message)
        assert len(r.steps) > 10 and [s.iteration for s in r.steps] == list(range(len(r.steps)))
        assert r.steps_file == str(tmp_path / "steps" / "contract-21-21.steps.jsonl")
        records, meta = read_step_log(r.steps_file)
        assert records == r.steps and meta.model == "llama-3.1-8b"

    def test_nothing_scrapes_the_engine_during_the_load(self, tmp_path, monkeypatch):
        """/metrics is scraped before and after the load only (a scrape stalls the API
        server's event loop, and the clients' ITL tail with it); the KV-usage peak comes from
        the step log, which has every step's usage."""
        import time
        from dataclasses import replace

        from chunktune.backends import local
        from chunktune.core.steps import kv_usage_peak
        from tests.contract.backends import PROFILE, plan

        calls: list[float] = []
        real_scrape = local.scrape

        async def counted(http, url):
            calls.append(time.monotonic())
            return await real_scrape(http, url)

        monkeypatch.setattr(local, "scrape", counted)
        b = LocalBackend(workdir=tmp_path, load_time=0.2)
        p = replace(plan(22), profile=PROFILE.with_overrides(duration=4, warmup=1, rate=6))
        try:
            r = self.run(b, p)
        finally:
            asyncio.run(b.close())
        assert r.state == "COMPLETE", (r.reason, r.message)
        assert r.load_seconds is not None and r.load_seconds > 3
        assert len(calls) == 2, calls  # one before the load, one after
        peak = kv_usage_peak(r.steps)
        assert peak is not None and peak > 0
        assert r.metrics["kv_cache_usage_peak"] == pytest.approx(peak)


def test_simulated_loads_score_the_mean_over_draws_of_the_workload(tmp_path) -> None:
    """``loads=K``: the trial replays K draws of the workload (seeds s, s+1, ...) and scores
    the mean of their metrics (what a twin-first search ranks by: a tail percentile of one
    draw lands on either side of a cliff); the first draw's step log is the one kept."""
    import dataclasses
    import statistics

    from tests.contract.backends import plan

    p = plan(1, **{"max-num-batched-tokens": 2048})
    single = [asyncio.run(SimulatedBackend().run_trial(dataclasses.replace(
        p, profile=dataclasses.replace(p.profile, seed=p.profile.seed + i))))
        for i in range(3)]
    assert len({r.metrics["itl_p99"] for r in single}) > 1  # the draws differ
    kept = SimulatedBackend(loads=3, keep_steps=True, steps_dir=tmp_path)
    r = asyncio.run(kept.run_trial(p))
    assert r.state == "COMPLETE"
    for k in ("itl_p99", "ttft_p99", "chat.ttft_p99", "throughput_tokens_per_s"):
        assert r.metrics[k] == pytest.approx(statistics.fmean(s.metrics[k] for s in single)), k
    # the profile's own draw (what a real trial of it runs) kept beside the mean
    assert r.metrics["draw0:itl_p99"] == single[0].metrics["itl_p99"]
    assert same_draw(r.metrics)["itl_p99"] == single[0].metrics["itl_p99"]
    assert not any(k.startswith("draw0:") for k in same_draw(r.metrics))
    assert r.steps is not None and len(list(tmp_path.iterdir())) == 1
    assert r.summary is not None and r.summary.seed == p.profile.seed
    # a point the engine refuses is refused once, as without draws
    bad = asyncio.run(kept.run_trial(plan(2, **{"max-num-batched-tokens": 8,
                                                 "max-num-seqs": 256})))
    assert bad.state == "INFEASIBLE"
