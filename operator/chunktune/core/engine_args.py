"""Engine arguments with vLLM's spellings, defaults and validation rules.

:class:`EngineArgs` holds what a user passes (``None`` = not given); :func:`resolve` turns it into
a :class:`ResolvedConfig` the way vLLM's ``EngineArgs.get_batch_defaults`` and
``SchedulerConfig.verify_max_model_len`` do (``docs/vllm-behaviour.md`` §2), raising
:class:`EngineStartupError` with vLLM's own message for a configuration vLLM refuses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from chunktune.core import speculative
from chunktune.core.errors import ChunktuneError, SpecError
from chunktune.core.flags import BY_ATTR, FLAGS, argv, engine_defaults
from chunktune.core.gpus import GPU
from chunktune.core.models import (
    CHUNKED,
    MODELLED_QUANTIZATION,
    SLIDING,
    ModelConfig,
    resolve_model,
)
from chunktune.core.speculative import SpeculativeConfig
from chunktune.core.vllm_release import Version, scheduler_release


class EngineStartupError(ChunktuneError):
    """The engine refuses to start. ``reason`` is the classification a tuner records
    (``ConfigRejected``, ``EngineOOM``, ``KVCacheTooSmall``, ``MaxModelLenTooLarge``);
    ``message`` is the line vLLM itself prints."""

    def __init__(self, reason: str, message: str, hint: str = "",
                 preceding: tuple[str, ...] = (), lines: tuple[str, ...] = (),
                 estimated_max_model_len: int = 0) -> None:
        self.reason = reason
        self.message = message
        #: What to change, in our words (vLLM's message is kept verbatim in ``message``).
        self.hint = hint
        #: Log lines vLLM prints just before the error (e.g. the memory figures).
        self.preceding = preceding
        #: The end of vLLM's traceback as it prints it (default: ``message`` alone).
        self.lines = lines or (message,)
        #: ``MaxModelLenTooLarge``: the longest request the KV cache holds, as vLLM estimates
        #: it in the message (0: none, or another reason).
        self.estimated_max_model_len = estimated_max_model_len
        super().__init__(message)

    def describe(self) -> str:
        """The message with its hint, as a trial records it (as
        :meth:`chunktune.backends.classify.StartupFailure.describe` does)."""
        return f"{self.message} (hint: {self.hint})" if self.hint else self.message

    @classmethod
    def value_error(cls, config: str, text: str, hint: str = "") -> EngineStartupError:
        """A rule a vLLM 0.32 config dataclass enforces (``SchedulerConfig``,
        ``ModelConfig``): pydantic wraps the ``ValueError`` and the server exits 1 with::

            pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig
              Value error, <text> [type=value_error, input_value=ArgsKwargs(...), ...]
                For further information visit https://errors.pydantic.dev/2.14/v/value_error

        ``message`` is the ``Value error, ...`` line, the one a log classifier finds."""
        message = (f"Value error, {text} [type=value_error, input_value=ArgsKwargs((), {{...}}), "
                   "input_type=ArgsKwargs]")
        return cls("ConfigRejected", message, hint=hint, lines=(
            f"pydantic_core._pydantic_core.ValidationError: 1 validation error for {config}",
            "  " + message,
            "    For further information visit https://errors.pydantic.dev/2.14/v/value_error",
        ))


def _default(name: str) -> Any:
    return FLAGS[name].default


#: The ``--kv-cache-dtype`` values the simulator models (vLLM takes more).
SIM_KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")
#: The ``--quantization`` values the simulator models for a checkpoint without its own
#: quantization (vLLM 0.32 quantizes the linear layers to FP8 online, one layer at a time as
#: it loads them, so only the FP8 weights stay); a quantized checkpoint also takes its own
#: method's name.
SIM_ONLINE_QUANTIZATION = ("fp8", "fp8_per_tensor", "fp8_per_block", "fp8_per_channel")


@dataclass
class EngineArgs:
    """The ``vllm serve`` arguments the simulator models, one field per registry flag the
    ``sim`` engine takes (:mod:`chunktune.core.flags`; a test keeps the two in step).
    ``None`` means "the engine derives it" (:func:`chunktune.core.flags.engine_defaults`).

    ``enable_prefix_caching`` defaults to off, unlike vLLM: the simulator models vLLM's prefix
    cache when it is given (:class:`chunktune.sim.engine.kv_cache.PrefixCache`)."""

    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    long_prefill_token_threshold: int = _default("long-prefill-token-threshold")
    long_prefill_token_threshold_adaptive: bool = \
        _default("long-prefill-token-threshold-adaptive")
    scheduler_reserve_full_isl: bool = _default("scheduler-reserve-full-isl")
    prefill_schedule_interval: int = _default("prefill-schedule-interval")
    cache_aware_admission_window: int = _default("cache-aware-admission-window")
    cache_aware_admission_threshold: float = _default("cache-aware-admission-threshold")
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    enable_chunked_prefill: bool = _default("enable-chunked-prefill")
    block_size: int = _default("block-size")
    tensor_parallel_size: int = _default("tensor-parallel-size")
    max_num_partial_prefills: int = _default("max-num-partial-prefills")
    max_long_partial_prefills: int = _default("max-long-partial-prefills")
    enable_prefix_caching: bool = False
    kv_cache_dtype: str = _default("kv-cache-dtype")
    quantization: str | None = None
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    scheduling_policy: str = _default("scheduling-policy")
    enforce_eager: bool = _default("enforce-eager")
    async_scheduling: bool | None = None
    """None: as the engine's vLLM version does (on since 0.14)."""
    max_cudagraph_capture_size: int | None = None
    max_num_queued_reqs: int | None = None
    speculative_config: str | None = None
    """The JSON text (:mod:`chunktune.core.speculative`)."""
    num_speculative_tokens: int | None = None
    """K inside ``speculative_config`` where searched (0: no speculative decoding)."""
    enable_expert_parallel: bool = _default("enable-expert-parallel")
    data_parallel_size: int = _default("data-parallel-size")
    """Attention data parallelism: the simulator runs it for an MoE model with
    ``--enable-expert-parallel`` (:mod:`chunktune.sim.engine.data_parallel`)."""
    enable_logging_iteration_details: bool = _default("enable-logging-iteration-details")
    """Only ``sim serve`` reads it: its step log (:mod:`chunktune.core.steps`)."""

    @classmethod
    def from_point(cls, point: Mapping[str, Any], base: EngineArgs | None = None) -> EngineArgs:
        """``base`` (default: all defaults) with a point's flags set, each value of its flag's
        type. Raises :class:`SpecError` naming the flag for a flag the simulator does not take
        or a value the engine refuses."""
        problems: list[tuple[str, str]] = []
        values: dict[str, Any] = {}
        for name, value in point.items():
            f = FLAGS.get(name)
            if f is None or "sim" not in f.engines:
                problems.append(("--" + name, "the simulator does not take this flag"))
                continue
            why = f.why(value)
            if why is not None:
                problems.append((f.option, why))
                continue
            values[f.attr] = f.coerce(value)
        if problems:
            raise SpecError(problems)
        return replace(base if base is not None else cls(), **values)

    def point(self, only_set: bool = True) -> dict[str, Any]:
        """The arguments as a point (``{"max-num-seqs": 256}``), in registry order; with
        ``only_set`` only those that differ from the defaults; never the unset (None) ones."""
        default = EngineArgs()
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None or (only_set and v == getattr(default, f.name)):
                continue
            out[BY_ATTR[f.name].name] = v
        return out

    def check(self) -> None:
        """Reject values no engine would take (wrong types, out of the flag's bounds), naming
        the flag. Rules vLLM itself enforces at start-up are in :func:`resolve` instead, since
        they are results (the engine refuses), not input errors."""
        problems: list[tuple[str, str]] = []
        for f in fields(self):
            v = getattr(self, f.name)
            flag = BY_ATTR[f.name]
            if v is None and flag.default is None:
                continue
            why = flag.why(v)
            if why is not None:
                problems.append((flag.option, why))
        if problems:
            raise SpecError(problems)

    def check_simulated(self) -> None:
        """:meth:`check`, then refuse what vLLM takes but the simulator does not model (rather
        than ignore it): ``--max-model-len auto``, KV-cache dtypes other than
        :data:`SIM_KV_CACHE_DTYPES`, quantization methods other than FP8 (the checkpoint's own
        method is checked against it in :func:`resolve`)."""
        self.check()
        problems: list[tuple[str, str]] = []
        if self.max_model_len == -1:
            problems.append(("--max-model-len", "auto (-1) fits the length to the KV cache, "
                             "which the simulator does not model; give a length"))
        if self.kv_cache_dtype not in SIM_KV_CACHE_DTYPES:
            problems.append(("--kv-cache-dtype", f"the simulator models "
                             f"{', '.join(SIM_KV_CACHE_DTYPES)} (got {self.kv_cache_dtype!r})"))
        modelled = tuple(dict.fromkeys((*SIM_ONLINE_QUANTIZATION, *MODELLED_QUANTIZATION)))
        if self.quantization is not None and self.quantization not in modelled:
            problems.append(("--quantization", f"the simulator models FP8: "
                             f"{', '.join(modelled)} (got {self.quantization!r})"))
        if self.speculative_config is not None:
            try:
                speculative.parse(self.speculative_config)
            except SpecError as e:
                problems += e.problems
        if problems:
            raise SpecError(problems)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_cli(self, only_set: bool = True) -> list[str]:
        """The ``vllm serve`` flags for these arguments (defaults left out)."""
        return argv(self.point(only_set))


@dataclass(frozen=True)
class ResolvedConfig:
    """Every engine setting with a concrete value, after vLLM's defaults and checks."""

    model: ModelConfig
    gpu: GPU
    max_num_batched_tokens: int
    max_num_seqs: int
    long_prefill_token_threshold: int
    max_model_len: int
    gpu_memory_utilization: float
    enable_chunked_prefill: bool
    block_size: int
    tensor_parallel_size: int
    kv_cache_dtype_bytes: float
    kv_cache_memory_bytes: int | None
    num_gpu_blocks_override: int | None
    enforce_eager: bool
    scheduling_policy: str = "fcfs"
    #: whether the host prepares the next step while the GPU runs this one
    async_scheduling: bool = False
    enable_prefix_caching: bool = False
    cudagraph_capture_sizes: tuple[int, ...] = field(default=())
    warnings: tuple[str, ...] = field(default=())
    #: ``--kv-cache-dtype`` as the engine resolved it (``auto``: the model's dtype, unless
    #: the checkpoint quantizes the KV cache) and the quantization method it runs (None: none)
    kv_cache_dtype: str = "auto"
    quantization: str | None = None
    #: the vLLM whose start-up defaults and memory accounting apply (None: the current one)
    #: and whose scheduler runs (None: the newest checked, ``vllm_release.NEWEST_SCHEDULER``)
    vllm_version: Version | None = None
    long_prefill_token_threshold_adaptive: bool = False
    #: ``--scheduler-reserve-full-isl`` (vLLM 0.19+; releases before admit on the first
    #: chunk whatever it says: ``SchedulerRelease.reserves_full_sequence``)
    scheduler_reserve_full_isl: bool = True
    prefill_schedule_interval: int = 1
    cache_aware_admission_window: int = 0
    cache_aware_admission_threshold: float = 0.5
    #: speculative decoding (``--speculative-config``; None: off) and, for a draft model, its
    #: architecture
    speculative: SpeculativeConfig | None = None
    draft_model: ModelConfig | None = None
    #: ``--max-num-queued-reqs``: requests in the system beyond which the server answers 503
    max_num_queued_reqs: int | None = None

    @property
    def speculative_config(self) -> str | None:
        """``--speculative-config`` as the engine runs it (K included), or None."""
        spec = self.speculative
        if spec is None:
            return None
        return speculative.to_text(spec)

    @property
    def num_speculative_tokens(self) -> int | None:
        return self.speculative.num_speculative_tokens if self.speculative else None
    #: ``--enable-expert-parallel``: an MoE model's experts split whole across the ranks
    enable_expert_parallel: bool = False
    #: ``--data-parallel-size``: ranks, each this configuration's attention, KV cache and
    #: scheduler; the routed experts split over ``data_parallel_size x tensor_parallel_size``
    data_parallel_size: int = 1

    def flags(self) -> dict[str, Any]:
        """The engine flags as the engine runs with them, as a point
        (``{"max-num-batched-tokens": 8192, ...}``), in registry order; unset ones left out."""
        out: dict[str, Any] = {}
        for f in FLAGS.values():
            value = getattr(self, f.attr, None)
            if "sim" in f.engines and value is not None:
                out[f.name] = value
        return out


def kv_cache_dtype_bytes(dtype: str, model_dtype_bytes: float) -> float:
    """Bytes per cached K or V element for a ``--kv-cache-dtype``: the model's for ``auto``,
    2 for 16-bit types, 1 for 8-bit ones, the bit width / 8 for the packed 3- and 4-bit ones
    (the simulator itself runs only auto, bfloat16 and fp8; the rest serve the tuner's memory
    prescreen of a real vLLM engine)."""
    if dtype == "auto":
        return model_dtype_bytes
    if dtype in ("bfloat16", "float16"):
        return 2.0
    if dtype.startswith(("fp8", "int8")):
        return 1.0
    if dtype == "turboquant_3bit_nc":
        return 3 / 8
    if dtype == "turboquant_k3v4_nc":
        return (3 + 4) / 16
    if dtype == "turboquant_k8v4":
        return (8 + 4) / 16
    return 0.5  # int4_per_token_head, nvfp4*, turboquant_4bit_nc, ultraquant_4bit


def cudagraph_sizes(max_num_seqs: int, max_num_batched_tokens: int,
                    max_size: int | None = None) -> tuple[int, ...]:
    """vLLM's default CUDA-graph capture sizes: [1, 2, 4] + range(8, 256, 8) +
    range(256, max + 1, 16) with max = min(max_num_seqs * 2, 512), clipped to the budget."""
    top = max_size if max_size is not None else min(max_num_seqs * 2, 512)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16)]
    return tuple(s for s in sizes if s <= min(top, max_num_batched_tokens))


def check_scheduler_rules(budget: int, seqs: int, max_model_len: int | None,
                          chunked: bool = True, partial: int = 1, long_partial: int = 1,
                          threshold: int = 0) -> None:
    """vLLM's scheduler-config checks (``SchedulerConfig.verify_max_model_len`` and V1's
    feature check), usable without a model: raises :class:`EngineStartupError`
    (``ConfigRejected``) with vLLM's message. ``max_model_len`` None skips the rule that
    needs it."""
    if partial != 1 or long_partial != 1:
        raise EngineStartupError(
            "ConfigRejected",
            "NotImplementedError: Concurrent Partial Prefill is not supported. "
            "(--max-num-partial-prefills and --max-long-partial-prefills must be 1 in the V1 "
            "engine)",
        )
    if not chunked and max_model_len is not None and budget < max_model_len:
        raise EngineStartupError.value_error(
            "SchedulerConfig",
            f"max_num_batched_tokens ({budget}) is smaller than max_model_len "
            f"({max_model_len}). This effectively limits the maximum sequence length to "
            "max_num_batched_tokens and makes vLLM reject longer sequences. Please increase "
            "max_num_batched_tokens or decrease max_model_len.",
        )
    if budget < seqs:
        raise EngineStartupError.value_error(
            "SchedulerConfig",
            f"max_num_batched_tokens ({budget}) must be greater than or equal to "
            f"max_num_seqs ({seqs}).",
        )
    if max_model_len is not None and threshold > max_model_len:
        raise EngineStartupError.value_error(
            "SchedulerConfig",
            f"long_prefill_token_threshold ({threshold}) cannot be greater than the "
            f"max_model_len ({max_model_len}).",
        )


def resolve(args: EngineArgs, model: ModelConfig, gpu: GPU,
            version: Version | None = None) -> ResolvedConfig:
    """Apply vLLM's defaults, then its start-up validation. Raises :class:`SpecError` for input
    no engine accepts and :class:`EngineStartupError` (reason ``ConfigRejected``) for a
    combination vLLM refuses, with vLLM's message. ``--quantization`` and the checkpoint's
    quantization are resolved as vLLM 0.32's ``ModelConfig._verify_quantization`` does: the
    model the result holds has its linear layers at the resolved weight type. ``version``:
    the vLLM whose defaults apply (:mod:`chunktune.core.vllm_release`; None: the current)."""
    args.check()
    _check_release_flags(args, version)
    model = apply_quantization(model, args.quantization)
    tp = args.tensor_parallel_size
    if model.num_attention_heads % tp:
        raise EngineStartupError(
            "ConfigRejected",
            f"ValueError: Total number of attention heads ({model.num_attention_heads}) must be "
            f"divisible by tensor parallel size ({tp}).",
        )
    derived_len = model.max_position_embeddings
    # None: the model's; -1 (auto): at most the model's, fitted to the KV cache by vLLM.
    max_model_len = derived_len if args.max_model_len in (None, -1) else args.max_model_len
    if max_model_len > derived_len:
        raise EngineStartupError.value_error(
            "ModelConfig",
            f"User-specified max_model_len ({max_model_len}) is greater than the "
            f"derived max_model_len (max_position_embeddings={float(derived_len)} or "
            "model_max_length=None in model's config.json). To allow overriding this maximum, "
            "set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN "
            "must be used with extreme caution. If the model uses relative position encoding "
            "(RoPE), positions exceeding derived_max_model_len lead to nan. If the model uses "
            "absolute position encoding, positions exceeding derived_max_model_len will cause a "
            "CUDA array out-of-bounds error.",
        )
    values = engine_defaults(args.point(only_set=False), gpu, max_model_len, engine="sim",
                             version=version)
    budget, seqs = values["max-num-batched-tokens"], values["max-num-seqs"]
    check_scheduler_rules(budget, seqs, max_model_len, args.enable_chunked_prefill,
                          args.max_num_partial_prefills, args.max_long_partial_prefills,
                          values.get("long-prefill-token-threshold") or 0)
    warnings: list[str] = []
    if budget > seqs * max_model_len:
        warnings.append(
            f"max_num_batched_tokens ({budget}) exceeds max_num_seqs * max_model_len "
            f"({seqs * max_model_len}). This may lead to unexpected behavior."
        )
    # vLLM 0.32 resolve_kv_cache_dtype_string: auto follows a ModelOpt checkpoint's KV scheme
    kv_dtype = model.kv_cache_dtype if args.kv_cache_dtype == "auto" else args.kv_cache_dtype
    kv_bytes = kv_cache_dtype_bytes(kv_dtype, model.dtype_bytes)
    graphs = () if args.enforce_eager else cudagraph_sizes(seqs, budget,
                                                           args.max_cudagraph_capture_size)
    spec, draft = resolve_speculative(args, budget)
    if spec is not None and spec.draft_slots \
            and not scheduler_release(version).draft_slots_per_request \
            and budget <= spec.draft_slots * seqs:
        # vLLM 0.18-0.27 take max_num_seqs x the slots off the budget once
        # (VllmConfig._set_max_num_scheduled_tokens): nothing would ever be scheduled
        raise SpecError(
            f"--max-num-batched-tokens {budget} leaves no token to schedule under vLLM "
            f"{scheduler_release(version).name}'s rules: it takes --max-num-seqs ({seqs}) x "
            f"{spec.draft_slots} draft slot(s) off the budget once; raise the budget above "
            f"{spec.draft_slots * seqs} or lower --max-num-seqs",
            field="max-num-batched-tokens")
    return ResolvedConfig(
        model=model,
        gpu=gpu,
        max_num_batched_tokens=budget,
        max_num_seqs=seqs,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        max_model_len=max_model_len,
        gpu_memory_utilization=float(values["gpu-memory-utilization"]),
        enable_chunked_prefill=args.enable_chunked_prefill,
        block_size=args.block_size,
        tensor_parallel_size=tp,
        kv_cache_dtype_bytes=kv_bytes,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        enforce_eager=args.enforce_eager,
        async_scheduling=bool(values["async-scheduling"]),
        scheduling_policy=args.scheduling_policy,
        enable_prefix_caching=args.enable_prefix_caching,
        cudagraph_capture_sizes=graphs,
        warnings=tuple(warnings),
        kv_cache_dtype=kv_dtype,
        quantization=model.quantization or None,
        vllm_version=version,
        long_prefill_token_threshold_adaptive=args.long_prefill_token_threshold_adaptive,
        scheduler_reserve_full_isl=args.scheduler_reserve_full_isl,
        prefill_schedule_interval=args.prefill_schedule_interval,
        cache_aware_admission_window=args.cache_aware_admission_window,
        cache_aware_admission_threshold=args.cache_aware_admission_threshold,
        speculative=spec,
        draft_model=draft,
        max_num_queued_reqs=args.max_num_queued_reqs,
        enable_expert_parallel=args.enable_expert_parallel,
        data_parallel_size=args.data_parallel_size,
    )


def _check_release_flags(args: EngineArgs, version: Version | None) -> None:
    """Refuse a flag newer than vLLM ``version`` (:attr:`Flag.since`; its ``vllm serve``
    exits on an unrecognized argument), naming the release that brought it. None: the newest
    checked release (:func:`scheduler_release`), which has them all."""
    release = scheduler_release(version)
    named = version or release.version
    problems = [(f.option, why) for f in FLAGS.values()
                if (why := f.absent_from(named)) is not None
                and hasattr(args, f.attr) and getattr(args, f.attr) != f.default]
    if problems:
        raise SpecError(problems)


#: The releases whose whole-sequence admission gate (``--scheduler-reserve-full-isl``, on by
#: default) budgets a sliding-window or chunked-attention layer for the whole sequence
#: instead of its window: vLLM 0.19.x (``KVCacheManager.can_fit_full_sequence`` asks
#: ``get_num_blocks_to_allocate`` for every token, vLLM issue #39734); 0.20 caps it at the
#: layer's own bound (``max_admission_blocks_per_request``, PR #40946).
UNCAPPED_WINDOWED_GATE: tuple[Version, Version] = ((0, 19, 0), (0, 20, 0))


def check_windowed_admission(model: ModelConfig, version: Version | None,
                             reserve_full_isl: bool) -> None:
    """Refuse, by name, scheduling a model with windowed attention layers under vLLM 0.19.x's
    whole-sequence gate (:data:`UNCAPPED_WINDOWED_GATE`; ``reserve_full_isl``: the gate is
    on): that gate holds long prompts back, and one whose whole sequence over all KV-cache
    groups exceeds the pool is never admitted (the queue behind it waits for ever); the
    simulator's scheduler sizes windowed layers as 0.20 does and does not model it. The
    release's start-up (memory, KV tokens) is modelled: only its scheduling is refused."""
    low, high = UNCAPPED_WINDOWED_GATE
    if version is None or not low <= version < high or not reserve_full_isl:
        return
    kinds = set(model.layer_kinds())
    windowed = [w for k, w in ((SLIDING, "sliding-window"), (CHUNKED, "chunked-attention"))
                if k in kinds]
    if not windowed:
        return
    named = f"{version[0]}.{version[1]}"
    raise SpecError(
        f"vLLM {named}'s whole-sequence admission gate budgets {model.name}'s "
        f"{' and '.join(windowed)} layers for every token of a prompt, not their window "
        "(vLLM issue #39734, fixed in 0.20): long prompts wait, and one longer than about "
        "the KV cache divided by its groups is never admitted. The simulator does not "
        "model that gate; name vLLM 0.20 or later, or pass --no-scheduler-reserve-full-isl",
        field="--scheduler-reserve-full-isl")


def resolve_speculative(args: EngineArgs, budget: int
                        ) -> tuple[SpeculativeConfig | None, ModelConfig | None]:
    """The speculative decoding ``args`` run and a draft model's architecture; raises
    :class:`SpecError` for a config the simulator does not take and, as vLLM 0.32's
    ``VllmConfig._set_max_num_scheduled_tokens`` does, :class:`EngineStartupError` when the
    budget leaves no slot beside the draft slots."""
    spec = speculative.resolve(args.speculative_config, args.num_speculative_tokens)
    if spec is None:
        return None, None
    draft = None
    if spec.method == "draft_model":
        draft = resolve_model(spec.model, field="--speculative-config.model")
    if budget <= spec.draft_slots:
        raise EngineStartupError(
            "ConfigRejected",
            "ValueError: VllmConfig does not have enough slots to schedule a token and support "
            f"the speculative decoding settings. Got max_num_batched_tokens={budget} and "
            f"scheduled_token_delta={spec.draft_slots}.")
    return spec, draft


def apply_quantization(model: ModelConfig, quantization: str | None) -> ModelConfig:
    """``model`` as the engine loads it under ``--quantization`` (None: as the checkpoint
    says). A checkpoint's own method must match the flag, except that a ModelOpt FP8
    checkpoint overrides it (vLLM's ``override_quantization_method``); without one, the FP8
    methods (:data:`SIM_ONLINE_QUANTIZATION`) quantize the linear layers online. Raises
    :class:`EngineStartupError` (``ConfigRejected``) with vLLM's message."""
    if quantization is None:
        return model
    if model.quantization:
        if quantization != model.quantization and model.quantization != "modelopt":
            raise EngineStartupError.value_error(
                "ModelConfig",
                f"Quantization method specified in the model config ({model.quantization}) "
                "does not match the quantization method specified in the `quantization` "
                f"argument ({quantization}).",
                hint=f"drop --quantization (the checkpoint is {model.quantization}) or give "
                     f"--quantization {model.quantization}")
        return model
    if quantization not in SIM_ONLINE_QUANTIZATION:
        raise SpecError(f"the simulator models FP8: {', '.join(SIM_ONLINE_QUANTIZATION)} for a "
                        f"checkpoint without quantization (got {quantization!r})",
                        field="--quantization")
    return model.quantized(quantization, "fp8")
