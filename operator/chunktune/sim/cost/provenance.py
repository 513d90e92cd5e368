"""What a GPU's step-time model was fitted on, in one line for ``chunktune sim run``,
``chunktune tune`` and a study's status (:func:`provenance`)."""

from __future__ import annotations

import json
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

from chunktune.core.gpus import GPU, resolve_gpu
from chunktune.core.models import ModelConfig
from chunktune.core.vllm_release import parse_version
from chunktune.sim.cost import aic_data, gemm_table, mla_table, moe_table
from chunktune.sim.cost.allreduce_backends import compute_capability
from chunktune.sim.cost.coefficients import POOLED, group_sources, load_document, source_gpu
from chunktune.sim.cost.collectives import (
    measured_allreduce_source,
    measured_pcie_gpus,
    p2p_table,
    p2p_timings,
)

#: Per GPU, the end-to-end error of the simulator against real vLLM serving runs (written by
#: ``python bench/fidelity_e2e.py --quick --write-fidelity``; ``tests/sim/calibration/
#: test_e2e.py`` fails when it is not what the committed model measures).
E2E_FIDELITY_PATH = Path(__file__).with_name("data") / "e2e_fidelity.json"


#: Per GPU, the end-to-end error against GPUStack's published vLLM runs, per model and client
#: (written by ``python bench/published_runs.py --write-fidelity``; ``tests/sim/calibration/
#: test_published.py`` fails when it is not what the committed model measures).
PUBLISHED_FIDELITY_PATH = Path(__file__).with_name("data") / "published_fidelity.json"
#: How each client of the published runs is named in the line.
_CLIENTS = {"closed": "a few requests in flight", "burst": "hundreds of requests at once"}


@cache
def published_fidelity() -> dict[str, Any]:
    """The committed figures of the published runs: ``{gpu: [{model, shape, weights, client,
    runs, vllm, tpot, ttft, tpot_signed, ttft_signed}]}``."""
    doc: dict[str, Any] = json.loads(PUBLISHED_FIDELITY_PATH.read_text())
    return dict(doc["gpus"])


def published(gpu: str, model: ModelConfig) -> str:
    """The error against GPUStack's published runs of ``model`` (same shape and weight format)
    on ``gpu``, per client; "" where there are none."""
    own = [m for m in published_fidelity().get(gpu, [])
           if m["shape"] == model.shape_key and m["weights"] == model.weights]
    if not own:
        return ""
    releases = sorted({v for m in own for v in m["vllm"]}, key=parse_version)
    parts = []
    for m in sorted(own, key=lambda m: m["client"] != "closed"):
        sign = "slower" if m["tpot_signed"] > 0 else "faster"
        parts.append(f"{_CLIENTS[m['client']]} {_figures(m)} (simulated TPOT {sign})")
    return (f"GPUStack's published runs of this model on this GPU (vLLM "
            f"{', '.join(releases)}, held out): " + "; ".join(parts))


@cache
def e2e_fidelity() -> dict[str, Any]:
    """The committed end-to-end figures: ``{gpu: {precision, runs, tpot, ttft, models}}``,
    ``models`` a list of ``{model, shape, weights, moe, runs, tpot, ttft}``."""
    doc: dict[str, Any] = json.loads(E2E_FIDELITY_PATH.read_text())
    return dict(doc["gpus"])


def _figures(m: dict[str, Any], runs: str = "runs") -> str:
    """``TPOT a / TTFT b over N runs`` (``runs``: what a run is called, plural)."""
    n = m["runs"]
    return f"TPOT {m['tpot']:.1%} / TTFT {m['ttft']:.1%} over {n} {runs[:-1] if n == 1 else runs}"


def _others(models: list[dict[str, Any]]) -> str:
    """The models' figures, the most runs first (three at most)."""
    top = sorted(models, key=lambda m: (-m["runs"], m["model"], m["weights"]))[:3]
    return ", ".join(f"{m['model']} {m['weights']} {_figures(m)}" for m in top)


def end_to_end(gpu: str, model: ModelConfig | None = None) -> str:
    """The simulator's end-to-end error on ``gpu`` against real vLLM serving runs
    (:func:`e2e_fidelity`), for ``model`` where given: its own runs' figures where the GPU
    has runs of it (same :attr:`~ModelConfig.shape_key`; in its weight format, else in
    another, named), else "no real serving runs of this model" and the figures of the
    other models of its kind (dense or mixture of experts), else of the other kind, saying
    none is of its kind. Without ``model``, the GPU's largest group of dense runs. With
    ``model``, its figures against GPUStack's published runs of it (:func:`published`), which
    are not the guard's, come too: first where the guard has no run of it."""
    pub = published(gpu, model) if model is not None else ""
    e2e = e2e_fidelity().get(gpu)
    if e2e is None:
        return (f"end to end: {pub}" if pub else
                "end to end: no real serving runs of this GPU to check it against")
    if model is None:
        return (f"end to end: TPOT {e2e['tpot']:.1%} / TTFT {e2e['ttft']:.1%} median error "
                f"over {e2e['runs']} real vLLM serving runs of {e2e['precision']} models")
    models: list[dict[str, Any]] = e2e.get("models", [])
    same = [m for m in models if m["shape"] == model.shape_key]
    own = [m for m in same if m["weights"] == model.weights]
    if own or same:
        m = (own or sorted(same, key=lambda m: -m["runs"]))[0]
        what = (f"{m['model']} {m['weights']}" if own else
                f"{m['model']} in {m['weights']} weights, none in {model.weights}")
        return (f"end to end: median error {_figures(m, 'real vLLM serving runs')} of this "
                f"model ({what})" + (f"; {pub}" if pub else ""))
    kind = "mixture-of-experts" if model.is_moe else "dense"
    alike = [m for m in models if m["moe"] == model.is_moe]
    if pub:
        shown = alike or models
        return (f"end to end: {pub}; the guard's runs on this GPU are of other models"
                + (f" ({_others(shown)})" if shown else ""))
    if alike:
        return (f"end to end: no real serving runs of this model on this GPU (other {kind} "
                f"models' median error: {_others(alike)})")
    other = "dense" if model.is_moe else "mixture-of-experts"
    return (f"end to end: no real serving runs of a {kind} model on this GPU"
            + (f" ({other} models' median error: {_others(models)})" if models else ""))


def approximations(model: ModelConfig) -> str:
    """What the step-time model approximates of ``model``, in one clause ("" for nothing): one
    attention shape for every layer (:class:`chunktune.sim.cost.step_time.AttentionShape`)
    where some layers have their own head size or KV heads (Gemma-4's full layers), and a
    vision tower vLLM loads but the simulator's text requests never run."""
    parts = []
    if model.per_kind_heads:
        odd = {k: (model.layer_kv_heads(k), model.layer_head_dim(k), n)
               for k, n in Counter(model.layer_kinds()).items()
               if (model.layer_kv_heads(k), model.layer_head_dim(k))
               != (model.num_key_value_heads, model.head_dim)}
        theirs = ", ".join(f"the {n} {k} layers' {kv} of {hd}"
                           for k, (kv, hd, n) in odd.items())
        parts.append(f"every layer's attention and QKV/O projections timed with "
                     f"{model.num_key_value_heads} KV heads of {model.head_dim} ({theirs} "
                     "approximated)")
    if model.vision_params:
        parts.append(f"the vision tower ({model.vision_params / 1e9:.2f} B parameters) is in "
                     "the weights but never timed (text requests only)")
    return f"{model.name}: " + "; ".join(parts) if parts else ""


def sinks_run_triton(gpu: GPU) -> bool:
    """Whether vLLM serves a model with attention sinks (gpt-oss) on ``gpu`` with its Triton
    backend: on Ampere and Ada (SM 8.x), where neither FlashAttention (version 2 there:
    ``flash_attn_supports_sinks`` wants 3 or 4) nor FlashInfer (``supports_sink``: TRT-LLM's
    kernels, SM 9.0, 10.x and 12.x only) takes sinks (vLLM 0.33 ``platforms/cuda.py``
    ``_get_backend_priorities``: FLASH_ATTN, FLASHINFER, then TRITON_ATTN)."""
    return compute_capability(gpu).startswith("8.")


def provenance(gpu: str | GPU, model: ModelConfig | None = None) -> str:
    """One line: the measured GPU whose kernels each family was fitted on, and where a family
    is borrowed, the error borrowing makes (leave-one-GPU-out, median over the measured GPUs
    of that family, stored with the fit; a family borrowed from a pool of GPUs
    (``coefficients.POOLED``) names them; for GEMMs borrowed as a same-architecture GPU's
    measured table scaled by the data sheets, that rule's error; likewise for an MoE table,
    scaled per regime by the ratio of the fitted form). All-reduces say what they
    run on: a measured table (the GPU's own or one on the same interconnect), or over PCIe
    NCCL's curve at TP 2 and NCCL's measured graphed latency above; FP8
    GEMMs on a GPU without FP8 tensor cores run weight-only at the bf16 rate. Last, the
    end-to-end error against real serving runs of that GPU, where there are any, of
    ``model`` where there are runs of it (:func:`end_to_end`). With ``model``, what the step
    time approximates of it (:func:`approximations`)."""
    g = resolve_gpu(gpu) if isinstance(gpu, str) else gpu
    name = g.name
    loo = load_document().get("loo_gpu", {})
    src = source_gpu(name)
    sources = {f: s for f, s in group_sources(name).items()
               if f != "all-reduce" and not (f == "gemm-fp8" and g.fp8_tflops <= 0)}
    def fig(f: str) -> str:
        if f in gemm_table.DTYPE and gemm_table.lent(g, gemm_table.DTYPE[f]) is not None:
            rule = gemm_table.borrowing(g, f)
            assert rule is not None
            return f"{f} {rule['table']:.0%} (its measured table scaled by the data sheets)"
        if f == "moe" and moe_table.lent(g) is not None:
            moe = moe_table.borrowing()
            assert moe is not None
            return f"moe {moe['table']:.0%} (its measured MoE table scaled per regime)"
        return f"{f} {loo[f]:.0%}"

    def err(fams: list[str]) -> str:
        figs = [fig(f) for f in fams if f in loo]
        return f" (leave-one-GPU-out error of borrowing: {', '.join(figs)})" if figs else ""

    if src != name:
        text = f"{name}: no measured kernels; borrowed from {src}"
        pooled = {f: sources[f] for f in POOLED if sources.get(f, src) != src}
        if pooled:
            text += " (" + ", ".join(f"{f} fitted on {s.replace('+', ', ')} together"
                                     for f, s in pooled.items()) + ")"
        text += err(sorted(sources))
    else:
        own = sorted(f for f, s in sources.items() if s == name)
        text = f"{name}: fitted on measured kernels of {name} ({', '.join(own)})"
        lent: dict[str, list[str]] = {}
        for f, s in sorted(sources.items()):
            if s != name:
                lent.setdefault(s, []).append(f)
        for s, fams in lent.items():
            text += f"; {', '.join(fams)} borrowed from {s}{err(fams)}"
    ar = measured_allreduce_source(g)
    ar_loo = load_document().get("allreduce_loo_by_path", {})

    def ar_err(path: str) -> str:
        return (f" (leave-one-GPU-out error of borrowing: all-reduce {ar_loo[path]:.0%})"
                if path in ar_loo else "")

    if not g.nvlink and g.peer_to_peer is False:
        text += ("; all-reduce over PCIe without a peer-to-peer path (as stated): NCCL "
                 "through host memory at every TP, as measured on an RTX PRO 6000 box at TP 2 "
                 "and the L40S box at TP 4 and 8 (another host's memory and sockets: "
                 "unmeasured error)")
    elif not g.nvlink and g.peer_to_peer:
        boxes = " and ".join(measured_pcie_gpus()) or "no"
        fitted = " and ".join(sorted({t.gpu.name for t in p2p_timings(
            aic_data.read_committed_allreduce())})) or "no"
        two = ("its measured vLLM custom all-reduce" if ar == name else
               f"{ar}'s measured vLLM custom all-reduce (same interconnect)" if ar else
               f"vLLM's custom all-reduce as fitted on the {fitted} box, its kernel at this "
               "GPU's SM clock and its bytes at the same fraction of its own link (unmeasured "
               "error)")
        above = (f"{ar}'s measured NCCL" if ar and p2p_table(g, 4) is not None else
                 f"NCCL's latency in a CUDA graph measured on the {boxes} boxes and the "
                 "ring's bytes at Vidur's PCIe ring efficiency")
        text += (f"; all-reduce over PCIe, peer to peer (as stated): at TP 2 {two}, above "
                 f"TP 2 {above}")
    elif not g.nvlink:
        boxes = " and ".join(measured_pcie_gpus()) or "no"
        text += ("; all-reduce over PCIe: at TP 2 NCCL's curve fitted on Vidur's collectives "
                 "(vLLM runs its custom all-reduce there with peer-to-peer access), above TP 2 "
                 "NCCL as vLLM runs it: its latency in a CUDA graph measured on the "
                 f"{boxes} boxes and the ring's bytes at Vidur's PCIe ring efficiency, "
                 "assuming peer-to-peer access (the node's path not stated: "
                 "spec.engine.gpu.peerToPeer or --gpu-peer-to-peer; without one NCCL goes "
                 "through host memory, several times slower)")
        if "pcie" in ar_loo:
            above = (f"; above TP 2: {ar_loo['pcie-tp>2']:.0%}" if "pcie-tp>2" in ar_loo
                     else "")
            text += (" (leave-one-GPU-out error against the PCIe GPUs' measured vLLM "
                     f"all-reduces: {ar_loo['pcie']:.0%} median{above})")
        else:
            text += " (unmeasured error)"
    elif ar == name:
        text += f"; all-reduce: {name}'s measured vLLM all-reduce"
    elif ar is not None:
        text += (f"; all-reduce: {ar}'s measured vLLM all-reduce (same interconnect)"
                 f"{ar_err('table')}")
        cap, lender_cap = compute_capability(g), compute_capability(resolve_gpu(ar))
        if cap != lender_cap:
            text += (f" where vLLM runs the same backend on SM {cap} as on {lender_cap}, "
                     f"else that backend as priced from {ar}'s table (unmeasured error)")
    else:
        text += ("; all-reduce: priced per vLLM backend (custom, symmetric memory, NCCL) "
                 f"fitted on the measured NVLink GPUs{ar_err('backends')}")
    if g.fp8_tflops <= 0:
        text += "; FP8 weights run weight-only (no FP8 tensor cores)"
    fp4 = gemm_table.nvfp4_lender(g)
    if model is not None and model.weights == "nvfp4" and fp4 is not None:
        text += (f"; NVFP4 GEMMs: {fp4.name}'s measured grids scaled by the data sheets' FP4 "
                 "peaks (unmeasured error: no second GPU's NVFP4 GEMMs are timed)")
    if model is not None and model.is_mla and not mla_table.has_table(name):
        lender = mla_table.table_lender(g)
        rule = mla_table.borrowing()
        if lender is not None and rule is not None:
            text += (f"; MLA module: {lender}'s measured table scaled by the data sheets "
                     f"(leave-one-GPU-out error of borrowing: decode {rule['decode']:.0%}, "
                     f"prefill {rule['prefill']:.0%})")
    if model is not None and model.attention_sinks and sinks_run_triton(g):
        text += (f"; attention: vLLM runs its Triton backend for {model.name}'s attention sinks "
                 f"on SM {compute_capability(g)} (FlashAttention 2 has none), which no table "
                 "here times: priced as the measured FlashAttention (unmeasured error; "
                 "published A100 runs of gpt-oss replay fast, most at long prompts: "
                 "bench/published_runs.py)")
    text += "; " + end_to_end(name, model)
    approx = approximations(model) if model is not None else ""
    return text + (f"; approximated for {approx}" if approx else "")
