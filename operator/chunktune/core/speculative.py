"""``--speculative-config``: what the simulator takes of vLLM's speculative decoding.

vLLM takes the setting as one JSON object (``vllm/config/speculative.py::SpeculativeConfig``);
the simulator models the methods of :data:`METHODS` and, of each, only what changes the
schedule and the step time:

- **the drafts a decode verifies.** After every step in which a request sampled a token, the
  drafter proposes ``num_speculative_tokens`` (K) tokens for it (``update_draft_token_ids``;
  prefill chunks that sampled nothing get none). The scheduler then asks ``1 + K`` tokens for
  the decode (``num_tokens_with_spec - num_computed_tokens``), cut by the budget like any
  request's; the step verifies them and the request keeps ``1 + accepted`` tokens: the
  rejected ones roll ``num_computed_tokens`` back (``Scheduler.update_from_output``).
  An n-gram drafter proposes only when the prompt holds a match; the simulator assumes it
  always proposes K (its budget cost is then an upper bound, its acceptance the class's).
- **the per-request draft slots** (:meth:`SpeculativeConfig.draft_slots`): vLLM 0.31-0.34
  charge every scheduled request ``num_new_tokens + max_num_new_slots_for_drafting`` against
  ``max_num_batched_tokens`` (``input_budget`` in ``Scheduler.schedule``), stop scheduling
  once ``input_budget <= draft_slots`` and cap each request at ``input_budget - draft_slots``.
  The slots are 1 for a (non-parallel) draft model, 0 for ngram, EAGLE, EAGLE-3 and MTP
  (``SpeculativeConfig.max_num_new_slots_for_drafting`` in 0.31-0.33;
  ``SpeculatorConfig.max_num_new_slots_for_drafting`` in 0.34, 1 only for
  ``standalone_ar``). So a step schedules at most ``max_num_batched_tokens - draft_slots x
  scheduled requests`` tokens; the budget the decodes' ``K`` drafts take is what starves the
  prefill chunks.
- **the KV lookahead** (:meth:`SpeculativeConfig.lookahead`): the drafter writes KV past the
  verified tokens, so ``allocate_slots`` reserves ``num_lookahead_tokens`` more: K for EAGLE,
  EAGLE-3, MTP and a draft model, 0 for ngram (``VllmConfig.num_lookahead_tokens``).
- **the draft's own cost**: ngram runs on the host (nothing on the GPU); EAGLE, EAGLE-3 and MTP
  run one decoder layer of the target's shape; a draft model runs its own forward
  (:mod:`chunktune.sim.cost.draft`).

Parallel drafting (P-EAGLE, PARD), DFlash and dynamic K (``num_speculative_tokens_per_batch_size``)
are refused by name: the simulator does not model them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from chunktune.core.errors import SpecError

#: The ``method`` values the simulator models.
METHODS = ("ngram", "eagle", "eagle3", "mtp", "draft_model")
#: Keys vLLM takes that change nothing the simulator models (the n-gram matcher's window,
#: where the draft weights come from).
IGNORED_KEYS = frozenset({"prompt_lookup_max", "prompt_lookup_min", "revision",
                          "code_revision", "quantization", "draft_tensor_parallel_size"})
#: The largest K the simulator takes (vLLM has no bound; a larger value is a typo).
MAX_SPECULATIVE_TOKENS = 64
FLAG = "--speculative-config"


@dataclass(frozen=True)
class SpeculativeConfig:
    """The parts of vLLM's ``SpeculativeConfig`` the simulator models."""

    method: str
    num_speculative_tokens: int
    model: str | None = None
    """The draft model (``draft_model``: a catalog name; EAGLE/MTP heads: informational)."""

    @property
    def draft_slots(self) -> int:
        """vLLM's ``max_num_new_slots_for_drafting`` (0.31-0.34): 1 for a draft model, else 0."""
        return 1 if self.method == "draft_model" else 0

    @property
    def lookahead(self) -> int:
        """vLLM's ``num_lookahead_tokens``: KV slots reserved past the scheduled tokens."""
        return 0 if self.method == "ngram" else self.num_speculative_tokens

    def with_tokens(self, k: int) -> SpeculativeConfig:
        return SpeculativeConfig(self.method, k, self.model)


def parse(text: str, field: str = FLAG) -> SpeculativeConfig:
    """A ``--speculative-config`` JSON object. Raises :class:`SpecError` naming ``field`` and
    the key for what vLLM refuses or the simulator does not model."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(f"is not a JSON object ({e.msg} at character {e.pos}); give e.g. "
                        "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'",
                        field=field) from e
    if not isinstance(raw, dict):
        raise SpecError("must be a JSON object such as "
                        "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'", field=field)
    return from_mapping(raw, field)


def from_mapping(raw: dict[str, Any], field: str = FLAG) -> SpeculativeConfig:
    problems: list[tuple[str, str]] = []
    method = raw.get("method")
    if method not in METHODS:
        problems.append((f"{field}.method", f"the simulator models {', '.join(METHODS)} "
                         f"(got {method!r})"))
    k = raw.get("num_speculative_tokens")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        problems.append((f"{field}.num_speculative_tokens",
                         f"must be an integer from 1 to {MAX_SPECULATIVE_TOKENS} (got {k!r})"))
    model = raw.get("model")
    if model is not None and not isinstance(model, str):
        problems.append((f"{field}.model", f"must be a model name (got {model!r})"))
    if method == "draft_model" and not model:
        problems.append((f"{field}.model", "the draft_model method needs the draft model "
                         "(a catalog name)"))
    for key in raw:
        if key in ("method", "num_speculative_tokens", "model") or key in IGNORED_KEYS:
            continue
        problems.append((f"{field}.{key}", "the simulator does not model this key"))
    if problems:
        raise SpecError(problems)
    return SpeculativeConfig(str(method), int(k), model)  # type: ignore[arg-type]


def resolve(text: str | None, num_speculative_tokens: int | None) -> SpeculativeConfig | None:
    """The speculative decoding an engine runs: ``--speculative-config`` with K replaced by
    the searched ``num-speculative-tokens`` where given (0: speculative decoding off), or
    None. Raises :class:`SpecError`."""
    if text is None:
        if num_speculative_tokens:
            raise SpecError("num-speculative-tokens sets K inside --speculative-config: give "
                            "--speculative-config with a method in engine.args",
                            field="num-speculative-tokens")
        return None
    spec = parse(text)
    if num_speculative_tokens is None:
        return spec
    if num_speculative_tokens == 0:
        return None
    return spec.with_tokens(num_speculative_tokens)


def to_text(spec: SpeculativeConfig) -> str:
    """The config as ``--speculative-config`` JSON (the keys the simulator models)."""
    raw: dict[str, Any] = {"method": spec.method,
                           "num_speculative_tokens": spec.num_speculative_tokens}
    if spec.model is not None:
        raw["model"] = spec.model
    return json.dumps(raw, separators=(",", ":"))


def acceptance_from_counters(drafts: float | None, draft_tokens: float | None,
                             accepted: float | None) -> float | None:
    """The per-token acceptance behind vLLM's ``spec_decode_num_drafts`` /
    ``_num_draft_tokens`` / ``_num_accepted_tokens`` counters (their increase over a window):
    the ``a`` at which ``drafts`` verifications of ``K = draft_tokens / drafts`` tokens each
    would accept ``accepted`` (:func:`expected_accepted`, solved by bisection). None where a
    counter is missing or nothing was drafted."""
    if not drafts or not draft_tokens or accepted is None or drafts <= 0 or draft_tokens <= 0:
        return None
    k = max(1, round(draft_tokens / drafts))
    target = min(max(accepted / drafts, 0.0), float(k))
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if expected_accepted(mid, k) < target:
            low = mid
        else:
            high = mid
    return round((low + high) / 2, 4)


def expected_accepted(acceptance: float, drafts: int) -> float:
    """Expected accepted tokens of ``drafts`` draft tokens when each is accepted with
    probability ``acceptance`` given the ones before it were (acceptance stops at the first
    rejection): ``a + a^2 + ... + a^drafts``."""
    total, p = 0.0, 1.0
    for _ in range(drafts):
        p *= acceptance
        total += p
    return total
