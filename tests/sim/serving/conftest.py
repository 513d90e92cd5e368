"""Fixtures: one shared ``chunktune sim serve`` child process on 127.0.0.1 (ephemeral port) and
small HTTP helpers (``requests``) for the tests that do not use the OpenAI SDK."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from bench.serve_overhead import ServerProc, start_server
from prometheus_client.parser import text_string_to_metric_families

#: The shared server: a short context (cheap "too long" prompts), two served names, a small
#: chat default so requests without max_tokens stay quick.
SHARED_FLAGS = ["--max-model-len", "4096", "--max-num-seqs", "16",
                "--served-model-name", "sim-llama", "sim-alias", "--default-max-tokens", "8"]
MODEL = "sim-llama"
MAX_MODEL_LEN = 4096


@pytest.fixture(scope="package")
def sim() -> Iterator[ServerProc]:
    with start_server("llama-3.1-8b", SHARED_FLAGS) as srv:
        yield srv


def post(srv: ServerProc, path: str, body: Any, **kw: Any) -> requests.Response:
    return requests.post(srv.url + path, json=body, timeout=30, **kw)


def metric_samples(srv: ServerProc) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics`` keyed by (sample name, sorted labels)."""
    text = requests.get(srv.url + "/metrics", timeout=10).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


LABELS = (("engine", "0"), ("model_name", MODEL))


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
          **extra: str) -> float:
    labels = tuple(sorted((*LABELS, *extra.items())))
    return samples[(name, labels)]


def wait_for(predicate: Any, timeout: float = 5.0, interval: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0
