"""What ``loadtest/locustfile.py`` exposes to the ``locust`` command (ad-hoc runs, the web UI).

The profile must be known when Locust imports the locustfile, because the User classes are
made from it; it comes from ``--chunktune-profile`` on the command line (read before Locust
parses it), else ``$CHUNKTUNE_PROFILE``, else the shipped ``smoke`` profile. The module then
holds one abstract ``HttpUser`` per traffic class and a ``ChunktuneDispatcher`` user
(``fixed_count = 1``; run Locust with ``-u 1``) that replays the profile through them when the
test starts, writes the chunktune summary to ``--chunktune-out`` if given, and stops Locust.
Locust's ``--run-time`` is not needed: the profile's duration (``--chunktune-duration``) plus
the drain decide when the test ends.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gevent  # type: ignore[import-untyped]
from locust import User, events, task
from locust.env import Environment
from locust.exception import StopUser

from chunktune.core.workload import Profile, load_profile, parse_duration
from chunktune.load.config import DriverConfig
from chunktune.load.launcher import EventCollector, resolve_model
from chunktune.load.users import Schedule, StreamingOpenAIUser, make_user_classes

__all__ = ["locustfile_namespace", "profile_ref"]

_DEFAULT_PROFILE = "smoke"


def profile_ref(argv: Sequence[str], environ: Mapping[str, str]) -> str:
    """The profile named by ``--chunktune-profile`` in ``argv``, else the environment."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--chunktune-profile")
    known, _ = pre.parse_known_args(list(argv))
    return (known.chunktune_profile or environ.get("CHUNKTUNE_PROFILE")
            or environ.get("LOCUST_CHUNKTUNE_PROFILE") or _DEFAULT_PROFILE)


def _add_arguments(parser: Any) -> None:
    g = parser.add_argument_group("chunktune")
    g.add_argument("--chunktune-profile", env_var="LOCUST_CHUNKTUNE_PROFILE",
                   default=_DEFAULT_PROFILE,
                   help="workload profile file or shipped name (or $CHUNKTUNE_PROFILE)")
    g.add_argument("--chunktune-model", default="",
                   help="served model name (default: the first of GET /v1/models)")
    g.add_argument("--chunktune-out", default="", help="write the chunktune summary here")
    g.add_argument("--chunktune-duration", default="", help="override the profile's duration")
    g.add_argument("--chunktune-warmup", default="", help="override the profile's warm-up")
    g.add_argument("--chunktune-rate", type=float, default=0.0, help="arrivals per second")
    g.add_argument("--chunktune-concurrency", type=int, default=0, help="requests in flight")
    g.add_argument("--chunktune-seed", type=int, default=-1, help="override the seed")
    g.add_argument("--chunktune-drain-timeout", default="60s", help="drain timeout")
    g.add_argument("--chunktune-token-ids", action="store_true", help="prompts as token ids")
    g.add_argument("--chunktune-raw", action="store_true", help="raw records in the summary")


def _config(env: Environment, profile: Profile) -> tuple[DriverConfig, str]:
    o = env.parsed_options
    assert o is not None, "needs Locust's parsed options (run through the locust command)"
    host = (env.host or "").rstrip("/")
    if not host:
        raise ValueError("give the server with --host")
    p = profile.with_overrides(
        duration=parse_duration(o.chunktune_duration, "--chunktune-duration")
        if o.chunktune_duration else None,
        warmup=parse_duration(o.chunktune_warmup, "--chunktune-warmup")
        if o.chunktune_warmup else None,
        rate=o.chunktune_rate or None, concurrency=o.chunktune_concurrency or None,
        seed=None if o.chunktune_seed < 0 else o.chunktune_seed)
    model = o.chunktune_model or resolve_model(host)
    cfg = DriverConfig(target=host, model=model, profile=p.to_dict(),
                       drain_timeout=parse_duration(o.chunktune_drain_timeout,
                                                    "--chunktune-drain-timeout"),
                       token_ids=bool(o.chunktune_token_ids))
    return cfg, o.chunktune_out


def locustfile_namespace(argv: Sequence[str], environ: Mapping[str, str]) -> dict[str, Any]:
    """The names a locustfile should define: the class users and the dispatcher."""
    profile = load_profile(profile_ref(argv, environ))
    placeholder = DriverConfig(target="http://unset", model="", profile=profile.to_dict())
    classes = make_user_classes(profile, placeholder)
    events.init_command_line_parser.add_listener(_add_arguments)  # type: ignore[no-untyped-call]

    class ChunktuneDispatcher(User):
        """Replays the profile once through the class users, then stops the test."""

        fixed_count = 1

        @task
        def replay(self) -> None:
            env = self.environment
            cfg, out = _config(env, profile)
            collector = EventCollector(cfg, None, None)
            schedule = Schedule(env, cfg.parsed_profile(), cfg, collector.handle, classes)
            schedule.run()
            if out:
                summary = collector.summary(cfg, raw=bool(env.parsed_options.chunktune_raw))
                Path(out).parent.mkdir(parents=True, exist_ok=True)
                Path(out).write_text(json.dumps(summary.to_dict(), indent=2) + "\n")
            if env.runner is not None:
                gevent.spawn_later(0.1, env.runner.quit)
            raise StopUser()

    ns: dict[str, Any] = {c.__name__: c for c in classes}
    ns["ChunktuneDispatcher"] = ChunktuneDispatcher
    ns["StreamingOpenAIUser"] = StreamingOpenAIUser
    return ns


def from_process() -> dict[str, Any]:
    """:func:`locustfile_namespace` for this process's command line and environment."""
    import sys

    return locustfile_namespace(sys.argv[1:], os.environ)
