"""The store's bulk path: finished results stored many at a time (CSV imports, benchmarks).

One transaction per call; experiments, entities and requests are looked up and inserted in chunks
of CHUNK ids, not one statement per row.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Table, bindparam, func, insert, select, update

from tunebench.store import db
from tunebench.store.base import StoreBase
from tunebench.store.rows import CHUNK, Record, entity_row, experiment_row, id_hash, result_row
from tunebench.store.schema import PENDING, RUNNING, entities, experiments, requests, results
from tunebench.store.series import insert_series

RequestKey = tuple[int, int, str]  # (experiment pk, entity pk, actuator): one request


class Imports(StoreBase):
    """Results stored in bulk (see the module)."""

    def record_many(self, records: Sequence[Record]) -> tuple[int, int]:
        """Store finished results in bulk (imports) in one transaction; returns (added, already there).

        Rows whose source_key is already stored are skipped, so importing a file twice adds nothing.
        A request's status follows its latest recorded result unless someone is measuring it.
        """
        if not records:
            return 0, 0
        now = time.time()
        try:
            with db.write(self.engine) as conn:
                exp_pks = self._bulk_pks(conn, experiments, {id_hash(r.experiment.id): r.experiment for r in records})
                ent_pks = self._bulk_pks(conn, entities, {id_hash(r.entity.id): r.entity for r in records})
                keys = [(exp_pks[id_hash(r.experiment.id)], ent_pks[id_hash(r.entity.id)], r.actuator) for r in records]
                req_ids = _requests(conn, keys, now)
                seen = _stored_source_keys(conn, [r.source_key for r in records if r.source_key])
                rows, series = [], []
                for record, key in zip(records, keys):
                    if record.source_key and (record.source_key in seen):
                        continue
                    if record.source_key:
                        seen.add(record.source_key)
                    rows.append(
                        result_row(
                            req_ids[key],
                            record.result,
                            record.generator,
                            record.source_key,
                            record.source_identifier,
                            record.source_experiment_id,
                            now,
                        )
                    )
                    series.append(record.result.series)
                if not rows:
                    return 0, len(records)
                _insert(conn, rows, series)
                _follow_latest(conn, sorted({row["request_id"] for row in rows}), now)
        except Exception:
            self._forget_new_keys()
            raise
        return len(rows), len(records) - len(rows)

    def record_one(self, record: Record) -> int | None:
        """Store one finished result (`tunebench run`'s) and its time series; returns the result's id
        (None: a result with its source_key is already stored)."""
        added, _ = self.record_many([record])
        if not added:
            return None
        point = (record.experiment.id, record.entity.id)
        request_id = self.request_ids([point], actuator=record.actuator)[point]
        with db.read(self.engine) as conn:
            return conn.execute(select(func.max(results.c.id)).where(results.c.request_id == request_id)).scalar()

    def _bulk_pks(self, conn: Connection, table: Table, objects: dict[str, Any]) -> dict[str, int]:
        """hash -> pk for experiments or entities, inserting the missing ones."""
        hashes = list(objects)
        found = _pks(conn, table, hashes)
        missing = [h for h in hashes if h not in found]
        if missing:
            now = time.time()
            if table is experiments:
                rows = [experiment_row(objects[h], h, now) for h in missing]
            else:
                rows = [entity_row(objects[h], h) for h in missing]
            conn.execute(insert(table), rows)
            found.update(_pks(conn, table, missing))
        return found


def _insert(conn: Connection, rows: list[dict[str, Any]], series: list[dict[str, Any] | None]) -> None:
    """Insert result rows in their order: in one statement, or one by one where a row has a time series
    (its blob is keyed by the result's id; imports have none, measurements recorded by `run` one)."""
    if not any(series):
        conn.execute(insert(results), rows)
        return
    for row, data in zip(rows, series):
        result_id = conn.execute(insert(results).values(row)).inserted_primary_key[0]
        if data:
            insert_series(conn, result_id, data)


def _pks(conn: Connection, table: Table, hashes: list[str]) -> dict[str, int]:
    found: dict[str, int] = {}
    for i in range(0, len(hashes), CHUNK):
        found.update(
            conn.execute(select(table.c.id_hash, table.c.pk).where(table.c.id_hash.in_(hashes[i : i + CHUNK]))).all()
        )
    return found


def _requests(conn: Connection, keys: list[RequestKey], now: float) -> dict[RequestKey, int]:
    """Request ids of keys, creating the missing requests (pending) in the order of keys."""
    want = dict.fromkeys(keys)
    req_ids = _existing_requests(conn, want)
    missing = [k for k in want if k not in req_ids]
    if missing:
        conn.execute(
            insert(requests),
            [
                dict(experiment_pk=e, entity_pk=n, actuator=a, status=PENDING, attempts=0, created_at=now)
                for e, n, a in missing
            ],
        )
        req_ids.update(_existing_requests(conn, dict.fromkeys(missing)))
    return req_ids


def _existing_requests(conn: Connection, want: dict[RequestKey, None]) -> dict[RequestKey, int]:
    entity_pks = sorted({n for _, n, _ in want})
    out: dict[RequestKey, int] = {}
    for i in range(0, len(entity_pks), CHUNK):
        for r in conn.execute(
            select(requests.c.id, requests.c.experiment_pk, requests.c.entity_pk, requests.c.actuator).where(
                requests.c.entity_pk.in_(entity_pks[i : i + CHUNK])
            )
        ):
            key = (r.experiment_pk, r.entity_pk, r.actuator)
            if key in want:
                out[key] = r.id
    return out


def _stored_source_keys(conn: Connection, keys: list[str]) -> set[str]:
    seen: set[str] = set()
    for i in range(0, len(keys), CHUNK):
        seen.update(
            conn.execute(select(results.c.source_key).where(results.c.source_key.in_(keys[i : i + CHUNK]))).scalars()
        )
    return seen


def _follow_latest(conn: Connection, request_ids: list[int], now: float) -> None:
    """Each request's status and result become its latest result's, unless someone is measuring it."""
    latest: dict[int, int] = {}
    for i in range(0, len(request_ids), CHUNK):
        latest.update(
            conn.execute(
                select(results.c.request_id, func.max(results.c.id))
                .where(results.c.request_id.in_(request_ids[i : i + CHUNK]))
                .group_by(results.c.request_id)
            ).all()
        )
    result_ids = list(latest.values())
    status_of: dict[int, str] = {}
    for i in range(0, len(result_ids), CHUNK):
        status_of.update(
            conn.execute(
                select(results.c.id, results.c.status).where(results.c.id.in_(result_ids[i : i + CHUNK]))
            ).all()
        )
    conn.execute(
        update(requests)
        .where(requests.c.id == bindparam("rid"), requests.c.status != RUNNING)
        .values(status=bindparam("st"), result_id=bindparam("res"), finished_at=now),
        [{"rid": rid, "st": status_of[res], "res": res} for rid, res in latest.items()],
    )
