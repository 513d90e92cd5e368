"""``chunktune sim run`` end to end (in process)."""

from __future__ import annotations

import json

import yaml

from chunktune.cli import main


def test_sim_run_prints_table_and_json(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main(["sim", "run", "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
               "--max-num-batched-tokens", "2048", "--long-prefill-token-threshold", "0",
               "--max-num-seqs", "256", "--gpu-memory-utilization", "0.9",
               "--workload", "loadtest/profiles/smoke.yaml", "--duration", "20",
               "--json", str(out)])
    text = capsys.readouterr()
    assert rc == 0
    for word in ("long-context", "chat", "overall", "TTFT p50/p90/p99", "KV cache:"):
        assert word in text.out
    assert "GPU KV cache size:" in text.err
    s = json.loads(out.read_text())
    assert s["overall"]["requests"]["ok"] > 50
    assert s["config"]["max-num-batched-tokens"] == 2048
    # the load driver's summary schema, plus what the engine saw
    assert s["schema"] == "chunktune.dev/load-summary/v1"
    assert set(s["overall"]["ttft"]) == {"count", "mean", "min", "p50", "p90", "p95", "p99",
                                         "max"}
    assert s["engine"]["steps"] > 0
    # what the GPU's cost model was fitted on: the H100's own measured kernels
    assert "cost model: h100-sxm: fitted on measured kernels of h100-sxm" in text.out
    assert s["cost_model"].startswith("h100-sxm: fitted on measured kernels of h100-sxm")


def test_sim_run_says_when_a_gpu_borrows_its_cost_model(capsys):
    """A GPU without measured kernels says whose it borrows and the error that makes."""
    rc = main(["sim", "run", "--model", "llama-3.1-8b", "--gpu", "h200", "--workload", "smoke",
               "--duration", "5"])
    out = capsys.readouterr().out
    assert rc == 0
    line = next(x for x in out.splitlines() if x.startswith("cost model: "))
    assert "h200: no measured kernels; borrowed from h100-sxm" in line
    assert "leave-one-GPU-out error of borrowing: " in line and "gemm " in line


def test_vllm_spellings(capsys):
    rc = main(["sim", "run", "--model", "meta-llama/Llama-3.1-8B-Instruct",
               "--max_num_batched_tokens", "8K", "--workload", "smoke", "--duration", "5",
               "--warmup", "1", "--trust-remote-code"])
    text = capsys.readouterr()
    assert rc == 0
    assert "--max-num-batched-tokens 8192" in text.out
    assert "--trust-remote-code is a vLLM flag the simulator does not model" in text.err


def test_shared_openings_and_the_prefix_cache(capsys, tmp_path):
    """The shipped ``rag`` profile: without ``--enable-prefix-caching`` a warning says every
    prompt is prefilled whole; with it the run says how much the cache found, and the
    prompts' first tokens come sooner."""
    run = ["sim", "run", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--workload", "rag",
           "--duration", "20", "--warmup", "2", "--json"]
    assert main([*run, str(tmp_path / "plain.json")]) == 0
    text = capsys.readouterr()
    assert "the workload's class rag shares openings" in text.err
    assert "prefix cache:" not in text.out
    plain = json.loads((tmp_path / "plain.json").read_text())
    assert main([*run, str(tmp_path / "cached.json"), "--enable-prefix-caching"]) == 0
    text = capsys.readouterr()
    assert "shares openings" not in text.err and "prefix cache: 4" in text.out
    cached = json.loads((tmp_path / "cached.json").read_text())
    cache = cached["engine"]["prefix_cache"]
    assert 0.4 < cache["hits"] / cache["queries"] < 0.5  # 1488 of ~3000 tokens, less misses
    assert "prefix_cache" not in plain["engine"]
    assert cached["overall"]["ttft"]["p99"] < 0.7 * plain["overall"]["ttft"]["p99"]


def test_startup_failure_prints_vllm_message_and_exits_nonzero(capsys):
    rc = main(["sim", "run", "--model", "llama-3.1-8b", "--gpu", "l4",
               "--max-num-batched-tokens", "32k", "--max-model-len", "8192",
               "--workload", "smoke"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "ValueError: To serve at least one request with the model's max seq len" in err


def test_bad_input_names_the_field(capsys):
    assert main(["sim", "run", "--model", "llama-9b", "--gpu", "x100"]) == 2
    err = capsys.readouterr().err
    assert "--model: unknown model 'llama-9b'" in err and "--gpu: unknown GPU 'x100'" in err
    assert main(["sim", "run", "--max-num-batched-token", "5"]) == 2
    assert "did you mean --max-num-batched-tokens?" in capsys.readouterr().err
    assert main(["sim", "run", "--max-num-seqs", "0"]) == 2
    assert "--max-num-seqs: must be >= 1 and <= 65536 (got 0)" in capsys.readouterr().err
    assert main(["sim", "run", "--workload", "nope"]) == 2
    assert "--workload: no profile file 'nope'" in capsys.readouterr().err
    assert main(["sim", "run", "--duration", "10", "--warmup", "20"]) == 2
    assert "--warmup: must be shorter" in capsys.readouterr().err


def test_model_config_file(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({
        "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256,
        "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}))
    assert main(["sim", "run", "--model-config", str(cfg), "--workload", "smoke",
                 "--duration", "5", "--warmup", "1"]) == 0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hidden_size": 2048}))
    assert main(["sim", "run", "--model-config", str(bad), "--workload", "smoke"]) == 2
    assert "num_hidden_layers: is missing" in capsys.readouterr().err


def test_flags_vllm_0_32_does_not_know_exit_2_like_vllm(capsys):
    """--max-num-partial-prefills was removed in vLLM 0.32: its parser answers
    "unrecognized arguments" and exits 2; a vLLM flag the simulator only ignores still runs."""
    rc = main(["sim", "run", "--model", "llama-3.1-8b", "--workload", "smoke", "--duration", "5",
               "--max-num-partial-prefills", "2"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "error: unrecognized arguments: --max-num-partial-prefills 2" in err
    rc = main(["sim", "run", "--model", "llama-3.1-8b", "--workload", "smoke", "--duration", "5",
               "--disable-log-stats"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err


def test_class_priority_is_honoured_under_the_priority_policy(tmp_path, capsys):
    """A profile's per-class priority reaches the simulated scheduler: on a saturated engine
    (8 running at most) ``--scheduling-policy priority`` serves the urgent class first, so its
    TTFT falls and the batch class's rises, against ``fcfs`` on the same requests."""
    profile = tmp_path / "p.yaml"
    profile.write_text(yaml.safe_dump({
        "name": "p", "arrival": {"mode": "poisson", "rate": 5}, "duration": 20, "seed": 1,
        "classes": [
            {"name": "urgent", "weight": 1, "priority": -1, "prompt_tokens": 200,
             "output_tokens": 50},
            {"name": "batch", "weight": 3, "priority": 1, "prompt_tokens": 2000,
             "output_tokens": 200}]}))
    runs = {}
    for policy in ("fcfs", "priority"):
        out = tmp_path / f"{policy}.json"
        assert main(["sim", "run", "--workload", str(profile), "--max-num-seqs", "8",
                     "--scheduling-policy", policy, "--json", str(out)]) == 0
        runs[policy] = json.loads(out.read_text())["classes"]
    capsys.readouterr()
    fcfs, prio = runs["fcfs"], runs["priority"]
    assert fcfs["urgent"]["requests"] == prio["urgent"]["requests"]  # the same, all ok
    assert fcfs["batch"]["requests"]["failed"] == prio["batch"]["requests"]["failed"] == 0
    assert prio["urgent"]["ttft"]["p50"] < 0.5 * fcfs["urgent"]["ttft"]["p50"]
    assert prio["batch"]["ttft"]["p50"] > fcfs["batch"]["ttft"]["p50"]


SPEC_WORKLOAD = {
    "name": "spec", "arrival": {"mode": "poisson", "rate": 12}, "duration": 15, "seed": 3,
    "classes": [{"name": "chat", "prompt_tokens": {"dist": "uniform", "min": 300, "max": 3000},
                 "output_tokens": {"dist": "constant", "value": 96},
                 "spec_acceptance": 0.6}],
}


def sim_steps(tmp_path, *extra: str) -> list[dict]:
    """``sim run`` of a workload that keeps prefill chunks beside the decodes at a 256-token
    budget; its step trace (vLLM's iteration-log counts per step)."""
    wl = tmp_path / "w.yaml"
    wl.write_text(yaml.safe_dump(SPEC_WORKLOAD))
    steps = tmp_path / "steps.jsonl"
    rc = main(["sim", "run", "--workload", str(wl), "--max-num-batched-tokens", "256",
               "--max-num-seqs", "32", "--steps", str(steps), *extra])
    assert rc == 0
    return [json.loads(line) for line in steps.read_text().splitlines()]


def test_sim_run_schedules_the_budget_speculative_decoding_leaves(tmp_path, capsys):
    """With ngram K=4 every decode takes 5 of the step's 256 tokens and a step whose prefill
    the budget cuts schedules exactly the budget: the prefill gets 256 - 5 x decodes (vLLM
    0.32 ``Scheduler.schedule``; ngram has no draft slots). Without speculative decoding the
    same kind of step gives the prefill 256 - decodes."""
    spec = sim_steps(tmp_path, "--speculative-config",
                     '{"method": "ngram", "num_speculative_tokens": 4}')
    assert "num_speculative_tokens" in capsys.readouterr().out  # the flags line shows it
    assert all(s["context_tokens"] + s["generation_tokens"] <= 256 for s in spec)
    # steps whose decodes all verified 4 drafts beside a budget-cut prefill chunk
    full = [s for s in spec if s["generation_requests"] and s["context_requests"]
            and s["generation_tokens"] == 5 * s["generation_requests"]
            and s["context_tokens"] + s["generation_tokens"] == 256]
    assert len(full) > 20
    assert {s["context_tokens"] for s in full} == {256 - 5 * s["generation_requests"]
                                                   for s in full}
    assert max(s["generation_requests"] for s in full) >= 4
    plain = sim_steps(tmp_path)
    cut = [s for s in plain if s["generation_requests"] and s["context_requests"]
           and s["context_tokens"] + s["generation_tokens"] == 256]
    assert cut and all(s["generation_tokens"] == s["generation_requests"] for s in plain)
    assert all(s["context_tokens"] == 256 - s["generation_requests"] for s in cut)


def test_sim_run_needs_each_class_acceptance_with_speculative_decoding(tmp_path, capsys):
    wl = tmp_path / "w.yaml"
    wl.write_text(yaml.safe_dump({**SPEC_WORKLOAD, "classes": [
        {k: v for k, v in SPEC_WORKLOAD["classes"][0].items() if k != "spec_acceptance"}]}))
    rc = main(["sim", "run", "--workload", str(wl), "--speculative-config",
               '{"method": "ngram", "num_speculative_tokens": 4}'])
    err = capsys.readouterr().err
    assert rc == 2
    assert "give spec_acceptance (0 to 1) to class chat" in err and "Traceback" not in err
    bad = {**SPEC_WORKLOAD, "classes": [{**SPEC_WORKLOAD["classes"][0], "spec_acceptance": 1.5}]}
    wl.write_text(yaml.safe_dump(bad))
    assert main(["sim", "run", "--workload", str(wl)]) == 2
    assert "classes[0].spec_acceptance" in capsys.readouterr().err


def test_max_num_queued_reqs_answers_503_beyond_n_requests(tmp_path, capsys):
    """vLLM 0.32-0.34 (``AsyncLLM.check_admission``): a request that would make more than N
    requests in the system is refused with HTTP 503; the load summary counts it an error."""
    out = tmp_path / "r.json"
    args = ["sim", "run", "--workload", "loadtest/profiles/smoke.yaml", "--duration", "20",
            "--max-num-batched-tokens", "512", "--json", str(out)]
    assert main(args) == 0
    free = json.loads(out.read_text())
    assert main([*args, "--max-num-queued-reqs", "4"]) == 0
    text = capsys.readouterr()
    assert "--max-num-queued-reqs" not in text.err  # modelled, not ignored with a warning
    capped = json.loads(out.read_text())
    assert free["overall"]["requests"]["failed"] == 0
    failed = capped["overall"]["requests"]["failed"]
    assert failed > 0 and capped["engine"]["queue_rejections"] == failed
    assert list(capped["overall"]["failures"]) == ["http_503"]
    assert capped["overall"]["failures"]["http_503"]["count"] == failed


def test_sim_run_says_which_release_schedules_and_refuses_a_newer_flag(capsys):
    """The scheduler is the named release's (none named: the newest checked); a flag the named
    release does not have is refused by name, exit 2."""
    base = ["sim", "run", "--model", "llama-3.1-8b", "--workload", "smoke", "--duration", "5"]
    assert main(base) == 0
    assert "scheduler: vLLM 0.34 (the newest checked" in capsys.readouterr().out
    assert main([*base, "--vllm-version", "0.33.0", "--prefill-schedule-interval", "4"]) == 0
    out = capsys.readouterr().out
    assert "scheduler: vLLM 0.33\n" in out and "--prefill-schedule-interval 4" in out
    assert main([*base, "--vllm-version", "0.33.0", "--cache-aware-admission-window", "8"]) == 2
    assert "vLLM 0.33 has no --cache-aware-admission-window (since 0.34)" in \
        capsys.readouterr().err
