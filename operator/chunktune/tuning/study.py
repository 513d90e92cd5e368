"""Optuna wiring: storage, sampler and pruner from the spec, and the study itself.

Every fact the tuner needs to resume lives in the Optuna storage: each trial's point, state,
reason, metrics and flags (as trial user attributes), and the spec fingerprint (a study user
attribute) so that a storage is never resumed with a different search.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import socket
import time
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import optuna
from optuna.samplers import BaseSampler
from optuna.storages import BaseStorage

from chunktune.api.metrics import Direction
from chunktune.api.v1alpha1 import ChunkedPrefillTuning
from chunktune.core.errors import SpecError
from chunktune.core.trials import RESULT_STATES, TrialState
from chunktune.tuning import space
from chunktune.tuning import storage as storages

log = logging.getLogger(__name__)

#: Trial user-attribute names (one vocabulary for the runner, the results and the status).
ATTR_STATE = "chunktune_state"  # a TrialState value (INFEASIBLE, SKIPPED, FAIL, ...)
ATTR_REASON = "reason"
ATTR_MESSAGE = "message"
ATTR_METRICS = "metrics"
ATTR_POINT = "point"
ATTR_BASELINE = "baseline"
ATTR_SERVER = "server"
ATTR_OWNER = "owner"  # the process running the trial: host:pid:start (:func:`owner_id`)
ATTR_HEARTBEAT = "heartbeat"  # when its owner last said it runs the trial (Unix time)
ATTR_TIMES = "times"
ATTR_STEPS = "steps"  # vLLM's step log of the trial: {"file": ..., "steps": N, ...totals}
#: The :class:`~chunktune.core.progress.TwinPhase` a trial was queued in: calibrate, confirm, or
#: recheck (a configuration measured again on purpose: never reused as a duplicate; its
#: configuration's metrics become the mean of its measurements).
ATTR_PHASE = "phase"
#: Study attribute: ``{"points": [...], "after": why the study before the recheck ended}``,
#: once the recheck is queued.
ATTR_RECHECK = "recheck"
ATTR_ROUND = "twin_round"  # twin-first: the search round a confirmed trial came from
ATTR_PREDICTED = "predicted"  # twin-first: the twin's metrics for a confirmed trial
#: What a queued trial carries besides its point (kept when an interrupted trial is re-queued).
QUEUED_ATTRS = (ATTR_PHASE, ATTR_ROUND, ATTR_PREDICTED)
#: The trial ran a point outside the search space (a baseline default that is not among the
#: choices): told to Optuna as FAIL so samplers never see a trial missing a parameter (which
#: would make GP and multivariate TPE sample that parameter at random); our own state is in
#: ATTR_STATE.
ATTR_HIDDEN = "outside_search_space"
#: How often a running trial's owner records its heartbeat, and how old a heartbeat may be
#: before another writer takes the trial as left behind (seconds; the grace covers clock skew
#: between hosts too). ``CHUNKTUNE_HEARTBEAT_GRACE`` overrides the grace.
HEARTBEAT_SECONDS = 10.0
HEARTBEAT_GRACE = 60.0
STUDY_FINGERPRINT = "chunktune_fingerprint"
#: The image a simulated engine's spec defaulted to before chunktune stopped naming an image it
#: does not publish; only :func:`fingerprint` still uses it.
_FORMER_SIM_IMAGE = "ghcr.io/chunktune/chunktune:0.1.0"
STUDY_SPEC = "chunktune_spec"


#: Spec fields added after studies were stored (a dotted path for a nested one): left out of
#: the fingerprint while unset.
_ADDED_ENGINE_FIELDS = ("vllmVersion", "gpu.peerToPeer")
_ADDED_WORKLOAD_FIELDS = ("trace", "fromPrometheus")


def fingerprint(tuning: ChunkedPrefillTuning) -> str:
    """What must not change under a running study: engine, search space, workload,
    objectives and constraints (budget, sampler seed and output may change)."""
    s = tuning.spec
    engine = s.engine.model_dump(mode="json", by_alias=True,
                                 exclude={"startup_timeout", "security_context"})
    if s.engine.kind == "sim" and s.engine.image is None:
        # a simulated engine without an image runs the operator's; studies fingerprinted
        # while the spec filled in this default keep their fingerprint (and so resume)
        engine["image"] = _FORMER_SIM_IMAGE
    workload = s.workload.model_dump(mode="json", by_alias=True,
                                     exclude={"load_workers"})
    # fields added after studies were stored count only when set, so those studies resume
    for d, added in ((engine, _ADDED_ENGINE_FIELDS), (workload, _ADDED_WORKLOAD_FIELDS)):
        for path in added:
            *parents, key = path.split(".")
            at: Any = d
            for p in parents:
                at = at.get(p) if isinstance(at, dict) else None
            if isinstance(at, dict) and at.get(key) is None:
                at.pop(key, None)
    keep = {
        "engine": engine,
        "searchSpace": [p.model_dump(mode="json", by_alias=True) for p in s.search_space or []],
        # (how many Locust processes send the load does not change what is measured)
        "workload": workload,
        "objectives": [o.model_dump(mode="json", by_alias=True) for o in s.objectives],
        "constraints": [c.model_dump(mode="json", by_alias=True) for c in s.constraints],
    }
    if s.strategy.name != "real":  # (absent for all-real studies: their fingerprints stay)
        keep["strategy"] = s.strategy.name
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


def storage_url(tuning: ChunkedPrefillTuning, override: str | None = None,
                default_dir: Path | None = None) -> str:
    """The storage to use: ``--storage``, else ``spec.storage``, else a journal file
    ``<default_dir>/<namespace>-<name>.journal``."""
    url = override or tuning.spec.storage
    if url:
        return url
    base = default_dir or Path(".chunktune")
    ns = tuning.metadata.namespace or "default"
    return str(base / f"{ns}-{tuning.metadata.name}.journal")


#: The package that brings each database's driver, by SQLAlchemy's module name.
_DRIVER_PACKAGES = {"MySQLdb": "mysqlclient", "pymysql": "pymysql", "psycopg2": "psycopg2-binary",
                    "psycopg": "psycopg[binary]", "asyncpg": "asyncpg"}


def check_storage(url: str, field: str, must_exist: bool = False) -> None:
    """Refuse, before any work, a storage that cannot be opened: a database URL of an unknown
    kind or whose driver is not installed, a journal path that is a directory or lies under a
    file; with ``must_exist`` (reading a study), one that is not there. Raises
    :class:`SpecError` naming ``field`` (``--storage``, ``spec.storage``)."""
    shown = storages.display_url(url)
    if storages.is_database(url):
        import sqlalchemy.exc
        from sqlalchemy.engine import make_url

        try:
            u = make_url(url)
            dialect = u.get_dialect()
        except (sqlalchemy.exc.ArgumentError, sqlalchemy.exc.NoSuchModuleError) as e:
            raise SpecError(f"{shown!r} is not a database URL SQLAlchemy knows (e.g. "
                            "postgresql://HOST/DB, sqlite:///FILE.db) or a journal path",
                            field=field) from e
        try:
            dialect.import_dbapi()
        except ImportError as e:
            pkg = _DRIVER_PACKAGES.get(e.name or "", e.name or "its driver")
            raise SpecError(f"{shown!r} needs the {u.get_backend_name()} driver "
                            f"{e.name!r}, which is not installed: pip install {pkg}",
                            field=field) from e
        if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
            return
        path = Path(u.database)
    else:
        path = Path(url.split("://", 1)[1] if "://" in url else url)
    if path.is_dir():
        raise SpecError(f"{str(path)!r} is a directory; give a file in it, e.g. "
                        f"{str(path / 'study.journal')!r}", field=field)
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise SpecError(f"{str(parent)!r} is a file, not a directory, so {str(path)!r} "
                            "cannot be created", field=field)
    if must_exist and not path.exists():
        raise SpecError(f"no study storage at {str(path)!r}", field=field)


def check_out_dir(path: str, field: str = "--out") -> None:
    """Refuse, before any work, an output directory that is a file or lies under one."""
    p = Path(path)
    for q in (p, *p.parents):
        if q.exists() and not q.is_dir():
            raise SpecError(f"{str(q)!r} is a file; give a directory (created if missing)",
                            field=field)


def open_storage(url: str, field: str = "storage") -> BaseStorage:
    """An Optuna storage for a URL (:func:`chunktune.tuning.storage.open_storage`): a database
    that waits out its outages, or a journal file."""
    return storages.open_storage(url, field)


class _AskTellGridSampler(optuna.samplers.GridSampler):
    """GridSampler whose ``after_trial`` does not call ``study.stop()`` once the grid is done:
    that only works inside ``optimize()`` and raises under ask/tell. The loop checks
    ``is_exhausted`` itself."""

    def after_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial,
                    state: optuna.trial.TrialState, values: Any) -> None:
        return None


def make_sampler(tuning: ChunkedPrefillTuning, n_objectives: int,
                 constrained: bool) -> BaseSampler:
    s = tuning.spec.sampler
    params = tuning.spec.search_space or []
    seed = s.seed
    if s.name == "tpe":
        return optuna.samplers.TPESampler(
            seed=seed, multivariate=True, group=False, constant_liar=True,
            n_startup_trials=max(4, min(10, tuning.spec.budget.max_trials // 5)))
    if s.name == "gp":
        try:
            import torch  # noqa: F401
        except ImportError as e:
            raise SpecError("the gp sampler needs PyTorch, which is not installed: "
                            "pip install 'chunktune[gp]' (or use tpe)",
                            field="spec.sampler.name") from e
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.GPSampler(seed=seed, n_startup_trials=max(4, min(
                10, tuning.spec.budget.max_trials // 5)), deterministic_objective=True)
    if s.name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(
            4, min(20, tuning.spec.budget.max_trials // 3)))
    if s.name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if s.name == "grid":
        return _AskTellGridSampler(space.grid(params), seed=seed)
    if s.name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    raise SpecError(f"unknown sampler {s.name!r}", field="spec.sampler.name")


class WindowPercentilePruner(optuna.pruners.BasePruner):
    """Prune a trial whose *current* value is worse than the given percentile of the completed
    trials' values at the same window.

    Optuna's Median/PercentilePruner compare a trial's best value over all its steps, which
    suits learning curves; a load test reports a cumulative percentile (p99 TTFT so far), which
    starts low on the first few requests and rises as long prompts arrive, so its "best" is
    always the first window and nothing would ever be pruned.
    """

    def __init__(self, percentile: float, n_startup_trials: int = 3,
                 n_warmup_steps: int = 2) -> None:
        self.percentile = percentile
        self.n_startup_trials = n_startup_trials
        self.n_warmup_steps = n_warmup_steps

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step = trial.last_step
        if step is None or step < self.n_warmup_steps:
            return False
        done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        values = [t.intermediate_values[step] for t in done if step in t.intermediate_values]
        if len(values) < self.n_startup_trials:
            return False
        import numpy as np

        current = trial.intermediate_values[step]
        if study.direction == optuna.study.StudyDirection.MAXIMIZE:
            return bool(current < np.percentile(values, 100 - self.percentile))
        return bool(current > np.percentile(values, self.percentile))


def make_pruner(tuning: ChunkedPrefillTuning, n_objectives: int) -> optuna.pruners.BasePruner:
    p = tuning.spec.pruner
    if n_objectives > 1 or p.name == "none":
        return optuna.pruners.NopPruner()
    warm = p.warmup_windows
    if p.name == "median":
        return WindowPercentilePruner(50.0, n_startup_trials=3, n_warmup_steps=warm)
    if p.name == "percentile":
        return WindowPercentilePruner(25.0, n_startup_trials=3, n_warmup_steps=warm)
    return optuna.pruners.HyperbandPruner(min_resource=max(1, warm))


def study_name(tuning: ChunkedPrefillTuning) -> str:
    return f"{tuning.metadata.namespace or 'default'}/{tuning.metadata.name}"


def open_study(tuning: ChunkedPrefillTuning, storage: BaseStorage | str,
               directions: list[Direction],
               sampler: BaseSampler, pruner: optuna.pruners.BasePruner,
               name: str | None = None) -> optuna.Study:
    """Create the study (named ``name``, default :func:`study_name`), or load it to resume;
    refuses a storage holding the same study name with a different search (engine, space,
    workload, objectives, constraints)."""
    name = name or study_name(tuning)
    fp = fingerprint(tuning)
    study = optuna.create_study(storage=storage, study_name=name, directions=directions,
                                sampler=sampler, pruner=pruner, load_if_exists=True)
    old = study.user_attrs.get(STUDY_FINGERPRINT)
    if old is None:
        study.set_user_attr(STUDY_FINGERPRINT, fp)
        study.set_user_attr(STUDY_SPEC, tuning.spec.model_dump(mode="json", by_alias=True))
    elif old != fp:
        raise SpecError(
            f"the storage already holds study {name!r} with a different engine, search space, "
            "workload, objectives or constraints; give a new metadata.name or another "
            "spec.storage / --storage to start a new study (the measured trials are kept)",
            field="spec",
        )
    if [d.name.lower() for d in study.directions] != directions:
        raise SpecError(f"study {name!r} in this storage has directions "
                        f"{[d.name.lower() for d in study.directions]}, not {directions}",
                        field="spec.objectives")
    return study


def live_trial(study: optuna.Study, storage: BaseStorage, number: int) -> optuna.Trial:
    """A handle on trial ``number`` of ``study`` (stored in ``storage``) that can still record
    attributes and be told, such as a RUNNING trial a previous process left behind. Uses the
    storage's public lookups, not Optuna's private ``FrozenTrial._trial_id``."""
    study_id = storage.get_study_id_from_name(study.study_name)
    return optuna.Trial(study, storage.get_trial_id_from_study_id_trial_number(study_id, number))


def owner_id() -> str:
    """This writer's name for the trials it runs: ``host:pid:start``."""
    return f"{socket.gethostname()}:{os.getpid()}:{time.time():.6f}"


def _grace() -> float:
    try:
        return float(os.environ.get("CHUNKTUNE_HEARTBEAT_GRACE") or HEARTBEAT_GRACE)
    except ValueError:
        return HEARTBEAT_GRACE


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def abandoned(t: optuna.trial.FrozenTrial, me: str, now: float | None = None) -> bool:
    """Whether the RUNNING trial ``t`` was left by a writer that stopped, so that writer
    ``me`` may take it over: its owner is a process of this host that is gone (or an earlier
    life of this process); or its last heartbeat (or, without an owner, its start) is older
    than the grace (:data:`HEARTBEAT_GRACE`). A trial another live writer runs is left
    alone."""
    owner = t.user_attrs.get(ATTR_OWNER)
    now = now if now is not None else time.time()
    if not isinstance(owner, str) or not owner:  # asked a moment ago, or never started
        start = t.datetime_start.timestamp() if t.datetime_start is not None else 0.0
        return now - start > _grace()
    if owner == me:
        return False
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    my_host, my_pid = me.split(":")[:2]
    if host == my_host and pid_text.isdigit() and (pid_text == my_pid or
                                                   not _pid_alive(int(pid_text))):
        return True
    beat = t.user_attrs.get(ATTR_HEARTBEAT)
    if not isinstance(beat, int | float):
        return host != my_host  # a writer from before heartbeats, on another host
    return now - float(beat) > _grace()


def runs_elsewhere(t: optuna.trial.FrozenTrial, me: str) -> bool:
    """Trial ``t`` is (or was just) run by another live writer of the study, not by ``me``
    nor by a writer that stopped."""
    owner = t.user_attrs.get(ATTR_OWNER)
    return isinstance(owner, str) and bool(owner) and owner != me and not abandoned(t, me)


def claim(study: optuna.Study, storage: BaseStorage, number: int,
          me: str) -> optuna.Trial | None:
    """Take over trial ``number`` for writer ``me`` if it is still RUNNING and
    :func:`abandoned` (atomically among the study's writers: :func:`storage.study_lock`);
    None when another writer has it or it ended meanwhile."""
    with storages.study_lock(storage, study.study_name):
        study_id = storage.get_study_id_from_name(study.study_name)
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
        fresh = storage.get_trial(trial_id)
        if fresh.state != optuna.trial.TrialState.RUNNING or not abandoned(fresh, me):
            return None
        trial = optuna.Trial(study, trial_id)
        trial.set_user_attr(ATTR_OWNER, me)
        trial.set_user_attr(ATTR_HEARTBEAT, time.time())
        return trial


@contextlib.asynccontextmanager
async def heartbeat(trial: optuna.Trial, me: str) -> AsyncIterator[None]:
    """Record ``me`` as the trial's owner, and its heartbeat every :data:`HEARTBEAT_SECONDS`
    while the block runs (a storage that does not answer delays a beat, never the trial)."""
    trial.set_user_attr(ATTR_OWNER, me)
    trial.set_user_attr(ATTR_HEARTBEAT, time.time())

    async def beat() -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_SECONDS)
            try:
                trial.set_user_attr(ATTR_HEARTBEAT, time.time())
            except storages.StorageFault as e:
                log.warning("trial %d: heartbeat not recorded (%s)", trial.number, e)

    task = asyncio.get_running_loop().create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def trial_state(t: optuna.trial.FrozenTrial) -> TrialState:
    """chunktune's state of a trial (Optuna's, refined by our user attribute)."""
    if t.state == optuna.trial.TrialState.RUNNING:
        return TrialState.RUNNING
    if t.state == optuna.trial.TrialState.WAITING:
        return TrialState.WAITING
    ours = t.user_attrs.get(ATTR_STATE)
    if ours:
        return TrialState(ours)
    return {optuna.trial.TrialState.COMPLETE: TrialState.COMPLETE,
            optuna.trial.TrialState.PRUNED: TrialState.PRUNED,
            optuna.trial.TrialState.FAIL: TrialState.FAIL}[t.state]


def point_of(t: optuna.trial.FrozenTrial) -> dict[str, Any]:
    """The configuration the trial ran (params, plus any the baseline fixed outside the
    space)."""
    return dict(t.user_attrs.get(ATTR_POINT) or t.params)


def counted_in(storage: BaseStorage, name: str) -> int:
    """Counted trials (:data:`~chunktune.core.trials.RESULT_STATES`) of study ``name`` in
    ``storage`` (0 when there is none)."""
    try:
        trials = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
    except KeyError:
        return 0
    return sum(1 for t in trials if trial_state(t) in RESULT_STATES)
