"""``vllm serve``-style argument parsing shared by ``chunktune sim run`` and ``sim serve``.

The engine flags, their spellings, parsers and help come from the registry
(:mod:`chunktune.core.flags`): vLLM's spellings (``--max-num-batched-tokens``; vLLM's
``--max_num_batched_tokens`` underscore form works too), vLLM's value parsers (``8k`` = 8000 and
``8K`` = 8192 where vLLM takes them), so one argument list serves a vLLM pod and a simulated
one. Flags only the simulator has (``--gpu``, ``--model-config``, ``--load-time``) sit in their
own group. A vLLM flag the simulator does not model is accepted with one warning; a near-miss of
a modeled flag is an error with the suggestion, since a typo would otherwise silently tune
nothing. A flag the supported vLLM (:data:`~chunktune.core.vllm_release.VLLM_VERSION`)
itself does not know (:data:`VLLM_FLAGS_FILE`, every option string of its API server's
parser) is refused as vLLM refuses it: ``error: unrecognized arguments: ...``, exit status 2 — so
``--max-num-partial-prefills`` and ``--max-long-partial-prefills``, which that release removed,
fail exactly as on a real engine.
"""

from __future__ import annotations

import argparse
import difflib
import functools
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from chunktune.core import flags
from chunktune.core.engine_args import EngineArgs
from chunktune.core.errors import Problems, SpecError
from chunktune.core.gpus import GPU, gpu_names, resolve_gpu, with_peer_to_peer
from chunktune.core.models import ModelConfig, catalog_names, resolve_model
from chunktune.core.vllm_release import VLLM_VERSION

#: The option strings of the supported vLLM's API server (package data of ``chunktune.sim``).
VLLM_FLAGS_FILE = f"data/vllm_{VLLM_VERSION.replace('.', '_')}_flags.txt"
#: Help that says more than the registry's, for ``--help``.
_HELP = {
    "max-num-batched-tokens": "token budget of one engine step (vLLM default by GPU: 8192 on "
                              ">=70 GiB non-A100, else 2048); 8k = 8000, 8K = 8192",
    "max-model-len": "context length (default: the model's)",
    "enable-prefix-caching": "model vLLM's prefix cache (vLLM's default is on; the "
                             "simulator's off unless given)",
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
    # Registry flags the supported vLLM no longer has (--max-num-partial-prefills, ...) are not
    # options here: they reach split_unknown and are refused as that vLLM refuses them (exit 2).
    # Those a newer release brought (Flag.since) are: resolve() refuses them for an older one.
    for action in list(g._group_actions):
        if action.option_strings and not set(action.option_strings) & vllm_flags() \
                and not any((f := flags.lookup(o)[0]) is not None and f.since
                            for o in action.option_strings):
            g._group_actions.remove(action)
            p._remove_action(action)
            for o in action.option_strings:
                p._option_string_actions.pop(o, None)
    s = p.add_argument_group("simulator only")
    s.add_argument("--gpu", default="h100-sxm", help=f"GPU type ({', '.join(gpu_names())})")
    s.add_argument("--gpu-peer-to-peer", action=argparse.BooleanOptionalAction, default=None,
                   help="whether the node's PCIe GPUs reach each other peer to peer "
                        "(nvidia-smi topo -p2p r): vLLM's all-reduce over PCIe depends on it "
                        "(default: not stated)")
    s.add_argument("--model-config", help="a Hugging Face config.json for a model not in the "
                                          "catalog")


def engine_args_from(ns: argparse.Namespace) -> EngineArgs:
    """The engine arguments set on a namespace of :func:`add_engine_args`."""
    return EngineArgs.from_point(flags.given(ns, "sim"))


def model_and_gpu(ns: argparse.Namespace) -> tuple[ModelConfig, GPU]:
    """The model (a catalog name, or — as vLLM takes it — a model directory holding a
    ``config.json``, or ``--model-config PATH``) and the GPU."""
    name = getattr(ns, "model", None) or getattr(ns, "model_tag", None)
    config_path = ns.model_config
    if config_path is None and name and Path(name).is_dir():
        config_path = Path(name) / "config.json"
        if not config_path.is_file():
            raise SpecError(f"model directory {name!r} has no config.json", field="MODEL")
        name = Path(name).resolve().name
    problems = Problems()
    model = problems.attempt(resolve_model, name, config_path)
    gpu = problems.attempt(resolve_gpu, ns.gpu)
    if gpu is not None:
        gpu = problems.attempt(with_peer_to_peer, gpu, getattr(ns, "gpu_peer_to_peer", None),
                               "--gpu-peer-to-peer")
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


@functools.cache
def vllm_flags() -> frozenset[str]:
    """Every option string the supported vLLM's API server accepts (:data:`VLLM_FLAGS_FILE`)."""
    text = resources.files("chunktune.sim").joinpath(VLLM_FLAGS_FILE).read_text()
    return frozenset(line.strip() for line in text.splitlines()
                     if line.strip() and not line.startswith("#"))


def unrecognized_by_vllm(args: Sequence[str]) -> list[str]:
    """The arguments the supported vLLM would answer ``unrecognized arguments`` to: each flag
    it does not know (underscore spellings normalised, as vLLM's parser does), with the values
    after it."""
    known = vllm_flags()
    out: list[str] = []
    taking_values = False
    for a in normalize_argv(args):
        if a.startswith("-") and not flags.is_number(a):
            taking_values = a.split("=", 1)[0] not in known
            if taking_values:
                out.append(a)
        elif taking_values:
            out.append(a)
    return out


def unrecognized_message(prog: str, args: Sequence[str]) -> str:
    """argparse's (and so vLLM's) line for arguments it does not know."""
    return f"{prog}: error: unrecognized arguments: {' '.join(args)}"


def split_unknown(parser: argparse.ArgumentParser,
                  unknown: list[str]) -> tuple[list[str], list[str]]:
    """Sort leftover arguments into (ignored vLLM flags, errors). Errors: a near-miss of one of
    our flags (with the suggestion), then, as vLLM words it, the flags the supported vLLM does
    not know either (``unrecognized arguments: ...``)."""
    known = [s for a in parser._actions for s in a.option_strings]
    ignored, errors = [], []
    refused = unrecognized_by_vllm(unknown)
    for a in normalize_argv(unknown):
        if not a.startswith("-") or flags.is_number(a):
            continue  # a value of an ignored flag
        name = a.split("=", 1)[0]
        if name in vllm_flags():
            ignored.append(name)  # a real vLLM flag, even if it looks like one of ours
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.88)
        if close:
            errors.append(f"unknown flag {name}; did you mean {close[0]}?")
    if refused:
        errors.append(f"unrecognized arguments: {' '.join(refused)}")
    return ignored, errors
