"""``chunktune operator run``: the Kubernetes operator.

::

    chunktune operator run [--namespace NS ... | --all-namespaces] [--state-dir DIR]
                           [--standalone] [--liveness URL] [--log-level LEVEL]
                           [--metrics-address HOST:PORT] [--leader-elect]

Flags override the ``CHUNKTUNE_*`` environment (:mod:`chunktune.k8s.settings`). Exit status 0
on a clean stop (SIGTERM/SIGINT), 1 when the settings are invalid, 3 when a leader lost its
Lease (:mod:`chunktune.k8s.leader`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from pathlib import Path
from typing import Any

from chunktune.core.errors import BackendUnavailable, SpecError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = subparsers.add_parser("operator", help="run the Kubernetes operator",
                                  description="The chunktune Kubernetes operator.")
    sub = group.add_subparsers(dest="operator_cmd", required=True, metavar="{run}")
    run = sub.add_parser(
        "run", help="watch ChunkedPrefillTuning resources and run their studies",
        description="Run the operator: each ChunkedPrefillTuning gets a study whose trials "
                    "run as engine Pods and load Jobs in its namespace. Settings come from "
                    "CHUNKTUNE_* environment variables; these flags override them.",
        allow_abbrev=False)
    where = run.add_mutually_exclusive_group()
    where.add_argument("--namespace", "-n", action="append", metavar="NS",
                       help="watch this namespace (repeatable; default: all namespaces, or "
                            "$CHUNKTUNE_NAMESPACES)")
    where.add_argument("--all-namespaces", "-A", action="store_true",
                       help="watch every namespace (overrides $CHUNKTUNE_NAMESPACES)")
    run.add_argument("--state-dir", metavar="DIR",
                     help="where studies without spec.storage keep their journal "
                          "(default /var/lib/chunktune, or $CHUNKTUNE_STATE_DIR)")
    run.add_argument("--standalone", action="store_true", default=None,
                     help="no peering with other operator replicas")
    run.add_argument("--liveness", metavar="URL",
                     help="serve a liveness probe, e.g. http://0.0.0.0:8080/healthz")
    run.add_argument("--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                     help="default INFO, or $CHUNKTUNE_LOG_LEVEL")
    run.add_argument("--metrics-address", metavar="HOST:PORT",
                     help="serve /metrics and /healthz here, e.g. 0.0.0.0:8080 "
                          "($CHUNKTUNE_METRICS_ADDRESS)")
    run.add_argument("--leader-elect", action="store_true", default=None,
                     help="one active replica: run the studies only while holding the Lease "
                          "($CHUNKTUNE_LEADER_ELECT; $CHUNKTUNE_LEASE_* tune it)")
    run.set_defaults(func=cmd_run)


def settings_from(ns: argparse.Namespace) -> Any:
    from chunktune.k8s.settings import Settings

    overrides: dict[str, Any] = {"standalone": ns.standalone, "liveness": ns.liveness,
                                 "log_level": ns.log_level,
                                 "metrics_address": ns.metrics_address}
    if ns.leader_elect:
        overrides["leader"] = {"enabled": True}
    if ns.state_dir:
        overrides["state_dir"] = Path(ns.state_dir)
    if ns.namespace:
        overrides["namespaces"] = tuple(ns.namespace)
    settings = Settings.from_env(**overrides)
    if ns.all_namespaces:
        settings = settings.with_overrides(namespaces=())
    return settings


def cmd_run(ns: argparse.Namespace) -> int:
    try:
        settings = settings_from(ns)
    except SpecError as e:
        for path, msg in e.problems:
            print(f"chunktune operator run: {path}: {msg}" if path else msg, file=sys.stderr)
        return 1
    logging.basicConfig(level=settings.log_level,
                        format="%(asctime)s %(levelname)s [%(name)s] %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    from chunktune.k8s.runtime import run

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(run(settings))
    except BackendUnavailable as e:
        print(f"chunktune operator run: {e}", file=sys.stderr)
        return 1
    return 0


__all__ = ["cmd_run", "register", "settings_from"]
