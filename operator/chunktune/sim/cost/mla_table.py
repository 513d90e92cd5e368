"""MLA attention layers timed from the GPU's measured MLA module (AIConfigurator's vLLM tables).

Multi-head latent attention (DeepSeek-V2/V3/R1, Kimi-K2.x: vLLM 0.33 ``deepseek_v2.py``,
``DeepseekV2MLAAttention`` over ``MLACommonImpl``) runs a layer's attention as one module: the
query down- and up-projections, the fused KV down-projection into the latent cache, the
attention (decodes through the absorbed latent path, prefills through the expanded one) and
the output projection. AIConfigurator timed that whole module per GPU and vLLM release
(0.19-0.24; DeepSeek-V3's dimensions: hidden 7168, q_lora_rank 1536, kv_lora_rank 512, rope
64, nope 128, value 128, which Kimi-K2.x share) for the query heads on one rank, the
projections' format (bf16, block FP8, NVFP4) and the KV cache's (bf16, FP8):

- ``mla_generation_module_perf``: ``batch_size`` decodes with ``step`` tokens of context each;
- ``mla_context_module_perf``: ``batch_size`` prompts of ``isl`` tokens prefilled from scratch
  (several prefill backends timed: the fastest counts, as for the MoE table).

The step time (:class:`chunktune.sim.cost.step_time.StepCostModel`) prices an MLA layer's
decodes by the generation table at the batch's decode count and mean context, and each
prefill chunk of ``c`` tokens after ``p`` computed ones as ``ctx(p + c) - ctx(p)`` (never below
``ctx(c)``): what prefilling the first ``p + c`` tokens costs beyond the first ``p``. Both are
bilinear in log time over the tables' log grids (proportional past the largest measured count).
The newest release's tables are read (vLLM's own backend selection, as for the MoE table).

The H100's and H200's tables ran the module's RMSNorms and rotary embedding through their
native PyTorch chains (mean, pow, rsqrt, mul: a dozen small kernels a call), which a served
engine never runs (torch.compile fuses them; eager regions call vLLM's CUDA kernels).
AIConfigurator re-collected the B200's tables with vLLM's fused ops (its commits bb300a327 and
6c72579ef, ai-dynamo/aiconfigurator#1423: 8 heads, 4 decodes: 77 -> 34 us) and not the
Hopper ones, which still time the chain: 83-92 us a layer at a few decodes on both the H100
and the H200, where the B200's first collection timed 70-77 us. The chain's cost, the B200's
first collection less its re-collection (:data:`NORM_CHAIN_PATH`: 37-62 us for 1-64 decodes,
flat over context; growing with the prompt for a prefill), is taken off the Hopper tables
(:func:`measured_us`): small launch-bound kernels, their time carried over unscaled (a
prefill's long chains read more bytes, which the H200's slower HBM would take longer over:
the correction is then the smaller). What is left at 128 heads, one decode, is 122 us on the
H200 against 94 us on the B200: 28 us apart where streaming the module's 374 MB of bf16
weights takes 78 us against 47 us.

Committed derivatives: ``data/aic_mla_us.csv`` (``python -m chunktune.sim.cost.fit.mla_derive
--data ../shared/data`` rewrites it) and ``data/aic_mla_norm_chain_us.csv`` (``... mla_derive
--norm-chain PRE --data ../shared/data``: :mod:`chunktune.sim.cost.fit.mla_derive` says what
``PRE`` holds).
"""

from __future__ import annotations

import bisect
import csv
import math
from functools import lru_cache
from pathlib import Path

DATA = Path(__file__).with_name("data")
MLA_PATH = DATA / "aic_mla_us.csv"
#: The native norm chain's cost per module call (see the module docstring), measured on the
#: B200: the first collection less the re-collection with vLLM's fused ops.
NORM_CHAIN_PATH = DATA / "aic_mla_norm_chain_us.csv"
#: The GPUs whose committed module tables ran the native norm chain (AIConfigurator's
#: ``collection_meta.yaml`` names no ``norm_dispatch`` for them): their tables less the chain.
NATIVE_NORM_CHAIN_GPUS = frozenset({"h100-sxm", "h200"})
#: The dimensions the tables were timed at (DeepSeek-V3's): a model's MLA must have them.
MLA_SHAPE = {"hidden_size": 7168, "q_lora_rank": 1536, "kv_lora_rank": 512,
             "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128}
#: The grids kept: decode batch and context (generation), prompt length (context, batch 1).
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
STEPS = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536,
         131072)
PROMPTS = (1, 16, 32, 64, 128, 256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 10240,
           12288, 16384, 32768)

#: gpu, "gen"/"ctx", projections' format, KV format, heads on the rank, decode batch (0: ctx)
Key = tuple[str, str, str, str, int, int]


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return list(csv.DictReader(line for line in fh if not line.startswith("#")))


@lru_cache(maxsize=1)
def norm_chain() -> dict[tuple[str, str, str, int, int], list[float]]:
    """The native norm chain's microseconds (:data:`NORM_CHAIN_PATH`) per kind, projections'
    and KV format, heads and decode batch (0: a prefill): one figure for decodes, one per
    prompt of :data:`PROMPTS` for a prefill."""
    return {(r["kind"], r["gemm"], r["kv"], int(r["heads"]), int(r["batch"])):
            [float(u) for u in r["us"].split()] for r in _rows(NORM_CHAIN_PATH)}


def measured_us(key: Key, us: list[float]) -> list[float]:
    """A committed curve as the served module runs it: on a GPU whose table ran the native
    norm chain (:data:`NATIVE_NORM_CHAIN_GPUS`), less that chain as the B200 measured it
    (small, launch-bound kernels: their time carried over unscaled); else as committed."""
    if key[0] not in NATIVE_NORM_CHAIN_GPUS:
        return us
    chain = norm_chain()[key[1:]]
    return [u - chain[0 if len(chain) == 1 else i] for i, u in enumerate(us)]


@lru_cache(maxsize=1)
def _load() -> dict[Key, list[float]]:
    out: dict[Key, list[float]] = {}
    for r in _rows(MLA_PATH):
        key = (r["gpu"], r["kind"], r["gemm"], r["kv"], int(r["heads"]), int(r["batch"]))
        out[key] = [math.log(u) for u in measured_us(key, [float(u) for u in r["us"].split()])]
    return out


def _interp(grid: tuple[int, ...], logus: list[float], x: float) -> float:
    """Microseconds at ``x``: linear in log time over log ``x`` inside the grid, proportional
    to ``x`` past its end, the first point below it."""
    if x >= grid[-1]:
        return math.exp(logus[-1]) * x / grid[-1]
    if x <= grid[0]:
        return math.exp(logus[0])
    i = bisect.bisect_right(grid, x) - 1
    f = (math.log(x) - math.log(grid[i])) / (math.log(grid[i + 1]) - math.log(grid[i]))
    return math.exp(logus[i] + f * (logus[i + 1] - logus[i]))


class MlaTable:
    """One GPU's MLA module for one model on one rank: seconds of a layer's decodes and of a
    prefill chunk (see the module docstring)."""

    def __init__(self, gen: list[tuple[int, list[float]]], ctx: list[float]) -> None:
        self.gen = gen
        self.ctx = ctx
        self._batches = tuple(b for b, _ in gen)

    @staticmethod
    def find(gpu: str, gemm: str, kv: str, heads: int) -> MlaTable | None:
        """The table for these (the decode batches measured over the whole context grid), or
        None where the GPU's tables lack them."""
        t = _load()
        gen = [(b, t[(gpu, "gen", gemm, kv, heads, b)]) for b in BATCHES
               if (gpu, "gen", gemm, kv, heads, b) in t]
        ctx = t.get((gpu, "ctx", gemm, "bf16", heads, 0))
        if ctx is None or len(gen) < 2:
            return None
        return MlaTable(gen, ctx)

    def decode_s(self, decodes: int, context: float) -> float:
        """``decodes`` decodes with ``context`` tokens of context each (mean): bilinear in log
        time over log batch and log context; past the largest measured batch, proportional
        to the batch."""
        if decodes <= 0:
            return 0.0
        bs = self._batches
        if decodes >= bs[-1]:
            return _interp(STEPS, self.gen[-1][1], context) * decodes / bs[-1] * 1e-6
        i = max(0, bisect.bisect_right(bs, decodes) - 1)
        lo = math.log(_interp(STEPS, self.gen[i][1], context))
        if decodes <= bs[0]:
            return math.exp(lo) * 1e-6
        hi = math.log(_interp(STEPS, self.gen[i + 1][1], context))
        f = (math.log(decodes) - math.log(bs[i])) / (math.log(bs[i + 1]) - math.log(bs[i]))
        return math.exp(lo + f * (hi - lo)) * 1e-6

    def prefill_s(self, chunk: int, computed: int) -> float:
        """A prefill chunk of ``chunk`` tokens after ``computed`` ones."""
        whole = _interp(PROMPTS, self.ctx, computed + chunk)
        before = _interp(PROMPTS, self.ctx, computed) if computed else 0.0
        return max(whole - before, _interp(PROMPTS, self.ctx, chunk)) * 1e-6
