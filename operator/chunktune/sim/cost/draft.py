"""The drafter's own time in a step with speculative decoding
(:mod:`chunktune.core.speculative`).

After the target model's forward the drafter proposes K tokens for every request that sampled
(vLLM 0.32 ``GPUModelRunner.propose_draft_token_ids``):

- ``ngram``: a CPU-side n-gram match over the request's tokens (``NgramProposer``): no GPU
  time; the simulator counts none.
- ``eagle`` / ``eagle3`` / ``mtp``: a head of one decoder layer of the target's shape
  (``EagleProposer.propose``): a first pass over the step's scheduled tokens (the target's
  hidden states), then K - 1 passes of one row per sampling request, each with the head's
  logits.
- ``draft_model``: the same K passes through the draft model itself.

Each pass is costed by the target's step-time model (:class:`StepCostModel`, GPU part only)
built for the drafter's network, with what the server runs it with: the target's KV cache
dtype (vLLM's drafter layers share the engine's ``CacheConfig``), CUDA graphs or
``--enforce-eager`` (vLLM 0.33 ``llm_base_proposer.initialize_cudagraph_keys``: piecewise graphs
unless the engine runs without them),
tensor and expert parallelism (its layers are built under the same ``ParallelConfig``), the
vLLM environment and release (which pick its MoE and NVFP4 kernels). Not carried: the
all-reduce + RMSNorm fusion of a compiled target (the drafter's all-reduces are priced
unfused).
"""

from __future__ import annotations

from chunktune.core.models import ModelConfig
from chunktune.core.speculative import SpeculativeConfig
from chunktune.sim.cost.step_time import StepCostModel


class DraftCost:
    """Seconds the drafter adds to a step."""

    def __init__(self, spec: SpeculativeConfig, net: StepCostModel | None) -> None:
        self.spec = spec
        self.net = net

    @classmethod
    def build(cls, spec: SpeculativeConfig, target: StepCostModel,
              net: ModelConfig | None) -> DraftCost:
        """The drafter of ``spec`` beside ``target``: ``net`` its network (None for ngram:
        :func:`chunktune.sim.engine.memory.drafter`)."""
        if net is None:
            return cls(spec, None)
        # --quantization fp8 quantizes the drafter too; NVFP4 is a checkpoint's own format
        # (no online NVFP4): the drafter runs its own
        dtype = None if target.weight_dtype == "nvfp4" else target.weight_dtype
        return cls(spec, StepCostModel(
            net, target.gpu, target.tp, max_tokens=target.max_tokens,
            enforce_eager=target.enforce_eager, interconnect=target.interconnect,
            weight_dtype=dtype, kv_dtype_bytes=target.kv_dtype_bytes,
            expert_parallel=target.expert_parallel and net.is_moe, vllm_env=target.vllm_env,
            vllm_version=target.vllm_version))

    def time(self, num_tokens: int, num_sampling: int, prefill_chunks: list[tuple[int, int]],
             num_decodes: int, decode_context_tokens: int) -> float:
        """The drafter's passes after a step of ``num_tokens`` scheduled tokens in which
        ``num_sampling`` requests sampled."""
        net = self.net
        if net is None or not num_sampling:
            return 0.0
        first = net.forward_time(num_tokens, num_sampling, prefill_chunks, num_decodes,
                                 decode_context_tokens)
        rest = net.forward_time(num_sampling, num_sampling, [], num_sampling,
                                decode_context_tokens + num_sampling)
        return first + (self.spec.num_speculative_tokens - 1) * rest
