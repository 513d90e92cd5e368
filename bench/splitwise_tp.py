"""Where Splitwise's Llama-2-70B steps differ from the step-time model, by tensor parallelism.

Usage: ``python bench/splitwise_tp.py [--data ../shared/data]``. Splitwise's
``data/perf_model.csv`` (Mutinifni/splitwise-sim, MIT) times static batches on DGX-A100 and
DGX-H100 with a 2023 serving stack (fp16, no CUDA graphs). Prints

1. decode iterations at batch 1 per TP: measured, the model and its terms, and what the excess
   would cost per all-reduce if it were one (160 per step);
2. how decode iterations grow from batch 1 to 64 at TP 8, measured and modelled;
3. prefills: a least-squares fit ``measured = a x (linear + attention) + bytes / BW + c`` per GPU
   over TP 2/4/8, where ``bytes`` is what each GPU's ring all-reduces move per step
   (2 per layer x 2(n-1)/n x tokens x hidden x 2 bytes): ``a`` scales the kernels, ``BW`` is the
   all-reduce bus bandwidth the stack reached;
4. decode iterations (all batches) fitted per GPU by three 4-parameter forms: the model's
   kernels scaled plus (a) an all-reduce latency per ring step, 2 (n - 1) per all-reduce, (b) one
   per tree level, log2 n, each with a cost per sequence and a constant, or (c) a host floor
   (a constant plus a cost per sequence) the kernels hide only when slower (soft maximum).
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.sim.cost import collectives
from chunktune.sim.cost.fit import kernel_data
from chunktune.sim.cost.step_time import StepCostModel

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    a = ap.parse_args()
    pts = kernel_data.read_splitwise(a.data)
    m = resolve_model("llama-2-70b")
    layers, h = m.num_hidden_layers, m.hidden_size
    cms = {(g, tp): StepCostModel(m, resolve_gpu(g), tp, max_tokens=65536)
           for g in ("a100-sxm", "h100-sxm") for tp in (2, 4, 8)}

    print("1. decode, batch 1 (median over prompts and lengths), ms")
    print(f"{'gpu':9} {'tp':>2} {'measured':>8} {'model':>6} {'linear':>6} {'attn':>5} "
          f"{'allred':>6} {'ovh':>4} {'excess':>6} {'us/allreduce':>12}")
    for (g, tp), cm in cms.items():
        sel = [p for p in pts if p.gpu == g and p.tp == tp and p.batch == 1]
        meas = statistics.median(p.token_ms for p in sel)
        ctx = int(statistics.median(p.prompt + p.generated // 2 for p in sel))
        lin, att = cm.linear_time(1) * 1e3, cm.attention_time([], 1, ctx) * 1e3
        ar = cm.allreduce_time(1) * 1e3
        tot = cm.step_time(1, 1, 1, [], 1, ctx) * 1e3
        print(f"{g:9} {tp:>2} {meas:8.1f} {tot:6.1f} {lin:6.1f} {att:5.1f} {ar:6.2f} "
              f"{tot - lin - att - ar:4.1f} {meas - tot:6.1f} "
              f"{(meas - tot) / (2 * layers) * 1e3:12.0f}")

    print("\n2. decode at TP 8, prompt 512, 128 tokens: batch 1 -> 64, ms")
    for g in ("a100-sxm", "h100-sxm"):
        cm = cms[(g, 8)]
        by_b = {p.batch: p.token_ms for p in pts
                if p.gpu == g and p.tp == 8 and p.prompt == 512 and p.generated == 128}
        mod = {b: cm.step_time(b, b, b, [], b, b * 576) * 1e3 for b in (1, 64)}
        print(f"{g:9} measured {by_b[1]:5.1f} -> {by_b[64]:5.1f} (+{by_b[64] - by_b[1]:4.1f}); "
              f"model {mod[1]:5.1f} -> {mod[64]:5.1f} (+{mod[64] - mod[1]:4.1f})")

    print("\n3. prefill (batches of >= 2048 tokens): measured = a x (linear + attention) "
          "+ all-reduce bytes / BW + c")
    for g in ("a100-sxm", "h100-sxm"):
        rows: dict[str, list[list[float]]] = defaultdict(list)
        for p in pts:
            tokens = p.batch * p.prompt
            if p.gpu != g or tokens < 2048 or p.prompt_ms < 0.2 * tokens / p.tp:
                continue  # (a few rows are far below any GEMM time: failed runs)
            cm = cms[(g, p.tp)]
            kern = (cm.linear_time(tokens) + cm.attention_time([(p.prompt, 0)] * p.batch, 0, 0))
            moved = 2 * layers * 2 * (p.tp - 1) / p.tp * tokens * h * m.dtype_bytes
            rows["x"].append([kern * 1e3, moved / 1e9, 1.0])
            rows["y"].append([p.prompt_ms])
        x, y = np.array(rows["x"]), np.array(rows["y"])[:, 0]
        coef, *_ = np.linalg.lstsq(x / y[:, None], np.ones_like(y), rcond=None)
        err = np.median(np.abs(x @ coef / y - 1))
        link, kind = collectives.gpu_interconnect(resolve_gpu(g)).bottleneck(8)
        model_bw = link * collectives.collective_coefficients().link_eff[kind] / 1e9
        print(f"{g:9} a = {coef[0]:.2f}, BW = {1e3 / coef[1]:5.1f} GB/s (NCCL on its NVSwitch, "
              f"Vidur: {model_bw:.0f} GB/s), c = {coef[2]:6.1f} ms (median |error| {err:.1%}, "
              f"{len(y)} batches)")

    print("\n4. decode iterations, all batches: three forms fitted per GPU")
    from scipy.optimize import least_squares

    for g in ("a100-sxm", "h100-sxm"):
        cols: dict[str, list[float]] = defaultdict(list)
        for p in pts:
            if p.gpu != g:
                continue
            cm, b = cms[(g, p.tp)], p.batch
            ctx = p.prompt + p.generated // 2
            # the model's GPU time: the step less its all-reduces and host overheads
            kern = (cm.step_time(b, b, b, [], b, b * ctx) - cm.allreduce_time(b)
                    - cm.c.step_overhead_s - cm.c.per_request_overhead_s * b)
            for k, v in (("kern", kern * 1e3), ("n", p.tp), ("b", b), ("y", p.token_ms)):
                cols[k].append(v)
        k_, n_, b_, y_ = (np.array(cols[k]) for k in ("kern", "n", "b", "y"))
        for name, f, x0, unit in (("ring steps", _ring, [1, 10, 0.2, 1], "us/step"),
                                  ("tree levels", _tree, [1, 50, 0.2, 1], "us/level"),
                                  ("host floor", _host, [1, 40, 0.3, 1], "ms floor")):
            args = (k_, n_, b_, 2 * layers)
            r = least_squares(_log_ratio, x0, args=(f, y_, *args))
            e = np.abs(f(r.x, *args) / y_ - 1)
            x = r.x
            print(f"{g:9} {name:11}: kernels x {x[0]:.2f}, {x[1]:5.1f} {unit}, "
                  f"{x[2] * 1e3:3.0f} us/sequence, {x[3]:+5.1f} ms; median |error| "
                  f"{np.median(e):.1%}, p90 {np.percentile(e, 90):.1%}")


Form = Callable[..., np.ndarray]


def _ring(x: np.ndarray, k: np.ndarray, n: np.ndarray, b: np.ndarray, ars: int) -> np.ndarray:
    out: np.ndarray = x[0] * k + ars * x[1] * 1e-3 * 2 * (n - 1) + x[2] * b + x[3]
    return out


def _tree(x: np.ndarray, k: np.ndarray, n: np.ndarray, b: np.ndarray, ars: int) -> np.ndarray:
    out: np.ndarray = x[0] * k + ars * x[1] * 1e-3 * np.log2(n) + x[2] * b + x[3]
    return out


def _host(x: np.ndarray, k: np.ndarray, n: np.ndarray, b: np.ndarray, ars: int) -> np.ndarray:
    out: np.ndarray = ((x[0] * k) ** 8 + (x[1] + x[2] * b) ** 8) ** (1 / 8) + x[3]
    return out


def _log_ratio(x: np.ndarray, f: Form, y: np.ndarray, *args: object) -> np.ndarray:
    out: np.ndarray = np.log(np.maximum(f(x, *args), 1e-3) / y)
    return out

if __name__ == "__main__":
    main()
