"""Run requests through real vLLM 0.32 in process and print its per-step trace as JSON.

Usage: ``python vllm_steps.py SPEC.json OUT.json``. SPEC holds ``model`` (a model directory)
and ``engines``: a list of ``{"name", "engine": {keyword arguments for vllm.EngineArgs, e.g.
"max_num_batched_tokens"}, "cases": [{"name", "requests": [{"id", "prompt_len",
"max_tokens", "priority"}]}]}``. The engines start one after the other in this one process (vLLM is
imported once); each serves its cases in turn, a case starting only when the previous one has
finished.

Each request is a token-id prompt of exactly ``prompt_len`` tokens (random ids, so prefix
caching can hit nothing), with ``min_tokens = max_tokens`` and ``ignore_eos``; a request with a
``prefix`` (``[key, tokens]``) opens with that key's ``tokens`` ids, the same in every request
naming the key. Prefix caching is off unless the engine's arguments turn it on. All requests of
a case are added before its first step, so the schedule does not depend on arrival timing.

Per engine step the trace holds the four counts of vLLM's own iteration log line
(``--enable-logging-iteration-details``: ``Iteration(N): A context requests, B context tokens,
C generation requests, D generation tokens, ...``), parsed from that line, plus the requests
preempted in the step (vLLM's ``IterationStats.num_preempted_reqs``, read by a stat logger).
Finished requests come in the order vLLM reported them, with their own preemption counts.

Runs with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` so the engine core steps in this process; it is
spawned as a subprocess by the tests so pytest's own process never imports vLLM.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import random
import re
import sys
import time

ITERATION_RE = re.compile(
    r"Iteration\((\d+)\): (\d+) context requests, (\d+) context tokens, "
    r"(\d+) generation requests, (\d+) generation tokens"
)


class _IterationLines(logging.Handler):
    """Collects the ``Iteration(N)`` lines vLLM logs (one per engine step)."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.steps: list[list[int]] = []

    def emit(self, record: logging.LogRecord) -> None:
        m = ITERATION_RE.search(record.getMessage())
        if m:
            self.steps.append([int(g) for g in m.groups()[1:]])


def main(spec_path: str, out_path: str) -> int:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)

    from vllm import EngineArgs, LLMEngine, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.metrics.loggers import StatLoggerBase

    preempted_per_step: list[int] = []
    finished_stats: dict[str, int] = {}

    class _Recorder(StatLoggerBase):
        def __init__(self, vllm_config, engine_index=0):  # type: ignore[no-untyped-def]
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None,  # type: ignore[no-untyped-def]
                   engine_idx=0):
            if scheduler_stats is not None and scheduler_stats.iteration_details is not None:
                preempted_per_step.append(
                    iteration_stats.num_preempted_reqs if iteration_stats is not None else 0
                )
            if iteration_stats is not None:
                for fin in iteration_stats.finished_requests:
                    if fin.request_id is not None:
                        finished_stats[fin.request_id] = fin.num_preemptions

        def log_engine_initialized(self) -> None:
            pass

    lines = _IterationLines()
    vocab = int(spec.get("vocab_size", 4096))
    engines_out = []
    for eng in spec["engines"]:
        t0 = time.monotonic()
        engine = LLMEngine.from_engine_args(
            EngineArgs(
                model=spec["model"],
                load_format="dummy",
                enforce_eager=True,
                enable_logging_iteration_details=True,
                disable_log_stats=False,
                seed=0,
                **{"enable_prefix_caching": False, **eng["engine"]},
            ),
            stat_loggers=[_Recorder],
        )
        startup_s = time.monotonic() - t0
        # vLLM (re)applies its logging config while an engine starts, which clears the
        # handlers of its child loggers: attach ours after each start.
        logging.getLogger("vllm.v1.metrics.loggers").addHandler(lines)
        rng = random.Random(0)
        results = []
        for case in eng["cases"]:
            lines.steps.clear()
            preempted_per_step.clear()
            finished_order: list[str] = []
            for r in case["requests"]:
                n = int(r["max_tokens"])
                length = int(r["prompt_len"])
                key, shared = r.get("prefix") or (None, 0)
                shared = min(int(shared), length)
                opening = random.Random(f"opening:{key}")
                ids = [opening.randrange(4, vocab) for _ in range(shared)] + \
                    [rng.randrange(4, vocab) for _ in range(length - shared)]
                engine.add_request(
                    str(r["id"]),
                    TokensPrompt(prompt_token_ids=ids),
                    SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True,
                                   temperature=0.0),
                    priority=int(r.get("priority", 0)),
                )
            budget = int(case.get("max_steps", 5000))
            while engine.has_unfinished_requests() and budget > 0:
                budget -= 1
                for out in engine.step():
                    if out.finished:
                        finished_order.append(out.request_id)
            if engine.has_unfinished_requests():
                print(f"{eng['name']}/{case['name']}: unfinished after max_steps",
                      file=sys.stderr)
                return 1
            results.append({
                "name": case["name"],
                "steps": list(lines.steps),
                "preempted": list(preempted_per_step),
                "finished": finished_order,
                "request_preemptions": {rid: finished_stats.get(rid, 0)
                                        for rid in finished_order},
            })
        engines_out.append({"name": eng["name"], "startup_s": startup_s, "cases": results})
        engine.engine_core.shutdown()
        del engine
        gc.collect()
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"engines": engines_out}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
