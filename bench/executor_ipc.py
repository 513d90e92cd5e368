"""What vLLM's multiprocess executor adds to a synchronous step at TP > 1 (issue 32), timed on
this machine's CPU with the release's own message queue.

Usage: ``python bench/executor_ipc.py [--vllm-src DIR] [--batch 1,8,32,128,256,512]
[--readers 1,2] [--steps 2000]``.

vLLM 0.12's ``EngineCore.step`` (``vllm/v1/engine/core.py``) calls ``execute_model`` and then
``sample_tokens``; at TP > 1 ``MultiprocExecutor`` (``vllm/v1/executor/multiproc_executor.py``)
sends each as a pickled ``(method, args, kwargs, output_rank)`` through a shared-memory
``MessageQueue`` (``vllm/distributed/device_communicators/shm_broadcast.py``) that every worker
reads, and only rank 0 answers (``None``, then its ``ModelRunnerOutput``). The messages here have
the fields of 0.12's ``SchedulerOutput`` / ``CachedRequestData`` / ``ModelRunnerOutput`` for a
decode-only step of B requests. Prints the serialization of one step's two RPCs (CPU time,
least and median of 7 repeats: what the step's critical path must do whatever the load) and,
with ``--vllm-src`` (an unzipped vLLM wheel: ``pip download vllm==0.12.0 --no-deps``), the round
trip through that release's ``MessageQueue`` to ``--readers`` worker processes (wall time; on a
loaded machine the readers' wake-up dominates it). Not a GPU host's CPU."""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing as mp
import pickle
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any


@dataclass
class CachedRequestData:
    req_ids: list[str]
    resumed_req_ids: set[str]
    new_token_ids: list[list[int]]
    all_token_ids: dict[str, list[int]]
    new_block_ids: list[tuple[list[int], ...] | None]
    num_computed_tokens: list[int]
    num_output_tokens: list[int]


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[Any]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict[str, list[int]]
    scheduled_encoder_inputs: dict[str, list[int]]
    num_common_prefix_blocks: list[int]
    finished_req_ids: set[str]
    free_encoder_mm_hashes: list[str]
    preempted_req_ids: set[str] | None = None
    pending_structured_output_tokens: bool = False
    kv_connector_metadata: Any = None
    ec_connector_metadata: Any = None


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]]
    logprobs: Any
    prompt_logprobs_dict: dict[str, Any]
    pooler_output: list[Any]
    kv_connector_output: Any = None
    ec_connector_output: Any = None
    num_nans_in_logits: Any = None


def step_messages(batch: int, step: int) -> tuple[SchedulerOutput, ModelRunnerOutput]:
    """A decode-only step of ``batch`` requests at 4,000 tokens: one new KV block every 16."""
    ids = [f"cmpl-{uuid.UUID(int=i).hex}-0" for i in range(batch)]
    blocks: list[tuple[list[int], ...] | None] = [
        ([step + i],) if (step + i) % 16 == 0 else None for i in range(batch)]
    cached = CachedRequestData(ids, set(), [], {}, blocks, [4000 + step] * batch,
                               [step] * batch)
    so = SchedulerOutput([], cached, dict.fromkeys(ids, 1), batch, {}, {}, [0], set(), [])
    mro = ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, [[1234] for _ in ids],
                            None, {}, [])
    return so, mro


def serialization_s(batch: int) -> tuple[float, float]:
    """(least, median) CPU seconds to pickle and unpickle one step's two RPCs and replies."""
    so, mro = step_messages(batch, 0)
    msgs = (("execute_model", (so,), {}, 0), (0, None), ("sample_tokens", (None,), {}, 0),
            (0, mro))
    reps = []
    for _ in range(7):
        t, n = time.process_time(), 0
        while time.process_time() - t < 0.3:
            for m in msgs:
                pickle.loads(pickle.dumps(m, protocol=pickle.HIGHEST_PROTOCOL))
            n += 1
        reps.append((time.process_time() - t) / n)
    return min(reps), statistics.median(reps)


def load_shm_broadcast(src: Path) -> ModuleType:
    """The release's ``shm_broadcast.py``, importing the installed vLLM for its helpers (the
    one environment variable it reads at import that newer releases renamed is set to its
    0.12 default, off)."""
    text = (src / "vllm/distributed/device_communicators/shm_broadcast.py").read_text()
    text = text.replace("envs.VLLM_SLEEP_WHEN_IDLE", "False")
    spec = importlib.util.spec_from_loader("release_shm_broadcast", loader=None)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["release_shm_broadcast"] = mod
    exec(compile(text, "release_shm_broadcast", "exec"), mod.__dict__)
    return mod


def _worker(src: Path, handle: Any, replies: Any, rank: int, batch: int) -> None:
    shm = load_shm_broadcast(src)
    mq = shm.MessageQueue.create_from_handle(handle, rank)
    resp = shm.MessageQueue(1, 1) if rank == 0 else None
    if resp is not None:
        replies.put(resp.export_handle())
    mq.wait_until_ready()
    if resp is not None:
        resp.wait_until_ready()
    _, mro = step_messages(batch, 0)
    while True:
        method, _args, _kw, out_rank = mq.dequeue(indefinite=True)
        if method == "stop":
            return
        if rank == out_rank and resp is not None:
            resp.enqueue((0, None if method == "execute_model" else mro))


def round_trip_s(src: Path, readers: int, batch: int, steps: int) -> tuple[float, float]:
    """(median, 10th percentile) wall seconds of one step's two RPCs through the release's
    ``MessageQueue`` to ``readers`` worker processes."""
    shm = load_shm_broadcast(src)
    ctx = mp.get_context("fork")
    mq = shm.MessageQueue(readers, readers)
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(src, mq.export_handle(), q, r, batch))
             for r in range(readers)]
    for p in procs:
        p.start()
    resp = shm.MessageQueue.create_from_handle(q.get(), 0)
    mq.wait_until_ready()
    resp.wait_until_ready()
    wall = []
    for s in range(steps):
        so, _ = step_messages(batch, s)
        t = time.perf_counter()
        mq.enqueue(("execute_model", (so,), {}, 0))
        resp.dequeue()
        mq.enqueue(("sample_tokens", (None,), {}, 0))
        resp.dequeue()
        wall.append(time.perf_counter() - t)
    mq.enqueue(("stop", (), {}, None))
    for p in procs:
        p.join()
    wall.sort()
    return statistics.median(wall), wall[len(wall) // 10]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm-src", type=Path, help="an unzipped vLLM wheel (for the round trip)")
    ap.add_argument("--batch", default="1,8,32,128,256,512")
    ap.add_argument("--readers", default="1,2")
    ap.add_argument("--steps", type=int, default=2000)
    a = ap.parse_args()
    batches = [int(b) for b in a.batch.split(",")]
    for b in batches:
        so, mro = step_messages(b, 0)
        least, med = serialization_s(b)
        print(f"B={b:4d}: pickled SchedulerOutput {len(pickle.dumps(so, protocol=5)):6d} B, "
              f"ModelRunnerOutput {len(pickle.dumps(mro, protocol=5)):6d} B; two RPCs' "
              f"serialization {least * 1e6:6.1f} us CPU (median {med * 1e6:6.1f})")
    if a.vllm_src is None:
        return
    for n in (int(r) for r in a.readers.split(",")):
        for b in batches:
            med, p10 = round_trip_s(a.vllm_src, n, b, a.steps)
            print(f"readers={n} B={b:4d}: two RPCs' round trip {med * 1e6:6.0f} us wall "
                  f"(10th percentile {p10 * 1e6:6.0f})")


if __name__ == "__main__":
    main()
