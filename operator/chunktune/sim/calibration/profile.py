"""Calibration profiles: the step-time model fitted to one user's engine (``chunktune calibrate``).

A profile is a JSON file (format :data:`PROFILE_KIND`, version :data:`PROFILE_VERSION`)::

    {"kind": "chunktune-calibration", "version": 1,
     "model": "tiny", "gpu": "cpu", "tensor_parallel_size": 1,
     "coefficients": {"step_overhead_scale": .., "per_request_scale": ..,
                      "linear_scale": .., "attention_scale": ..,
                      "per_token_s": .., "per_prefill_pair_s": .., "per_decode_kv_token_s": ..},
     "step_overhead_s": .., "per_request_s": ..,        # the scaled fixed costs, for reading
     "kv_cache_tokens": 130944,                          # the engine's logged KV capacity
     "server_overhead_s": null,                          # time before the first token, if fitted
     "step_gap_s": 0.0,                                  # wall time between steps, if fitted
     "delivery_stall_prob": 0.0, "delivery_stall_s": 0.0,  # clients' tail, if fitted
     "fit": {"num_steps": .., "median_rel_err": .., "p90_rel_err": .., "total_ratio": ..,
             "cross_validated_median_rel_err": .., "cross_validated_total_ratio": ..},
     "fitted_on": {"files": [{"path": .., "steps": .., "model": .., "vllm_version": ..}],
                   "steps": .., "vllm_version": .., "device": ..,
                   "engine": {"kv_cache_dtype_bytes": 2, "enforce_eager": false}}}

``fitted_on.engine`` (written by ``chunktune calibrate``; absent in a study's twin profile,
fitted over its trials' own settings): the engine settings whose terms the scales multiply;
:func:`apply` refuses an engine with others.

A step costs the sum of the four terms of :class:`~chunktune.sim.cost.step_time.StepCostModel` for
that model and device, each scaled (see :mod:`chunktune.sim.calibration.step_fit`), plus three
terms in the engine's own units (per token, per prefill query-key pair, per decode KV token) which
carry an engine the data-sheet roofline does not describe (vLLM's CPU build), plus ``step_gap_s``.
The coefficients are non-negative least squares on the logged step times; a simulated engine given
the profile (:func:`apply`) costs each step as that sum. Pure apart from :func:`read_profile` /
:func:`write_profile` and :func:`load_logs`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from chunktune.core import infile
from chunktune.core.engine_args import EngineArgs
from chunktune.core.errors import SpecError
from chunktune.core.infile import shown
from chunktune.core.models import ModelConfig
from chunktune.core.steps import read_step_log
from chunktune.core.vllm_release import Version, parse_version
from chunktune.sim.calibration.step_fit import MIN_STEPS, StepLog, check_steps
from chunktune.sim.cost.step_time import StepCostModel
from chunktune.sim.engine.virtual import Engine

PROFILE_KIND = "chunktune-calibration"
PROFILE_VERSION = 1
SCALES = ("step_overhead_scale", "per_request_scale", "linear_scale", "attention_scale")
#: Terms in the engine's own units, beside the scaled model terms: seconds per scheduled token,
#: per prefill query-key pair (a chunk of ``c`` after ``p`` tokens has ``c * (p + (c+1)/2)``),
#: per KV token a decode reads.
DIRECT = ("per_token_s", "per_prefill_pair_s", "per_decode_kv_token_s")
COEFFICIENTS = (*SCALES, *DIRECT)
#: The largest value a profile may give each coefficient: a scale of the data-sheet model
#: (fitted ones lie near 1), or a term in the engine's own units (seconds per token, per query-key
#: pair, per KV token: fitted ones are below a millisecond).
COEFFICIENT_BOUNDS = {**dict.fromkeys(SCALES, 1e4), **dict.fromkeys(DIRECT, 1.0)}
#: The longest time a profile's own terms (server overhead, step gap, delivery stall) may take.
MAX_TERM_S = 3600.0
#: The largest calibration profile file read.
MAX_PROFILE_BYTES = 4 * 2**20


@dataclass(frozen=True)
class TwinFit:
    """Coefficients (in :data:`COEFFICIENTS` order) and how well they reproduce the steps."""

    coefficients: tuple[float, ...]
    num_steps: int
    median_rel_err: float
    p90_rel_err: float
    #: Sum of predicted step times over the sum of measured ones (what latencies add up).
    total_ratio: float
    #: Median error on each fifth of the steps when fitted on the other four.
    cross_validated_median_rel_err: float
    cross_validated_total_ratio: float


def twin_features(log: StepLog, cost: StepCostModel) -> np.ndarray:
    """Per step with tokens: the seven calibration features of
    :meth:`~chunktune.sim.cost.step_time.StepCostModel.log_features` (the four model terms, then
    scheduled tokens, prefill query-key pairs and the decodes' KV tokens), from the step's
    iteration-log counts and KV usage. A calibrated replay costs its steps from the same
    features."""
    cap = log.kv_capacity_tokens
    rows = [cost.log_features(s.context_requests, s.context_tokens, s.generation_requests,
                              s.generation_tokens,
                              s.kv_usage_pct / 100 * cap if cap and s.kv_usage_pct is not None
                              else None)
            for s in log.steps if s.tokens > 0]
    return np.array(rows, dtype=np.float64).reshape(-1, 7)


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares of ``a @ x - b`` (numpy only: every subset of free columns is
    tried, the best non-negative solution kept; columns are scaled to unit norm first)."""
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    an = a / norms
    n = a.shape[1]
    best, best_err = np.zeros(n), float(b @ b)
    for mask in range(1, 2**n):
        cols = [i for i in range(n) if mask >> i & 1]
        sol, *_ = np.linalg.lstsq(an[:, cols], b, rcond=None)
        if (sol < 0).any():
            continue
        r = an[:, cols] @ sol - b
        if (err := float(r @ r)) < best_err:
            best, best_err = np.zeros(n), err
            best[cols] = sol
    out: np.ndarray = best / norms
    return out


def fit_twin(x: np.ndarray, y: np.ndarray) -> TwinFit:
    """Coefficients minimising the squared error of the step times (seconds, so long steps,
    which make the latencies, weigh what they cost), with 5-fold cross-validated errors."""
    if len(y) < MIN_STEPS:
        raise SpecError(f"{len(y)} steps with tokens in the logs; at least {MIN_STEPS} are "
                        "needed to fit (run the engine longer or under more load)",
                        field="--log")
    coef = nnls(x, y)
    if not (coef > 0).any():  # a profile in which no step costs anything simulates nothing
        raise SpecError(f"the {len(y)} steps' times fit no cost at all (are they all 0 ms?): "
                        "give logs of an engine under load", field="--log")
    pred = x @ coef
    err = np.abs(pred / y - 1.0)
    folds = np.arange(len(y)) % 5
    cv, cv_pred = [], np.zeros_like(y)
    for k in range(5):
        tr, te = folds != k, folds == k
        c = nnls(x[tr], y[tr])
        cv_pred[te] = x[te] @ c
        cv.append(np.abs(cv_pred[te] / y[te] - 1.0))
    return TwinFit(tuple(float(v) for v in coef), len(y), float(np.median(err)),
                   float(np.percentile(err, 90)), float(pred.sum() / y.sum()),
                   float(np.median(np.concatenate(cv))), float(cv_pred.sum() / y.sum()))


@dataclass(frozen=True)
class CalibrationProfile:
    model: str
    gpu: str
    coefficients: dict[str, float]
    fit: dict[str, float]
    fitted_on: dict[str, Any]
    tensor_parallel_size: int = 1
    step_overhead_s: float = 0.0
    per_request_s: float = 0.0
    kv_cache_tokens: int | None = None
    server_overhead_s: float | None = None
    #: Wall time between steps that vLLM's "iteration elapsed time" leaves out (output
    #: processing, scheduling), fitted from measured request latencies.
    step_gap_s: float = 0.0
    #: The clients' share of the time between tokens beyond the engine's steps (the API
    #: server or the client not running when a token is ready): each streamed token reaches
    #: the client, with this probability, an exponentially distributed time late (mean
    #: ``delivery_stall_s``), and never before the token ahead of it (:func:`deliver`). Fitted
    #: from measured ITL percentiles; 0 leaves the clients' timing the engine's.
    delivery_stall_prob: float = 0.0
    delivery_stall_s: float = 0.0
    kind: str = PROFILE_KIND
    version: int = PROFILE_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def cost_coefficients(self) -> tuple[float, ...]:
        """What :meth:`StepCostModel.calibrate` takes."""
        return (*(float(self.coefficients[k]) for k in COEFFICIENTS), self.step_gap_s)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not d["extra"]:
            del d["extra"]
        return d


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.rstrip("/").rsplit("/", 1)[-1].lower())


def check_model(log_model: str | None, model: ModelConfig, declared: str, source: str) -> None:
    """Raise :class:`SpecError` when a log names another model than the declared one."""
    if not log_model:
        return
    names = {_norm(n) for n in (model.name, model.hf_name, declared) if n}
    if _norm(log_model) not in names:
        raise SpecError(f"{source} was written by an engine serving {log_model!r}, not the "
                        f"declared model {declared!r}: give the model the log is from",
                        field="--model")


def check_token_sizes(log: StepLog, model: ModelConfig, source: str) -> None:
    """Raise when a step's sizes are impossible for ``model`` (a prompt chunk longer than
    its context window, or a KV capacity in the log that ``model`` could not fill)."""
    limit = model.max_position_embeddings
    for s in log.steps:
        if s.context_requests and s.context_tokens > s.context_requests * limit:
            raise SpecError(f"{source}: step Iteration({s.iteration}) has {s.context_tokens} "
                            f"prompt tokens for {s.context_requests} request(s), more than "
                            f"{model.name}'s {limit}-token context allows: the log is from "
                            "another model", field="--model")


def load_logs(paths: list[str], model: ModelConfig, declared: str) -> list[StepLog]:
    """Each file's steps (a raw vLLM log or a backend's ``.steps.jsonl``), checked against the
    declared model. Raises :class:`SpecError` naming the file and the problem."""
    logs = []
    for p in paths:
        path = Path(p)
        records, meta = read_step_log(path, "--log")  # a regular file, from here on
        log = check_steps(records, meta, path.stat().st_size > 0, p)
        check_model(meta.model, model, declared, p)
        check_token_sizes(log, model, p)
        logs.append(log)
    return logs


def fit_logs(logs: list[StepLog], cost: StepCostModel | Sequence[StepCostModel]) -> TwinFit:
    """One fit over every log's steps (each with its own KV capacity), each log's features
    from ``cost`` or, given one per log, from its own engine's step-time model."""
    costs = [cost] * len(logs) if isinstance(cost, StepCostModel) else list(cost)
    if len(costs) != len(logs):
        raise ValueError(f"{len(costs)} step-time models for {len(logs)} logs")
    xs = [twin_features(log, c) for log, c in zip(logs, costs, strict=True)]
    ys = [np.array([s.elapsed_ms / 1e3 for s in log.steps if s.tokens > 0]) for log in logs]
    return fit_twin(np.concatenate(xs), np.concatenate(ys))


def engine_settings(cost: StepCostModel) -> dict[str, Any]:
    """What a profile fitted on ``cost``'s terms records of the engine (``fitted_on.engine``):
    the KV cache's bytes an element, whether it ran without CUDA graphs and, where stated, its
    node's peer-to-peer path (:attr:`chunktune.core.gpus.GPU.peer_to_peer`)."""
    kv = cost.kv_dtype_bytes if cost.kv_dtype_bytes is not None else cost.model.dtype_bytes
    out: dict[str, Any] = {"kv_cache_dtype_bytes": kv, "enforce_eager": cost.enforce_eager}
    if cost.gpu.peer_to_peer is not None:
        out["peer_to_peer"] = cost.gpu.peer_to_peer
    return out


def build_profile(paths: list[str], logs: list[StepLog], fit: TwinFit, cost: StepCostModel,
                  model: ModelConfig, gpu: str, tp: int = 1,
                  server_overhead_s: float | None = None,
                  step_gap_s: float = 0.0, engine: bool = False) -> CalibrationProfile:
    """The profile of ``fit``; ``engine``: record the engine settings ``cost`` was built
    with (:func:`engine_settings`), which :func:`apply` then holds an engine to."""
    metas = [log.meta for log in logs]
    versions = sorted({m.vllm_version for m in metas if m.vllm_version})
    kv = [m.kv_cache_tokens for m in metas if m.kv_cache_tokens]
    scales = dict(zip(COEFFICIENTS, fit.coefficients, strict=True))
    return CalibrationProfile(
        model=model.name, gpu=gpu, tensor_parallel_size=tp, coefficients=scales,
        step_overhead_s=scales["step_overhead_scale"] * cost.c.step_overhead_s,
        per_request_s=scales["per_request_scale"] * cost.c.per_request_overhead_s,
        kv_cache_tokens=min(kv) if kv else None, server_overhead_s=server_overhead_s,
        step_gap_s=step_gap_s,
        fit={"num_steps": fit.num_steps, "median_rel_err": fit.median_rel_err,
             "p90_rel_err": fit.p90_rel_err, "total_ratio": fit.total_ratio,
             "cross_validated_median_rel_err": fit.cross_validated_median_rel_err,
             "cross_validated_total_ratio": fit.cross_validated_total_ratio},
        fitted_on={
            "files": [{"path": p, "steps": len(log.steps), **log.meta.to_dict()}
                      for p, log in zip(paths, logs, strict=True)],
            "steps": sum(len(log.steps) for log in logs),
            "vllm_version": ", ".join(versions) if versions else None,
            "device": next((m.device for m in metas if m.device), None),
            **({"engine": engine_settings(cost)} if engine else {})})


#: The profile's terms that act after the engine (on what the clients receive): a replay
#: does not depend on them, only its summary does.
AFTER_ENGINE = ("delivery_stall_prob", "delivery_stall_s")


def deliver(token_times: np.ndarray, prob: float, mean_s: float,
            rng: np.random.Generator) -> np.ndarray:
    """When a request's tokens, produced at ``token_times`` (seconds, ascending), reach its
    client: each, with probability ``prob``, an exponential time of mean ``mean_s`` late, and
    never before the token ahead of it (a stalled stream delivers what piled up at once)."""
    t = np.asarray(token_times, dtype=np.float64)
    if prob <= 0 or mean_s <= 0 or t.size == 0:
        return t
    late = np.where(rng.random(t.size) < prob, rng.exponential(mean_s, t.size), 0.0)
    out: np.ndarray = np.maximum.accumulate(t + late)
    return out


def delivery(profile: CalibrationProfile | None, seed: int
             ) -> Callable[[np.ndarray, int], np.ndarray] | None:
    """The profile's delivery stalls as ``deliver(token_times, rid)`` (:func:`deliver`), drawn
    per request from the workload ``seed`` and the request's id so that a replay repeats; None
    when the profile has none."""
    if profile is None or profile.delivery_stall_prob <= 0 or profile.delivery_stall_s <= 0:
        return None
    prob, mean_s = profile.delivery_stall_prob, profile.delivery_stall_s

    def stalled(made: np.ndarray, rid: int) -> np.ndarray:
        return deliver(made, prob, mean_s, np.random.default_rng([seed, rid]))
    return stalled


def write_profile(path: str | Path, profile: CalibrationProfile) -> Path:
    p = Path(path)
    p.write_text(json.dumps(profile.to_dict(), indent=2, sort_keys=True) + "\n")
    return p


def parse_profile(d: Any, source: str, field_path: str = "--calibration") -> CalibrationProfile:
    """A profile from its JSON object; :class:`SpecError` naming ``field_path`` otherwise."""
    def bad(msg: str) -> SpecError:
        return SpecError(f"{source}: {msg}", field=field_path)
    if not isinstance(d, dict) or d.get("kind") != PROFILE_KIND:
        raise bad(f"not a calibration profile (kind must be {PROFILE_KIND!r}; write one with "
                  "`chunktune calibrate`)")
    if d.get("version") != PROFILE_VERSION:
        raise bad(f"profile version {d.get('version')!r} is not supported (this chunktune "
                  f"reads version {PROFILE_VERSION}); recalibrate")
    coeffs = d.get("coefficients")
    if not isinstance(coeffs, dict):
        raise bad("coefficients: missing")
    for k in COEFFICIENTS:
        v, top = coeffs.get(k), COEFFICIENT_BOUNDS[k]
        if not isinstance(v, int | float) or isinstance(v, bool) or not 0 <= v <= top:
            raise bad(f"coefficients.{k}: must be a number from 0 to {top:g} (got {shown(v)})")
    if not any(coeffs[k] > 0 for k in COEFFICIENTS):
        raise bad("coefficients: all 0, so every step would cost nothing; recalibrate from "
                  "logs with step times")
    for k in ("model", "gpu"):
        if not isinstance(d.get(k), str) or not d[k] or len(d[k]) > 256:
            raise bad(f"{k}: missing (a name of at most 256 characters)")
    for k in ("server_overhead_s", "step_gap_s", "delivery_stall_prob", "delivery_stall_s"):
        v = d.get(k)
        if v is not None and (not isinstance(v, int | float) or isinstance(v, bool)
                              or not 0 <= v <= MAX_TERM_S):
            raise bad(f"{k}: must be a number from 0 to {MAX_TERM_S:g} (got {shown(v)})")
    if not (d.get("delivery_stall_prob") or 0) <= 1:
        raise bad(f"delivery_stall_prob: must be a probability, 0 to 1 (got "
                  f"{shown(d['delivery_stall_prob'])})")
    for k, top in (("tensor_parallel_size", 1024), ("kv_cache_tokens", 2**40)):
        v = d.get(k)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)
                              or not 1 <= v <= top):
            raise bad(f"{k}: must be a whole number from 1 to {top} (got {shown(v)})")
    for k in ("fit", "fitted_on"):
        if not isinstance(d.get(k, {}), dict):
            raise bad(f"{k}: must be a mapping (got {shown(d[k])})")
    eng = d.get("fitted_on", {}).get("engine")
    if eng is not None:
        kv = eng.get("kv_cache_dtype_bytes") if isinstance(eng, dict) else None
        if (not isinstance(eng, dict)
                or not {"kv_cache_dtype_bytes", "enforce_eager"} <= set(eng)
                <= {"kv_cache_dtype_bytes", "enforce_eager", "peer_to_peer"}
                or not isinstance(eng["enforce_eager"], bool)
                or not isinstance(eng.get("peer_to_peer", False), bool)
                or not isinstance(kv, int | float) or isinstance(kv, bool) or kv not in (1, 2, 4)):
            raise bad("fitted_on.engine: must be {\"kv_cache_dtype_bytes\": 1, 2 or 4, "
                      "\"enforce_eager\": true or false[, \"peer_to_peer\": true or false]} "
                      "(as `chunktune calibrate` writes it)")
    known = set(CalibrationProfile.__dataclass_fields__)
    try:
        return CalibrationProfile(**{k: v for k, v in d.items() if k in known})
    except TypeError as e:
        raise bad(str(e)) from e


def read_profile(path: str | Path, field_path: str = "--calibration") -> CalibrationProfile:
    p = Path(path)
    text = infile.read_text(p, field=field_path, max_bytes=MAX_PROFILE_BYTES,
                            name=f"calibration profile {p}")
    d = infile.json_value(text, where=str(p), field=field_path)
    return parse_profile(d, str(p), field_path)


def _one_version(texts: set[str]) -> Version | None:
    """The release ``texts`` name, where they name one and only one that parses."""
    if len(texts) != 1:
        return None
    try:
        return parse_version(texts.pop())
    except SpecError:
        return None


def logs_version(logs: Sequence[StepLog]) -> Version | None:
    """The vLLM release the step logs name, where they name one and only one."""
    return _one_version({log.meta.vllm_version for log in logs if log.meta.vllm_version})


def fitted_version(profile: CalibrationProfile) -> Version | None:
    """The vLLM release whose step logs the profile was fitted on, where they name one: a
    calibrated simulation that names no release runs that release's scheduler, the one whose
    steps it was fitted to (the CPU build's 0.32, not the newest checked)."""
    text = profile.fitted_on.get("vllm_version")
    # build_profile joins the logs' releases with ", "
    return _one_version(set(text.split(", "))) if isinstance(text, str) else None


def engine_args(args: EngineArgs, profile: CalibrationProfile) -> EngineArgs:
    """``args`` with the profile's KV capacity, unless they set the block count themselves."""
    if profile.kv_cache_tokens and args.num_gpu_blocks_override is None:
        return replace(args, num_gpu_blocks_override=max(
            1, profile.kv_cache_tokens // args.block_size))
    return args


def apply(engine: Engine, profile: CalibrationProfile,
          field_path: str = "--calibration") -> None:
    """Make ``engine`` cost its steps with the profile; refuses a profile of another model or
    device."""
    m, g = engine.cfg.model.name, engine.cfg.gpu.name
    if _norm(profile.model) != _norm(m) or profile.gpu != g:
        raise SpecError(f"the profile was fitted for {profile.model} on {profile.gpu}, not "
                        f"{m} on {g}: simulate that model and device, or recalibrate",
                        field=field_path)
    fitted = profile.fitted_on.get("engine")
    if fitted is not None:
        mine = engine_settings(engine.cost)
        diff = [f"--kv-cache-dtype ({fitted['kv_cache_dtype_bytes']:g} bytes an element there, "
                f"{mine['kv_cache_dtype_bytes']:g} here)"
                if k == "kv_cache_dtype_bytes" else
                f"--enforce-eager ({'on' if fitted[k] else 'off'} there, "
                f"{'on' if mine[k] else 'off'} here)"
                for k in ("kv_cache_dtype_bytes", "enforce_eager") if fitted[k] != mine[k]]
        if "peer_to_peer" in fitted and fitted["peer_to_peer"] != mine.get("peer_to_peer"):
            def path(v: bool | None) -> str:
                return "not stated" if v is None else "peer to peer" if v else "none"
            diff.append(f"peer-to-peer path between the GPUs ({path(fitted['peer_to_peer'])} "
                        f"there, {path(mine.get('peer_to_peer'))} here)")
        if diff:
            raise SpecError(f"the profile was fitted on an engine run with another "
                            f"{' and '.join(diff)}: its scales multiply that engine's terms; "
                            "simulate with the engine's flags, or recalibrate with these",
                            field=field_path)
    engine.cost.calibrate(profile.cost_coefficients)
