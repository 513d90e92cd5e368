"""Where a tuning's study lives in the operator, and what ``spec.storage`` may name.

Identity is the resource's uid: a study without ``spec.storage`` is the journal
``<state_dir>/<uid>.journal``, so two tunings never share one (``a-b/c`` and ``a/b-c`` did,
under the old ``<namespace>-<name>.journal``) and deleting a tuning removes its own journal
only. A journal of the old name is adopted once (:func:`adopt_legacy`): renamed when it holds
this resource's study alone, copied when other studies share it (they keep the original).

``spec.storage`` is confined (:func:`resolve`), since the operator writes with its own rights:

* a journal path (``PATH``, ``journal://PATH``, ``file://PATH``) must stay inside the state
  directory: relative paths are taken from it, absolute ones must lie in it, ``..`` is refused
  and symbolic links are resolved before the check;
* an RDB URL (``sqlite:///...``, ``postgresql://...``, ``mysql://...``) only when the operator
  allows them (``CHUNKTUNE_ALLOW_DATABASE_URLS``, chart value
  ``storage.allowDatabaseURLs``), without an inline password; a URL with credentials comes from
  a Secret (``spec.storageFrom.secretKeyRef``), read at the study's start; with both, the
  Secret holds the password of ``spec.storage``'s URL (:func:`with_password`). SQLite files
  are confined like journals.

Every refusal is a :class:`~chunktune.core.errors.SpecError` naming the field and the fix.

Each trial engine's step log (:mod:`chunktune.core.steps`) is kept in the state directory too
(:func:`steps_dir`): beside the default journal (``<uid>.journal.steps/``, where ``chunktune``'s
CLI looks beside a journal), else in ``<uid>.steps/`` (a database, or a journal other studies
may share). Both go with the resource (:func:`remove_steps`).
"""

from __future__ import annotations

import base64
import contextlib
import logging
import shutil
from pathlib import Path
from urllib.parse import urlsplit

import optuna

from chunktune.core.errors import SpecError

log = logging.getLogger(__name__)

JOURNAL_SCHEMES = ("journal://", "file://")
ALLOW_HINT = ("set the operator's CHUNKTUNE_ALLOW_DATABASE_URLS=true (chart value "
              "storage.allowDatabaseURLs) to allow database URLs, or remove spec.storage to use "
              "the operator's journal")


def journal_path(state_dir: Path, uid: str) -> Path:
    """The default journal of the resource with this uid."""
    if not uid or "/" in uid or uid in (".", ".."):
        raise SpecError(f"the resource has no usable uid ({uid!r})", field="metadata.uid")
    return state_dir / f"{uid}.journal"


def legacy_journal_path(state_dir: Path, namespace: str, name: str) -> Path:
    """The default journal's name before uids (``<namespace>-<name>.journal``)."""
    return state_dir / f"{namespace}-{name}.journal"


def confine(state_dir: Path, raw: str, field: str) -> Path:
    """``raw`` as a path inside ``state_dir`` (relative: from it), or a :class:`SpecError`."""
    if "\x00" in raw or not raw.strip():
        raise SpecError(f"is not a usable path ({raw!r})", field=field)
    path = Path(raw)
    if ".." in path.parts:
        raise SpecError(f"must not contain '..' (got {raw!r}): give a file name or a path "
                        f"inside the operator's state directory {state_dir}", field=field)
    base = state_dir.resolve()
    full = (path if path.is_absolute() else base / path).resolve()
    if full == base or not full.is_relative_to(base):
        raise SpecError(f"must be a file inside the operator's state directory {state_dir} "
                        f"(got {raw!r}); give a relative file name such as my-study.journal",
                        field=field)
    return full


def resolve(storage: str | None, state_dir: Path, uid: str, *, allow_database_urls: bool,
            from_secret: str | None = None) -> str:
    """The Optuna storage URL (or journal path) of a tuning, after the checks above.
    ``from_secret``: the URL read from ``spec.storageFrom``'s Secret."""
    if from_secret is not None:
        return _database(from_secret.strip(), state_dir, allow_database_urls,
                         "spec.storageFrom", inline=False)
    if storage is None:
        return str(journal_path(state_dir, uid))
    for scheme in JOURNAL_SCHEMES:
        if storage.startswith(scheme):
            return str(confine(state_dir, storage[len(scheme):], "spec.storage"))
    if "://" in storage:
        return _database(storage, state_dir, allow_database_urls, "spec.storage", inline=True)
    return str(confine(state_dir, storage, "spec.storage"))


def _database(url: str, state_dir: Path, allowed: bool, field: str, inline: bool) -> str:
    if "://" not in url:
        raise SpecError("the Secret's value must be a database URL such as "
                        "postgresql://user:password@host/db", field=field)
    if not allowed:
        raise SpecError(f"database URLs are not allowed by this operator: {ALLOW_HINT}",
                        field=field)
    parts = urlsplit(url)
    if inline and parts.password:
        raise SpecError("must not carry a password inline: put the URL in a Secret and "
                        "reference it with spec.storageFrom.secretKeyRef {name, key}",
                        field=field)
    if parts.scheme.split("+", 1)[0] == "sqlite":
        raw = url.split("://", 1)[1]
        if not raw.startswith("/"):
            raise SpecError(f"is not a SQLite URL ({url!r}): write sqlite:///file.db",
                            field=field)
        return "sqlite:///" + str(confine(state_dir, raw[1:], field))
    return url


def with_password(url: str, password: str) -> str:
    """``spec.storage``'s database URL with the password ``spec.storageFrom``'s Secret holds
    (both given: the URL stays visible in the spec, the password in the Secret)."""
    field = "spec.storageFrom.secretKeyRef"
    if "://" not in url or url.startswith(("journal://", "file://", "sqlite")):
        raise SpecError("a password from spec.storageFrom needs a database URL in spec.storage "
                        "(postgresql://user@host:5432/db); remove spec.storage to read the "
                        "whole URL from the Secret", field=field)
    password = password.strip()
    if "://" in password:
        raise SpecError("with spec.storage set, the Secret's key holds the password only, not "
                        "a URL; remove spec.storage to read the whole URL from the Secret",
                        field=field)
    if not password:
        raise SpecError("the Secret's key is empty: it must hold the database password",
                        field=field)
    import sqlalchemy

    parts = sqlalchemy.engine.make_url(url)
    if not parts.username:
        raise SpecError("the database URL names no user: write postgresql://USER@host/db",
                        field="spec.storage")
    return parts.set(password=password).render_as_string(hide_password=False)


def steps_dir(url: str, state_dir: Path, uid: str) -> Path:
    """Where the trials of the resource with this uid and storage ``url`` (:func:`resolve`'s)
    keep their engines' step logs."""
    journal = journal_path(state_dir, uid)
    if url == str(journal):
        return journal.with_name(journal.name + ".steps")
    return journal.with_name(f"{uid}.steps")


def remove_steps(state_dir: Path, uid: str) -> None:
    """Delete the step logs of the resource with this uid (both of :func:`steps_dir`'s)."""
    journal = journal_path(state_dir, uid)
    for d in (journal.with_name(journal.name + ".steps"), journal.with_name(f"{uid}.steps")):
        shutil.rmtree(d, ignore_errors=True)


def secret_value(secret: dict[str, object] | None, name: str, key: str) -> str:
    """The decoded ``key`` of a Secret as the API returns it."""
    field = "spec.storageFrom.secretKeyRef"
    if secret is None:
        raise SpecError(f"Secret {name!r} does not exist in the tuning's namespace", field=field)
    data = secret.get("data") or {}
    if not isinstance(data, dict) or key not in data:
        raise SpecError(f"Secret {name!r} has no key {key!r}", field=field)
    try:
        return base64.b64decode(str(data[key])).decode()
    except (ValueError, UnicodeDecodeError) as e:
        raise SpecError(f"the key {key!r} of Secret {name!r} is not UTF-8 text",
                        field=field) from e


def adopt_legacy(state_dir: Path, namespace: str, name: str, uid: str) -> Path | None:
    """Move (or copy, when shared) the old-named journal of ``namespace/name`` to the uid's
    name, if there is one and the uid's journal does not exist yet; returns the new path."""
    new = journal_path(state_dir, uid)
    old = legacy_journal_path(state_dir, namespace, name)
    if new.exists() or not old.exists():
        return None
    study = f"{namespace}/{name}"
    from optuna.storages.journal import JournalFileBackend

    try:
        storage = optuna.storages.JournalStorage(JournalFileBackend(str(old)))
        names = [s.study_name for s in storage.get_all_studies()]
    except Exception as e:  # an unreadable file is left alone
        log.warning("cannot read the old journal %s: %s", old, e)
        return None
    if study not in names:
        return None
    if names == [study]:
        old.rename(new)
        with contextlib.suppress(OSError):
            old.with_name(old.name + ".lock").unlink()
        log.info("adopted the journal %s of %s as %s", old.name, study, new.name)
    else:
        shutil.copyfile(old, new)
        log.info("copied the shared journal %s (studies %s) to %s for %s", old.name,
                 ", ".join(names), new.name, study)
    return new


__all__ = ["ALLOW_HINT", "adopt_legacy", "confine", "journal_path", "legacy_journal_path",
           "remove_steps", "resolve", "secret_value", "steps_dir", "with_password"]
