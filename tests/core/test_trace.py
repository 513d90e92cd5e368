"""Request traces: the formats, the options, all-or-nothing errors with line numbers, and the
replay as a pure function of (trace, seed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from chunktune.core import trace as trace_mod
from chunktune.core.errors import SpecError
from chunktune.core.workload import generate, load_profile, parse_profile, trace_profile

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "traces" / "azure-conv-sample.csv"


def profile_of(tmp_path: Path, text: str, name: str = "t.csv", **options: object):
    (tmp_path / name).write_text(text)
    return parse_profile({"name": "t", "trace": {"file": name, **options}}, "p",
                         base_dir=tmp_path)


def error_of(tmp_path: Path, text: str, name: str = "t.csv", **options: object) -> str:
    with pytest.raises(SpecError) as e:
        profile_of(tmp_path, text, name, **options)
    return str(e.value)


def test_azure_processed_sample_replays_its_rows():
    p = trace_profile(SAMPLE)
    rows = SAMPLE.read_text().splitlines()[1:]
    specs = generate(p)
    assert len(specs) == len(rows) == 446
    for spec, row in zip(specs, rows, strict=True):
        t, prompt, out = row.split(",")
        assert (spec.arrival, spec.prompt_tokens, spec.output_tokens) == \
            (float(t), int(prompt), int(out))
    assert p.arrival.mode == "trace" and p.class_names() == ["trace"]
    assert p.duration == 90.0  # the last arrival (89.92 s) rounded up to a whole second
    assert p.arrival.rate == pytest.approx(446 / 90)


def test_azure_published_header_counts_from_the_first_timestamp(tmp_path):
    p = profile_of(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                             "2023-11-16 18:15:46.6805900,374,44\n"
                             "2023-11-16 18:15:47.0000000,396,109\n"
                             "2023-11-16 18:16:46.6805900,10,1\n", format="azure")
    assert [(r.arrival, r.prompt_tokens, r.output_tokens) for r in generate(p)] == [
        (0.0, 374, 44), (pytest.approx(0.31941), 396, 109), (pytest.approx(60.0), 10, 1)]


def test_mooncake_jsonl_milliseconds(tmp_path):
    lines = [{"timestamp": 0, "input_length": 6955, "output_length": 52, "hash_ids": [1, 2]},
             {"timestamp": 1500, "input_length": 70, "output_length": 8, "hash_ids": []}]
    p = profile_of(tmp_path, "\n".join(json.dumps(x) for x in lines) + "\n", "m.jsonl")
    assert [(r.arrival, r.prompt_tokens, r.output_tokens) for r in generate(p)] == [
        (0.0, 6955, 52), (1.5, 70, 8)]
    assert p.duration == 2.0


def test_generic_csv_and_jsonl_give_the_same_requests(tmp_path):
    csv_text = ("arrival,prompt_tokens,output_tokens,class,priority,user\n"
                "0.5,100,10,chat,0,a\n1.25,9000,20,doc,1,b\n2,300,30,chat,,c\n")
    jsonl = "".join(json.dumps(d) + "\n" for d in (
        {"arrival": 0.5, "prompt_tokens": 100, "output_tokens": 10, "class": "chat",
         "priority": 0},
        {"arrival": 1.25, "prompt_tokens": 9000, "output_tokens": 20, "class": "doc",
         "priority": 1},
        {"arrival": 2, "prompt_tokens": 300, "output_tokens": 30, "class": "chat"}))
    classes = [{"name": "chat", "priority": 5}, {"name": "doc"}]
    a = profile_of(tmp_path, csv_text, "g.csv", classes=classes)
    b = profile_of(tmp_path, jsonl, "g.jsonl", classes=classes)
    assert generate(a) == generate(b)
    # the class column splits; a row's priority wins over its class's (5)
    assert [(r.cls, r.priority) for r in generate(a)] == [(0, 0), (1, 1), (0, 5)]
    assert a.class_names() == ["chat", "doc"]


def test_split_by_prompt_length_and_by_an_undeclared_column(tmp_path):
    text = "arrival,prompt_tokens,output_tokens,tenant\n0,100,1,x\n1,5000,1,y\n2,2048,1,x\n"
    p = profile_of(tmp_path, text, classes=[
        {"name": "short", "max_prompt_tokens": 2048, "api": "chat"},
        {"name": "long", "priority": 2}])
    assert [(r.cls, r.priority) for r in generate(p)] == [(0, 0), (1, 2), (0, 0)]
    assert [c.api for c in p.classes] == ["chat", "completions"]
    q = profile_of(tmp_path, text, split="column", column="tenant")
    assert q.class_names() == ["x", "y"] and [r.cls for r in generate(q)] == [0, 1, 0]


def test_window_and_speedup(tmp_path):
    text = "arrival,prompt_tokens,output_tokens\n" + "".join(
        f"{t},{10 + t},1\n" for t in range(10))
    p = profile_of(tmp_path, text, start="2s", end="6s", speedup=2)
    assert [(r.arrival, r.prompt_tokens) for r in generate(p)] == [
        (0.0, 12), (0.5, 13), (1.0, 14), (1.5, 15)]
    assert p.duration == 2.0  # the window's 4 s at twice the speed
    # a duration override cuts the replay; warm-up marks, as for any profile
    assert len(generate(p.with_overrides(duration=1.0))) == 2


def test_rate_scale_is_a_seeded_function_of_the_trace():
    base = trace_profile(SAMPLE)
    raw = base.to_dict()
    raw["trace"]["rate_scale"] = 2.5
    p = parse_profile(raw, "p")
    a, b = generate(p), generate(p)
    assert a == b and len(a) == round(2.5 * 446)
    assert all(0 <= r.arrival < p.duration for r in a)
    assert [r.arrival for r in a] == sorted(r.arrival for r in a)
    assert [r.rid for r in a] == list(range(len(a)))
    assert p.arrival.rate == pytest.approx(2.5 * 446 / 90)
    other = generate(p.with_overrides(seed=1))
    assert len(other) == len(a) and other != a
    raw["trace"]["rate_scale"] = 0.5
    half = generate(parse_profile(raw, "p"))
    rows = {(r.arrival, r.prompt_tokens, r.output_tokens) for r in generate(base)}
    assert len(half) == 223 and {(r.arrival, r.prompt_tokens, r.output_tokens)
                                 for r in half} <= rows


def test_the_profile_carries_its_requests(tmp_path):
    """to_dict gives the requests inline: JSON (the load driver's config) and YAML (a
    ConfigMap) read back as the same trace and the same request sequence."""
    p = trace_profile(SAMPLE).with_overrides(warmup=5, seed=3)
    again = parse_profile(json.loads(json.dumps(p.to_dict())), "again")
    assert again.trace == p.trace and generate(again) == generate(p)
    assert again.duration == p.duration and again.warmup == 5 and again.seed == 3
    from_yaml = parse_profile(yaml.safe_load(yaml.safe_dump(p.to_dict())), "y")
    assert generate(from_yaml) == generate(p)


def test_profile_file_names_its_trace_relative_to_itself(tmp_path):
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "x.csv").write_text(SAMPLE.read_text())
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({
        "name": "x", "warmup": "10s", "trace": {"file": "traces/x.csv", "end": "60s"}}))
    p = load_profile(tmp_path / "p.yaml")
    assert p.duration == 60.0 and p.warmup == 10.0
    assert len(generate(p)) == sum(1 for r in generate(trace_profile(SAMPLE))
                                   if r.arrival < 60)


def test_chat_prompts_are_raised_to_the_template_minimum(tmp_path):
    p = profile_of(tmp_path, "arrival,prompt_tokens,output_tokens\n0,2,1\n1,50,1\n",
                   classes=[{"name": "c", "api": "chat"}])
    assert [r.prompt_tokens for r in generate(p)] == [8, 50]
    assert p.trace is not None and p.trace.notes == (
        "class c: 1 prompt(s) under 8 tokens raised to 8, the shortest chat prompt",)


@pytest.mark.parametrize(("text", "name", "options", "message"), [
    ("arrival,prompt_tokens,output_tokens\n0,10,1\n1,ten,1\n", "t.csv", {},
     "t.csv line 3: prompt_tokens must be a whole number of tokens >= 1 (got a text of 3 "
     "characters)"),
    ("arrival,prompt_tokens,output_tokens\n0,10,1\n\n5,10,0\n", "t.csv", {},
     "t.csv line 4: output_tokens must be a whole number of tokens >= 1 (got '0')"),
    ("arrival,prompt_tokens,output_tokens\n0,10,1\n-1,10,1\n", "t.csv", {},
     "t.csv line 3: arrival must be a number of seconds >= 0 (got '-1')"),
    ("arrival,prompt_tokens,output_tokens\n5,10,1\n4,10,1\n", "t.csv", {},
     "t.csv line 3: arrival 4s is before the previous request's (5s, line 2); a trace must be "
     "in arrival order (sort it by that column)"),
    ("arrival,prompt_tokens,output_tokens\n0,10,1\n1,10\n", "t.csv", {},
     "t.csv line 3: 2 fields where the header has 3"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1\n', "m.jsonl",
     {}, "m.jsonl line 2: not valid JSON: Expecting ',' delimiter"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 9}\n', "m.jsonl",
     {}, "m.jsonl line 2: missing input_length, output_length (a mooncake trace has "
         "timestamp, input_length, output_length on every line)"),
    ("when,prompt,out\n0,1,1\n", "t.csv", {},
     "t.csv line 1: the header is none of the trace formats (its header has 3 columns, "
         "of which none known)"),
    ("arrival,prompt_tokens,output_tokens\n0,1,1\n", "t.csv", {"format": "azure"},
     "t.csv line 1: this is a generic CSV trace, not the azure format"),
    ("arrival,prompt_tokens,output_tokens,class\n0,1,1,a\n1,1,1,b\n", "t.csv",
     {"classes": [{"name": "a"}]},
     "t.csv line 3: the class here matches no class (the classes take: a)"),
    ("arrival,prompt_tokens,output_tokens\n0,1,1\n1,9000,1\n", "t.csv",
     {"classes": [{"name": "s", "max_prompt_tokens": 100},
                  {"name": "m", "max_prompt_tokens": 1000}]},
     "t.csv line 3: a prompt of 9000 tokens is above every class's max_prompt_tokens"),
    ("arrival,prompt_tokens,output_tokens\n0,1,1\n", "t.csv", {"start": "10s"},
     "t.csv: no request in the window [10s, end) (the trace's arrivals run 0s to 0s)"),
    ("", "t.csv", {}, "t.csv is empty"),
    (",\n , ,\n", "t.csv", {}, "t.csv line 2: no header"),
])
def test_malformed_traces_name_the_line(tmp_path, text, name, options, message):
    err = error_of(tmp_path, text, name, **options)
    assert err.startswith("p.trace.file: ") and message in err, err


def test_bad_options_name_the_field(tmp_path):
    with pytest.raises(SpecError) as e:
        parse_profile({"trace": {"file": "x.csv", "speedup": 0, "colour": 1}}, "p")
    assert dict(e.value.problems) == {
        "p.trace.speedup": "must be >= 0.001 (got 0)",
        "p.trace.colour": "unknown field; allowed: file, data, format, start, end, speedup, "
                          "rate_scale, split, column, classes, max_requests, source"}
    with pytest.raises(SpecError) as e:
        parse_profile({"trace": {"file": "x.csv"}, "arrival": {"mode": "poisson", "rate": 1}},
                      "p")
    assert e.value.problems == [("p.arrival", "a trace profile takes its arrival from the "
                                              "trace; leave arrival out")]
    with pytest.raises(SpecError) as e:
        parse_profile({"trace": {"file": "nope.csv"}}, "p", base_dir=tmp_path)
    assert e.value.problems[0][0] == "p.trace.file" and "does not exist" in str(e.value)
    with pytest.raises(SpecError) as e:
        trace_profile(SAMPLE).with_overrides(rate=3)
    assert e.value.problems[0][0] == "rate" and "speedup or rate_scale" in str(e.value)


def test_huge_traces_are_refused_before_any_replay(tmp_path, monkeypatch):
    """Over the size limit: refused before reading; over max_requests: refused at the line
    that passes it. Never a partial trace."""
    rows = "arrival,prompt_tokens,output_tokens\n" + "".join(f"{i},5,1\n" for i in range(50))
    err = error_of(tmp_path, rows, max_requests=20)
    assert "t.csv line 22: more than 20 requests in the window; narrow it (start, end) or " \
           "raise max_requests (at most 2,000,000)" in err
    assert len(generate(profile_of(tmp_path, rows, max_requests=20, end=20))) == 20
    monkeypatch.setattr(trace_mod, "MAX_TRACE_BYTES", 100)
    for options in ({}, {"max_requests": 1_000_000}):
        err = error_of(tmp_path, rows, **options)
        assert "p.trace.file: t.csv is over the 100 bytes such a file may have (at line " \
               in err, err
