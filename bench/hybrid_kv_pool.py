"""The simulator's hybrid KV pool against vLLM's own hybrid KV cache manager, per release.

A model whose layers mix sliding-window or chunked-local attention with full attention
(gpt-oss, Gemma-4, Llama-4) has several KV-cache groups in one pool of blocks: a windowed
group frees the blocks its window leaves and finds a prefix-cache hit only where the window's
blocks before it are still cached, and the admission gate reserves at most its cap
(``max_admission_blocks_per_request``). The simulator counts each group's blocks so
(``kv_cache.HybridBlocks``, ``HybridPrefixCache``). This script drives each release's own
``Scheduler`` (the per-release suite's harness, ``tests/sim/releases/vllm_scheduler.py``) with
the model's groups at the pool the simulator plans, and prints its steps, preemptions and
prefill tokens (recomputed ones included) beside the simulator's on the same pool: for each
KV-bound published burst of a sliding-window model (100 x 32,000-token gpt-oss prompts,
``bench/published_runs.py``; prefix caching on, as vLLM ran), and for Llama-4 Scout on four
H100s (TP 4, ``--max-model-len 32768``) under a burst of 600 chat-length requests (2,000
tokens in, 300 out), where a request holds as many blocks in each of its three chunked
groups as in its full one. A release whose scheduler stops admitting is reported as stalled
(vLLM 0.19's gate, issue #39734).

Usage: ``python bench/hybrid_kv_pool.py [--release 0.34.0 ...] [--group TEXT]``; each release's
wheel is downloaded once (``tests/sim/releases/wheels.py``), a few minutes of CPU a release.
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

from chunktune.core.engine_args import EngineArgs, ResolvedConfig, resolve  # noqa: E402
from chunktune.core.gpus import resolve_gpu  # noqa: E402
from chunktune.core.models import FULL, resolve_model  # noqa: E402
from chunktune.core.vllm_release import parse_version  # noqa: E402
from chunktune.modelgen import write_tiny_model  # noqa: E402
from chunktune.sim.calibration import published  # noqa: E402
from chunktune.sim.engine.memory import kv_cache_layout, plan_memory  # noqa: E402

HARNESS = ROOT / "tests" / "sim" / "releases" / "vllm_scheduler.py"


def _case(name: str, cfg: ResolvedConfig, pool: int,
          requests: tuple[tuple[str, int, int], ...]) -> ReleaseCase:
    groups = tuple("full" if g.kind == FULL else g.kind.split("_")[0]
                   for g in kv_cache_layout(cfg).groups)
    m = cfg.model
    return ReleaseCase(name, requests, max_num_batched_tokens=cfg.max_num_batched_tokens,
                       max_num_seqs=cfg.max_num_seqs, max_model_len=cfg.max_model_len,
                       enable_prefix_caching=cfg.enable_prefix_caching, num_gpu_blocks=pool,
                       kv_groups=groups, window=m.sliding_window or m.attention_chunk_size,
                       extra={"async_scheduling": cfg.async_scheduling})


def cases(group: list[str]) -> list[ReleaseCase]:
    """Per KV-bound published burst of a sliding-window model and the Llama-4 Scout burst:
    the case at the pool the simulator plans (vLLM's blocks)."""
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
        cfg = resolve(replace(args, enable_prefix_caching=True), model, gpu, version=version)
        plan = plan_memory(cfg)
        if not plan.pool_blocks:
            continue
        name = run.group.replace("/", "_") + ("_async" if cfg.async_scheduling else "")
        out.append(_case(name, cfg, plan.pool_blocks,
                         tuple((f"r{i}", run.prompt_len, run.output_len)
                               for i in range(run.requests))))
    if not group or any(g in "llama-4-scout" for g in group):
        cfg = resolve(EngineArgs(tensor_parallel_size=4, max_model_len=32768),
                      resolve_model("llama-4-scout"), resolve_gpu("h100-sxm"))
        out.append(_case("llama-4-scout_h100_tp4_chat", cfg, plan_memory(cfg).pool_blocks,
                         tuple((f"r{i}", 2000, 300) for i in range(600))))
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
            theirs = drive(release, [c.spec() for c in found], tiny, tmp)
            for case in found:
                print(f"{case.name}, vLLM {release}, pool {case.num_gpu_blocks:,} blocks, "
                      f"groups {'/'.join(case.kv_groups)}")
                r = theirs[case.name]
                if "error" in r:
                    print(f"  vLLM       stalled: {r['error']}")
                else:
                    print(f"  vLLM       {figures(r['steps'], r['preempted'])}")  # type: ignore[arg-type]
                if not case.runs_on(version):
                    print("  simulator  refused by name (0.19's gate over windowed layers)")
                    continue
                ours = sim_trace(case, version, tiny / "config.json")
                print(f"  simulator  {figures(ours.steps, ours.preempted)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
