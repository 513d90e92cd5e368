"""How faithful the simulator is: one table of every measured comparison.

Usage: ``python bench/fidelity.py [--data ../shared/data]``. Sections:

1. kernel datasets (``python -m chunktune.sim.cost.fit.kernel_fit report``): per operator family
   (GEMM bf16 and fp8, attention prefill / decode / mixed, all-reduce, fused MoE, elementwise)
   and GPU, in sample and with the GPU held out; the cross-checks between sources; the engine's
   linear layers against Vidur's and LLMServingSim's per-layer sums; NCCL all-reduce (Vidur);
   Splitwise Llama-2-70B steps and Vidur's unseen models (held out);
2. LLMServingSim's end-to-end vLLM 0.19 runs replayed through the simulator: TTFT, TPOT and E2E
   p50/p99, predicted vs measured (engine-side timestamps, so no server overhead is added);
3. the CPU twin (``chunktune calibrate`` on the real CPU engine, issue #10 items 4-5): the
   held-out predictions ``bench/cpu_twin.py`` stored (``--twin DIR``, default
   ``.chunktune/cpu-twin``); "not run" with the command when it has not been run here.

Without ``--data`` (the shared data folder beside the checkout) only the committed derived
tables are used: section 1 without Splitwise (all-reduce on its committed sub-sample), section 2
skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from chunktune.sim.calibration.fidelity import compare_run
from chunktune.sim.cost.fit import kernel_data, kernel_report

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


DEFAULT_TWIN = Path(__file__).resolve().parents[1] / ".chunktune" / "cpu-twin"
#: The committed table of the last bench/cpu_twin.py run (used when this checkout has none).
PUBLISHED = Path(__file__).with_name("data") / "cpu_twin_comparison.json"


def cpu_twin_rows(store: Path = DEFAULT_TWIN) -> tuple[list[str], str | None]:
    """Held-out predictions of the CPU twin that ``bench/cpu_twin.py`` stored; (rows, reason
    it was not run)."""
    path = store / "comparison.json"
    if not path.exists() and PUBLISHED.exists():
        path = PUBLISHED
    if not path.exists():
        return [], (f"not run: no {path.name} in {store} (run `python bench/cpu_twin.py`: "
                    "six short real vLLM CPU runs, ~10-15 min on 2 cores, then the fit)")
    try:
        d = json.loads(path.read_text())
        rows = [f"{'config':16} {'metric':9} {'measured':>10} {'predicted':>10} {'error':>8}"]
        rows += [f"{r['config']:16} {r['metric']:9} {r['measured_s'] * 1e3:>8.1f}ms "
                 f"{r['predicted_s'] * 1e3:>8.1f}ms {r['rel_err']:>+8.1%}" for r in d["rows"]]
        fit = d["profile"]["fit"]
        rows.append(f"from {path.name if path != PUBLISHED else 'bench/data/' + path.name}: "
                    f"calibrated on {', '.join(d['calibrated_on'])} "
                    f"({fit['num_steps']} steps; step error median {fit['median_rel_err']:.1%} "
                    f"in sample, {fit['cross_validated_median_rel_err']:.1%} cross-validated)")
        rows.append(f"median |error| over {len(d['rows'])} held-out figures: "
                    f"{d['median_abs_err']:.1%} (target <= 15%)")
    except (ValueError, KeyError, TypeError) as e:
        return [], f"not shown: {path} is not what bench/cpu_twin.py writes ({e}); rerun it"
    return rows, None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA,
                    help="the shared data folder (default: ../shared/data beside the checkout)")
    ap.add_argument("--twin", type=Path, default=DEFAULT_TWIN,
                    help="where bench/cpu_twin.py stored its runs (default .chunktune/cpu-twin)")
    a = ap.parse_args()
    data = a.data if (a.data / "llmservingsim-vllm019").is_dir() else None
    t0 = time.perf_counter()
    print("== 1. kernel datasets " + ("(raw data: " + str(a.data) + ")" if data else
                                      "(committed derived tables only; no --data)"))
    rows, checks = kernel_report.full_report(data)
    print(kernel_report.format_report(rows, checks))

    print("\n== 2. end-to-end vLLM 0.19 runs (LLMServingSim) replayed")
    if data is None:
        print("  not run: the raw runs are not beside this checkout (give --data)")
    else:
        print(f"  {'run':42} {'metric':6} {'pct':>4} {'measured':>10} {'simulated':>10} "
              f"{'error':>7}")
        for run in kernel_data.read_engine_runs(data):
            for c in compare_run(run):
                print(f"  {c.run:42} {c.metric:6} p{c.percentile:<3} {c.measured_s:>9.3f}s "
                      f"{c.predicted_s:>9.3f}s {c.rel_err:>+7.1%}")

    print("\n== 3. CPU twin, held-out configurations (issue #10 item 5)")
    twin, reason = cpu_twin_rows(a.twin)
    for line in twin:
        print("  " + line)
    if reason:
        print("  " + reason)
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
