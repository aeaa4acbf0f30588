"""Where the store lives and how to talk to it: URL resolution and the SQLAlchemy engine.

URL: ``--store URL``, else ``TUNEBENCH_STORE``, else an SQLite file ``store.db`` in the user's
data directory (platformdirs ``user_data_dir("tunebench")``: measurements are data, not cache), or
in ``TUNEBENCH_HOME`` when that is set (tests and sandboxes). Any SQLAlchemy URL works
(``postgresql+psycopg://...``, ``mysql+pymysql://...``); a plain path means an SQLite file.

SQLite settings (one file shared by several explorer processes):

- WAL journal: readers never block the writer and vice versa; ``synchronous=NORMAL`` keeps every
  committed transaction across a crash or ``kill -9`` of the application (only an OS crash or power
  loss may lose the last commits, never corrupt the file; sqlite.org/wal.html);
- ``busy_timeout`` 30 s: a writer waits for the lock instead of failing;
- every write transaction starts with ``BEGIN IMMEDIATE`` (it takes the write lock up front, so a
  read-then-update cannot fail half-way with SQLITE_BUSY); the SQLAlchemy recipe "Serializable
  isolation / Savepoints / Transactional DDL" (pysqlite dialect docs) lets SQLAlchemy emit BEGIN.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import platformdirs
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url

ENV = "TUNEBENCH_STORE"
SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file
BUSY_TIMEOUT_MS = 30_000


def default_path() -> Path:
    """The default SQLite file."""
    home = os.environ.get("TUNEBENCH_HOME")
    root = Path(home).expanduser() if home else Path(platformdirs.user_data_dir("tunebench"))
    return root / "store.db"


def store_url(url: str | os.PathLike | None = None) -> str:
    """The store URL: the argument, else $TUNEBENCH_STORE, else the default SQLite file."""
    text = str(url) if url else os.environ.get(ENV) or ""
    if not text:
        text = str(default_path())
    if "://" not in text:  # a path
        path = Path(text).expanduser().resolve()
        return f"sqlite:///{path}"
    return text


def sqlite_file(url: str) -> Path | None:
    """The file of an SQLite URL; None for another database or an in-memory one."""
    parsed = make_url(url)
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database).expanduser()


def check_location(url: str, *, create: bool) -> None:
    """InputError (field --store) if url cannot be a store: not a URL, an SQLite path that is a directory
    or a file that is not an SQLite database, a missing file when the command only reads (create=False),
    or a new file in a directory that does not exist. Touches nothing."""
    from sqlalchemy.exc import ArgumentError

    from tunebench.errors import InputError

    try:
        path = sqlite_file(url)
        make_url(url).get_dialect()  # an unknown database kind fails here, before anything is opened
    except (ArgumentError, ValueError):
        raise InputError("--store", f"not a database URL or an SQLite file: {url!r}",
                         allowed="a path to an SQLite file, or an SQLAlchemy URL (postgresql+psycopg://...)") from None  # fmt: skip
    if path is None:
        return
    if path.is_dir():
        raise InputError("--store", f"{str(path)!r} is a directory, not a store file")
    if path.exists():
        with open(path, "rb") as f:
            header = f.read(len(SQLITE_HEADER))
        if header and header != SQLITE_HEADER:
            raise InputError("--store", f"{str(path)!r} is not a tunebench store (not an SQLite database)")
        return
    if not create:
        raise InputError("--store", f"no store at {str(path)!r}",
                         allowed="an existing store; `tunebench explore` or `tunebench import` creates one")  # fmt: skip
    if url != store_url(None) and not path.parent.is_dir():
        raise InputError("--store", f"the directory {str(path.parent)!r} of the store does not exist")


def make_engine(url: str) -> Engine:
    """An engine for url; SQLite files get WAL, a busy timeout and BEGIN IMMEDIATE writes."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True)
    database = parsed.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy emits BEGIN itself (see _begin)
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        readonly = conn.get_execution_options().get("tunebench_readonly", False)
        conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")

    return engine


@contextmanager
def write(engine: Engine) -> Iterator[Connection]:
    """One write transaction: committed on success, rolled back on any exception."""
    with engine.connect() as conn, conn.begin():
        yield conn


@contextmanager
def read(engine: Engine) -> Iterator[Connection]:
    """One read-only transaction (SQLite: a deferred BEGIN, no write lock)."""
    with engine.connect() as conn:
        conn = conn.execution_options(tunebench_readonly=True)
        with conn.begin():
            yield conn
