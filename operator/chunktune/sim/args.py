"""``vllm serve``-style argument parsing shared by ``chunktune sim run`` and ``sim serve``.

Flags take vLLM's spellings (``--max-num-batched-tokens``; vLLM's ``--max_num_batched_tokens``
underscore form works too; sizes accept ``8k`` = 8000 and ``8K`` = 8192 as vLLM does), so one
argument list serves a vLLM pod and a simulated one. Flags only the simulator has
(``--gpu``, ``--model-config``, ``--load-time``) sit in their own group. A vLLM flag the simulator
does not model is accepted with one warning; a near-miss of a modeled flag is an error with the
suggestion, since a typo would otherwise silently tune nothing.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Sequence

from chunktune.core.errors import Problems, SpecError
from chunktune.sim.config import EngineArgs
from chunktune.sim.gpus import GPU, gpu_names, resolve_gpu
from chunktune.sim.models import ModelConfig, catalog_names, resolve_model


def human_int(text: str) -> int:
    """vLLM's human-readable integers: ``8k`` = 8000, ``8K`` = 8192 (also m/M, g/G)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*", str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"expected an integer such as 2048, 8k or 8K "
                                         f"(got {text!r})")
    num, unit = float(m.group(1)), m.group(2)
    scale = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9,
             "K": 2**10, "M": 2**20, "G": 2**30}[unit]
    value = num * scale
    if value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(value)


def _fraction(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number such as 0.9 (got {text!r})") from None


#: (flag, dest, type, help) of the modeled ``vllm serve`` arguments.
ENGINE_FLAGS: list[tuple[str, str, object, str]] = [
    ("--max-num-batched-tokens", "max_num_batched_tokens", human_int,
     "token budget of one engine step (vLLM default by GPU: 8192 on >=70 GiB non-A100, "
     "else 2048)"),
    ("--max-num-seqs", "max_num_seqs", human_int, "max requests in the running set"),
    ("--long-prefill-token-threshold", "long_prefill_token_threshold", human_int,
     "cap on one request's tokens per step (0 = no cap)"),
    ("--max-model-len", "max_model_len", human_int, "context length (default: the model's)"),
    ("--gpu-memory-utilization", "gpu_memory_utilization", _fraction,
     "fraction of GPU memory for the engine (default 0.92)"),
    ("--block-size", "block_size", int, "KV block size in tokens (default 16)"),
    ("--tensor-parallel-size", "tensor_parallel_size", int, "tensor-parallel degree"),
    ("--max-num-partial-prefills", "max_num_partial_prefills", int,
     "V0 only; V1 refuses values other than 1"),
    ("--max-long-partial-prefills", "max_long_partial_prefills", int,
     "V0 only; V1 refuses values other than 1"),
    ("--kv-cache-dtype", "kv_cache_dtype", str, "auto or fp8"),
    ("--kv-cache-memory-bytes", "kv_cache_memory_bytes", human_int,
     "KV cache size in bytes (overrides --gpu-memory-utilization)"),
    ("--num-gpu-blocks-override", "num_gpu_blocks_override", int, "force the KV block count"),
    ("--scheduling-policy", "scheduling_policy", str, "fcfs or priority"),
    ("--max-cudagraph-capture-size", "max_cudagraph_capture_size", int,
     "largest CUDA-graph batch"),
]
_BOOL_FLAGS = [
    ("--enable-chunked-prefill", "enable_chunked_prefill", "chunked prefill (default on)"),
    ("--enable-prefix-caching", "enable_prefix_caching",
     "prefix caching (accepted; not modeled: synthetic prompts share no prefix)"),
]


def add_engine_args(p: argparse.ArgumentParser, model_positional: bool = False) -> None:
    g = p.add_argument_group("engine (vllm serve flags)")
    if model_positional:
        g.add_argument("model_tag", nargs="?", metavar="MODEL",
                       help="model, as `vllm serve MODEL` takes it")
    g.add_argument("--model", help=f"catalog name or HF repo id ({', '.join(catalog_names())})")
    for flag, dest, typ, help_ in ENGINE_FLAGS:
        g.add_argument(flag, dest=dest, type=typ, default=None, help=help_)  # type: ignore[arg-type]
    g.add_argument("-tp", dest="tensor_parallel_size", type=int, default=None,
                   help=argparse.SUPPRESS)
    for flag, dest, help_ in _BOOL_FLAGS:
        g.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None,
                       help=help_)
    g.add_argument("--enforce-eager", action="store_true", default=None,
                   help="no CUDA graphs: no graph memory, more launch overhead per step")
    s = p.add_argument_group("simulator only")
    s.add_argument("--gpu", default="h100-sxm", help=f"GPU type ({', '.join(gpu_names())})")
    s.add_argument("--model-config", help="a Hugging Face config.json for a model not in the "
                                          "catalog")


def engine_args_from(ns: argparse.Namespace) -> EngineArgs:
    kw = {dest: getattr(ns, dest) for _, dest, _, _ in ENGINE_FLAGS
          if getattr(ns, dest, None) is not None}
    for _, dest, _ in _BOOL_FLAGS:
        if getattr(ns, dest, None) is not None:
            kw[dest] = getattr(ns, dest)
    if getattr(ns, "enforce_eager", None):
        kw["enforce_eager"] = True
    return EngineArgs(**kw)


def model_and_gpu(ns: argparse.Namespace) -> tuple[ModelConfig, GPU]:
    name = getattr(ns, "model", None) or getattr(ns, "model_tag", None)
    problems = Problems()
    model = problems.attempt(resolve_model, name, ns.model_config)
    gpu = problems.attempt(resolve_gpu, ns.gpu)
    problems.check()
    assert model is not None and gpu is not None
    return model, gpu


def normalize_argv(argv: Sequence[str]) -> list[str]:
    """vLLM accepts ``--max_num_seqs`` for ``--max-num-seqs``; so do we."""
    out = []
    for a in argv:
        if a.startswith("--") and "_" in a.split("=", 1)[0]:
            head, sep, tail = a.partition("=")
            a = head.replace("_", "-") + sep + tail
        out.append(a)
    return out


def split_unknown(parser: argparse.ArgumentParser,
                  unknown: list[str]) -> tuple[list[str], list[str]]:
    """Sort leftover arguments into (ignored vLLM flags, errors with suggestions)."""
    known = [s for a in parser._actions for s in a.option_strings]
    ignored, errors = [], []
    for a in unknown:
        if not a.startswith("-"):
            continue  # a value of an ignored flag
        name = a.split("=", 1)[0]
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.88)
        if close:
            errors.append(f"unknown flag {name}; did you mean {close[0]}?")
        else:
            ignored.append(name)
    return ignored, errors


def parse_engine_flags(flags: Sequence[str]) -> tuple[EngineArgs, argparse.Namespace, list[str]]:
    """Parse a ``vllm serve`` flag list (fixed args plus a trial's flags) into
    :class:`EngineArgs`; returns the args, the namespace (model, gpu, ...) and the flags the
    simulator does not model. Raises :class:`SpecError` for a malformed value."""
    p = argparse.ArgumentParser(prog="engine args", add_help=False, allow_abbrev=False,
                                exit_on_error=False)
    add_engine_args(p)
    try:
        ns, unknown = p.parse_known_args(normalize_argv(flags))
    except argparse.ArgumentError as e:
        raise SpecError(str(e), field=e.argument_name or "args") from None
    return engine_args_from(ns), ns, unknown
