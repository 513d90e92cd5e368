"""Published vLLM serving runs (GPUStack's performance lab) replayed: held out, never fitted.

Usage: ``python bench/published_runs.py [--rows] [--group TEXT] [--write-fidelity]
[--write-configs DIR]``.

Replays every run of ``bench/data/e2e/gpustack_runs.csv`` (:mod:`chunktune.sim.calibration
.published` says how each client and engine is taken) and prints, per doc (model and GPU) and
client, the runs, those the simulator cannot run and why, and the median |error| (and median
signed error: + the simulator is slower) of the mean TPOT, the mean TTFT and the benchmark's
duration; then the same over all closed-loop and all burst runs; then, for each two runs of one
doc's workload under two serving commands, whether the simulator picks the faster one as
measured (:func:`chunktune.sim.calibration.published.pairs`). ``--rows`` prints every run and
pair.
Every measured figure is GPUStack's; every other figure is simulated. ``--write-fidelity``
writes the per-GPU figures the cost-model line quotes of a model's own published runs
(``chunktune/sim/cost/data/published_fidelity.json``). ``--write-configs DIR``
copies the config.json files the table's models need that the catalog lacks from the shared
data folder DIR into ``bench/data/e2e/model-configs``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from chunktune.sim.calibration import published
from chunktune.sim.cost import provenance


def pct(v: float | None) -> str:
    return "     -" if v is None else f"{v:+6.1%}"


def absolute(v: float | None) -> str:
    return "     -" if v is None else f"{v:6.1%}"


def print_figures(label: str, f: published.Figures, width: int) -> None:
    why = "; ".join(f"{n} {reason}" for reason, n in sorted(f.skipped.items()))
    cells = "  ".join(f"{absolute(f.median_abs[w])} {pct(f.median[w])}"
                      for w in ("tpot", "ttft", "duration"))
    print(f"{label:{width}} {f.runs:4} {f.replayed:4}  {cells}"
          + (f"\n{'':{width}}   {f.refused} of them refused at start-up as stated"
             if f.refused else "")
          + (f"\n{'':{width}}   not run: {why}" if why else ""))


def write_fidelity(table: dict[str, object]) -> None:
    doc = {"about": "median |error| and median signed error (+: the simulator slower) of the "
                    "mean TPOT and TTFT of GPUStack's published vLLM runs replayed by the "
                    "simulator (bench/published_runs.py; held out: nothing was fitted on "
                    "them), per GPU, model (shape) and weight format, and client (closed: "
                    "ShareGPT at a few requests in flight; burst: hundreds of requests at once)",
           "rewrite": "python bench/published_runs.py --write-fidelity",
           "gpus": table}
    provenance.PUBLISHED_FIDELITY_PATH.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {provenance.PUBLISHED_FIDELITY_PATH}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", action="store_true", help="print every run")
    ap.add_argument("--group", action="append", default=[],
                    help="only the runs whose doc contains TEXT (e.g. qwen3-8b; repeatable)")
    ap.add_argument("--write-fidelity", action="store_true",
                    help="also write the per-GPU figures the cost-model line quotes "
                         "(chunktune/sim/cost/data/published_fidelity.json; all runs)")
    ap.add_argument("--write-configs", type=Path, metavar="DIR",
                    help="copy the config.json files the table needs from the shared data "
                         "folder DIR")
    a = ap.parse_args()
    if a.write_configs:
        for name in sorted(published.CONFIG_FILES.values()):
            shutil.copyfile(a.write_configs / "aiconfigurator-vllm" / "model-configs" / name,
                            published.CONFIGS / name)
            print(f"wrote {published.CONFIGS / name}")
        return 0
    runs = [r for r in published.read_runs()
            if not a.group or any(t in r.source for t in a.group)]
    replays = [published.replay(r) for r in runs]
    if a.rows:
        print(f"{'run':100} {'TPOT meas':>9} {'sim':>7} {'err':>7}  {'TTFT err':>8}  "
              f"{'dur err':>7}")
        for rep in replays:
            r = rep.run
            if rep.skipped is not None:
                print(f"{r.name[:100]:100} not run: {rep.skipped}")
                continue
            assert rep.tpot_s is not None
            print(f"{r.name[:100]:100} {r.tpot_s * 1e3:7.1f}ms {rep.tpot_s * 1e3:5.1f}ms "
                  f"{pct(rep.error('tpot'))}  {pct(rep.error('ttft'))}  "
                  f"{pct(rep.error('duration'))}"
                  + (f"\n{'':100} {rep.refused}" if rep.refused else ""))
        print()
    width = 44
    print(f"{'doc (model/GPU), client':{width}} runs  ran  "
          f"{'TPOT |err| / signed':>20}  {'TTFT |err| / signed':>20}  "
          f"{'duration |err| / signed':>22}")
    groups: dict[str, list[published.PublishedReplay]] = {}
    for rep in replays:
        groups.setdefault(f"{rep.run.group}, {rep.run.client}", []).append(rep)
    for label, reps in sorted(groups.items()):
        print_figures(label, published.figures(reps), width)
    print()
    for client in published.CLIENTS:
        print_figures(f"all {client}", published.figures(
            r for r in replays if r.run.client == client), width)
    print("\nthe same doc's workload under two serving commands (flags, TP, precision): does "
          "the simulator pick the faster one as measured?")
    for what in ("duration", "tpot", "ttft"):
        ps = published.pairs(replays, what)
        print(f"  {what:8}: {sum(p.agrees for p in ps)} of {len(ps)} pairs")
        if a.rows:
            for p in ps:
                first, second = p.first.run, p.second.run
                print(f"    {first.source} {first.case}: {first.model.split('/')[-1]} "
                      f"{' '.join(first.args) or '(defaults)'} -> "
                      f"{second.model.split('/')[-1]} {' '.join(second.args) or '(defaults)'}: "
                      f"measured {p.measured:+.1%}, simulated {p.simulated:+.1%}"
                      + ("" if p.agrees else "  DISAGREE"))
    if a.write_fidelity:
        if a.group:
            print("--write-fidelity takes every run: leave out --group", file=sys.stderr)
            return 2
        write_fidelity(published.fidelity_table(replays))
    print("\nmeasured: GPUStack's docs (bench/data/e2e/gpustack_runs.csv); the rest simulated. "
          "+ : the simulator slower than measured")
    return 0


if __name__ == "__main__":
    sys.exit(main())
