"""The weight bytes one tensor-parallel rank holds as vLLM's own model code creates them, next to
the simulator's (the reference that ``tests/sim/engine/test_weights.py`` pins).

vLLM's model classes build their parameters in ``__init__`` (the quantization method's
``create_weights`` decides each parameter's dtype and shape), so they can be built on the
``meta`` device on a CPU machine: no memory, no GPU. Unzip a vLLM wheel (only its Python files
are needed; its compiled extensions are not loaded) and give the directory:

    python bench/vllm_weights_reference.py --vllm DIR     # DIR holds vllm/ of release 0.33.0

For each model: the model's ``config.json`` (and ``hf_quant_config.json`` where present) in a
temporary directory, ``EngineArgs(...).create_engine_config()`` resolves the architecture and
the quantization config as ``vllm serve`` does, and
``model_loader.utils.initialize_model`` builds the model class under ``torch.device("meta")``.
The sum of its parameters' and buffers' bytes is what the rank holds after ``load_weights``
before ``process_weights_after_loading`` (see "Not followed" below).

What is faked, and how (nothing in vLLM's model or quantization code is changed):

* the platform: a ``CudaPlatform`` (vLLM's NonNvml one) answering compute capability 9.0 (H100
  and H200 are both SM90; 132 SMs; ``current_device()`` the meta device), set as
  ``vllm.platforms.current_platform`` before anything reads it, so ``select_mxfp4_moe_backend``
  (TRITON for gpt-oss), the FP8 methods (TRITON MoE, cutlass block-FP8 linear) and
  compressed-tensors' WNA16 MoE (MARLIN) pick as on Hopper;
* the CUDA extensions' capability queries, which ``vllm._custom_ops`` forwards to
  ``torch.ops._C``: answered as the CUDA kernels do (cutlass FP8 from SM89, block FP8 and the
  grouped GEMM on SM90/SM100, FP4 from SM100, MXFP4 expert quantization on SM100 only).
  ``vllm._C_stable_libtorch`` and ``vllm.vllm_flash_attn`` (compiled-only) are empty modules;
  once ``_custom_ops`` has registered what it finds (nothing), any other ``torch.ops._C``
  kernel a layer binds in ``__init__`` (``silu_and_mul``...) is a stand-in that raises if
  called (nothing is run); ``torch.cuda.Stream`` / ``Event`` (the shared experts' side
  stream) are plain objects. DeepGEMM's extension is absent, so it is not selected; the FP8
  methods' ``create_weights`` shapes do not depend on the kernel;
* the tensor-parallel group: ``parallel_state._TP`` (and the world, EP, pipeline, data and
  context-parallel groups) are stand-ins with ``world_size`` the TP size and rank 0, so
  ``get_tensor_model_parallel_world_size`` / ``_rank`` give what rank 0 of that engine sees;
* multimodal checkpoints (Kimi-K2.5, Gemma-4, Llama-4) build their towers as when served with
  their processor files (only config.json is here): ``ModelConfig._supports_multimodal_inputs``
  answers yes, the HF processors (whose image parts need torchvision) are empty classes, and
  the registry inspects a model class in this process, not in a subprocess that would import
  the environment's installed vLLM.

``process_weights_after_loading`` runs on loaded weights and is not followed, but for the OAI
Triton MXFP4 backend (gpt-oss on Hopper), whose repacking is printed apart
(:func:`triton_mxfp4_after_loading`: vLLM's ``_swizzle_mxfp4`` on the meta tensors). Not
followed: MLA's ``W_UK_T`` / ``W_UV`` (bf16 copies of ``kv_b_proj``'s halves it makes there).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import types
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))
CONFIGS = ROOT.parent / "shared" / "data" / "aiconfigurator-vllm" / "model-configs"

#: (model config, GPU, TP) of issue 32's acceptance
CASES = [
    ("deepseek-ai--DeepSeek-V3", "h200", 8),
    ("moonshotai--Kimi-K2.5", "h200", 8),
    ("openai--gpt-oss-120b", "h100-sxm", 1),
    ("Qwen--Qwen3-235B-A22B-FP8", "h200", 4),
    ("google--gemma-4-26B-A4B", "h100-sxm", 1),
    ("meta-llama--Llama-4-Scout-17B-16E-Instruct", "h100-sxm", 4),
]

#: Hopper: H100 and H200 are both compute capability 9.0
CAPABILITY = (9, 0)


class NotBuilt:
    """A compiled kernel, looked up (``torch.ops._C.silu_and_mul``, ``.default``) but never
    run here."""

    def __getattr__(self, name: str) -> Any:
        return self

    def __call__(self, *a: Any, **k: Any) -> Any:
        raise RuntimeError("vLLM's compiled kernels are not built on this machine")


def fake_hopper(vllm_dir: str) -> None:
    """Import vLLM from ``vllm_dir`` with the current platform a CUDA GPU of
    :data:`CAPABILITY` (see the module docstring for what is stubbed)."""
    sys.path.insert(0, vllm_dir)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its backend choices: --verbose
    for name in ("vllm._C_stable_libtorch", "vllm._C", "vllm._moe_C",
                 "vllm._moe_C_stable_libtorch"):
        sys.modules.setdefault(name, types.ModuleType(name))
    fa = types.ModuleType("vllm.vllm_flash_attn")  # compiled-only; not used to build weights
    for name in ("compile_flash_attn_varlen_func_from_specs", "flash_attn_varlen_func",
                 "get_scheduler_metadata"):
        setattr(fa, name, NotBuilt())
    fa.is_fa_version_supported = lambda *a, **k: False  # type: ignore[attr-defined]
    fa.fa_version_unsupported_reason = lambda *a, **k: "not built"  # type: ignore[attr-defined]
    sys.modules["vllm.vllm_flash_attn"] = fa

    import torch._ops
    import torch.cuda
    import vllm.platforms as platforms
    from vllm.platforms.cuda import NonNvmlCudaPlatform
    from vllm.platforms.interface import DeviceCapability

    class Hopper(NonNvmlCudaPlatform):
        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(*CAPABILITY)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return "NVIDIA H100 80GB HBM3"

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return 80 * 2**30

        @classmethod
        def device_count(cls) -> int:
            return 8

        @classmethod
        def num_compute_units(cls, device_id: int = 0) -> int:
            return 132  # H100 SXM's SMs (an attention backend's __init__ reads it)

        @classmethod
        def current_device(cls) -> Any:
            return torch.device("meta")  # a tower moved .to(current_device()) stays on meta

    platforms._current_platform = Hopper()  # type: ignore[attr-defined]
    import vllm._custom_ops as ops  # the CUDA kernels' own capability answers (csrc)
    ops.cutlass_scaled_mm_supports_fp8 = lambda c: c >= 89
    ops.cutlass_scaled_mm_supports_block_fp8 = lambda c: c >= 90
    ops.cutlass_scaled_mm_supports_fp4 = lambda c: c >= 100
    ops.mxfp4_experts_quant_supported = lambda c: c // 10 == 10
    ops.cutlass_group_gemm_supported = lambda c: 90 <= c < 110

    # _custom_ops registered what it registers on the ops it found (none); from here on, a
    # kernel of torch.ops._C that layers bind in __init__ or modules on import is a stand-in
    lookup = torch._ops._OpNamespace.__getattr__

    def kernel(self: Any, name: str) -> Any:
        try:
            return lookup(self, name)
        except AttributeError:
            if getattr(self, "name", "") == "_C" and not name.startswith("__"):
                return NotBuilt()
            raise

    torch._ops._OpNamespace.__getattr__ = kernel  # type: ignore[method-assign]

    class Stand(SimpleNamespace):
        pass

    # the shared experts' side stream and its events, made in __init__
    torch.cuda.Stream = torch.cuda.Event = Stand  # type: ignore[assignment,misc]
    # a multimodal checkpoint served with its processor files (absent here: only config.json)
    # builds its towers under the default --limit-mm-per-prompt
    from vllm.config.model import ModelConfig
    ModelConfig._supports_multimodal_inputs = lambda self: self.is_multimodal_model
    # the registry inspects a model class in a subprocess, which would import the vLLM
    # installed in this environment, not DIR's: inspect in this process
    import vllm.model_executor.models.registry as registry
    registry._run_in_subprocess = lambda fn: fn()
    # gemma4_mm.py and mllama4.py import the HF processors, whose image parts need
    # torchvision (not needed to build weights, not installed here)
    import transformers.models.gemma4 as hf_gemma4
    import transformers.models.llama4 as hf_llama4
    hf_gemma4.Gemma4Processor = type("Gemma4Processor", (), {})
    hf_llama4.Llama4Processor = type("Llama4Processor", (), {})
    image = types.ModuleType("transformers.models.llama4.image_processing_llama4")
    image.find_supported_resolutions = image.get_best_fit = NotBuilt()  # type: ignore[attr-defined]
    sys.modules[image.__name__] = image


def fake_tp(tp: int) -> None:
    """Rank 0 of a ``tp``-way tensor-parallel engine, as ``parallel_state``'s getters see it."""
    import vllm.distributed.parallel_state as ps

    def group(n: int) -> SimpleNamespace:
        return SimpleNamespace(world_size=n, rank_in_group=0, rank=0, ranks=list(range(n)),
                               local_rank=0, is_first_rank=True, is_last_rank=True,
                               device_group=SimpleNamespace(size=lambda: n, rank=lambda: 0),
                               cpu_group=None, unique_name="reference",
                               use_custom_op_call=False, device_communicator=None)

    ps._WORLD, ps._TP, ps._EP = group(tp), group(tp), group(tp)
    ps._PP = ps._DP = ps._DCP = ps._PCP = ps._EPLB = group(1)


def build_model(name: str, tp: int, **engine_args: Any) -> tuple[Any, Any]:
    """(the ``VllmConfig``, the model class built on the meta device) of rank 0 of ``name`` at
    TP ``tp``, as vLLM resolves ``vllm serve`` with ``engine_args`` (after :func:`fake_hopper`)."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    with tempfile.TemporaryDirectory() as d:
        shutil.copy(CONFIGS / f"{name}_config.json", Path(d) / "config.json")
        quant = CONFIGS / f"{name}_hf_quant_config.json"
        if quant.is_file():
            shutil.copy(quant, Path(d) / "hf_quant_config.json")
        vc = EngineArgs(model=d, tensor_parallel_size=tp, skip_tokenizer_init=True,
                        load_format="dummy", enforce_eager=True,
                        **engine_args).create_engine_config()
        fake_tp(tp)
        with set_current_vllm_config(vc), set_default_torch_dtype(vc.model_config.dtype), \
                torch.device("meta"):
            model = initialize_model(vllm_config=vc, model_config=vc.model_config)
    return vc, model


def vllm_weights(name: str, tp: int) -> tuple[int, Counter[tuple[str, str]], str, int]:
    """(bytes of rank 0's parameters and buffers, those bytes by module path and dtype, the
    model class and quantization config, what :func:`triton_mxfp4_after_loading` adds) as
    vLLM builds ``name`` at TP ``tp``."""
    vc, model = build_model(name, tp)
    total, by = 0, Counter[tuple[str, str]]()
    tensors: list[tuple[str, Any]] = [*model.named_parameters(), *model.named_buffers()]
    for path, t in tensors:
        b = t.numel() * t.element_size()
        total += b
        by[(".".join(p for p in path.split(".") if not p.isdigit()), str(t.dtype))] += b
    method = type(vc.quant_config).__name__ if vc.quant_config else "no quantization"
    what = f"{type(model).__name__}, {method}"
    return total, by, what, triton_mxfp4_after_loading(model)


def triton_mxfp4_after_loading(model: Any) -> int:
    """Bytes the OAI Triton MXFP4 backend adds in ``process_weights_after_loading``
    (``convert_gpt_oss_weight_to_mxfp4_moe_kernel_format``): vLLM's own ``_swizzle_mxfp4`` run
    on the meta tensors with triton_kernels' layouts for :data:`CAPABILITY`
    (``HopperMXValueLayout`` / ``HopperMXScaleLayout``: the scales padded to 256 rows, their
    groups to 0 mod 4), and the expert biases cast to float32. 0 for other backends."""
    import torch
    from vllm.utils.import_utils import has_triton_kernels

    if not has_triton_kernels():
        return 0
    import triton_kernels.tensor_details.layout as layout
    from vllm.model_executor.layers.quantization.utils.mxfp4_utils import _swizzle_mxfp4

    # triton_kernels asks torch.cuda for the capability; answer for the faked GPU
    layout.cuda_capability_geq = lambda major, minor=0: (major, minor) <= CAPABILITY

    def nbytes(t: Any) -> int:  # a tensor, or triton_kernels' wrapper of its swizzled one
        data = t if isinstance(t, torch.Tensor) else t.storage.data
        return int(data.numel() * data.element_size())

    extra = 0
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        backend = getattr(method, "mxfp4_backend", None)
        if backend is None or backend.name != "TRITON":
            continue
        for w, sc in (("w13_weight", "w13_weight_scale"), ("w2_weight", "w2_weight_scale")):
            weight, scale = getattr(module, w), getattr(module, sc)
            new_w, _, new_s = _swizzle_mxfp4(weight, scale)
            extra += nbytes(new_w) + nbytes(new_s) - nbytes(weight) - nbytes(scale)
        for b in ("w13_bias", "w2_bias"):
            bias = getattr(module, b, None)
            if bias is not None:
                extra += bias.numel() * (4 - bias.element_size())
    return extra


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm", required=True, metavar="DIR",
                    help="directory holding an unzipped vLLM wheel's vllm/ package")
    ap.add_argument("--model", action="append", help="only these model configs (repeatable)")
    ap.add_argument("--verbose", action="store_true",
                    help="vLLM's INFO log: the backends and kernels it selects")
    ap.add_argument("--detail", action="store_true",
                    help="also print the bytes by module and dtype, largest first")
    ns = ap.parse_args(argv)
    if ns.verbose:
        os.environ["VLLM_LOGGING_LEVEL"] = "INFO"
    fake_hopper(ns.vllm)
    import vllm

    from chunktune.core.models import resolve_model

    print(f"vLLM {vllm.__version__} (from {ns.vllm}), compute capability {CAPABILITY}")
    rows = []
    for name, gpu, tp in CASES:
        if ns.model and name not in ns.model:
            continue
        total, by, what, after = vllm_weights(name, tp)
        model = resolve_model(config_path=CONFIGS / f"{name}_config.json", name=name)
        ours = int(model.weight_bytes(tp))
        # the language model's rotary cos/sin caches (a vision tower's are its own)
        rope = sum(b for (path, _), b in by.items()
                   if path.endswith("cos_sin_cache") and "vision" not in path)
        print(f"{name} {gpu} TP{tp} ({what}): vLLM {total} B ({total / 2**30:.3f} GiB) a rank, "
              f"rotary caches {rope} B; simulator {ours} B ({(ours - total) / total:+.3%}), "
              f"rotary caches {int(model.rope_cache_bytes())} B", flush=True)
        if after:
            err = (ours - total - after) / (total + after)
            print(f"    after the OAI Triton MXFP4 kernels' process_weights_after_loading: "
                  f"+{after} B ({total + after} B; simulator {err:+.3%})")
        rows.append({"model": name, "tp": tp, "vllm_bytes": total, "vllm_rope_bytes": rope,
                     "vllm_after_loading_extra": after, "simulator_bytes": ours})
        if ns.detail:
            for (path, dtype), b in sorted(by.items(), key=lambda kv: -kv[1]):
                print(f"    {b:>14} {path} {dtype}")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
