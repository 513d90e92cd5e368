"""``chunktune tune FILE`` and ``chunktune results FILE|STORAGE``."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import ValidationError

from chunktune.api.metrics import format_value
from chunktune.api.reader import load_manifest, read_manifest, validate
from chunktune.backends.base import TrialBackend
from chunktune.core.errors import BackendUnavailable, SpecError
from chunktune.core.flags import flags_line
from chunktune.core.progress import EventKind, StopReason, StopRequest, TrialEvent
from chunktune.core.trials import TrialState
from chunktune.core.workload import openings_note
from chunktune.metrics.derive import WorkloadUnavailable

if TYPE_CHECKING:
    from chunktune.tuning.tuner import Tuner

T = TypeVar("T")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    t = sub.add_parser("tune", help="run a ChunkedPrefillTuning manifest on this machine",
                       description="Validate FILE, then run its study: trial 0 is the engine's "
                                   "defaults, then Optuna proposes configurations until the "
                                   "budget is spent or the study converges. Rerun with the "
                                   "same storage to resume.")
    t.add_argument("file", metavar="FILE")
    t.add_argument("--name", help="the ChunkedPrefillTuning to run when FILE holds several")
    t.add_argument("--out", metavar="DIR", help="write result.json and plots here")
    t.add_argument("--storage", help="Optuna storage (journal file path or RDB URL); default "
                                     "spec.storage, else .chunktune/<namespace>-<name>.journal")
    t.add_argument("--backend", choices=("auto", "simulated", "local"), default="auto",
                   help="where trials run: simulated (in process, virtual time) or local "
                        "(engine and Locust as processes); auto: simulated for engine.kind "
                        "sim, local for vllm")
    t.add_argument("--max-trials", type=int, help="override spec.budget.maxTrials")
    t.add_argument("--quiet", "-q", action="store_true", help="no per-trial progress lines")
    t.set_defaults(func=cmd_tune)
    r = sub.add_parser("results", help="print a study's results from its storage",
                       description="Print the best configuration, the Pareto front and the "
                                   "trial counts of a study, from its manifest (and default "
                                   "storage) or from a storage path.")
    r.add_argument("source", metavar="FILE|STORAGE")
    r.add_argument("--storage", help="storage, when giving a manifest with another storage")
    r.add_argument("--trials", action="store_true", help="list every trial")
    r.add_argument("--out", metavar="DIR", help="also write result.json and plots")
    r.set_defaults(func=cmd_results)
    c = sub.add_parser(
        "calibrate-study", help="fit a calibration profile from a study's real trials",
        description="Fit the simulator to the engine a study measured: the step-time model to "
                    "the step logs its real trials kept, then the wall time between steps and "
                    "the time before the first token to the same trials' measured latencies "
                    "(what a twin-first study does each round). Writes a profile that "
                    "`chunktune sim run --calibration` and spec.engine.calibration read.")
    c.add_argument("source", metavar="FILE|STORAGE")
    c.add_argument("--storage", help="storage, when giving a manifest with another storage")
    c.add_argument("--out", required=True, metavar="PROFILE", help="profile JSON to write")
    c.set_defaults(func=cmd_calibrate_study)


def make_backend(kind: str, engine_kind: str, parallelism: int,
                 steps_dir: Path | None = None, keep_steps: bool = False) -> TrialBackend:
    """``keep_steps``: the simulated backend also returns (and keeps in ``steps_dir``) its
    step log, as a twin-first study's calibration needs."""
    if kind == "auto":
        kind = "simulated" if engine_kind == "sim" else "local"
    if kind == "simulated":
        from chunktune.backends.simulated import SimulatedBackend

        return SimulatedBackend(max_parallel=parallelism, keep_steps=keep_steps,
                                steps_dir=steps_dir if keep_steps else None)
    from chunktune.backends.local import LocalBackend

    return LocalBackend(max_parallel=parallelism, steps_dir=steps_dir)


def steps_dir_for(storage: str, out: str | None) -> Path | None:
    """Where real engines' step logs go: ``--out DIR/steps``, else beside a journal storage
    (``<storage>.steps/``); None for a database storage without ``--out``."""
    if out:
        return Path(out) / "steps"
    if "://" in storage and not storage.startswith(("journal://", "file://")):
        return None
    path = storage.split("://", 1)[1] if "://" in storage else storage
    return Path(path + ".steps")


def _load(path: str, name: str | None) -> Any:
    raw = read_manifest(path, name)
    problems = validate(raw, base_dir=Path(path).parent)
    if problems:
        raise SpecError(problems)
    return load_manifest(path, name)


def _storage_field(flag: str | None, spec: str | None) -> str:
    """Where the storage in use was given, for an error about it."""
    return "--storage" if flag else "spec.storage" if spec else "storage"


def _print_problems(e: SpecError) -> None:
    for path, msg in e.problems:
        print(f"{path} {msg}" if path else msg, file=sys.stderr)


class StopOnSignal:
    """Ctrl-C during ``chunktune tune``: the first asks no new trial and lets the trials in
    flight finish (:data:`~chunktune.core.progress.StopRequest.DRAIN`, each recorded); the
    second cancels them (:data:`~chunktune.core.progress.StopRequest.CANCEL`: each is recorded
    as ``Interrupted`` and runs again when the study resumes); the third aborts at once. The
    runner asks :meth:`__call__` before each trial and while trials run."""

    def __init__(self) -> None:
        self.request: StopRequest | None = None

    def __call__(self) -> StopRequest | None:
        return self.request

    def on_signal(self, signum: int, frame: object) -> None:
        if self.request is None:
            self.request = StopRequest.DRAIN
            print("stopping after the trials in flight (Ctrl-C again to cancel them: they run "
                  "again when the study resumes)", file=sys.stderr, flush=True)
            return
        self.request = StopRequest.CANCEL
        print("cancelling the trials in flight: they run again when the study resumes "
              "(Ctrl-C again to abort)", file=sys.stderr, flush=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)


class TrialLines:
    """One line per trial end, with the best so far: a measured trial that misses a
    constraint says which; a skip, a prune or a failure is explained the first time its kind
    appears (later ones of the same kind only name it)."""

    def __init__(self, tuner: Tuner, quiet: bool) -> None:
        self.tuner = tuner
        self.quiet = quiet
        self.t0 = time.monotonic()
        self.explained: set[str] = set()

    def event(self, e: TrialEvent) -> None:
        if e.kind in (EventKind.PHASE, EventKind.WARNING):
            if not self.quiet or e.kind == EventKind.WARNING:
                tag = "WARNING" if e.kind == EventKind.WARNING else f"phase {e.phase}"
                print(f"== {tag} ({time.monotonic() - self.t0:.0f} s): {e.message}", flush=True)
            return
        if self.quiet or e.kind != EventKind.FINISHED:
            return
        t = self.tuner
        budget = t.spec.budget.max_trials
        done = t.counted()
        keys = [o.key for o in t.objectives] + [c.key for c in t.constraints]
        shown = ", ".join(f"{k}={format_value(k, e.metrics[k])}" for k in dict.fromkeys(keys)
                          if k in e.metrics)
        tag = " (baseline)" if e.baseline else ""
        what = self.outcome(e)
        best = self.best_text()
        phase = f"{t.strategy.phase} " if t.strategy.phase is not None else ""
        print(f"[{phase}{done}/{budget}] trial {e.number}{tag}: {flags_line(e.point)} -> {what}"
              + (f"; {shown}" if shown else "") + (f" | best: {best}" if best else ""),
              flush=True)
        note = self.explanation(e)
        if note:
            print(f"    {note}", flush=True)

    def outcome(self, e: TrialEvent) -> str:
        """``COMPLETE``; ``COMPLETE, violates chat.itl_p99 <= 60ms``; ``PRUNED``; ``SKIPPED
        Duplicate (same configuration as trial 3)``; ``INFEASIBLE EngineOOM``."""
        if e.state == TrialState.COMPLETE:
            missed = [c.text() for c in self.tuner.constraints if c.violation(e.metrics) > 0]
            return "COMPLETE" + (f", violates {', '.join(missed)}" if missed else "")
        if e.state == TrialState.PRUNED and e.reason in (None, "Pruned"):
            return "PRUNED"
        what = f"{e.state} {e.reason or ''}".strip()
        if e.reason == "Duplicate" and e.message:
            what += f" ({e.message})"
        return what

    def explanation(self, e: TrialEvent) -> str | None:
        """What a trial's kind of end means, the first time that kind appears."""
        kind = f"{e.state} {e.reason or ''}"
        if e.state == TrialState.COMPLETE or kind in self.explained:
            return None
        self.explained.add(kind)
        if e.state == TrialState.PRUNED:
            key = self.tuner.objectives[0].key
            return (f"pruned: stopped early by the {self.tuner.spec.pruner.name} pruner, its "
                    f"{key} so far being worse than the earlier trials' at the same point of "
                    "the load; the values shown are those when it stopped, and it is no result")
        if e.reason == "Duplicate":
            return ("duplicate: the sampler proposed a configuration measured before (or "
                    "running now); it is not run again and its earlier values count for it, "
                    "not against the budget")
        if e.message:
            return e.message.strip().splitlines()[-1][:300]
        return None

    def best_text(self) -> str:
        from chunktune.tuning.results.model import collect

        t = self.tuner
        res = collect(t.study, t.objectives, t.constraints)
        b = res.best_trial
        if b is None:
            return ""
        k = t.objectives[0].key
        return f"trial {b.number} {k}={format_value(k, b.metrics[k])}"


def cmd_tune(ns: argparse.Namespace) -> int:
    from chunktune.tuning.results.files import write_outputs
    from chunktune.tuning.results.model import collect
    from chunktune.tuning.results.plots import importances
    from chunktune.tuning.results.text import format_results
    from chunktune.tuning.runner import cost_model
    from chunktune.tuning.storage import StorageFault, display_url
    from chunktune.tuning.study import check_out_dir, check_storage, storage_url
    from chunktune.tuning.tuner import Tuner

    try:
        if ns.out:
            check_out_dir(ns.out)
        tuning = _load(ns.file, ns.name)
        if ns.max_trials is not None:
            if ns.max_trials < 1:
                raise SpecError("must be >= 1", field="--max-trials")
            tuning.spec.budget.max_trials = ns.max_trials
        storage = storage_url(tuning, ns.storage)
        check_storage(storage, _storage_field(ns.storage, tuning.spec.storage))
        backend = make_backend(ns.backend, tuning.spec.engine.kind,
                               tuning.spec.budget.parallelism, steps_dir_for(storage, ns.out),
                               keep_steps=tuning.spec.strategy.name == "twin")
        stop = StopOnSignal()
        tuner = Tuner(tuning, backend, storage, stop_requested=stop)
        preflight = getattr(backend, "preflight", None)
        if preflight is not None:  # vLLM installed, model directory readable
            preflight(tuner.plan(0, {}))
    except SpecError as e:
        _print_problems(e)
        return 1
    except (BackendUnavailable, StorageFault, WorkloadUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    progress = TrialLines(tuner, ns.quiet)
    tuner.on_event = progress.event
    prior = tuner.counted()
    print(f"{tuning.metadata.name}: {len(tuner.params)} parameters "
          f"({', '.join(p.name for p in tuner.params)}), objectives "
          f"{', '.join(o.label() for o in tuner.objectives)}"
          + (f", constraints {', '.join(c.text() for c in tuner.constraints)}"
             if tuner.constraints else "")
          + f"; backend {backend.name}; storage {display_url(storage)}"
          + (f" (resuming: {prior} trials done)" if prior else ""), flush=True)
    if tuner.derived:
        src = tuner.derived["source"]
        print(f"workload derived from {src['url']} ({src['selector']}, {src['window']:g} s "
              f"ending {src['at']}): {tuner.profile.arrival.rate:g} req/s", flush=True)
    if tuning.spec.retune is not None:
        print("note: spec.retune is the operator's (it keeps watching the deployment); here "
              "the study runs once", file=sys.stderr)
    line = cost_model(tuning, tuner.context.model)
    if line:
        print(f"cost model: {line}", flush=True)
    if tuning.spec.engine.kind == "sim":  # the engine's fixed flags, as the tuner read them
        note = openings_note(tuner.profile, tuner.context.fixed.enable_prefix_caching)
        if note:
            print(f"WARNING {note}", file=sys.stderr)

    old = signal.signal(signal.SIGINT, stop.on_signal)
    try:
        why = asyncio.run(_run(tuner, backend))
    except StorageFault as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGINT, old)
    results = collect(tuner.study, tuner.objectives, tuner.constraints)
    elapsed = time.monotonic() - progress.t0
    extra: dict[str, Any] = {}
    sims = ""
    if tuning.spec.strategy.name == "twin":
        from chunktune.tuning.strategies.twin_report import twin_report

        extra["twin"] = twin_report(tuner.study, tuner.objectives, tuner.constraints,
                                    tuning.spec.strategy.max_twin_error)
        sims = f" and {extra['twin']['simulated_trials']} simulated"
    print(f"\nstudy stopped: {why} ({tuner.counted()} {'real ' if sims else ''}trials{sims} "
          f"in {elapsed:.1f} s)")
    print(format_results(results))
    if ns.out:
        imp = importances(tuner.study, results)
        print(f"\n{imp.text()}")
        files = write_outputs(Path(ns.out), results, tuner.study, importances=imp,
                              stop_reason=why, storage=display_url(storage),
                              name=tuning.metadata.name, wall_s=elapsed, **extra)
        print(f"\nwrote {', '.join(str(f) for f in files)}")
    if results.no_result:
        print(f"error: {results.no_result}", file=sys.stderr)
        return 1
    if why == StopReason.FAILURES:
        return 1
    return 0


async def _run(tuner: Tuner, backend: TrialBackend) -> StopReason:
    try:
        return await tuner.run()
    finally:
        await backend.close()


def cmd_results(ns: argparse.Namespace) -> int:
    import optuna

    from chunktune.tuning import study as st
    from chunktune.tuning.objectives import ConstraintDef, ObjectiveDef
    from chunktune.tuning.results.files import write_outputs
    from chunktune.tuning.results.model import collect
    from chunktune.tuning.results.text import format_results
    from chunktune.tuning.storage import StorageFault

    try:
        if ns.out:
            st.check_out_dir(ns.out)
        if Path(ns.source).suffix in (".yaml", ".yml"):
            tuning = _load(ns.source, None)
            url = st.storage_url(tuning, ns.storage)
            _check_study_storage(url, ns.source, _storage_field(ns.storage, tuning.spec.storage))
            study = optuna.load_study(study_name=st.study_name(tuning),
                                      storage=st.open_storage(url))
            objectives = [ObjectiveDef.from_spec(o) for o in tuning.spec.objectives]
            constraints = [ConstraintDef.from_spec(c) for c in tuning.spec.constraints]
        else:
            st.check_storage(ns.source, "FILE|STORAGE", must_exist=True)
            study = _first_study(ns.source)
            from chunktune.api.v1alpha1 import STORED_SPEC, Spec

            spec = _stored(study, lambda raw: Spec.model_validate(
                raw, context={STORED_SPEC: True}))
            objectives = [ObjectiveDef.from_spec(o) for o in spec.objectives]
            constraints = [ConstraintDef.from_spec(c) for c in spec.constraints]
    except SpecError as e:
        _print_problems(e)
        return 1
    except StorageFault as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    results = collect(study, objectives, constraints)
    print(f"study {study.study_name}")
    print(format_results(results))
    if ns.trials:
        print("\ntrials:")
        for t in results.trials:
            vals = ", ".join(f"{k}={format_value(k, v)}" for k, v in t.metrics.items()
                             if k in {o.key for o in objectives} | {c.key for c in constraints})
            print(f"  {t.number:>4} {t.state:<10} {t.reason or '':<20} "
                  f"{flags_line(dict(t.params))}  {vals}")
    if ns.out:
        extra: dict[str, Any] = {}
        spec_d = study.user_attrs.get(st.STUDY_SPEC) or {}
        strategy = spec_d.get("strategy") or {}
        if strategy.get("name") == "twin":
            from chunktune.tuning.strategies.twin_report import twin_report

            extra["twin"] = twin_report(study, objectives, constraints,
                                        float(strategy.get("maxTwinError", 0.25)))
        write_outputs(Path(ns.out), results, study, **extra)
    return 0


def _check_study_storage(url: str, manifest: str, field: str) -> None:
    """A manifest's storage, to read its study: there, or the command that makes it."""
    from chunktune.tuning import study as st

    try:
        st.check_storage(url, field, must_exist=True)
    except SpecError as e:
        if not any(m.startswith("no study storage") for _, m in e.problems):
            raise
        raise SpecError(f"no study storage at {url}: run `chunktune tune {manifest}` first",
                        field=field) from e


def _tuning_of(source: str, storage: str | None) -> tuple[Any, str]:
    """The study's manifest and storage: from a manifest (and its default storage) or from a
    storage (the spec the study recorded)."""
    from chunktune.api.v1alpha1 import (
        API_GROUP,
        API_VERSION,
        KIND,
        STORED_SPEC,
        ChunkedPrefillTuning,
    )
    from chunktune.tuning import study as st

    if Path(source).suffix in (".yaml", ".yml"):
        tuning = _load(source, None)
        url = st.storage_url(tuning, storage)
        _check_study_storage(url, source, _storage_field(storage, tuning.spec.storage))
        return tuning, url
    st.check_storage(source, "FILE|STORAGE", must_exist=True)
    study = _first_study(source)
    ns, _, name = study.study_name.rpartition("/")
    tuning = _stored(study, lambda raw: ChunkedPrefillTuning.model_validate({
        "apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": KIND,
        "metadata": {"name": name, "namespace": ns or "default"}, "spec": raw},
        context={STORED_SPEC: True}))
    return tuning, source


def _first_study(source: str) -> Any:
    """The first study of the storage ``source`` (a journal file or a database URL). Raises
    :class:`SpecError`: a file that is no storage (:func:`chunktune.tuning.storage.
    check_existing`), one whose records Optuna cannot replay, one without a study."""
    import optuna

    from chunktune.tuning import study as st

    try:
        storage = st.open_storage(source, field="FILE|STORAGE")
        names = [n for n in optuna.get_all_study_names(storage) if "#" not in n]
        if not names:
            raise SpecError("the storage holds no study", field="FILE|STORAGE")
        return optuna.load_study(study_name=names[0], storage=storage)
    except (ValueError, KeyError, TypeError, AttributeError, AssertionError) as e:
        if isinstance(e, SpecError):
            raise
        # a journal whose records are not Optuna's (its first line was)
        raise SpecError(f"{source} is not a study storage Optuna can read "
                        f"({type(e).__name__}): give a journal `chunktune tune` wrote",
                        field="FILE|STORAGE") from e


def _stored(study: Any, parse: Callable[[dict[str, Any]], T]) -> T:
    """``parse`` of the ChunkedPrefillTuning spec ``study`` keeps; :class:`SpecError` for a
    study without one (not written by ``chunktune tune``) or with one this chunktune cannot
    read."""
    from chunktune.tuning import study as st

    raw = study.user_attrs.get(st.STUDY_SPEC)
    if not isinstance(raw, dict):
        raise SpecError(f"the study {study.study_name!r} holds no ChunkedPrefillTuning spec: "
                        "it was not written by `chunktune tune`", field="FILE|STORAGE")
    try:
        return parse(raw)
    except ValidationError as e:
        raise SpecError(f"the study {study.study_name!r} holds a spec this chunktune cannot "
                        f"read ({e.error_count()} problems): give the manifest as FILE",
                        field="FILE|STORAGE") from e


def cmd_calibrate_study(ns: argparse.Namespace) -> int:
    from chunktune.backends.simulated import SimulatedBackend
    from chunktune.sim.calibration import profile as profiles
    from chunktune.tuning.runner import TrialRunner
    from chunktune.tuning.strategies.twin_fit import TwinError, measured_runs, study_profile

    try:
        tuning, url = _tuning_of(ns.source, ns.storage)
        tuner = TrialRunner(tuning, SimulatedBackend(), url)
        runs = measured_runs(tuner)
        profile = study_profile(tuner, runs)
    except SpecError as e:
        _print_problems(e)
        return 1
    except TwinError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    profiles.write_profile(ns.out, profile)
    f = profile.fit
    print(f"calibrated {profile.model} on {profile.gpu} from {f['num_steps']:.0f} steps of "
          f"{len(runs)} real trials ({', '.join(str(r.number) for r in runs)})")
    print(f"  step error: median {f['median_rel_err']:.1%} in sample, "
          f"{f['cross_validated_median_rel_err']:.1%} cross-validated; step gap "
          f"{profile.step_gap_s * 1e3:.2f} ms, time before the first token "
          f"{(profile.server_overhead_s or 0) * 1e3:.1f} ms, clients' stalls between tokens "
          + (f"{profile.delivery_stall_prob:.1%} of tokens {profile.delivery_stall_s * 1e3:g} ms "
             "late on average" if profile.delivery_stall_prob > 0 else "none")
          + " (fitted to their measured latencies)")
    print(f"wrote {ns.out}")
    return 0
