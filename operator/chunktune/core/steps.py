"""vLLM's per-step log: one :class:`StepRecord` per engine step, parsed from its log lines.

With ``--enable-logging-iteration-details`` vLLM
(:data:`~chunktune.core.vllm_release.VLLM_VERSION`) logs every engine step as::

    (APIServer pid=8177) INFO 12-03 00:25:21 [loggers.py:199] Engine 000: Iteration(0):
    1 context requests, 10 context tokens, 0 generation requests, 0 generation tokens,
    iteration elapsed time: 10.80 ms, CPU KV cache usage: 0.0%

(one line). "Context" is prefill (a chunk of a prompt), "generation" is decode. The sequence
of records is a trace of the real scheduler and its step times: what the simulator's step
plans are compared against and what its step-time model is calibrated from. Pure: text in,
records out; :func:`write_steps` / :func:`read_steps` store them as JSON lines.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from chunktune.core import infile
from chunktune.core.errors import SpecError
from chunktune.core.infile import shown
from chunktune.core.stats import weighted_percentile

#: The largest count (requests, tokens, the step counter) a stored step may carry.
MAX_STEP_COUNT = 10**12
#: The longest step (ms) a stored step may take: an hour.
MAX_STEP_MS = 3_600_000.0
#: The largest step log read, and the most steps it may hold.
MAX_STEP_LOG_BYTES = 512 * 2**20
MAX_STEP_LOG_STEPS = 2_000_000


#: How many of a record's unknown keys an error names (a file of another kind has dozens).
SHOWN_KEYS = 5


def _strict(d: Mapping[str, object], fields: Mapping[str, object],
            optional: Iterable[str] = ()) -> None:
    """Raise ValueError for a key ``d`` has that ``fields`` lacks, or a missing one."""
    extra = [k for k in d if k not in fields]
    if extra:
        known = [k for k in extra if len(k) <= 40 and re.fullmatch(r"[a-z_]+", k)]
        named = ", ".join(known[:SHOWN_KEYS]) or "(not a field name)"
        if len(extra) > min(len(known), SHOWN_KEYS):
            named += f" (of {len(extra)})"
        raise ValueError(f"unknown key{'s' if len(extra) > 1 else ''} {named}; allowed: "
                         f"{', '.join(fields)}")
    missing = [k for k in fields if k not in d and k not in optional]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")

#: One ``Iteration(N)`` line (the prefix before ``Engine`` is free: pid, level, time, source).
ITERATION_RE = re.compile(
    r"(?:Engine (?P<engine>\d{1,6}): )?Iteration\((?P<iteration>\d{1,12})\): "
    r"(?P<context_requests>\d{1,9}) context requests?, "
    r"(?P<context_tokens>\d{1,9}) context tokens?, "
    r"(?P<generation_requests>\d{1,9}) generation requests?, "
    r"(?P<generation_tokens>\d{1,9}) generation tokens?, "
    r"iteration elapsed time: (?P<elapsed_ms>\d{1,9}(?:\.\d{1,9})?) ms(?P<dummy> \(dummy\))?"
    r"(?:, (?P<device>[A-Za-z]+) KV cache usage: (?P<kv_usage_pct>\d{1,3}(?:\.\d{1,9})?)%)?"
)


@dataclass(frozen=True)
class StepRecord:
    """One engine step as vLLM logged it."""

    iteration: int
    """vLLM's step counter (from 0 for each engine)."""
    context_requests: int
    """Requests with prompt tokens in this step (prefill chunks)."""
    context_tokens: int
    """Prompt tokens computed in this step."""
    generation_requests: int
    """Requests decoding in this step."""
    generation_tokens: int
    """Tokens generated in this step."""
    elapsed_ms: float
    """The step's wall time, as vLLM measured it."""
    kv_usage_pct: float | None = None
    """KV-cache usage after the step, percent (None when the line has none)."""
    engine: int = 0
    """The engine index (data parallel), ``Engine 000`` -> 0."""

    @property
    def tokens(self) -> int:
        """Tokens scheduled in this step (what ``--max-num-batched-tokens`` bounds)."""
        return self.context_tokens + self.generation_tokens

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> StepRecord:
        """A record from :meth:`to_dict`'s form, checked: whole counts from 0 to
        :data:`MAX_STEP_COUNT`, a finite step time from 0 to :data:`MAX_STEP_MS`, a KV usage
        from 0 to 100%. Raises ValueError naming the field (never its value's text)."""
        _strict(d, cls.__dataclass_fields__, ("kv_usage_pct", "engine"))
        for k in ("iteration", "context_requests", "context_tokens", "generation_requests",
                  "generation_tokens", "engine"):
            v = d.get(k, 0)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_STEP_COUNT:
                raise ValueError(f"{k} must be a whole number from 0 to {MAX_STEP_COUNT} "
                                 f"(got {shown(v)})")
        for k, top, unit in (("elapsed_ms", MAX_STEP_MS, " ms"), ("kv_usage_pct", 100, "%")):
            v = d.get(k, 0)
            if v is None and k == "kv_usage_pct":
                continue
            if not isinstance(v, int | float) or isinstance(v, bool) or not 0 <= v <= top:
                raise ValueError(f"{k} must be a number from 0 to {top:g}{unit} (got "
                                 f"{shown(v)})")
        return cls(**d)  # type: ignore[arg-type]


def parse_line(line: str) -> StepRecord | None:
    """The record of one log line, or None when the line is not an ``Iteration`` line (or is
    a data-parallel engine's ``(dummy)`` step, which runs no request)."""
    m = ITERATION_RE.search(line)
    if m is None or m["dummy"]:
        return None
    kv = m["kv_usage_pct"]
    return StepRecord(
        iteration=int(m["iteration"]),
        context_requests=int(m["context_requests"]),
        context_tokens=int(m["context_tokens"]),
        generation_requests=int(m["generation_requests"]),
        generation_tokens=int(m["generation_tokens"]),
        elapsed_ms=float(m["elapsed_ms"]),
        kv_usage_pct=float(kv) if kv is not None else None,
        engine=int(m["engine"]) if m["engine"] is not None else 0,
    )


def format_line(record: StepRecord, device: str = "GPU") -> str:
    """The ``Iteration`` text the supported vLLM logs for a record (after its ``INFO ...
    [loggers.py]`` prefix): :func:`parse_line`'s inverse, up to the rounding of the time (0.01 ms)
    and the KV usage (0.1 %). ``device`` names the KV cache (``GPU``/``CPU``); a record without
    a usage gets 0.0 %, as vLLM always logs one."""
    return (f"Engine {record.engine:03d}: Iteration({record.iteration}): "
            f"{record.context_requests} context requests, {record.context_tokens} context tokens, "
            f"{record.generation_requests} generation requests, "
            f"{record.generation_tokens} generation tokens, "
            f"iteration elapsed time: {record.elapsed_ms:.2f} ms, "
            f"{device} KV cache usage: {record.kv_usage_pct or 0.0:.1f}%")


def parse_steps(lines: Iterable[str]) -> list[StepRecord]:
    """Every ``Iteration`` record in ``lines`` (other lines are skipped), in log order."""
    return [r for r in map(parse_line, lines) if r is not None]


def iteration_lines(lines: Iterable[str]) -> Iterator[str]:
    """The raw ``Iteration`` lines of a log, unchanged (for keeping next to the parse)."""
    return (line for line in lines if ITERATION_RE.search(line))


@dataclass(frozen=True)
class StepSummary:
    """Totals over a step log: what a results table or a calibration check needs first."""

    steps: int
    context_tokens: int
    generation_tokens: int
    max_step_tokens: int
    mean_elapsed_ms: float
    total_elapsed_ms: float
    itl_band_s: tuple[float, float] | None = None
    """The engine's ITL half a percentile either side of its p99 (:func:`itl_band`)."""
    max_running: int = 0
    """The most requests one step scheduled (prefill chunks and decodes: what
    ``--max-num-seqs`` bounds). With :attr:`max_step_tokens`, what tells whether a limit ever
    bound (:data:`LIMIT_USE`)."""

    @classmethod
    def of(cls, records: list[StepRecord]) -> StepSummary:
        total = sum(r.elapsed_ms for r in records)
        return cls(
            steps=len(records),
            context_tokens=sum(r.context_tokens for r in records),
            generation_tokens=sum(r.generation_tokens for r in records),
            max_step_tokens=max((r.tokens for r in records), default=0),
            mean_elapsed_ms=total / len(records) if records else 0.0,
            total_elapsed_ms=total,
            itl_band_s=itl_band(records),
            max_running=max((r.context_requests + r.generation_requests for r in records),
                            default=0),
        )


#: The engine limits a step log shows the use of: the flag, and the :class:`StepSummary`
#: field with the most any step used of it. A run whose use stayed below a limit's value ran
#: as it would have with any value above its use: the limit never decided anything.
LIMIT_USE = {"max-num-seqs": "max_running", "max-num-batched-tokens": "max_step_tokens"}


def kv_usage_peak(records: Iterable[StepRecord]) -> float | None:
    """The largest KV-cache usage after any step, as a fraction (vLLM logs percent; the
    ``vllm:kv_cache_usage_perc`` gauge is a fraction); None when no record has one. Every step
    counts, so this is the peak a sampled gauge can only approach."""
    kv = [r.kv_usage_pct for r in records if r.kv_usage_pct is not None]
    return max(kv) / 100 if kv else None


def engine_itl(records: Iterable[StepRecord], q: float = 99.0) -> float | None:
    """The inter-token latency the engine itself gave, in seconds: the ``q``-th percentile of
    step time over the decoded tokens (each step counted once per request decoding in it).
    A client cannot see tokens faster than this; what it sees beyond it was added outside the
    engine's steps (scheduling between steps, the API server, the network, the client, or
    other work on the host). None when no step decoded."""
    recs = list(records)
    return weighted_percentile([r.elapsed_ms / 1e3 for r in recs],
                               [r.generation_requests for r in recs], q)


#: :func:`itl_band`: how far either side of the p99 the band reaches (percentiles), and
#: :func:`on_cliff`: the band's top over its bottom that makes the p99 a cliff.
BAND_WIDTH = 0.5
CLIFF_RATIO = 2.0


def itl_band(records: Iterable[StepRecord], q: float = 99.0, width: float = BAND_WIDTH
             ) -> tuple[float, float] | None:
    """The engine's ITL (:func:`engine_itl`) at the ``q - width`` and ``q + width``
    percentiles, seconds; None when no step decoded.

    A tail percentile of a short load is unstable where the step-time distribution jumps
    near it: when about 1% of the decoded tokens waited on long steps (a long prompt's prefill
    chunk beside them), the p99 is either a decode step's time or a long step's, depending on
    how many decodes happened to share those steps in that run. On the real CPU engine, one
    configuration's engine ITL p99 was 14.9 ms in one run (0.55% of the tokens in steps over
    40 ms) and 74.8 ms in the next (1.18%), with the same requests."""
    recs = list(records)
    lo, hi = engine_itl(recs, q - width), engine_itl(recs, q + width)
    if lo is None or hi is None:
        return None
    return lo, hi


def on_cliff(band: tuple[float, float] | None) -> str | None:
    """Why the p99 of a trial with this :func:`itl_band` is not a stable figure, or None."""
    if band is None or not band[0] > 0 or band[1] < CLIFF_RATIO * band[0]:
        return None
    return (f"the engine's ITL goes from {band[0] * 1e3:.1f} ms at p{99 - BAND_WIDTH:g} to "
            f"{band[1] * 1e3:.1f} ms at p{99 + BAND_WIDTH:g}: about 1% of the tokens waited "
            "on long steps, so a p99 of this load lands on either side from one run to the next")


#: :func:`outside_engine`: client ITL p99 above ``HOST_FACTOR`` times the engine's own plus
#: ``HOST_SLACK_S`` is flagged (the slack leaves room for the engine's own work between steps,
#: scheduling and output processing, which its step times leave out). On the real CPU engine
#: (engine, API server and load client on 2 shared cores) about half the trials saw 1.1-1.6
#: times the engine's figure and the rest 2.4-9 times (docs/tuning.md, "Noisy measurements").
HOST_FACTOR = 2.0
HOST_SLACK_S = 0.005


#: :func:`burst_delivery`: clients' ITL p50 below this (seconds) is tokens arriving together.
BURST_ITL_S = 0.0001


def burst_delivery(metrics: Mapping[str, float]) -> str | None:
    """Why a trial's clients received its tokens in bursts, or None: an ITL p50 of 0
    (``itl_p50`` under :data:`BURST_ITL_S`) while the engine decoded a token per step (its
    step log gave ``engine_itl_p99``). At least half the tokens then reached the client
    together with the one before them: the API server or the load client fell behind the
    engine. On the real CPU engine this happened only while other work ran on the 2-core host,
    and came with a TTFT p50 of 57-118 ms against 13-15 ms undisturbed (the sixth bench
    session). (An engine that streams several tokens a step, with speculative decoding or a
    stream interval above 1, would show it too; chunktune tunes neither.)"""
    p50, engine = metrics.get("itl_p50"), metrics.get("engine_itl_p99")
    if p50 is None or engine is None or not engine > 0 or p50 >= BURST_ITL_S:
        return None
    return (f"clients saw ITL p50 {p50 * 1e3:.1f} ms: at least half the tokens arrived in "
            "bursts, together with the one before them, so the API server or the load client "
            "fell behind the engine (other work on the host)")


def outside_engine(metrics: Mapping[str, float]) -> str | None:
    """Why a trial's measured latencies were set outside the engine, or None: the clients'
    ITL p99 (``itl_p99``) far above what the engine's steps gave (``engine_itl_p99``, from its
    step log), or tokens delivered in bursts (:func:`burst_delivery`). Such a measurement says
    more about the host than about the configuration. (A p99 on a cliff, :func:`on_cliff`, can
    also put the clients' p99 on the long steps where the engine's, over all its tokens, is
    not: that measurement does not repeat either.)"""
    burst = burst_delivery(metrics)
    if burst is not None:
        return burst
    client, engine = metrics.get("itl_p99"), metrics.get("engine_itl_p99")
    if client is None or engine is None or not engine > 0:
        return None
    if client <= HOST_FACTOR * engine + HOST_SLACK_S:
        return None
    return (f"clients saw ITL p99 {client * 1e3:.1f} ms while the engine's own steps gave "
            f"{engine * 1e3:.1f} ms: {client / engine:.1f}x, the rest added outside the engine "
            "(API server, network, load client or other work on the host)")


def host_added(metrics: Mapping[str, float], band: tuple[float, float] | None) -> str | None:
    """Why a trial's latencies were set by the host rather than by its configuration, or None:
    :func:`outside_engine`, unless the engine's own ITL explains the clients' p99 (a p99 on a
    cliff, :func:`on_cliff`, whose clients' figure lies inside the engine's ``band``: about 1%
    of the engine's tokens waited on long steps and the clients' p99 landed on them; that
    figure is the configuration's, however unstable)."""
    why = outside_engine(metrics)
    if why is None or burst_delivery(metrics) is not None:
        return why
    client = metrics.get("itl_p99")
    if band is not None and on_cliff(band) is not None and client is not None \
            and client <= band[1]:
        return None
    return why


#: vLLM's start-up lines that say which engine wrote a log (the supported release:
#: ``Initializing a V1 LLM engine (vX.Y.Z) with config: model='...', ...`` and ``CPU KV cache
#: size: 130,944 tokens``).
ENGINE_RE = re.compile(r"Initializing a V\d+ LLM engine \(v(?P<version>[^)]{1,64})\) with "
                       r"config: model='(?P<model>[^']{0,512})'")
KV_SIZE_RE = re.compile(r"(?P<device>[A-Za-z]{1,16})(?: \+ host)? KV cache size: "
                        r"(?P<n>\d[0-9,]{0,18}) tokens")
#: The step budget the engine runs with, whoever chose it (vLLM's SchedulerConfig logs it at
#: start-up: ``Chunked prefill is enabled with max_num_batched_tokens=8192.``), and the
#: flags set on its command line (``non-default args: {'model': ..., 'max_num_seqs': 128}``;
#: vLLM 0.32 logs max_num_seqs nowhere else).
BUDGET_RE = re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=(?P<n>\d{1,12})")
NON_DEFAULT_SEQS_RE = re.compile(r"non-default args: .*'max_num_seqs': (?P<n>\d{1,12})")


@dataclass(frozen=True)
class StepLogMeta:
    """What a log says about the engine that wrote it (None where it does not say)."""

    model: str | None = None
    """The model vLLM loaded (its ``--model``: a repo id or a directory)."""
    vllm_version: str | None = None
    kv_cache_tokens: int | None = None
    """KV-cache capacity in tokens (what turns the steps' usage % into tokens)."""
    device: str | None = None
    """``CPU`` or ``GPU``, from the KV-cache size line."""
    max_num_batched_tokens: int | None = None
    """The step budget the engine started with (its default where the flag was not given)."""
    max_num_seqs: int | None = None
    """``--max-num-seqs`` where the command line set it (vLLM logs no default)."""

    def to_dict(self) -> dict[str, object]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, d: object) -> StepLogMeta:
        """:meth:`to_dict`'s form, checked (texts of at most 512 characters, whole numbers
        from 1 to :data:`MAX_STEP_COUNT`); ValueError naming the field."""
        if not isinstance(d, dict):
            raise ValueError(f"meta must be a mapping (got {shown(d)})")
        _strict(d, cls.__dataclass_fields__, cls.__dataclass_fields__)
        for k, v in d.items():
            text = k in ("model", "vllm_version", "device")
            if v is None or (text and isinstance(v, str) and len(v) <= 512):
                continue
            if not text and isinstance(v, int) and not isinstance(v, bool) \
                    and 1 <= v <= MAX_STEP_COUNT:
                continue
            raise ValueError(f"meta.{k} must be {'a text' if text else 'a whole number >= 1'} "
                             f"(got {shown(v)})")
        return cls(**d)

    def merged(self, other: StepLogMeta) -> StepLogMeta:
        """This, with the fields it lacks taken from ``other``."""
        return StepLogMeta(self.model or other.model, self.vllm_version or other.vllm_version,
                           self.kv_cache_tokens or other.kv_cache_tokens,
                           self.device or other.device,
                           self.max_num_batched_tokens or other.max_num_batched_tokens,
                           self.max_num_seqs or other.max_num_seqs)


#: Words on the lines :func:`parse_meta` reads.
_META_KEYS = ("LLM engine", "KV cache size", "max_num_batched_tokens", "non-default args")


def parse_meta(lines: Iterable[str]) -> StepLogMeta:
    """The engine's identity and effective batch limits from a vLLM log's start-up lines."""
    model = version = device = None
    kv = budget = seqs = None
    for line in lines:
        if (m := ENGINE_RE.search(line)) is not None:
            model, version = m["model"], m["version"]
        elif (k := KV_SIZE_RE.search(line)) is not None:
            kv, device = int(k["n"].replace(",", "")), k["device"]
        elif (b := BUDGET_RE.search(line)) is not None:
            budget = int(b["n"])
        elif (s := NON_DEFAULT_SEQS_RE.search(line)) is not None:
            seqs = int(s["n"])
    return StepLogMeta(model, version, kv, device, budget, seqs)


def write_steps(path: str | Path, records: Iterable[StepRecord],
                meta: StepLogMeta | None = None) -> Path:
    """Store records as JSON lines (one object per step), after a ``{"meta": ...}`` line
    when ``meta`` says anything."""
    p = Path(path)
    head = json.dumps({"meta": meta.to_dict()}, sort_keys=True) + "\n" \
        if meta is not None and meta.to_dict() else ""
    p.write_text(head + "".join(json.dumps(r.to_dict(), sort_keys=True) + "\n"
                                for r in records))
    return p


#: The file a trial's step records go to in a steps directory (the raw lines: same name, ``.log``).
STEPS_SUFFIX = ".steps.jsonl"


def step_log_path(steps_dir: str | Path, tag: str) -> Path:
    """Where :func:`keep_step_log` keeps the steps of the trial named ``tag``."""
    return Path(steps_dir) / f"{tag}{STEPS_SUFFIX}"


def keep_step_log(lines: Iterable[str], steps_dir: str | Path | None, tag: str
                  ) -> tuple[list[StepRecord], Path | None]:
    """A trial engine's log -> its step records, and, with ``steps_dir``, the file they were
    kept in: ``<tag>.steps.jsonl`` (:func:`write_steps`, with the log's :class:`StepLogMeta`)
    and the raw ``Iteration`` lines beside it (``<tag>.steps.log``). No file when the log has
    no steps. The backends' one writer (local processes, Kubernetes pods)."""
    lines = list(lines)
    raw = list(iteration_lines(lines))
    records = parse_steps(raw)
    if steps_dir is None or not raw:
        return records, None
    out = step_log_path(steps_dir, tag)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_steps(out, records, parse_meta(lines))
    out.with_suffix(".log").write_text("".join(x if x.endswith("\n") else x + "\n" for x in raw))
    return records, out


def read_step_log(path: str | Path, field: str = "--log"
                  ) -> tuple[list[StepRecord], StepLogMeta]:
    """Records and engine identity from :func:`write_steps`'s file or a raw vLLM log, read
    through :func:`chunktune.core.infile.lines` (a regular file of at most
    :data:`MAX_STEP_LOG_BYTES`, UTF-8, at most :data:`MAX_STEP_LOG_STEPS` steps). Raises
    :class:`SpecError` under ``field`` naming the file and the line."""
    name = str(path)
    lines = infile.lines(path, field=field, max_bytes=MAX_STEP_LOG_BYTES, name=name)
    first = next(lines, None)
    if first is None:
        return [], StepLogMeta()
    if not first[1].lstrip().startswith("{"):
        text = []  # the start-up lines parse_meta reads, not the whole log
        records = []
        for n, line in itertools.chain([first], lines):
            if any(k in line for k in _META_KEYS):
                text.append(line)
            if (r := parse_line(line)) is not None:
                records.append(r)
                _count(records, name, n, field)
        return records, parse_meta(text)
    records, meta = [], StepLogMeta()
    for n, line in itertools.chain([first], lines):
        if not line.strip():
            continue
        d = infile.json_value(line, where=f"{name} line {n}", field=field)
        try:
            if isinstance(d, dict) and set(d) == {"meta"}:
                meta = StepLogMeta.from_dict(d["meta"])
            elif isinstance(d, dict):
                records.append(StepRecord.from_dict(d))
                _count(records, name, n, field)
            else:
                raise ValueError(f"a step record is a JSON object (got {shown(d)})")
        except (ValueError, TypeError) as e:
            raise SpecError(f"{name} line {n} is not a step record: {e}", field=field) from e
    return records, meta


def _count(records: list[StepRecord], name: str, n: int, field: str) -> None:
    if len(records) > MAX_STEP_LOG_STEPS:
        raise SpecError(f"{name} line {n}: more than {MAX_STEP_LOG_STEPS:,} steps; give a "
                        "shorter log", field=field)


def read_steps(path: str | Path) -> list[StepRecord]:
    """Records from :func:`write_steps`'s file, or parsed from a raw vLLM log."""
    return read_step_log(path)[0]
