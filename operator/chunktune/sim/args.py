"""``vllm serve``-style argument parsing shared by ``chunktune sim run`` and ``sim serve``.

The engine flags, their spellings, parsers and help come from the registry
(:mod:`chunktune.core.flags`): vLLM's spellings (``--max-num-batched-tokens``; vLLM's
``--max_num_batched_tokens`` underscore form works too), vLLM's value parsers (``8k`` = 8000 and
``8K`` = 8192 where vLLM takes them), so one argument list serves a vLLM pod and a simulated
one. Flags only the simulator has (``--gpu``, ``--model-config``, ``--load-time``) sit in their
own group. A vLLM flag the simulator does not model is accepted with one warning; a near-miss of
a modeled flag is an error with the suggestion, since a typo would otherwise silently tune
nothing.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence

from chunktune.core import flags
from chunktune.core.engine_args import EngineArgs
from chunktune.core.errors import Problems
from chunktune.core.gpus import GPU, gpu_names, resolve_gpu
from chunktune.core.models import ModelConfig, catalog_names, resolve_model

#: Help that says more than the registry's, for ``--help``.
_HELP = {
    "max-num-batched-tokens": "token budget of one engine step (vLLM default by GPU: 8192 on "
                              ">=70 GiB non-A100, else 2048); 8k = 8000, 8K = 8192",
    "max-model-len": "context length (default: the model's)",
    "enable-prefix-caching": "not modeled: the simulator refuses --enable-prefix-caching and "
                             "runs with it off",
}


def add_engine_args(p: argparse.ArgumentParser, model_positional: bool = False) -> None:
    """The ``vllm serve`` options the simulator takes, from :mod:`chunktune.core.flags`, and
    the simulator's own (``--gpu``, ``--model-config``)."""
    g = p.add_argument_group("engine (vllm serve flags)")
    if model_positional:
        g.add_argument("model_tag", nargs="?", metavar="MODEL",
                       help="model, as `vllm serve MODEL` takes it")
    g.add_argument("--model", help=f"catalog name or HF repo id ({', '.join(catalog_names())})")
    flags.add_argparse(g, "sim", help_for=_HELP)
    s = p.add_argument_group("simulator only")
    s.add_argument("--gpu", default="h100-sxm", help=f"GPU type ({', '.join(gpu_names())})")
    s.add_argument("--model-config", help="a Hugging Face config.json for a model not in the "
                                          "catalog")


def engine_args_from(ns: argparse.Namespace) -> EngineArgs:
    """The engine arguments set on a namespace of :func:`add_engine_args`."""
    return EngineArgs.from_point(flags.given(ns, "sim"))


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
