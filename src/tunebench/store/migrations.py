"""Schema versions: an ordered list of DDL steps and a ``schema_version`` table.

A fresh store is created at ``SCHEMA_VERSION`` straight from ``schema.py`` and stamped with it
(Alembic's recommended "create_all + stamp head" for new databases). An existing store at version
v < SCHEMA_VERSION is upgraded by ``UPGRADES[v + 1]``, ``UPGRADES[v + 2]``, ... in order, each step
in its own transaction together with its ``schema_version`` row, so an interrupted upgrade resumes
where it stopped. A store written by a newer tunebench (version > SCHEMA_VERSION) is refused. Schema
changes hold a lock (``_lock_schema``), so explorers opening a new store at once create it once.
A store opened to read is never created (``read_version``): a database without one is refused.

To change the schema: edit ``schema.py``, bump ``SCHEMA_VERSION`` and add
``UPGRADES[new] = (description, fn(conn))`` that brings a store of the previous version to the new
shape with portable SQLAlchemy DDL (``sa.schema.CreateTable``, ``AddColumn`` via
``conn.exec_driver_sql`` for the plain ``ALTER TABLE t ADD COLUMN c TYPE`` all dialects accept).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable

from sqlalchemy import Connection, Engine, func, inspect, select
from sqlalchemy.schema import CreateIndex, CreateTable

from tunebench.store import db
from tunebench.store.schema import metadata, operation_points, schema_version, series

SCHEMA_VERSION = 3


def _add_series(conn: Connection) -> None:
    """Version 2: the ``series`` table (a measurement's time series, one compressed blob per result)."""
    conn.execute(CreateTable(series))


def _index_operation_points_by_request(conn: Connection) -> None:
    """Version 3: operation_points indexed by request_id (the operations that sampled a point)."""
    index = next(i for i in operation_points.indexes if i.name == "ix_operation_points_request")
    if index.name not in {i["name"] for i in inspect(conn).get_indexes(operation_points.name)}:
        conn.execute(CreateIndex(index))


# version -> (description, step that upgrades a store at version - 1); 1 is the first schema.
UPGRADES: dict[int, tuple[str, Callable[[Connection], None]]] = {
    2: ("series: the time series of each measurement", _add_series),
    3: ("operation_points by request: the operations that sampled a point", _index_operation_points_by_request),
}


class SchemaError(RuntimeError):
    """The store cannot be used by this tunebench (e.g. it was written by a newer version)."""


def current_version(conn: Connection) -> int | None:
    """The store's schema version; None if it has no schema yet."""
    if not inspect(conn).has_table(schema_version.name):
        return None
    return conn.execute(select(func.max(schema_version.c.version))).scalar()


def read_version(engine: Engine) -> int:
    """The schema version of a store opened to read, creating nothing: SchemaError for a database that
    holds no tunebench store (none yet, or another program's tables), or one newer than this tunebench."""
    with db.read(engine) as conn:
        version = current_version(conn)
        tables = sorted(inspect(conn).get_table_names()) if version is None else []
    if version is None and tables:
        shown = ", ".join(tables[:5]) + (f", ... ({len(tables)} in all)" if len(tables) > 5 else "")
        raise SchemaError(f"the database holds another program's tables ({shown}), not a tunebench store")
    if version is None:
        raise SchemaError("the database holds no tunebench store yet (`tunebench explore` or `import` creates one)")
    if version > SCHEMA_VERSION:
        raise SchemaError(_newer(version))
    return version


def _newer(version: int) -> str:
    return f"the store has schema version {version}, newer than this tunebench's {SCHEMA_VERSION}; upgrade tunebench"


# pg_advisory_xact_lock key of schema changes: the first 8 bytes of sha256(b"tunebench schema") as a signed int64
SCHEMA_LOCK_KEY = int.from_bytes(hashlib.sha256(b"tunebench schema").digest()[:8], "big", signed=True)


def _lock_schema(conn: Connection) -> None:
    """Serialise schema changes across processes: SQLite's BEGIN IMMEDIATE already holds the write lock;
    PostgreSQL takes a transaction-level advisory lock (two sessions creating the same tables at once
    fail on pg_type's unique index; postgresql.org/docs "Advisory Locks")."""
    if conn.dialect.name == "postgresql":
        conn.execute(select(func.pg_advisory_xact_lock(SCHEMA_LOCK_KEY)))


def migrate(engine: Engine) -> int:
    """Create or upgrade the store's schema to SCHEMA_VERSION; returns the version."""
    target = SCHEMA_VERSION
    with db.write(engine) as conn:  # SQLite: BEGIN IMMEDIATE serialises concurrent first opens
        _lock_schema(conn)
        version = current_version(conn)
        if version is None:
            metadata.create_all(conn)
            conn.execute(schema_version.insert().values(version=target, description="create", applied_at=time.time()))
            return target
    if version > SCHEMA_VERSION:
        raise SchemaError(_newer(version))
    for step in range(version + 1, target + 1):
        description, upgrade = UPGRADES[step]
        with db.write(engine) as conn:
            _lock_schema(conn)
            if current_version(conn) >= step:  # another process applied it meanwhile
                continue
            upgrade(conn)
            conn.execute(schema_version.insert().values(version=step, description=description, applied_at=time.time()))
    return target
