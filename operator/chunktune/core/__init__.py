"""The bottom layer: plain types and pure functions every other package shares.

Nothing here imports another chunktune package (``.importlinter`` enforces it): errors, the
workload profile (durations, distributions, request generation), the token-counting rule, the
load summary with its percentile arithmetic and flat metrics, the trial plan/result types, and
the engine: the flag registry (``flags``), the engine arguments with vLLM's defaults and
start-up rules (``engine_args``), GPU data sheets (``gpus``) and model shapes (``models``).
"""
