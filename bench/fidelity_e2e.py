"""Real vLLM serving runs replayed through the simulator: median |error| of TPOT and TTFT.

Usage: ``python bench/fidelity_e2e.py [--quick] [--moe|--dense] [--group TEXT] [--rows]
[--data ../shared/data] [--write-tables]``.

Replays AIConfigurator's 249 dense silicon runs (``silicon-e2e.csv``: H100/H200/B200, FP8 and
FP4, closed loop), its 776 MoE runs (``silicon-e2e-moe.csv``: gpt-oss-120b, Kimi-K2.5,
MiniMax-M2.5; reported per GPU, precision and model; ``--moe``/``--dense`` replay one set)
and LLMServingSim's vLLM 0.19 RTX runs (open loop, engine-side timestamps), each
as its client ran it (``chunktune.sim.calibration.e2e`` says how the closed-loop client is
modelled), and prints per GPU and precision the rows, the rows the simulator cannot run and
why, and the median |error| of the mean TPOT and TTFT per run. ``--quick`` replays only the
cheap silicon rows, the set ``tests/sim/calibration/test_e2e.py`` pins. Reads the committed
copies in ``bench/data/e2e`` (``--data DIR`` reads the shared raw data instead;
``--write-tables`` rewrites the committed copies from it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

from chunktune.sim.calibration import e2e
from chunktune.sim.cost import provenance
from chunktune.sim.cost.fit import kernel_data

TABLES = Path(__file__).with_name("data") / "e2e"
SILICON = TABLES / "silicon_e2e.csv"
SILICON_MOE = TABLES / "silicon_e2e_moe.csv"
RUNS = TABLES / "llmss_runs.csv"
REQUESTS = TABLES / "llmss_requests.csv"
RUNS_HEADER = (
    "# LLMServingSim's end-to-end vLLM 0.19 runs (derived: engine arguments from meta.json;\n"
    "# per request the arrival offset, token counts, engine-side TTFT and E2E in seconds from\n"
    "# requests.jsonl, to 0.1 ms). Source: casys-kaist/LLMServingSim 5daddb21; MIT,\n"
    "# Copyright (c) 2024 CASYS Lab at KAIST. Rewrite: python bench/fidelity_e2e.py --data DIR "
    "--write-tables\n")
SILICON_HEADER = (
    "# AIConfigurator silicon_sample.csv, vLLM aggregated-serving rows (the shared data's\n"
    "# silicon-e2e.csv, unchanged). Source: ai-dynamo/aiconfigurator 095f58a51; Apache-2.0,\n"
    "# Copyright NVIDIA CORPORATION & AFFILIATES. Rewrite: python bench/fidelity_e2e.py --data "
    "DIR --write-tables\n")


def load(data: Path | None) -> tuple[list[e2e.ServingRun], list[kernel_data.EngineRun]]:
    """The silicon rows (the dense ones, then the MoE ones) and the RTX runs."""
    if data is None:
        return (e2e.read_silicon(SILICON) + e2e.read_silicon(SILICON_MOE),
                e2e.read_engine_runs(RUNS, REQUESTS))
    aic = data / "aiconfigurator-vllm"
    return (e2e.read_silicon(aic / "silicon-e2e.csv")
            + e2e.read_silicon(aic / "silicon-e2e-moe.csv"), kernel_data.read_engine_runs(data))


def write_tables(data: Path) -> None:
    TABLES.mkdir(parents=True, exist_ok=True)
    for path, name in ((SILICON, "silicon-e2e.csv"), (SILICON_MOE, "silicon-e2e-moe.csv")):
        with path.open("w") as out, (data / "aiconfigurator-vllm" / name).open() as raw:
            out.write(SILICON_HEADER.replace("silicon-e2e.csv", name))
            shutil.copyfileobj(raw, out)
    for name in e2e.moe_config_files():
        shutil.copyfile(data / "aiconfigurator-vllm" / "model-configs" / name,
                        e2e.MOE_CONFIGS / name)
    e2e.write_engine_runs(kernel_data.read_engine_runs(data), RUNS, REQUESTS, RUNS_HEADER)
    print(f"wrote {SILICON}, {SILICON_MOE}, {e2e.MOE_CONFIGS}, {RUNS} and {REQUESTS}")


def print_first_token(silicon: list[e2e.ServingRun]) -> int:
    res = e2e.first_token_residuals(silicon)
    print(f"{'light-load run':58} {'measured':>9} {'prefill':>9} {'left':>8}")
    for r in res:
        print(f"{r.run.name:58} {r.run.ttft_s * 1e3:7.1f}ms {r.simulated_s * 1e3:7.1f}ms "
              f"{r.residual_s * 1e3:6.1f}ms")
    fit = e2e.fit_server_cost(res)
    print(f"fitted on the TP {max(r.run.tp for r in res)} rows: {fit.fixed_s * 1e3:.1f} ms + "
          f"{fit.per_prompt_token_s * 1e6:.1f} us per prompt token (assumed); committed: "
          f"{e2e.API_SERVER.fixed_s * 1e3:.1f} ms + "
          f"{e2e.API_SERVER.per_prompt_token_s * 1e6:.1f} us")
    return 0


def print_groups(replays: list[e2e.Replay], width: int) -> None:
    for g in e2e.summarize(replays).values():
        why = "; ".join(f"{n} {reason}" for reason, n in g.skipped.items())
        print(f"{g.group:{width}} {g.rows:4} {g.run:4} {pct(g.tpot_median_abs_err)} "
              f"{pct(g.ttft_median_abs_err)}" + (f"  not run: {why}" if why else ""))


def print_peak_shares(runs: list[e2e.ServingRun], split: list[e2e.Replay]) -> None:
    """Per harness group, the share of the GPUs' dense peak its rows' measured means need for
    the lengths they state (:func:`chunktune.sim.calibration.e2e.peak_share`)."""
    shares: dict[str, list[float]] = {}
    for run, rep in zip(runs, split, strict=False):
        share = e2e.peak_share(run)
        if share is not None:
            shares.setdefault(rep.group, []).append(share)
    print("\nshare of the GPUs' dense tensor peak the measured means need for the stated "
          "lengths\n(every prompt prefilled; median / highest row):")
    for group, values in sorted(shares.items()):
        print(f"{group:38} {statistics.median(values):6.0%} {max(values):6.0%}")


def write_fidelity(table: dict[str, object]) -> None:
    doc = {"about": "end-to-end median |error| of the mean TPOT and TTFT of real vLLM serving "
                    "runs replayed by the simulator, per GPU, over the dense runs whose "
                    "harness is known (bench/fidelity_e2e.py --quick: InferenceX's silicon "
                    "rows, LLMServingSim's RTX runs), the GPU's largest group; under models, "
                    "per model (shape) and weight format, those runs and InferenceX's MoE "
                    "rows (not attention data parallel)",
           "rewrite": "python bench/fidelity_e2e.py --quick --write-fidelity",
           "gpus": table}
    provenance.E2E_FIDELITY_PATH.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {provenance.E2E_FIDELITY_PATH}")


def pct(v: float | None) -> str:
    return "-" if v is None else f"{v:6.1%}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, help="the shared data folder (default: the "
                                               "committed copies in bench/data/e2e)")
    ap.add_argument("--quick", action="store_true",
                    help="only the cheap silicon rows (the CI guard's set)")
    ap.add_argument("--moe", action="store_true", help="only the MoE rows (silicon-e2e-moe)")
    ap.add_argument("--dense", action="store_true", help="only the dense rows and RTX runs")
    ap.add_argument("--group", action="append", default=[],
                    help="only the rows whose group contains TEXT (e.g. \"b200 fp4 gpt-oss\"; "
                         "repeat for several)")
    ap.add_argument("--rows", action="store_true", help="print every replayed row")
    ap.add_argument("--first-token", action="store_true",
                    help="print the light-load rows' TTFT left beside the simulated prefill "
                         "and the cost before the first token fitted on them")
    ap.add_argument("--peer-to-peer", choices=("yes", "no"),
                    help="replay LLMServingSim's multi-GPU runs on a node with (yes) or "
                         "without (no) a peer-to-peer path between its PCIe GPUs (default: "
                         "not stated, as the guard does; their hosts' is not recorded)")
    ap.add_argument("--write-tables", action="store_true",
                    help="rewrite bench/data/e2e from --data")
    ap.add_argument("--write-fidelity", action="store_true",
                    help="with --quick: rewrite the per-GPU figures `chunktune sim run` shows "
                         "(sim/cost/data/e2e_fidelity.json)")
    a = ap.parse_args()
    if a.peer_to_peer and a.write_fidelity:
        ap.error("--write-fidelity writes the figures of the runs as the guard replays them "
                 "(the path not stated): leave out --peer-to-peer")
    p2p = None if a.peer_to_peer is None else a.peer_to_peer == "yes"
    if a.write_tables:
        if a.data is None:
            ap.error("--write-tables needs --data")
        write_tables(a.data)
        return 0
    t0 = time.perf_counter()
    silicon, runs = load(a.data)
    if a.first_token:
        return print_first_token(silicon)
    chosen = e2e.quick(silicon) if a.quick else silicon
    if a.moe:
        chosen, runs = [r for r in chosen if r.is_moe], []
    elif a.dense:
        chosen = [r for r in chosen if not r.is_moe]
    if a.group:
        chosen = [r for r in chosen if any(g in r.group for g in a.group)]
        runs = [r for r in runs if any(g in f"{r.gpu} bf16" for g in a.group)]
    # the dense silicon rows, the RTX runs, then the MoE rows (by_harness and fidelity_table
    # take the dense rows and, after them, the RTX runs)
    dense = [r for r in chosen if not r.is_moe]
    replays = [e2e.replay_silicon(r) for r in dense]
    replays += [e2e.replay_engine_run(r, p2p) for r in runs]
    replays += [e2e.replay_silicon(r) for r in chosen if r.is_moe]
    if a.rows:
        print(f"{'run':58} {'ttft meas':>9} {'sim':>9} {'err':>7} "
              f"{'tpot meas':>9} {'sim':>7} {'err':>7}")
        for r in replays:
            if r.skipped:
                print(f"{r.name:58} not run: {r.skipped}")
                continue
            assert r.ttft_s is not None and r.tpot_s is not None
            print(f"{r.name:58} {r.measured_ttft_s * 1e3:7.1f}ms {r.ttft_s * 1e3:7.1f}ms "
                  f"{r.ttft_err:+7.1%} {r.measured_tpot_s * 1e3:7.2f}ms {r.tpot_s * 1e3:5.2f}ms "
                  f"{r.tpot_err:+7.1%}")
        print()
    print(f"{'GPU, precision':30} {'rows':>4} {'run':>4} {'TPOT':>7} {'TTFT':>7}  "
          "(median |error|; not run: why)")
    print_groups(replays, 30)
    # the silicon groups again, by whether the row's harness is known (InferenceX's rows name
    # no vLLM version; the others record no harness: see the module docstring of e2e)
    if any(run.vllm_version for run in dense):
        print("\nsilicon rows by harness:")
        split = e2e.by_harness(dense, replays[:len(dense)])
        print_groups(split, 38)
        print_peak_shares(dense, split)
    if a.write_fidelity:
        if not a.quick or a.moe or a.dense or a.group:
            ap.error("--write-fidelity takes the --quick set (what the CI test pins)")
        write_fidelity(e2e.fidelity_table(dense, replays[:len(dense) + len(runs)],
                                          replays[len(dense) + len(runs):]))
    notes = [f"{p} rows model {what}" for p, what in e2e.MODELLED_PRECISIONS.items() if what]
    print("\nSilicon rows: InferenceX's client (10 x N requests of lengths drawn in [0.8 L, L], "
          "N in flight,\nthe first N at once; means over all) against InferenceX's engine "
          "flags (FP8 KV cache, bf16 on\nthe H100; async scheduling). RTX rows: "
          "LLMServingSim's open-loop runs, engine-side timestamps."
          + ("\n" + "; ".join(notes) if notes else "")
          + "\nMoE rows (model named): InferenceX's MoE engine flags (the checkpoint's KV cache, "
          "async scheduling,\n--max-num-seqs N; on the B200 its gpt-oss and MiniMax scripts' "
          "flags and MoE kernels), the row's\nvLLM version (a nightly's: the current one's "
          "defaults).")
    print(f"({len(chosen)} of {len(silicon)} silicon rows{' (--quick)' if a.quick else ''}, "
          f"{len(runs)} RTX runs; {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
