"""The end-to-end clause of a run's cost-model line: the run's model's own figures where the
GPU has real runs of it, else whose they are, said (``provenance.end_to_end``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from chunktune.core.engine_args import apply_quantization
from chunktune.core.models import resolve_model
from chunktune.sim.cost import provenance


def entry(model: str, weights: str, moe: bool, runs: int, tpot: float, ttft: float,
          shape_of: str) -> dict[str, object]:
    return {"model": model, "shape": resolve_model(shape_of).shape_key, "weights": weights,
            "moe": moe, "runs": runs, "tpot": tpot, "ttft": ttft}


@pytest.fixture
def table(monkeypatch):
    doc = {
        "h100-sxm": {"precision": "fp8", "runs": 18, "tpot": 0.012, "ttft": 0.102, "models": [
            entry("Llama-3.1-70B", "fp8", False, 18, 0.012, 0.102, "llama-3.1-70b"),
            entry("gpt-oss-120b", "mxfp4", True, 18, 0.069, 0.067, "gpt-oss-120b")]},
        "rtx4090": {"precision": "bf16", "runs": 1, "tpot": 0.0, "ttft": 0.015, "models": [
            entry("Llama-3.1-8B-Instruct", "bf16", False, 1, 0.0, 0.015, "llama-3.1-8b")]},
    }
    monkeypatch.setattr(provenance, "e2e_fidelity", lambda: doc)
    monkeypatch.setattr(provenance, "published_fidelity", lambda: {})
    return doc


def published_entry(model: str, client: str, runs: int, tpot: float, signed: float
                    ) -> dict[str, object]:
    m = resolve_model(model)
    return {"model": model, "shape": m.shape_key, "weights": m.weights, "client": client,
            "runs": runs, "vllm": ["0.11.0"], "tpot": tpot, "ttft": 0.4,
            "tpot_signed": signed, "ttft_signed": -0.4}


def test_published_runs_of_the_model_are_quoted_beside_the_guard(table, monkeypatch):
    """GPUStack's published runs of the run's model on its GPU (held out) come after the
    guard's figures; where the guard has none of the model, first; where the guard has none of
    the GPU, alone; another model's published runs are not quoted."""
    monkeypatch.setattr(provenance, "published_fidelity", lambda: {
        "h100-sxm": [published_entry("gpt-oss-120b", "burst", 8, 0.357, -0.357),
                     published_entry("gpt-oss-120b", "closed", 2, 0.057, -0.057),
                     published_entry("qwen3-8b", "closed", 4, 0.038, 0.038)],
        "a100-sxm": [published_entry("gpt-oss-120b", "burst", 8, 0.261, -0.261)]})
    line = provenance.end_to_end("h100-sxm", resolve_model("gpt-oss-120b"))
    assert line == (
        "end to end: median error TPOT 6.9% / TTFT 6.7% over 18 real vLLM serving runs of "
        "this model (gpt-oss-120b mxfp4); GPUStack's published runs of this model on this GPU "
        "(vLLM 0.11.0, held out): a few requests in flight TPOT 5.7% / TTFT 40.0% over 2 runs "
        "(simulated TPOT faster); hundreds of requests at once TPOT 35.7% / TTFT 40.0% over "
        "8 runs (simulated TPOT faster)")
    line = provenance.end_to_end("h100-sxm", resolve_model("qwen3-8b"))
    assert line.startswith("end to end: GPUStack's published runs of this model on this GPU "
                           "(vLLM 0.11.0, held out): a few requests in flight TPOT 3.8% / TTFT "
                           "40.0% over 4 runs (simulated TPOT slower); the guard's runs on "
                           "this GPU are of other models (Llama-3.1-70B fp8 TPOT 1.2%")
    assert provenance.end_to_end("a100-sxm", resolve_model("gpt-oss-120b")).startswith(
        "end to end: GPUStack's published runs of this model on this GPU")
    assert provenance.end_to_end("a100-sxm", resolve_model("llama-3.1-8b")) == (
        "end to end: no real serving runs of this GPU to check it against")
    assert "GPUStack" not in provenance.end_to_end("h100-sxm", resolve_model("llama-3.1-70b"))


def test_a_model_with_runs_on_the_gpu_is_quoted_its_own(table):
    assert provenance.end_to_end("h100-sxm", resolve_model("gpt-oss-120b")) == (
        "end to end: median error TPOT 6.9% / TTFT 6.7% over 18 real vLLM serving runs of "
        "this model (gpt-oss-120b mxfp4)")
    # the same model under another name and loaded as the runs ran it (--quantization fp8)
    fp8 = apply_quantization(replace(resolve_model("llama-3.1-70b"), name="my-70b"), "fp8")
    assert provenance.end_to_end("h100-sxm", fp8).endswith(
        "over 18 real vLLM serving runs of this model (Llama-3.1-70B fp8)")
    assert provenance.end_to_end("rtx4090", resolve_model("llama-3.1-8b")).endswith(
        "over 1 real vLLM serving run of this model (Llama-3.1-8B-Instruct bf16)")


def test_its_runs_in_another_weight_format_are_named_so(table):
    assert provenance.end_to_end("h100-sxm", resolve_model("llama-3.1-70b")).endswith(
        "of this model (Llama-3.1-70B in fp8 weights, none in bf16)")


def test_another_model_is_told_whose_figures_it_reads(table):
    """Not the dense FP8 70B's figures for a mixture of experts, nor without saying so."""
    assert provenance.end_to_end("h100-sxm", resolve_model("deepseek-v3")) == (
        "end to end: no real serving runs of this model on this GPU (other mixture-of-experts "
        "models' median error: gpt-oss-120b mxfp4 TPOT 6.9% / TTFT 6.7% over 18 runs)")
    assert provenance.end_to_end("h100-sxm", resolve_model("qwen3-32b")) == (
        "end to end: no real serving runs of this model on this GPU (other dense models' "
        "median error: Llama-3.1-70B fp8 TPOT 1.2% / TTFT 10.2% over 18 runs)")
    assert provenance.end_to_end("rtx4090", resolve_model("qwen3-30b-a3b")) == (
        "end to end: no real serving runs of a mixture-of-experts model on this GPU (dense "
        "models' median error: Llama-3.1-8B-Instruct bf16 TPOT 0.0% / TTFT 1.5% over 1 run)")


def test_without_a_model_or_runs_the_gpu_line_stays(table):
    assert provenance.end_to_end("h100-sxm") == (
        "end to end: TPOT 1.2% / TTFT 10.2% median error over 18 real vLLM serving runs of fp8 "
        "models")
    assert provenance.end_to_end("a100-sxm", resolve_model("gpt-oss-120b")) == (
        "end to end: no real serving runs of this GPU to check it against")
    line = provenance.provenance("h100-sxm", resolve_model("gpt-oss-120b"))
    assert "; end to end: median error TPOT 6.9%" in line


def test_a_borrowed_mla_module_or_nvfp4_grid_is_said_with_its_error():
    """A model whose MLA module or NVFP4 GEMMs a GPU runs from its family neighbour's tables
    (the B300's from the B200's) says so, with the held-out error of that rule where one
    exists; a GPU with its own tables, or a model without such layers, says nothing of it."""
    mla = provenance.provenance("b300", resolve_model("deepseek-v3"))
    assert ("; MLA module: b200's measured table scaled by the data sheets (leave-one-GPU-out "
            "error of borrowing: decode 9%, prefill 8%)") in mla
    assert "MLA module" not in provenance.provenance("b200", resolve_model("deepseek-v3"))
    assert "MLA module" not in provenance.provenance("b300", resolve_model("llama-3.1-8b"))
    fp4 = provenance.provenance("gb200", resolve_model("llama-3.3-70b-fp4"))
    assert "; NVFP4 GEMMs: b200's measured grids scaled by the data sheets' FP4 peaks" in fp4
    assert "NVFP4" not in provenance.provenance("b200", resolve_model("llama-3.3-70b-fp4"))
    assert "NVFP4" not in provenance.provenance("b300", resolve_model("llama-3.1-70b-fp8"))


@pytest.mark.parametrize(("model", "gpu", "triton"), [
    ("gpt-oss-120b", "a100-sxm", True),  # SM 8.0: FlashAttention 2, no sinks
    ("gpt-oss-20b", "l40s", True),  # SM 8.9
    ("gpt-oss-120b", "h100-sxm", False),  # FlashAttention 3 takes sinks
    ("gpt-oss-120b", "b200", False),  # FlashInfer's TRT-LLM kernels take them
    ("llama-3.1-8b", "a100-sxm", False),  # no sinks
])
def test_attention_sinks_served_by_triton_are_said_unmeasured(model, gpu, triton):
    """gpt-oss's attention sinks: on Ampere and Ada vLLM serves them with its Triton backend,
    which no table times; the line says the attention is priced as FlashAttention there."""
    m = resolve_model(model)
    assert m.attention_sinks == model.startswith("gpt-oss")
    line = provenance.provenance(gpu, m)
    assert ("vLLM runs its Triton backend for" in line) == triton
    if triton:
        assert "attention sinks" in line and "unmeasured error" in line
