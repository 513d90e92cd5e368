"""NCCL's all-reduce fitted on Vidur's collectives: the curve the step-time model uses where
no measured vLLM all-reduce covers a GPU or where a node's links are given explicitly
(:func:`chunktune.sim.cost.collectives.tp_allreduce_s`).

Source: microsoft/vidur ``data/profiling/network/*/all_reduce.csv`` (MIT licence, Copyright (c)
Microsoft Corporation), read by :func:`chunktune.sim.cost.fit.kernel_data.read_allreduce`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from chunktune.sim.cost import collectives as col
from chunktune.sim.cost.fit import kernel_data as kd


def _allreduce_arrays(points: list[kd.AllReducePoint]
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str], np.ndarray]:
    """(bytes, ranks, per-direction link bytes/s, link kind, ms) per point."""
    links = [col.VIDUR_TOPOLOGIES[p.topology].bottleneck(p.workers) for p in points]
    return (np.array([p.nbytes for p in points], float),
            np.array([p.workers for p in points], float),
            np.array([b for b, _ in links]), [k for _, k in links],
            np.array([p.ms for p in points]))


def _allreduce_coef(x: np.ndarray) -> col.CollectiveCoefficients:
    v = np.abs(x)
    return col.CollectiveCoefficients(
        float(v[0]) * 1e-6, float(v[1]) * 1e3,
        {k: float(e) for k, e in zip(col.LINK_KINDS, v[2:6], strict=True)},
        float(v[6]) * 1e-6, 1.0 + float(v[7]))


def allreduce_pred_ms(c: col.CollectiveCoefficients, points: list[kd.AllReducePoint]
                      ) -> np.ndarray:
    """The measured quantity (host floor and device time, soft maximum), ms."""
    nbytes, n, link, kinds, _ = _allreduce_arrays(points)
    eff = np.array([c.link_eff[k] for k in kinds])
    return col.measured_allreduce_s(nbytes, n, link, eff, c) * 1e3


def fit_allreduce(points: list[kd.AllReducePoint]) -> col.CollectiveCoefficients:
    """Least squares on the log ratio predicted/measured, every (topology, ranks) sweep weighted
    equally: one latency, chunk, host floor and soft-maximum exponent for all, one efficiency
    per kind of link. A kind without points keeps its starting value (see ``loo``)."""
    from scipy.optimize import least_squares

    nbytes, n, link, kinds, ms = _allreduce_arrays(points)
    key = [(p.topology, p.workers) for p in points]
    ids = {k: i for i, k in enumerate(sorted(set(key)))}
    grp = np.array([ids[k] for k in key])
    w = 1.0 / np.sqrt(np.bincount(grp)[grp])
    kind_idx = np.array([col.LINK_KINDS.index(k) for k in kinds])

    def resid(x: np.ndarray) -> np.ndarray:
        c = _allreduce_coef(x)
        eff = np.abs(x[2:6])[kind_idx]
        pred = col.measured_allreduce_s(nbytes, n, link, eff, c) * 1e3
        out: np.ndarray = np.log(pred / ms) * w
        return out

    x0 = np.array([20.0, 100.0, 0.6, 0.6, 0.6, 0.7, 30.0, 3.0])
    res = least_squares(resid, x0, x_scale=np.array([10.0, 100.0, 0.1, 0.1, 0.1, 0.1, 10.0, 1.0]))
    c = _allreduce_coef(res.x)
    return col.CollectiveCoefficients(
        float(f"{c.latency_s:.4g}"), float(f"{c.chunk_bytes:.4g}"),
        {k: float(f"{v:.4g}") for k, v in c.link_eff.items()},
        float(f"{c.host_floor_s:.4g}"), float(f"{c.smoothness:.4g}"))


def allreduce_document(points: list[kd.AllReducePoint]) -> dict[str, Any]:
    """The committed ``data/allreduce_coefficients.json``."""
    return {
        "source": "microsoft/vidur data/profiling/network/{a100_dgx,a100_pairwise_nvlink,"
                  "h100_dgx,h100_pairwise_nvlink}/all_reduce.csv (MIT licence, Copyright (c) "
                  "Microsoft Corporation), one node; fitted by chunktune.sim.cost.fit.kernel_fit "
                  "(fit_allreduce); the model is chunktune.sim.cost.collectives",
        "units": "latency_s, host_floor_s: seconds; chunk_bytes: bytes; link_eff: fraction of "
                 "the per-direction data-sheet bandwidth of the ring's slowest link",
        "coefficients": fit_allreduce(points).to_dict(),
    }
