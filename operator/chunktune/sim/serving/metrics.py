"""vLLM's Prometheus metric families for the served simulator (``GET /metrics``).

Names, types, labels and histogram buckets follow vLLM V1's ``vllm/v1/metrics/loggers.py``
(``docs/vllm-behaviour.md`` §4): every family carries ``model_name`` (the first
served model name) and ``engine`` (``"0"``); counters get prometheus_client's ``_total``
suffix exactly as vLLM's do (``vllm:num_preemptions`` -> ``vllm:num_preemptions_total``).

The family set, label sets, buckets and Content-Type are those of vLLM 0.32's
``PrometheusStatLogger`` as served by its API server (checked against a real scrape by
``tests/conformance/test_metrics.py``). The page is always the plain text format 1.0.0
(``CONTENT_TYPE``, ``text/plain; version=1.0.0; charset=utf-8``, what vLLM 0.32 answers),
whatever the scraper's ``Accept`` header asks for: prometheus-client >= 0.23 answers an
OpenMetrics request with colons escaped to underscores (``vllm_time_to_first_token_seconds``),
which breaks every ``vllm:...`` query (toolchain notes, "Prometheus").

Families vLLM exposes for features the simulator does not model are present with vLLM's labels
and stay at vLLM's idle values: prefix-cache hits (synthetic prompts share no prefix), external
and multi-modal caches, cached prompt tokens by source, admission rejections (no
``--max-num-queued-*`` limits), ``engine_sleep_state`` (always awake), the ``deferred`` reason
of ``num_requests_waiting_by_reason``, and the ``estimated_*_per_gpu`` counters (vLLM counts
them only with ``--enable-mfu-metrics``).

When what is observed (all times on the event loop's monotonic clock, seconds):

- per engine step: ``vllm:num_requests_running`` / ``_waiting`` (and ``_waiting_by_reason``),
  ``vllm:kv_cache_usage_perc``, ``vllm:generation_tokens_total``, and
  ``vllm:num_preemptions_total`` — which, as in vLLM 0.32, counts a preemption in the step
  where the preempted request produces its next token (the event travels with its output);
- ``vllm:iteration_tokens_total``, as vLLM 0.32 records it: once per step that produced at
  least one token, the prompt tokens of the prefills that *finished* in that step plus the
  tokens generated in it (``IterationStats``: ``prompt_token_stats.computed +
  num_generation_tokens``). A step that only advances a prefill chunk is not observed, so a lone
  1000-token prompt chunked over 16 steps is one observation of 1001;
- when a request's first token is pushed: ``vllm:time_to_first_token_seconds`` (from the
  request's arrival at the HTTP frontend, as vLLM measures it), ``vllm:prompt_tokens_total``
  and ``vllm:prompt_tokens_by_source_total{source="local_compute"}`` (the whole prompt, at
  prefill completion, as vLLM counts it);
- per later token: ``vllm:inter_token_latency_seconds`` (gap to the previous token);
- when a request finishes: the request-level histograms (e2e, queue = arrival -> first
  scheduled, prefill = first scheduled -> first token, decode = first -> last token,
  inference = first scheduled -> last token, mean time per output token, prompt/generation
  token counts, ``max_tokens``, ``n``, the request's preemptions, its prefill tokens computed)
  and ``vllm:request_success_total{finished_reason}``.
  Every simulated request runs to ``max_tokens``, so ``finished_reason`` is ``length``; a
  request the client abandons is counted as ``abort`` and observed in no histogram.

Simulator-only families: ``chunktune_sim_info`` (the served configuration, value 1),
``chunktune_sim_step_overhead_seconds`` (Python wall time per step: schedule + cost model +
apply + token push, the figure that must stay far below the simulated step time),
``chunktune_sim_step_lateness_seconds`` (how late the event loop woke for a step's end) and
``chunktune_sim_late_steps_total`` (steps that started late because Python was).
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_PLAIN_1_0_0,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from chunktune import __version__
from chunktune.core.engine_args import ResolvedConfig
from chunktune.sim.engine.memory import MemoryPlan

#: The content type of ``/metrics``: Prometheus text format 1.0.0 (as vLLM 0.32 serves it),
#: never OpenMetrics.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_1_0_0

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_TIME_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                        50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
REQUEST_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
#: vLLM 0.32's ``FinishReason`` values, each pre-created as a ``finished_reason`` label.
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
#: ``PromptTokenStats.ALL_SOURCES``: where a prompt token's KV came from.
PROMPT_TOKEN_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
#: ``CacheHitSource``: the cache tier of a prefix-cache hit.
CACHE_HIT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
#: ``vllm:num_requests_waiting_by_reason`` reasons.
WAITING_REASONS = ("capacity", "deferred")
#: ``vllm:engine_sleep_state`` states.
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
#: ``vllm:admission_rejections_total`` reasons (labels ``model_name`` and ``reason`` only).
ADMISSION_REJECTION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")

OVERHEAD_BUCKETS = (1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2)
LATENESS_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1.0)


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """vLLM's ``build_1_2_5_buckets``: 1, 2, 5, 10, 20, 50, ... up to ``max_value``."""
    out: list[int] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exponent
            if v > max_value:
                return out
            out.append(v)
        exponent += 1


class VllmMetrics:
    """The metric families of one served engine, in a private registry."""

    def __init__(self, cfg: ResolvedConfig, memory: MemoryPlan, model_name: str,
                 engine_index: int = 0, enable_prefix_caching: bool = True,
                 user_specified_block_size: bool = False) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        labels = ["model_name", "engine"]
        lv = (model_name, str(engine_index))

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=reg)

        def hist(name: str, doc: str, buckets: tuple[float, ...] | list[int]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=reg)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=reg)

        # Performance estimates: counted by vLLM only with --enable-mfu-metrics (off by default).
        for name, doc in (
            ("vllm:estimated_flops_per_gpu", "Estimated number of floating point operations "
             "per GPU (for Model Flops Utilization calculations)."),
            ("vllm:estimated_read_bytes_per_gpu", "Estimated number of bytes read from memory "
             "per GPU (for Model Bandwidth Utilization calculations)."),
            ("vllm:estimated_write_bytes_per_gpu", "Estimated number of bytes written to "
             "memory per GPU (for Model Bandwidth Utilization calculations)."),
        ):
            counter(name, doc).labels(*lv)

        # Scheduler state.
        self.running = gauge("vllm:num_requests_running",
                             "Number of requests in model execution batches.").labels(*lv)
        self.waiting = gauge("vllm:num_requests_waiting",
                             "Number of requests waiting to be processed.").labels(*lv)
        by_reason = Gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, "
            "KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
            [*labels, "reason"], registry=reg)
        self.waiting_capacity = by_reason.labels(*lv, "capacity")
        by_reason.labels(*lv, "deferred")
        sleep = Gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
            "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep "
            "level 2.", [*labels, "sleep_state"], registry=reg)
        for state in SLEEP_STATES:
            sleep.labels(*lv, state).set(1 if state == "awake" else 0)
        self.kv_usage = gauge("vllm:kv_cache_usage_perc",
                              "KV-cache usage. 1 means 100 percent usage.").labels(*lv)
        # The prefix cache's lookups and hits, counted at admission (the engine's: see
        # on_prefix_lookups); external (KV connector) and multi-modal caches do not exist
        # here: vLLM shows them at 0 without a connector or images.
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.").labels(*lv)
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.").labels(*lv)
        counter("vllm:external_prefix_cache_queries",
                "External prefix cache queries from KV connector cross-instance cache sharing, "
                "in terms of number of queried tokens.").labels(*lv)
        counter("vllm:external_prefix_cache_hits",
                "External prefix cache hits from KV connector cross-instance cache sharing, in "
                "terms of number of cached tokens.").labels(*lv)
        counter("vllm:mm_cache_queries",
                "Multi-modal cache queries, in terms of number of queried items.").labels(*lv)
        counter("vllm:mm_cache_hits",
                "Multi-modal cache hits, in terms of number of cached items.").labels(*lv)

        # Counters.
        self.preemptions = counter("vllm:num_preemptions",
                                   "Cumulative number of preemption from the engine.").labels(*lv)
        self.prompt_tokens = counter("vllm:prompt_tokens",
                                     "Number of prefill tokens processed.").labels(*lv)
        by_source = Counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.",
                            [*labels, "source"], registry=reg)
        self.prompt_tokens_computed = by_source.labels(*lv, "local_compute")
        self.prompt_tokens_hit = by_source.labels(*lv, "local_cache_hit")
        for source in PROMPT_TOKEN_SOURCES[2:]:
            by_source.labels(*lv, source)
        self.prompt_tokens_cached = counter(
            "vllm:prompt_tokens_cached",
            "Number of cached prompt tokens (local + external).").labels(*lv)
        cached_by_source = Counter(
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), "
            "host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
            "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
            "vllm:external_prefix_cache_hits.", [*labels, "source"], registry=reg)
        for source in CACHE_HIT_SOURCES:
            cached_by_source.labels(*lv, source)
        self.cached_on_device = cached_by_source.labels(*lv, "device")
        self.generation_tokens = counter("vllm:generation_tokens",
                                         "Number of generation tokens processed.").labels(*lv)
        self.iteration_tokens = hist("vllm:iteration_tokens_total",
                                     "Histogram of number of tokens per engine_step.",
                                     ITERATION_TOKEN_BUCKETS).labels(*lv)
        #: prompt tokens of prefills that finished in the current step (see on_step)
        self._step_prompt_tokens = 0
        #: the prefix cache's totals last seen (see on_prefix_lookups)
        self._lookups = (0, 0)

        # Request-level.
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          [*labels, "finished_reason"], registry=reg)
        self.success = {r: success.labels(*lv, r) for r in FINISH_REASONS}
        rejections = Counter("vllm:admission_rejections",
                             "Requests rejected at admission by the queue limits "
                             "(--max-num-queued-reqs, --max-num-queued-tokens).",
                             ["model_name", "reason"], registry=reg)
        self.rejections = {reason: rejections.labels(model_name, reason)
                           for reason in ADMISSION_REJECTION_REASONS}
        # Speculative decoding (vllm/v1/spec_decode/metrics.py::SpecDecodingProm, 0.32): only
        # an engine with --speculative-config has these families.
        self.spec: tuple[Counter, ...] = ()
        self.spec_per_pos: list[Counter] = []
        self._spec_seen: tuple[int, ...] = ()
        if cfg.speculative is not None:
            self.spec = tuple(counter(name, doc).labels(*lv) for name, doc in (
                ("vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
                ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
                ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")))
            per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                              "Accepted tokens per draft position.", [*labels, "position"],
                              registry=reg)
            k = cfg.speculative.num_speculative_tokens
            self.spec_per_pos = [per_pos.labels(*lv, str(pos)) for pos in range(k)]
            self._spec_seen = (0,) * (3 + k)
        lens = build_1_2_5_buckets(cfg.max_model_len)
        self.req_prompt_tokens = hist("vllm:request_prompt_tokens",
                                      "Number of prefill tokens processed.", lens).labels(*lv)
        self.req_generation_tokens = hist("vllm:request_generation_tokens",
                                          "Number of generation tokens processed.",
                                          lens).labels(*lv)
        self.req_max_num_generation_tokens = hist(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.", lens).labels(*lv)
        self.req_params_n = hist("vllm:request_params_n",
                                 "Histogram of the n request parameter.",
                                 PARAMS_N_BUCKETS).labels(*lv)
        self.req_params_max_tokens = hist("vllm:request_params_max_tokens",
                                          "Histogram of the max_tokens request parameter.",
                                          lens).labels(*lv)
        self.ttft = hist("vllm:time_to_first_token_seconds",
                         "Histogram of time to first token in seconds.",
                         TTFT_BUCKETS).labels(*lv)
        self.itl = hist("vllm:inter_token_latency_seconds",
                        "Histogram of inter-token latency in seconds.", ITL_BUCKETS).labels(*lv)
        self.tpot = hist("vllm:request_time_per_output_token_seconds",
                         "Histogram of time_per_output_token_seconds per request.",
                         ITL_BUCKETS).labels(*lv)
        self.e2e = hist("vllm:e2e_request_latency_seconds",
                        "Histogram of e2e request latency in seconds.",
                        REQUEST_TIME_BUCKETS).labels(*lv)
        self.queue = hist("vllm:request_queue_time_seconds",
                          "Histogram of time spent in WAITING phase for request.",
                          REQUEST_TIME_BUCKETS).labels(*lv)
        self.inference = hist("vllm:request_inference_time_seconds",
                              "Histogram of time spent in RUNNING phase for request.",
                              REQUEST_TIME_BUCKETS).labels(*lv)
        self.prefill = hist("vllm:request_prefill_time_seconds",
                            "Histogram of time spent in PREFILL phase for request.",
                            REQUEST_TIME_BUCKETS).labels(*lv)
        self.decode = hist("vllm:request_decode_time_seconds",
                           "Histogram of time spent in DECODE phase for request.",
                           REQUEST_TIME_BUCKETS).labels(*lv)
        self.req_preemptions = hist("vllm:request_num_preemptions",
                                    "Number of preemptions per request.",
                                    REQUEST_PREEMPTIONS_BUCKETS).labels(*lv)
        self.req_prefill_computed = hist(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            lens).labels(*lv)

        # Configuration, as vLLM 0.32's CacheConfig.metrics_info() renders it (str() of each
        # field); fields the simulator has no counterpart for carry vLLM's defaults.
        kv_tokens = memory.kv_cache_tokens  # with windowed layers: vLLM's capacity figure
        pool_blocks = memory.pool_blocks or memory.num_gpu_blocks  # vLLM's KVCacheConfig's
        cache_info = {
            "_block_size_resolved": "True",
            "block_size": str(cfg.block_size),
            "cache_dtype": cfg.kv_cache_dtype,
            "cache_hit_alignment_tokens": "None",
            "effective_attention_block_size": str(cfg.block_size),
            "enable_mamba_shared_prefix_checkpoint": "False",
            "enable_prefix_caching": str(enable_prefix_caching),
            "gpu_memory_utilization": str(cfg.gpu_memory_utilization),
            "hash_block_size": "None",
            "is_attention_free": "False",
            "kv_cache_dtype_skip_layers": "[]",
            "kv_cache_layout": "None",
            "kv_cache_max_concurrency": str(kv_tokens / cfg.max_model_len),
            "kv_cache_memory_bytes": str(cfg.kv_cache_memory_bytes),
            "kv_cache_size_tokens": str(kv_tokens),
            "kv_offloading_backend": "native",
            "kv_offloading_size": "None",
            "kv_sharing_fast_prefill": "False",
            "mamba_block_size": "None",
            "mamba_cache_dtype": "auto",
            "mamba_cache_mode": "none",
            "mamba_page_size_padded": "None",
            "mamba_ssm_cache_dtype": "auto",
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(pool_blocks),
            "num_gpu_blocks_override": str(cfg.num_gpu_blocks_override),
            "prefix_cache_retention_interval": "0",
            "prefix_caching_hash_algo": "sha256",
            "prefix_match_unit": "None",
            "replayssm_buffer_len": "16",
            "skip_page_size_padded": "None",
            "sliding_window": "None",
            "swa_bounded_replay": "True",
            "use_kda_recoverssm": "False",
            "use_replayssm": "False",
            "user_specified_block_size": str(user_specified_block_size),
            "engine": str(engine_index),
        }
        Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
              list(cache_info), registry=reg).labels(**cache_info).set(1)
        sim_info = {
            "version": __version__,
            "model": cfg.model.name,
            "gpu": cfg.gpu.name,
            "tensor_parallel_size": str(cfg.tensor_parallel_size),
            "max_num_batched_tokens": str(cfg.max_num_batched_tokens),
            "max_num_seqs": str(cfg.max_num_seqs),
            "long_prefill_token_threshold": str(cfg.long_prefill_token_threshold),
            "max_model_len": str(cfg.max_model_len),
            "enable_chunked_prefill": str(cfg.enable_chunked_prefill),
            "gpu_memory_utilization": str(cfg.gpu_memory_utilization),
            "num_gpu_blocks": str(pool_blocks),
            "block_size": str(cfg.block_size),
            "enforce_eager": str(cfg.enforce_eager),
        }
        Gauge("chunktune_sim_info", "The simulated engine's configuration (value 1).",
              list(sim_info), registry=reg).labels(**sim_info).set(1)

        # The simulator's own health: Python overhead per step and event-loop lateness.
        self.step_overhead = Histogram(
            "chunktune_sim_step_overhead_seconds",
            "Python wall time per simulated step (schedule, cost model, apply, token push).",
            labels, buckets=OVERHEAD_BUCKETS, registry=reg).labels(*lv)
        self.step_lateness = Histogram(
            "chunktune_sim_step_lateness_seconds",
            "How late the event loop woke up for a simulated step's end.",
            labels, buckets=LATENESS_BUCKETS, registry=reg).labels(*lv)
        self.late_steps = Counter(
            "chunktune_sim_late_steps",
            "Steps that started late (after the previous one's end plus the slack) because "
            "Python was late.", labels, registry=reg).labels(*lv)

    # ---- recording ------------------------------------------------------------------------

    def on_step(self, num_generated: int, num_preempted: int, running: int, waiting: int,
                kv_usage: float) -> None:
        """After a step's tokens were pushed (``on_first_token`` for the prefills that finished
        in it): ``iteration_tokens_total`` gets one observation if the step produced a token."""
        if num_generated:
            self.generation_tokens.inc(num_generated)
            self.iteration_tokens.observe(self._step_prompt_tokens + num_generated)
        self._step_prompt_tokens = 0
        if num_preempted:
            self.preemptions.inc(num_preempted)
        self.set_queue(running, waiting, kv_usage)

    def set_queue(self, running: int, waiting: int, kv_usage: float) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.waiting_capacity.set(waiting)
        self.kv_usage.set(kv_usage)

    def on_first_token(self, ttft: float, prompt_tokens: int, cached_tokens: int = 0) -> None:
        """A request's first token; ``cached_tokens`` of its prompt came from the prefix
        cache."""
        self.ttft.observe(ttft)
        self.prompt_tokens.inc(prompt_tokens)
        self.prompt_tokens_computed.inc(prompt_tokens - cached_tokens)
        if cached_tokens:
            self.prompt_tokens_hit.inc(cached_tokens)
            self.prompt_tokens_cached.inc(cached_tokens)
            self.cached_on_device.inc(cached_tokens)
        self._step_prompt_tokens += prompt_tokens

    def on_prefix_lookups(self, queries: int, hits: int) -> None:
        """The prefix cache's running totals of tokens looked up and found (requests admitted
        for the first time): the counters follow them."""
        self.prefix_queries.inc(queries - self._lookups[0])
        self.prefix_hits.inc(hits - self._lookups[1])
        self._lookups = (queries, hits)

    def on_finished(self, *, arrival: float, scheduled: float, first_token: float,
                    last_token: float, prompt_tokens: int, generation_tokens: int,
                    max_tokens: int, num_preemptions: int = 0,
                    reason: str = "length") -> None:
        self.success[reason].inc()
        self.e2e.observe(last_token - arrival)
        self.queue.observe(max(0.0, scheduled - arrival))
        self.prefill.observe(max(0.0, first_token - scheduled))
        self.decode.observe(last_token - first_token)
        self.inference.observe(max(0.0, last_token - scheduled))
        # vLLM observes every finished request, 0 when it produced a single token.
        self.tpot.observe((last_token - first_token) / (generation_tokens - 1)
                          if generation_tokens > 1 else 0.0)
        self.req_prompt_tokens.observe(prompt_tokens)
        self.req_generation_tokens.observe(generation_tokens)
        self.req_max_num_generation_tokens.observe(max_tokens)
        self.req_params_max_tokens.observe(max_tokens)
        self.req_params_n.observe(1)
        self.req_preemptions.observe(num_preemptions)
        self.req_prefill_computed.observe(prompt_tokens)

    def on_spec_decode(self, totals: tuple[int, ...]) -> None:
        """The scheduler's running spec-decode totals (drafts, draft tokens, accepted tokens,
        then accepted tokens by position): the counters follow them."""
        for c, now, before in zip((*self.spec, *self.spec_per_pos), totals, self._spec_seen,
                                  strict=True):
            if now != before:
                c.inc(now - before)
        self._spec_seen = tuple(totals)

    def on_admission_rejection(self, reason: str = "max_num_queued_reqs") -> None:
        self.rejections[reason].inc()

    def on_abort(self) -> None:
        self.success["abort"].inc()

    def render(self) -> bytes:
        """The ``/metrics`` page (text format 1.0.0)."""
        return generate_latest(self.registry)
