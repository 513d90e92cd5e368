"""Drive one vLLM release's own V1 ``Scheduler`` step by step and print its trace as JSON.

Usage: ``python vllm_scheduler.py EXTRACT MODEL SPEC.json OUT.json``. EXTRACT is a directory
holding the pure-Python files of one release's wheel (``vllm/...``; see ``wheels.py``), put
first on ``sys.path`` so that every ``vllm`` module comes from it and none from the installed
CPU build; MODEL is a ``chunktune model tiny`` directory (the ``ModelConfig`` it needs). SPEC
holds ``cases``: ``[{"name", "engine": {...}, "requests": [{"id", "prompt_len", "max_tokens",
"priority", "prefix": [key, tokens] | null, "arrive": step}], "speculative": [method, K] |
null, "accepted": {"<request id>": [drafts accepted at each verification, ...]}}]``
(``cases.py`` writes it). An engine may name its KV-cache groups, ``"kv_groups": ["sliding",
"full"]`` with ``"sliding_window": tokens``, or ``"chunked"`` with ``"attention_chunk_size"``
(one ``SlidingWindowSpec``, ``ChunkedLocalAttentionSpec`` or ``FullAttentionSpec``
group each, sharing the pool: vLLM's hybrid KV cache manager; ``bench/hybrid_kv_pool.py``);
by default one full-attention group.

There is no model: each step, the requests whose scheduled tokens reach their last known
token get one sampled id (the release's ``ModelRunnerOutput``, whose fields differ between
releases: 0.34 dropped ``req_id_to_index``), and ``update_from_output`` runs as the engine
core would. With speculative decoding (``ngram``, or ``draft_model`` with the model drafting
for itself: the release's ``SpeculativeConfig``), a request verifying drafts samples
``1 + accepted`` tokens (the case's next number, at most its drafts), as vLLM's own scheduler
tests answer it; then the drafter proposes K tokens for every request that sampled and is
not finished (``DraftTokenIds`` through ``update_draft_token_ids``, the same in 0.31-0.34),
unless the step is marked ``skip_drafts`` (0.33 with the V2 model runner, 0.34 for drafters
that reserve lookahead slots: no request of the step could use its drafts, so the scheduler
sees nothing different). A request arriving at step ``k`` is added before the ``k``-th
executed step. Per step the trace holds the four counts of vLLM's iteration log, from the
release's own ``compute_iteration_details``, the requests preempted in the step and the draft
tokens it verifies; then the request ids in the order they finished. A step that schedules
nothing (vLLM 0.31-0.32, a request preempting itself under ``priority``) is left out, as
vLLM's log leaves it out.

Run as a subprocess (one per release): modules of two releases must never meet in one
process, nor meet the installed vLLM.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import sys
from typing import Any

#: Third-party packages that older releases import when their configs and request types load
#: and that the installed CPU build does not need, with the submodules they import:
#: ``gguf`` (GGUF files, before 0.19), ``diskcache`` (the structured-output grammar cache).
#: No scheduler step reads either.
STUBBED: dict[str, tuple[str, ...]] = {"gguf": ("constants", "quants"), "diskcache": ()}
#: A stand-in module: every public name a placeholder class (PEP 562).
_PLACEHOLDER = (
    '"""A stand-in written by the per-release scheduler suite: the package is not installed."""\n'
    "def __getattr__(name):\n"
    "    if name.startswith('__'):\n"
    "        raise AttributeError(name)\n"
    "    return type(name, (), {})\n")


def stub_missing(folder: str) -> None:
    """Write a stand-in package into ``folder`` for each package of :data:`STUBBED` that is
    not installed; the folder goes on the path of this process and of vLLM's own
    subprocesses (the model registry inspects a model's class in one)."""
    for name, submodules in STUBBED.items():
        if importlib.util.find_spec(name) is not None:
            continue
        package = os.path.join(folder, name)
        os.makedirs(package, exist_ok=True)
        for module in ("__init__", *submodules):
            with open(os.path.join(package, f"{module}.py"), "w", encoding="utf-8") as f:
                f.write(_PLACEHOLDER)


def main(extract: str, model: str, spec_path: str, out_path: str) -> int:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("PYTHONHASHSEED", "0")
    # the V1 model runner, as the CPU build runs (0.31-0.33 send a request resumed after a
    # preemption as new to the V2 one, which the iteration log then counts as context; 0.34
    # has only that behaviour: SchedulerRelease.resumed_counts_as_context)
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    # the same release in vLLM's own subprocesses (the model registry inspects the model's
    # class in one), and its model-info cache kept apart from other releases'
    stubs = os.path.join(extract, ".stubs")
    stub_missing(stubs)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (extract, stubs, os.environ.get("PYTHONPATH")) if p)
    os.environ["VLLM_CACHE_ROOT"] = os.path.join(extract, ".vllm-cache")
    sys.path[:0] = [extract, stubs]
    import torch
    import vllm.platforms
    from vllm.platforms.interface import UnspecifiedPlatform

    class Neutral(UnspecifiedPlatform):
        """No platform's adjustments (``check_and_update_config`` does nothing): the
        configs stay as given, as the scheduler sees them on any accelerator."""

        device_type = "cpu"
        device_name = "cpu"

    vllm.platforms._current_platform = Neutral()  # before anything binds the platform
    import vllm
    from vllm.config import (
        CacheConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        SpeculativeConfig,
        VllmConfig,
    )
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        SlidingWindowSpec,
    )
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager
    from vllm.v1.utils import compute_iteration_details

    foreign = [m.__file__ for m in list(sys.modules.values())
               if m.__name__.split(".")[0] == "vllm" and getattr(m, "__file__", None)
               and not os.path.realpath(m.__file__).startswith(os.path.realpath(extract))]
    if foreign:
        raise SystemExit(f"vllm modules from outside the extract: {foreign[:3]}")
    takes_index = "req_id_to_index" in ModelRunnerOutput.__dataclass_fields__

    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    init_none_hash(sha256)
    model_config = ModelConfig(model=model, dtype="float32", seed=0,
                               skip_tokenizer_init=True, enforce_eager=True)
    out_cases = []
    for case in spec["cases"]:
        e = case["engine"]
        block = e["block_size"]
        extra: dict[str, Any] = {}
        for key in ("long_prefill_token_threshold_adaptive", "prefill_schedule_interval",
                    "scheduler_reserve_full_isl", "async_scheduling",
                    "cache_aware_admission_window", "cache_aware_admission_threshold"):
            if key in e:
                extra[key] = e[key]
        sched_config = SchedulerConfig(
            max_num_batched_tokens=e["max_num_batched_tokens"],
            max_num_seqs=e["max_num_seqs"],
            max_model_len=e["max_model_len"],
            long_prefill_token_threshold=e["long_prefill_token_threshold"],
            enable_chunked_prefill=e["enable_chunked_prefill"],
            policy=e["scheduling_policy"],
            is_encoder_decoder=False,
            **extra,
        )
        model_config.max_model_len = e["max_model_len"]
        cache_config = CacheConfig(block_size=block, gpu_memory_utilization=0.9,
                                   cache_dtype="auto",
                                   enable_prefix_caching=e["enable_prefix_caching"])
        spec_config = None
        k = 0
        if case.get("speculative"):
            method, k = case["speculative"]
            spec_extra: dict[str, Any] = (
                {"prompt_lookup_max": 4, "prompt_lookup_min": 1} if method == "ngram"
                else {"model": model, "target_model_config": model_config,
                      "target_parallel_config": ParallelConfig()})
            spec_config = SpeculativeConfig(method=method, num_speculative_tokens=k,
                                            **spec_extra)
        vllm_config = VllmConfig(scheduler_config=sched_config, model_config=model_config,
                                 cache_config=cache_config, speculative_config=spec_config)
        common = {"block_size": block, "num_kv_heads": 1, "head_size": 1,
                  "dtype": torch.float32}
        groups = []
        for i, kind in enumerate(e.get("kv_groups", ["full"])):
            if kind == "sliding":
                kv_spec: Any = SlidingWindowSpec(**common,
                                                 sliding_window=e["sliding_window"])
            elif kind == "chunked":
                kv_spec = ChunkedLocalAttentionSpec(
                    **common, attention_chunk_size=e["attention_chunk_size"])
            else:
                kv_spec = FullAttentionSpec(**common)
            groups.append(KVCacheGroupSpec([f"layer{i}"], kv_spec))
        kv_config = KVCacheConfig(num_blocks=e["num_gpu_blocks"], kv_cache_tensors=[],
                                  kv_cache_groups=groups)
        cache_config.num_gpu_blocks = e["num_gpu_blocks"]
        sched = Scheduler(vllm_config=vllm_config, kv_cache_config=kv_config,
                          structured_output_manager=StructuredOutputManager(vllm_config),
                          block_size=block, log_stats=True)
        hasher = get_request_block_hasher(block, sha256)
        rng = random.Random(case["name"])
        openings: dict[str, list[int]] = {}
        pending = []
        for i, r in enumerate(case["requests"]):
            ids = [rng.randrange(1000, 30000) for _ in range(r["prompt_len"])]
            if r.get("prefix"):
                key, n = r["prefix"]
                n = min(n, len(ids))  # an opening longer than the prompt is all of it
                opening = openings.setdefault(key, [rng.randrange(1000, 30000)
                                                    for _ in range(n)])
                ids[:n] = opening[:n]
            params = SamplingParams(max_tokens=r["max_tokens"], min_tokens=r["max_tokens"],
                                    ignore_eos=True)
            pending.append((r.get("arrive", 0), i, Request(
                r["id"], ids, params, None, arrival_time=i * 1e-6,
                priority=r.get("priority", 0), block_hasher=hasher)))
        accepted = {rid: list(v) for rid, v in case.get("accepted", {}).items()}
        steps: list[list[int]] = []
        preempted: list[int] = []
        drafts: list[int] = []
        #: per step, each scheduled request's tokens (for reading a difference)
        scheduled: list[list[tuple[str, int]]] = []
        finished: list[str] = []
        step = empties = 0
        while pending or sched.has_unfinished_requests():
            while pending and pending[0][0] <= step:
                sched.add_request(pending.pop(0)[2])
            if not sched.has_unfinished_requests():
                step = pending[0][0]
                continue
            if len(steps) > 20000:
                raise SystemExit(f"{case['name']}: no end after 20000 steps")
            out = sched.schedule()
            empty = out.total_num_scheduled_tokens == 0
            empties = empties + 1 if empty else 0
            if empties > 3:
                raise SystemExit(f"{case['name']}: steps up to {step} scheduled nothing")
            if not empty:  # an empty step runs no model and logs no iteration
                d = compute_iteration_details(out)
                steps.append([d.num_ctx_requests, d.num_ctx_tokens,
                              d.num_generation_requests, d.num_generation_tokens])
                preempted.append(len(out.preempted_req_ids or ()))
                drafts.append(sum(len(t) for t in out.scheduled_spec_decode_tokens.values()))
                scheduled.append(sorted(out.num_scheduled_tokens.items()))
            req_ids = list(out.num_scheduled_tokens)
            sampled = []
            for rid in req_ids:
                req = sched.requests[rid]
                n = 0
                if req.num_computed_tokens >= req.num_tokens:  # it reaches its last token
                    verified = len(out.scheduled_spec_decode_tokens.get(rid, ()))
                    n = 1 + (min(accepted[rid].pop(0), verified) if verified else 0)
                sampled.append([7] * n)
            kwargs: dict[str, Any] = {"req_ids": req_ids, "sampled_token_ids": sampled}
            if takes_index:
                kwargs["req_id_to_index"] = {rid: i for i, rid in enumerate(req_ids)}
            engine_outputs = sched.update_from_output(out, ModelRunnerOutput(**kwargs))
            for outs in engine_outputs.values():
                finished += [o.request_id for o in outs.outputs if o.finished]
            proposing = [rid for rid, t in zip(req_ids, sampled, strict=True)
                         if t and rid in sched.requests and not sched.requests[rid].is_finished()]
            # 0.33-0.34: a step whose drafts would all go unused runs no drafter
            if k and proposing and not getattr(out, "skip_drafts", False):
                sched.update_draft_token_ids(DraftTokenIds(proposing,
                                                           [[9] * k for _ in proposing]))
            step += 1
        out_cases.append({"name": case["name"], "steps": steps, "preempted": preempted,
                          "drafts": drafts, "finished": finished, "scheduled": scheduled})
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"version": vllm.__version__, "cases": out_cases}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
