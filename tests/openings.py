"""One workload of shared openings, sent by ``chunktune load run`` to real vLLM
(``tests/metrics/test_from_prometheus.py``) and to ``chunktune sim serve``
(``tests/sim/serving/test_prefix_cache.py``), and what a prefix cache of 128-token blocks
must count for it: prompts of 612 tokens opening with one of two 512-token openings (four
blocks), one request in flight at a time, so that each request after the first of its
opening finds the opening's four blocks cached."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from chunktune.core.workload import generate, parse_profile

SHARED, PROMPT, BLOCK = 512, 612, 128
PROFILE: dict[str, Any] = {
    "name": "openings", "arrival": {"mode": "concurrency", "concurrency": 1}, "duration": 6,
    "warmup": 0, "seed": 11,
    "classes": [{"name": "rag", "prompt_tokens": PROMPT, "output_tokens": 2,
                 "shared_prefix": {"tokens": SHARED, "groups": 2}}]}


def send(url: str, model: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    """The load driver with :data:`PROFILE` (token-id prompts) against ``url``."""
    profile = tmp / "openings.yaml"
    profile.write_text(yaml.safe_dump(PROFILE))
    return subprocess.run(
        [sys.executable, "-m", "chunktune", "load", "run", "--target", url, "--profile",
         str(profile), "--out", str(tmp / "openings.json"), "--quiet", "--token-ids",
         "--model", model], capture_output=True, text=True, timeout=300)


def counter(metrics_text: str, name: str) -> float:
    """A ``vllm:`` counter of a scrape, summed over its labels."""
    return sum(float(x.rsplit(" ", 1)[1]) for x in metrics_text.splitlines()
               if x.startswith(f"vllm:{name}{{"))


def expected(n: int) -> tuple[int, int]:
    """(prompt tokens looked up, found) for the first ``n`` requests of :data:`PROFILE`."""
    specs = generate(parse_profile(PROFILE))[:n]
    first = {s.prefix_key: s.rid for s in reversed(specs)}
    return n * PROMPT, SHARED * sum(s.rid != first[s.prefix_key] for s in specs)
