"""The scheduler rules that differ between vLLM releases (``core.vllm_release.SCHEDULERS``),
on the simulator's side; ``tests/sim/releases`` checks each against the release's own
scheduler, step by step."""

from __future__ import annotations

import pytest

from chunktune.core.engine_args import EngineArgs, resolve
from chunktune.core.errors import SpecError
from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.core.vllm_release import (
    NEWEST_SCHEDULER,
    SCHEDULERS,
    scheduler_note,
    scheduler_release,
)
from chunktune.sim.engine.scheduler import Scheduler
from tests.sim.releases.cases import NAMED, sim_trace

V18, V19, V23, V28, V31, V32, V33, V34 = (r.version for r in SCHEDULERS)
CASE = {c.name: c for c in NAMED}


def steps(name: str, version: tuple[int, int, int] | None) -> list[tuple[int, int, int, int]]:
    return sim_trace(CASE[name], version).steps


def test_each_version_runs_the_scheduler_of_its_release_or_the_nearest_checked():
    assert scheduler_release(None) is NEWEST_SCHEDULER
    assert scheduler_release((0, 33, 2)).version == V33
    assert scheduler_release((0, 20, 0)).version == V19  # between two: the older one
    assert scheduler_release((0, 30, 1)).version == V28
    assert scheduler_release((0, 10, 2)).version == V18  # older ones: the oldest checked
    assert scheduler_note((0, 11, 0)) == \
        "vLLM 0.18's for 0.11.0 (older schedulers are not checked)"
    assert scheduler_release((0, 40, 0)) is NEWEST_SCHEDULER
    assert "newest checked" in scheduler_note(None)
    assert scheduler_note((0, 33, 0)) == "vLLM 0.33"


def test_the_prefill_cadence_holds_prefill_from_0_33_and_is_a_no_op_before():
    held, every = steps("prefill_schedule_interval_4", V33), steps(
        "prefill_schedule_interval_1", V33)
    assert steps("prefill_schedule_interval_4", V32) == steps("prefill_schedule_interval_1",
                                                             V32)
    assert held != every
    # decodes run alone in between: steps with decodes and no prompt tokens
    assert sum(1 for s in held if s[1] == 0 and s[3]) > sum(1 for s in every
                                                             if s[1] == 0 and s[3])
    # the prompts take longer to finish: the cadence trades TTFT for ITL
    assert len(held) > len(every)


def test_a_request_preempting_itself_ends_the_running_loop_only_before_0_33():
    assert steps("priority_self_preemption", V33) != steps("priority_self_preemption", V32)
    # 0.34 schedules as 0.33 (its log counts the resumed request as context, see below)
    assert [s[1] + s[3] for s in steps("priority_self_preemption", V34)] == \
        [s[1] + s[3] for s in steps("priority_self_preemption", V33)]


def test_the_log_counts_a_resumed_request_as_context_from_0_34():
    case = CASE["priority_self_preemption"]
    old, new = sim_trace(case, V33), sim_trace(case, V34)
    assert sum(old.preempted) == sum(new.preempted) > 0
    assert sum(s[0] for s in new.steps) > sum(s[0] for s in old.steps)


def test_the_threshold_needs_chunked_prefill_from_0_34():
    old, new = steps("threshold_without_chunking", V33), steps("threshold_without_chunking",
                                                              V34)
    assert old[0] == (2, 2 * 32, 0, 0)  # 0.33 splits both prompts at the threshold
    assert new[0] == (2, 100 + 90, 0, 0)  # 0.34 takes them whole


def test_the_adaptive_threshold_floors_the_cap_at_a_fair_share_of_the_budget():
    adaptive = steps("adaptive_threshold", V32)
    # three requests in the system: 128 // 3 = 42 tokens each at least
    assert adaptive[0] == (3, 42 + 42 + 20, 0, 0)


def test_cache_aware_admission_puts_cached_openings_first_from_0_34():
    on, off = steps("cache_aware_admission", V34), steps("cache_aware_admission_off", V34)
    assert on != off
    with pytest.raises(SpecError, match=r"--cache-aware-admission-window.*since 0\.34"):
        resolve(EngineArgs(cache_aware_admission_window=4), resolve_model("llama-3.1-8b"),
                resolve_gpu("h100-sxm"), version=(0, 33, 0))


def test_a_long_prompt_is_admitted_on_its_first_chunk_before_0_19():
    """vLLM 0.18 admits a waiting prompt when its first chunk's blocks are free, and its
    later chunks preempt the requests decoding beside it; 0.19 (``scheduler_reserve_full_isl``)
    waits until the whole sequence fits, and preempts nothing."""
    old, new = sim_trace(CASE["full_sequence_admission"], V18), sim_trace(
        CASE["full_sequence_admission"], V19)
    assert sum(old.preempted) > 0
    assert sum(new.preempted) == 0
    assert new.steps == sim_trace(CASE["full_sequence_admission"], V34).steps


def test_the_threshold_holds_a_lone_request_before_0_31():
    old, new = steps("lone_request_threshold", V28), steps("lone_request_threshold", V31)
    assert old[0] == (1, 32, 0, 0)
    assert new[0] == (1, 128, 0, 0)


def test_draft_slots_cut_the_budget_once_before_0_28():
    """0.18-0.27 take max_num_seqs x 1 draft slot off a draft model's budget once (48 - 8);
    0.28 charges each scheduled request its slot (48 - 2 for two prompts)."""
    assert steps("spec_draft_k2", V23)[0] == (2, 40, 0, 0)
    assert steps("spec_draft_k2", V28)[0] == (2, 46, 0, 0)


def test_a_new_request_is_admitted_without_its_lookahead_before_0_23():
    old = sim_trace(CASE["admission_lookahead"], V19)
    new = sim_trace(CASE["admission_lookahead"], V23)
    assert sum(old.preempted) > 0
    assert sum(new.preempted) == 0


def test_a_flag_newer_than_the_named_release_is_refused_by_its_own_version():
    """The check reads the release named, not the checked row it runs: vLLM 0.25 has
    --prefill-schedule-interval (0.24) though it runs 0.23's scheduler."""
    model, gpu = resolve_model("llama-3.1-8b"), resolve_gpu("h100-sxm")
    resolve(EngineArgs(prefill_schedule_interval=2), model, gpu, version=(0, 25, 0))
    with pytest.raises(SpecError, match=r"vLLM 0\.23 has no --prefill-schedule-interval"):
        resolve(EngineArgs(prefill_schedule_interval=2), model, gpu, version=(0, 23, 0))
    with pytest.raises(SpecError,
                       match=r"vLLM 0\.30 has no --long-prefill-token-threshold-adaptive"):
        resolve(EngineArgs(long_prefill_token_threshold_adaptive=True), model, gpu,
                version=(0, 30, 0))


def test_a_budget_the_old_draft_slot_cut_empties_is_refused_by_name():
    model, gpu = resolve_model("llama-3.1-8b"), resolve_gpu("h100-sxm")
    spec = '{"method": "draft_model", "model": "llama-3.1-8b", "num_speculative_tokens": 2}'
    args = EngineArgs(max_num_batched_tokens=256, max_num_seqs=256, speculative_config=spec)
    with pytest.raises(SpecError, match="max-num-batched-tokens") as e:
        resolve(args, model, gpu, version=(0, 19, 0))
    assert "256 x 1 draft slot" in str(e.value) or "(256) x 1" in str(e.value)
    resolve(args, model, gpu, version=(0, 28, 0))  # a slot a scheduled request: it runs


def test_no_scheduler_reserve_full_isl_admits_on_the_first_chunk_again():
    """``--no-scheduler-reserve-full-isl`` (vLLM 0.19+) turns the whole-sequence gate off;
    vLLM 0.18 has no such flag, and the simulator refuses it there as that vLLM would."""
    off = sim_trace(CASE["full_sequence_admission_off"], V34)
    assert off.steps == sim_trace(CASE["full_sequence_admission"], V18).steps
    assert sum(off.preempted) > 0
    model, gpu = resolve_model("llama-3.1-8b"), resolve_gpu("h100-sxm")
    with pytest.raises(SpecError, match=r"vLLM 0\.18 has no --scheduler-reserve-full-isl"):
        resolve(EngineArgs(scheduler_reserve_full_isl=False), model, gpu, version=(0, 18, 0))


@pytest.mark.parametrize("model", ["gpt-oss-120b", "gemma-4-26b-a4b", "llama-4-scout"])
def test_vllm_0_19s_gate_over_windowed_layers_is_refused_by_name(model: str):
    # vLLM 0.19.x KVCacheManager.can_fit_full_sequence asks get_num_blocks_to_allocate for
    # every token of the sequence in each KV-cache group, a sliding-window or chunked group
    # too (vLLM issue #39734): vLLM 0.19.0's own scheduler, driven with gpt-oss-120b's two
    # groups at its published one-H100 pool (3,930 blocks, bench/hybrid_kv_pool.py), never
    # admits a 32,000-token prompt (4,000 blocks); 0.20 caps the group at its window
    # (max_admission_blocks_per_request, PR #40946), which is what the simulator sizes
    m, gpu = resolve_model(model), resolve_gpu("h200")

    def scheduler(version, **kw):
        return Scheduler(resolve(EngineArgs(max_model_len=32768, **kw), m, gpu,
                                 version=version), 1000)

    for version in ((0, 19, 0), (0, 19, 1)):
        # its start-up is modelled: the configuration resolves, the memory plans
        cfg = resolve(EngineArgs(max_model_len=32768), m, gpu, version=version)
        with pytest.raises(SpecError, match=r"--scheduler-reserve-full-isl: vLLM 0\.19's "
                                            r"whole-sequence admission gate .*#39734"):
            Scheduler(cfg, 1000)
        scheduler(version, scheduler_reserve_full_isl=False)  # the gate off: scheduled
    for version in ((0, 18, 0), (0, 20, 0), (0, 34, 0), None):
        scheduler(version)


def test_vllm_0_19s_gate_is_taken_on_a_model_without_windowed_layers():
    Scheduler(resolve(EngineArgs(), resolve_model("llama-3.1-8b"), resolve_gpu("h100-sxm"),
                      version=(0, 19, 1)), 1000)
