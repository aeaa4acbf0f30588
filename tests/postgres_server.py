"""A throw-away PostgreSQL server for the tests: initdb + pg_ctl in a temporary directory on a free port.

The binaries come from PATH or Debian's ``postgresql`` package (/usr/lib/postgresql/<version>/bin).
initdb refuses to run as root, so as root the server runs as the ``postgres`` user (else ``nobody``)
in a directory given to that user. Each test gets its own database (``fresh_database``).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

SUPERUSER = "tunebench"


def binaries() -> Path | None:
    """The directory holding initdb and pg_ctl, or None when PostgreSQL is not installed."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(versions[-1]).parent if versions else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    bindir: Path
    directory: Path
    port: int
    user: str | None  # the system user the server runs as (None: this process's user)

    @property
    def data(self) -> Path:
        return self.directory / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self.user:
            command = ["runuser", "-u", self.user, "--", *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=self.directory)

    def start(self) -> None:
        made = self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            SUPERUSER,
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
        )
        if made.returncode:
            raise RuntimeError(f"initdb failed: {made.stderr or made.stdout}")
        options = f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 -F -c max_connections=200"
        started = self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.directory / "log"), "-w", "-t", "60", "-o", options, "start"
        )
        if started.returncode:
            log = (self.directory / "log").read_text() if (self.directory / "log").exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {started.stderr or started.stdout} {log[-2000:]}")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.directory, ignore_errors=True)

    def fresh_database(self) -> str:
        """A new empty database; its SQLAlchemy URL."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(host="127.0.0.1", port=self.port, user=SUPERUSER, dbname="postgres", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def start_server() -> Server:
    """Start a server (PostgreSQL must be installed: see binaries())."""
    bindir = binaries()
    if bindir is None:
        raise FileNotFoundError("PostgreSQL is not installed (Debian: apt-get install -y postgresql)")
    directory = Path(tempfile.mkdtemp(prefix="tunebench-pg-"))
    user = None
    if os.geteuid() == 0:  # initdb refuses root
        user = next(u for u in ("postgres", "nobody") if _user_exists(u))
        entry = pwd.getpwnam(user)
        os.chown(directory, entry.pw_uid, entry.pw_gid)
    server = Server(bindir, directory, free_port(), user)
    try:
        server.start()
    except Exception:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return server


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False
