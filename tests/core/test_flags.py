"""The engine-flag registry: every flag round-trips unchanged through every representation, and
the parsers accept what vLLM 0.32 accepts."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
from typing import Any

import optuna
import pytest
import yaml

from chunktune.api import parse_manifest, validate
from chunktune.api.v1alpha1 import SWITCHES, Parameter
from chunktune.backends.deployment import set_flags
from chunktune.core import flags
from chunktune.core.engine_args import EngineArgs
from chunktune.core.flags import (
    FLAGS,
    TUNABLE,
    Flag,
    FlagValueError,
    batch_defaults,
    engine_defaults,
    flags_line,
    human_readable_int,
    human_readable_int_or_auto,
    parse_argv,
)
from chunktune.core.gpus import GPU, resolve_gpu
from chunktune.sim.args import add_engine_args, unrecognized_by_vllm, vllm_flags
from chunktune.tuning.space import suggest
from tests.api.factories import quickstart, vllm_manifest

#: Values the manifest takes where the generic samples would be refused for another reason:
#: vLLM's V1 engine refuses partial prefills other than 1; the tensor-parallel degree must fit
#: the GPU count.
SAMPLES = {"max-num-partial-prefills": [1], "max-long-partial-prefills": [1],
           "tensor-parallel-size": [1, 8], "num-speculative-tokens": [0, 4, 64],
           "speculative-config": ['{"method":"ngram","num_speculative_tokens":4}',
                                  '{"method":"eagle3","num_speculative_tokens":2}']}
#: The --speculative-config a searched num-speculative-tokens is set inside.
SPEC_BASE = ["--speculative-config", '{"method":"ngram","num_speculative_tokens":4}']


def samples(f: Flag) -> list[Any]:
    """Values the flag's engine takes: its bounds' edges, a typical value, special values."""
    if f.name in SAMPLES:
        return SAMPLES[f.name]
    if f.kind == "bool":
        return [True, False]
    if f.choices:
        return list(f.choices)
    if f.kind == "float":
        return [0.5, 1.0, 0.1 + 0.2]
    low = int(f.minimum) if f.minimum is not None else 0
    values = [low, 8192, *f.special]
    return [v for v in values if v not in f.forbidden]


CASES = [pytest.param(f, v, id=f"{f.name}={v}") for f in FLAGS.values() for v in samples(f)]

#: What vLLM takes but the simulator refuses rather than ignore (tests/core/test_engine_args).
SIM_REFUSES = {("max-model-len", -1)} | {
    ("kv-cache-dtype", d) for d in FLAGS["kv-cache-dtype"].choices
    if d not in ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")} | {
    ("quantization", q) for q in FLAGS["quantization"].choices
    if q not in ("fp8", "fp8_per_tensor", "fp8_per_block", "fp8_per_channel", "modelopt",
                 "compressed-tensors")}


def manifest_point(f: Flag, value: Any) -> dict[str, Any]:
    """The flag set in a manifest (searched with one choice if tunable, else in engine.args),
    validated, and read back as the trial's point the way the tuner reads it."""
    kind = "sglang" if "sglang" in f.engines else "vllm"
    raw = vllm_manifest()
    raw["spec"]["engine"]["kind"] = kind
    if kind == "sglang":
        raw["spec"]["engine"]["image"] = "lmsysorg/sglang:latest"
    if f.since is not None:  # a release that has it (the manifest's image is older)
        raw["spec"]["engine"]["vllmVersion"] = ".".join(map(str, f.since))
    if f.tunable and f.kind != "bool":
        raw["spec"]["searchSpace"] = [{"name": f.name, "choices": [value]}]
    elif f.name == "tensor-parallel-size":  # a field of its own in the manifest
        raw["spec"]["engine"]["tensorParallelSize"] = value
        raw["spec"]["engine"]["gpu"]["count"] = value
    else:
        raw["spec"]["engine"]["args"] = f.format(value)
    raw = yaml.safe_load(yaml.safe_dump(raw))  # as a manifest file gives it
    assert validate(raw) == []
    spec = parse_manifest(raw).spec
    if f.tunable and f.kind != "bool":
        trial = optuna.trial.FixedTrial({f.name: value})
        return suggest(trial, spec.parameters)
    return parse_argv(spec.engine_fixed_args()).values


@pytest.mark.parametrize(("f", "value"), CASES)
def test_every_flag_round_trips(f: Flag, value: Any) -> None:
    if f.within:
        return within_round_trips(f, value)
    point = manifest_point(f, value)
    if not f.tunable or f.kind == "bool":  # read from engine.args
        point = {f.name: point[f.name]}
    assert point == {f.name: value} and type(point[f.name]) is type(value)

    # point -> engine arguments (the simulator's, built straight from the point) -> point
    if "sim" in f.engines:
        args = EngineArgs.from_point(point)
        assert getattr(args, f.attr) == value
        assert args.point(only_set=False)[f.name] == value

    # point -> flags line -> argv -> parse (the registry's reader and sim run's argparse)
    line = flags_line(point)
    tokens = shlex.split(line)
    assert tokens == flags.argv(point)
    assert parse_argv(tokens).values == point
    if "sim" in f.engines and tokens[0].split("=", 1)[0] not in vllm_flags() \
            and f.since is None:
        # A flag vLLM 0.32 removed (--max-num-partial-prefills, ...): sim run/serve refuse it
        # as vLLM 0.32 does (unrecognized arguments, exit 2).
        p = argparse.ArgumentParser(exit_on_error=False)
        add_engine_args(p)
        _, unknown = p.parse_known_args(tokens)
        assert unknown == tokens and unrecognized_by_vllm(unknown) == tokens
    elif "sim" in f.engines:
        p = argparse.ArgumentParser(exit_on_error=False)
        add_engine_args(p)
        assert flags.given(p.parse_args(tokens)) == point
        if (f.name, value) not in SIM_REFUSES:
            sim = quickstart()
            sim["spec"]["engine"]["args"] = tokens
            sim["spec"]["searchSpace"] = [p for p in sim["spec"]["searchSpace"]
                                          if p["name"] != f.name]
            if f.name == "tensor-parallel-size":
                sim["spec"]["engine"]["args"] = []
                sim["spec"]["engine"]["tensorParallelSize"] = value
                sim["spec"]["engine"].setdefault("gpu", {})["count"] = value
            assert validate(sim) == [], tokens

    # a patched Deployment's args
    if f.kind != "bool" and f.kind != "str":
        patched = set_flags(["vllm", "serve", "m", f.option, "1"], point)
        assert parse_argv(patched[3:]).values == point
        assert patched.count(f.option) == 1
    if f.kind == "bool":  # a switch, given the other way before
        patched = set_flags(["vllm", "serve", "m", *f.format(not value)], point)
        assert parse_argv(patched[3:]).values == point and len(patched) == 4


def test_every_sim_flag_is_an_engine_argument() -> None:
    """The simulator's engine arguments are the registry's ``sim`` flags, with their defaults
    (bar prefix caching, which the simulator runs with off unless it is given)."""
    fields = {f.name: f.default for f in dataclasses.fields(EngineArgs)}
    sim = {f.attr: f for f in flags.for_engine("sim")}
    assert set(fields) == set(sim)
    for attr, default in fields.items():
        expected = False if attr == "enable_prefix_caching" else sim[attr].default
        assert default == expected, attr


def test_crd_enum_is_the_registry() -> None:
    schema = Parameter.model_json_schema()["properties"]["name"]
    assert schema["enum"] == list(TUNABLE)
    assert set(TUNABLE) == {f.name for f in FLAGS.values() if f.tunable}
    assert all(FLAGS[n].kind in ("int", "float", "bool") for n in TUNABLE)


@pytest.mark.parametrize("name", SWITCHES)
def test_a_searched_switch_takes_both_settings(name: str) -> None:
    raw = vllm_manifest()
    raw["spec"]["engine"]["vllmVersion"] = "0.34.0"
    raw["spec"]["searchSpace"] = [{"name": name}]
    assert validate(raw) == []
    params = parse_manifest(raw).spec.parameters
    for value in (False, True):
        assert suggest(optuna.trial.FixedTrial({name: value}), params) == {name: value}
        assert flags.argv({name: value}) == [f"--{name}" if value else f"--no-{name}"]


# ---- the review's two disagreements ----------------------------------------------------------


@pytest.mark.parametrize(("text", "value"), [("8k", 8000), ("8K", 8192), ("8192", 8192)])
def test_8k_is_taken_everywhere_vllm_takes_it(text: str, value: int) -> None:
    """``engine.args: ["--max-num-batched-tokens", "8k"]`` was refused by the manifest
    validator while ``chunktune sim run`` took it."""
    for raw in (quickstart(), vllm_manifest()):
        raw["spec"]["engine"]["args"] = ["--max-num-batched-tokens", text]
        raw["spec"]["searchSpace"] = [{"name": "max-num-seqs", "choices": [64]}]
        assert validate(raw) == []
        assert parse_argv(parse_manifest(raw).spec.engine_fixed_args()).values[
            "max-num-batched-tokens"] == value
    p = argparse.ArgumentParser(exit_on_error=False)
    add_engine_args(p)
    assert p.parse_args(["--max-num-batched-tokens", text]).max_num_batched_tokens == value


def test_max_num_seqs_takes_plain_integers_only() -> None:
    """vLLM reads --max-num-seqs with int(): ``8k`` is refused there, and so here."""
    raw = vllm_manifest()
    raw["spec"]["engine"]["args"] = ["--max-num-seqs", "8k"]
    assert validate(raw) == [("spec.engine.args[0]",
                              "--max-num-seqs takes an integer (got '8k')")]
    p = argparse.ArgumentParser(exit_on_error=False)
    add_engine_args(p)
    with pytest.raises(argparse.ArgumentError, match="--max-num-seqs takes an integer"):
        p.parse_args(["--max-num-seqs", "8k"])


def test_one_flags_line_everywhere() -> None:
    """Status printed ``0 ... true``, events and the CLI ``0.0 ... True``; now one formatter,
    whose output vLLM's argparse takes back (a switch has no value)."""
    import chunktune.api.status as status
    import chunktune.backends.manifests as manifests
    import chunktune.k8s.controller as study
    import chunktune.k8s.outputs as outputs
    import chunktune.tuning.cli as cli
    import chunktune.tuning.results.files as files
    import chunktune.tuning.results.text as text

    for module in (status, manifests, outputs, study, cli, files, text):
        assert module.flags_line is flags.flags_line, module.__name__
    point = {"long-prefill-token-threshold": 0.0, "max-num-batched-tokens": 4096.0,
             "gpu-memory-utilization": 0.9, "enable-chunked-prefill": True}
    assert flags_line(point) == ("--long-prefill-token-threshold 0 --max-num-batched-tokens "
                                 "4096 --gpu-memory-utilization 0.9 --enable-chunked-prefill")
    assert flags_line({"enable-chunked-prefill": False}) == "--no-enable-chunked-prefill"


# ---- parsers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "value"), [
    ("8k", 8000), ("8K", 8192), ("25.6k", 25600), ("1m", 10**6), ("2M", 2 * 2**20),
    ("1G", 2**30), ("1t", 10**12), (" 2048 ", 2048), ("1_000", 1000), ("1.0009k", 1000),
])
def test_human_readable_int_as_vllm(text: str, value: int) -> None:
    assert human_readable_int(text) == value


@pytest.mark.parametrize("text", ["1.5K", "abc", "8 k", "1.5", "k", ""])
def test_human_readable_int_refuses_what_vllm_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        human_readable_int(text)


def test_max_model_len_auto() -> None:
    assert human_readable_int_or_auto("auto") == human_readable_int_or_auto("-1") == -1
    assert human_readable_int_or_auto("32k") == 32000
    assert FLAGS["max-model-len"].parse("AUTO") == -1
    with pytest.raises(FlagValueError, match="must be >= 1"):
        FLAGS["max-model-len"].parse("-2")


def test_values_and_spellings() -> None:
    assert parse_argv(["--max_num_seqs=64", "-tp", "2", "--no-enable-chunked-prefill",
                       "--device-memory-utilization", "0.8"]).values == {
        "max-num-seqs": 64, "tensor-parallel-size": 2, "enable-chunked-prefill": False,
        "gpu-memory-utilization": 0.8}
    parsed = parse_argv(["--swap-space", "4", "--max-num-seqs", "0", "--enforce-eager=1",
                         "stray"])
    assert parsed.unknown == [(0, "--swap-space")]
    assert parsed.problems == [(2, "--max-num-seqs must be >= 1 and <= 65536 (got 0)"),
                               (4, "--enforce-eager takes no value (use --enforce-eager or "
                                   "--no-enforce-eager)")]
    assert parsed.stray == [5]
    with pytest.raises(FlagValueError, match="takes an integer"):
        FLAGS["max-num-seqs"].coerce(1.5)
    with pytest.raises(FlagValueError, match="is a switch"):
        FLAGS["enable-chunked-prefill"].coerce(1)
    assert FLAGS["max-num-seqs"].coerce(256.0) == 256
    assert parse_argv(["--chunked-prefill-size", "-1"]).values == {"chunked-prefill-size": -1}
    assert parse_argv(["--chunked-prefill-size", "0"]).problems == [
        (0, "--chunked-prefill-size must be >= -1 and <= 16777216, not 0 (got 0)")]


# ---- defaults ----------------------------------------------------------------------------------


def test_batch_defaults_tiers() -> None:
    big = dataclasses.replace(resolve_gpu("h200"), name="b200", memory_gib=178.4,
                              device_name="NVIDIA B200")
    assert batch_defaults(big) == (16384, 1024)
    assert batch_defaults(resolve_gpu("h100-sxm")) == (8192, 1024)
    assert batch_defaults(resolve_gpu("a100-sxm")) == (2048, 256)
    assert batch_defaults(None) == (2048, 256)


def test_engine_defaults_follow_vllm() -> None:
    h100: GPU = resolve_gpu("h100-sxm")
    d = engine_defaults({}, h100, 131072)
    assert (d["max-num-batched-tokens"], d["max-num-seqs"], d["max-model-len"]) == \
        (8192, 1024, 131072)
    assert d["gpu-memory-utilization"] == 0.92 and d["long-prefill-token-threshold"] == 0
    # chunked prefill off: the budget covers a whole prompt
    off = engine_defaults({"enable-chunked-prefill": False}, h100, 32768)
    assert off["max-num-batched-tokens"] == 32768
    # a short context caps the default budget at max_num_seqs * max_model_len
    short = engine_defaults({"max-num-seqs": 2}, h100, 1024)
    assert short["max-num-batched-tokens"] == 2048
    # the default max_num_seqs never exceeds the budget
    assert engine_defaults({"max-num-batched-tokens": 512}, h100, 4096)["max-num-seqs"] == 512
    assert engine_defaults({}, h100, None, engine="sglang") == {"chunked-prefill-size": 8192}
    assert engine_defaults({}, h100, 4096, engine="sim")["enable-prefix-caching"] is False


def test_manifest_args_check_values_not_vllms_other_flags() -> None:
    """For a vLLM engine the registry's flags are checked and the rest (any arity) passed on;
    the simulator refuses what it does not model, stray tokens included."""
    raw = vllm_manifest()
    raw["spec"]["engine"]["args"] = ["--api-key", "k1", "k2", "--max-model-len", "4K"]
    assert validate(raw) == []
    raw["spec"]["engine"]["args"] = ["--max-num-batched-tokens", "1.5K"]
    assert validate(raw) == [("spec.engine.args[0]", "--max-num-batched-tokens takes an integer "
                              "such as 2048, 8k (8000) or 8K (8192) (got '1.5K'): decimals are "
                              "not allowed with binary suffixes like K; did you mean 1.5k?")]
    sim = quickstart()
    sim["spec"]["engine"]["args"] = ["--enforce-eager", "yes"]
    assert validate(sim) == [("spec.engine.args[1]", "expected a --flag (got 'yes')")]


def within_round_trips(f: Flag, value: Any) -> None:
    """A key of a JSON flag (num-speculative-tokens inside --speculative-config): searched in
    a manifest, it lands inside the fixed flag's object on the engine's command line, in the
    simulator's arguments and in a patched Deployment; 0 drops the flag."""
    raw = quickstart()
    raw["spec"]["engine"]["args"] = list(SPEC_BASE)
    raw["spec"]["searchSpace"] = [{"name": f.name, "choices": [value]}]
    assert validate(raw) == []
    spec = parse_manifest(raw).spec
    point = suggest(optuna.trial.FixedTrial({f.name: value}), spec.parameters)
    assert point == {f.name: value}
    tokens = flags.argv(point, base=spec.engine_fixed_args())
    got = parse_argv(tokens).values.get(f.within)
    patched = set_flags(["vllm", "serve", "m", *SPEC_BASE], point)
    if value == 0:
        assert got is None and "--speculative-config" not in patched
        return
    assert json.loads(got) == {"method": "ngram", f.attr: value}
    assert json.loads(parse_argv(patched[3:]).values[f.within])[f.attr] == value
    args = EngineArgs.from_point({f.within: SPEC_BASE[1], **point})
    assert getattr(args, f.attr) == value
