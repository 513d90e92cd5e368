"""Real vLLM 0.32 (CPU build, tiny model) against the simulator, configuration by configuration.

For each engine configuration and request batch — the conformance suite's cases
(``tests/conformance/cases.py``) plus a few mixed batches — it runs the same token-id requests
through an in-process vLLM engine (``tests/conformance/vllm_steps.py``, all requests waiting
before step 0, same KV block count and block size) and through the simulator's scheduler
(``chunktune.sim.engine.step_trace``), and prints:

- steps: vLLM's and the simulator's step counts, and the *step agreement*: the share of step
  indices whose (context requests, context tokens, generation requests, generation tokens) are
  identical, over the longer of the two sequences;
- preemptions: totals on each side (as vLLM reports them), and whether the completion order is
  the same.

Then (unless ``--no-metrics``) it starts a real vLLM API server and ``chunktune sim serve`` with
the same flags, sends both the same few requests, and prints the ``/metrics`` coverage: the
share of vLLM's ``vllm:`` families the simulator exposes, and of those, the share with the same
type, label names and buckets; and whether the Content-Type matches.

    python bench/real_vs_sim.py                       # writes the tiny model to a temp dir
    python bench/real_vs_sim.py --model DIR           # a `chunktune model tiny DIR` directory

Needs real vLLM (``pip install -e '.[cpu]'``). Takes 1-3 minutes on an idle 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

import requests  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from tests.conformance.cases import ENGINES, Case, EngineCase, sim_trace, vllm_spec  # noqa: E402

#: Mixed batches beyond the conformance cases: a chat-heavy batch with two long prompts under a
#: small budget with a threshold, the same without a threshold, and a KV-tight mixed batch.
MIXED = tuple((f"m{i}", (1500 if i % 5 == 0 else 40 + 37 * i), 4 + i % 7) for i in range(12))
EXTRA: tuple[EngineCase, ...] = (
    EngineCase("mixed_budget128_threshold64", max_num_batched_tokens=128,
               long_prefill_token_threshold=64, max_num_seqs=8, max_model_len=2048,
               num_gpu_blocks=256, cases=(Case("mixed", MIXED),)),
    EngineCase("mixed_budget512_no_threshold", max_num_batched_tokens=512, max_num_seqs=8,
               max_model_len=2048, num_gpu_blocks=256, cases=(Case("mixed", MIXED),)),
    EngineCase("mixed_kv_tight", max_num_batched_tokens=256, long_prefill_token_threshold=128,
               max_num_seqs=8, max_model_len=2048, num_gpu_blocks=20,
               cases=(Case("mixed", tuple((f"k{i}", 200 + 50 * i, 150) for i in range(8))),)),
)

METRIC_FLAGS = ["--max-num-batched-tokens", "64", "--long-prefill-token-threshold", "32",
                "--max-num-seqs", "4", "--max-model-len", "2048", "--block-size", "128",
                "--num-gpu-blocks-override", "256", "--kv-cache-memory-bytes", str(64 * 2**20),
                "--no-enable-prefix-caching", "--served-model-name", "tiny"]


def vllm_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "operator"), env.get("PYTHONPATH", "")])
    return env


def run_real_steps(model: Path, engines: tuple[EngineCase, ...], tmp: Path) -> dict[str, Any]:
    spec, out = tmp / "spec.json", tmp / "out.json"
    spec.write_text(json.dumps(vllm_spec(model, engines)))
    env = vllm_env()
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    proc = subprocess.run([sys.executable, str(ROOT / "tests/conformance/vllm_steps.py"),
                           str(spec), str(out)], env=env, capture_output=True, text=True,
                          timeout=1800, check=False)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        sys.exit(f"vllm_steps.py failed ({proc.returncode}):\n{tail}")
    return json.loads(out.read_text())


def agreement(real: list[tuple[int, ...]], sim: list[tuple[int, ...]]) -> float:
    n = max(len(real), len(sim))
    return sum(a == b for a, b in zip(real, sim, strict=False)) / n if n else 1.0


def steps_table(model: Path, tmp: Path) -> list[dict[str, Any]]:
    engines = ENGINES + EXTRA
    real = run_real_steps(model, engines, tmp)
    by_name = {(e["name"], c["name"]): c for e in real["engines"] for c in e["cases"]}
    rows = []
    for eng in engines:
        for case in eng.cases:
            r = by_name[(eng.name, case.name)]
            s = sim_trace(eng, case, model / "config.json")
            rsteps = [tuple(x) for x in r["steps"]]
            rows.append({
                "config": f"{eng.name}/{case.name}", "real_steps": len(rsteps),
                "sim_steps": len(s.steps), "agreement": agreement(rsteps, s.steps),
                "real_preemptions": sum(r["preempted"]), "sim_preemptions": sum(s.reported),
                "same_order": r["finished"] == s.finished,
            })
    return rows


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_health(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode} while starting")
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"no /health within {timeout:.0f} s")


def _scrape(cmd: list[str], port: int, log: Path, timeout: float) -> tuple[str, str]:
    url = f"http://127.0.0.1:{port}"
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=vllm_env(),
                                start_new_session=True)
        try:
            _wait_health(url, proc, timeout)
            for i, (p, o) in enumerate(((10, 5), (1000, 3), (37, 1))):
                requests.post(url + "/v1/completions", timeout=300, json={
                    "model": "tiny", "prompt": [100 + (7 * i + k) % 3000 for k in range(p)],
                    "max_tokens": o, "min_tokens": o, "ignore_eos": True}).raise_for_status()
            r = requests.get(url + "/metrics", timeout=30)
            return r.headers.get("Content-Type", ""), r.text
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=30)


def _shape(text: str) -> dict[str, tuple[str, frozenset[str], tuple[str, ...]]]:
    out = {}
    for f in text_string_to_metric_families(text):
        if f.name.startswith("vllm:"):
            labels = frozenset(k for s in f.samples for k in s.labels if k != "le")
            buckets = tuple(s.labels["le"] for s in f.samples if s.name.endswith("_bucket"))
            out[f.name] = (f.type, labels, buckets)
    return out


def metrics_coverage(model: Path, tmp: Path) -> dict[str, Any]:
    port = _free_port()
    real_ct, real_text = _scrape(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
         "--load-format", "dummy", "--enforce-eager", "--host", "127.0.0.1", "--port",
         str(port), *METRIC_FLAGS], port, tmp / "vllm.log", 600)
    port = _free_port()
    sim_ct, sim_text = _scrape(
        [sys.executable, "-m", "chunktune", "sim", "serve", str(model), "--host", "127.0.0.1",
         "--port", str(port), "--load-time", "0", *METRIC_FLAGS], port, tmp / "sim.log", 60)
    real, sim = _shape(real_text), _shape(sim_text)
    families = [n for n in real if not n.endswith("_created")]
    present = [n for n in families if n in sim]
    same = [n for n in present if sim[n] == real[n]]
    return {"real_families": len(families), "sim_present": len(present),
            "sim_same_shape": len(same), "missing": sorted(set(families) - set(present)),
            "extra": sorted(n for n in sim if n not in real),
            "content_type_same": real_ct == sim_ct, "content_type": real_ct}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a `chunktune model tiny` directory (default: write one)")
    ap.add_argument("--no-metrics", action="store_true", help="skip the /metrics comparison")
    ns = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="real-vs-sim-") as tmpdir:
        tmp = Path(tmpdir)
        if ns.model:
            model = Path(ns.model)
        else:
            from chunktune.modelgen import write_tiny_model

            model = Path(write_tiny_model(tmp / "tiny"))
        t0 = time.monotonic()
        rows = steps_table(model, tmp)
        print(f"step sequences, real vLLM 0.32 (in process) vs simulator "
              f"({time.monotonic() - t0:.0f} s)")
        print(f"{'configuration':56s} {'steps real/sim':>15s} {'agreement':>9s} "
              f"{'preempt real/sim':>17s} {'order':>6s}")
        for r in rows:
            print(f"{r['config']:56s} {r['real_steps']:>7d}/{r['sim_steps']:<7d} "
                  f"{r['agreement']:>9.1%} {r['real_preemptions']:>8d}/{r['sim_preemptions']:<8d} "
                  f"{'same' if r['same_order'] else 'DIFF':>6s}")
        total_real = sum(r["real_steps"] for r in rows)
        weighted = sum(r["agreement"] * max(r["real_steps"], r["sim_steps"]) for r in rows) \
            / sum(max(r["real_steps"], r["sim_steps"]) for r in rows)
        print(f"all: {len(rows)} configurations, {total_real} vLLM steps, step agreement "
              f"{weighted:.1%} (weighted by steps)")
        if not ns.no_metrics:
            t0 = time.monotonic()
            m = metrics_coverage(model, tmp)
            print(f"\n/metrics, real vLLM 0.32 API server vs chunktune sim serve "
                  f"({time.monotonic() - t0:.0f} s)")
            print(f"vllm: families (without _created): {m['real_families']}; simulator exposes "
                  f"{m['sim_present']} ({m['sim_present'] / m['real_families']:.0%}), "
                  f"{m['sim_same_shape']} with the same type, labels and buckets")
            print(f"missing: {', '.join(m['missing']) or 'none'}; "
                  f"simulator-only vllm: families: {', '.join(m['extra']) or 'none'}")
            print(f"Content-Type: {m['content_type']} "
                  f"({'same' if m['content_type_same'] else 'DIFFERENT'} on the simulator)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
