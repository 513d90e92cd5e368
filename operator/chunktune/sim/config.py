"""Engine arguments with vLLM's spellings, defaults and validation rules.

:class:`EngineArgs` holds what a user passes (``None`` = not given); :func:`resolve` turns it into
a :class:`ResolvedConfig` the way vLLM's ``EngineArgs.get_batch_defaults`` and
``SchedulerConfig.verify_max_model_len`` do (``docs/vllm-behaviour.md`` §2), raising
:class:`EngineStartupError` with vLLM's own message for a configuration vLLM refuses.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from chunktune.core.errors import ChunktuneError, SpecError
from chunktune.sim.gpus import GPU
from chunktune.sim.models import ModelConfig

#: vLLM's default ``gpu_memory_utilization`` since v0.21 (PR #38284); 0.9 before.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
DEFAULT_BLOCK_SIZE = 16


class EngineStartupError(ChunktuneError):
    """The engine refuses to start. ``reason`` is the classification a tuner records
    (``ConfigRejected``, ``EngineOOM``, ``KVCacheTooSmall``, ``MaxModelLenTooLarge``);
    ``message`` is the line vLLM itself prints."""

    def __init__(self, reason: str, message: str, hint: str = "",
                 preceding: tuple[str, ...] = ()) -> None:
        self.reason = reason
        self.message = message
        #: What to change, in our words (vLLM's message is kept verbatim in ``message``).
        self.hint = hint
        #: Log lines vLLM prints just before the error (e.g. the memory figures).
        self.preceding = preceding
        super().__init__(message)


@dataclass
class EngineArgs:
    """The ``vllm serve`` arguments the simulator models. ``None`` means "vLLM's default"."""

    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    long_prefill_token_threshold: int = 0
    max_model_len: int | None = None
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    enable_chunked_prefill: bool = True
    block_size: int = DEFAULT_BLOCK_SIZE
    tensor_parallel_size: int = 1
    max_num_partial_prefills: int = 1
    max_long_partial_prefills: int = 1
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    scheduling_policy: str = "fcfs"
    enforce_eager: bool = False
    max_cudagraph_capture_size: int | None = None

    def check(self) -> None:
        """Reject values no engine would take (wrong types, zero or negative sizes), naming the
        flag. Rules vLLM itself enforces at start-up are in :func:`resolve` instead, since they
        are results (the engine refuses), not input errors."""
        problems: list[tuple[str, str]] = []
        positive = ("max_num_batched_tokens", "max_num_seqs", "max_model_len", "block_size",
                    "tensor_parallel_size", "max_num_partial_prefills",
                    "max_long_partial_prefills", "kv_cache_memory_bytes",
                    "num_gpu_blocks_override", "max_cudagraph_capture_size")
        for name in positive:
            v = getattr(self, name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int):
                problems.append((flag(name), f"must be an integer (got {v!r})"))
            elif v <= 0:
                problems.append((flag(name), f"must be > 0 (got {v})"))
        t = self.long_prefill_token_threshold
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            problems.append((flag("long_prefill_token_threshold"),
                             f"must be an integer >= 0, 0 meaning no cap (got {t!r})"))
        u = self.gpu_memory_utilization
        if isinstance(u, bool) or not isinstance(u, int | float) or not 0 < u <= 1:
            problems.append((flag("gpu_memory_utilization"),
                             f"must be a fraction in (0, 1] (got {u!r})"))
        if self.block_size not in (1, 8, 16, 32, 64, 128, 256):
            problems.append((flag("block_size"),
                             f"must be one of 1, 8, 16, 32, 64, 128, 256 (got {self.block_size})"))
        if self.kv_cache_dtype not in ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"):
            problems.append((flag("kv_cache_dtype"),
                             f"must be auto, bfloat16, fp8, fp8_e4m3 or fp8_e5m2 "
                             f"(got {self.kv_cache_dtype!r})"))
        if self.scheduling_policy not in ("fcfs", "priority"):
            problems.append((flag("scheduling_policy"),
                             f"must be fcfs or priority (got {self.scheduling_policy!r})"))
        if problems:
            raise SpecError(problems)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_cli(self, only_set: bool = True) -> list[str]:
        """The ``vllm serve`` flags for these arguments (defaults left out)."""
        default = EngineArgs()
        out: list[str] = []
        for f in fields(self):
            v = getattr(self, f.name)
            if only_set and v == getattr(default, f.name):
                continue
            if v is None:
                continue
            if isinstance(v, bool):
                out.append(flag(f.name) if v else "--no-" + flag(f.name)[2:])
            else:
                out += [flag(f.name), str(v)]
        return out


def flag(name: str) -> str:
    """``max_num_seqs`` -> ``--max-num-seqs``."""
    return "--" + name.replace("_", "-")


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
    cudagraph_capture_sizes: tuple[int, ...] = field(default=())
    warnings: tuple[str, ...] = field(default=())

    def flags(self) -> dict[str, Any]:
        """The tuned knobs, by vLLM flag name."""
        return {
            "max-num-batched-tokens": self.max_num_batched_tokens,
            "max-num-seqs": self.max_num_seqs,
            "long-prefill-token-threshold": self.long_prefill_token_threshold,
            "max-model-len": self.max_model_len,
            "gpu-memory-utilization": self.gpu_memory_utilization,
            "enable-chunked-prefill": self.enable_chunked_prefill,
            "block-size": self.block_size,
            "tensor-parallel-size": self.tensor_parallel_size,
        }


def batch_defaults(gpu: GPU) -> tuple[int, int]:
    """``vllm serve``'s default (max_num_batched_tokens, max_num_seqs) for a GPU: 8192/1024 on
    GPUs of >= 70 GiB whose name does not contain "a100", else 2048/256 (get_batch_defaults,
    PR #17885)."""
    if gpu.memory_gib >= 70 and "a100" not in gpu.device_name.lower():
        return 8192, 1024
    return 2048, 256


def cudagraph_sizes(max_num_seqs: int, max_num_batched_tokens: int,
                    max_size: int | None = None) -> tuple[int, ...]:
    """vLLM's default CUDA-graph capture sizes: [1, 2, 4] + range(8, 256, 8) +
    range(256, max + 1, 16) with max = min(max_num_seqs * 2, 512), clipped to the budget."""
    top = max_size if max_size is not None else min(max_num_seqs * 2, 512)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16)]
    return tuple(s for s in sizes if s <= min(top, max_num_batched_tokens))


def check_scheduler_rules(budget: int, seqs: int, max_model_len: int | None,
                          chunked: bool = True, partial: int = 1, long_partial: int = 1) -> None:
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
        raise EngineStartupError(
            "ConfigRejected",
            f"ValueError: max_num_batched_tokens ({budget}) is smaller than max_model_len "
            f"({max_model_len}). This effectively limits the maximum sequence length to "
            "max_num_batched_tokens and makes vLLM reject longer sequences. Please increase "
            "max_num_batched_tokens or decrease max_model_len.",
        )
    if budget < seqs:
        raise EngineStartupError(
            "ConfigRejected",
            f"ValueError: max_num_batched_tokens ({budget}) must be greater than or equal to "
            f"max_num_seqs ({seqs}).",
        )


def resolve(args: EngineArgs, model: ModelConfig, gpu: GPU) -> ResolvedConfig:
    """Apply vLLM's defaults, then its start-up validation. Raises :class:`SpecError` for input
    no engine accepts and :class:`EngineStartupError` (reason ``ConfigRejected``) for a
    combination vLLM refuses, with vLLM's message."""
    args.check()
    tp = args.tensor_parallel_size
    if model.num_attention_heads % tp:
        raise EngineStartupError(
            "ConfigRejected",
            f"ValueError: Total number of attention heads ({model.num_attention_heads}) must be "
            f"divisible by tensor parallel size ({tp}).",
        )
    derived_len = model.max_position_embeddings
    max_model_len = args.max_model_len if args.max_model_len is not None else derived_len
    if max_model_len > derived_len:
        raise EngineStartupError(
            "ConfigRejected",
            f"ValueError: User-specified max_model_len ({max_model_len}) is greater than the "
            f"derived max_model_len (max_position_embeddings={derived_len} or "
            "model_max_length=None in model's config.json). To allow overriding this maximum, "
            "set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.",
        )
    default_budget, default_seqs = batch_defaults(gpu)
    budget = args.max_num_batched_tokens
    if budget is None:
        budget = default_budget if args.enable_chunked_prefill else max(max_model_len, 2048)
    seqs = args.max_num_seqs
    if seqs is None:
        seqs = min(default_seqs, budget)
    check_scheduler_rules(budget, seqs, max_model_len, args.enable_chunked_prefill,
                          args.max_num_partial_prefills, args.max_long_partial_prefills)
    warnings: list[str] = []
    if budget > seqs * max_model_len:
        warnings.append(
            f"max_num_batched_tokens ({budget}) exceeds max_num_seqs * max_model_len "
            f"({seqs * max_model_len}). This may lead to unexpected behavior."
        )
    kv_bytes = model.dtype_bytes if args.kv_cache_dtype in ("auto", "bfloat16") else 1.0
    graphs = () if args.enforce_eager else cudagraph_sizes(seqs, budget,
                                                           args.max_cudagraph_capture_size)
    return ResolvedConfig(
        model=model,
        gpu=gpu,
        max_num_batched_tokens=budget,
        max_num_seqs=seqs,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        max_model_len=max_model_len,
        gpu_memory_utilization=float(args.gpu_memory_utilization),
        enable_chunked_prefill=args.enable_chunked_prefill,
        block_size=args.block_size,
        tensor_parallel_size=tp,
        kv_cache_dtype_bytes=kv_bytes,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        enforce_eager=args.enforce_eager,
        cudagraph_capture_sizes=graphs,
        warnings=tuple(warnings),
    )
