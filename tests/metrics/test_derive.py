"""Deriving a workload from vLLM's histograms (pure), the queries it needs, and drift: what
the derivation makes of known buckets, without a server. The real Prometheus round trip is in
test_from_prometheus.py."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from chunktune.core.distributions import Histogram
from chunktune.core.selectors import LabelSelector
from chunktune.core.workload import generate, parse_profile
from chunktune.metrics import promql
from chunktune.metrics.cli import from_prometheus, profile_yaml
from chunktune.metrics.derive import (
    Buckets,
    DriftLimits,
    Observation,
    WorkloadStats,
    WorkloadUnavailable,
    derive,
    drift,
    stats_of,
)
from tests.metrics.prometheus import free_port

#: vLLM's 1-2-5 token buckets up to 20000.
BOUNDS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000]


def buckets_of(values: list[int]) -> Buckets:
    """What Prometheus' ``sum by (le) (increase(..._bucket))`` gives for these observations."""
    by_le = {str(float(b)): float(sum(v <= b for v in values)) for b in BOUNDS}
    by_le["+Inf"] = float(len(values))
    return Buckets.from_le(by_le)


def observation(prompts: list[int], outputs: list[int], window: float = 600.0,
                peak: float | None = None) -> Observation:
    return Observation(url="http://prom:9090", selector='{model_name="llama"}', window=window,
                       at=1_800_000_000.0, peak_window=60.0, requests=float(len(prompts)),
                       peak_rate=peak, prompt=buckets_of(prompts), output=buckets_of(outputs),
                       prompt_sum=float(sum(prompts)), output_sum=float(sum(outputs)))


def bucket_index(v: float) -> int:
    return next(i for i, b in enumerate(BOUNDS) if v <= b)


def sample(rng: random.Random, n: int) -> tuple[list[int], list[int]]:
    """A chat-and-documents mix: 80% prompts of 100-900 tokens, 20% of 3000-9000."""
    prompts = [rng.randint(100, 900) if rng.random() < 0.8 else rng.randint(3000, 9000)
               for _ in range(n)]
    outputs = [rng.randint(10, 300) for _ in range(n)]
    return prompts, outputs


def test_buckets_read_prometheus_answers() -> None:
    b = Buckets.from_le({"+Inf": 10, "1.0": 2, "5.0": 7, "2.0": 5})
    assert b.bounds == (1.0, 2.0, 5.0, math.inf) and b.cumulative == (2, 5, 7, 10)
    assert b.total == 10
    # histogram_quantile's interpolation, and the largest finite bound for the +Inf bucket
    assert b.quantile(0.5) == pytest.approx(2.0)
    assert b.quantile(0.6) == pytest.approx(2 + 3 * (6 - 5) / 2)
    assert b.quantile(0.99) == 5.0
    assert Buckets.from_le({}).quantile(0.5) is None
    # counts made monotonic (extrapolated increases can dip)
    assert Buckets.from_le({"1": 3, "2": 2.5, "+Inf": 4}).cumulative == (3, 3, 4)


def test_derived_percentiles_and_profile_stay_in_the_true_buckets() -> None:
    prompts, outputs = sample(random.Random(7), 4000)
    d = derive(observation(prompts, outputs, window=1000.0, peak=9.5))
    s = d.stats
    assert s.rate == pytest.approx(4.0) and s.peak_rate == 9.5 and s.requests == 4000
    for q in (0.5, 0.9, 0.99):
        truth = sorted(prompts)[math.ceil(q * len(prompts)) - 1]
        assert bucket_index(s.prompt[f"p{round(q * 100)}"]) == bucket_index(truth)
    assert s.long_threshold == 2000  # 2048 moved to the bucket bound
    assert s.long_share == pytest.approx(sum(p > 2000 for p in prompts) / len(prompts))
    assert s.prompt_mean == pytest.approx(sum(prompts) / len(prompts))
    short, long_ = d.profile.classes
    assert (short.name, long_.name) == ("short", "long")
    assert short.weight + long_.weight == pytest.approx(1.0)
    assert long_.weight == pytest.approx(s.long_share, abs=1e-6)
    assert isinstance(short.prompt_tokens, Histogram)
    assert short.prompt_tokens.edges == (50, 100, 200, 500, 1000)
    assert isinstance(long_.prompt_tokens, Histogram)
    assert long_.prompt_tokens.edges == (2000, 5000, 10000)
    assert d.profile.arrival.mode == "poisson" and d.profile.arrival.rate == 4.0
    # replayed, the profile's prompts land in the buckets in the shares that were observed
    replay = parse_profile(d.profile.to_dict())
    drawn = [r.prompt_tokens for r in generate(replay.with_overrides(rate=200, duration=100))]
    for b in (500, 1000, 2000, 5000):
        seen = sum(p <= b for p in prompts) / len(prompts)
        assert sum(p <= b for p in drawn) / len(drawn) == pytest.approx(seen, abs=0.02), b


def test_peak_rate_and_options() -> None:
    prompts, outputs = sample(random.Random(1), 500)
    obs = observation(prompts, outputs, window=100.0, peak=12.0)
    assert derive(obs, rate_from="peak").profile.arrival.rate == 12.0
    assert derive(obs, rate_from="peak").source["rateFrom"] == "peak"
    # no peak known: the mean, said so
    no_peak = observation(prompts, outputs, window=100.0)
    assert derive(no_peak, rate_from="peak").source["rateFrom"] == "mean"
    d = derive(obs, long_threshold=800, duration=60, name="x")
    assert d.stats.long_threshold == 1000 and d.profile.name == "x"
    assert (d.profile.duration, d.profile.warmup) == (60, 6)  # a tenth of a short duration


def test_one_class_when_nothing_is_long() -> None:
    d = derive(observation([300] * 50, [20] * 50))
    (only,) = d.profile.classes
    assert only.name == "short" and d.stats.long_share == 0


def test_no_request_in_the_window_names_the_selector() -> None:
    obs = observation([], [])
    with pytest.raises(WorkloadUnavailable, match=r'model_name="llama".*window') as e:
        derive(obs)
    assert e.value.reason == "NoRequests"


def test_profile_file_says_where_it_came_from() -> None:
    prompts, outputs = sample(random.Random(3), 300)
    text = profile_yaml(derive(observation(prompts, outputs, window=3600.0, peak=0.2)))
    head = [line for line in text.splitlines() if line.startswith("#")]
    assert '{model_name="llama"}' in head[1] and "1h ending 2027-01-15T08:00:00Z" in head[1]
    assert "peak 0.2 req/s over 1m" in text
    import yaml

    assert parse_profile(yaml.safe_load(text)).classes[0].name == "short"


def test_drift_against_limits() -> None:
    prompts, outputs = sample(random.Random(5), 2000)
    ref = stats_of(observation(prompts, outputs, window=1000.0))
    same = stats_of(observation(prompts, outputs, window=1000.0))
    limits = DriftLimits(rate=0.3, prompt=0.5, long_share=0.1)
    assert drift(ref, same, limits) == []
    busier = stats_of(observation(prompts, outputs, window=500.0))
    (why,) = drift(ref, busier, limits)
    assert why.startswith("arrival rate 2 -> 4 req/s (+100%")
    longer = stats_of(observation([p * 4 for p in prompts], outputs, window=1000.0))
    found = drift(ref, longer, limits)
    assert any(r.startswith("prompt length p50") for r in found)
    assert any(r.startswith("long-prompt share") for r in found)
    # a limit left out is not checked
    assert drift(ref, busier, DriftLimits(prompt=0.5)) == []
    # the status form round-trips
    assert WorkloadStats.from_dict(ref.to_dict()).rate == pytest.approx(ref.rate)


def test_the_production_prefix_cache_hit_rate_is_read_and_its_meaning_said() -> None:
    """vLLM's prefix-cache counters over the window: the share of prompt tokens production
    found cached, in the stats (and the status form), and what it means for trials that
    replay prompts sharing no prefix."""
    prompts, outputs = sample(random.Random(4), 300)
    obs = observation(prompts, outputs)
    cached = dataclasses.replace(obs, prefix_queries=float(sum(prompts)),
                                 prefix_hits=0.6 * sum(prompts))
    derived = derive(cached)
    assert derived.stats.prefix_hit_rate == pytest.approx(0.6)
    assert derived.to_dict()["stats"]["prefixCacheHitRate"] == pytest.approx(0.6)
    assert WorkloadStats.from_dict(derived.stats.to_dict()).prefix_hit_rate == \
        pytest.approx(0.6)
    text = derived.describe()
    assert "prefix cache: 60.0% of prompt tokens found cached" in text
    assert "trials prefill 2.5x the prompt tokens production did" in text
    # a low rate is reported without the note; no lookup is not a rate of 0
    low = derive(dataclasses.replace(cached, prefix_hits=0.05 * sum(prompts)))
    assert "5.0% of prompt tokens found cached" in low.describe()
    assert "note:" not in low.describe() and low.stats.prefix_caveat() is None
    for queries, hits in ((None, None), (0.0, 0.0)):
        off = derive(dataclasses.replace(obs, prefix_queries=queries, prefix_hits=hits))
        assert off.stats.prefix_hit_rate is None
        assert "prefixCacheHitRate" not in off.stats.to_dict()
        assert "prefix cache: no lookups counted" in off.describe()


def test_selectors() -> None:
    sel = LabelSelector.parse('{model_name="llama", namespace=~"prod|canary"}')
    assert str(sel) == '{model_name="llama",namespace=~"prod|canary"}'
    assert sel.labels() == ["model_name", "namespace"]
    assert str(LabelSelector.parse('model_name="a"')) == '{model_name="a"}'
    for bad in ("{model_name=llama}", 'a="b" c="d"', '{__name__="x"}', '{a="b"'):
        with pytest.raises(ValueError):
            LabelSelector.parse(bad)


def test_workload_queries() -> None:
    q = promql.workload_queries(LabelSelector.parse('{model_name="m"}'), 86400, 300)
    assert q["requests"] == ('sum(increase({__name__=~"vllm(:|_)request_prompt_tokens_count",'
                             'model_name="m"}[86400s]))')
    assert q["peak_rate"] == ('max_over_time(sum(rate({__name__=~"vllm(:|_)request_prompt_'
                              'tokens_count",model_name="m"}[300s]))[86400s:60s])')
    assert q["output_buckets"].startswith("sum by (le) (increase({__name__=~\"vllm(:|_)"
                                          "request_generation_tokens_bucket\"")
    assert q["prefix_hits"] == ('sum(increase({__name__=~"vllm(:|_)prefix_cache_hits_total",'
                                'model_name="m"}[86400s]))')
    assert q["prefix_queries"] == q["prefix_hits"].replace("hits", "queries")
    assert promql.series("x", LabelSelector()) == '{__name__=~"vllm(:|_)x"}'


def test_no_prometheus_is_an_error_naming_the_selector() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(WorkloadUnavailable,
                       match=r'\{model_name="prod"\}: Prometheus at .* did not answer '
                             r'\(Connection refused\)') as e:
        from_prometheus(url, '{model_name="prod"}', 3600, timeout=2)
    assert e.value.reason == "PrometheusUnreachable"


def test_the_draft_acceptance_is_derived_from_the_spec_decode_counters() -> None:
    """vLLM's spec-decode counters over the window give the chance a draft token is accepted
    given the ones before it were: 1000 verifications of K=4 drafts that accepted 2.1 tokens
    each on average; every class of the derived profile takes it, the status keeps it, and a
    profile without the counters has none."""
    from chunktune.core.speculative import expected_accepted

    prompts, outputs = sample(random.Random(5), 200)
    obs = dataclasses.replace(observation(prompts, outputs), spec_drafts=1000.0,
                              spec_draft_tokens=4000.0, spec_accepted=2100.0)
    derived = derive(obs)
    a = derived.stats.spec_acceptance
    assert a is not None and 0 < a < 1
    assert 1000 * expected_accepted(a, 4) == pytest.approx(2100, rel=1e-3)
    assert [c.spec_acceptance for c in derived.profile.classes] == [a, a]
    assert derived.to_dict()["stats"]["specAcceptance"] == a
    assert WorkloadStats.from_dict(derived.stats.to_dict()).spec_acceptance == a
    assert "draft token accepted with chance" in derived.describe()
    # the written profile reads back with the acceptance, in range
    again = parse_profile(derived.profile.to_dict())
    assert [c.spec_acceptance for c in again.classes] == [a, a]
    for drafts in (None, 0.0):
        plain = derive(dataclasses.replace(obs, spec_drafts=drafts))
        assert plain.stats.spec_acceptance is None
        assert all(c.spec_acceptance is None for c in plain.profile.classes)
    # the queries read the three counters under both metric spellings
    q = promql.workload_queries(LabelSelector.parse('{model_name="llama"}'), 600, 60)
    assert 'vllm(:|_)spec_decode_num_accepted_tokens_total' in q["spec_accepted"]
