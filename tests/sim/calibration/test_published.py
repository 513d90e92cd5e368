"""GPUStack's published vLLM runs replayed (``python bench/published_runs.py`` prints the
figures): the table reads, each client and engine is taken as the docs ran it, what the
simulator does not model is refused by name, and the synchronous TP 1 decode runs stay where
they are (held out: nothing was fitted on them)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from chunktune.core.errors import SpecError
from chunktune.sim.calibration import published
from chunktune.sim.cost import provenance

#: The replays (module fixture) take under a minute of one CPU (gpt-oss's KV-bound bursts
#: over its two KV-cache groups the longest); a busy CI machine may take several times that.
pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="module")
def runs() -> list[published.PublishedRun]:
    return published.read_runs()


@pytest.fixture(scope="module")
def replays(runs) -> list[published.PublishedReplay]:
    return [published.replay(r) for r in runs]


def test_the_table_reads(runs):
    assert len(runs) >= 90
    assert {r.client for r in runs} == set(published.CLIENTS)
    for r in runs:
        assert r.source.endswith(".md") and len(r.source.split("/")) == 2
        assert (r.client == "closed") == (r.concurrency is not None)
        assert r.prompt_len > 0 and r.output_len > 0 and r.tpot_s > 0
    # a measurement printed under two headings (the engine-choice run reused as a baseline)
    # is kept once
    keys = [(r.source, r.args, r.client, r.concurrency, r.requests, r.input_tokens,
             r.duration_s) for r in runs]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize(("row", "what"), [
    ("x,1,h100-sxm,H100,0.11.0,Qwen/Qwen3-8B,,,burst,,ten,1,1,1,1,1,1,case",
     "column requests"),
    ("x,1,h100-sxm,H100,0.11.0,Qwen/Qwen3-8B,,,open,,10,1,1,1,1,1,1,case", "column client"),
    ("x,1,h100-sxm,H100,0.11.0,Qwen/Qwen3-8B,,,closed,,10,1,1,1,1,1,1,case",
     "column concurrency"),
    ("x,1,h100-sxm,H100,0.11.0,Qwen/Qwen3-8B,,,burst,,10,1,1,nan,1,1,1,case",
     "column duration_s"),
    ("x,1,h100-sxm,H100,0.11.0,Qwen/Qwen3-8B,\"-tp 'x\",,burst,,10,1,1,1,1,1,1,case",
     "column args or env"),
    ("x,1,h100-sxm,H100,0.11.0,Qwen/Qwen3-8B,,,burst,,10,1,1,1,1,1", "columns"),
])
def test_a_malformed_row_is_named_not_echoed(tmp_path: Path, row: str, what: str):
    path = tmp_path / "runs.csv"
    path.write_text("# comment\n" + ",".join(published.COLUMNS) + "\n" + row + "\n")
    with pytest.raises(SpecError) as e:
        published.read_runs(path)
    text = str(e.value)
    assert str(path) in text and "line 3" in text and what in text
    assert "Qwen3-8B" not in text  # the row's text is not echoed


def test_a_wrong_header_is_named(tmp_path: Path):
    path = tmp_path / "runs.csv"
    path.write_text("source,gpu\nx,h100-sxm\n")
    with pytest.raises(SpecError, match="the header is not"):
        published.read_runs(path)


def test_clients_send_as_vllm_bench_serve_does(runs):
    burst = next(r for r in runs if r.client == "burst")
    specs = published.requests(burst)
    assert len(specs) == burst.requests
    assert all(s.arrival == 0.0 for s in specs)  # request rate inf: all at once
    closed = next(r for r in runs if r.client == "closed")
    specs = published.requests(closed)
    assert closed.concurrency is not None
    assert [s.arrival for s in specs[:closed.concurrency]] == [0.0] * closed.concurrency
    assert all(s.arrival is None for s in specs[closed.concurrency:])
    assert {(s.prompt_tokens, s.output_tokens) for s in specs} == {
        (closed.prompt_len, closed.output_len)}


def test_engines_take_the_docs_release_flags_and_gpu(runs):
    r = next(r for r in runs if r.source == "gpt-oss-120b/h100.md" and "-tp" in r.args)
    args, model, gpu, version = published.engine(r)
    assert (args.tensor_parallel_size, args.async_scheduling) == (2, True)
    assert (model.hf_name, gpu.name, version) == ("openai/gpt-oss-120b", "h100-sxm",
                                                  (0, 10, 2))
    r = next(r for r in runs if r.source.startswith("qwen3-235b") and r.model.endswith("2507"))
    _, model, _, _ = published.engine(r)
    assert model.max_position_embeddings == 262144  # the 2507 release's own length


def test_synchronous_tp1_decode_stays_where_it_is(runs):
    """vLLM 0.11 (synchronous) serving Qwen3-8B on one H100 SXM at 1-8 in flight: the
    simulated TPOT 3.4-6.1% slower than GPUStack's measured 7.3-7.7 ms (held out)."""
    qwen = [r for r in runs if r.source == "qwen3-8b/h100-latency.md"]
    assert sorted(r.concurrency or 0 for r in qwen) == [1, 2, 4, 8]
    for r in qwen:
        rep = published.replay(r)
        assert rep.skipped is None and rep.refused is None
        err = rep.error("tpot")
        assert err is not None and -0.02 < err < 0.09, (r.name, err)
        duration = rep.error("duration")
        assert duration is not None and abs(duration) < 0.05, (r.name, duration)


def test_what_is_not_modelled_is_refused_by_name(runs):
    dsa = next(r for r in runs if r.model == "deepseek-ai/DeepSeek-V3.2")
    # its frontend flags (--tokenizer-mode, --reasoning-parser) are not what refuses it
    assert "DSA" in (published.replay(dsa).skipped or "")
    glm = next(r for r in runs if r.model == "zai-org/GLM-4.6")
    other = dataclasses.replace(glm, model="zai-org/GLM-4.5")
    assert published.replay(other).skipped == "no config.json of zai-org/GLM-4.5 here"
    qwen = next(r for r in runs if r.source == "qwen3-8b/h100-latency.md")
    piped = dataclasses.replace(qwen, args=("-pp", "2"))
    assert published.replay(piped).skipped == "--pipeline-parallel-size is not modelled"


def test_a_start_up_refusal_is_reported_and_the_run_replayed(runs):
    """Qwen3-235B-A22B-Instruct-2507 (bf16, 262,144 positions) on 8 x H100: vLLM 0.11 started
    it; the simulated profile leaves 11.07 GiB where one such request needs 11.75 GiB. The
    replay goes on at the length vLLM's message estimates, with the same KV cache."""
    r = next(r for r in runs if r.source == "qwen3-235b-a22b/h100.md" and r.args == ("-tp", "8")
             and r.prompt_len > 30000)
    rep = published.replay(r)
    assert rep.skipped is None
    assert rep.refused is not None and "MaxModelLenTooLarge" in rep.refused
    assert "247,040" in rep.refused


def test_the_committed_figures_are_what_the_model_measures(replays):
    """``published_fidelity.json`` (what the cost-model line quotes of a model's published
    runs) is what the committed simulator measures: rewrite it with ``python
    bench/published_runs.py --write-fidelity`` after a model change."""
    table = published.fidelity_table(replays)
    assert table == provenance.published_fidelity()
    burst = next(m for m in table["h100-sxm"]
                 if m["model"] == "gpt-oss-120b" and m["client"] == "burst")
    assert burst["runs"] == 8 and burst["vllm"] == ["0.10.2"]


def test_the_twin_ranks_the_docs_serving_commands_as_measured(replays):
    """Each doc's workload under two serving commands (async scheduling and a smaller budget,
    TP 2 for TP 1, TP 4 FP8 for TP 8 bf16): the simulator picks the faster one as the runs
    did in 24 of 26 pairs (duration); the two it does not: a measured tie (gpt-oss-20b,
    32,000-token prompts, +0.0%) and Qwen3-235B's 128-token burst of 984 requests, whose
    duration the API server's handling of the requests sets more than the steps.
    gpt-oss-120b's 2,000-token burst on the A100 (async and a 4,096 budget 8.6% sooner
    measured) agrees since its two KV-cache groups are counted as vLLM counts them (3.2%
    sooner simulated; a tie when they were counted as full-attention blocks)."""
    ps = published.pairs(replays, "duration")
    assert len(ps) == 26
    wrong = sorted((p.first.run.source, p.first.run.case) for p in ps if not p.agrees)
    assert wrong == [("gpt-oss-20b/h100.md", "random 32K input"),
                     ("qwen3-235b-a22b/h100.md", "random 128 input")]
    tie = next(p for p in ps if p.first.run.source == "gpt-oss-20b/h100.md" and not p.agrees)
    assert abs(tie.measured) < 0.01
    # TP 2 (async) for TP 1 (sync) on the H100: gpt-oss-120b's 4,000-token bursts finish 59%
    # sooner measured, 65% simulated, while their TPOT grows 5x (more requests fit the KV cache,
    # so more of each step is prefill): the twin has both
    tp2 = next(p for p in published.pairs(replays, "tpot")
               if p.first.run.source == "gpt-oss-120b/h100.md"
               and p.first.run.case == "random 4K input")
    assert tp2.measured > 3 and tp2.simulated > 3
