"""One decode step's simulated parts at TP 1/2/4/8: a bf16 dense 32B (Qwen3-32B) against the FP8
70B (Llama-3.1-70B) the dense guard's H100/H200 rows run (issue #32).

Usage: ``python bench/tp_step_breakdown.py [--gpu h100-sxm] [--batch 24,64] [--context 4500]``.

Prints per TP the simulator's linear, attention, all-reduce (and per call), lm_head + sampler and
host terms of a decode-only step of ``batch`` requests at ``context`` tokens each, its total with
and without async scheduling, and two TP-dependent items the step does not price (both from vLLM's
own code, docs/simulator.md says where): the sampler's fp32 passes over the whole vocabulary
(``LogitsProcessor._gather_logits`` all-gathers the logits, so every rank samples all of it; the
model prices ``vocab / tp``), and the bytes of that all-gather. All figures are simulated."""

from __future__ import annotations

import argparse

from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.sim.cost.step_time import StepCostModel

MODELS = (("qwen3-32b", "bf16"), ("llama-3.1-70b", "fp8"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", default="h100-sxm")
    ap.add_argument("--batch", default="24,64", help="decodes per step, comma-separated")
    ap.add_argument("--context", type=int, default=4500, help="tokens of context per decode")
    a = ap.parse_args()
    gpu = resolve_gpu(a.gpu)
    print(f"{'model':14} {'w':4} {'tp':>2} {'B':>4} {'linear':>7} {'attn':>6} {'allred':>6} "
          f"{'us/call':>7} {'lm+smp':>6} {'host':>5} {'sync':>6} {'async':>6} "
          f"{'smp@V':>6} {'gather':>7}   (ms; gather: MB)")
    for name, wd in MODELS:
        model = resolve_model(name)
        calls = 2 * model.num_hidden_layers
        for b in map(int, a.batch.split(",")):
            for tp in (1, 2, 4, 8):
                cost = StepCostModel(model, gpu, tp, max_tokens=8192, weight_dtype=wd)
                kv = b * a.context
                lin, att = cost.linear_time(b), cost.attention_time([], b, kv)
                ar = cost.allreduce_time(b)
                lm = cost.forward_time(b, b, [], b, kv) - cost.forward_time(b, 0, [], b, kv)
                sync = cost.step_time(b, b, b, [], b, kv)
                # the host's part: overhead, per request, the executor's messages at TP > 1
                host = sync - cost.forward_time(b, b, [], b, kv)
                cost.async_scheduling = True
                asy = cost.step_time(b, b, b, [], b, kv)
                # the sampler's three fp32 passes over the vocabulary every rank samples, less
                # the vocab / tp the model prices (lower bound: what lm_row_s's memory side says)
                unpriced = 3 * model.vocab_size * 4 * (1 - 1 / tp) * b / cost._B
                gather = b * model.vocab_size * model.dtype_bytes * (tp - 1) / tp / 1e6
                print(f"{name:14} {wd:4} {tp:2d} {b:4d} {lin * 1e3:7.2f} {att * 1e3:6.2f} "
                      f"{ar * 1e3:6.3f} {ar / calls * 1e6 if tp > 1 else 0:7.1f} "
                      f"{lm * 1e3:6.3f} {host * 1e3:5.2f} {sync * 1e3:6.2f} {asy * 1e3:6.2f} "
                      f"{unpriced * 1e3:6.3f} {gather:7.2f}")


if __name__ == "__main__":
    main()
