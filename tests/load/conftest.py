"""Fixtures: the fake OpenAI server (a child process on loopback) and profile helpers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.load.fake_openai import FakeServer


@pytest.fixture(scope="session")
def fake_server() -> Iterator[FakeServer]:
    with FakeServer() as srv:
        yield srv


@pytest.fixture
def server(fake_server: FakeServer) -> FakeServer:
    """The shared fake server with its records cleared and default settings."""
    fake_server.reset()
    return fake_server


def profile_dict(*, rate: float | None = 20.0, concurrency: int | None = None,
                 duration: float = 3.0, warmup: float = 0.0, seed: int = 0,
                 classes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    arrival: dict[str, Any] = ({"mode": "concurrency", "concurrency": concurrency}
                               if concurrency else {"mode": "poisson", "rate": rate})
    return {
        "name": "test", "arrival": arrival, "duration": duration, "warmup": warmup,
        "seed": seed,
        "classes": classes or [
            {"name": "long", "weight": 0.3, "api": "completions",
             "prompt_tokens": {"dist": "uniform", "min": 1000, "max": 3000},
             "output_tokens": {"dist": "uniform", "min": 8, "max": 16}},
            {"name": "chat", "weight": 0.7, "api": "chat",
             "prompt_tokens": {"dist": "uniform", "min": 4, "max": 300},
             "output_tokens": {"dist": "uniform", "min": 4, "max": 24}},
        ],
    }
