"""Workload profiles: parsing with field-named errors, and deterministic generation."""

from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest
import yaml

from chunktune.core.distributions import (
    Choice,
    Constant,
    Exponential,
    Histogram,
    LogNormal,
    Normal,
    Uniform,
    parse_distribution,
)
from chunktune.core.errors import SpecError
from chunktune.core.workload import (
    PROFILE_DIR,
    generate,
    load_profile,
    parse_duration,
    parse_profile,
)


def base() -> dict:
    return {
        "name": "t", "arrival": {"mode": "poisson", "rate": 10}, "duration": 100, "warmup": 5,
        "classes": [{"name": "a", "weight": 1,
                     "prompt_tokens": {"dist": "uniform", "min": 10, "max": 20},
                     "output_tokens": {"dist": "constant", "value": 5}}],
    }


@pytest.mark.parametrize("name", ["mixed", "chat", "long-context", "rag", "smoke"])
def test_shipped_profiles_load(name):
    p = load_profile(name)
    assert p.name == name and p.classes and p.duration > p.warmup
    assert load_profile(PROFILE_DIR / f"{name}.yaml") == p


def test_mixed_has_long_context_beside_chat():
    p = load_profile("mixed")
    long_ctx, chat = (c for c in p.classes)
    assert isinstance(long_ctx.prompt_tokens, Uniform) and long_ctx.prompt_tokens.low >= 8192
    assert long_ctx.prompt_tokens.min is None  # uniform's min/max are its range, not a clip
    assert isinstance(chat.prompt_tokens, LogNormal) and chat.prompt_tokens.max == 1000


@pytest.mark.parametrize(("text", "seconds"), [
    (90, 90.0), ("90s", 90.0), ("10m", 600.0), ("1h30m", 5400.0), ("250ms", 0.25), ("1.5", 1.5),
])
def test_durations(text, seconds):
    assert parse_duration(text, "x") == seconds


@pytest.mark.parametrize(("mutate", "path", "fragment"), [
    (lambda d: d.pop("classes"), "t.classes", "non-empty list"),
    (lambda d: d["classes"][0].update(weight=0), "t.classes[0].weight", "> 0"),
    (lambda d: d["classes"][0].update(api="grpc"), "t.classes[0].api", "completions, chat"),
    (lambda d: d["classes"][0]["prompt_tokens"].update(dist="zipf"),
     "t.classes[0].prompt_tokens.dist", "one of"),
    (lambda d: d["classes"][0]["prompt_tokens"].update(min=30), "t.classes[0].prompt_tokens",
     "min must be <= max"),
    (lambda d: d["classes"][0]["output_tokens"].pop("value"), "t.classes[0].output_tokens.value",
     "required"),
    (lambda d: d["classes"][0]["output_tokens"].update(value=-3),
     "t.classes[0].output_tokens.value", "> 0"),
    (lambda d: d["arrival"].update(mode="burst"), "t.arrival.mode", "poisson, constant"),
    (lambda d: d["arrival"].update(rate=0), "t.arrival.rate", "> 0"),
    (lambda d: d.update(arrival={"mode": "concurrency"}), "t.arrival.concurrency", "integer"),
    (lambda d: d.update(duration="ten minutes"), "t.duration", "duration such as"),
    (lambda d: d.update(warmup=200), "t.warmup", "shorter than duration"),
    (lambda d: d.update(extra=1), "t.extra", "unknown field"),
    (lambda d: d["classes"].append(dict(d["classes"][0])), "t.classes[1].name", "duplicate"),
    (lambda d: d["classes"][0]["prompt_tokens"].pop("dist"), "t.classes[0].prompt_tokens.dist",
     "is required: one of constant, uniform"),
    (lambda d: d["classes"][0]["prompt_tokens"].update(sigma=2),
     "t.classes[0].prompt_tokens.sigma", "not a field of dist uniform; allowed: max, min"),
    (lambda d: d["classes"][0].update(output_tokens={"dist": "choice", "values": [1, 2],
                                                    "weights": [1]}),
     "t.classes[0].output_tokens.weights", "as many entries as values (2)"),
    (lambda d: d["classes"][0].update(output_tokens={"dist": "normal", "mean": 9}),
     "t.classes[0].output_tokens.std", "is required for dist normal"),
    (lambda d: d["classes"][0].update(output_tokens="lots"), "t.classes[0].output_tokens",
     "a number or a mapping"),
    (lambda d: d["classes"][0].update(weight=True), "t.classes[0].weight", "must be a number"),
    (lambda d: d.update(seed=1.5), "t.seed", "must be an integer"),
    (lambda d: d["classes"][0].update(shared_prefix={"tokens": 0}),
     "t.classes[0].shared_prefix.tokens", "> 0"),
    (lambda d: d["classes"][0].update(shared_prefix={"tokens": 64, "groups": 0}),
     "t.classes[0].shared_prefix.groups", "> 0"),
    (lambda d: d["classes"][0].update(shared_prefix={"tokens": 64, "share": 1}),
     "t.classes[0].shared_prefix.share", "unknown field"),
])
def test_bad_profiles_name_the_field(mutate, path, fragment):
    d = base()
    mutate(d)
    with pytest.raises(SpecError) as e:
        parse_profile(d, source="t")
    paths = [p for p, _ in e.value.problems]
    assert path in paths, e.value.problems
    assert fragment in dict(e.value.problems)[path]


def test_all_problems_at_once():
    d = base()
    d["arrival"]["rate"] = -1
    d["classes"][0]["weight"] = "heavy"
    d["duration"] = "x"
    with pytest.raises(SpecError) as e:
        parse_profile(d, source="t")
    assert len(e.value.problems) == 3


def test_malformed_yaml_file(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("classes: [unclosed")
    with pytest.raises(SpecError) as e:
        load_profile(f)
    assert "not valid YAML" in str(e.value)
    with pytest.raises(SpecError, match="no profile file"):
        load_profile("does-not-exist")


def test_generation_is_deterministic_and_follows_the_profile():
    p = parse_profile(base())
    a, b = generate(p), generate(p)
    assert a == b
    assert generate(p.with_overrides(seed=1)) != a
    rate = len(a) / p.duration
    assert rate == pytest.approx(10, rel=0.15)
    assert all(10 <= r.prompt_tokens <= 20 and r.output_tokens == 5 for r in a)
    gaps = [y.arrival - x.arrival for x, y in itertools.pairwise(a)]
    assert statistics.mean(gaps) == pytest.approx(0.1, rel=0.15)


def test_class_weights_and_constant_arrivals():
    d = base()
    d["arrival"] = {"mode": "constant", "rate": 4}
    d["classes"].append({"name": "b", "weight": 3, "prompt_tokens": 7, "output_tokens": 2})
    p = parse_profile(d)
    reqs = generate(p)
    assert [r.arrival for r in reqs[:3]] == [0.0, 0.25, 0.5]
    share_b = sum(r.cls == 1 for r in reqs) / len(reqs)
    assert share_b == pytest.approx(0.75, abs=0.08)


def test_shared_openings_are_drawn_apart_from_the_sequence():
    """A class's ``shared_prefix``: each request takes one of its openings (uniformly) and
    shares its first ``tokens`` tokens (all of a shorter prompt); the arrivals and lengths are
    the ones the profile gives without openings, and a class without them has none."""
    d = base()
    d["classes"][0]["prompt_tokens"] = {"dist": "uniform", "min": 10, "max": 200}
    d["classes"].append({"name": "b", "prompt_tokens": 50, "output_tokens": 2})
    plain = generate(parse_profile(d))
    d["classes"][0]["shared_prefix"] = {"tokens": 100, "groups": 3}
    p = parse_profile(d)
    shared = generate(p)
    assert [(r.arrival, r.prompt_tokens, r.output_tokens, r.cls) for r in shared] == \
        [(r.arrival, r.prompt_tokens, r.output_tokens, r.cls) for r in plain]
    a = [r for r in shared if r.cls == 0]
    assert all(r.prefix_tokens == min(100, r.prompt_tokens) for r in a)
    assert {r.prefix_group for r in a} == {0, 1, 2}
    assert sum(r.prefix_group == 0 for r in a) / len(a) == pytest.approx(1 / 3, abs=0.08)
    assert {r.prefix_key for r in a} == {"0/0", "0/1", "0/2"}
    assert all(r.prefix_group == -1 and r.prefix_tokens == 0 and r.prefix_key is None
               for r in shared if r.cls == 1)
    assert generate(p) == shared
    # the file form keeps the openings
    assert parse_profile(yaml.safe_load(yaml.safe_dump(p.to_dict()))) == p
    assert p.to_dict()["classes"][0]["shared_prefix"] == {"tokens": 100, "groups": 3}
    assert "shared_prefix" not in p.to_dict()["classes"][1]


def test_round_trip_to_dict():
    p = load_profile("mixed")
    assert parse_profile(yaml.safe_load(yaml.safe_dump(p.to_dict())), source="mixed") == p


@pytest.mark.parametrize(("raw", "kind", "mean"), [
    ({"dist": "constant", "value": 64}, Constant, 64.0),
    (64, Constant, 64.0),
    ({"dist": "uniform", "min": 10, "max": 20}, Uniform, 15.0),
    ({"dist": "normal", "mean": 100, "std": 10, "min": 50}, Normal, 100.0),
    ({"dist": "lognormal", "mean": 500, "sigma": 0.5, "min": 200, "max": 1000}, LogNormal,
     500.0),
    ({"dist": "exponential", "mean": 30, "max": 90}, Exponential, 30.0),
    ({"dist": "choice", "values": [10, 30], "weights": [3, 1]}, Choice, 15.0),
    ({"dist": "histogram", "edges": [0, 100, 200], "weights": [1, 3]}, Histogram, 125.0),
])
def test_each_distribution_is_its_own_type(raw, kind, mean):
    d = parse_distribution(raw, "p")
    assert (type(d), d.mean()) == (kind, mean)
    assert parse_distribution(d.to_dict(), "p") == d  # to_dict is what parse reads back
    rng = random.Random(7)
    draws = [d.sample(rng) for _ in range(200)]
    lo = raw["min"] if isinstance(raw, dict) and "min" in raw else 1
    hi = raw["max"] if isinstance(raw, dict) and "max" in raw else math.inf
    assert all(isinstance(x, int) and max(1, lo) <= x <= hi for x in draws)


def test_histogram_draws_inside_its_buckets_by_weight():
    d = parse_distribution({"dist": "histogram", "edges": [0, 1, 2, 5, 10],
                            "weights": [0, 1, 0, 3]}, "p")
    rng = random.Random(3)
    draws = [d.sample(rng) for _ in range(4000)]
    assert set(draws) <= {2, 6, 7, 8, 9, 10}  # (1, 2] and (5, 10], never an empty bucket
    assert sum(x == 2 for x in draws) / len(draws) == pytest.approx(0.25, abs=0.03)
    assert {6, 10} <= set(draws)  # both ends of a bucket: above its lower edge, up to its upper


@pytest.mark.parametrize(("raw", "path", "fragment"), [
    ({"edges": [0, 10, 5], "weights": [1, 1]}, "p.edges", "must increase"),
    ({"edges": [0, 10, 20], "weights": [1]}, "p.weights", "one entry per bucket"),
    ({"edges": [0, 10], "weights": [0]}, "p.weights", "not all be 0"),
    ({"edges": [5], "weights": []}, "p.edges", "at least 2"),
])
def test_bad_histograms_name_the_field(raw, path, fragment):
    with pytest.raises(SpecError) as e:
        parse_distribution({"dist": "histogram", **raw}, "p")
    assert any(p == path and fragment in m for p, m in e.value.problems), e.value.problems


def test_a_simulator_without_the_cache_is_told_about_shared_openings():
    from chunktune.core.workload import openings_note

    d = base()
    assert openings_note(parse_profile(d), False) is None
    d["classes"][0]["shared_prefix"] = {"tokens": 8}
    d["classes"].append({"name": "b", "prompt_tokens": 9, "output_tokens": 1,
                         "shared_prefix": {"tokens": 4}})
    note = openings_note(parse_profile(d), False)
    assert note is not None and note.startswith("the workload's classes a, b share openings")
    assert "--enable-prefix-caching" in note
    assert openings_note(parse_profile(d), True) is None
