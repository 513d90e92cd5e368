"""Pure PromQL builders: a trial's engine-side figures, and a deployment's workload.

Every query names its metric by a regular expression that accepts both spellings,
``vllm:num_preemptions_total`` and ``vllm_num_preemptions_total``
(``{__name__=~"vllm(:|_)num_preemptions_total"}``): Prometheus 2.x scraping prometheus-client >=
0.23 over OpenMetrics stores the colons as underscores (toolchain notes), and real vLLM pods
meet the same. Each query is filtered by label matchers that pick the trial's pod — by default
``namespace`` and ``pod`` (what a PodMonitor or ``kubernetes_sd_configs`` relabelling gives), or
``instance`` by the pod IP.

The figures mirror :func:`chunktune.metrics.promtext.server_metrics` (the scrape-based reader),
so a trial's metrics have the same keys whichever source produced them.

A running deployment's workload (``chunktune workload from-prometheus``,
``spec.workload.fromPrometheus``) is read from vLLM's request histograms under a user's label
selector (:class:`LabelSelector`, ``{model_name="llama"}``): :func:`workload_queries` gives the
request rate over the window and its peak over shorter sub-windows, and the prompt and output
length buckets; :mod:`chunktune.metrics.derive` turns the answers into a profile.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from chunktune.core.selectors import LabelSelector

#: Counters (without the ``vllm:`` prefix) whose increase over the load window is reported,
#: with the key each becomes.
COUNTERS: dict[str, str] = {
    "num_preemptions_total": "preemptions",
    "prompt_tokens_total": "prompt_tokens",
    "generation_tokens_total": "generation_tokens",
    "request_success_total": "request_success",
    "prefix_cache_queries_total": "prefix_cache_queries",
    "prefix_cache_hits_total": "prefix_cache_hits",
}
#: Histograms (base names) and the key prefix of their quantiles.
HISTOGRAMS: dict[str, str] = {
    "request_queue_time_seconds": "queue_time",
    "time_to_first_token_seconds": "server_ttft",
    "inter_token_latency_seconds": "server_itl",
}
KV_USAGE = "kv_cache_usage_perc"
QUANTILES = (0.5, 0.99)


def escape(value: str) -> str:
    """A label value inside double quotes."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metric_name(name: str) -> str:
    """``__name__`` matcher for a vLLM metric in both spellings (``name`` without prefix)."""
    name = re.sub(r"^vllm[:_]", "", name)
    return f'__name__=~"vllm(:|_){re.escape(name)}"'


def matchers(labels: Mapping[str, str], regex: Mapping[str, str] | None = None) -> str:
    """``a="x",b=~"y"`` from exact and regular-expression matchers (sorted, escaped)."""
    parts = [f'{k}="{escape(v)}"' for k, v in sorted(labels.items())]
    parts += [f'{k}=~"{escape(v)}"' for k, v in sorted((regex or {}).items())]
    return ",".join(parts)


@dataclass(frozen=True)
class PodSelector:
    """Which series belong to the trial's engine."""

    namespace: str
    pod: str
    ip: str | None = None
    by: str = "pod"
    """``pod`` (labels ``namespace`` and ``pod``) or ``instance`` (``instance`` = the pod IP
    with any port)."""

    def text(self) -> str:
        if self.by == "instance":
            if not self.ip:
                raise ValueError("selecting by instance needs the pod IP")
            return matchers({}, {"instance": f"{re.escape(self.ip)}(:[0-9]+)?"})
        return matchers({"namespace": self.namespace, "pod": self.pod})


def series(name: str, sel: PodSelector | LabelSelector) -> str:
    """``{__name__=~"vllm(:|_)NAME",<matchers>}``."""
    matchers_ = sel.text()
    return "{" + metric_name(name) + ("," + matchers_ if matchers_ else "") + "}"


def _range(seconds: float) -> str:
    return f"{max(1, round(seconds))}s"


def counter_increase(name: str, sel: PodSelector, seconds: float) -> str:
    """The increase of a counter over the last ``seconds`` (summed over engines and
    labels)."""
    return f"sum(increase({series(name, sel)}[{_range(seconds)}]))"


def histogram_quantile(q: float, name: str, sel: PodSelector, seconds: float) -> str:
    """Quantile ``q`` of a histogram's observations over the last ``seconds``."""
    bucket = series(f"{name}_bucket", sel)
    return (f"histogram_quantile({q:g}, sum by (le) "
            f"(increase({bucket}[{_range(seconds)}])))")


def gauge_max(name: str, sel: PodSelector, seconds: float, step: float = 1.0) -> str:
    """The largest value of a gauge over the last ``seconds`` (a subquery at ``step``)."""
    return (f"max(max_over_time({series(name, sel)}[{_range(seconds)}:"
            f"{_range(step)}]))")


#: vLLM's request histograms a workload is derived from (observed once per finished request).
PROMPT_TOKENS = "request_prompt_tokens"
GENERATION_TOKENS = "request_generation_tokens"
#: vLLM's prefix-cache counters, in prompt tokens: looked up, and found cached.
PREFIX_CACHE_QUERIES = "prefix_cache_queries_total"
PREFIX_CACHE_HITS = "prefix_cache_hits_total"
#: vLLM's speculative-decoding counters: verifications, draft tokens, accepted tokens.
SPEC_DECODE_COUNTERS = {"spec_drafts": "spec_decode_num_drafts_total",
                        "spec_draft_tokens": "spec_decode_num_draft_tokens_total",
                        "spec_accepted": "spec_decode_num_accepted_tokens_total"}
#: Server-side latency histograms a production SLO is read from, by metric base name.
LATENCY_HISTOGRAMS = {"ttft": "time_to_first_token_seconds",
                      "itl": "inter_token_latency_seconds",
                      "e2e": "e2e_request_latency_seconds"}


def buckets(name: str, sel: PodSelector | LabelSelector, seconds: float) -> str:
    """A histogram's cumulative bucket counts over the last ``seconds``, one sample per ``le``
    (summed over engines and other labels)."""
    return f"sum by (le) (increase({series(f'{name}_bucket', sel)}[{_range(seconds)}]))"


def peak_rate(name: str, sel: LabelSelector, seconds: float, sub: float) -> str:
    """The highest per-second rate of a counter over any ``sub``-second stretch of the last
    ``seconds`` (sliding: a subquery evaluated every fifth of ``sub``)."""
    step = max(1.0, sub / 5)
    return (f"max_over_time(sum(rate({series(name, sel)}[{_range(sub)}]))"
            f"[{_range(seconds)}:{_range(step)}])")


def workload_queries(sel: LabelSelector, seconds: float, sub: float) -> dict[str, str]:
    """The queries of a workload derivation over the last ``seconds``: requests (finished,
    counted by the prompt-length histogram), their peak rate over ``sub``-second stretches,
    how many series match, both length histograms' buckets and sums, the prompt tokens
    the prefix cache was asked for and found, and the speculative-decoding counters."""
    count = f"{PROMPT_TOKENS}_count"
    return {
        "prefix_queries": f"sum(increase({series(PREFIX_CACHE_QUERIES, sel)}"
                          f"[{_range(seconds)}]))",
        "prefix_hits": f"sum(increase({series(PREFIX_CACHE_HITS, sel)}[{_range(seconds)}]))",
        "requests": f"sum(increase({series(count, sel)}[{_range(seconds)}]))",
        "peak_rate": peak_rate(count, sel, seconds, sub),
        "series": f"count(last_over_time({series(count, sel)}[{_range(seconds)}]))",
        "prompt_sum": f"sum(increase({series(PROMPT_TOKENS + '_sum', sel)}"
                      f"[{_range(seconds)}]))",
        "output_sum": f"sum(increase({series(GENERATION_TOKENS + '_sum', sel)}"
                      f"[{_range(seconds)}]))",
        "prompt_buckets": buckets(PROMPT_TOKENS, sel, seconds),
        "output_buckets": buckets(GENERATION_TOKENS, sel, seconds),
        **{key: f"sum(increase({series(name, sel)}[{_range(seconds)}]))"
           for key, name in SPEC_DECODE_COUNTERS.items()},
    }


def label_values(label: str, seconds: float) -> str:
    """The values of ``label`` on vLLM's request histograms over the last ``seconds`` (what
    an error names when a selector matches nothing)."""
    count = f"{PROMPT_TOKENS}_count"
    return (f"count by ({label}) (last_over_time({{{metric_name(count)}}}"
            f"[{_range(seconds)}]))")


def trial_queries(sel: PodSelector, seconds: float) -> dict[str, str]:
    """Every query of a trial's load window, by the metric key it yields; evaluate each at
    the window's end."""
    out = {key: counter_increase(name, sel, seconds) for name, key in COUNTERS.items()}
    for name, key in HISTOGRAMS.items():
        for q in QUANTILES:
            out[f"{key}_p{int(q * 100)}"] = histogram_quantile(q, name, sel, seconds)
    out["kv_cache_usage_peak"] = gauge_max(KV_USAGE, sel, seconds)
    return out


__all__ = ["COUNTERS", "GENERATION_TOKENS", "HISTOGRAMS", "LATENCY_HISTOGRAMS",
           "PREFIX_CACHE_HITS", "PREFIX_CACHE_QUERIES", "PROMPT_TOKENS",
           "PodSelector", "buckets", "counter_increase", "escape", "gauge_max",
           "histogram_quantile", "label_values", "matchers", "metric_name", "peak_rate",
           "series", "trial_queries", "workload_queries"]
