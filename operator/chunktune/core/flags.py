"""The one registry of engine flags: spelling, type, parser, formatter, engines, bounds, default.

Every other representation of an engine flag is derived from :data:`FLAGS`: the CRD's enum of
searchable flags (:data:`TUNABLE`), the argparse options of ``chunktune sim run`` and
``sim serve`` (:func:`add_argparse`), the manifest's ``engine.args`` check
(:func:`parse_argv`), the search-space mapping onto the simulator's engine arguments
(:attr:`Flag.attr`), the flags line shown everywhere (:func:`flags_line`) and the argv given to
an engine process or pod (:func:`argv`). A *point* is a mapping ``{flag name: value}`` with the
name as vLLM spells it without dashes (``max-num-batched-tokens``); strings appear only where a
point crosses a process boundary.

Parsers accept what the supported vLLM's ``vllm serve`` accepts
(:data:`~chunktune.core.vllm_release.VLLM_VERSION`; ``vllm/engine/arg_utils.py``,
``vllm/utils/argparse_utils.py``): ``--max-num-batched-tokens`` and ``--kv-cache-memory-bytes``
take vLLM's human-readable integers (``8k`` = 8000, ``8K`` = 8192, ``25.6k`` = 25600),
``--max-model-len`` also ``auto`` / ``-1``, the other integer flags plain integers only; boolean
flags take no value (``--enable-chunked-prefill`` / ``--no-enable-chunked-prefill``). Bounds
are those of vLLM's config classes (``SchedulerConfig``, ``CacheConfig``, ``ParallelConfig``).

vLLM's per-GPU defaults (``EngineArgs.get_batch_defaults`` and
``_set_default_max_num_seqs_and_batched_tokens_args``) live in :func:`batch_defaults` and
:func:`engine_defaults`, nowhere else. Adding a tunable knob is one :class:`Flag` entry here
(plus, if the simulator takes it, its semantics in :mod:`chunktune.core.engine_args` and the
simulator); the ``tests/core/test_flags.py`` round trip then covers it.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from chunktune.core import vllm_release
from chunktune.core.errors import ChunktuneError
from chunktune.core.gpus import GPU

Engine = Literal["vllm", "sim", "sglang"]
Kind = Literal["int", "float", "bool", "str"]
DefaultRule = Literal["static", "batch_budget", "batch_seqs", "model_len", "sglang_chunk",
                      "memory_fraction"]

VLLM_ENGINES: tuple[Engine, ...] = ("vllm", "sim")


class FlagValueError(ChunktuneError, ValueError):
    """A flag's value that its engine would refuse; the message names the flag and the fix."""


# ---- parsers (what vLLM's argparse types accept) ----------------------------------------------

_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_HUMAN = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")


def human_readable_int(text: str) -> int:
    """vLLM's human-readable integer: ``8k`` = 8000, ``8K`` = 8192, ``25.6k`` = 25600 (a
    decimal suffix allows a fraction and truncates; a binary one does not), otherwise Python's
    ``int``. Raises :class:`ValueError`."""
    text = text.strip()
    m = _HUMAN.fullmatch(text)
    if m is None:
        return int(text)
    number, suffix = m.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    if "." in number:
        raise ValueError(f"decimals are not allowed with binary suffixes like {suffix}; did you "
                         f"mean {number}{suffix.lower()}?")
    return int(number) * _BINARY[suffix]


def human_readable_int_or_auto(text: str) -> int:
    """:func:`human_readable_int`, plus ``auto`` (any case) or ``-1``, both giving -1."""
    stripped = text.strip()
    if stripped == "-1" or stripped.lower() == "auto":
        return -1
    return human_readable_int(stripped)


def _json_object(text: str) -> str:
    """A JSON object's text, kept as given (vLLM's ``json.loads`` argparse type reads it)."""
    if not isinstance(json.loads(text), dict):
        raise ValueError("not a JSON object")
    return text


def _no_value(text: str) -> Any:  # pragma: no cover - boolean flags never reach a parser
    raise ValueError("takes no value")


# ---- the flag ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Flag:
    """One engine flag. ``name`` is vLLM's spelling without the dashes."""

    name: str
    kind: Kind
    engines: tuple[Engine, ...]
    help: str
    parser: Callable[[str], Any] = _no_value
    """Text -> value, as the engine's own argparse type does (raises ValueError)."""
    accepts: str = ""
    """What the parser accepts, for error messages (``an integer such as 2048, 8k or 8K``)."""
    minimum: float | None = None
    maximum: float | None = None
    minimum_exclusive: bool = False
    choices: tuple[Any, ...] = ()
    forbidden: tuple[Any, ...] = ()
    """Values inside the bounds that the engine still refuses."""
    special: tuple[Any, ...] = ()
    """Values outside the bounds that the engine takes with a meaning of their own."""
    default: Any = None
    """The static default (``default_rule == "static"``); None: the engine derives it."""
    default_rule: DefaultRule = "static"
    """How the default is derived: see :func:`engine_defaults`."""
    tunable: bool = False
    """Whether ``spec.searchSpace`` may search it (the CRD's enum)."""
    aliases: tuple[str, ...] = ()
    """Other spellings the engine accepts, with their dashes (``-tp``)."""
    since: vllm_release.Version | None = None
    """The vLLM release that brought the flag, where newer than the supported one: the
    simulator takes it, and refuses it for a study naming an older release."""
    within: str = ""
    """The JSON flag this one is a key of (``num-speculative-tokens`` is the
    ``num_speculative_tokens`` of ``--speculative-config``): no command-line spelling of its
    own; :func:`argv` writes it into that flag's object (:func:`fold`)."""

    @property
    def attr(self) -> str:
        """The attribute name (``max_num_batched_tokens``), as in vLLM's ``EngineArgs``."""
        return self.name.replace("-", "_")

    @property
    def option(self) -> str:
        return "--" + self.name

    @property
    def spellings(self) -> tuple[str, ...]:
        """Every spelling the engine accepts on a command line (``--no-`` forms aside)."""
        if self.within:
            return ()
        under = "--" + self.attr
        return (self.option, *((under,) if under != self.option else ()), *self.aliases)

    # -- text -> value --

    def read(self, text: str) -> Any:
        """The value ``--flag TEXT`` gives, as the engine's argparse type reads it (bounds are
        checked later, as vLLM's config classes do). Raises :class:`FlagValueError` naming
        the flag."""
        if self.kind == "bool":
            raise FlagValueError(f"{self.option} takes no value (use {self.option} or "
                                 f"--no-{self.name})")
        try:
            return self.parser(text)
        except ValueError as e:
            plain = "invalid literal" in str(e) or "could not convert" in str(e)
            detail = "" if plain else f": {e}"
            raise FlagValueError(f"{self.option} takes {self.accepts} (got {text!r}){detail}") \
                from e

    def parse(self, text: str) -> Any:
        """:meth:`read`, then the bounds: the value the engine runs with, or
        :class:`FlagValueError`."""
        return self.coerce(self.read(text))

    # -- a point's value (from JSON, Optuna, a dataclass) -> value --

    def coerce(self, value: Any) -> Any:
        """``value`` as this flag's type: an integral float becomes an int for an int flag
        (JSON and Optuna give ``4096.0``). Raises :class:`FlagValueError` for a value of the
        wrong type or out of bounds."""
        why = self.why(value)
        if why is not None:
            raise FlagValueError(f"{self.option} {why}")
        if self.kind == "int":
            return int(value)
        if self.kind == "float":
            return float(value)
        return value

    def why(self, value: Any) -> str | None:
        """Why the engine refuses ``value`` given as data (wrong type, out of bounds), without
        the flag's name (``must be >= 1 (got 0)``), or None."""
        if self.kind == "bool":
            return None if isinstance(value, bool) else \
                f"is a switch: give true or false (got {value!r})"
        if self.kind == "str":
            if not isinstance(value, str):
                return f"takes a string (got {value!r})"
        elif isinstance(value, bool) or not isinstance(value, int | float):
            return f"takes {self.accepts} (got {value!r})"
        elif self.kind == "int" and isinstance(value, float) and not value.is_integer():
            return f"takes an integer (got {value!r})"
        problem = self.problem(value)
        return None if problem is None else f"{problem} (got {self.text(value)})"

    def problem(self, value: Any) -> str | None:
        """Why the engine refuses ``value`` (of the flag's type) by its bounds, or None."""
        if value in self.special:
            return None
        if self.choices and value not in self.choices:
            return f"must be one of {', '.join(self.text(c) for c in self.choices)}"
        if self.kind in ("int", "float"):
            v = float(value)
            low = self.minimum
            if math.isnan(v) or (low is not None and (v <= low if self.minimum_exclusive
                                                      else v < low)) \
                    or (self.maximum is not None and v > self.maximum) or value in self.forbidden:
                return f"must be {self.range_text()}"
        return None

    def absent_from(self, version: vllm_release.Version) -> str | None:
        """Why vLLM ``version`` refuses the flag, newer than it (:attr:`since`), with the fix;
        None where it has the flag."""
        if self.since is None or version >= self.since:
            return None
        since = f"{self.since[0]}.{self.since[1]}"
        return (f"vLLM {version[0]}.{version[1]} has no {self.option} (since {since}); drop "
                f"it or name vLLM {since} or later")

    def range_text(self) -> str:
        """``>= 1``, ``> 0 and <= 1``, ``>= -1, not 0``."""
        def num(v: float) -> str:
            return str(int(v)) if float(v).is_integer() else f"{v:g}"

        parts = []
        if self.minimum is not None:
            parts.append(f"{'>' if self.minimum_exclusive else '>='} {num(self.minimum)}")
        if self.maximum is not None:
            parts.append(f"<= {num(self.maximum)}")
        text = " and ".join(parts) or "a number"
        if self.forbidden:
            text += ", not " + ", ".join(self.text(x) for x in self.forbidden)
        if self.special:
            text += " (or " + ", ".join(self.text(x) for x in self.special) + ")"
        return text

    # -- value -> text --

    def text(self, value: Any) -> str:
        """The value as one command-line token (``4096``, ``0.92``, ``fcfs``). An int flag's
        integral float prints as an int; a float prints the shortest text that parses back
        to the same float."""
        if self.kind == "bool":
            return "true" if value else "false"
        if self.kind == "int" and isinstance(value, float) and value.is_integer():
            return str(int(value))
        if self.kind == "float" and isinstance(value, int | float) \
                and not isinstance(value, bool):
            return repr(float(value))
        return str(value)

    def format(self, value: Any) -> list[str]:
        """``--flag VALUE`` as argv tokens; a switch is ``--flag`` or ``--no-flag``."""
        if self.kind == "bool":
            return [self.option if value else f"--no-{self.name}"]
        return [self.option, self.text(value)]


# ---- the registry ------------------------------------------------------------------------------

#: The largest token count a flag may take: 2**24 (16.8M), above the longest context any model
#: ships (10M tokens); a larger value is a typo, not a setting.
MAX_TOKENS = 2**24
#: The largest ``--max-num-seqs``: 2**16 running requests.
MAX_SEQS = 2**16

_HUMAN_INT = "an integer such as 2048, 8k (8000) or 8K (8192)"
#: ``--quantization``'s choices in vLLM 0.32 (``vllm/model_executor/layers/quantization``
#: ``QuantizationMethods``, with the online shorthands of ``vllm/config/quantization.py``).
VLLM_QUANTIZATION_METHODS = (
    "awq", "auto_awq", "fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4",
    "modelopt_mxfp8", "modelopt_mixed", "auto_gptq", "gptq", "gptq_marlin", "awq_marlin",
    "humming", "compressed-tensors", "experts_int8", "quark", "moe_wna16", "torchao", "inc",
    "mxfp4", "gpt_oss_mxfp4", "deepseek_v4_fp8", "online", "fp8_per_tensor", "fp8_per_block",
    "fp8_per_channel", "int8_per_channel_weight_only", "nvfp4_per_token", "mxfp8")
_INT = "an integer"

_ENTRIES: tuple[Flag, ...] = (
    Flag("max-num-batched-tokens", "int", VLLM_ENGINES,
         "token budget of one engine step, shared by decodes and prefill chunks",
         human_readable_int, _HUMAN_INT, minimum=1, maximum=MAX_TOKENS,
         default_rule="batch_budget", tunable=True),
    Flag("long-prefill-token-threshold", "int", VLLM_ENGINES,
         "most prompt tokens one request may take in a step; 0 = no cap",
         int, _INT, minimum=0, maximum=MAX_TOKENS, default=0, tunable=True),
    # vLLM's SchedulerConfig; what each release does with them: core.vllm_release.SCHEDULERS
    Flag("long-prefill-token-threshold-adaptive", "bool", VLLM_ENGINES,
         "floor the long-prefill threshold at the token budget / requests in the system",
         default=False, tunable=True, since=(0, 31, 0)),
    Flag("scheduler-reserve-full-isl", "bool", VLLM_ENGINES,
         "admit a waiting prompt only when its whole sequence fits the KV cache (vLLM 0.19+, "
         "on by default); off: when its first chunk does, as before 0.19, and its later "
         "chunks preempt the requests decoding beside it",
         default=True, tunable=True, since=(0, 19, 0)),
    Flag("prefill-schedule-interval", "int", VLLM_ENGINES,
         "hold prefill until N steps have passed since the last step that carried prefill, "
         "so decodes run alone in between (without data parallelism since vLLM 0.33)",
         int, _INT, minimum=1, maximum=MAX_SEQS, default=1, tunable=True, since=(0, 24, 0)),
    Flag("cache-aware-admission-window", "int", VLLM_ENGINES,
         "within the first N waiting requests admit those with a cached prefix first, once "
         "KV usage reaches the threshold (vLLM 0.34; fcfs with prefix caching); 0 = off",
         int, _INT, minimum=0, maximum=MAX_SEQS, default=0, since=(0, 34, 0)),
    Flag("cache-aware-admission-threshold", "float", VLLM_ENGINES,
         "KV-cache usage from which --cache-aware-admission-window applies (vLLM 0.34)",
         float, "a fraction such as 0.5", minimum=0, maximum=1, default=0.5,
         since=(0, 34, 0)),
    Flag("max-num-seqs", "int", VLLM_ENGINES, "most running requests",
         int, _INT, minimum=1, maximum=MAX_SEQS, default_rule="batch_seqs", tunable=True),
    Flag("gpu-memory-utilization", "float", VLLM_ENGINES,
         "fraction of GPU memory the engine may use",
         float, "a fraction such as 0.9", minimum=0, maximum=1, minimum_exclusive=True,
         default_rule="memory_fraction", tunable=True,  # 0.92 since v0.21, 0.9 before
         aliases=("--device-memory-utilization",)),
    Flag("max-model-len", "int", VLLM_ENGINES,
         "longest prompt + output (default: the model's; auto or -1: what fits in memory)",
         human_readable_int_or_auto, "an integer such as 32768, 32k or 32K, or auto",
         minimum=1, maximum=MAX_TOKENS, special=(-1,), default_rule="model_len", tunable=True),
    Flag("chunked-prefill-size", "int", ("sglang",),
         "SGLang's prefill chunk size; -1 disables chunking",
         int, _INT, minimum=-1, maximum=MAX_TOKENS, forbidden=(0,), default_rule="sglang_chunk",
         tunable=True),
    Flag("enable-chunked-prefill", "bool", VLLM_ENGINES, "chunked prefill (default on)",
         default=True),
    Flag("block-size", "int", VLLM_ENGINES, "KV-cache block size in tokens",
         int, _INT, choices=(1, 8, 16, 32, 64, 128, 256), default=16),
    Flag("tensor-parallel-size", "int", VLLM_ENGINES, "tensor-parallel degree",
         int, _INT, minimum=1, default=1, aliases=("-tp",)),
    Flag("max-num-partial-prefills", "int", VLLM_ENGINES,
         "concurrent partial prefills (V0 only; V1 refuses values other than 1)",
         int, _INT, minimum=1, default=1),
    Flag("max-long-partial-prefills", "int", VLLM_ENGINES,
         "concurrent long partial prefills (V0 only; V1 refuses values other than 1)",
         int, _INT, minimum=1, default=1),
    Flag("kv-cache-dtype", "str", VLLM_ENGINES, "KV-cache data type",
         str, "a data type name",
         choices=("auto", "bfloat16", "float16", "fp8", "fp8_ds_mla", "fp8_e4m3", "fp8_e5m2",
                  "fp8_inc", "fp8_per_token_head", "int4_per_token_head",
                  "int8_per_token_head", "nvfp4", "nvfp4_4over6", "nvfp4_ds_mla",
                  "turboquant_3bit_nc", "turboquant_4bit_nc", "turboquant_k3v4_nc",
                  "turboquant_k8v4", "ultraquant_4bit"),
         default="auto"),
    Flag("quantization", "str", VLLM_ENGINES,
         "how the linear layers' weights are quantized (default: as the checkpoint says; fp8: "
         "FP8 weights, quantized online from a bf16 checkpoint)",
         str, "a quantization method", choices=VLLM_QUANTIZATION_METHODS, aliases=("-q",)),
    Flag("kv-cache-memory-bytes", "int", VLLM_ENGINES,
         "KV-cache size in bytes (overrides --gpu-memory-utilization)",
         human_readable_int, "a byte count such as 8G or 8589934592", minimum=1),
    Flag("num-gpu-blocks-override", "int", VLLM_ENGINES, "force the KV block count",
         int, _INT, minimum=1),
    Flag("scheduling-policy", "str", VLLM_ENGINES,
         "fcfs (arrival order) or priority (the request's priority, then arrival)",
         str, "fcfs or priority", choices=("fcfs", "priority"), default="fcfs"),
    Flag("enable-prefix-caching", "bool", VLLM_ENGINES,
         "reuse KV blocks of shared prompt prefixes (vLLM: on by default)", default=True),
    Flag("async-scheduling", "bool", VLLM_ENGINES,
         "prepare the next step on the host while the GPU runs this one (vLLM: on by default "
         "since 0.14)", tunable=True),
    Flag("enforce-eager", "bool", VLLM_ENGINES,
         "no CUDA graphs: no graph memory, more launch overhead per step", default=False),
    Flag("max-cudagraph-capture-size", "int", VLLM_ENGINES, "largest CUDA-graph batch",
         int, _INT, minimum=1),
    Flag("max-num-queued-reqs", "int", VLLM_ENGINES,
         "most requests in the system (waiting + running); more are answered HTTP 503",
         int, _INT, minimum=0),
    Flag("speculative-config", "str", VLLM_ENGINES,
         "speculative decoding, as a JSON object: method (ngram, eagle, eagle3, mtp, "
         "draft_model), num_speculative_tokens, model",
         _json_object, "a JSON object such as '{\"method\": \"ngram\", "
         "\"num_speculative_tokens\": 4}'"),
    Flag("num-speculative-tokens", "int", VLLM_ENGINES,
         "draft tokens per decode (the num_speculative_tokens of --speculative-config; "
         "0: no speculative decoding)",
         int, _INT, minimum=0, maximum=64, tunable=True, within="speculative-config"),
    Flag("enable-expert-parallel", "bool", VLLM_ENGINES,
         "split a mixture-of-experts model's experts whole across the ranks (expert "
         "parallelism) instead of sharding every expert", default=False),
    Flag("data-parallel-size", "int", VLLM_ENGINES,
         "data-parallel ranks: each a copy of the model's attention (tensor-parallel within "
         "the rank) with its own scheduler and KV cache; an MoE model's experts split over "
         "all the ranks with --enable-expert-parallel, the ranks stepping together",
         int, _INT, minimum=1, default=1, aliases=("-dp",)),
    Flag("enable-logging-iteration-details", "bool", VLLM_ENGINES,
         "log one Iteration(N) line per engine step (the step log chunktune keeps of every "
         "trial); changes nothing else", default=False),
)

#: Every engine flag, by name.
FLAGS: dict[str, Flag] = {f.name: f for f in _ENTRIES}
#: The same, by attribute name.
BY_ATTR: dict[str, Flag] = {f.attr: f for f in _ENTRIES}
#: The flags ``spec.searchSpace`` may search, in registry order (the CRD's enum).
TUNABLE: tuple[str, ...] = tuple(f.name for f in _ENTRIES if f.tunable)

_SPELLING: dict[str, Flag] = {s: f for f in _ENTRIES for s in f.spellings}


def for_engine(engine: str) -> list[Flag]:
    """The flags an engine kind (``vllm``, ``sim``, ``sglang``) takes, in registry order."""
    return [f for f in _ENTRIES if engine in f.engines]


def lookup(spelling: str) -> tuple[Flag | None, bool]:
    """The flag a command-line spelling names (``--max-num-seqs``, ``--max_num_seqs``,
    ``-tp``, ``--no-enable-chunked-prefill``) and whether it is the ``--no-`` form."""
    if spelling in _SPELLING:
        return _SPELLING[spelling], False
    for prefix in ("--no-", "--no_"):
        if spelling.startswith(prefix):
            f = _SPELLING.get("--" + spelling[len(prefix):])
            if f is not None and f.kind == "bool":
                return f, True
    return None, False


# ---- point <-> argv ----------------------------------------------------------------------------


def coerce_point(point: Mapping[str, Any]) -> dict[str, Any]:
    """A point with every value of its flag's type (``{"max-num-seqs": 256.0}`` ->
    ``{"max-num-seqs": 256}``). Raises :class:`FlagValueError` for an unknown flag or a bad
    value."""
    out: dict[str, Any] = {}
    for name, value in point.items():
        if name not in FLAGS:
            raise FlagValueError(f"unknown engine flag {name!r}")
        out[name] = FLAGS[name].coerce(value)
    return out


def argv(point: Mapping[str, Any], base: Sequence[str] = ()) -> list[str]:
    """A point as command-line tokens after ``base`` (an engine's fixed args), in the point's
    order: ``{"max-num-seqs": 256}`` -> ``["--max-num-seqs", "256"]``. A flag that is a key of
    a JSON flag (:attr:`Flag.within`) is written into that flag's object (:func:`fold`)."""
    out: list[str] = list(base)
    inner: dict[str, Any] = {}
    for name, value in coerce_point(point).items():
        if FLAGS[name].within:
            inner[name] = value
        else:
            out += FLAGS[name].format(value)
    return fold(out, inner)


def fold(args: Sequence[str], inner: Mapping[str, Any]) -> list[str]:
    """``args`` with each key-flag of ``inner`` (:attr:`Flag.within`) set inside its JSON flag's
    object (the last one given); ``num-speculative-tokens`` 0 drops ``--speculative-config``
    (no speculative decoding). Where the JSON flag is not given, the key goes into an object
    of its own (``--speculative-config '{"num_speculative_tokens":4}'``: the value to merge
    into the engine's own object, as a flags line shows a point alone)."""
    out = list(args)
    for name, value in inner.items():
        parent = FLAGS[FLAGS[name].within]
        at = max((i for i, a in enumerate(out)
                  if a.split("=", 1)[0] in parent.spellings), default=None)
        if at is None:
            out += [parent.option, "{}"]
            at = len(out) - 2
        token = out[at]
        text = token.split("=", 1)[1] if "=" in token else out[at + 1]
        width = 1 if "=" in token else 2
        obj = json.loads(text)
        if name == "num-speculative-tokens" and value == 0:
            del out[at:at + width]
            continue
        obj[FLAGS[name].attr] = value
        out[at:at + width] = [parent.option, json.dumps(obj, separators=(",", ":"))]
    return out


def expand(point: Mapping[str, Any], args: Sequence[str]) -> dict[str, Any]:
    """``point`` with each key-flag (:attr:`Flag.within`) turned into its JSON flag's new value:
    the object ``args`` give that flag (``{}`` where none) with the key set; ``None`` where
    ``num-speculative-tokens`` is 0 (the flag is to be dropped)."""
    out: dict[str, Any] = {}
    inner: dict[str, Any] = {}
    for name, value in point.items():
        if FLAGS[name].within:
            inner[name] = value
        else:
            out[name] = value
    if not inner:
        return out
    tokens = fold(list(args), inner)
    for name in inner:
        parent = FLAGS[FLAGS[name].within]
        at = max((i for i, a in enumerate(tokens)
                  if a.split("=", 1)[0] in parent.spellings), default=None)
        out[parent.name] = None if at is None else \
            (tokens[at].split("=", 1)[1] if "=" in tokens[at] else tokens[at + 1])
    return out


def flags_line(point: Mapping[str, Any]) -> str:
    """The flags to paste into a ``vllm serve`` command line — in status, events, the CLI, the
    output ConfigMap and the patched Deployment's annotation."""
    return shlex.join(argv(point))


@dataclass
class ParsedArgs:
    """An argument list read against the registry. Indices are positions in the list."""

    values: dict[str, Any] = field(default_factory=dict)
    """Registry flags given, by name, parsed."""
    index: dict[str, int] = field(default_factory=dict)
    """Where each registry flag was given (its last occurrence)."""
    unknown: list[tuple[int, str]] = field(default_factory=list)
    """Flags not in the registry (or not taken by the engine asked for): (index, spelling)."""
    problems: list[tuple[int, str]] = field(default_factory=list)
    """(index, message) for values of registry flags that the engine would refuse."""
    stray: list[int] = field(default_factory=list)
    """Tokens that are no flag and follow no flag that takes them (an unknown flag may take
    several values, as vLLM's ``--api-key K1 K2`` does)."""


def is_number(text: str) -> bool:
    """Whether a command-line token is a number (``-1`` is a value, not a flag)."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse_argv(args: Sequence[str], engine: str | None = None) -> ParsedArgs:
    """Read ``--flag VALUE``, ``--flag=VALUE``, ``--switch`` / ``--no-switch`` tokens with the
    registry's parsers. A flag the registry lacks (or ``engine`` does not take) is listed in
    ``unknown`` and skipped with its value (the next token, unless it is itself a flag)."""
    out = ParsedArgs()
    i = 0
    while i < len(args):
        token, at = args[i], i
        i += 1
        if not token.startswith("-") or token == "-" or is_number(token):
            out.stray.append(at)
            continue
        spelling, eq, text = token.partition("=")
        flag, negated = lookup(spelling)
        if flag is None or (engine is not None and engine not in flag.engines):
            out.unknown.append((at, spelling))
            if not eq and i < len(args) and (not args[i].startswith("-") or is_number(args[i])):
                i += 1
            continue
        try:
            if flag.kind == "bool":
                if eq:
                    raise FlagValueError(f"{flag.option} takes no value (use {flag.option} or "
                                         f"--no-{flag.name})")
                value: Any = not negated
            else:
                if not eq:
                    if i >= len(args) or (args[i].startswith("-") and not is_number(args[i])):
                        raise FlagValueError(f"{flag.option} needs a value ({flag.accepts})")
                    text = args[i]
                    i += 1
                value = flag.parse(text)
        except FlagValueError as e:
            out.problems.append((at, str(e)))
            continue
        out.values[flag.name] = value
        out.index[flag.name] = at
    return out


# ---- argparse (chunktune sim run / sim serve) --------------------------------------------------


def _argparse_type(flag: Flag) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return flag.read(text)
        except FlagValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from e

    parse.__name__ = flag.attr
    return parse


def add_argparse(group: argparse._ActionsContainer, engine: str = "sim",
                 help_for: Mapping[str, str] | None = None) -> None:
    """Add an option per registry flag ``engine`` takes: ``dest`` is the attribute name,
    ``default`` None (= not given), the type the flag's parser; switches get
    ``--flag`` / ``--no-flag``. ``help_for`` overrides a flag's help."""
    for f in for_engine(engine):
        if f.within:
            continue
        help_ = (help_for or {}).get(f.name, f.help)
        shown = [s for s in f.spellings if s.startswith("--") and "_" not in s]
        hidden = [s for s in f.spellings if s not in shown]
        if f.kind == "bool":
            group.add_argument(*shown, dest=f.attr, action=argparse.BooleanOptionalAction,
                               default=None, help=help_)
            continue
        kwargs: dict[str, Any] = {"dest": f.attr, "default": None,
                                  "type": _argparse_type(f), "help": help_}
        group.add_argument(*shown, **kwargs)
        for s in hidden:
            if s.startswith("-") and not s.startswith("--"):
                group.add_argument(s, **{**kwargs, "help": argparse.SUPPRESS})


def given(ns: argparse.Namespace, engine: str = "sim") -> dict[str, Any]:
    """The registry flags set on an argparse namespace (see :func:`add_argparse`), by name."""
    return {f.name: getattr(ns, f.attr) for f in for_engine(engine)
            if getattr(ns, f.attr, None) is not None}


# ---- defaults ----------------------------------------------------------------------------------

_GIB = 2**30


#: vLLM's CPU build, API server: 2048 tokens and 128 sequences per step
#: (vllm/engine/arg_utils.py, ``EngineArgs.get_batch_defaults``, the supported release).
CPU_BATCH_DEFAULTS = (2048, 128)


def batch_defaults(gpu: GPU | None, cpu: bool = False,
                   version: vllm_release.Version | None = None) -> tuple[int, int]:
    """``vllm serve``'s default (max_num_batched_tokens, max_num_seqs) on a GPU in vLLM
    ``version`` (None: the current one): 16384/1024 with >= 160 GiB (since 0.28), 8192/1024
    with >= 70 GiB unless the name contains "a100" (PR #17885), else 2048/256 — also when the
    GPU is unknown, as vLLM does when it cannot query one (``EngineArgs.get_batch_defaults``,
    API-server usage context; :mod:`chunktune.core.vllm_release`)."""
    if cpu:
        return CPU_BATCH_DEFAULTS
    if gpu is None:
        return 2048, 256
    memory = gpu.memory_gib * _GIB
    if memory >= 160 * _GIB and vllm_release.large_memory_tier(version):
        return 16384, 1024
    if memory >= 70 * _GIB and "a100" not in gpu.device_name.lower():
        return 8192, 1024
    return 2048, 256


def engine_defaults(given: Mapping[str, Any], gpu: GPU | None, model_max_len: int | None,
                    engine: str = "vllm", cpu: bool = False,
                    version: vllm_release.Version | None = None) -> dict[str, Any]:
    """Every flag ``engine`` takes, with the value the engine starts with when ``given`` (a
    point) sets some — vLLM's start-up defaulting (of vLLM ``version``; None: the current
    one), in one place, by each flag's ``default_rule``:

    - ``static``: the flag's ``default`` (None: unset); for the simulator
      ``enable-prefix-caching`` is off unless given (vLLM's default is on);
    - ``model_len`` (``max-model-len``): the model's ``max_position_embeddings``
      (``model_max_len``; None when unknown), also for ``auto`` / -1;
    - ``batch_budget`` (``max-num-batched-tokens``): the GPU's default (:func:`batch_defaults`);
      with chunked prefill off at least ``max-model-len``; at most
      ``max-num-seqs * max-model-len``;
    - ``batch_seqs`` (``max-num-seqs``): the GPU's default, at most the budget;
    - ``sglang_chunk`` (SGLang's ``chunked-prefill-size``): 8192 on GPUs of >= 60 GiB, else 4096;
    - ``memory_fraction`` (``gpu-memory-utilization``): 0.92 since vLLM 0.21, 0.9 before;
    - ``async-scheduling``: on since vLLM 0.14, off before.
    """
    default_budget, default_seqs = batch_defaults(gpu, cpu, version)
    values: dict[str, Any] = {}
    rules: dict[DefaultRule, str] = {}
    for f in for_engine(engine):
        rules[f.default_rule] = f.name
        if f.default_rule == "static":
            values[f.name] = given.get(f.name, f.default)
    if engine == "sim" and "enable-prefix-caching" not in given:
        values["enable-prefix-caching"] = False
    if "async-scheduling" in values and given.get("async-scheduling") is None:
        values["async-scheduling"] = vllm_release.async_scheduling(version)
    if "memory_fraction" in rules:
        name = rules["memory_fraction"]
        values[name] = given.get(name, vllm_release.default_gpu_memory_utilization(version))
    if "sglang_chunk" in rules:
        name = rules["sglang_chunk"]
        values[name] = given.get(name, 8192 if gpu is not None and gpu.memory_gib >= 60
                                 else 4096)
    max_len = model_max_len
    if "model_len" in rules:
        name = rules["model_len"]
        if given.get(name) not in (None, -1):
            max_len = given[name]
        values[name] = max_len
    if "batch_budget" in rules and "batch_seqs" in rules:
        budget_name, seqs_name = rules["batch_budget"], rules["batch_seqs"]
        seqs = given.get(seqs_name)
        budget = given.get(budget_name)
        if budget is None:
            budget = default_budget
            if not values.get("enable-chunked-prefill", True) and max_len is not None:
                budget = max(max_len, budget)
            if max_len is not None:
                budget = min((seqs or default_seqs) * max_len, budget)
        values[budget_name] = budget
        values[seqs_name] = seqs if seqs is not None else min(default_seqs, budget)
    return values
