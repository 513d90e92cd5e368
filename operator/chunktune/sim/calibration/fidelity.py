"""Replay measured vLLM runs through the simulator and compare latencies.

The runs are LLMServingSim's (``kernel_data.read_engine_runs``): vLLM 0.19, offline engine
with timed injection, per-request engine-side timestamps (TTFT = first token - queued, E2E =
last token - queued, TPOT = (E2E - TTFT) / (output - 1)). The simulator replays the same
arrivals and token counts with the run's engine arguments and returns the same quantities.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from chunktune.core.engine_args import EngineArgs
from chunktune.core.gpus import resolve_gpu, with_peer_to_peer
from chunktune.core.models import resolve_model
from chunktune.core.workload import RequestSpec
from chunktune.sim.cost.fit.kernel_data import EngineRun
from chunktune.sim.engine.data_parallel import DataParallelEngine, build_data_parallel_engine
from chunktune.sim.engine.virtual import Engine, build_engine

#: The vLLM LLMServingSim's runs used (their meta.json): its start-up memory accounting.
LLMSS_VERSION = (0, 19, 0)


@dataclass(frozen=True)
class LatencyComparison:
    run: str
    metric: str
    percentile: int
    measured_s: float
    predicted_s: float

    @property
    def rel_err(self) -> float:
        return self.predicted_s / self.measured_s - 1.0


def measured_latencies(run: EngineRun) -> dict[str, np.ndarray]:
    ttft = np.array([r[3] for r in run.requests])
    e2e = np.array([r[4] for r in run.requests])
    out = np.array([r[2] for r in run.requests], float)
    tpot = (e2e - ttft) / np.maximum(out - 1, 1)
    return {"ttft": ttft, "tpot": tpot[out > 1], "e2e": e2e}


def simulate_run(run: EngineRun, pre_first_token_s: float = 0.0,
                 peer_to_peer: bool | None = None) -> dict[str, np.ndarray]:
    """Replay ``run`` in virtual time; latencies per request as the run measured them.

    ``pre_first_token_s`` is added to each TTFT and E2E (a server-side cost before the first
    token that the engine's own timestamps do not contain: 0 for these runs). A run of
    several data-parallel ranks (the Qwen3-30B-A3B one: two, experts split whole over them)
    replays on the data-parallel engine (:mod:`chunktune.sim.engine.data_parallel`); raises
    SpecError for what that does not model. ``peer_to_peer``: the node's peer-to-peer path
    between its PCIe GPUs (:func:`chunktune.core.gpus.with_peer_to_peer`; the runs' hosts do
    not record theirs: None, not stated)."""
    args = EngineArgs(max_num_batched_tokens=run.max_num_batched_tokens,
                      max_num_seqs=run.max_num_seqs,
                      max_model_len=run.max_model_len or 32768,
                      gpu_memory_utilization=0.9, tensor_parallel_size=run.tp,
                      num_gpu_blocks_override=run.kv_blocks,
                      data_parallel_size=run.dp, enable_expert_parallel=run.ep)
    model = resolve_model(run.model)
    gpu = with_peer_to_peer(resolve_gpu(run.gpu), peer_to_peer)
    eng: Engine | DataParallelEngine = (
        build_data_parallel_engine(args, model, gpu, LLMSS_VERSION) if run.dp > 1
        else build_engine(args, model, gpu, LLMSS_VERSION))
    specs = [RequestSpec(i, a, p, o, 0) for i, (a, p, o, _, _) in enumerate(run.requests)]
    res = eng.replay(specs, record_steps=False)
    done = [r for r in res.requests if r.finish_time >= 0 and r.first_token >= 0]
    ttft = np.array([r.first_token - r.arrival for r in done]) + pre_first_token_s
    e2e = np.array([r.finish_time - r.arrival for r in done]) + pre_first_token_s
    out = np.array([r.num_output for r in done], float)
    tpot = (e2e - ttft) / np.maximum(out - 1, 1)
    return {"ttft": ttft, "tpot": tpot[out > 1], "e2e": e2e}


def compare_run(run: EngineRun, pre_first_token_s: float = 0.0) -> list[LatencyComparison]:
    meas = measured_latencies(run)
    pred = simulate_run(run, pre_first_token_s)
    return [LatencyComparison(run.name, m, q, float(np.percentile(meas[m], q)),
                              float(np.percentile(pred[m], q)))
            for m in ("ttft", "tpot", "e2e") for q in (50, 99)]
