"""A vLLM-V1-compatible simulator: scheduler, step-time and memory models, in virtual time.

The pieces are pure and separate, as in vLLM's own ``v1/core/sched``:

- :mod:`.models` and :mod:`.gpus` describe what runs where (from Hugging Face ``config.json``
  fields and data-sheet figures);
- :mod:`.config` holds the engine arguments with vLLM's defaults and validation rules;
- :mod:`.memory` reproduces vLLM's start-up memory profiling and its failures;
- :mod:`.kv_cache` is the block pool; :mod:`.scheduler` builds one step
  (``schedule(state) -> StepPlan``) and applies it;
- :mod:`.cost_model` predicts a step's GPU time (``step_time(plan)``);
- :mod:`.engine` replays a workload in virtual time; :mod:`.workload` reads profiles.
"""
