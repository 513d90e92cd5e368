"""``chunktune calibrate``: profiles fitted to synthetic step logs, their format, bad logs."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest

from chunktune.cli import main
from chunktune.core.engine_args import EngineArgs
from chunktune.core.errors import SpecError
from chunktune.core.gpus import resolve_gpu
from chunktune.core.models import resolve_model
from chunktune.core.steps import StepLogMeta, parse_steps, write_steps
from chunktune.sim.calibration import profile as profiles
from chunktune.sim.engine.virtual import build_engine

HEADER = ("(EngineCore pid=1) INFO 12-03 01:00:00 [core.py:134] Initializing a V1 LLM engine "
          "(v0.32.0) with config: model='{model}', speculative_config=None, tokenizer='x'")
KV = "(EngineCore pid=1) INFO 12-03 01:00:01 [kv_cache_utils.py:2328] CPU KV cache size: " \
     "100,000 tokens, Maximum concurrency for 8,192 tokens per request: 12.21x"

#: The engine the synthetic logs come from: 2 ms a step, 20 us a token, 4 ns a decode KV token
#: and 1 ns a prefill query-key pair.
TRUE = {"step": 2e-3, "tok": 2e-5, "kv": 4e-9, "pair": 1e-9}


def _line(i: int, cr: int, ct: int, gr: int, usage: float, ms: float) -> str:
    return (f"(APIServer pid=2) INFO 12-03 01:00:02 [loggers.py:199] Engine 000: Iteration({i}):"
            f" {cr} context requests, {ct} context tokens, {gr} generation requests, {gr} "
            f"generation tokens, iteration elapsed time: {ms:.3f} ms, CPU KV cache usage: "
            f"{usage:.1f}%")


def synthetic_log(n: int = 300, seed: int = 0, model: str = "/m/tiny",
                  noise: float = 0.0) -> list[str]:
    rng = np.random.default_rng(seed)
    lines = [HEADER.format(model=model), KV]
    for i in range(n):
        cr = int(rng.integers(0, 3))
        ct = int(rng.integers(16, 512)) * cr
        gr = int(rng.integers(0, 40))
        if cr + gr == 0:
            gr = 1
        usage = float(rng.uniform(1, 40))
        each = ct / cr if cr else 0.0
        kv = max(gr, usage / 100 * 100_000 - ct) if gr else 0.0
        t = (TRUE["step"] + TRUE["tok"] * (ct + gr) + TRUE["kv"] * kv
             + TRUE["pair"] * cr * each * (each + 1) / 2)
        t *= 1 + noise * float(rng.standard_normal())
        lines.append(_line(i, cr, ct, gr, round(usage, 1), 1e3 * t))
    return lines


@pytest.fixture
def tiny(tmp_path):
    from chunktune.modelgen.tiny import write_tiny_model
    return write_tiny_model(tmp_path / "tiny") / "config.json"


def _calibrate(tmp_path, tiny, logs: list[list[str]], *extra: str) -> int:
    paths = []
    for k, lines in enumerate(logs):
        p = tmp_path / f"engine{k}.log"
        p.write_text("\n".join(lines) + ("\n" if lines else ""))
        paths.append(str(p))
    return main(["calibrate", "--log", *paths, "--model-config", str(tiny), "--gpu", "cpu",
                 "--out", str(tmp_path / "profile.json"), *extra])


def test_profile_recovers_the_engine_and_records_its_fit(tmp_path, tiny, capsys):
    assert _calibrate(tmp_path, tiny, [synthetic_log(300, 0), synthetic_log(200, 1)],
                      "--server-overhead", "0.05") == 0
    out = capsys.readouterr().out
    assert "from 500 steps in 2 file(s) (vLLM 0.32.0)" in out
    d = json.loads((tmp_path / "profile.json").read_text())
    assert d["kind"] == profiles.PROFILE_KIND and d["version"] == profiles.PROFILE_VERSION
    assert (d["model"], d["gpu"], d["kv_cache_tokens"]) == ("tiny", "cpu", 100_000)
    assert d["server_overhead_s"] == 0.05 and d["step_gap_s"] == 0.0
    assert d["fitted_on"]["steps"] == 500 and d["fitted_on"]["device"] == "CPU"
    assert d["fitted_on"]["vllm_version"] == "0.32.0"
    assert [f["steps"] for f in d["fitted_on"]["files"]] == [300, 200]
    assert all(f["model"] == "/m/tiny" for f in d["fitted_on"]["files"])
    # noise-free steps of the model's own form: reproduced, in sample and held out
    assert d["fit"]["median_rel_err"] < 0.02
    assert d["fit"]["cross_validated_median_rel_err"] < 0.02
    assert d["fit"]["total_ratio"] == pytest.approx(1.0, abs=0.01)
    assert set(d["coefficients"]) == set(profiles.COEFFICIENTS)
    assert all(v >= 0 for v in d["coefficients"].values())
    # the profile reads back as what was written
    prof = profiles.read_profile(tmp_path / "profile.json")
    assert prof.to_dict() == d


def test_the_fit_prices_the_engine_as_it_ran(tmp_path, tiny, monkeypatch):
    """The scales a profile holds multiply the engine's own terms as ``sim run --calibration``
    prices them with the same flags: ``--kv-cache-dtype fp8 --enforce-eager`` and the release
    the logs name (0.32.0) reach the step-time model the fit uses."""
    seen = []
    fit = profiles.fit_logs

    def spy(logs, cost):
        seen.append(cost)
        return fit(logs, cost)

    monkeypatch.setattr(profiles, "fit_logs", spy)
    assert _calibrate(tmp_path, tiny, [synthetic_log(300, 0)], "--kv-cache-dtype", "fp8",
                      "--enforce-eager") == 0
    assert _calibrate(tmp_path, tiny, [synthetic_log(300, 0)]) == 0
    fp8, plain = seen
    assert fp8.kv_dtype_bytes == 1 and fp8.enforce_eager and fp8.vllm_version == (0, 32, 0)
    assert plain.kv_dtype_bytes != 1 and not plain.enforce_eager


def test_calibrate_refuses_engine_flags_vllm_would_refuse(tmp_path, tiny, capsys):
    assert _calibrate(tmp_path, tiny, [synthetic_log(300, 0)], "--kv-cache-dtype",
                      "fp9") == 2
    assert "kv-cache-dtype" in capsys.readouterr().err


def test_noisy_steps_keep_their_total(tmp_path, tiny):
    """30% noise per step (a busy machine): single steps miss, their sum does not."""
    assert _calibrate(tmp_path, tiny, [synthetic_log(600, 3, noise=0.3)]) == 0
    fit = json.loads((tmp_path / "profile.json").read_text())["fit"]
    assert 0.1 < fit["median_rel_err"] < 0.4
    assert fit["cross_validated_total_ratio"] == pytest.approx(1.0, abs=0.05)


def test_calibrated_engine_costs_steps_as_the_log(tmp_path, tiny):
    assert _calibrate(tmp_path, tiny, [synthetic_log(300, 0)]) == 0
    prof = profiles.read_profile(tmp_path / "profile.json")
    model = resolve_model(None, tiny)
    args = profiles.engine_args(EngineArgs(max_num_batched_tokens=512, max_model_len=8192), prof)
    assert args.num_gpu_blocks_override == 100_000 // args.block_size
    eng = build_engine(args, model, resolve_gpu("cpu"))
    profiles.apply(eng, prof)
    # 2 decodes over 1000 KV tokens beside a 100-token chunk from position 0
    t = eng.cost.step_time(102, 3, 3, [(100, 0)], 2, 1000)
    want = (TRUE["step"] + TRUE["tok"] * 102 + TRUE["kv"] * 1000
            + TRUE["pair"] * 100 * 101 / 2)
    assert t == pytest.approx(want, rel=0.05)
    # a profile of another device is refused, naming the field
    other = build_engine(EngineArgs(max_num_batched_tokens=512, max_model_len=8192), model,
                         resolve_gpu("h100-sxm"))
    with pytest.raises(SpecError) as e:
        profiles.apply(other, prof, field_path="spec.engine.calibration")
    assert e.value.problems[0][0] == "spec.engine.calibration"
    assert "fitted for tiny on cpu" in str(e.value)


def test_a_profile_holds_an_engine_to_the_settings_it_was_fitted_on(tmp_path, tiny):
    """``calibrate --kv-cache-dtype fp8`` records the engine it fitted (``fitted_on.engine``);
    applying the profile to an engine with another KV cache dtype or ``--enforce-eager``
    is refused, naming both flags' values, since its scales multiply that engine's terms; the
    same settings are taken, and a profile without the record (an older one) is not held."""
    assert _calibrate(tmp_path, tiny, [synthetic_log(300, 0)], "--kv-cache-dtype", "fp8") == 0
    d = json.loads((tmp_path / "profile.json").read_text())
    assert d["fitted_on"]["engine"] == {"kv_cache_dtype_bytes": 1, "enforce_eager": False}
    prof = profiles.read_profile(tmp_path / "profile.json")
    model = resolve_model(None, tiny)
    cpu = resolve_gpu("cpu")

    def engine(**kw):
        return build_engine(profiles.engine_args(
            EngineArgs(max_num_batched_tokens=512, max_model_len=8192, **kw), prof), model, cpu)

    profiles.apply(engine(kv_cache_dtype="fp8"), prof)
    with pytest.raises(SpecError) as e:
        profiles.apply(engine(enforce_eager=True), prof)
    assert "--kv-cache-dtype (1 bytes an element there, 2 here)" in str(e.value)
    assert "--enforce-eager (off there, on here)" in str(e.value)
    older = dataclasses.replace(prof, fitted_on={k: v for k, v in prof.fitted_on.items()
                                                 if k != "engine"})
    profiles.apply(engine(), older)
    for bad in ({"kv_cache_dtype_bytes": 3, "enforce_eager": False},
                {"kv_cache_dtype_bytes": 2}, "fp8"):
        with pytest.raises(SpecError, match=r"fitted_on\.engine: must be"):
            profiles.parse_profile(dict(d, fitted_on=dict(d["fitted_on"], engine=bad)), "p")


def test_a_profile_holds_an_engine_to_the_peer_to_peer_path_it_was_fitted_on(tmp_path, tiny):
    """``calibrate --no-gpu-peer-to-peer`` records the path (the fitted per-token cost carries
    that node's all-reduces: a calibrated step prices none apart); an engine on a node with
    another (or none stated) is refused, naming both; a profile fitted without one stated
    records none and holds nobody to it."""
    from chunktune.core.gpus import with_peer_to_peer
    assert _calibrate(tmp_path, tiny, [synthetic_log(300, 0)], "--no-gpu-peer-to-peer") == 0
    d = json.loads((tmp_path / "profile.json").read_text())
    assert d["fitted_on"]["engine"] == {"kv_cache_dtype_bytes": 2, "enforce_eager": False,
                                        "peer_to_peer": False}
    prof = profiles.read_profile(tmp_path / "profile.json")
    model = resolve_model(None, tiny)

    def engine(p2p: bool | None):
        return build_engine(profiles.engine_args(
            EngineArgs(max_num_batched_tokens=512, max_model_len=8192), prof), model,
            with_peer_to_peer(resolve_gpu("cpu"), p2p))

    profiles.apply(engine(False), prof)
    for p2p, here in ((True, "peer to peer"), (None, "not stated")):
        with pytest.raises(SpecError) as e:
            profiles.apply(engine(p2p), prof)
        assert f"peer-to-peer path between the GPUs (none there, {here} here)" in str(e.value)
    with pytest.raises(SpecError, match=r"fitted_on\.engine: must be"):
        profiles.parse_profile(dict(d, fitted_on=dict(d["fitted_on"], engine=dict(
            d["fitted_on"]["engine"], peer_to_peer="no"))), "p")
    assert _calibrate(tmp_path, tiny, [synthetic_log(300, 0)]) == 0
    unstated = profiles.read_profile(tmp_path / "profile.json")
    assert "peer_to_peer" not in unstated.fitted_on["engine"]
    profiles.apply(engine(True), unstated)


def test_sim_run_takes_the_profile(tmp_path, tiny, capsys):
    assert _calibrate(tmp_path, tiny, [synthetic_log(300, 0)], "--server-overhead", "0.1") == 0
    common = ["sim", "run", "--model-config", str(tiny), "--gpu", "cpu", "--workload", "chat",
              "--duration", "40", "--warmup", "5", "--rate", "1",
              "--max-num-batched-tokens", "512", "--max-model-len", "8192"]
    capsys.readouterr()
    assert main([*common, "--calibration", str(tmp_path / "profile.json"),
                 "--json", str(tmp_path / "cal.json")]) == 0
    cal = json.loads((tmp_path / "cal.json").read_text())
    # the idle TTFT carries the profile's 100 ms before the first token
    assert cal["overall"]["ttft"]["p50"] > 0.1
    # no release named: the scheduler of the one whose steps the profile was fitted on
    prof = profiles.read_profile(tmp_path / "profile.json")
    assert profiles.fitted_version(prof) == (0, 32, 0)
    assert cal["scheduler"] == "vLLM 0.32"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "something-else"}))
    assert main([*common, "--calibration", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "--calibration" in err and "not a calibration profile" in err


@pytest.mark.parametrize(("logs", "message"), [
    ([[]], "is empty"),
    ([["INFO 10.0.0.1 - GET /metrics 200", "INFO started"]], "has no vLLM step lines"),
    ([synthetic_log(10)], "10 steps with tokens in the logs; at least 20"),
    ([synthetic_log(50, model="Qwen/Qwen2.5-7B-Instruct")],
     "serving 'Qwen/Qwen2.5-7B-Instruct', not the declared model"),
    ([[*synthetic_log(50), _line(99, 1, 9000, 0, 10.0, 50.0)]],
     "9000 prompt tokens for 1 request(s), more than tiny's 8192-token context"),
])
def test_bad_logs_name_the_problem(tmp_path, tiny, capsys, logs, message):
    assert _calibrate(tmp_path, tiny, logs) == 2
    err = capsys.readouterr().err
    assert message in err and ("--log" in err or "--model" in err), err
    assert not (tmp_path / "profile.json").exists()


def test_steps_files_carry_the_engine_identity(tmp_path, tiny, capsys):
    """A backend's .steps.jsonl (with its meta line) calibrates like the raw log; a steps file
    of another model is refused from that meta line; a broken one names its line."""
    lines = synthetic_log(100)
    good = write_steps(tmp_path / "a.steps.jsonl", parse_steps(lines),
                       StepLogMeta(model="/m/tiny", vllm_version="0.32.0",
                                   kv_cache_tokens=100_000, device="CPU"))
    out = tmp_path / "p.json"
    args = ["calibrate", "--model-config", str(tiny), "--gpu", "cpu", "--out", str(out)]
    assert main([*args, "--log", str(good)]) == 0
    assert json.loads(out.read_text())["fitted_on"]["vllm_version"] == "0.32.0"
    other = write_steps(tmp_path / "b.steps.jsonl", parse_steps(lines),
                        StepLogMeta(model="meta-llama/Llama-3.1-8B"))
    assert main([*args, "--log", str(other)]) == 2
    assert "serving 'meta-llama/Llama-3.1-8B'" in capsys.readouterr().err
    broken = tmp_path / "c.steps.jsonl"
    broken.write_text(good.read_text() + '{"iteration": "x"}\n')
    assert main([*args, "--log", str(broken)]) == 2
    assert "c.steps.jsonl line 102 is not a step record: missing" in capsys.readouterr().err
    assert main([*args, "--log", str(tmp_path / "missing.log")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize(("edit", "message"), [
    ({"version": 99}, "profile version 99 is not supported"),
    ({"coefficients": {"step_overhead_scale": -1}}, "coefficients.step_overhead_scale"),
    ({"step_gap_s": "fast"},
     "step_gap_s: must be a number from 0 to 3600 (got a text of 4 characters)"),
    ({"delivery_stall_s": -0.001},
     "delivery_stall_s: must be a number from 0 to 3600 (got -0.001)"),
    ({"delivery_stall_prob": 1.5}, "delivery_stall_prob: must be a probability, 0 to 1"),
    ({"model": ""}, "model: missing"),
])
def test_bad_profiles_name_the_field(tmp_path, tiny, edit, message):
    assert _calibrate(tmp_path, tiny, [synthetic_log(100)]) == 0
    d = json.loads((tmp_path / "profile.json").read_text())
    for k, v in edit.items():
        d[k] = {**d[k], **v} if isinstance(v, dict) else v
    with pytest.raises(SpecError) as e:
        profiles.parse_profile(d, "p.json", "spec.engine.calibration")
    assert message in str(e.value) and e.value.problems[0][0] == "spec.engine.calibration"


def test_delivery_stalls_delay_tokens_and_keep_their_order():
    made = np.arange(200) * 0.003  # a token every 3 ms
    assert np.array_equal(profiles.deliver(made, 0.0, 0.004, np.random.default_rng(1)), made)
    got = profiles.deliver(made, 0.05, 0.004, np.random.default_rng(1))
    assert np.all(got >= made) and np.all(np.diff(got) >= 0)  # late, never out of order
    late = got > made
    assert 3 <= late.sum() <= 40  # about 5% stalled, and some that piled up behind them
    gaps = np.diff(got)
    # a stall lengthens the gap before the late token and shortens the ones after it
    assert gaps.max() > 0.003 + 0.002 and gaps.min() < 0.003 - 1e-9
    assert np.isclose(got[-1] - got[0], made[-1] - made[0], atol=0.1)
    # the same generator, the same stalls
    assert np.array_equal(got, profiles.deliver(made, 0.05, 0.004, np.random.default_rng(1)))


def test_step_times_of_zero_give_no_profile(tmp_path, tiny, capsys):
    """Steps that all took 0 ms fit no cost: refused, not an all-zero profile that simulates
    every step as free (issue 34)."""
    lines = [re.sub(r"elapsed time: [0-9.]+ ms", "elapsed time: 0.00 ms", x)
             for x in synthetic_log(100)]
    assert _calibrate(tmp_path, tiny, [lines]) != 0
    assert "fit no cost at all" in capsys.readouterr().err
    assert not (tmp_path / "profile.json").exists()
