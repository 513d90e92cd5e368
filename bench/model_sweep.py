"""Every model config users serve, on every catalog GPU and a few TP sizes: which the simulator
runs, which it refuses by name, which vLLM would not start, and anything else (a traceback is a
bug).

Usage: ``python bench/model_sweep.py [--data ../shared/data] [--gpus b200,b300] [--tp 1,2,8]
[--list]``.

Reads the ``config.json`` files of ``aiconfigurator-vllm/model-configs`` in the shared data
folder (the models of issue 32: DeepSeek, Kimi, gpt-oss, Qwen3, MiniMax, Llama-4, Gemma-4,
...), builds each engine as ``chunktune sim run --model-config F --gpu G
--tensor-parallel-size N`` does (and ``--enable-expert-parallel`` for a mixture of experts at
TP > 1) and prices one decode step and one prefill chunk, in process. Prints per GPU how many
ran, were refused (the simulator's :class:`SpecError`: a layer kind or kernel not modelled,
named), failed to start as vLLM would (:class:`EngineStartupError`: weights over the memory,
no room for the KV cache), and raised anything else; ``--list`` prints every refusal and
failure. What a GPU refuses that its measured sibling runs is the thing to look at (the B300
and GB200 refused every MLA model until 2026-12-07). Simulated; no GPU.
"""

from __future__ import annotations

import argparse
import traceback
from collections import Counter
from pathlib import Path

from chunktune.core.engine_args import EngineArgs, EngineStartupError
from chunktune.core.errors import SpecError
from chunktune.core.gpus import gpu_names, resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.sim.engine.virtual import build_engine

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def outcome(config: Path, gpu: str, tp: int, ep: bool) -> tuple[str, str]:
    """``("ran" | "refused" | "no start" | "error", why)`` for one engine."""
    try:
        model = resolve_model(config_path=config)
        args = EngineArgs(tensor_parallel_size=tp, enable_expert_parallel=ep)
        engine = build_engine(args, model, resolve_gpu(gpu))
        cost = engine.cost
        cost.step_time(16, 16, 16, [], 16, 16 * 2048)
        cost.step_time(512, 1, 1, [(512, 0)], 0, 0)
    except SpecError as e:
        return "refused", str(e).splitlines()[0]
    except EngineStartupError as e:
        return "no start", e.reason
    except Exception:  # the bench reports it
        return "error", traceback.format_exc().strip().splitlines()[-1]
    return "ran", ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    ap.add_argument("--gpus", default="", help="comma-separated (default: every catalog GPU)")
    ap.add_argument("--tp", default="1,2,8", help="tensor-parallel sizes, comma-separated")
    ap.add_argument("--list", action="store_true", help="print every refusal and failure")
    a = ap.parse_args()
    folder = a.data / "aiconfigurator-vllm" / "model-configs"
    configs = sorted(p for p in folder.glob("*_config.json") if "hf_quant" not in p.name)
    if not configs:
        ap.error(f"--data {a.data}: no model configs under {folder}")
    gpus = [g for g in (a.gpus.split(",") if a.gpus else gpu_names()) if g != "cpu"]
    tps = [int(t) for t in a.tp.split(",")]
    counts: dict[str, Counter[str]] = {g: Counter() for g in gpus}
    for config in configs:
        moe = '"num_experts' in config.read_text() or "n_routed_experts" in config.read_text() \
            or "num_local_experts" in config.read_text()
        for gpu in gpus:
            for tp in tps:
                for ep in ((False, True) if moe and tp > 1 else (False,)):
                    kind, why = outcome(config, gpu, tp, ep)
                    counts[gpu][kind] += 1
                    if a.list and kind != "ran":
                        name = config.name.removesuffix("_config.json")
                        print(f"{kind:8} {name:48} {gpu:12} tp{tp}{' ep' if ep else ''}: {why}")
    print(f"{'GPU':14} {'ran':>5} {'refused':>8} {'no start':>9} {'error':>6}  "
          f"({len(configs)} configs, TP {a.tp}; simulated)")
    for gpu in gpus:
        c = counts[gpu]
        print(f"{gpu:14} {c['ran']:5d} {c['refused']:8d} {c['no start']:9d} {c['error']:6d}")
    return 1 if any(c["error"] for c in counts.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
