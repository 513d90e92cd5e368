"""The KV-cache figures vLLM's own code computes for the models the simulator sizes, next to
the simulator's (the reference that ``tests/sim/engine/test_kv_layout.py`` pins).

vLLM's KV planning is pure Python and imports on a CPU machine: unzip a vLLM wheel (only its
``vllm/`` Python files are needed) and give the directory:

    python bench/vllm_kv_reference.py --vllm DIR          # DIR holds vllm/ of release 0.33.0

For each model the per-layer KV specs are built as vLLM's attention layers build them
(``Attention.get_kv_cache_spec``: FullAttentionSpec / SlidingWindowSpec;
``ChunkedLocalAttention``: ChunkedLocalAttentionSpec; ``MLAAttention``: MLAAttentionSpec with
one KV head of kv_lora_rank + qk_rope_head_dim), with the KV heads of one TP rank. vLLM's
``get_kv_cache_groups`` groups them, ``get_kv_cache_config_from_groups`` cuts the available
memory (the simulator's figure for that engine, so the two are compared on the same bytes)
into blocks, and ``get_kv_cache_capacity`` gives the tokens vLLM prints. Prints one line a
model: vLLM's blocks and tokens, the simulator's, and their difference.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))
CONFIGS = ROOT.parent / "shared" / "data" / "aiconfigurator-vllm" / "model-configs"

#: (model config, GPU, TP, --max-model-len or None for the model's own, --kv-cache-dtype) of
#: issue 32's acceptance; budget 8192 tokens, async scheduling on (vLLM 0.33's defaults)
CASES = [
    ("deepseek-ai--DeepSeek-V3", "h200", 8, None, "auto"),
    ("deepseek-ai--DeepSeek-V3", "h200", 8, None, "fp8"),
    ("moonshotai--Kimi-K2.5", "h200", 8, None, "auto"),
    ("openai--gpt-oss-120b", "h100-sxm", 1, None, "auto"),
    ("openai--gpt-oss-20b", "h100-sxm", 1, 8192, "auto"),
    ("Qwen--Qwen3-235B-A22B-FP8", "h200", 4, None, "auto"),
    ("meta-llama--Llama-4-Scout-17B-16E-Instruct", "h100-sxm", 4, 131072, "auto"),
    ("meta-llama--Llama-4-Maverick-17B-128E-Instruct", "h200", 8, 65536, "auto"),
]


def vllm_specs(model: Any, tp: int, block_size: int, kv_bytes: float) -> dict[str, Any]:
    """Each layer's KV-cache spec as vLLM 0.33's attention layers build it."""
    import torch
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
    )

    from chunktune.core.models import CHUNKED, MLA, SLIDING

    dtype = torch.bfloat16 if kv_bytes == 2 else torch.float8_e4m3fn
    kv_heads = max(1, model.num_key_value_heads // tp)
    specs: dict[str, Any] = {}
    for i, kind in enumerate(model.layer_kinds()):
        name = f"model.layers.{i}.attn"
        common = {"block_size": block_size, "dtype": dtype}
        if kind == MLA:
            specs[name] = MLAAttentionSpec(
                num_kv_heads=1, head_size=model.kv_lora_rank + model.qk_rope_head_dim,
                cache_dtype_str="auto" if kv_bytes == 2 else "fp8", **common)
        elif kind == SLIDING:
            specs[name] = SlidingWindowSpec(num_kv_heads=kv_heads, head_size=model.head_dim,
                                            sliding_window=model.sliding_window, **common)
        elif kind == CHUNKED:
            specs[name] = ChunkedLocalAttentionSpec(
                num_kv_heads=kv_heads, head_size=model.head_dim,
                attention_chunk_size=model.attention_chunk_size, **common)
        else:
            specs[name] = FullAttentionSpec(num_kv_heads=kv_heads, head_size=model.head_dim,
                                            **common)
    return specs


def vllm_capacity(cfg: Any, available: int) -> tuple[int, int, float]:
    """(num_blocks, KV tokens, max concurrency) vLLM computes for ``available`` bytes."""
    from vllm.config import VllmConfig
    from vllm.v1.core import kv_cache_planning as planning
    from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity

    class Cfg(SimpleNamespace):  # the VllmConfig fields the planning functions read
        max_concurrent_batches = VllmConfig.max_concurrent_batches
        max_in_flight_tokens = VllmConfig.max_in_flight_tokens

    vc = Cfg(
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False,
                                         max_num_batched_tokens=cfg.max_num_batched_tokens,
                                         async_scheduling=cfg.async_scheduling),
        attention_config=SimpleNamespace(hisparse_config=None),
        cache_config=SimpleNamespace(
            kv_cache_layout="NHD", num_gpu_blocks_override=None,
            prefix_cache_retention_interval=None,
            get_resolved_kv_cache_layout=lambda: __import__(
                "vllm.config.cache", fromlist=["_layout_from_name"])._layout_from_name("NHD")),
        model_config=SimpleNamespace(max_model_len=cfg.max_model_len),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1,
                                        pipeline_parallel_size=1),
        use_v2_model_runner=False,
    )
    specs = vllm_specs(cfg.model, cfg.tensor_parallel_size, cfg.block_size,
                       cfg.kv_cache_dtype_bytes)
    groups = planning.get_kv_cache_groups(vc, specs)
    kvc = planning.get_kv_cache_config_from_groups(vc, groups, available)
    tokens, conc = get_kv_cache_capacity(vc, kvc)
    return kvc.num_blocks, tokens, conc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm", required=True, metavar="DIR",
                    help="directory holding an unzipped vLLM wheel's vllm/ package")
    ns = ap.parse_args(argv)
    sys.path.insert(0, ns.vllm)
    import vllm

    from chunktune.core.engine_args import EngineArgs, resolve
    from chunktune.core.gpus import resolve_gpu
    from chunktune.core.models import resolve_model
    from chunktune.sim.engine.memory import plan_memory

    print(f"vLLM {vllm.__version__} (from {ns.vllm})")
    for name, gpu, tp, mml, kv_dtype in CASES:
        model = resolve_model(config_path=CONFIGS / f"{name}_config.json", name=name)
        cfg = resolve(EngineArgs(tensor_parallel_size=tp, max_model_len=mml,
                                 kv_cache_dtype=kv_dtype, max_num_batched_tokens=8192,
                                 async_scheduling=True), model, resolve_gpu(gpu))
        plan = plan_memory(cfg)
        blocks, tokens, conc = vllm_capacity(cfg, int(plan.kv_cache))
        ours = plan.kv_cache_tokens
        print(f"{name} {gpu} TP{tp} kv {kv_dtype} max_model_len {cfg.max_model_len}: available "
              f"{int(plan.kv_cache)} B; vLLM num_blocks {blocks}, KV tokens {tokens:,}, "
              f"concurrency {conc:.2f}x; simulator KV tokens {ours:,} "
              f"({(ours - tokens) / tokens:+.3%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
