"""The engine flags a ChunkedPrefillTuning may search, and the default search space.

vLLM has no prefill "chunk size" flag: the chunk a request gets in one step is bounded by the
per-step token budget ``--max-num-batched-tokens`` and the per-request cap
``--long-prefill-token-threshold`` (``shared/reference/vllm-facts.md`` §0). SGLang's
``--chunked-prefill-size`` is listed for SGLang manifests only.

The default search space (used when ``spec.searchSpace`` is omitted), for vLLM and the
simulator:

=============================== ====================================================
``max-num-batched-tokens``      int 512..16384, step 512 (the step token budget)
``long-prefill-token-threshold`` choices 0 (no cap), 256, 512, 1024, 2048, 4096
``max-num-seqs``                choices 64, 128, 256, 512
=============================== ====================================================

Every combination satisfies vLLM's start-up rule ``max_num_batched_tokens >= max_num_seqs``.
For SGLang: ``chunked-prefill-size`` choices 1024, 2048, 4096, 8192, 16384.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

FlagName = Literal[
    "max-num-batched-tokens",
    "long-prefill-token-threshold",
    "max-num-seqs",
    "gpu-memory-utilization",
    "max-model-len",
    "chunked-prefill-size",
]

VLLM_ENGINES = ("vllm", "sim")


@dataclass(frozen=True)
class Flag:
    """A tunable engine flag: its value type and the values the engine accepts."""

    name: str
    kind: Literal["int", "float"]
    engines: tuple[str, ...]
    minimum: float
    maximum: float | None
    description: str
    minimum_exclusive: bool = False
    forbidden: tuple[float, ...] = ()
    """Values inside the range that the engine still rejects."""

    def check_value(self, v: float) -> str | None:
        """Why the engine would reject ``v``, or ``None``."""
        if self.kind == "int" and (isinstance(v, float) and not v.is_integer()):
            return f"must be an integer for --{self.name} (got {v!r})"
        low_bad = v <= self.minimum if self.minimum_exclusive else v < self.minimum
        if low_bad or (self.maximum is not None and v > self.maximum) or v in self.forbidden:
            return f"is not a valid --{self.name} value ({self.range_text()}; got {v:g})"
        return None

    def range_text(self) -> str:
        op = ">" if self.minimum_exclusive else ">="
        text = f"must be {op} {self.minimum:g}"
        if self.maximum is not None:
            text += f" and <= {self.maximum:g}"
        if self.forbidden:
            text += ", not " + ", ".join(f"{x:g}" for x in self.forbidden)
        return text


#: The largest token count a flag may take: 2**24 (16.8M), above the longest context any model
#: ships (10M tokens); a larger value is a typo, not a setting.
MAX_TOKENS = 2**24
#: The largest ``--max-num-seqs``: 2**16 running requests.
MAX_SEQS = 2**16

FLAGS: dict[str, Flag] = {
    f.name: f
    for f in (
        Flag("max-num-batched-tokens", "int", VLLM_ENGINES, 1, MAX_TOKENS,
             "token budget of one engine step, shared by decodes and prefill chunks"),
        Flag("long-prefill-token-threshold", "int", VLLM_ENGINES, 0, MAX_TOKENS,
             "most prompt tokens one request may take in a step; 0 = no cap"),
        Flag("max-num-seqs", "int", VLLM_ENGINES, 1, MAX_SEQS, "most running requests"),
        Flag("gpu-memory-utilization", "float", VLLM_ENGINES, 0, 1,
             "fraction of GPU memory the engine may use", minimum_exclusive=True),
        Flag("max-model-len", "int", VLLM_ENGINES, 1, MAX_TOKENS, "longest prompt + output"),
        Flag("chunked-prefill-size", "int", ("sglang",), -1, MAX_TOKENS,
             "SGLang's prefill chunk size; -1 disables chunking", forbidden=(0,)),
    )
}

#: The default search space per engine kind, as manifest mappings (see the module docstring).
DEFAULT_SEARCH_SPACE: dict[str, list[dict[str, Any]]] = {
    "vllm": [
        {"name": "max-num-batched-tokens", "type": "int", "low": 512, "high": 16384,
         "step": 512},
        {"name": "long-prefill-token-threshold", "choices": [0, 256, 512, 1024, 2048, 4096]},
        {"name": "max-num-seqs", "choices": [64, 128, 256, 512]},
    ],
    "sglang": [
        {"name": "chunked-prefill-size", "choices": [1024, 2048, 4096, 8192, 16384]},
    ],
}
DEFAULT_SEARCH_SPACE["sim"] = DEFAULT_SEARCH_SPACE["vllm"]

#: Flags the manifest sets through its own fields; they may not appear in ``engine.args``.
MANAGED_FLAGS: dict[str, str] = {
    "model": "spec.engine.model",
    "port": "spec.engine.port",
    "tensor-parallel-size": "spec.engine.tensorParallelSize",
    "served-model-name": "spec.engine.servedModelName",
}


def format_value(v: Any) -> str:
    """A flag value as it is written on a command line (``4096``, ``0.92``)."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**53:
        return str(int(v))
    if isinstance(v, float):
        return repr(round(v, 6))
    return str(v)


def format_flags(params: Mapping[str, Any]) -> list[str]:
    """``{"max-num-seqs": 256}`` -> ``["--max-num-seqs", "256"]``, in the mapping's order."""
    out: list[str] = []
    for name, v in params.items():
        out += [f"--{name}", format_value(v)]
    return out


def flags_line(params: Mapping[str, Any]) -> str:
    """The flags to paste into a ``vllm serve`` command line."""
    return " ".join(format_flags(params))


def args_flags(args: Sequence[str]) -> list[tuple[int, str]]:
    """The flags named in an argument list, as ``(index, name without dashes)``; handles
    ``--flag value``, ``--flag=value`` and ``--no-flag``."""
    out: list[tuple[int, str]] = []
    for i, a in enumerate(args):
        if a.startswith("--") and len(a) > 2:
            out.append((i, a[2:].split("=", 1)[0]))
        elif a.startswith("-") and len(a) > 1 and not _is_number(a):
            out.append((i, a[1:].split("=", 1)[0]))
    return out


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def sim_engine_kwargs(args: Sequence[str], ignore: Sequence[str] = ()) -> dict[str, Any]:
    """``engine.args`` as :class:`chunktune.sim.config.EngineArgs` keyword arguments, for the
    simulated engine; flags named in ``ignore`` are skipped with their values. Raises
    :class:`SpecError` with paths ``spec.engine.args[i]`` for a flag the simulator does not model
    or a value of the wrong type."""
    from dataclasses import fields

    from chunktune.errors import SpecError
    from chunktune.sim.config import EngineArgs

    types = {f.name: str(f.type) for f in fields(EngineArgs)}
    problems: list[tuple[str, str]] = []
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        a, where = args[i], f"spec.engine.args[{i}]"
        i += 1
        if not a.startswith("--"):
            problems.append((where, f"expected a --flag (got {a!r})"))
            continue
        name, eq, value = a[2:].partition("=")
        field = name.replace("-", "_")
        negated = field.startswith("no_") and "bool" in types.get(field[3:], "")
        if negated:
            field = field[3:]
        if field not in types or name in ignore:
            if name not in ignore:
                known = ", ".join(sorted("--" + f.replace("_", "-") for f in types))
                problems.append((where, f"the simulator does not model --{name}; it takes "
                                 f"{known}"))
            if not eq and i < len(args) and not args[i].startswith("--"):
                i += 1  # its value
            continue
        kind = types[field]
        if "bool" in kind:
            if eq:
                problems.append((where, f"--{name} takes no value (use --{name} or --no-{name})"))
            out[field] = not negated
            continue
        if not eq:
            if i >= len(args) or args[i].startswith("--"):
                problems.append((where, f"--{name} needs a value"))
                continue
            value = args[i]
            i += 1
        try:
            out[field] = int(value) if "int" in kind else float(value) if "float" in kind \
                else value
        except ValueError:
            what = "an integer" if "int" in kind else "a number"
            problems.append((where, f"--{name} takes {what} (got {value!r})"))
    if problems:
        raise SpecError(problems)
    return out
