"""Reading and checking ChunkedPrefillTuning manifests.

:func:`validate` reports every problem of a manifest at once, each as ``(field path, message)``
with paths such as ``spec.searchSpace[1].low``. It first checks shapes with the pydantic models,
then, on each part that parsed, the rules between fields (a range's ``low <= high``, a searched
flag that is also fixed in ``engine.args``, an objective on a class the workload lacks, a sampler
that cannot handle the objectives, ...). :func:`parse_manifest` and :func:`load_manifest` raise
:class:`~chunktune.core.errors.SpecError` with those problems, or return the model with defaults
filled in.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from chunktune.api import _checks
from chunktune.api.v1alpha1 import (
    KIND,
    Budget,
    ChunkedPrefillTuning,
    Constraint,
    EngineSpec,
    Objective,
    Parameter,
    PrunerSpec,
    RetuneSpec,
    SamplerSpec,
    Spec,
    StrategySpec,
    WorkloadSpec,
)
from chunktune.core import yamlsafe
from chunktune.core.errors import SpecError
from chunktune.core.suggest import closest
from chunktune.core.validation import Problem, problems_from

M = TypeVar("M", bound=BaseModel)

_SECTIONS = ("", "apiVersion", "kind", "metadata",
             *(f"spec.{f.alias or n}" for n, f in Spec.model_fields.items()), "spec")


#: The deepest nesting a manifest may have (the deepest real one is about 8 levels); deeper
#: input is refused before anything walks it recursively.
MAX_DEPTH = 64


def too_deep(obj: Any, limit: int = MAX_DEPTH) -> str | None:
    """The path of the first value nested more than ``limit`` levels deep, or None. Iterative:
    a document nested 100,000 levels deep costs no stack."""
    stack: list[tuple[Any, str, int]] = [(obj, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > limit:
            return path
        # NOTE: the path names the field (three levels), not the whole way down.
        if isinstance(value, dict):
            stack += [(v, (f"{path}.{k}" if path else str(k)) if depth < 3 else path,
                       depth + 1) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(v, f"{path}[{i}]" if depth < 3 else path, depth + 1)
                      for i, v in enumerate(value)]
    return None


def validate(obj: Any, base_dir: str | Path | None = None,
             trace_data: str | None = None) -> list[Problem]:
    """Every problem of a manifest mapping, as ``(path, message)``; empty when it is valid.

    ``base_dir`` resolves a relative ``spec.workload.profile`` or ``trace.file`` path (the
    manifest's folder); ``trace_data`` is the text of ``spec.workload.trace.configMapKeyRef``
    (read by the operator; without it the trace's content and class names go unchecked)."""
    if not isinstance(obj, dict):
        return [("", f"must be a mapping: a {KIND} manifest (got {type(obj).__name__})")]
    deep = too_deep(obj)
    if deep is not None:
        return [(deep, f"is nested more than {MAX_DEPTH} levels deep; a manifest never "
                       "needs that")]
    problems: list[Problem] = []
    try:
        ChunkedPrefillTuning.model_validate(obj, by_name=False)
    except ValidationError as e:
        problems += problems_from(e, ChunkedPrefillTuning)
    spec = obj.get("spec")
    if isinstance(spec, dict):
        problems += _checks.check(_parts(spec, None if base_dir is None else Path(base_dir),
                                         trace_data))
    return _ordered(problems)


def parse_manifest(obj: Any, base_dir: str | Path | None = None,
                   trace_data: str | None = None) -> ChunkedPrefillTuning:
    """The manifest as a model, defaults filled in (see :func:`validate`). Raises
    :class:`SpecError` listing every problem."""
    problems = validate(obj, base_dir, trace_data)
    if problems:
        raise SpecError(problems)
    m = ChunkedPrefillTuning.model_validate(obj, by_name=False)
    m.spec.workload._base_dir = None if base_dir is None else Path(base_dir)
    if trace_data is not None:
        m.spec.workload.set_trace_data(trace_data)
    return m


def read_manifest(path: str | Path, name: str | None = None) -> dict[str, Any]:
    """The ChunkedPrefillTuning document of a YAML file, as a mapping. A file with several
    documents gives the one of our kind (``name`` picks among several). Raises
    :class:`SpecError`."""
    p = Path(path)
    docs = yamlsafe.read(p, every=True)
    if len(docs) == 1 and isinstance(docs[0], dict) and "kind" not in docs[0]:
        return docs[0]  # let validate() report the missing kind
    ours = [d for d in docs if isinstance(d, dict) and d.get("kind") == KIND]
    named = [str((d.get("metadata") or {}).get("name")) for d in ours]
    if name is not None and ours:
        if name not in named:
            hint = closest(name, named)
            raise SpecError(f"has no {KIND} named {name!r}; its {KIND} documents are "
                            f"named {', '.join(named)}"
                            + (f"; did you mean {hint!r}?" if hint else ""), field=str(p))
        ours = [d for d, n in zip(ours, named, strict=True) if n == name]
    if not ours:
        kinds = sorted({str(d.get("kind")) for d in docs if isinstance(d, dict)})
        found = f" (found: {', '.join(kinds)})" if kinds else ""
        raise SpecError(f"has no {KIND} document{found}", field=str(p))
    if len(ours) > 1:
        names = ", ".join(str((d.get("metadata") or {}).get("name")) for d in ours)
        raise SpecError(f"has {len(ours)} {KIND} documents ({names}); pick one with --name",
                        field=str(p))
    return ours[0]


def load_manifest(path: str | Path, name: str | None = None) -> ChunkedPrefillTuning:
    """Read, validate and parse a manifest file (see :func:`read_manifest`); relative profile
    paths are taken from the file's folder."""
    return parse_manifest(read_manifest(path, name), base_dir=Path(path).parent)


# ---- parts ------------------------------------------------------------------------------------


def _try(cls: type[M], raw: Any, default: bool = True) -> M | None:
    if raw is None and default:
        raw = {}
    try:
        return cls.model_validate(raw, by_name=False)
    except ValidationError:
        return None


def _items(cls: type[M], raw: Any) -> list[tuple[int, M]]:
    if not isinstance(raw, list):
        return []
    out = []
    for i, item in enumerate(raw):
        parsed = _try(cls, item, default=False)
        if parsed is not None:
            out.append((i, parsed))
    return out


def _parts(spec: dict[str, Any], base_dir: Path | None,
           trace_data: str | None = None) -> _checks.Parts:
    engine = _try(EngineSpec, spec.get("engine"), default=False)
    raw_kind = (spec.get("engine") or {}).get("kind", "vllm") \
        if isinstance(spec.get("engine"), dict) else "vllm"
    kind = engine.kind if engine else raw_kind if raw_kind in ("vllm", "sim", "sglang") else None
    workload = _try(WorkloadSpec, spec.get("workload"), default=False)
    if workload is not None:
        workload._base_dir = base_dir
        if trace_data is not None:
            workload.set_trace_data(trace_data)
    raw_objectives = spec.get("objectives")
    raw_constraints = spec.get("constraints")
    pruner_raw = spec.get("pruner")
    defaults = _try(Spec, {"engine": {"kind": kind or "vllm", "model": "x"},
                           "workload": {"profile": "x"}})
    assert defaults is not None
    return _checks.Parts(
        kind=kind,
        engine=engine,
        params=_items(Parameter, spec["searchSpace"]) if spec.get("searchSpace") is not None
        else list(enumerate(defaults.parameters)),
        params_default=spec.get("searchSpace") is None,
        workload=workload,
        objectives=_items(Objective, raw_objectives) if raw_objectives is not None
        else list(enumerate(defaults.objectives)),
        n_objectives=len(raw_objectives) if isinstance(raw_objectives, list) else 1,
        constraints=_items(Constraint, raw_constraints),
        n_constraints=len(raw_constraints) if isinstance(raw_constraints, list) else 0,
        budget=_try(Budget, spec.get("budget")),
        sampler=_try(SamplerSpec, spec.get("sampler")),
        strategy=_try(StrategySpec, spec.get("strategy")),
        pruner=_try(PrunerSpec, pruner_raw),
        pruner_explicit=isinstance(pruner_raw, dict) and "name" in pruner_raw,
        storage=spec.get("storage") if isinstance(spec.get("storage"), str) else None,
        prometheus_url=(spec.get("metrics") or {}).get("prometheusURL")
        if isinstance(spec.get("metrics"), dict) else None,
        retune=spec.get("retune") is not None,
        retune_spec=_try(RetuneSpec, spec.get("retune")) if spec.get("retune") is not None
        else None,
    )


def _ordered(problems: list[Problem]) -> list[Problem]:
    """Problems in manifest order: by section, then list index; duplicates dropped."""

    def key(item: tuple[int, Problem]) -> tuple[int, int, int]:
        seq, (path, _) = item
        section, length = 0, -1
        for i, s in enumerate(_SECTIONS):
            if s and len(s) > length and (path == s or path.startswith((s + ".", s + "["))):
                section, length = i, len(s)
        m = re.match(re.escape(_SECTIONS[section]) + r"\[(\d+)\]", path) if section else None
        return section, int(m.group(1)) if m else -1, seq

    unique = list(dict.fromkeys((path[:300], _short(m)) for path, m in problems))
    return [p for _, p in sorted(enumerate(unique), key=key)]


_LONG_QUOTE = re.compile(r"""(['"])([^'"]{80})[^'"]{40,}\1""")


def _short(message: str, limit: int = 1000) -> str:
    """A message with long quoted values cut (a 1 MB value must not make a 1 MB message,
    condition or event), and at most ``limit`` characters."""
    if len(message) <= 300:
        return message
    message = _LONG_QUOTE.sub(lambda m: f"{m[1]}{m[2]}...{m[1]}", message)
    return message if len(message) <= limit else message[:limit - 9] + " ... (cut)"

