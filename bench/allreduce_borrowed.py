"""vLLM's all-reduce on GPUs that borrow another GPU's measured table (B300, GB200 from the
B200): the backend vLLM runs on each and the simulated time, per world size and message size,
and a TP 8 Llama-3.1-70B FP8 decode step and 8192-token prefill step.

Usage: ``python bench/allreduce_borrowed.py [--gpus b300,gb200,b200] [--batch 64]``.

All figures are simulated: no B300 or GB200 all-reduce or step was measured here."""

from __future__ import annotations

import argparse

from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.sim.cost import allreduce_backends as ab
from chunktune.sim.cost.collectives import tp_allreduce_s

SIZES_KIB = (256, 1024, 2048, 3072, 4096, 8192, 16384)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", default="b300,gb200,b200")
    ap.add_argument("--batch", type=int, default=64, help="decodes in the decode step")
    ap.add_argument("--context", type=int, default=4500, help="tokens of context per decode")
    ap.add_argument("--prefill", type=int, default=8192, help="tokens of the prefill step")
    a = ap.parse_args()
    gpus = [resolve_gpu(g) for g in a.gpus.split(",")]
    print("all-reduce, us (backend vLLM runs)")
    print(f"{'gpu':6} {'n':>2} " + " ".join(f"{s:>19}" for s in
                                           (f"{k // 1024} MiB" if k >= 1024 else f"{k} KiB"
                                            for k in SIZES_KIB)))
    for g in gpus:
        for n in (2, 4, 8):
            cells = []
            for k in SIZES_KIB:
                s = float(k * 1024)
                us = float(tp_allreduce_s(s, n, g)) * 1e6
                cells.append(f"{us:7.1f} {ab.vllm_allreduce_backend(g, n, s):>11}")
            print(f"{g.name:6} {n:>2} " + " ".join(cells))
    from chunktune.sim.cost.step_time import StepCostModel
    model = resolve_model("llama-3.1-70b")
    b, kv = a.batch, a.batch * a.context
    print(f"\nLlama-3.1-70B FP8 TP 8 (ms): decode step of {b} at {a.context} tokens, "
          f"prefill step of {a.prefill} tokens; all-reduce part in brackets")
    for g in gpus:
        cost = StepCostModel(model, g, 8, max_tokens=8192, weight_dtype="fp8")
        dec = cost.step_time(b, b, b, [], b, kv)
        pre = cost.step_time(a.prefill, 1, 1, [(a.prefill, 0)], 0, 0)
        print(f"{g.name:6} decode {dec * 1e3:7.3f} ({cost.allreduce_time(b) * 1e3:.3f})  "
              f"prefill {pre * 1e3:8.3f} ({cost.allreduce_time(a.prefill) * 1e3:.3f})")


if __name__ == "__main__":
    main()
