"""A real PostgreSQL server for tests: Debian's ``initdb`` and ``pg_ctl`` (package
``postgresql``, which ``.ci/run`` installs), a cluster in a temporary directory, listening on a
free loopback port with password (SCRAM) authentication, stopped and removed after.

PostgreSQL refuses to run as root: as root the cluster belongs to the ``postgres`` user (or
``nobody``) and its commands run through ``runuser``.

Usage::

    with PostgresServer() as pg:
        url = pg.url("optuna")          # postgresql://chunktune:PASSWORD@127.0.0.1:PORT/optuna
        pg.restart()                    # or pg.stop(); ...; pg.start()
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

USER = "chunktune"


def _bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(
        glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if found is None:
        raise RuntimeError(f"no PostgreSQL {name!r}: apt-get install postgresql (.ci/run does)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One PostgreSQL cluster on loopback; ``password`` is the ``chunktune`` user's."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.password = secrets.token_hex(8)
        self.dir = Path(tempfile.mkdtemp(prefix="chunktune-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.run_as: str | None = None
        if os.geteuid() == 0:
            for name in ("postgres", "nobody"):
                try:
                    entry = pwd.getpwnam(name)
                except KeyError:
                    continue
                self.run_as = name
                os.chown(self.dir, entry.pw_uid, entry.pw_gid)
                break
            else:
                raise RuntimeError("running as root and no 'postgres' or 'nobody' user")
        self.dir.chmod(0o700)

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = list(args)
        if self.run_as is not None:
            cmd = ["runuser", "-u", self.run_as, "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=check,
                              cwd=self.dir)

    def url(self, database: str = "postgres", password: str | None = None,
            with_password: bool = True) -> str:
        secret = self.password if password is None else password
        auth = f"{USER}:{secret}" if with_password else USER
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                  "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
                        "-c fsync=off -c synchronous_commit=off -c full_page_writes=off",
                  "start")

    def stop(self, mode: str = "fast") -> None:
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self) -> None:
        self.stop()
        self.start()

    def create_database(self, name: str) -> str:
        """A new database; returns its URL (with the password)."""
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user=USER,
                             password=self.password, dbname="postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"'.encode())
        return self.url(name)

    def __enter__(self) -> PostgresServer:
        pwfile = self.dir / "pw"
        pwfile.write_text(self.password + "\n")
        if self.run_as is not None:
            entry = pwd.getpwnam(self.run_as)
            os.chown(pwfile, entry.pw_uid, entry.pw_gid)
        self._run(_bin("initdb"), "-D", str(self.data), "-U", USER, "--auth=scram-sha-256",
                  f"--pwfile={pwfile}", "-E", "UTF8", "--no-sync")
        pwfile.unlink()
        try:
            self.start()
        except subprocess.CalledProcessError as e:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(f"PostgreSQL did not start: {e.stderr}\n{log}") from e
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop",
                  check=False)
        shutil.rmtree(self.dir, ignore_errors=True)
