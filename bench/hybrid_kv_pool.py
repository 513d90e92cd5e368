"""The simulator's KV pool for sliding-window models against vLLM's own hybrid KV cache manager.

The simulator schedules a model whose layers mix sliding-window and full attention (gpt-oss)
against a pool of full-attention blocks: the KV tokens vLLM prints, in blocks
(``memory.KVLayout.tokens``). vLLM keeps one pool of blocks shared by a sliding-window group
and a full-attention group, frees a sliding-window layer's blocks as its window passes and
finds a prefix-cache hit of a windowed group only where the window's blocks before it are
still cached. This script drives each release's own ``Scheduler`` (the per-release suite's
harness, ``tests/sim/releases/vllm_scheduler.py``) with the two groups at the pool the
simulator plans for each KV-bound published gpt-oss burst (100 x 32,000-token prompts,
``bench/published_runs.py``; prefix caching on, as vLLM ran), and prints its steps,
preemptions and prefill tokens (recomputed ones included) beside the simulator's. A release
whose scheduler stops admitting is reported as stalled (vLLM 0.19's gate, issue #39734).

Usage: ``python bench/hybrid_kv_pool.py [--release 0.34.0 ...] [--group TEXT]``; each release's
wheel is downloaded once (``tests/sim/releases/wheels.py``), about 1.5 min of CPU a release.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "operator"), str(ROOT)]

from tests.sim.releases.cases import ReleaseCase, sim_trace  # noqa: E402
from tests.sim.releases.wheels import vllm_extract  # noqa: E402

from chunktune.core.engine_args import resolve  # noqa: E402
from chunktune.core.models import FULL  # noqa: E402
from chunktune.core.vllm_release import parse_version  # noqa: E402
from chunktune.modelgen import write_tiny_model  # noqa: E402
from chunktune.sim.calibration import published  # noqa: E402
from chunktune.sim.engine.memory import kv_cache_layout, plan_memory  # noqa: E402

HARNESS = ROOT / "tests" / "sim" / "releases" / "vllm_scheduler.py"


def cases(group: list[str]) -> list[tuple[ReleaseCase, dict[str, object], int]]:
    """Per KV-bound published burst of a sliding-window model: the case, the harness's spec
    (the pool in vLLM's blocks, the groups) and the simulator's pool (full-attention
    blocks)."""
    out = []
    for run in published.read_runs():
        if run.client != "burst" or run.prompt_len < 30000 or "-tp" in run.args:
            continue
        if group and not any(g in run.name for g in group):
            continue
        try:
            args, model, gpu, version = published.engine(run)
        except Exception:
            continue
        if not model.sliding_window:
            continue
        cfg = resolve(args, model, gpu, version=version)
        plan = plan_memory(cfg)
        if not plan.pool_blocks:
            continue
        name = run.group.replace("/", "_") + ("_async" if cfg.async_scheduling else "")
        case = ReleaseCase(name, tuple((f"r{i}", run.prompt_len, run.output_len)
                                       for i in range(run.requests)),
                           max_num_batched_tokens=cfg.max_num_batched_tokens,
                           max_num_seqs=cfg.max_num_seqs, max_model_len=cfg.max_model_len,
                           enable_prefix_caching=True, num_gpu_blocks=plan.pool_blocks)
        spec = case.spec()
        engine = spec["engine"]
        assert isinstance(engine, dict)
        engine["kv_groups"] = ["full" if g.kind == FULL else "sliding"
                               for g in kv_cache_layout(cfg).groups]
        engine["sliding_window"] = model.sliding_window
        out.append((case, spec, plan.num_gpu_blocks))
    return out


def drive(release: str, specs: list[dict[str, object]], tiny: Path, tmp: Path
          ) -> dict[str, dict[str, object]]:
    """Each case through the release's own scheduler, one subprocess per case (a stalled
    case ends only its own)."""
    extract = vllm_extract(release)
    out: dict[str, dict[str, object]] = {}
    for spec in specs:
        name = str(spec["name"])
        spec_path, out_path = tmp / f"{name}.json", tmp / f"{name}-{release}.out.json"
        spec_path.write_text(json.dumps({"cases": [spec]}))
        proc = subprocess.run([sys.executable, str(HARNESS), str(extract), str(tiny),
                               str(spec_path), str(out_path)], capture_output=True, text=True,
                              timeout=1800, check=False)
        if proc.returncode == 0:
            out[name] = json.loads(out_path.read_text())["cases"][0]
        else:
            last = (proc.stdout + proc.stderr).strip().splitlines()[-1:]
            out[name] = {"error": last[0] if last else f"exit {proc.returncode}"}
    return out


def figures(steps: list[list[int]] | list[tuple[int, int, int, int]], preempted: list[int]
            ) -> str:
    return (f"steps {len(steps):6,d}  preemptions {sum(preempted):4d}  "
            f"prefill tokens {sum(s[1] for s in steps):10,d}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--release", action="append", default=[],
                    help="a vLLM release to drive (repeatable; default 0.18.0 and 0.34.0)")
    ap.add_argument("--group", action="append", default=[],
                    help="only the runs whose name contains TEXT (repeatable)")
    a = ap.parse_args()
    releases = a.release or ["0.18.0", "0.34.0"]
    found = cases(a.group)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        tiny = Path(write_tiny_model(str(tmp / "tiny")))
        for release in releases:
            version = parse_version(release, "--release")
            theirs = drive(release, [s for _, s, _ in found], tiny, tmp)
            for case, _, sim_blocks in found:
                r = theirs[case.name]
                print(f"{case.name}, vLLM {release}, pool {case.num_gpu_blocks:,} blocks "
                      f"(simulator: {sim_blocks:,} full-attention blocks)")
                if "error" in r:
                    print(f"  vLLM       stalled: {r['error']}")
                else:
                    print(f"  vLLM       {figures(r['steps'], r['preempted'])}")  # type: ignore[arg-type]
                ours = sim_trace(replace(case, num_gpu_blocks=sim_blocks), version)
                print(f"  simulator  {figures(ours.steps, ours.preempted)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
