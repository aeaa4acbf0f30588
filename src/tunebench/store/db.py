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

Commands that only read (show, export, report, calibrate, plan --compare) open the store read-only
(``make_engine(url, readonly=True)``): SQLite with ``PRAGMA query_only`` on every connection, and a
file not in WAL mode (a database tunebench did not make) through a ``file:...?mode=ro`` URI so that
SQLite cannot write it at all (a read-only connection to a WAL file would leave its -wal and -shm
files behind, sqlite.org/wal.html "Read-Only Databases"); PostgreSQL with
``default_transaction_read_only``.

PostgreSQL settings (libpq connection parameters and server settings, postgresql.org/docs "Connection
Strings" and "Client Connection Defaults"); a URL's ``connect_timeout=`` and ``options=-c ...`` win:

- ``connect_timeout`` 10 s: a server that accepts and never answers fails the open instead of hanging;
- ``statement_timeout`` 5 min: the store's statements are short claims, inserts and reads (a
  100,000-result read takes about a second), so one running for minutes is a stuck server or lock;
- ``lock_timeout`` 1 min: waiting for another session's lock (a schema upgrade, a stuck claim);
- ``idle_in_transaction_session_timeout`` 5 min: a client stopped inside a transaction frees its locks.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import platformdirs
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url

from tunebench.paths import env_dir

ENV = "TUNEBENCH_STORE"
SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file
# header bytes 18-19, the file format write/read versions: 1 rollback journal, 2 WAL (sqlite.org/fileformat.html)
SQLITE_WAL_VERSION = 2
BUSY_TIMEOUT_MS = 30_000
PG_CONNECT_TIMEOUT_S = 10
PG_SETTINGS_MS = {"statement_timeout": 300_000, "lock_timeout": 60_000, "idle_in_transaction_session_timeout": 300_000}
PG_DRIVERS = ("psycopg", "psycopg2")  # libpq's connection parameters (connect_timeout, options)


def default_path() -> Path:
    """The default SQLite file."""
    home = env_dir("TUNEBENCH_HOME")
    root = home if home else Path(platformdirs.user_data_dir("tunebench"))
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
        raise InputError(
            "--store",
            f"not a database URL or an SQLite file: {url!r}",
            allowed="a path to an SQLite file, or an SQLAlchemy URL (postgresql+psycopg://...)",
        ) from None
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
        raise InputError(
            "--store",
            f"no store at {str(path)!r}",
            allowed="an existing store; `tunebench explore` or `tunebench import` creates one",
        )
    if url != store_url(None) and not path.parent.is_dir():
        raise InputError("--store", f"the directory {str(path.parent)!r} of the store does not exist")


def make_engine(url: str, *, readonly: bool = False) -> Engine:
    """An engine for url; SQLite files get WAL, a busy timeout and BEGIN IMMEDIATE writes, PostgreSQL
    its timeouts. readonly: nothing can be written through it (see the module's docstring)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() in PG_DRIVERS:
        return create_engine(url, pool_pre_ping=True, connect_args=postgres_args(parsed, readonly=readonly))
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True)
    database = parsed.database or ""
    plain_file = bool(database) and database != ":memory:" and not database.startswith("file:")
    if plain_file and not readonly:
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    if plain_file and readonly and not _is_wal(Path(database).expanduser()):
        path = Path(database).expanduser().absolute()
        parsed = parsed.set(database=f"file:{quote(str(path))}", query={**parsed.query, "mode": "ro", "uri": "true"})
    engine = create_engine(parsed, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy emits BEGIN itself (see _begin)
        cursor = dbapi_connection.cursor()
        if readonly:
            cursor.execute("PRAGMA query_only=ON")
        else:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        reads = readonly or conn.get_execution_options().get("tunebench_readonly", False)
        conn.exec_driver_sql("BEGIN" if reads else "BEGIN IMMEDIATE")

    return engine


def postgres_args(parsed: URL, *, readonly: bool = False) -> dict[str, Any]:
    """libpq connection parameters: the connect timeout (unless the URL sets one) and the server settings
    of the module's docstring (the URL's own ``options=-c name=value`` come after them, so they win)."""
    settings: dict[str, Any] = dict(PG_SETTINGS_MS)
    if readonly:
        settings["default_transaction_read_only"] = "on"
    options = [f"-c {name}={value}" for name, value in settings.items()]
    args: dict[str, Any] = {"options": " ".join([*options, str(parsed.query.get("options", ""))]).strip()}
    if "connect_timeout" not in parsed.query:
        args["connect_timeout"] = PG_CONNECT_TIMEOUT_S
    return args


def _is_wal(path: Path) -> bool:
    """Whether the SQLite file at path is in WAL mode (its header says so); False if it cannot be read."""
    try:
        with open(path, "rb") as f:
            header = f.read(20)
    except OSError:
        return False
    return len(header) == 20 and header[18] == SQLITE_WAL_VERSION


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
