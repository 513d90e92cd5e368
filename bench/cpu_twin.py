"""The CPU twin: calibrate the simulator on the real CPU engine, predict configurations it has
not seen (issue #10 item 5).

Usage: ``python bench/cpu_twin.py [--store DIR] [--duration 45] [--rerun]``, or
``python bench/cpu_twin.py --study STORAGE [--calibrate-on N]``.

With ``--study`` the real runs are a stored study's trials instead (e.g. the all-real reference
study of ``bench/twin_vs_real.py``, ``.chunktune/twin-vs-real/reference.journal``): the twin is
calibrated on its first N completed trials (``chunktune calibrate-study``'s fit: step logs,
then step gap, time before the first token and delivery stalls from their latencies) and
predicts every other completed trial, costing no engine time.

1. Runs real vLLM (its CPU build, the tiny model, ``examples/cpu-vllm.yaml``'s workload) on the
   local backend for six configurations, one ``chunktune tune`` trial each, keeping every
   trial's step log and metrics in ``--store`` (default ``.chunktune/cpu-twin``). A
   configuration whose result is already stored is reused, not rerun (``--rerun`` redoes them).
2. Calibrates the twin on the first three as a study does (``chunktune calibrate-study``,
   :func:`chunktune.tuning.strategies.twin_fit.fit_profile`): the step-time model fitted to their
   step logs (what ``chunktune calibrate --log`` fits), then the wall time between steps, the time
   before the first token and the clients' delivery stalls fitted to their measured latencies.
3. Replays the same workload in the simulator with that profile for the other three and
   prints measured vs predicted TTFT, ITL and E2E p50/p99 and the median |error|. The table is
   also written to ``DIR/comparison.json`` (what ``bench/fidelity.py`` shows).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "cpu-vllm.yaml"

#: (max-num-batched-tokens, long-prefill-token-threshold, max-num-seqs)
CALIBRATE_ON = [(256, 0, 64), (2048, 0, 128), (512, 256, 16)]
HELD_OUT = [(1024, 128, 64), (4096, 512, 128), (256, 128, 16)]
METRICS = [f"{m}_p{p}" for m in ("ttft", "itl", "e2e") for p in (50, 99)]


def config_name(c: tuple[int, int, int]) -> str:
    return f"b{c[0]}-t{c[1]}-s{c[2]}"


def manifest(c: tuple[int, int, int], duration: float) -> dict[str, Any]:
    m = yaml.safe_load(EXAMPLE.read_text())
    m["metadata"]["name"] = "cpu-twin-" + config_name(c)
    # The configuration goes into the fixed engine args: a study's first trial is the
    # baseline (vLLM's defaults for the searched flags), so searching them would measure the
    # defaults. The one searched flag is the tiny model's own length (its default).
    m["spec"]["engine"]["args"] = [*m["spec"]["engine"]["args"],
                                   "--max-num-batched-tokens", str(c[0]),
                                   "--long-prefill-token-threshold", str(c[1]),
                                   "--max-num-seqs", str(c[2])]
    m["spec"]["searchSpace"] = [{"name": "max-model-len", "choices": [8192]}]
    m["spec"]["workload"]["duration"] = f"{duration:g}s"
    m["spec"]["budget"] = {"maxTrials": 1, "parallelism": 1}
    m["spec"]["sampler"] = {"name": "random", "seed": 0}
    return dict(m)


def run_real(c: tuple[int, int, int], store: Path, duration: float, rerun: bool
             ) -> dict[str, Any]:
    """The stored result of configuration ``c``, running the real engine when there is none."""
    out = store / f"{config_name(c)}.json"
    if out.exists() and not rerun:
        print(f"  {config_name(c)}: reusing the stored real run {out}")
        return dict(json.loads(out.read_text()))
    import optuna

    from chunktune.tuning import study as st
    store.mkdir(parents=True, exist_ok=True)
    mpath = store / f"{config_name(c)}.yaml"
    mpath.write_text(yaml.safe_dump(manifest(c, duration)))
    storage = store / f"{config_name(c)}.journal"
    for p in (storage, Path(str(storage) + ".lock")):
        if p.exists():
            p.unlink()
    t0 = time.time()
    print(f"  {config_name(c)}: running real vLLM ({duration:g} s of load) ...", flush=True)
    proc = subprocess.run([sys.executable, "-m", "chunktune", "tune", str(mpath), "--storage",
                           str(storage)], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env=dict(os.environ))
    if proc.returncode != 0:
        raise SystemExit(f"real run {config_name(c)} failed (rc {proc.returncode}):\n"
                         f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    study = optuna.load_study(study_name=f"default/cpu-twin-{config_name(c)}",
                              storage=st.open_storage(str(storage)))
    (trial,) = study.trials
    if st.trial_state(trial) != "COMPLETE":
        raise SystemExit(f"real run {config_name(c)}: trial ended {st.trial_state(trial)}: "
                         f"{trial.user_attrs.get(st.ATTR_MESSAGE)}")
    steps = trial.user_attrs[st.ATTR_STEPS]
    if steps.get("max_step_tokens", 0) > c[0]:
        raise SystemExit(f"real run {config_name(c)}: a step of {steps['max_step_tokens']} "
                         f"tokens, over the configured budget {c[0]}: the flags were not applied")
    result = {"config": list(c), "name": config_name(c), "duration_s": duration,
              "metrics": trial.user_attrs[st.ATTR_METRICS],
              "steps_file": trial.user_attrs[st.ATTR_STEPS]["file"],
              "wall_s": time.time() - t0}
    out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"  {config_name(c)}: done in {time.time() - t0:.0f} s", flush=True)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, default=ROOT / ".chunktune" / "cpu-twin")
    ap.add_argument("--duration", type=float, default=45.0, help="seconds of load per run")
    ap.add_argument("--rerun", action="store_true", help="rerun stored real runs")
    ap.add_argument("--real-only", action="store_true", help="only collect the real runs")
    ap.add_argument("--study", metavar="STORAGE", help="take the real runs from this study")
    ap.add_argument("--calibrate-on", type=int, default=3, metavar="N",
                    help="with --study: calibrate on the first N completed trials")
    a = ap.parse_args()
    if a.study:
        return from_study(a.study, a.calibrate_on)
    print("== real runs (vLLM CPU, tiny model, examples/cpu-vllm.yaml workload)")
    real = {config_name(c): run_real(c, a.store, a.duration, a.rerun)
            for c in CALIBRATE_ON + HELD_OUT}
    if a.real_only:
        return 0
    return report(real, a.store)


class Twins:
    """The simulated twin of every stored configuration: each real run's own study (its
    manifest carries the configuration in its fixed flags), replayed as the product's twin
    does (:func:`chunktune.tuning.strategies.twin_fit.replayer`)."""

    def __init__(self, store: Path, names: list[str]) -> None:
        from chunktune.backends.simulated import SimulatedBackend
        from chunktune.tuning.cli import _tuning_of
        from chunktune.tuning.strategies.twin_fit import replayer
        from chunktune.tuning.tuner import Tuner

        backend = SimulatedBackend()
        self.tuners = {}
        self.replay = {}
        for n in names:
            tuning, url = _tuning_of(str(store / f"{n}.journal"), None)
            self.tuners[n] = Tuner(tuning, backend, url)
            self.replay[n] = replayer(self.tuners[n], backend)

    def simulate(self, point: dict[str, Any], prof: Any) -> dict[str, float]:
        """The simulated metrics of the run ``point`` names (``__config``) under ``prof``."""
        params = {k: v for k, v in point.items() if k != "__config"}
        return dict(self.replay[point["__config"]](params, prof))

    def measured(self, names: list[str]) -> list[Any]:
        """The stored real runs ``names`` (one trial each) as the twin's fit takes them,
        numbered in order, their points naming their configuration."""
        import dataclasses

        from chunktune.tuning.strategies.twin_fit import measured_runs
        out = []
        for i, n in enumerate(names):
            (run,) = measured_runs(self.tuners[n])
            out.append(dataclasses.replace(run, number=i, point={**run.point, "__config": n}))
        return out


def report(real: dict[str, dict[str, Any]], store: Path) -> int:
    import numpy as np

    from chunktune.tuning.strategies.twin_fit import fit_profile
    calib = [config_name(c) for c in CALIBRATE_ON]
    held = [config_name(c) for c in HELD_OUT]
    twins = Twins(store, calib + held)
    print("\n== calibrate on " + ", ".join(calib) + " (the product's fit: `chunktune "
          "calibrate-study`'s step-time model on their step logs, then step gap, time before "
          "the first token and delivery stalls on their measured latencies)")
    t0 = time.time()
    prof = fit_profile(twins.tuners[calib[0]].target, twins.measured(calib), twins.simulate)
    fit = prof.fit
    print(f"  {fit['num_steps']:.0f} steps; step error median {fit['median_rel_err']:.1%} in "
          f"sample, {fit['cross_validated_median_rel_err']:.1%} cross-validated; step gap "
          f"{prof.step_gap_s * 1e3:.2f} ms; time before the first token "
          f"{(prof.server_overhead_s or 0) * 1e3:.1f} ms; delivery stalls "
          f"{prof.delivery_stall_prob:g} x {prof.delivery_stall_s * 1e3:g} ms "
          f"({time.time() - t0:.0f} s)")
    profile = store / "profile.json"
    profile.write_text(json.dumps(prof.to_dict(), indent=2, sort_keys=True) + "\n")
    rows, errs = [], []
    print("\n== held-out configurations: real vLLM vs calibrated simulator")
    print(f"  {'config':16} {'metric':9} {'measured':>10} {'predicted':>10} {'error':>8}")
    for n, run in zip(held, twins.measured(held), strict=True):
        meas, pred = run.metrics, twins.simulate(run.point, prof)
        for k in METRICS:
            if not (meas.get(k, 0) > 0 and pred.get(k, 0) > 0):
                print(f"  {n:16} {k:9} not compared: measured {meas.get(k)}, predicted "
                      f"{pred.get(k)} (left out of the table)")
                continue
            err = pred[k] / meas[k] - 1.0
            errs.append(abs(err))
            rows.append({"config": n, "metric": k, "measured_s": meas[k],
                         "predicted_s": pred[k], "rel_err": err})
            print(f"  {n:16} {k:9} {meas[k] * 1e3:>8.1f}ms {pred[k] * 1e3:>8.1f}ms "
                  f"{err:>+8.1%}")
    if not errs:
        raise SystemExit("no held-out figure could be compared (see above)")
    med = float(np.median(errs))
    print(f"\nmedian |error| over {len(errs)} held-out figures: {med:.1%} (target <= 15%)")
    shown = prof.to_dict()
    for f in shown.get("fitted_on", {}).get("files", []):  # no paths of this machine
        f["path"] = "<store>/" + os.path.relpath(f["path"], store.resolve())
    table = store / "comparison.json"
    table.write_text(json.dumps(
        {"rows": rows, "median_abs_err": med, "calibrated_on": calib,
         "server_overhead_s": prof.server_overhead_s, "step_gap_s": prof.step_gap_s,
         "delivery_stall": [prof.delivery_stall_prob, prof.delivery_stall_s],
         "duration_s": sorted({real[n]["duration_s"] for n in calib + held}),
         "profile": shown,
         "command": "python bench/cpu_twin.py",
         "source": f"real vLLM {prof.fitted_on.get('vllm_version')} CPU build runs on a "
                   f"{os.cpu_count()}-core "
                   f"machine, reported {time.strftime('%Y-%m-%d')}; measured by this project "
                   "(Apache-2.0 like the code)"}, indent=2) + "\n")
    print(f"(real runs stored in {os.path.relpath(store)}; rerunning this reuses them, --rerun "
          f"redoes them; the table is {os.path.relpath(table)}: copy it to "
          "bench/data/cpu_twin_comparison.json to publish it to bench/fidelity.py)")
    return 0


def from_study(storage: str, n: int) -> int:
    """Calibrate on a stored study's first ``n`` completed trials, predict the others."""
    import numpy as np

    from chunktune.backends.simulated import SimulatedBackend
    from chunktune.tuning.cli import _tuning_of
    from chunktune.tuning.strategies.twin_fit import measured_runs, study_profile, twin_target
    from chunktune.tuning.tuner import Tuner

    tuning, url = _tuning_of(storage, None)
    tuner = Tuner(tuning, SimulatedBackend(), url)
    runs = measured_runs(tuner)
    if len(runs) <= n:
        raise SystemExit(f"{storage}: {len(runs)} completed trials with step logs; need > {n}")
    calib, held = runs[:n], runs[n:]
    print(f"== calibrate on trials {', '.join(str(r.number) for r in calib)} of {storage}")
    t0 = time.time()
    prof = study_profile(tuner, calib)
    print(f"  {prof.fit['num_steps']:.0f} steps, step error median "
          f"{prof.fit['median_rel_err']:.1%}"
          f"; step gap {prof.step_gap_s * 1e3:.2f} ms, time before the first token "
          f"{(prof.server_overhead_s or 0) * 1e3:.1f} ms ({time.time() - t0:.0f} s)")
    import dataclasses

    backend = SimulatedBackend()
    plan0 = tuner.plan(0, {})
    target = twin_target(tuner.target, prof.to_dict())
    errs: dict[str, list[float]] = {k: [] for k in METRICS}
    print(f"\n== {len(held)} held-out trials: median |error| per figure")
    for r in held:
        res = backend.run_sync(dataclasses.replace(plan0, params=r.point, target=target))
        for k in METRICS:
            if r.metrics.get(k, 0) > 0 and k in res.metrics:
                errs[k].append(res.metrics[k] / r.metrics[k] - 1)
    allerr = []
    for k, v in errs.items():
        if v:
            a = np.abs(v)
            allerr += list(a)
            print(f"  {k:9} median |err| {np.median(a):6.1%}  p90 {np.percentile(a, 90):6.1%}  "
                  f"median signed {np.median(v):+6.1%}  (n={len(v)})")
    print(f"\nmedian |error| over {len(allerr)} held-out figures: {np.median(allerr):.1%} "
          "(target <= 15%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
