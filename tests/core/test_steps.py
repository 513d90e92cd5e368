"""vLLM's ``Iteration(N)`` step log: parsing real lines, storing and reading records."""

from __future__ import annotations

import pytest

from chunktune.core.steps import (
    StepRecord,
    StepSummary,
    iteration_lines,
    parse_line,
    parse_steps,
    read_steps,
    write_steps,
)

# Lines as vLLM 0.32's CPU build printed them (tiny model, --enable-logging-iteration-details).
REAL = """\
(APIServer pid=8177) INFO 12-03 00:25:09 [kv_cache_utils.py:2327] CPU KV cache size: 524,288 tokens
INFO:     Application startup complete.
(APIServer pid=8177) INFO 12-03 00:25:21 [loggers.py:199] Engine 000: Iteration(0): 1 context requests, 10 context tokens, 0 generation requests, 0 generation tokens, iteration elapsed time: 10.80 ms, CPU KV cache usage: 0.0%
(APIServer pid=8177) INFO 12-03 00:25:21 [loggers.py:199] Engine 000: Iteration(1): 0 context requests, 0 context tokens, 1 generation requests, 1 generation tokens, iteration elapsed time: 10.56 ms, CPU KV cache usage: 0.0%
INFO:     127.0.0.1:40000 - "POST /v1/completions HTTP/1.1" 200 OK
(APIServer pid=8177) INFO 12-03 00:25:21 [loggers.py:199] Engine 000: Iteration(2): 0 context requests, 0 context tokens, 1 generation requests, 1 generation tokens, iteration elapsed time: 4.01 ms, CPU KV cache usage: 0.0%
"""  # noqa: E501


def test_parse_real_lines():
    recs = parse_steps(REAL.splitlines())
    assert [r.iteration for r in recs] == [0, 1, 2]
    assert recs[0] == StepRecord(iteration=0, context_requests=1, context_tokens=10,
                                 generation_requests=0, generation_tokens=0, elapsed_ms=10.8,
                                 kv_usage_pct=0.0, engine=0)
    assert recs[1].tokens == 1 and recs[1].generation_requests == 1
    assert recs[2].elapsed_ms == 4.01


def test_gpu_line_and_other_engine():
    r = parse_line("Engine 001: Iteration(41): 2 context requests, 512 context tokens, "
                   "30 generation requests, 30 generation tokens, iteration elapsed time: "
                   "25.5 ms, GPU KV cache usage: 37.5%")
    assert r is not None
    assert (r.engine, r.iteration, r.tokens, r.kv_usage_pct) == (1, 41, 542, 37.5)


def test_non_iteration_lines_are_skipped():
    assert parse_line("INFO:     Application startup complete.") is None
    assert parse_line("Iteration(x): nonsense") is None
    assert len(list(iteration_lines(REAL.splitlines()))) == 3


def test_round_trip_jsonl_and_raw(tmp_path):
    recs = parse_steps(REAL.splitlines())
    p = write_steps(tmp_path / "steps.jsonl", recs)
    assert read_steps(p) == recs
    raw = tmp_path / "engine.log"
    raw.write_text(REAL)
    assert read_steps(raw) == recs


def test_summary():
    s = StepSummary.of(parse_steps(REAL.splitlines()))
    assert (s.steps, s.context_tokens, s.generation_tokens, s.max_step_tokens) == (3, 10, 2, 10)
    assert abs(s.total_elapsed_ms - 25.37) < 1e-9
    assert StepSummary.of([]).steps == 0


def test_engine_itl_weights_each_step_by_its_decodes() -> None:
    from chunktune.core.steps import StepRecord, engine_itl

    def step(ms: float, decodes: int) -> StepRecord:
        return StepRecord(iteration=0, context_requests=0, context_tokens=0,
                          generation_requests=decodes, generation_tokens=decodes,
                          elapsed_ms=ms)

    # 99 fast steps of one decode, one slow step that 50 requests waited on: the slow step
    # is a third of the tokens, so the p99 is its time (an unweighted p99 would miss it)
    steps = [step(2.0, 1) for _ in range(99)] + [step(40.0, 50)]
    assert engine_itl(steps) == pytest.approx(0.040)
    assert engine_itl(steps, 50) == pytest.approx(0.002)
    # prefill-only steps decode nothing: no ITL at all
    assert engine_itl([step(100.0, 0)]) is None


def test_outside_engine_flags_client_gaps_far_beyond_the_engines_steps() -> None:
    from chunktune.core.steps import outside_engine

    # measured on the real CPU engine: undisturbed 13.9 ms vs 11.9 ms; beside other work
    # 47.9 ms vs 13.2 ms
    assert outside_engine({"itl_p99": 0.0139, "engine_itl_p99": 0.0119}) is None
    why = outside_engine({"itl_p99": 0.0479, "engine_itl_p99": 0.0132})
    assert why is not None and "47.9 ms" in why and "13.2 ms" in why
    assert outside_engine({"itl_p99": 0.05}) is None  # no step log, no judgement


def test_tokens_delivered_in_bursts_are_the_hosts() -> None:
    from chunktune.core.steps import host_added, outside_engine

    # the sixth bench session, vLLM's defaults on the CPU engine while tests ran beside it:
    # ITL p50 0.0 ms, p99 7.6 ms against the engine's 7.8 ms, TTFT p50 117.7 ms (13-15 ms
    # undisturbed); the ITL p99 rule alone does not see it
    burst = {"itl_p50": 0.0, "itl_p99": 0.0076, "engine_itl_p99": 0.0078, "ttft_p50": 0.1177}
    why = outside_engine(burst)
    assert why is not None and "ITL p50 0.0 ms" in why and "bursts" in why
    # on a cliff too: the cliff explains a p99, not tokens arriving together
    assert host_added(burst, (0.0078, 0.200)) == why
    # undisturbed: ITL p50 2.6 ms
    assert outside_engine({**burst, "itl_p50": 0.0026, "ttft_p50": 0.0135}) is None
    # no step log, no judgement
    assert outside_engine({"itl_p50": 0.0, "itl_p99": 0.0076}) is None


def test_host_added_spares_a_clients_p99_the_engines_own_band_explains() -> None:
    from chunktune.core.steps import host_added

    # session 6's vLLM defaults on the CPU engine: clients 51.9 ms against the engine's 16.6 ms
    # at p99, but the engine's own ITL ran 16.6-212 ms across p98.5-p99.5 (a cliff): the
    # clients' p99 landed on its long steps, no host needed
    cliff = {"itl_p99": 0.0519, "engine_itl_p99": 0.0166}
    assert host_added(cliff, (0.0166, 0.212)) is None
    # the same figures with no band, or a band without a cliff, or a clients' p99 beyond the
    # band's top: the host added it
    assert host_added(cliff, None) is not None
    assert host_added(cliff, (0.0150, 0.0180)) is not None
    assert host_added({"itl_p99": 0.300, "engine_itl_p99": 0.0166}, (0.0166, 0.212)) is not None
    # nothing flagged in the first place
    assert host_added({"itl_p99": 0.017, "engine_itl_p99": 0.0166}, None) is None


def test_kv_usage_peak_is_the_largest_step_usage_as_a_fraction() -> None:
    from chunktune.core.steps import kv_usage_peak

    def step(pct: float | None) -> StepRecord:
        return StepRecord(iteration=0, context_requests=1, context_tokens=8,
                          generation_requests=0, generation_tokens=0, elapsed_ms=1.0,
                          kv_usage_pct=pct)

    # vLLM logs percent; the metric (like the vllm:kv_cache_usage_perc gauge) is a fraction
    assert kv_usage_peak([step(0.0), step(37.5), step(None), step(12.0)]) == pytest.approx(0.375)
    assert kv_usage_peak([step(None)]) is None and kv_usage_peak([]) is None


def _decodes(ms: float, n: int, decodes: int = 1) -> list[StepRecord]:
    return [StepRecord(iteration=0, context_requests=0, context_tokens=0,
                       generation_requests=decodes, generation_tokens=decodes, elapsed_ms=ms)
            for _ in range(n)]


def test_itl_band_finds_a_p99_on_a_cliff() -> None:
    """About 1% of the tokens waiting on long steps puts the p99 on a cliff: half a percentile
    either side lands on a decode step (10 ms) and on a long step (150 ms)."""
    from chunktune.core.steps import itl_band, on_cliff

    cliff = _decodes(10.0, 990) + _decodes(150.0, 10)
    band = itl_band(cliff)
    assert band == (pytest.approx(0.010), pytest.approx(0.150))
    why = on_cliff(band)
    assert why is not None and "10.0 ms at p98.5" in why and "150.0 ms at p99.5" in why
    # well clear of 1%: a stable p99 either way, whatever the long steps take
    assert on_cliff(itl_band(_decodes(10.0, 1000))) is None
    assert on_cliff(itl_band(_decodes(10.0, 950) + _decodes(150.0, 50))) is None
    assert itl_band(_decodes(10.0, 5, decodes=0)) is None and on_cliff(None) is None


def test_a_record_of_another_kind_is_named_briefly(tmp_path) -> None:
    """A model's config.json given as a steps file: the error names a few of its keys and how
    many there were, not every one."""
    import json

    from chunktune.core.steps import read_step_log

    keys = {f"field_{c}": 1 for c in "abcdefghijklmnopqrst"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(keys) + "\n")
    with pytest.raises(ValueError) as e:
        read_step_log(path)
    msg = str(e.value)
    assert "field_a, field_b, field_c, field_d, field_e (of 20)" in msg
    assert "field_f" not in msg
