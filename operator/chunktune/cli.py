"""The ``chunktune`` command line. Each subsystem registers its own commands."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from chunktune import __version__

#: Modules with a ``register(subparsers)``; each adds its command group.
COMMAND_MODULES = (
    "chunktune.sim.cli",
    "chunktune.api.cli",
    "chunktune.tuning.cli",
    "chunktune.k8s.cli",
    "chunktune.load.cli",
    "chunktune.metrics.cli",
    "chunktune.modelgen.cli",
)

#: Commands a subsystem adds to another's group, which may not import it (the package layers):
#: group -> modules with a ``register(group_subparsers)``.
GROUP_COMMANDS = {
    "model": ("chunktune.sim.model_check",),  # model check needs the simulator's memory plan
}


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:  # type: ignore[type-arg]
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="chunktune",
        description="Find the best chunked-prefill settings for a vLLM deployment by "
                    "measuring them.",
        allow_abbrev=False,
    )
    p.add_argument("--version", action="version", version=f"chunktune {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for mod in COMMAND_MODULES:
        importlib.import_module(mod).register(sub)
    for group, mods in GROUP_COMMANDS.items():
        for mod in mods:
            importlib.import_module(mod).register(_subcommands(sub.choices[group]))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from chunktune.sim.args import normalize_argv

    argv = normalize_argv(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    ns, unknown = parser.parse_known_args(argv)
    func = getattr(ns, "func", None)
    if func is None:
        parser.print_help()
        return 2
    if getattr(ns, "accepts_unknown", False):
        return int(func(ns, unknown) or 0)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return int(func(ns) or 0)


if __name__ == "__main__":
    sys.exit(main())
