"""``chunktune tune`` on the local backend: real ``chunktune sim serve`` processes driven by a
real Locust run, end to end, with a short workload."""

from __future__ import annotations

import json

import pytest
import yaml

from chunktune.cli import main
from tests.tuning.conftest import manifest

pytestmark = pytest.mark.slow  # the local backend: real sim serve processes and Locust


def test_tune_with_local_backend(tmp_path, capsys):
    m = manifest(
        searchSpace=[{"name": "long-prefill-token-threshold", "choices": [0, 512]}],
        workload={"profile": "smoke", "duration": "6s", "warmup": "1s"},
        constraints=["error_rate <= 5%"], budget={"maxTrials": 2})
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(m))
    out = tmp_path / "out"
    rc = main(["tune", str(path), "--backend", "local", "--storage",
               str(tmp_path / "s.journal"), "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "backend local" in text and "best configuration" in text
    result = json.loads((out / "result.json").read_text())
    assert result["baseline"]["number"] == 0
    assert result["baseline"]["params"] == {"long-prefill-token-threshold": 0}
    assert [t["state"] for t in result["trials"]] == ["COMPLETE", "COMPLETE"]
    for t in result["trials"]:
        m = t["metrics"]
        assert m["chat.ttft_p99"] > 0 and m["error_rate"] <= 0.05
        assert "kv_cache_usage_peak" in m  # read from the engine's /metrics
        # the engine's own ITL, from the step log the trial kept: below what the clients saw
        # (up to the coarser percentile of a step-weighted sample)
        assert 0 < m["engine_itl_p99"] <= 1.2 * m["itl_p99"]
    assert (out / "history.png").stat().st_size > 1000
