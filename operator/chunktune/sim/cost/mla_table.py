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

from chunktune.core.gpus import GPU, resolve_gpu
from chunktune.sim.cost.allreduce_backends import compute_capability
from chunktune.sim.cost.coefficients import NEAREST, load_document

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


#: Bytes a weight of the MLA module's projections takes, per format (block FP8's and NVFP4's
#: scales: one per 128 x 128 block, negligible; one e4m3 byte per 16 weights).
WEIGHT_BYTES = {"bf16": 2.0, "fp8_block": 1.0, "nvfp4": 0.5 + 1 / 16}


def stream_bytes(gemm: str, kv: str, heads: int, batch: int, context: int) -> float:
    """What one call of the MLA module (:data:`MLA_SHAPE`) reads: its projections' weights at
    ``heads`` query heads (q_a and the fused kv_a whole, q_b, the absorbed kv_b and o_proj
    per head) and the latent cache of ``batch`` decodes of ``context`` tokens (kv_lora_rank
    + qk_rope_head_dim elements a token)."""
    d = MLA_SHAPE
    latent = d["kv_lora_rank"] + d["qk_rope_head_dim"]
    weights = (d["hidden_size"] * (d["q_lora_rank"] + latent)
               + heads * (d["q_lora_rank"] * (d["qk_nope_head_dim"] + d["qk_rope_head_dim"])
                          + d["kv_lora_rank"] * (d["qk_nope_head_dim"] + d["v_head_dim"])
                          + d["v_head_dim"] * d["hidden_size"]))
    return weights * WEIGHT_BYTES[gemm] + batch * context * latent * (1 if kv == "fp8" else 2)


def hbm_us(gpu: GPU, nbytes: float) -> float:
    """Microseconds ``gpu`` streams ``nbytes`` from HBM at its data-sheet bandwidth in a table
    that replays one module call: none where they fit in its L2 (they stay there from one
    replay to the next), all of them where they do not (a cyclic read larger than the cache
    evicts what the next pass needs)."""
    return 0.0 if nbytes <= gpu.l2_mib * 2**20 else nbytes / (gpu.hbm_tb_s * 1e6)


def lent_decode_us(us: float, floor_us: float, floor_bytes: float, nbytes: float,
                   lender: GPU, gpu: GPU) -> float:
    """One MLA decode call's microseconds on ``gpu`` from ``lender``'s table: ``us`` the
    lender's time for the call, which reads ``nbytes`` (:func:`stream_bytes`); ``floor_us``
    the lender's fastest call of the same formats and heads, which reads ``floor_bytes``.
    Both calls' reading from HBM (:func:`hbm_us`, at the lender's bandwidth and L2) is taken
    off and put back at ``gpu``'s: the floor's rest (the launch floor) kept, the call's time
    above the floor beyond what it reads scaled by HBM bandwidth. The floor's own reading is
    the floor's: a call whose weights stream from HBM has that reading in its floor too, and
    taking it off only the call would count it twice."""
    above = max(us - floor_us - (hbm_us(lender, nbytes) - hbm_us(lender, floor_bytes)), 0.0)
    return (floor_us - hbm_us(lender, floor_bytes) + above * lender.hbm_tb_s / gpu.hbm_tb_s
            + hbm_us(gpu, nbytes))


def lent_prefill_us(us: float, floor_us: float, gemm: str, lender: GPU, gpu: GPU) -> float:
    """One MLA prefill call's microseconds on ``gpu`` from ``lender``'s table: the lender's
    floor (its fastest prefill of the same formats and heads: launch-bound) kept, its time
    above the floor scaled by the two GPUs' dense peaks of the projections' format (FP8's
    where both have FP8 tensor cores and the projections are block FP8, else bf16's)."""
    fp8 = gemm.startswith("fp8") and gpu.fp8_tflops > 0 and lender.fp8_tflops > 0
    ratio = (lender.fp8_tflops / gpu.fp8_tflops if fp8
             else lender.bf16_tflops / gpu.bf16_tflops)
    return floor_us + (us - floor_us) * ratio


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


def has_table(gpu: str) -> bool:
    """Whether ``gpu`` has measured MLA module curves of its own."""
    return any(k[0] == gpu for k in _load())


def table_lender(gpu: GPU) -> str | None:
    """The GPU whose MLA tables ``gpu`` borrows (:meth:`MlaTable.lender`, whatever the heads
    and formats), None where it has its own or none lends."""
    if has_table(gpu.name):
        return None
    return next((o for o in NEAREST.get(gpu.name, ()) if has_table(o)
                 and MlaTable.lends(resolve_gpu(o), gpu)), None)


def borrowing() -> dict[str, float | str] | None:
    """The MLA module held out per measured GPU as a GPU without a table borrows one
    (``mla_borrowing`` in the coefficients document: decode and prefill, median over GPUs)."""
    rule: dict[str, float | str] | None = load_document().get("mla_borrowing")
    return rule


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

    @staticmethod
    def lender(gpu: GPU, gemm: str, kv: str, heads: int) -> str | None:
        """The GPU whose table ``gpu`` borrows for these where it has none of its own: the
        nearest (``coefficients.NEAREST``) with one, of its compute capability family (vLLM
        picks its MLA backend by it: FlashMLA on 9.x, CUTLASS MLA and TRT-LLM on 10.x, Triton
        elsewhere; the B300 and GB200 borrow the B200's, the H100 PCIe the H100 SXM's) and
        memory kind (the rule reads what a call streams from HBM beyond L2); None where none
        has it."""
        if MlaTable.find(gpu.name, gemm, kv, heads) is not None:
            return None
        return next((o for o in NEAREST.get(gpu.name, ())
                     if MlaTable.lends(resolve_gpu(o), gpu)
                     and MlaTable.find(o, gemm, kv, heads) is not None), None)

    @staticmethod
    def lends(lender: GPU, gpu: GPU) -> bool:
        """Whether ``lender``'s tables may stand in for ``gpu``'s (:meth:`lender`): the same
        compute capability family and memory kind."""
        return (lender.memory == gpu.memory and compute_capability(lender).split(".")[0]
                == compute_capability(gpu).split(".")[0])

    @staticmethod
    def lent(gpu: GPU, gemm: str, kv: str, heads: int) -> MlaTable | None:
        """The lender's table (:meth:`lender`) as ``gpu`` would run it, scaled by the two data
        sheets as ``kernel_report.mla_report`` holds each measured GPU out by: every decode
        point :func:`lent_decode_us` from the lender's fastest decode of these formats and
        heads, every prefill point :func:`lent_prefill_us` from its fastest prefill; None
        where there is no lender."""
        src = MlaTable.lender(gpu, gemm, kv, heads)
        if src is None:
            return None
        theirs = MlaTable.find(src, gemm, kv, heads)
        assert theirs is not None
        lender = resolve_gpu(src)
        gen = [(b, [math.exp(v) for v in logus]) for b, logus in theirs.gen]
        floor_us, floor_bytes = min(
            (u, stream_bytes(gemm, kv, heads, b, STEPS[i]))
            for b, us in gen for i, u in enumerate(us))
        ctx = [math.exp(v) for v in theirs.ctx]
        ctx_floor = min(ctx)
        return MlaTable(
            [(b, [math.log(lent_decode_us(u, floor_us, floor_bytes,
                                          stream_bytes(gemm, kv, heads, b, STEPS[i]),
                                          lender, gpu)) for i, u in enumerate(us)])
             for b, us in gen],
            [math.log(lent_prefill_us(u, ctx_floor, gemm, lender, gpu)) for u in ctx])

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
