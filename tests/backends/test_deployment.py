"""A Deployment's engine flags, read and set by one module (``chunktune.backends.deployment``):
the re-tune reads the running configuration with the same rules the output patch writes it."""

from __future__ import annotations

from typing import Any

import pytest

from chunktune.backends import deployment as dp


def deploy(*containers: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"template": {"spec": {"containers": list(containers)}}}}


SHELL = {"name": "engine", "command": ["sh", "-c", "vllm serve m --max_num_batched_tokens 1024"]}
ARGS = {"name": "engine", "args": ["--model", "m", "--max-num-batched-tokens=2048"]}


@pytest.mark.parametrize(("arg", "shell"), [
    ("vllm serve m --max-num-batched-tokens 1024", True), ("serve m -tp 2", True),
    ("--max-num-batched-tokens", False), ("sh", False), ("a b", False)])
def test_one_test_of_a_shell_string(arg: str, shell: bool) -> None:
    assert dp.is_shell_string(arg) is shell


def test_the_container_by_name_or_the_first() -> None:
    d = deploy({"name": "sidecar"}, ARGS)
    assert dp.engine_container(d, "engine") is not None
    assert dp.engine_container(d, None) == {"name": "sidecar"}
    assert dp.engine_container(d, "nope") is None and dp.engine_container(deploy(), None) is None


@pytest.mark.parametrize("container", [ARGS, SHELL], ids=["args", "shell"])
def test_what_set_flags_writes_read_flags_reads(container: dict[str, Any]) -> None:
    names = ["max-num-batched-tokens", "long-prefill-token-threshold"]
    field, args = dp.flags_field(container)
    assert field == ("command" if container is SHELL else "args")
    new = dp.set_flags(args, {"max-num-batched-tokens": 512, "long-prefill-token-threshold": 64})
    assert dp.read_flags({**container, field: new}, names) == {
        "max-num-batched-tokens": 512, "long-prefill-token-threshold": 64}
    if container is SHELL:  # the shell string is edited in place, not split
        assert len(new) == 3 and "--max_num_batched_tokens 512" in new[2]


def test_a_command_of_separate_tokens_is_read_and_left_alone() -> None:
    tokens = {"name": "e", "command": ["vllm", "serve", "m", "--max-num-batched-tokens", "8192"]}
    assert dp.read_flags(tokens, ["max-num-batched-tokens"]) == {"max-num-batched-tokens": 8192}
    assert dp.flags_field(tokens) == ("args", [])  # new flags go in args, after the command


@pytest.mark.parametrize(("args", "on", "expected"), [
    (["--model", "m", "--async-scheduling", "--max-num-seqs", "8"], False,
     ["--model", "m", "--no-async-scheduling", "--max-num-seqs", "8"]),
    (["--model", "m"], True, ["--model", "m", "--async-scheduling"]),
    # either spelling, on or off; a later copy (vLLM's last one wins) is dropped
    (["--no_async_scheduling", "--model", "m", "--async-scheduling"], True,
     ["--async-scheduling", "--model", "m"]),
    (["sh", "-c", "vllm serve m --async-scheduling --max_num_batched_tokens 1024 "
      "--no-async-scheduling"], False,
     ["sh", "-c", "vllm serve m --no-async-scheduling --max_num_batched_tokens 1024"]),
    (["sh", "-c", "vllm serve m --max_num_batched_tokens 1024"], True,
     ["sh", "-c", "vllm serve m --max_num_batched_tokens 1024 --async-scheduling"]),
])
def test_a_switch_is_set_on_or_off_in_place(args: list[str], on: bool,
                                            expected: list[str]) -> None:
    new = dp.set_flags(args, {"async-scheduling": on})
    assert new == expected
    field = "command" if args[0] == "sh" else "args"
    assert dp.read_flags({field: new}, ["async-scheduling"]) == {"async-scheduling": on}
