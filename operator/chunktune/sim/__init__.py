"""A vLLM-V1-compatible simulator: scheduler, step-time and memory models, in virtual time.

Sub-packages, top to bottom (``.importlinter`` enforces the order; each imports only those
below it):

- :mod:`.serving`: the simulator behind vLLM's HTTP interface in real time (``chunktune sim
  serve``): the aiohttp server, the OpenAI protocol, ``/metrics``, the tokenizer;
- :mod:`.calibration`: the twin of one user's engine: the step-time model fitted to the
  engine's own step log (a calibration *profile*), and replays of measured runs (fidelity);
- :mod:`.engine`: the engine in virtual time: requests, the KV block pool, the V1 scheduler
  (``schedule() -> StepPlan``, then ``apply``), start-up memory, the replay loop;
- :mod:`.cost`: what a step costs on a GPU: the step-time model, collectives, and the kernel
  fit of its efficiencies to measured GPU timings.

Beside them, ``sim run`` (:mod:`.cli`), its argument parsing (:mod:`.args`) and its tables
(:mod:`.report`). The engine never imports the serving side.
"""
