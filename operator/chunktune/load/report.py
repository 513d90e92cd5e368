"""A load summary as a human-readable table (what ``load run`` prints on stderr)."""

from __future__ import annotations

from chunktune.core.stats import MetricStats
from chunktune.core.summary import ClassSummary, LoadSummary

__all__ = ["format_summary"]


def _ms(m: MetricStats | None, attr: str) -> str:
    return "-" if m is None else f"{getattr(m, attr) * 1000:.1f}"


def _row(name: str, c: ClassSummary) -> list[str]:
    t = c.throughput
    return [name, str(c.requests.ok), str(c.requests.failed), _ms(c.ttft, "p50"),
            _ms(c.ttft, "p99"), _ms(c.itl, "p50"), _ms(c.itl, "p99"), _ms(c.tpot, "p50"),
            _ms(c.e2e, "p99"), f"{t.request_rate:.2f}", f"{t.output_tokens_per_s:.0f}",
            f"{t.total_tokens_per_s:.0f}"]


def format_summary(s: LoadSummary) -> str:
    head = ["class", "ok", "failed", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "TPOT p50",
            "E2E p99", "req/s", "out tok/s", "tot tok/s"]
    rows = [_row(n, c) for n, c in s.classes.items()]
    if len(s.classes) > 1:
        rows.append(_row("overall", s.overall))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    d = s.duration
    lines = [
        f"{s.profile} against {s.target} ({s.model}): measured {d.measured:.1f}s after "
        f"{d.warmup:g}s warm-up, drain {d.drain:.1f}s"
        + ("" if s.complete else " (stopped early)"),
        "latencies in ms; rates per second over the measured interval",
        fmt.format(*head),
        *(fmt.format(*r) for r in rows),
    ]
    if s.overall.failures:
        lines.append("failures: " + ", ".join(f"{k} x{v.count} ({v.example[:80]})"
                                              for k, v in s.overall.failures.items()))
    if s.goodput is not None:
        lines.append(f"goodput: {s.goodput.request_rate:.2f} req/s, "
                     f"{s.goodput.fraction * 100:.1f}% of requests met their SLO")
    return "\n".join(lines)
