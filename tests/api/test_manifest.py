"""Parsing manifests: defaults, round trips, files with several documents, the CLI."""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import pytest
import yaml

from chunktune.api import load_manifest, parse_manifest, validate
from chunktune.api.cli import main_crd, main_validate, register
from chunktune.api.default_space import DEFAULT_SEARCH_SPACE
from chunktune.api.v1alpha1 import Constraint, parse_constraint_string
from chunktune.core.errors import SpecError
from chunktune.core.flags import flags_line, parse_argv
from tests.api.factories import EXAMPLES, quickstart, vllm_manifest


def test_defaults_filled() -> None:
    m = parse_manifest(vllm_manifest())
    s = m.spec
    assert s.engine.kind == "vllm"
    assert s.engine.served_model_name == "meta-llama/Llama-3.1-8B-Instruct"
    assert s.engine.gpu.count == 1 and s.engine.port == 8000
    assert s.engine.startup_timeout == 900
    assert [p.name for p in s.parameters] == ["max-num-batched-tokens",
                                              "long-prefill-token-threshold", "max-num-seqs"]
    assert s.parameters[0].grid_values()[:3] == [512, 1024, 1536]
    assert len(s.parameters[0].grid_values()) == 32
    assert [(o.metric, o.direction) for o in s.objectives] == [("ttft_p99", "minimize")]
    assert s.constraints == []
    b = s.budget
    assert (b.max_trials, b.parallelism, b.max_failed_trials, b.trial_timeout, b.prescreen,
            b.patience, b.min_improvement) == (30, 1, 5, 1200, True, None, 0.01)
    assert (s.sampler.name, s.sampler.seed) == ("tpe", 0)
    assert (s.pruner.name, s.pruner.warmup_windows) == ("median", 2)
    assert s.storage is None and s.suspend is False
    assert s.engine_fixed_args() == ["--tensor-parallel-size", "1"]


def test_sim_and_derived_defaults() -> None:
    raw = quickstart()
    raw["spec"]["engine"]["tensorParallelSize"] = 2
    raw["spec"]["engine"]["args"] = ["--max-model-len", "32768"]
    raw["spec"]["objectives"] = [{"metric": "ttft_p99"}, {"metric": "throughput_tokens_per_s"}]
    s = parse_manifest(raw).spec
    assert s.engine.image is None  # a simulated engine runs the operator's own image
    assert s.engine.gpu.count == 2
    assert [o.direction for o in s.objectives] == ["minimize", "maximize"]
    assert s.pruner.name == "none"  # several objectives cannot be pruned
    assert s.engine_fixed_args() == ["--tensor-parallel-size", "2", "--max-model-len", "32768"]
    assert parse_argv(s.engine_fixed_args()).values == {"tensor-parallel-size": 2,
                                                        "max-model-len": 32768}


def test_quickstart_values() -> None:
    m = load_manifest(EXAMPLES / "quickstart.yaml")
    assert m.name == "quickstart"
    c = m.spec.constraints
    assert [(x.class_, x.metric, x.max, x.min) for x in c] == [
        ("chat", "itl_p99", 0.06, None), ("long-context", "ttft_p99", 3.0, None),
        (None, "error_rate", 0.01, None)]
    assert [x.text() for x in c] == ["chat.itl_p99 <= 60ms", "long-context.ttft_p99 <= 3.00s",
                                     "error_rate <= 1%"]
    assert c[0].ok(0.06) and not c[0].ok(0.07)
    profile = m.spec.workload.resolve()
    assert (profile.name, profile.duration, profile.warmup) == ("mixed", 120, 10)
    assert profile.class_names() == ["long-context", "chat"]
    assert m.spec.objectives[0].key == "chat.ttft_p99"
    assert m.spec.pruner.name == "median" and m.spec.pruner.warmup_windows == 5


@pytest.mark.parametrize(("text", "parsed"), [
    ("chat.itl_p99 <= 50ms", {"metric": "itl_p99", "class": "chat", "max": 0.05}),
    ("error_rate <= 1%", {"metric": "error_rate", "max": 0.01}),
    ("ttft_p99<=4s", {"metric": "ttft_p99", "max": 4.0}),
    ("long-context.e2e_p99 <= 1m30s", {"metric": "e2e_p99", "class": "long-context",
                                       "max": 90.0}),
    ("a.b.ttft_p50 <= 0.2", {"metric": "ttft_p50", "class": "a.b", "max": 0.2}),
    ("throughput_tokens_per_s >= 2000", {"metric": "throughput_tokens_per_s", "min": 2000.0}),
])
def test_constraint_strings(text: str, parsed: dict[str, object]) -> None:
    assert parse_constraint_string(text) == parsed
    assert Constraint.model_validate(text) == Constraint.model_validate(parsed)


def test_round_trip_yaml() -> None:
    for raw in (quickstart(), vllm_manifest()):
        m = parse_manifest(raw)
        text = yaml.safe_dump(m.to_manifest(), sort_keys=False)
        again = parse_manifest(yaml.safe_load(text))
        assert again == m
        assert again.to_manifest() == m.to_manifest()


def test_secret_values_are_references() -> None:
    raw = vllm_manifest()
    raw["spec"]["engine"]["env"] = [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]
    out = parse_manifest(raw).to_manifest()
    assert out["spec"]["engine"]["env"] == [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]


def test_default_search_space_is_valid_for_vllm() -> None:
    # every default combination passes vLLM's start-up rule budget >= max_num_seqs
    space = DEFAULT_SEARCH_SPACE["vllm"]
    assert space[0]["low"] >= max(space[2]["choices"])


@pytest.mark.parametrize(("image", "version", "cadence"), [
    ("vllm/vllm-openai:v0.11.0", None, False),  # the image's release: no local cadence
    ("vllm/vllm-openai:v0.33.0", None, True),
    ("vllm/vllm-openai:latest", None, True),  # no release named: the newest checked
    ("vllm/vllm-openai:latest", "0.32.0", False),
])
def test_default_search_space_has_the_prefill_cadence_where_the_release_has_it(
        image: str, version: str | None, cadence: bool) -> None:
    raw = vllm_manifest()
    raw["spec"]["engine"]["image"] = image
    if version:
        raw["spec"]["engine"]["vllmVersion"] = version
    names = [p.name for p in parse_manifest(raw).spec.parameters]
    assert names[:3] == [p["name"] for p in DEFAULT_SEARCH_SPACE["vllm"]]
    assert ("prefill-schedule-interval" in names) is cadence


def test_flags_line() -> None:
    assert flags_line({"max-num-batched-tokens": 4096, "long-prefill-token-threshold": 512}) == \
        "--max-num-batched-tokens 4096 --long-prefill-token-threshold 512"
    assert flags_line({"gpu-memory-utilization": 0.9, "max-num-seqs": 256.0}) == \
        "--gpu-memory-utilization 0.9 --max-num-seqs 256"


def test_relative_profile_path(tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "mine.yaml").write_text(yaml.safe_dump({
        "name": "mine", "duration": 30, "arrival": {"mode": "constant", "rate": 2},
        "classes": [{"name": "q", "prompt_tokens": 100, "output_tokens": 10}]}))
    raw = vllm_manifest()
    raw["spec"]["workload"] = {"profile": "profiles/mine.yaml"}
    raw["spec"]["objectives"] = [{"metric": "ttft_p99", "class": "q"}]
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(raw))
    m = load_manifest(tmp_path / "t.yaml")
    assert m.spec.workload.resolve().name == "mine"


def test_multi_document_file(tmp_path: Path) -> None:
    f = tmp_path / "all.yaml"
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
    f.write_text(yaml.safe_dump_all([other, quickstart()]))
    assert load_manifest(f).name == "quickstart"
    second = quickstart()
    second["metadata"]["name"] = "second"
    f.write_text(yaml.safe_dump_all([other, quickstart(), second]))
    with pytest.raises(SpecError, match="has 2 ChunkedPrefillTuning documents"):
        load_manifest(f)
    assert load_manifest(f, name="second").name == "second"
    f.write_text(yaml.safe_dump_all([other]))
    with pytest.raises(SpecError) as info:
        load_manifest(f)
    assert info.value.problems == [(str(f), "has no ChunkedPrefillTuning document "
                                            "(found: ConfigMap)")]


def test_cli_validate_ok() -> None:
    out, err = io.StringIO(), io.StringIO()
    path = EXAMPLES / "quickstart.yaml"
    assert main_validate(path, out=out, err=err) == 0
    assert out.getvalue() == (f"{path}: valid ChunkedPrefillTuning quickstart (3 parameters, "
                              "1 objective, 3 constraints)\n")
    assert err.getvalue() == ""


def test_cli_validate_errors(tmp_path: Path) -> None:
    raw = quickstart()
    raw["spec"]["searchSpace"][1] = {"name": "long-prefill-token-threshold", "type": "int",
                                     "low": 8192, "high": 4096}
    raw["spec"]["budget"]["parallelism"] = 21
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(raw))
    out, err = io.StringIO(), io.StringIO()
    assert main_validate(f, out=out, err=err) == 1
    assert err.getvalue().splitlines() == [
        "spec.searchSpace[1].low must be <= high (got 8192 > 4096)",
        "spec.budget.parallelism must be <= maxTrials (got 21 > 20)",
    ]
    assert out.getvalue() == ""
    f.write_text("a: [unclosed")
    assert main_validate(f, out=out, err=err) == 1
    assert validate({"kind": "x"})  # sanity: the verb reports, never raises


def test_cli_register_and_crd(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["validate", str(EXAMPLES / "quickstart.yaml")])
    assert args.func(args) == 0
    args = parser.parse_args(["crd", "--output", str(tmp_path / "crd.yaml")])
    assert args.func(args) == 0
    crd = yaml.safe_load((tmp_path / "crd.yaml").read_text())
    assert crd["spec"]["names"]["kind"] == "ChunkedPrefillTuning"
    buf = io.StringIO()
    assert main_crd(out=buf) == 0
    assert yaml.safe_load(buf.getvalue()) == crd
