"""Drive vLLM 0.32's own ``Scheduler`` with speculative decoding, step by step, and print what
it scheduled as JSON.

Usage: ``python vllm_sched_spec.py SPEC.json OUT.json``. SPEC holds ``model`` (a model
directory with a ``config.json``) and ``cases``: ``{"name", "engine": {"max_num_batched_tokens",
"max_num_seqs", "long_prefill_token_threshold", "num_blocks", "block_size", "max_model_len"},
"speculative": {"method" (ngram, or draft_model: the model directory drafts for itself),
"num_speculative_tokens"}, "requests": [{"id", "prompt_len",
"max_tokens"}], "accepted": {"<request id>": [accepted drafts at each verification, ...]}}``.

No model runs: the scheduler's output is answered with synthetic model outputs, as vLLM's own
scheduler tests do — a request whose scheduled tokens reach its last known token samples
``1 + accepted`` tokens (the case's ``accepted`` list, in order, for the verifications of its
drafts; the bonus token alone for a prefill), then the drafter proposes K tokens for every
request that sampled (``update_draft_token_ids``). Per step the trace holds each scheduled
request's tokens in the scheduler's order and the drafts scheduled for verification. Runs in its
own process so pytest never imports vLLM.
"""

from __future__ import annotations

import json
import os
import sys


def main(spec_path: str, out_path: str) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)

    import torch
    from vllm import SamplingParams
    from vllm.config import (
        CacheConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        SpeculativeConfig,
        VllmConfig,
    )
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
    )
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    results = []
    for case in spec["cases"]:
        eng = case["engine"]
        bs = int(eng["block_size"])
        model = ModelConfig(model=spec["model"], dtype="bfloat16", seed=0,
                            max_model_len=int(eng["max_model_len"]))
        sched_cfg = SchedulerConfig(
            max_num_seqs=int(eng["max_num_seqs"]),
            max_num_batched_tokens=int(eng["max_num_batched_tokens"]),
            max_model_len=int(eng["max_model_len"]),
            long_prefill_token_threshold=int(eng["long_prefill_token_threshold"]),
            enable_chunked_prefill=True, is_encoder_decoder=False)
        cache = CacheConfig(block_size=bs, gpu_memory_utilization=0.9, cache_dtype="auto",
                            enable_prefix_caching=False)
        sp = case["speculative"]
        extra: dict[str, object] = {"prompt_lookup_max": 4, "prompt_lookup_min": 1} \
            if sp["method"] == "ngram" else {"model": spec["model"],
                                             "target_model_config": model,
                                             "target_parallel_config": ParallelConfig()}
        spec_cfg = SpeculativeConfig(method=sp["method"],
                                     num_speculative_tokens=int(sp["num_speculative_tokens"]),
                                     **extra)
        vcfg = VllmConfig(model_config=model, scheduler_config=sched_cfg, cache_config=cache,
                          speculative_config=spec_cfg)
        vcfg.cache_config.num_gpu_blocks = int(eng["num_blocks"])
        kv = KVCacheConfig(num_blocks=int(eng["num_blocks"]), kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(
                               block_size=bs, num_kv_heads=1, head_size=1,
                               dtype=torch.float32))])
        sched = Scheduler(vllm_config=vcfg, kv_cache_config=kv, log_stats=True,
                          structured_output_manager=StructuredOutputManager(vcfg),
                          block_size=bs)
        k = int(sp["num_speculative_tokens"])
        accepted = {rid: list(v) for rid, v in case.get("accepted", {}).items()}
        for i, r in enumerate(case["requests"]):
            n = int(r["max_tokens"])
            sched.add_request(Request(
                str(r["id"]), [5 + (j % 100) for j in range(int(r["prompt_len"]))],
                SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True), None,
                arrival_time=float(i) * 1e-6))
        steps = []
        for _ in range(int(case.get("max_steps", 10_000))):
            if not sched.has_unfinished_requests():
                break
            out = sched.schedule()
            order = [r.req_id for r in out.scheduled_new_reqs] + \
                list(out.scheduled_cached_reqs.req_ids)
            steps.append({"scheduled": [[rid, out.num_scheduled_tokens[rid]] for rid in order],
                          "spec": {rid: len(t) for rid, t in
                                   out.scheduled_spec_decode_tokens.items()}})
            sampled: list[list[int]] = []
            for rid in order:
                req = sched.requests[rid]
                drafts = len(out.scheduled_spec_decode_tokens.get(rid, []))
                # the step reaches the request's last known token: it samples
                done = req.num_computed_tokens >= req.num_tokens
                n = 0
                if done:
                    n = 1
                    if drafts:
                        n += min(accepted[rid].pop(0), drafts)
                sampled.append([7] * n)
            mro = ModelRunnerOutput(req_ids=order,
                                    req_id_to_index={rid: i for i, rid in enumerate(order)},
                                    sampled_token_ids=sampled)
            sched.update_from_output(out, mro)
            proposing = [rid for rid, s in zip(order, sampled, strict=True)
                         if s and rid in sched.requests and not sched.requests[rid].is_finished()]
            if proposing:
                sched.update_draft_token_ids(DraftTokenIds(proposing,
                                                           [[9] * k for _ in proposing]))
        else:
            print(f"{case['name']}: unfinished after max_steps", file=sys.stderr)
            return 1
        results.append({"name": case["name"], "steps": steps})
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"cases": results}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
