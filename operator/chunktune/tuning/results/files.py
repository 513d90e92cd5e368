"""The files ``--out`` writes: ``result.json`` (versioned, :data:`SCHEMA_ID`) and the plots;
and the reader of ``result.json``, which refuses a version it does not know.

``result.json`` is public (the README's "What is public"): a new field may be added under the
same version; a field removed or changing meaning takes a new version. Top level::

    schema        "chunktune.dev/result/v1"
    tool          {name, version}       the chunktune that wrote it
    objectives    [{key, direction}]
    constraints   ["chat.itl_p99 <= 60ms", ...]
    baseline, best                      a trial: {number, params, state, reason, metrics,
                                        constraints_ok, flags, peak?, repeats?, noisy?}
    improvement   the first objective's change from the baseline to the best ("-34%")
    pareto_front  [trial]; trials: [trial]
    importances   {metric, trials, needed, resamples, params: {name: {median, p10, p90}}}:
                  PED-ANOVA over bootstrap resamples; params empty below ``needed`` trials
    no_result     only when no trial produced a result: why, the states and reasons counted
                  ("no trial produced a result: 31 SKIPPED PredictedEngineOOM (...)")
    ...           what the command adds (stop_reason, storage, name, wall_s; twin)
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import optuna

from chunktune import __version__
from chunktune.core import infile
from chunktune.core.errors import SpecError
from chunktune.core.flags import flags_line
from chunktune.core.infile import shown
from chunktune.core.study_records import TrialRecord
from chunktune.tuning.results import plots
from chunktune.tuning.results.model import Results

#: The version of ``result.json`` this chunktune writes and reads.
SCHEMA_ID = "chunktune.dev/result/v1"
#: The largest result.json read.
MAX_RESULT_BYTES = 256 * 2**20


def to_json(results: Results, **extra: Any) -> dict[str, Any]:
    """``result.json``'s document; ``extra`` adds top-level fields."""
    def tr(t: TrialRecord | None) -> dict[str, Any] | None:
        if t is None:
            return None
        out = {"number": t.number, "params": dict(t.params), "state": t.state,
               "reason": t.reason, "metrics": dict(t.metrics),
               "constraints_ok": t.constraints_ok, "flags": flags_line(dict(t.params))}
        if t.peak:
            out["peak"] = dict(t.peak)  # the busiest step's use of each limit flag
        if t.repeats:
            out["repeats"] = list(t.repeats)  # metrics: the mean of these trials' (not noisy's)
            if t.noisy:
                out["noisy"] = list(t.noisy)
        return out

    return {
        "schema": SCHEMA_ID,
        "tool": {"name": "chunktune", "version": __version__},
        "objectives": [{"key": o.key, "direction": o.direction} for o in results.objectives],
        "constraints": [c.text() for c in results.constraints],
        "baseline": tr(results.baseline_trial),
        "best": tr(results.best_trial),
        "improvement": results.improvement(),
        "pareto_front": [tr(results.configuration(n)) for n in results.pareto],
        "trials": [tr(t) for t in results.trials],
        **({"no_result": results.no_result} if results.no_result else {}),
        **extra,
    }


def read_result(path: str | Path) -> dict[str, Any]:
    """A ``result.json``, checked to be one this chunktune reads (:data:`SCHEMA_ID`). A file
    without ``schema`` was written before the file was versioned, in the layout of v1, and is
    read as v1. Raises :class:`~chunktune.core.errors.SpecError` naming the file and the fix."""
    p = Path(path)
    text = infile.read_text(p, field=str(p), max_bytes=MAX_RESULT_BYTES, name="the file")
    doc = infile.json_value(text, where="the file", field=str(p))
    if not isinstance(doc, dict):
        raise SpecError("is not a result.json (not a JSON object)", field=str(p))
    schema = doc.get("schema", SCHEMA_ID)
    if schema != SCHEMA_ID:
        said = repr(schema) if isinstance(schema, str) and re.fullmatch(r"[\w./-]{1,64}",
                                                                        schema) else shown(schema)
        raise SpecError(f"has schema {said}; this chunktune ({__version__}) reads "
                        f"{SCHEMA_ID!r}: read it with the chunktune that wrote it "
                        f"({(doc.get('tool') or {}).get('version', 'version unknown')}), or "
                        "rewrite it from the study's storage with `chunktune results STORAGE "
                        "--out DIR`", field=str(p))
    return dict(doc)


def write_outputs(out: Path, results: Results, study: optuna.Study,
                  importances: plots.Importances | None = None, **extra: Any) -> list[Path]:
    """``result.json`` and the plots (HTML with plotly, PNG with matplotlib); ``importances``
    (:func:`plots.importances`, computed here when not given) go into both."""
    out.mkdir(parents=True, exist_ok=True)
    imp = importances if importances is not None else plots.importances(study, results)
    written = [out / "result.json"]
    written[0].write_text(json.dumps(to_json(results, importances=imp.to_dict(), **extra),
                                     indent=2) + "\n")
    written += plots.write(out, study, results, imp)
    return written
