"""What each injected fault costs a study, against the Kubernetes emulator.

Runs the real operator (kopf + the official client, in process) against ``tests/kube``'s
emulator and fake kubelet (trials are real ``chunktune sim serve`` pods and ``chunktune load
run`` Jobs on loopback), one fresh emulator per fault, with the scenarios of
``tests/k8s/faults.py`` (the same ones ``tests/k8s/test_faults.py`` asserts on). Prints, per
fault:

* **lost**: trials the fault hit whose measurement (or genuine failure) was not recorded;
* **dup**: points measured more than once;
* **budget**: trials counted against ``maxTrials``/``maxFailedTrials`` that are faults, not
  results of their flags;
* **recover s**: seconds from the fault's end (an outage: the API back; a restart: the new
  operator started; a storm: its first error) until the status showed the study's progress
  again (the trial in flight, adopted or re-adopted, told to the study); ``-`` where the
  fault does not stop progress;
* **left**: trial objects left behind; **phase**: where the study ended.

An engine crash and a failed load Job are the trial's genuine results (``FAIL``, counted);
they are listed to show they are recorded with their cause and the study goes on.

Bad input comes first (``--only yaml``): each YAML alias bomb of ``tests/api/corpus.py``
(``YAML_BOMBS``), the seconds until ``chunktune validate`` (or reading the profile) refuses it
in process, and once as a ``chunktune validate`` process (its start-up included).

    python bench/faults.py [--only yaml,outage-retried,storm,...] [--outage 12]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "operator"), str(ROOT)]


def scenarios(outage: float) -> dict[str, Callable[..., Awaitable[Any]]]:
    from tests.k8s import faults

    return {
        "outage-retried": lambda kube, d: faults.api_outage(kube, d, 30.0, outage),
        "outage-readopted": lambda kube, d: faults.api_outage(kube, d, 2.0, outage),
        "storm": faults.status_storm,
        "prometheus-down": faults.prometheus_down,
        "restarts": faults.operator_restarts,
        "deleted-in-outage": faults.deleted_during_outage,
        "engine-crash": faults.engine_crash,
        "load-failure": faults.load_failure,
    }


async def run_one(key: str, fn: Callable[..., Awaitable[Any]], folder: Path) -> Any:
    from tests.k8s import faults
    from tests.k8s.conftest import BIN, POD_ENV
    from tests.kube.emulator import KubeEmulator
    from tests.kube.kubelet import FakeKubelet

    from chunktune.api.crd import build_crd

    env = POD_ENV
    if key == "engine-crash":
        env = faults.fault_path(folder / "bin", BIN, crash=("crash-t1",))
    elif key == "load-failure":
        env = faults.fault_path(folder / "bin", BIN, fail_jobs=("loadfail-t1-load",))
    with KubeEmulator() as kube:
        kube.create("crd", build_crd())
        async with FakeKubelet(kube, extra_env=env, kill_timeout=2.0):
            return await fn(kube, folder / "state")


def yaml_bombs(folder: Path) -> bool:
    """Time the refusal of each alias bomb; True when every one was refused in under 1 s."""
    import contextlib
    import io
    import os
    import subprocess

    from tests.api.corpus import YAML_BOMBS

    from chunktune.api.cli import main_validate
    from chunktune.core.errors import SpecError
    from chunktune.core.workload import load_profile

    ok = True
    print("bad input        refused in   error")
    for bad in YAML_BOMBS:
        path = folder / f"{bad.id}.yaml"
        path.write_text(bad.text)
        err = io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stderr(err):
            if bad.kind == "manifest":
                refused = main_validate(path) == 1
            else:
                try:
                    load_profile(path)
                    refused = False
                except SpecError as e:
                    print(e, file=err)
                    refused = True
        took = time.perf_counter() - t0
        ok = ok and refused and bad.words in err.getvalue() and took < 1.0
        first = err.getvalue().strip().splitlines()[0] if err.getvalue().strip() else "-"
        print(f"{bad.id:<34} {took * 1000:7.1f} ms  {first[:90]}")
    path = folder / f"{YAML_BOMBS[0].id}.yaml"
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path[:2])}  # this checkout
    out = subprocess.run([sys.executable, "-m", "chunktune", "validate", str(path)],
                         capture_output=True, text=True, timeout=600, env=env)
    took = time.perf_counter() - t0
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "chunktune", "validate",
                    str(ROOT / "examples" / "quickstart.yaml")], capture_output=True, timeout=600,
                   env=env)
    base = time.perf_counter() - t0
    print(f"chunktune validate (a process): exit {out.returncode} in {took:.2f} s "
          f"(a valid manifest: {base:.2f} s, the start-up)")
    return ok and out.returncode == 1


async def main_async(ns: argparse.Namespace) -> int:
    table = scenarios(ns.outage)
    keys = ns.only.split(",") if ns.only else ["yaml", *table]
    bad_input_ok = True
    if "yaml" in keys:
        keys.remove("yaml")
        with tempfile.TemporaryDirectory(prefix="faults-yaml-") as tmp:
            bad_input_ok = yaml_bombs(Path(tmp))
        if not keys:
            return 0 if bad_input_ok else 1
    unknown = [k for k in keys if k not in table]
    if unknown:
        print(f"unknown fault(s) {', '.join(unknown)}; choose from {', '.join(table)}",
              file=sys.stderr)
        return 2
    rows = []
    for key in keys:
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"faults-{key}-") as tmp:
            try:
                out = await run_one(key, table[key], Path(tmp))
            except Exception as e:  # a scenario that broke is a row, not a crash
                rows.append((key, "-", "-", "-", "-", "-", f"ERROR {type(e).__name__}: {e}"[:60]))
                continue
            print(f"# {key}: {out.fault}; trials {out.rows}", flush=True)
            study = out.detail.get("study")
            for t in study.trials if study is not None else []:
                if t.user_attrs.get("message"):
                    print(f"#   trial {t.number}: {t.user_attrs['message'][-400:]!r}", flush=True)
        rec = "-" if not out.recover_s else f"{out.recover_s:.1f}"
        rows.append((key, str(out.lost), str(out.duplicated), str(out.budget), rec,
                     str(len(out.left)), f"{out.phase} ({time.monotonic() - t0:.0f} s)"))
    head = ("fault", "lost", "dup", "budget", "recover s", "left", "phase (wall)")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, tuple("-" * w for w in widths), *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return 0 if bad_input_ok and all(r[1] == r[2] == r[3] == "0" and r[5] == "0"
                                     for r in rows) else 1


def main() -> int:
    p = argparse.ArgumentParser(description=textwrap.dedent(__doc__ or "").split("\n\n")[0])
    p.add_argument("--only", help="comma-separated faults to run (default: all; yaml: the "
                                  "alias bombs)")
    p.add_argument("--outage", type=float, default=12.0,
                   help="seconds the API is unreachable in the outage faults [12]")
    ns = p.parse_args()
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    return asyncio.run(main_async(ns))


if __name__ == "__main__":
    sys.exit(main())
