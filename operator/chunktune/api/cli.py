"""Command-line verbs of the API layer: ``chunktune validate FILE`` and ``chunktune crd``.

:func:`register` adds both to an ``argparse`` sub-parser set; each sets ``func`` to a callable
taking the parsed arguments and returning the exit code. ``validate`` prints one line per problem,
``PATH MESSAGE`` (``spec.searchSpace[1].low must be <= high (got 8192 > 4096)``), on stderr and
exits 1, or prints a one-line summary and exits 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import IO, Any

from chunktune.api.crd import crd_yaml
from chunktune.api.reader import parse_manifest, read_manifest, validate
from chunktune.api.reference import collect_examples, render_reference
from chunktune.core.errors import SpecError


def format_problems(problems: list[tuple[str, str]]) -> list[str]:
    """``("spec.budget.parallelism", "must be <= maxTrials ...")`` ->
    ``"spec.budget.parallelism must be <= maxTrials ..."``."""
    return [f"{path} {message}" if path else message for path, message in problems]


def main_validate(path: str | Path, name: str | None = None, out: IO[str] | None = None,
                  err: IO[str] | None = None) -> int:
    """Check a manifest file; 0 when it is valid, 1 otherwise."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        raw = read_manifest(path, name)
    except SpecError as e:
        for line in format_problems(e.problems):
            print(line, file=err)
        return 1
    problems = validate(raw, base_dir=Path(path).parent)
    if problems:
        for line in format_problems(problems):
            print(line, file=err)
        return 1
    m = parse_manifest(raw, base_dir=Path(path).parent)
    spec = m.spec
    print(f"{path}: valid ChunkedPrefillTuning {m.name} ({_n(len(spec.parameters), 'parameter')}"
          f", {_n(len(spec.objectives), 'objective')}, {_n(len(spec.constraints), 'constraint')})",
          file=out)
    return 0


def main_crd(output: str | Path | None = None, out: IO[str] | None = None,
             reference: bool = False, examples: str | Path | None = None) -> int:
    """Print the CRD YAML (or, with ``reference``, the manifest reference in markdown, with
    examples from the manifests in the folder ``examples``), or write it to ``output``."""
    try:
        text = reference_text(examples) if reference else crd_yaml()
    except SpecError as e:
        for line in format_problems(e.problems):
            print(line, file=sys.stderr)
        return 1
    if output is None:
        (out or sys.stdout).write(text)
    else:
        Path(output).write_text(text)
    return 0


def register(subparsers: Any) -> None:
    """Add ``validate`` and ``crd`` to ``subparsers`` (from ``ArgumentParser.add_subparsers``)."""
    v = subparsers.add_parser("validate", help="check a ChunkedPrefillTuning manifest",
                              description="Check a ChunkedPrefillTuning manifest and print every "
                                          "problem with its field path.")
    v.add_argument("file", metavar="FILE", help="manifest YAML (several documents allowed)")
    v.add_argument("--name", help="pick this ChunkedPrefillTuning when FILE holds several")
    v.set_defaults(func=lambda a: main_validate(a.file, a.name))
    c = subparsers.add_parser("crd", help="print the ChunkedPrefillTuning CRD",
                              description="Print the CustomResourceDefinition YAML generated "
                                          "from the manifest models.")
    c.add_argument("--output", "-o", metavar="FILE", help="write to FILE instead of stdout")
    c.add_argument("--reference", action="store_true",
                   help="print the manifest reference (markdown) instead of the CRD")
    c.add_argument("--examples", metavar="DIR",
                   help="with --reference: take each field's example from the manifests in DIR")
    c.set_defaults(func=lambda a: main_crd(a.output, reference=a.reference,
                                           examples=a.examples))


def reference_text(examples: str | Path | None = None) -> str:
    """The manifest reference, with examples from the ``ChunkedPrefillTuning`` of each YAML
    file in the folder ``examples`` (the quickstart's first, then by name; read as ``chunktune
    validate`` reads a manifest)."""
    found: list[tuple[str, dict[str, Any]]] = []
    if examples is not None:
        folder = Path(examples)
        if not folder.is_dir():
            raise SpecError(f"{str(folder)!r} is not a folder of manifests", field="--examples")
        # the quickstart's values first: it is the manifest a newcomer starts from
        for path in sorted(folder.glob("*.yaml"), key=lambda p: (p.stem != "quickstart", p.name)):
            found.append((f"{folder.name}/{path.name}", read_manifest(path)))
    return render_reference(collect_examples(found))


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def main(argv: list[str] | None = None) -> int:
    """Run the two verbs on their own (``python -m chunktune.api.cli validate FILE``)."""
    parser = argparse.ArgumentParser(prog="chunktune")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
