"""The metric registry and bound parsing."""

from __future__ import annotations

import pytest

from chunktune.api.metrics import METRICS, format_value, get_metric, metric_key, parse_value
from chunktune.core.errors import SpecError


def test_registry() -> None:
    for base in ("ttft", "itl", "e2e", "tpot"):
        for p in (50, 90, 95, 99):
            m = METRICS[f"{base}_p{p}"]
            assert (m.unit, m.direction, m.per_class) == ("s", "minimize", True)
    assert METRICS["queue_time_p99"].unit == "s"
    for name in ("throughput_tokens_per_s", "total_tokens_per_s", "request_rate", "goodput"):
        assert METRICS[name].direction == "maximize"
    assert METRICS["error_rate"].unit == "fraction"
    assert not METRICS["preemptions_per_minute"].per_class
    assert not METRICS["kv_cache_usage_peak"].per_class
    assert not METRICS["engine_itl_p99"].per_class and METRICS["engine_itl_p99"].unit == "s"
    prefix = METRICS["prefix_cache_hit_rate"]
    assert (prefix.unit, prefix.direction, prefix.per_class) == ("fraction", "maximize", False)
    assert len(METRICS) == 26
    assert metric_key("itl_p99", "chat") == "chat.itl_p99" and metric_key("itl_p99") == "itl_p99"
    with pytest.raises(SpecError, match="did you mean 'goodput'"):
        get_metric("goodpt")


@pytest.mark.parametrize(("metric", "raw", "value"), [
    ("itl_p99", "50ms", 0.05), ("ttft_p99", "4s", 4.0), ("ttft_p99", 0.25, 0.25),
    ("e2e_p99", "1m", 60.0), ("error_rate", "1%", 0.01), ("error_rate", 0.02, 0.02),
    ("kv_cache_usage_peak", "95%", 0.95), ("request_rate", 12, 12.0),
])
def test_parse_value(metric: str, raw: object, value: float) -> None:
    assert parse_value(metric, raw) == pytest.approx(value)


@pytest.mark.parametrize(("metric", "raw"), [
    ("itl_p99", "5%"), ("error_rate", 5), ("error_rate", "150%"), ("request_rate", "fast"),
    ("request_rate", -1), ("ttft_p99", True),
])
def test_parse_value_rejects(metric: str, raw: object) -> None:
    with pytest.raises(SpecError):
        parse_value(metric, raw)


def test_format_value() -> None:
    assert format_value("ttft_p99", 0.4123) == "412ms"
    assert format_value("chat.e2e_p99", 12.5) == "12.50s"
    assert format_value("error_rate", 0.01) == "1%"
    assert format_value("throughput_tokens_per_s", 1234.5) == "1234 tokens/s"
