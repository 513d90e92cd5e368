"""The simulated engine in virtual time: a request (:mod:`.request`), the KV block pool
(:mod:`.kv_cache`), vLLM's V1 scheduling step (:mod:`.scheduler`), start-up memory
(:mod:`.memory`), the replay loop (:mod:`.virtual`) and the step trace in vLLM's iteration-log
shape (:mod:`.step_trace`)."""
