"""Calibration of the step-time model against Vidur's GPU profiling data.

Source: microsoft/vidur, ``data/profiling/compute/{a100,h100}/<model>/mlp.csv`` (MIT licence),
per-layer median timings of the linear operators measured on real A100 and H100 GPUs at TP 1, 2,
4 and 8, for Llama-2-7B/70B, CodeLlama-34B and Llama-3-8B/70B (Llama-3 on A100 only).

Two artefacts are committed, both derived from that data:

- ``data/vidur_linear_ms.csv``: for each (GPU, model, TP, tokens) the per-layer sum of the
  operators' median times (duplicate measurements averaged), the quantity the model predicts;
- ``data/step_time_coefficients.json``: the fitted efficiencies per GPU family.

Regenerate both with ``python -m chunktune.sim.calibration fit --data DIR`` (``DIR`` holds the
``<gpu>__<model>.mlp.csv`` files); ``python -m chunktune.sim.calibration report`` prints the
error table, including a leave-one-model-out check that the fit generalizes to models it has not
seen.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import ModelConfig, resolve_model
from chunktune.sim.cost_model import (
    COEFFICIENTS_PATH,
    FamilyCoefficients,
    coefficients,
    linear_layer_time,
)

DERIVED_PATH = Path(__file__).with_name("data") / "vidur_linear_ms.csv"
OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
       "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
#: Vidur's model directory names -> our catalog.
VIDUR_MODELS = {
    "Llama-2-7b-hf": "llama-2-7b",
    "Llama-2-70b-hf": "llama-2-70b",
    "CodeLlama-34b-Instruct-hf": "codellama-34b",
    "Meta-Llama-3-8B": "llama-3-8b",
    "Meta-Llama-3-70B": "llama-3-70b",
}
VIDUR_GPUS = {"a100": "a100-sxm", "h100": "h100-sxm"}
#: Coefficients not fitted here, with where they come from.
FIXED = {
    # FlashAttention-2 forward reaches 50-73% of A100 peak and FlashAttention-3 up to 75% of
    # H100 peak on long sequences (Dao 2023, arXiv 2307.08691; Shah et al. 2024, arXiv
    # 2407.08608); varlen/paged kernels in serving run lower, so we take ~0.5.
    "attention_compute_eff": {"ampere": 0.5, "hopper": 0.45},
    # vLLM V1: "the GPU part of a Llama-8B step on H100 is as low as ~5 ms" and the CPU work
    # is overlapped or CUDA-graphed; ~1 ms per step plus a few us per request remains.
    "step_overhead_s": {"ampere": 0.0012, "hopper": 0.001},
    "per_request_overhead_s": {"ampere": 6e-6, "hopper": 5e-6},
    # --enforce-eager: ~10 kernels per layer launched from Python at ~4 us each.
    "eager_launch_overhead_per_layer_s": {"ampere": 4e-5, "hopper": 4e-5},
    # NCCL all-reduce: ~10 us latency on NVLink; ~70% of link bandwidth achieved.
    "allreduce_latency_s": {"ampere": 1e-5, "hopper": 1e-5},
    "allreduce_link_eff": {"ampere": 0.7, "hopper": 0.7},
}
FITTED = ("gemm_compute_eff", "gemm_memory_eff", "gemm_overhead_s", "gemm_smoothness",
          "elementwise_memory_eff", "elementwise_overhead_s")


@dataclass(frozen=True)
class Sample:
    gpu: str
    model: str
    tp: int
    tokens: int
    per_layer_ms: float


def derive(data_dir: Path) -> list[Sample]:
    """Per-layer linear time from the raw ``mlp.csv`` files (duplicates averaged)."""
    acc: dict[tuple[str, str, int, int], list[float]] = defaultdict(list)
    for f in sorted(data_dir.glob("*__*.mlp.csv")):
        gpu, model = f.name.removesuffix(".mlp.csv").split("__")
        if model not in VIDUR_MODELS:
            continue
        with f.open() as fh:
            for r in csv.DictReader(fh):
                ms = sum(float(r[f"time_stats.{op}.median"]) for op in OPS)
                key = (gpu, model, int(r["num_tensor_parallel_workers"]), int(r["num_tokens"]))
                acc[key].append(ms)
    return [Sample(g, m, tp, t, statistics.fmean(v)) for (g, m, tp, t), v in sorted(acc.items())]


def write_derived(samples: list[Sample], path: Path = DERIVED_PATH) -> None:
    with path.open("w", newline="") as fh:
        fh.write("# Derived from microsoft/vidur data/profiling/compute/*/mlp.csv "
                 "(MIT licence):\n")
        fh.write("# per-layer sum of the linear operators' median times, duplicates averaged.\n")
        w = csv.writer(fh)
        w.writerow(["gpu", "model", "tp", "num_tokens", "per_layer_ms"])
        for s in samples:
            w.writerow([s.gpu, s.model, s.tp, s.tokens, f"{s.per_layer_ms:.5f}"])


def read_derived(path: Path = DERIVED_PATH) -> list[Sample]:
    with path.open() as fh:
        rows = csv.DictReader(line for line in fh if not line.startswith("#"))
        return [Sample(r["gpu"], r["model"], int(r["tp"]), int(r["num_tokens"]),
                       float(r["per_layer_ms"])) for r in rows]


def _groups(samples: list[Sample]) -> dict[tuple[str, str, int], tuple[np.ndarray, np.ndarray]]:
    g: dict[tuple[str, str, int], list[Sample]] = defaultdict(list)
    for s in samples:
        g[(s.gpu, s.model, s.tp)].append(s)
    return {k: (np.array([s.tokens for s in v], float), np.array([s.per_layer_ms for s in v]))
            for k, v in g.items()}


def _model(name: str) -> ModelConfig:
    return resolve_model(VIDUR_MODELS[name])


def predict_ms(c: FamilyCoefficients, gpu: str, model: str, tp: int,
               tokens: np.ndarray) -> np.ndarray:
    return linear_layer_time(_model(model), resolve_gpu(VIDUR_GPUS[gpu]), tp, tokens, c) * 1e3


def _coeffs(x: np.ndarray, family: str) -> FamilyCoefficients:
    vals = dict(zip(FITTED, np.abs(x), strict=True))
    vals["gemm_smoothness"] = 1.0 + vals["gemm_smoothness"]
    vals.update({k: v[family] for k, v in FIXED.items()})
    return FamilyCoefficients(**vals)


def fit_family(samples: list[Sample], gpu: str) -> FamilyCoefficients:
    """Least squares on the log ratio predicted/measured, every (model, TP) weighted equally."""
    from scipy.optimize import least_squares

    family = resolve_gpu(VIDUR_GPUS[gpu]).family
    groups = {k: v for k, v in _groups(samples).items() if k[0] == gpu}

    def resid(x: np.ndarray) -> np.ndarray:
        c = _coeffs(x, family)
        out = []
        for (g, m, tp), (tok, ms) in groups.items():
            r = np.log(predict_ms(c, g, m, tp, tok) / ms)
            out.append(r / np.sqrt(len(r)))
        return np.concatenate(out)

    x0 = np.array([0.7, 0.85, 3e-6, 0.5, 0.6, 2e-6])
    res = least_squares(resid, x0, x_scale=np.array([0.1, 0.1, 1e-6, 0.3, 0.1, 1e-6]))
    return _coeffs(res.x, family)


def fit(samples: list[Sample]) -> dict[str, Any]:
    families: dict[str, Any] = {}
    for gpu in sorted({s.gpu for s in samples}):
        c = fit_family(samples, gpu)
        families[resolve_gpu(VIDUR_GPUS[gpu]).family] = {
            k: float(f"{getattr(c, k):.6g}") for k in FamilyCoefficients.__dataclass_fields__
        }
    return {
        "source": "microsoft/vidur data/profiling/compute/{a100,h100}/*/mlp.csv (MIT licence); "
                  "fitted by chunktune.sim.calibration",
        "fitted": list(FITTED),
        "fixed_sources": "see chunktune.sim.calibration.FIXED",
        "families": families,
    }


@dataclass(frozen=True)
class ErrorRow:
    gpu: str
    model: str
    tp: int
    n: int
    median_rel_err: float
    max_rel_err: float


def error_table(samples: list[Sample],
                coeffs: dict[str, FamilyCoefficients] | None = None) -> list[ErrorRow]:
    """Relative error of the committed (or given) coefficients, per GPU, model and TP."""
    rows = []
    for (g, m, tp), (tok, ms) in sorted(_groups(samples).items()):
        family = resolve_gpu(VIDUR_GPUS[g]).family
        c = coeffs[family] if coeffs else coefficients(family)
        err = np.abs(predict_ms(c, g, m, tp, tok) / ms - 1.0)
        rows.append(ErrorRow(g, m, tp, len(err), float(np.median(err)), float(err.max())))
    return rows


def leave_one_model_out(samples: list[Sample]) -> list[ErrorRow]:
    """Fit without each model in turn and measure the error on it: a model that is not in the
    data is predicted from its config alone."""
    rows = []
    for gpu in sorted({s.gpu for s in samples}):
        family = resolve_gpu(VIDUR_GPUS[gpu]).family
        models = sorted({s.model for s in samples if s.gpu == gpu})
        for held in models:
            train = [s for s in samples if s.gpu == gpu and s.model != held]
            c = fit_family(train, gpu)
            test = [s for s in samples if s.gpu == gpu and s.model == held]
            for r in error_table(test, {family: c}):
                rows.append(r)
    return rows


def format_table(rows: list[ErrorRow], title: str) -> str:
    out = [title, f"{'gpu':5} {'model':27} {'tp':>2} {'n':>4} {'median':>7} {'max':>7}"]
    for r in rows:
        out.append(f"{r.gpu:5} {r.model:27} {r.tp:>2} {r.n:>4} {r.median_rel_err:>7.1%} "
                   f"{r.max_rel_err:>7.1%}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m chunktune.sim.calibration")
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit", help="derive the table and fit the coefficients")
    f.add_argument("--data", type=Path, required=True, help="folder of <gpu>__<model>.mlp.csv")
    sub.add_parser("report", help="print the error tables for the committed coefficients")
    a = ap.parse_args(argv)
    if a.cmd == "fit":
        samples = derive(a.data)
        write_derived(samples)
        COEFFICIENTS_PATH.write_text(json.dumps(fit(samples), indent=2) + "\n")
        coefficients.__globals__["_load_coefficients"].cache_clear()
        print(f"wrote {DERIVED_PATH.name} ({len(samples)} rows) and {COEFFICIENTS_PATH.name}")
    samples = read_derived()
    print(format_table(error_table(samples), "Fit error (committed coefficients)"))
    if a.cmd == "report":
        print()
        print(format_table(leave_one_model_out(samples), "Leave-one-model-out error"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
