"""Errors shared by every layer.

Domain code raises these; only the command line and the operator translate them into exit codes
or Kubernetes condition reasons.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class ChunktuneError(Exception):
    """Base of every error chunktune raises on purpose."""


class SpecError(ChunktuneError, ValueError):
    """Bad user input: a manifest, a flag, a profile. Lists every problem, each with its field.

    ``problems`` holds ``(field_path, message)`` pairs, so callers can show all of them at once.
    """

    def __init__(self, problems: list[tuple[str, str]] | str, field: str | None = None) -> None:
        if isinstance(problems, str):
            problems = [(field or "", problems)]
        self.problems: list[tuple[str, str]] = list(problems)
        super().__init__("\n".join(_fmt(p, m) for p, m in self.problems))


class Problems(list[tuple[str, str]]):
    """Collects ``(field_path, message)`` problems so that all of them are reported at once."""

    def attempt(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        """``fn(*args, **kwargs)``; a :class:`SpecError` it raises is collected and None
        returned."""
        try:
            return fn(*args, **kwargs)
        except SpecError as e:
            self.extend(e.problems)
            return None

    def check(self) -> None:
        """Raise one :class:`SpecError` holding every problem collected, if any."""
        if self:
            raise SpecError(list(self))


def _fmt(path: str, message: str) -> str:
    return f"{path}: {message}" if path else message


class InfrastructureFault(ChunktuneError):
    """The infrastructure a trial runs on failed for a while (the cluster's API server is
    unreachable or keeps answering 429/5xx past the retry bound). Never a result of the
    trial: the tuner keeps the trial in flight and re-adopts it once the API answers again."""


class BackendUnavailable(ChunktuneError):
    """A trial backend cannot run trials at all (no cluster, no binary): retrying is useless."""
