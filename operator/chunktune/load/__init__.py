"""The load driver: replay a workload profile against an OpenAI-compatible server with Locust.

Public names (imported lazily, so ``import chunktune.load.prompts`` stays cheap and nothing
here imports gevent or Locust; only :mod:`chunktune.load.users` and :mod:`chunktune.load.runner`
do, in the Locust child process). The summary types, records, percentiles and the token rule
live in :mod:`chunktune.core` (the simulator and the tuner share them) and are listed here too:

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
    "count_tokens": "chunktune.core.tokens", "count_chat_tokens": "chunktune.core.tokens",
    "PromptSynth": "chunktune.load.prompts",
    "DriverConfig": "chunktune.load.config",
    "run_load": "chunktune.load.launcher", "resolve_model": "chunktune.load.launcher",
    "Progress": "chunktune.load.launcher", "LoadRunError": "chunktune.load.launcher",
    "LoadSummary": "chunktune.core.summary", "SCHEMA_ID": "chunktune.core.summary",
    "SUMMARY_JSON_SCHEMA": "chunktune.core.summary", "Slo": "chunktune.core.summary",
    "Window": "chunktune.core.summary", "ClassSummary": "chunktune.core.summary",
    "RequestRecord": "chunktune.core.records",
    "goodput": "chunktune.core.aggregate", "build_summary": "chunktune.core.aggregate",
    "percentile": "chunktune.core.stats", "MetricStats": "chunktune.core.stats",
    "format_summary": "chunktune.load.report",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    mod = _NAMES.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_NAMES])
