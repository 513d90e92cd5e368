"""``chunktune model check CONFIG``: what the simulator makes of a model, before any run.

Reads the model as :func:`chunktune.core.models.resolve_model` does (a ``config.json``, a
model directory or a catalog name) and prints its parameters, weight bytes per rank, KV bytes
per token per layer kind, the KV-cache groups and KV tokens vLLM would report on the GPU
(:func:`chunktune.sim.engine.memory.plan_memory`) and where each step-time family comes from
(:func:`chunktune.sim.cost.provenance.provenance`). A layer kind the simulator does not model
is refused by name, as every command refuses it.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

from chunktune.core.engine_args import EngineArgs, EngineStartupError, ResolvedConfig, resolve
from chunktune.core.errors import SpecError
from chunktune.core.gpus import GPU, resolve_gpu, with_peer_to_peer
from chunktune.core.models import MODULE_CLASSES, ModelConfig, resolve_model
from chunktune.core.vllm_release import CURRENT, parse_version, text
from chunktune.sim.cost.provenance import provenance
from chunktune.sim.cost.step_time import borrowed_shape, moe_weight_format
from chunktune.sim.engine.memory import GiB, MemoryPlan, kv_cache_layout, plan_memory
from chunktune.sim.engine.virtual import engine_cost


def register(msub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``check`` to the ``model`` command group."""
    check = msub.add_parser(
        "check",
        help="print what the simulator makes of a model: parameters, weights and KV cache "
             "per rank, the KV tokens vLLM would report, where step times come from",
        description="Read a model's config.json (or a model directory, or a catalog name) as "
                    "the simulator does and print its parameters, weight bytes per rank, KV "
                    "bytes per token per layer kind, the KV tokens vLLM would report on GPU "
                    "and which step-time terms come from measured kernel tables.",
        allow_abbrev=False,
    )
    check.add_argument("config", metavar="CONFIG",
                       help="config.json, a model directory holding one, or a catalog name")
    check.add_argument("--gpu", default="h100-sxm", help="GPU (default: h100-sxm)")
    check.add_argument("--gpu-peer-to-peer", action=argparse.BooleanOptionalAction,
                       default=None, help="whether the node's PCIe GPUs reach each other peer "
                                          "to peer (default: not stated)")
    check.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N")
    check.add_argument("--kv-cache-dtype", default="auto")
    check.add_argument("--max-model-len", type=int, metavar="TOKENS",
                       help="default: the model's max_position_embeddings")
    check.add_argument("--max-num-batched-tokens", type=int, metavar="TOKENS")
    check.add_argument("--gpu-memory-utilization", type=float, metavar="FRACTION")
    check.add_argument("--vllm-version", metavar="VERSION",
                       help="the vLLM whose start-up applies (its defaults, memory profile and "
                            "weight layouts), e.g. 0.11.0 (default: the current one, "
                            f"{text(CURRENT)}; docs/vllm-versions.md)")
    check.set_defaults(func=cmd_check)


def _model(spec: str) -> ModelConfig:
    if spec.endswith(".json") or "/" in spec or "\\" in spec:
        return resolve_model(config_path=spec)
    return resolve_model(spec)


def describe_model(m: ModelConfig, tp: int, kv_dtype_bytes: float) -> list[str]:
    """The model's lines: shape, parameters, quantization, weights and KV bytes per rank."""
    kinds = Counter(m.layer_kinds())
    layers = ", ".join(f"{n} {k}" for k, n in kinds.items())
    lines = [f"model: {m.name}: {m.num_params() / 1e9:.1f} B parameters "
             f"({m.num_params(active_only=True) / 1e9:.1f} B a token); {m.num_hidden_layers} "
             f"layers: {layers}"]
    if m.is_moe:
        shared = m.shared_expert_params() // (3 if m.gated_mlp else 2) // m.hidden_size
        lines.append(f"experts: {m.num_experts} routed ({m.num_experts_per_tok} a token, "
                     f"{m.moe_intermediate_size} wide)"
                     + (f", shared {shared} wide" if shared else "")
                     + f"; {m.num_moe_layers} MoE layers, {m.num_dense_layers} dense"
                     + (f"; a dense MLP {m.intermediate_size} wide beside the experts"
                        if m.dense_mlp_beside_moe else ""))
    if m.is_mla:
        lines.append(f"attention: MLA, latent {m.kv_lora_rank} + rope {m.qk_rope_head_dim}, "
                     f"{m.num_attention_heads} heads")
    else:
        window = (f", sliding window {m.sliding_window}" if m.sliding_window else "") + \
            (f", chunk {m.attention_chunk_size}" if m.attention_chunk_size else "")
        own = "".join(f"; {k} layers: {m.layer_kv_heads(k)} KV heads of {m.layer_head_dim(k)}"
                      for k in kinds if (m.layer_kv_heads(k), m.layer_head_dim(k))
                      != (m.num_key_value_heads, m.head_dim))
        lines.append(f"attention: {m.num_attention_heads} heads, {m.num_key_value_heads} KV "
                     f"heads of {m.head_dim}{window}{own}")
    if m.quantization:
        left = ", ".join(f"{c} {dict(m.unquantized)[c]:.0%}" for c in MODULE_CLASSES
                         if dict(m.unquantized).get(c))
        lines.append(f"quantization: {m.quantization}, {m.weight_dtype} weights "
                     f"({m.weight_dtype_bytes:.4g} bytes each with scales)"
                     + (f"; left at {m.dtype}: {left}" if left else ""))
    lines.append(f"weights: {m.weight_bytes(tp) / GiB:.2f} GiB a rank at TP {tp} "
                 f"({m.weight_bytes() / GiB:.1f} GiB in all; the checkpoint's bytes: "
                 "the start-up line holds them as the release's kernels lay them out)"
                 + (f"; the vision tower's {m.vision_params / 1e9:.2f} B parameters whole on "
                    "each rank" if m.vision_params else ""))
    per_kind = "; ".join(
        f"{k} {m.kv_bytes_per_token_per_layer(k, tp, kv_dtype_bytes):,.0f} B"
        for k in kinds)
    lines.append(f"KV cache a token a layer on one rank: {per_kind}")
    return lines


def describe_memory(plan: MemoryPlan) -> list[str]:
    g = GiB
    return [f"start-up: {plan.total / g:.1f} GiB x utilization = {plan.requested / g:.2f} GiB; "
            f"weights {plan.weights / g:.2f}, activation peak {plan.activation_peak / g:.2f}, "
            f"non-torch {plan.non_torch / g:.2f}, CUDA graphs {plan.cudagraph / g:.2f}, "
            f"KV cache {plan.kv_cache / g:.2f} GiB", *plan.log_lines()[2:]]


def borrowed_experts(gpu: GPU, m: ModelConfig, tp: int) -> str:
    """What ``m``'s routed experts run on ``gpu`` at TP ``tp`` where its MoE table times their
    kernel format on another shape only, so the step time scales that curve to the model's
    shape by the fitted form (:func:`chunktune.sim.cost.step_time.other_shape_curve`); ""
    otherwise."""
    if not m.is_moe:
        return ""
    fmt = moe_weight_format(m.weight_dtype, gpu.name)
    near = borrowed_shape(gpu.name, fmt, m.hidden_size, m.moe_intermediate_size, m.num_experts,
                          m.num_experts_per_tok, tp, 1)
    if near is None:
        return ""
    h, i, e, k = near
    return (f"routed experts ({fmt}): {gpu.name}'s measured curve of {h} x {i}, {e} experts, "
            f"top {k} at TP {tp}, scaled to this model's shape by the fitted form (borrowed: "
            "other INT4 shapes predicted so within 14% at the median, 36% at the 90th "
            "percentile)")


def cmd_check(ns: argparse.Namespace) -> int:
    try:
        model = _model(ns.config)
        gpu = with_peer_to_peer(resolve_gpu(ns.gpu), ns.gpu_peer_to_peer, "--gpu-peer-to-peer")
        if ns.tensor_parallel_size < 1:
            raise SpecError(f"must be >= 1 (got {ns.tensor_parallel_size})",
                            field="--tensor-parallel-size")
        version = (parse_version(ns.vllm_version, "--vllm-version") if ns.vllm_version
                   else None)
        cfg = resolve(EngineArgs(tensor_parallel_size=ns.tensor_parallel_size,
                                 kv_cache_dtype=ns.kv_cache_dtype,
                                 max_model_len=ns.max_model_len,
                                 max_num_batched_tokens=ns.max_num_batched_tokens,
                                 gpu_memory_utilization=ns.gpu_memory_utilization),
                      model, gpu, version=version)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except EngineStartupError as e:
        print(f"error: vLLM would refuse this configuration ({e.reason}): {e.message}",
              file=sys.stderr)
        return 1
    tp = cfg.tensor_parallel_size
    for line in describe_model(cfg.model, tp, cfg.kv_cache_dtype_bytes):
        print(line)
    layout = kv_cache_layout(cfg)
    groups = Counter((gr.kind, gr.layers, gr.blocks_per_request, gr.block_tokens)
                     for gr in layout.groups)
    print(f"KV cache groups (vLLM's hybrid manager, block {cfg.block_size}): " + "; ".join(
        f"{n} x {layers} {kind} layers, {blocks:,} blocks a max-length request"
        + (f" (blocks of {bt} tokens: pages unified)" if bt != cfg.block_size else "")
        for (kind, layers, blocks, bt), n in groups.items()))
    print(f"on {gpu.name} x{tp}, vLLM {text(cfg.vllm_version or CURRENT)}, --max-model-len "
          f"{cfg.max_model_len}, --kv-cache-dtype {cfg.kv_cache_dtype}:")
    try:
        plan = plan_memory(cfg)
    except EngineStartupError as e:
        print(f"  vLLM would not start ({e.reason}): {e.message}")
        if e.hint:
            print(f"  {e.hint}")
    else:
        for line in describe_memory(plan):
            print(f"  {line}")
    print(f"step time: {provenance(gpu, cfg.model)}")
    experts = borrowed_experts(gpu, cfg.model, tp)
    if experts:
        print(f"  {experts}")
    try:
        print(f"  {describe_steps(cfg)}")
    except SpecError as e:
        print(f"  simulated steps: not priced ({e})")
    return 0


#: The steps :func:`describe_steps` prices: decodes in flight, their context, a prefill chunk.
DECODES, CONTEXT, CHUNK = 16, 4096, 2048


def describe_steps(cfg: ResolvedConfig) -> str:
    """One line: the simulated time of a decode-only step and of a prefill chunk alone on the
    engine ``cfg`` resolves (its model, GPU and node, TP, KV cache dtype, release), with the
    all-reduces' part at TP > 1 (what the node's peer-to-peer path changes over PCIe)."""
    chunk = min(CHUNK, cfg.max_num_batched_tokens)
    cost = engine_cost(cfg, max_tokens=max(chunk, DECODES))
    decode = cost.step_time(DECODES, DECODES, DECODES, [], DECODES, DECODES * CONTEXT)
    prefill = cost.step_time(chunk, 1, 0, [(chunk, 0)], 0, 0)
    if cfg.tensor_parallel_size > 1:
        ar_d = f" (all-reduce {cost.allreduce_time(DECODES) * 1e3:.2f} ms)"
        ar_p = f" (all-reduce {cost.allreduce_time(chunk) * 1e3:.1f} ms)"
    else:
        ar_d = ar_p = ""
    return (f"simulated steps: {DECODES} decodes at {CONTEXT:,} tokens of context "
            f"{decode * 1e3:.2f} ms{ar_d}; a {chunk:,}-token prefill chunk alone "
            f"{prefill * 1e3:.1f} ms{ar_p}")
