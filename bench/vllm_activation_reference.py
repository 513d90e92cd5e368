"""The buffers vLLM 0.33's memory-profiling forward pass allocates for the MoE and MLA layers,
computed by vLLM's own code, next to the simulator's (the reference that
``tests/sim/engine/test_activation.py`` pins).

``Worker.determine_available_memory`` runs ``GPUModelRunner.profile_run``: ``_dummy_run`` of
``max_num_batched_tokens`` tokens with no attention metadata, then ``_dummy_sampler_run`` on
``max_num_seqs`` rows, and takes the torch allocator's peak (with everything still allocated
after it) from the KV cache. Two buffers of that pass depend on the MoE and MLA layers and are
computed here, on a CPU, with the model class built on the meta device as
``bench/vllm_weights_reference.py`` builds it (same faked Hopper GPU and TP group):

* the fused-MoE workspace. ``FusedMoEKernel._allocate_buffers`` asks the process-wide
  ``WorkspaceManager`` (``v1/worker/workspace.py``) for ``workspace13`` (shared with the output)
  and ``workspace2`` in one buffer (``get_simultaneous``: each rounded up to 256 B), with the
  shapes the experts class vLLM picks gives (``workspace_shapes``) for the whole batch (0.33
  does not chunk it). The manager keeps the buffer after the pass: it is still allocated when
  the sampler runs, so it adds to the peak whichever pass sets it. Here: the experts class of
  the layer's quantization method (``quant_method.experts_cls``, chosen by its oracle on SM90),
  its ``moe_problem_size`` on the layer's weights and an input of ``max_num_batched_tokens``
  rows, its ``workspace_shapes`` and ``workspace_dtype``, and the bytes a ``WorkspaceManager``
  on the meta device allocates for them. The monolithic OAI Triton MXFP4 experts (gpt-oss on
  Hopper) take no workspace: ``triton_kernel_fused_experts`` allocates its ``(M x topk, N/2)``
  intermediate inside the call (printed as a transient);
* MLA's profiling tensor: with no attention metadata ``MLAAttention.forward`` allocates
  ``(chunked_prefill_workspace_size, heads a rank, qk_nope_head_dim + v_head_dim)`` in the
  model's dtype ("the worst case output size for kv_b_proj(kv_c_normed) in
  _compute_prefill_context"), freed at once: a transient of the forward pass.

    python bench/vllm_activation_reference.py --vllm DIR     # DIR holds vllm/ of release 0.33.0

Nothing here is measured on a GPU: what the allocator does with these (fragmentation),
non-torch memory and CUDA-graph memory are not computed.
"""

from __future__ import annotations

import argparse
import json
import sys
from math import prod
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))
sys.path.insert(0, str(ROOT / "bench"))

from vllm_weights_reference import CASES, CONFIGS, build_model, fake_hopper  # noqa: E402

#: the profile run's batch: vLLM 0.33's defaults for ``vllm serve`` on an H100 / H200
MAX_NUM_BATCHED_TOKENS = 8192
MAX_NUM_SEQS = 1024


def moe_buffers(model: Any) -> dict[str, Any]:
    """The first routed-experts layer's experts class and its workspace bytes (persistent) or
    transient bytes, as vLLM 0.33 sizes them for a batch of :data:`MAX_NUM_BATCHED_TOKENS`."""
    import torch
    import vllm.model_executor.layers.fused_moe.modular_kernel as mk
    from vllm.v1.worker.workspace import WorkspaceManager

    layer = next(m for m in model.modules()
                 if getattr(getattr(m, "quant_method", None), "experts_cls", None) is not None)
    cls = layer.quant_method.experts_cls
    dtype = layer.moe_config.in_dtype
    M, k = MAX_NUM_BATCHED_TOKENS, layer.top_k
    row: dict[str, Any] = {"experts": cls.__name__, "top_k": k,
                           "local_experts": layer.local_num_experts}
    if not issubclass(cls, mk.FusedMoEExpertsModular):
        # monolithic (OAITritonMxfp4ExpertsMonolithic): triton_kernel_fused_experts with
        # intermediate_cache=None allocates (batch, M * topk, N // 2) in the input's dtype,
        # N the w13 rows (2 x intermediate a rank)
        n = layer.w13_weight.shape[1]
        row.update(workspace_bytes=0, transient_bytes=M * k * (n // 2) * dtype.itemsize, N=n)
        return row
    try:
        ex = cls(moe_config=layer.moe_config,
                 quant_config=layer.quant_method.get_fused_moe_quant_config(layer))
    except Exception:  # only workspace_shapes and moe_problem_size are called: no state
        ex = cls.__new__(cls)
    a1 = torch.empty(M, layer.hidden_size, device="meta", dtype=dtype)
    ids = torch.empty(M, k, device="meta", dtype=torch.int32)
    if hasattr(layer, "w13_weight"):
        _, m_, n, kk, k_ = ex.moe_problem_size(a1, layer.w13_weight, layer.w2_weight, ids)
    else:  # Marlin: N is what marlin_moe_intermediate_size reads off the repacked w2
        m_, n, kk, k_ = M, layer.intermediate_size_per_partition, layer.hidden_size, k
    ws13, ws2, out = ex.workspace_shapes(m_, n, kk, k_, layer.global_num_experts,
                                         layer.local_num_experts, None, layer.activation)
    wdt = ex.workspace_dtype(dtype)
    # FusedMoEKernel._allocate_buffers: workspace13 shares its storage with the output
    torch.accelerator.empty_cache = lambda: None  # the manager frees the CUDA cache on growth
    wm = WorkspaceManager(torch.device("meta"))
    wm.get_simultaneous(((max(prod(ws13), prod(out)),), wdt), (ws2, wdt))
    row.update(workspace_bytes=wm._workspace_size_bytes(wm._current_workspaces[0]),
               transient_bytes=0, N=n, K=kk, workspace13=ws13, workspace2=ws2, output=out,
               dtype=str(wdt))
    return row


def mla_buffers(model: Any) -> dict[str, Any]:
    """MLA's profiling tensor (``MLAAttention.forward`` with no attention metadata), 0 without
    MLA layers."""
    attn = next((m for m in model.modules() if hasattr(m, "_chunked_prefill_workspace_size")),
                None)
    if attn is None:
        return {"mla_profile_bytes": 0}
    rows = attn.chunked_prefill_workspace_size
    dims = attn.qk_nope_head_dim + attn.v_head_dim
    itemsize = attn.kv_b_proj.params_dtype.itemsize
    return {"mla_profile_bytes": rows * attn.num_heads * dims * itemsize,
            "chunked_prefill_workspace_size": rows, "heads": attn.num_heads, "dims": dims}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm", required=True, metavar="DIR",
                    help="directory holding an unzipped vLLM wheel's vllm/ package")
    ap.add_argument("--model", action="append", help="only these model configs (repeatable)")
    ns = ap.parse_args(argv)
    fake_hopper(ns.vllm)
    import vllm

    from chunktune.core.engine_args import EngineArgs, resolve
    from chunktune.core.gpus import resolve_gpu
    from chunktune.core.models import resolve_model
    from chunktune.sim.engine.activation import mla_profile_bytes, moe_workspace_bytes

    print(f"vLLM {vllm.__version__} (from {ns.vllm}), budget {MAX_NUM_BATCHED_TOKENS}, "
          f"{MAX_NUM_SEQS} sequences")
    rows = []
    for name, gpu, tp in CASES:
        if ns.model and name not in ns.model:
            continue
        vc, model = build_model(name, tp, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
                                max_num_seqs=MAX_NUM_SEQS)
        row = {"model": name, "gpu": gpu, "tp": tp, **moe_buffers(model), **mla_buffers(model),
               "max_model_len": vc.model_config.max_model_len}
        m = resolve_model(config_path=CONFIGS / f"{name}_config.json", name=name)
        cfg = resolve(EngineArgs(tensor_parallel_size=tp,
                                 max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
                                 max_num_seqs=MAX_NUM_SEQS), m, resolve_gpu(gpu))
        row["simulator_workspace_bytes"] = int(moe_workspace_bytes(cfg))
        row["simulator_mla_profile_bytes"] = int(mla_profile_bytes(cfg))
        print(f"{name} {gpu} TP{tp}: {row['experts']} workspace {row['workspace_bytes']:,} B "
              f"(simulator {row['simulator_workspace_bytes']:,}), MoE transient "
              f"{row['transient_bytes']:,} B; MLA profiling tensor "
              f"{row['mla_profile_bytes']:,} B (simulator "
              f"{row['simulator_mla_profile_bytes']:,})", flush=True)
        rows.append(row)
    print(json.dumps(rows, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
