"""A corpus of hostile input files, per file surface: what each reader must refuse, and the
words (the file, the line or field) its one-line error must hold.

Every file carries :data:`SECRET` where a careless reader would quote it (a header, a key, a
value, an alias, a line too long, bytes that are not UTF-8): no error may echo it. Besides the
files written here, every surface gets the same non-files (a FIFO, a directory, ``/dev/zero``,
``/proc/self/environ`` and a link to it) and the same broken texts (not UTF-8, CR-only line
ends, a line past the limit, a file past the size limit): :func:`generic`.

``surface`` is one of ``manifest`` (``chunktune validate``), ``profile`` (``--workload``),
``trace`` (``--trace``), ``calibration`` (``--calibration``), ``steps`` (``calibrate --log``),
``storage`` (``results FILE``, ``--storage``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

#: Planted in every hostile file; never to appear in any output.
SECRET = "zx-SECRET-4471-do-not-echo"

#: What each surface's file must be called (the readers tell formats by content, not name).
SUFFIX = {"manifest": ".yaml", "profile": ".yaml", "trace": ".csv", "calibration": ".json",
          "steps": ".steps.jsonl", "storage": ".log"}

SURFACES = tuple(SUFFIX)


@dataclass(frozen=True)
class Hostile:
    id: str
    surface: str
    content: bytes | None
    """The file's bytes; None for a special path (:attr:`special`)."""
    expect: tuple[str, ...]
    """Words the error must hold (besides the file's name)."""
    special: str | None = None
    """``fifo``, ``dir``, ``/dev/zero``, ``/proc/self/environ``, ``link-environ``."""
    suffix: str | None = None


MANIFEST_HEAD = ("apiVersion: chunktune.dev/v1alpha1\nkind: ChunkedPrefillTuning\n"
                 "metadata: {name: h}\nspec:\n  engine: {kind: sim, model: llama-3.1-8b, "
                 "gpu: {type: h100-sxm}}\n")
TRACE_HEAD = "arrival,prompt_tokens,output_tokens\n"


def _m(body: str) -> bytes:
    return (MANIFEST_HEAD + body).encode()


def _calibration(**edits: object) -> bytes:
    d: dict[str, object] = {
        "kind": "chunktune-calibration", "version": 1, "model": "tiny", "gpu": "cpu",
        "coefficients": {"step_overhead_scale": 1.0, "per_request_scale": 1.0,
                         "linear_scale": 1.0, "attention_scale": 1.0, "per_token_s": 0.0,
                         "per_prefill_pair_s": 0.0, "per_decode_kv_token_s": 0.0},
        "fit": {}, "fitted_on": {}}
    for k, v in edits.items():
        if k.startswith("c_"):
            d["coefficients"][k[2:]] = v  # type: ignore[index]
        else:
            d[k] = v
    return json.dumps(d).encode()


STEP = {"iteration": 0, "context_requests": 1, "context_tokens": 10, "generation_requests": 0,
        "generation_tokens": 0, "elapsed_ms": 10.5, "kv_usage_pct": 1.0, "engine": 0}


def _steps(**edits: object) -> bytes:
    return (json.dumps(STEP) + "\n" + json.dumps({**STEP, "iteration": 1, **edits})
            + "\n").encode()


def generic(surface: str) -> list[Hostile]:
    """What every file surface must refuse alike."""
    out = [Hostile(f"{surface}-{s.strip('/').replace('/', '-')}", surface, None,
                   ("regular file",), special=s)
           for s in ("fifo", "dir", "/dev/zero", "/proc/self/environ", "link-environ")]
    out += [
        Hostile(f"{surface}-not-utf8", surface, b"\xff\xfe" + SECRET.encode() + b"\n# ok\n",
                ("line 1", "UTF-8")),
        Hostile(f"{surface}-cr-only", surface,
                f"# {SECRET}\r# a line\r# another\r".encode(), ("line 1", "CR")),
        Hostile(f"{surface}-huge-line", surface, b"# " + SECRET.encode() * 90_000 + b"\n",
                ("line 1", "longer than 1 MiB")),
    ]
    return out


HOSTILE: list[Hostile] = [
    # ---- manifests (chunktune validate) ----
    Hostile("manifest-duplicate-key", "manifest", _m("  engine: {kind: sim}\n"),
            ("line 6", "twice")),
    Hostile("manifest-inf", "manifest", _m("  budget: {maxTrials: .inf}\n"),
            ("line 6", "finite")),
    Hostile("manifest-nan", "manifest", _m("  budget: {maxTrials: .NaN}\n"),
            ("line 6", "finite")),
    Hostile("manifest-huge-int", "manifest", _m("  budget: {maxTrials: " + "9" * 5000 + "}\n"),
            ("line 6", "too long")),
    Hostile("manifest-deep", "manifest", _m("  x: " + "[" * 20_000 + "]" * 20_000 + "\n"),
            ("nested",)),
    Hostile("manifest-many-nodes", "manifest",
            _m("  searchSpace: [" + ", ".join("1" for _ in range(30_000)) + "]\n"),
            ("more than 10000 values",)),
    Hostile("manifest-alias-bomb", "manifest",
            _m("  x: &a [" + SECRET + "]\n" + "".join(
                f"  y{i}: &a{i} [" + ", ".join([f"*a{i - 1}" if i else "*a"] * 9) + "]\n"
                for i in range(9))), ("alias",)),
    Hostile("manifest-syntax", "manifest", _m(f"  x: *{SECRET}\n"), ("line 6", "alias")),
    Hostile("manifest-control-char", "manifest", _m(f"  x: \x01{SECRET}\n"),
            ("control character",)),
    Hostile("manifest-inline-trace-absolute", "manifest",
            _m("  workload:\n    inline:\n      trace: {file: /etc/passwd}\n"),
            ("spec.workload.inline.trace.file", "relative")),
    Hostile("manifest-inline-trace-dotdot", "manifest",
            _m("  workload:\n    inline:\n      trace: {file: ../../etc/passwd}\n"),
            ("spec.workload.inline.trace.file", "relative")),
    Hostile("manifest-trace-speedup-tiny", "manifest",
            _m("  workload:\n    trace: {configMapKeyRef: {name: t, key: t.csv}, "
               "speedup: 1.0e-300}\n"), ("spec.workload.trace.speedup",)),
    Hostile("manifest-oversize", "manifest", _m(f"# {SECRET}\n" * 90_000),
            ("over the 2 MiB",)),
    # ---- workload profiles (--workload) ----
    Hostile("profile-duration-overflow", "profile",
            b"arrival: {mode: poisson, rate: 1}\nduration: '1e400'\n"
            b"classes: [{name: a, prompt_tokens: 10, output_tokens: 10}]\n", ("duration",)),
    Hostile("profile-duration-inf", "profile",
            b"arrival: {mode: poisson, rate: 1}\nduration: .inf\n"
            b"classes: [{name: a, prompt_tokens: 10, output_tokens: 10}]\n",
            ("line 2", "finite")),
    Hostile("profile-rate-1e12", "profile",
            b"arrival: {mode: poisson, rate: 1e12}\nduration: 60\n"
            b"classes: [{name: a, prompt_tokens: 10, output_tokens: 10}]\n", ("arrival.rate",)),
    Hostile("profile-too-many-requests", "profile",
            b"arrival: {mode: constant, rate: 1000}\nduration: 1h\n"
            b"classes: [{name: a, prompt_tokens: 10, output_tokens: 10}]\n",
            ("arrival.rate", "2,000,000")),
    Hostile("profile-weight-huge", "profile",
            b"arrival: {mode: poisson, rate: 1}\nclasses:\n"
            b"  - {name: a, weight: 1.0e+300, prompt_tokens: 10, output_tokens: 10}\n"
            b"  - {name: b, prompt_tokens: 10, output_tokens: 10}\n",
            ("classes[0].weight",)),
    Hostile("profile-bound-huge", "profile",
            b"arrival: {mode: poisson, rate: 1}\nclasses:\n  - name: a\n"
            b"    prompt_tokens: {dist: uniform, min: 1, max: 1e300}\n    output_tokens: 10\n",
            ("prompt_tokens.max",)),
    Hostile("profile-sigma-huge", "profile",
            b"arrival: {mode: poisson, rate: 1}\nclasses:\n  - name: a\n"
            b"    prompt_tokens: {dist: lognormal, mean: 100, sigma: 1e200}\n"
            b"    output_tokens: 10\n", ("prompt_tokens.sigma",)),
    Hostile("profile-shared-prefix-huge", "profile",
            b"arrival: {mode: poisson, rate: 1}\nclasses:\n  - name: a\n"
            b"    prompt_tokens: 10\n    output_tokens: 10\n"
            b"    shared_prefix: {tokens: 100000000000000000000}\n",
            ("shared_prefix.tokens",)),
    Hostile("profile-duplicate-key", "profile",
            b"arrival: {mode: poisson, rate: 1}\narrival: {mode: poisson, rate: 100}\n"
            b"classes: [{name: a, prompt_tokens: 10, output_tokens: 10}]\n",
            ("line 2", "twice")),
    Hostile("profile-trace-environ", "profile", b"trace: {file: /proc/self/environ}\n",
            ("trace.file", "/proc")),
    Hostile("profile-trace-speedup-tiny", "profile",
            b"trace: {file: ok.csv, speedup: 1e-300}\n", ("trace.speedup",)),
    Hostile("profile-trace-class-value", "profile",
            b"trace: {file: classes.csv, split: column, classes: [{name: a}]}\n",
            ("line 3", "matches no class")),
    # ---- traces (--trace) ----
    Hostile("trace-passwd-header", "trace",
            f"root:x:0:0:{SECRET}:/root:/bin/bash\n".encode(), ("line 1", "header")),
    Hostile("trace-secret-keys", "trace", (json.dumps({SECRET: 1}) + "\n").encode(),
            ("line 1", "keys")),
    Hostile("trace-jsonl-1e308", "trace",
            b'{"arrival": 0, "prompt_tokens": 5, "output_tokens": 1}\n'
            b'{"arrival": 1, "prompt_tokens": 1e308, "output_tokens": 1}\n',
            ("line 2", "prompt_tokens", "10,000,000")),
    Hostile("trace-csv-10e23", "trace", (TRACE_HEAD + "0,5,1\n1," + "1" + "0" * 23
                                         + ",1\n").encode(), ("line 3", "prompt_tokens")),
    Hostile("trace-csv-5000-digits", "trace", (TRACE_HEAD + "0," + "9" * 5000 + ",1\n").encode(),
            ("line 2", "prompt_tokens")),
    Hostile("trace-jsonl-deep", "trace",
            b'{"arrival": 0, "prompt_tokens": 5, "output_tokens": 1, "x": '
            + b"[" * 100_000 + b"]" * 100_000 + b"}\n", ("line 1", "nested")),
    Hostile("trace-jsonl-nan", "trace",
            b'{"arrival": NaN, "prompt_tokens": 5, "output_tokens": 1}\n', ("line 1", "NaN")),
    Hostile("trace-jsonl-duplicate-key", "trace",
            b'{"arrival": 0, "prompt_tokens": 5, "prompt_tokens": 9000, "output_tokens": 1}\n',
            ("line 1", "twice")),
    Hostile("trace-jsonl-priority-fraction", "trace",
            b'{"arrival": 0, "prompt_tokens": 5, "output_tokens": 1, "priority": 1.9}\n',
            ("line 1", "priority", "whole")),
    Hostile("trace-azure-year-1", "trace",
            b"TIMESTAMP,ContextTokens,GeneratedTokens\n0001-01-01 00:00:00.0,5,1\n",
            ("line 2", "TIMESTAMP")),
    Hostile("trace-azure-year-9999", "trace",
            b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,5,1\n"
            b"9999-12-31 23:59:59.9,5,1\n", ("line 3", "TIMESTAMP")),
    Hostile("trace-duplicate-column", "trace",
            b"arrival,prompt_tokens,prompt_tokens,output_tokens\n0,5,9000,1\n",
            ("line 1", "twice")),
    Hostile("trace-arrival-nan", "trace", (TRACE_HEAD + "nan,5,1\n").encode(),
            ("line 2", "arrival")),
    Hostile("trace-arrival-overflow", "trace", (TRACE_HEAD + "1e400,5,1\n").encode(),
            ("line 2", "arrival")),
    Hostile("trace-arrival-centuries", "trace", (TRACE_HEAD + "0,5,1\n1e10,5,1\n").encode(),
            ("line 3", "arrival")),
    Hostile("trace-secret-token-value", "trace", (TRACE_HEAD + f"0,{SECRET},1\n").encode(),
            ("line 2", "prompt_tokens")),
    Hostile("trace-csv-field-past-limit", "trace",
            (TRACE_HEAD + '0,"' + SECRET * 8000 + '",1\n').encode(), ("line 2",)),
    Hostile("trace-csv-nul", "trace", (TRACE_HEAD + f"0,5,1\x00{SECRET}\n").encode(),
            ("line 2",)),
    # ---- calibration profiles (--calibration) ----
    Hostile("calibration-infinity", "calibration",
            _calibration(c_linear_scale=1.0).replace(b'"linear_scale": 1.0',
                                                     b'"linear_scale": Infinity'),
            ("Infinity",)),
    Hostile("calibration-nan", "calibration",
            _calibration().replace(b'"linear_scale": 1.0', b'"linear_scale": NaN'), ("NaN",)),
    Hostile("calibration-1e400", "calibration",
            _calibration().replace(b'"linear_scale": 1.0', b'"linear_scale": 1e400'),
            ("largest float",)),
    Hostile("calibration-1e308", "calibration", _calibration(c_linear_scale=1e308),
            ("coefficients.linear_scale",)),
    Hostile("calibration-negative", "calibration", _calibration(c_per_token_s=-1e-3),
            ("coefficients.per_token_s",)),
    Hostile("calibration-all-zero", "calibration", _calibration(
        c_step_overhead_scale=0.0, c_per_request_scale=0.0, c_linear_scale=0.0,
        c_attention_scale=0.0), ("all 0",)),
    Hostile("calibration-model-secret", "calibration", _calibration(model=SECRET * 20),
            ("model",)),
    Hostile("calibration-string-coefficient", "calibration",
            _calibration(c_linear_scale=SECRET), ("coefficients.linear_scale",)),
    Hostile("calibration-duplicate-key", "calibration",
            _calibration().replace(b'"model": "tiny"', b'"model": "tiny", "model": "x"'),
            ("twice",)),
    Hostile("calibration-deep", "calibration",
            _calibration().replace(b'"fit": {}', b'"fit": ' + b"[" * 5000 + b"]" * 5000),
            ("nested",)),
    Hostile("calibration-not-object", "calibration", json.dumps([SECRET]).encode(),
            ("not a calibration profile",)),
    # ---- step logs (calibrate --log) ----
    Hostile("steps-string-tokens", "steps", _steps(context_tokens=SECRET),
            ("line 2", "context_tokens")),
    Hostile("steps-nan-time", "steps",
            _steps().replace(b'"elapsed_ms": 10.5, "kv_usage_pct": 1.0, "engine": 0}\n',
                             b'"elapsed_ms": NaN, "kv_usage_pct": 1.0, "engine": 0}\n', 1),
            ("line 1", "NaN")),
    Hostile("steps-negative-time", "steps", _steps(elapsed_ms=-5.0),
            ("line 2", "elapsed_ms")),
    Hostile("steps-1e308-time", "steps", _steps(elapsed_ms=1e308), ("line 2", "elapsed_ms")),
    Hostile("steps-kv-over-100", "steps", _steps(kv_usage_pct=250.0),
            ("line 2", "kv_usage_pct")),
    Hostile("steps-secret-key", "steps", _steps(**{SECRET: 1}), ("line 2", "unknown key")),
    Hostile("steps-bool-count", "steps", _steps(context_requests=True),
            ("line 2", "context_requests")),
    Hostile("steps-meta-secret", "steps",
            (json.dumps({"meta": {"model": SECRET * 40}}) + "\n").encode(),
            ("line 1", "meta.model")),
    Hostile("steps-not-object", "steps", (json.dumps(STEP) + "\n[1, 2]\n").encode(),
            ("line 2",)),
    Hostile("steps-raw-huge-counts", "steps",
            (f"{SECRET} Iteration(0): 1 context requests, " + "9" * 5000
             + " context tokens, 0 generation requests, 0 generation tokens, iteration elapsed "
               "time: 10.0 ms\n").encode(), ("no vLLM step lines",), suffix=".log"),
    # ---- stored studies (results FILE, --storage) ----
    Hostile("storage-garbage-journal", "storage", f"{SECRET}\n".encode(), ("line 1",)),
    Hostile("storage-journal-not-optuna", "storage",
            (json.dumps({"x": SECRET}) + "\n").encode(), ("line 1", "Optuna")),
    Hostile("storage-garbage-sqlite", "storage", SECRET.encode() * 100,
            ("not an SQLite database",), suffix=".db"),
]

for _s in SURFACES:
    HOSTILE += generic(_s)
