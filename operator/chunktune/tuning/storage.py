"""Study storages: journal files, and databases (PostgreSQL) that several writers share.

A database storage is Optuna's :class:`~optuna.storages.RDBStorage` with a connection pool that
checks each connection before use (``pool_pre_ping``), so a server restart costs a reconnect,
not an error. Every storage call is retried in place, with jittered backoff, while the database
is unreachable (:func:`transient`: connection refused or dropped, the server starting or
shutting down, a deadlock or serialisation failure), for :data:`RETRY_SECONDS`; past that it
raises :class:`StorageUnavailable`. A fault of the database is never a trial result: the tuner
lets these errors through instead of recording them (see :mod:`chunktune.tuning.runner`).

A database that refuses the connection for good (a wrong password, an unknown user or
database) raises :class:`StorageRefused` at once. Both name the storage (without its password)
and the fix. ``postgresql://`` URLs use psycopg (3), over libpq, so libpq's ``PGPASSWORD`` and
``~/.pgpass`` supply a password the URL leaves out.

Several writers on one study (two ``chunktune tune`` runs, or one beside the operator) are safe:
Optuna numbers a database's trials under a row lock on the study, and what Optuna cannot make
atomic (queueing the baseline once, claiming a trial a dead writer left) runs under
:func:`study_lock`: a PostgreSQL advisory lock, a file lock beside a journal.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import optuna
import sqlalchemy
import sqlalchemy.exc
import sqlalchemy.pool
from optuna.storages import BaseStorage, JournalStorage, RDBStorage

from chunktune.core import infile
from chunktune.core.errors import InfrastructureFault, SpecError

log = logging.getLogger(__name__)
T = TypeVar("T")

#: How long one storage call waits for an unreachable database (seconds);
#: ``CHUNKTUNE_STORAGE_RETRY_SECONDS`` overrides it.
RETRY_SECONDS = 120.0
#: Backoff between tries: first delay, cap (seconds).
RETRY_FIRST = 0.2
RETRY_CAP = 5.0
#: Seconds a connection attempt may take before it counts as a failed try.
CONNECT_TIMEOUT = 10
#: SQLSTATEs that are worth retrying: the connection failed or was dropped (class 08), the
#: server is shutting down or starting (57P01-57P03), deadlock and serialisation failures.
TRANSIENT_SQLSTATES = ("08", "57P01", "57P02", "57P03", "40001", "40P01", "53300")
#: SQLSTATEs (and libpq's words for them when a connection fails before any SQLSTATE) of a
#: refusal no retry can fix.
REFUSED_SQLSTATES = {"28P01": "the password was refused", "28000": "the user may not connect",
                     "3D000": "the database does not exist"}
REFUSED_WORDS = {"password authentication failed": "the password was refused",
                 "no password supplied": "no password was given",
                 "does not exist": "the user or database does not exist",
                 "no pg_hba.conf entry": "the server does not let this user connect"}


class StorageFault(InfrastructureFault):
    """The study's database failed; ``reason`` is a condition reason, ``url`` the storage
    without its password."""

    reason = "DatabaseUnreachable"

    def __init__(self, message: str, url: str) -> None:
        super().__init__(message)
        self.url = url


class StorageUnavailable(StorageFault):
    """The database did not answer for :data:`RETRY_SECONDS`: nothing was recorded as a
    result, and the study goes on from the storage once it answers."""


class StorageRefused(StorageFault):
    """The database refused the connection (wrong password, unknown user or database):
    retrying does not help until the credentials or the URL are fixed."""

    reason = "DatabaseAuthFailed"


def is_database(url: str) -> bool:
    """A URL of an RDB storage (``postgresql://...``, ``sqlite:///...``), not a journal."""
    return "://" in url and not url.startswith(("journal://", "file://"))


def display_url(url: str) -> str:
    """``url`` as it may be shown or logged: a database URL's password masked."""
    if not is_database(url):
        return url
    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy reads: show its scheme only
        return url.split("://", 1)[0] + "://..."


def retry_seconds() -> float:
    raw = os.environ.get("CHUNKTUNE_STORAGE_RETRY_SECONDS")
    try:
        return float(raw) if raw else RETRY_SECONDS
    except ValueError:
        return RETRY_SECONDS


def _causes(e: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        orig = getattr(cur, "orig", None)
        cur = orig if isinstance(orig, BaseException) else (cur.__cause__ or cur.__context__)


def _sqlstate(e: BaseException) -> str | None:
    for c in _causes(e):
        code = getattr(c, "pgcode", None) or getattr(c, "sqlstate", None)
        if isinstance(code, str) and code:
            return code
    return None


def refusal(e: BaseException) -> str | None:
    """Why the database refused us for good (words for a user), or None."""
    code = _sqlstate(e)
    if code in REFUSED_SQLSTATES:
        return REFUSED_SQLSTATES[code]
    if not any(isinstance(c, sqlalchemy.exc.OperationalError) for c in _causes(e)):
        return None
    text = " ".join(str(c) for c in _causes(e))
    for words, why in REFUSED_WORDS.items():
        if words in text:
            return why
    return None


def transient(e: BaseException) -> bool:
    """An error of the database's availability (worth retrying), not of our request."""
    if refusal(e) is not None:
        return False
    code = _sqlstate(e)
    if code is not None and code.startswith(TRANSIENT_SQLSTATES):
        return True
    for c in _causes(e):
        if isinstance(c, sqlalchemy.exc.DBAPIError) and c.connection_invalidated:
            return True
        if isinstance(c, sqlalchemy.exc.DisconnectionError | sqlalchemy.exc.InterfaceError |
                      sqlalchemy.exc.TimeoutError):
            return True
        if isinstance(c, sqlalchemy.exc.OperationalError):
            return True  # a failed connection has no SQLSTATE
    return False


def call_with_retry(fn: Callable[[], T], url: str, what: str,
                    seconds: float | None = None) -> T:
    """``fn()``, retried while the database at ``url`` has transient faults, for ``seconds``
    (default :func:`retry_seconds`); raises :class:`StorageRefused` or
    :class:`StorageUnavailable` naming the storage and the fix."""
    shown = display_url(url)
    deadline = time.monotonic() + (retry_seconds() if seconds is None else seconds)
    delay = RETRY_FIRST
    tries = 0
    while True:
        tries += 1
        try:
            return fn()
        except Exception as e:
            why = refusal(e)
            if why is not None:
                raise StorageRefused(
                    f"the study database {shown} refused the connection: {why}; fix the "
                    f"user, password or database in spec.storage (the operator: the Secret "
                    f"that spec.storageFrom names; the command line: the URL, PGPASSWORD or "
                    f"~/.pgpass)", shown) from e
            if not transient(e):
                raise
            if time.monotonic() + delay > deadline:
                raise StorageUnavailable(
                    f"the study database {shown} did not answer for {tries} tries "
                    f"({_short(e)}); nothing was recorded as a trial result: check that the "
                    f"server in spec.storage is up and reachable, then run the study again "
                    f"(it resumes)", shown) from e
            if tries == 1 or tries % 10 == 0:
                log.warning("study database %s: %s failed (%s); retrying for up to %.0f s",
                            shown, what, _short(e), deadline - time.monotonic())
            time.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(RETRY_CAP, delay * 2)


def _short(e: BaseException) -> str:
    for c in _causes(e):
        if not isinstance(c, optuna.exceptions.StorageInternalError):
            text = str(c).strip().splitlines()
            if text:
                return f"{type(c).__name__}: {text[0][:200]}"
    return type(e).__name__


def engine_kwargs(url: str) -> dict[str, Any]:
    """The connection pool of a database storage: a small pool per process, each connection
    checked before use and renewed every half hour."""
    kw: dict[str, Any] = {"pool_pre_ping": True}
    scheme = url.split("://", 1)[0]
    if scheme.startswith(("postgresql", "postgres")):
        kw.update(pool_size=4, max_overflow=4, pool_recycle=1800, pool_timeout=30,
                  connect_args={"connect_timeout": CONNECT_TIMEOUT,
                                "application_name": "chunktune"})
    return kw


#: The public storage calls (and the private ones Optuna's cache calls) retried in place.
_RETRIED = (
    "create_new_study", "delete_study", "set_study_user_attr", "set_study_system_attr",
    "get_study_id_from_name", "get_study_name_from_id", "get_study_directions",
    "get_study_user_attrs", "get_study_system_attrs", "get_all_studies", "_create_new_trial",
    "_set_trial_param", "get_trial_param", "set_trial_intermediate_value",
    "set_trial_user_attr", "set_trial_system_attr", "get_trial_id_from_study_id_trial_number",
    "get_trial", "_get_trials", "_get_best_trial_id", "record_heartbeat",
    "_get_stale_trial_ids",
)
"""(``create_new_trial``, ``set_trial_param``, ``get_all_trials`` and ``get_best_trial`` call
these.)"""


class ResilientRDBStorage(RDBStorage):
    """:class:`RDBStorage` whose calls wait out an unreachable database
    (:func:`call_with_retry`) and whose URL never shows its password."""

    def __init__(self, url: str, retry: float | None = None) -> None:
        self.retry = retry
        self.shown = display_url(url)

        def init() -> None:
            # NOTE: Optuna creates its tables on first use; two writers that start together
            # on a new database would collide, so PostgreSQL's are created under a lock
            with _advisory_lock(url, "chunktune:schema"):
                RDBStorage.__init__(self, url, engine_kwargs(url))

        call_with_retry(init, url, "opening the storage", retry)

    def __repr__(self) -> str:
        return f"ResilientRDBStorage({self.shown!r})"

    def set_trial_state_values(self, trial_id: int, state: optuna.trial.TrialState,
                               values: Any = None) -> bool:
        """Told once: a retry after a commit whose answer was lost finds the trial finished
        in the state it was told, and returns as the first call would have."""
        attempts = 0

        def tell() -> bool:
            nonlocal attempts
            attempts += 1
            try:
                return RDBStorage.set_trial_state_values(self, trial_id, state, values)
            except optuna.exceptions.UpdateFinishedTrialError:
                if attempts > 1 and RDBStorage.get_trial(self, trial_id).state == state:
                    return True
                raise

        return call_with_retry(tell, self.url, "set_trial_state_values", self.retry)


def _lock_key(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


@contextlib.contextmanager
def _advisory_lock(url: str, name: str) -> Iterator[None]:
    """A PostgreSQL advisory lock on a connection of its own (nothing for other databases)."""
    if sqlalchemy.engine.make_url(url).get_backend_name() != "postgresql":
        yield
        return
    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool,
                                      **{k: v for k, v in engine_kwargs(url).items()
                                         if k == "connect_args"})
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": _lock_key(name)})
            try:
                yield
            finally:
                with contextlib.suppress(sqlalchemy.exc.SQLAlchemyError):
                    conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"),
                                 {"k": _lock_key(name)})
    finally:
        engine.dispose()


def _retried(name: str) -> Callable[..., Any]:
    base = getattr(RDBStorage, name)

    @functools.wraps(base)
    def method(self: ResilientRDBStorage, *args: Any, **kwargs: Any) -> Any:
        return call_with_retry(lambda: base(self, *args, **kwargs), self.url, name, self.retry)

    return method


for _name in _RETRIED:
    setattr(ResilientRDBStorage, _name, _retried(_name))


def open_storage(url: str, field: str = "storage") -> BaseStorage:
    """An Optuna storage for a URL: ``sqlite:///...``/``postgresql://...`` as a
    :class:`ResilientRDBStorage`, a path (or ``journal://PATH``) as a journal file — ~10x
    faster per trial than SQLite. A file that exists but is no storage is refused
    (:func:`check_existing`, a :class:`SpecError` under ``field``)."""
    if is_database(url):
        check_existing(url, field)
        return ResilientRDBStorage(url)
    path = Path(url.split("://", 1)[1] if "://" in url else url)
    check_existing(url, field)
    path.parent.mkdir(parents=True, exist_ok=True)
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(str(path)))


#: The first bytes of an SQLite database file (https://www.sqlite.org/fileformat.html).
SQLITE_MAGIC = b"SQLite format 3\x00"


def check_existing(url: str, field: str = "storage") -> None:
    """Refuse a storage file that exists but is not one: not a regular file (a directory,
    ``/dev/zero``, a FIFO), an ``sqlite:///`` file without SQLite's header, a journal whose
    first line is not an Optuna journal record. A file that does not exist yet is fine (the
    study creates it); a database server is not checked here. Reads at most one line, through
    :func:`chunktune.core.infile.lines`; :class:`SpecError` under ``field``."""
    if is_database(url) and not url.startswith("sqlite:///"):
        return
    raw = url.removeprefix("sqlite:///") if is_database(url) else (
        url.split("://", 1)[1] if "://" in url else url)
    raw = raw.split("?", 1)[0] if is_database(url) else raw
    if not raw or raw == ":memory:" or not os.path.lexists(raw):
        return
    name = display_url(url)
    if is_database(url):
        head = infile.head(raw, len(SQLITE_MAGIC), field=field, name=name)
        if head and head != SQLITE_MAGIC:
            raise SpecError(f"{name} is not an SQLite database (its first bytes are not "
                            "SQLite's header): give another file, or remove it", field=field)
        return
    first = next(infile.lines(raw, field=field, max_bytes=2**62, name=name), None)
    if first is None:
        return
    record = infile.json_value(first[1], where=f"{name} line 1", field=field)
    if not isinstance(record, dict) or not isinstance(record.get("op_code"), int):
        raise SpecError(f"{name} line 1: not an Optuna journal record (a JSON object with "
                        "op_code): give a study's journal file, or another path", field=field)


def _journal_path(storage: BaseStorage) -> Path | None:
    backend = getattr(storage, "_backend", None)
    path = getattr(backend, "_file_path", None)
    return Path(path) if isinstance(path, str) else None


def _rdb(storage: BaseStorage) -> RDBStorage | None:
    if isinstance(storage, RDBStorage):
        return storage
    backend = getattr(storage, "_backend", None)  # Optuna's cache around an RDBStorage
    return backend if isinstance(backend, RDBStorage) else None


@contextlib.contextmanager
def study_lock(storage: BaseStorage, study_name: str) -> Iterator[None]:
    """Exclusive among every writer of ``study_name`` in ``storage``: a PostgreSQL advisory
    lock, a file lock beside a journal; nothing for other storages (one process)."""
    rdb = _rdb(storage)
    if rdb is not None and rdb.engine.dialect.name == "postgresql":
        key = _lock_key(f"chunktune:{study_name}")

        def connect() -> sqlalchemy.engine.Connection:
            conn = rdb.engine.connect()
            try:
                conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": key})
            except BaseException:
                conn.close()
                raise
            return conn

        conn = call_with_retry(connect, rdb.url, "locking the study")
        try:
            yield
        finally:
            with contextlib.suppress(sqlalchemy.exc.SQLAlchemyError):
                conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            conn.close()  # a dropped connection released the lock already
        return
    path = _journal_path(storage)
    if path is None:
        yield
        return
    with open(path.with_name(path.name + ".study.lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


__all__ = ["RETRY_SECONDS", "ResilientRDBStorage", "StorageFault", "StorageRefused",
           "StorageUnavailable", "call_with_retry", "display_url", "engine_kwargs",
           "is_database", "open_storage", "refusal", "study_lock", "transient"]
