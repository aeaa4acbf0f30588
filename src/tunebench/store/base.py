"""What every part of the store shares: the engine at a URL, and the primary keys of known ids.

``Store`` (store/store.py) is this base plus its parts: the queue (store/queue.py), the reads
(store/reads.py) and the bulk import (store/imports.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Self

from sqlalchemy import Connection, Table, insert, select

from tunebench.spec.experiments import Entity, Experiment
from tunebench.store import db
from tunebench.store.migrations import SCHEMA_VERSION, migrate, read_version
from tunebench.store.rows import entity_row, experiment_row, id_hash
from tunebench.store.schema import entities, experiments


class StoreBase:
    """A sample store at an SQLAlchemy URL (created and migrated on first use)."""

    def __init__(self, url: str | os.PathLike | None = None, *, readonly: bool = False):
        """readonly: open to read only (nothing can be written; a database without a tunebench store is
        refused with SchemaError instead of getting one); otherwise the store is created or upgraded."""
        self.url = db.store_url(url)
        self.engine = db.make_engine(self.url, readonly=readonly)
        try:
            self.version = read_version(self.engine) if readonly else migrate(self.engine)
            if self.version < SCHEMA_VERSION:  # an older store: upgraded once, by a write connection
                writer = db.make_engine(self.url)
                try:
                    self.version = migrate(writer)
                finally:
                    writer.dispose()
        except BaseException:
            self.engine.dispose()
            raise
        self._experiment_pks: dict[str, int] = {}
        self._entity_pks: dict[str, int] = {}

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------ identities

    def _experiment_pk(self, conn: Connection, experiment: Experiment) -> int:
        return _pk(
            conn,
            experiments,
            self._experiment_pks,
            experiment.id,
            lambda key: experiment_row(experiment, key, time.time()),
        )

    def _entity_pk(self, conn: Connection, entity: Entity) -> int:
        return _pk(conn, entities, self._entity_pks, entity.id, lambda key: entity_row(entity, key))

    def _forget_new_keys(self) -> None:
        """After a rolled-back transaction, cached primary keys may not exist: drop the caches."""
        self._experiment_pks.clear()
        self._entity_pks.clear()


def _pk(conn: Connection, table: Table, cache: dict[str, int], ident: str, make_row: Callable[[str], dict]) -> int:
    """Primary key of the row of table whose id_hash is sha256(ident): cached, else read, else inserted."""
    key = id_hash(ident)
    pk = cache.get(key)
    if pk is None:
        pk = conn.execute(select(table.c.pk).where(table.c.id_hash == key)).scalar()
        if pk is None:
            pk = conn.execute(insert(table).values(make_row(key))).inserted_primary_key[0]
        cache[key] = pk
    return pk
