"""The sampler warm-up of vLLM's memory-profiling pass, run with vLLM's own code on a CPU, its
live tensor bytes counted at the peak, next to the simulator's
(``chunktune.sim.engine.memory.sampler_activation_bytes``; the reference that
``tests/sim/engine/test_sampler_memory.py`` pins).

``GPUModelRunner.profile_run`` keeps the dummy forward pass's hidden states
(``max_num_batched_tokens`` x hidden) and runs ``_dummy_sampler_run`` on the last token of each
of ``max_num_seqs`` requests: ``torch.rand_like`` of those rows, ``model.compute_logits``
(``LogitsProcessor``: the lm-head's output over the vocabulary padded to 64, the padding sliced
off as a view), then the ``Sampler`` with temperature 0.5, top-k vocab-1, top-p 0.9, no
penalties, no logprobs. Here that method itself (``GPUModelRunner._dummy_sampler_run``, called
on a stand-in runner) runs on CPU tensors under ``torch.distributed._tools.mem_tracker.
MemTracker``, whose peak is the live bytes of every tensor storage the pass allocated,
the hidden states it is handed included.

What runs as on an H100 / H200 (the platform is faked as in ``bench/vllm_weights_reference.py``:
CUDA, SM90, 132 SMs), and what cannot run on a CPU:

* the top-k/top-p step of the PyTorch-native path is ``apply_top_k_top_p_triton``: its Python
  runs (the cached (programs, vocab) float32 buffer, ``_TRITON_BUFFER_CACHE``), its Triton
  kernel ``_topk_topp`` (in-place masking, no allocation) does not;
* vLLM 0.31+ samples first with FlashInfer (``VLLM_USE_FLASHINFER_SAMPLER`` defaults on and
  Hopper supports it): ``flashinfer`` (a CUDA package) is a stand-in whose
  ``sampling.top_k_top_p_sampling_from_logits`` allocates what flashinfer 0.7.2's Python
  wrapper allocates for tensor top-k/top-p (``top_k_mask_logits``: ``empty_like`` of the
  logits and a cached 1 MiB row-state buffer; ``torch.softmax`` of the masked logits; the
  int32 samples); vLLM 0.17 / 0.19 leave FlashInfer off by default (the PyTorch-native path);
* the lm-head GEMM is ``hidden @ weight.T`` (``UnquantizedLinearMethod.apply``'s result) on one
  rank (TP 1: tensor-parallel engines all-gather the logits, a transient of ``compute_logits``
  of (1/TP + 2) x 2 B a logit, below the sampler's peak).

    python bench/vllm_sampler_reference.py --vllm DIR [--vllm DIR2 ...]

``DIR`` holds the ``vllm/`` package of one release (0.17.0, 0.19.0, 0.31.0, 0.32.0, 0.33.0 read;
0.11.0 run for ``bench/startup_logs.py``'s logs: it has no Triton top-k/top-p kernel, samples
with FlashInfer when the package is installed, else on ``apply_top_k_top_p``'s sort path;
``--no-flashinfer`` runs the latter, as ``pip install vllm`` without its ``flashinfer`` extra).
Nothing here is measured on a GPU: the caching allocator's rounding (512 B blocks, 2 MiB
segments for large tensors) and fragmentation are not counted.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import types
import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))
sys.path.insert(0, str(ROOT / "bench"))

#: (requests, vocabulary, hidden) of the runs: small enough for a CPU, the vocabulary once not
#: a multiple of 64 (the lm-head pads it) and once with fewer requests than SMs
CASES = [(256, 4096, 512), (256, 4000, 512), (64, 8192, 256), (8, 2048, 128)]
NUM_SMS = 132


class LiveBytes:
    """The live bytes of the tensor storages created inside the context, and their peak: a
    ``TorchDispatchMode`` notes every op's output storage once (views and in-place results
    share it) and a ``weakref.finalize`` takes it off when the storage is freed (what the
    caching allocator sees, less its rounding). ``MemTracker`` does the same per module but
    refuses a module called twice (0.31+ calls the sampler twice). Views of tensors made
    before the context (``outside``: the lm-head's weight, whose ``.T`` the GEMM reads) are not
    counted."""

    def __init__(self, outside: tuple[Any, ...] = ()) -> None:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten
        from torch.utils.weak import WeakIdKeyDictionary

        self.live = self.peak = 0
        skip = {t.untyped_storage().data_ptr() for t in outside}  # e.g. the lm-head's weight
        seen: Any = WeakIdKeyDictionary()
        outer = self

        self.ops: dict[int, tuple[str, int]] = {}
        self.at_peak: list[tuple[str, int]] = []

        def note(t: Any, op: str) -> None:
            if not isinstance(t, torch.Tensor):
                return
            st = t.untyped_storage()
            if st in seen or st.data_ptr() in skip:
                return
            n = st.nbytes()
            seen[st] = n
            key = id(st)
            outer.ops[key] = (op, n)
            outer.live += n
            if outer.live > outer.peak:
                outer.peak = outer.live
                outer.at_peak = sorted(outer.ops.values(), key=lambda x: -x[1])
            weakref.finalize(st, outer._free, n, key)

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore
                out = func(*args, **(kwargs or {}))
                for t in tree_flatten(out)[0]:
                    note(t, str(func))
                return out

        self.mode = Mode()

    def _free(self, n: int, key: int) -> None:
        self.live -= n
        self.ops.pop(key, None)

    def __enter__(self) -> LiveBytes:
        self.mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.mode.__exit__(*exc)


def _flashinfer_stand_in() -> None:
    """A ``flashinfer`` whose ``sampling.top_k_top_p_sampling_from_logits`` allocates what
    flashinfer 0.7.2's Python does for tensor top-k / top-p (``filter_apply_order
    ="top_k_first"``, not the scalar-k fast path): the masked logits (``empty_like``), the
    cached 1 MiB row states, the softmax, the int32 samples. Its CUDA kernels are not run."""
    import torch

    cache: dict[str, torch.Tensor] = {}

    def top_k_top_p_sampling_from_logits(logits: torch.Tensor, top_k: Any, top_p: Any,
                                         **_: Any) -> torch.Tensor:
        cache.setdefault("row_states", torch.zeros(1024 * 1024, dtype=torch.uint8))
        masked_logits = torch.empty_like(logits)
        masked_logits.copy_(logits)
        probs = torch.softmax(masked_logits, dim=-1)
        out = probs.argmax(dim=-1).to(torch.int32)  # top_p_sampling_from_probs' samples
        return out

    fi = types.ModuleType("flashinfer")
    fi.cache = cache  # type: ignore[attr-defined]
    fi.sampling = SimpleNamespace(  # type: ignore[attr-defined]
        top_k_top_p_sampling_from_logits=top_k_top_p_sampling_from_logits)
    fi.__version__ = "0.7.2"  # type: ignore[attr-defined]  # 0.9-0.11 check >= 0.2.3
    sys.modules["flashinfer"] = fi
    sys.modules["flashinfer.sampling"] = fi.sampling  # type: ignore[assignment]


def runner_method(vllm_dir: str, name: str) -> Any:
    """``GPUModelRunner.<name>`` of the release's ``v1/worker/gpu_model_runner.py``, compiled
    from its source with the module-level names it reads (importing the whole runner module
    pulls in every model's Triton kernels, which do not import here)."""
    import ast
    import dataclasses

    import torch

    src = Path(vllm_dir, "vllm", "v1", "worker", "gpu_model_runner.py").read_text()
    tree = ast.parse(src)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GPUModelRunner")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)
    fn.decorator_list = []
    glb: dict[str, Any] = {"torch": torch, "replace": dataclasses.replace}
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    glb.update(LogitsProcessors=LogitsProcessors, SamplingMetadata=SamplingMetadata,
               SpecDecodeMetadata=SpecDecodeMetadata)
    try:
        from vllm.config.model import PROCESSED_LOGPROBS_MODES
        glb["PROCESSED_LOGPROBS_MODES"] = PROCESSED_LOGPROBS_MODES
    except ImportError:  # older releases
        pass
    mod = ast.Module(body=[fn], type_ignores=[])
    exec(compile(mod, f"{vllm_dir}/vllm/v1/worker/gpu_model_runner.py", "exec"), glb)
    return glb[name]


class NoKernel:
    """A Triton kernel launched as ``kernel[grid](...)`` that does nothing (it masks in place)."""

    def __getitem__(self, grid: Any) -> Any:
        return lambda *a, **k: None


def _stand_in_attr(attr: str) -> Any:
    if attr.startswith("__"):
        raise AttributeError(attr)
    return type(attr, (), {})


def run_release(vllm_dir: str, flashinfer: bool = True) -> list[dict[str, Any]]:
    """Each case's peak live bytes of ``_dummy_sampler_run`` under this release's code;
    ``flashinfer``: whether the (stand-in) ``flashinfer`` package is installed (0.9-0.11
    sample with it by default when it is, and ship it as an optional extra)."""
    os.environ.pop("VLLM_USE_FLASHINFER_SAMPLER", None)  # the release's default
    from vllm_weights_reference import fake_hopper, fake_tp

    try:
        import gguf  # noqa: F401
    except ImportError:  # 0.17 / 0.19 import it at module level (GGUF checkpoints only)
        for name in ("gguf", "gguf.constants", "gguf.quants"):
            mod = types.ModuleType(name)
            mod.__path__ = []  # type: ignore[attr-defined]
            mod.__getattr__ = _stand_in_attr  # type: ignore[method-assign]
            sys.modules[name] = mod
    fake_hopper(vllm_dir)
    fake_tp(1)  # 0.19's LogitsProcessor all-gathers at TP 1 too (a no-op there)
    if flashinfer:
        _flashinfer_stand_in()
    import importlib

    import torch
    import vllm
    import vllm.distributed.parallel_state as ps
    import vllm.v1.sample.ops.topk_topp_sampler as tks
    try:  # 0.17+: the Triton top-k/top-p kernel; before, the PyTorch sort path
        tkt: Any = importlib.import_module("vllm.v1.sample.ops.topk_topp_triton")
    except ImportError:
        tkt = SimpleNamespace(_TRITON_BUFFER_CACHE={}, apply_top_k_top_p_triton=None)
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.model_executor.layers.vocab_parallel_embedding import pad_vocab_size
    from vllm.v1.sample.sampler import Sampler

    dummy_sampler_run = runner_method(vllm_dir, "_dummy_sampler_run")

    # the Triton kernel masks in place (CUDA-only); its wrapper's Python, with its buffer, runs
    tkt._topk_topp = lambda *a, **k: None  # 0.31+: the dispatcher
    tkt._topk_topp_kernel = NoKernel()  # 0.17 / 0.19: the kernel launched directly
    tkt.num_compute_units = lambda *a, **k: NUM_SMS
    tks.HAS_TRITON = True  # on CUDA: Triton is there
    ps.get_tp_group().all_gather = lambda t, dim=-1: t  # one rank
    if hasattr(tks, "register_top_k_top_p_warmups"):  # JIT warm-up registry (after profiling)
        tks.register_top_k_top_p_warmups = lambda: None
    if tkt.apply_top_k_top_p_triton is not None:
        tks.apply_top_k_top_p_triton = tkt.apply_top_k_top_p_triton
    if hasattr(tks, "flashinfer_sampler_supported"):  # 0.31+: the SM90 answer (no JIT here)
        tks.flashinfer_sampler_supported = lambda: bool(tks.envs.VLLM_USE_FLASHINFER_SAMPLER)
    elif tks.envs.VLLM_USE_FLASHINFER_SAMPLER:  # 0.19 and before: off unless asked for
        from vllm.v1.attention.backends.flashinfer import FlashInferBackend  # noqa: F401
    rows = []
    for reqs, vocab, hidden in CASES:
        tkt._TRITON_BUFFER_CACHE.clear()  # each case as a fresh process: no cached buffer
        if flashinfer:
            sys.modules["flashinfer"].cache.clear()  # type: ignore[attr-defined]
        sampler = Sampler()
        padded = pad_vocab_size(vocab, 64)
        weight = torch.randn(padded, hidden, dtype=torch.bfloat16)
        head = SimpleNamespace(
            tp_size=1, weight=weight,
            quant_method=SimpleNamespace(apply=lambda layer, x, bias=None: x @ layer.weight.T))
        with set_current_vllm_config(VllmConfig()):  # no model config: the model's dtype
            lp = LogitsProcessor(vocab)
        runner = SimpleNamespace(
            vllm_config=SimpleNamespace(model_config=SimpleNamespace(multimodal_config=None)),
            model=SimpleNamespace(compute_logits=functools.partial(lp, head)),
            device=torch.device("cpu"), sampler=sampler, speculative_config=None)
        with LiveBytes(outside=(weight,)) as live:
            last_hidden = torch.randn(reqs, hidden, dtype=torch.bfloat16)
            dummy_sampler_run(runner, last_hidden)
        peak = live.peak
        if os.environ.get("SAMPLER_REFERENCE_DEBUG"):
            print(reqs, vocab, live.at_peak[:10], file=sys.stderr)
        buffer = next(iter(tkt._TRITON_BUFFER_CACHE.values()), None)
        row = {"vllm": vllm.__version__, "from": str(Path(vllm.__file__).parents[1]),
               "requests": reqs, "vocab": vocab, "padded": padded,
               "hidden": hidden, "peak_bytes": int(peak),
               "triton_buffer_rows": 0 if buffer is None else int(buffer.shape[0]),
               "flashinfer_first": tks.TopKTopPSampler().forward.__name__ == "forward_cuda",
               "flashinfer_installed": flashinfer}
        rows.append(row)
    return rows


def simulated(row: dict[str, Any]) -> float:
    """The simulator's bytes of the same pass (no forward pass's hidden states: tokens 0): the
    V1 runner's path, with FlashInfer's cached row states where the release samples with it
    first (the V1 runner of 0.31+, ``VLLM_USE_V2_MODEL_RUNNER=0``)."""
    from chunktune.sim.engine.activation import (
        FLASHINFER_ROW_STATES_BYTES,
        V1_NATIVE,
        sampler_warmup_live_bytes,
    )

    live = sampler_warmup_live_bytes(V1_NATIVE, row["requests"], row["vocab"], row["hidden"],
                                     2, NUM_SMS)
    return live + (FLASHINFER_ROW_STATES_BYTES if row["flashinfer_first"] else 0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm", action="append", required=True, metavar="DIR",
                    help="directory holding an unzipped vLLM release's vllm/ (repeatable)")
    ap.add_argument("--no-flashinfer", action="store_true",
                    help="run without the flashinfer package (0.9-0.11: `pip install vllm` "
                         "without its flashinfer extra samples on the PyTorch sort path)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    if ns.one:  # one release a process: each imports its own vllm
        print(json.dumps(run_release(ns.one, flashinfer=not ns.no_flashinfer)))
        return 0
    for d in ns.vllm:
        cmd = [sys.executable, __file__, "--vllm", d, "--one", d]
        out = subprocess.run(cmd + (["--no-flashinfer"] if ns.no_flashinfer else []),
                             capture_output=True, text=True, check=False)
        if out.returncode:
            print(out.stderr[-3000:], file=sys.stderr)
            return out.returncode
        for row in json.loads(out.stdout.strip().splitlines()[-1]):
            sim = simulated(row)
            print(f"vLLM {row['vllm']} {row['requests']} requests x vocab {row['vocab']} "
                  f"(padded {row['padded']}), hidden {row['hidden']}: peak "
                  f"{row['peak_bytes']:,} B = "
                  f"{row['peak_bytes'] / (row['requests'] * row['vocab']):.2f} B a logit "
                  f"(Triton buffer {row['triton_buffer_rows']} rows, FlashInfer first: "
                  f"{row['flashinfer_first']}); simulator {sim:,.0f} B "
                  f"({(sim / row['peak_bytes'] - 1) * 100:+.2f}%)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
