"""What one load run does: the settings the launcher hands to the Locust process (pure, JSON)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from chunktune.core.workload import Profile, parse_profile

__all__ = ["DriverConfig"]


@dataclass(frozen=True)
class DriverConfig:
    """A load run's settings, after the command line's overrides are applied to the profile."""

    target: str
    """Base URL of the OpenAI-compatible server, e.g. ``http://127.0.0.1:8000``."""
    model: str
    """Served model name sent in every request."""
    profile: dict[str, Any]
    """The workload profile (``Profile.to_dict()``), overrides included."""
    drain_timeout: float = 60.0
    """Seconds requests still in flight at the end of the arrival window may take to finish;
    those still running then fail with reason ``timeout``."""
    token_ids: bool = False
    """Send completions prompts as token-id lists (exact length on any server)."""
    connect_timeout: float = 10.0
    request_timeout: float = 300.0
    """Read timeout: the longest silence within one response before it fails (``timeout``)."""
    api_key: str | None = None
    window: float | None = None
    """Emit window marks every this many seconds (``--windows``)."""
    tick: float = 0.5
    """Seconds between progress ticks."""
    locust_csv: str | None = None
    """Write Locust's own CSV statistics with this prefix."""
    extra_headers: dict[str, str] = field(default_factory=dict)
    load_workers: int = 0
    """Locust workers (``workload.loadWorkers``): 0 runs the load in one process; N > 0 runs
    Locust's master and N workers, one schedule split across them
    (:mod:`chunktune.load.distributed`)."""
    master_bind: str = "127.0.0.1"
    """Where the master listens for its workers."""
    master_port: int = 0
    """The master's port (0: a free one)."""
    spawn_workers: bool = True
    """Start the workers as local processes; False: wait for N workers to connect (a worker
    Job in a cluster)."""

    def parsed_profile(self) -> Profile:
        return parse_profile(self.profile, source=str(self.profile.get("name") or "profile"))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DriverConfig:
        return cls(**d)
