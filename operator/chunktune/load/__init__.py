"""The load driver: replay a workload profile against an OpenAI-compatible server with Locust.

Public names (imported lazily, so ``import chunktune.load.prompts`` stays cheap and nothing
here imports gevent or Locust; only :mod:`chunktune.load.users` and :mod:`chunktune.load.runner`
do, in the Locust child process):

* prompts: :func:`count_tokens`, :func:`count_chat_tokens`, :class:`PromptSynth`;
* running: :class:`DriverConfig`, :func:`run_load`, :func:`resolve_model`, :class:`Progress`,
  :class:`LoadRunError`;
* results: :class:`LoadSummary` (schema :data:`SCHEMA_ID`, :data:`SUMMARY_JSON_SCHEMA`),
  :class:`RequestRecord`, :class:`Slo`, :func:`goodput`, :func:`build_summary`,
  :func:`percentile`, :func:`format_summary`.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "count_tokens": "prompts", "count_chat_tokens": "prompts", "PromptSynth": "prompts",
    "DriverConfig": "config",
    "run_load": "launcher", "resolve_model": "launcher", "Progress": "launcher",
    "LoadRunError": "launcher",
    "LoadSummary": "summary", "SCHEMA_ID": "summary", "SUMMARY_JSON_SCHEMA": "summary",
    "Slo": "summary", "Window": "summary", "ClassSummary": "summary",
    "RequestRecord": "records",
    "goodput": "aggregate", "build_summary": "aggregate",
    "percentile": "stats", "MetricStats": "stats",
    "format_summary": "report",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    mod = _NAMES.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_NAMES])
