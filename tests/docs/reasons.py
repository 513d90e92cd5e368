"""Every reason the operator can put on a condition, an event or a trial, read from the code:
the literals it passes (``emit(type, "Reason", ...)``, ``condition(type, ok, "Reason", ...)``,
``(ok, "Reason", message)`` tuples of conditions, ``reason="Reason"`` of a trial result or a
refusal, ``reason = "Reason"`` of a fault class) and the families it builds (``Trial<State>``
events, ``Retune<Outcome>`` events, the start-up failure classifier's reasons)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.docs.pages import ROOT
from tests.pysource import parse

PACKAGE = ROOT / "operator" / "chunktune"
#: Where the operator's reasons are written: the operator, the trial backends it runs, the
#: tuner (skips, prunes) and the study storage's faults; and where a start-up refusal the
#: tuner predicts is (``EngineStartupError``: vLLM's start-up rules, the memory model).
SOURCES = ("k8s", "backends", "tuning", "core/engine_args.py", "sim/engine/memory.py",
           "core/progress.py", "metrics/derive.py")
#: Calls whose first argument is a reason, and the one whose second is.
_FIRST = {"EngineStartupError", "WorkloadUnavailable", "on_warning", "degraded"}
_SECOND = {"emit", "Refusal"}
_REASON = re.compile(r"^[A-Z][A-Za-z0-9]+$")


def _literal(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) \
            and _REASON.match(node.value):
        return node.value
    return None


def source_paths() -> list[Path]:
    """The modules of :data:`SOURCES`."""
    return [p for source in SOURCES for p in (
        sorted((PACKAGE / source).rglob("*.py")) if (PACKAGE / source).is_dir()
        else [PACKAGE / source])]


def literal_reasons(paths: list[Path] | None = None) -> dict[str, set[str]]:
    """``{reason: {module, ...}}`` of every reason literal in ``paths`` (default: the modules
    of :data:`SOURCES`)."""
    found: dict[str, set[str]] = {}

    def add(value: str | None, where: Path) -> None:
        if value:
            name = str(where.relative_to(PACKAGE)) if where.is_relative_to(PACKAGE) else where.name
            found.setdefault(value, set()).add(name)

    paths = source_paths() if paths is None else paths
    trees = {path: parse(path) for path in paths}
    # module constants (``TWIN_UNTRUSTED = "TwinUntrusted"``), by name across the modules
    constants = {t.id: n.value for tree in trees.values() for n in tree.body
                 if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}

    def value(node: ast.AST | None) -> str | None:
        if isinstance(node, ast.Name) and node.id.isupper():
            node = constants.get(node.id)
        return _literal(node)

    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                args = node.args
                if name in _SECOND and len(args) >= 2:
                    add(value(args[1]), path)
                elif name in _FIRST and args:
                    add(value(args[0]), path)
                elif name == "condition" and len(args) >= 3:
                    add(value(args[2]), path)
                elif name == "set_condition" and len(args) >= 4:
                    add(value(args[3]), path)
                elif name == "set_user_attr" and len(args) == 2 and isinstance(
                        args[0], ast.Attribute) and args[0].attr == "ATTR_REASON":
                    add(value(args[1]), path)
                for kw in node.keywords:
                    if kw.arg == "reason":
                        add(value(kw.value), path)
            elif isinstance(node, ast.Tuple) and len(node.elts) >= 2 and isinstance(
                    node.elts[0], ast.Constant) and isinstance(node.elts[0].value, bool):
                add(value(node.elts[1]), path)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id in ("reason", "cause")
                       for t in targets) and node.value is not None:
                    for inner in ast.walk(node.value):
                        add(value(inner), path)
    return found


def built_reasons() -> set[str]:
    """The reasons the operator builds rather than writes out: ``Trial<State>`` events of each
    state a trial ends in, ``Retune<Outcome>`` events of each re-tune outcome, the start-up
    classifier's reasons (and its fallback), and ``Predicted<Reason>`` of each start-up refusal
    the memory model predicts (the prescreen's skips)."""
    from chunktune.backends.classify import PATTERNS
    from chunktune.core.trials import TrialState

    ended = {TrialState.COMPLETE, TrialState.PRUNED, TrialState.INFEASIBLE, TrialState.FAIL,
             TrialState.SKIPPED}
    out = {f"Trial{s.value.title()}" for s in ended}
    retuner = (PACKAGE / "k8s" / "retuner.py").read_text()
    outcomes = re.findall(r'"([A-Z][a-z]+)"', "\n".join(
        line for line in retuner.splitlines() if re.match(r"\s*outcome(, message)? = ", line)))
    out |= {f"Retune{o}" for o in outcomes if o != "Running"}
    out |= {reason for reason, _ in PATTERNS} | {"EngineCrashed"}
    memory = literal_reasons()
    out |= {f"Predicted{r}" for r, where in memory.items() if "sim/engine/memory.py" in where}
    return out
