"""The store's reads: counts and states of requests, and stored outcomes as rows or columns.

Speed (``tunebench show`` over 100,000s of results): measured properties and the common entity
values are real columns, so most rows need no JSON decoding at all; experiments are read once
each, not once per row; the cyclic garbage collector is paused while the rows are built.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Select, and_, case, func, select

from tunebench.spec.results import Result
from tunebench.store import db
from tunebench.store.base import StoreBase
from tunebench.store.rows import (
    CHUNK,
    PROPERTY_COLUMNS,
    Outcomes,
    Repeats,
    Selection,
    as_text,
    decode_rows,
    id_hash,
    json_value,
    no_gc,
    properties_of,
)
from tunebench.store.schema import (
    DONE,
    ENTITY_COLUMNS,
    MEASURED_COLUMNS,
    VALID,
    entities,
    experiments,
    operation_points,
    requests,
    results,
    series,
)
from tunebench.store.series import UnknownResult, stored_series


class Reads(StoreBase):
    """What a store holds: counts, states, request ids, outcomes, the results of a request."""

    def counts(self, operation_id: str) -> dict[str, int]:
        """Requests of an operation by status."""
        with db.read(self.engine) as conn:
            rows = conn.execute(
                select(requests.c.status, func.count())
                .join(operation_points, operation_points.c.request_id == requests.c.id)
                .where(operation_points.c.operation_id == operation_id)
                .group_by(requests.c.status)
            ).all()
        return {status: n for status, n in rows}

    def actuators(self) -> dict[str, int]:
        """Requests that have a result, by actuator (what another --actuator of show would find)."""
        with db.read(self.engine) as conn:
            rows = conn.execute(
                select(requests.c.actuator, func.count())
                .where(requests.c.result_id.is_not(None))
                .group_by(requests.c.actuator)
            ).all()
        return {actuator: n for actuator, n in rows}

    def states(self, request_ids: Iterable[int]) -> dict[int, tuple[str, dict[str, Any]]]:
        """request id -> (status, properties of its deciding result)."""
        ids = list(request_ids)
        out: dict[int, tuple[str, dict[str, Any]]] = {}
        with db.read(self.engine) as conn:
            for i in range(0, len(ids), CHUNK):
                rows = conn.execute(
                    select(requests.c.id, requests.c.status, *PROPERTY_COLUMNS)
                    .outerjoin(results, results.c.id == requests.c.result_id)
                    .where(requests.c.id.in_(ids[i : i + CHUNK]))
                ).all()
                out.update({r[0]: (r[1], properties_of(r[2], r[3:-1], r[-1])) for r in rows})
        return out

    def request_ids(self, points: Sequence[tuple[str, str]], actuator: str | None = None) -> dict[tuple[str, str], int]:
        """(experiment id, entity id) -> request id for the points the store knows."""
        out: dict[tuple[str, str], int] = {}
        keys = {(id_hash(e), id_hash(n)): (e, n) for e, n in points}
        by_entity: dict[str, list[str]] = {}
        for eh, nh in keys:
            by_entity.setdefault(nh, []).append(eh)
        hashes = list(by_entity)
        with db.read(self.engine) as conn:
            for i in range(0, len(hashes), CHUNK):
                query = (
                    select(requests.c.id, experiments.c.id_hash.label("eh"), entities.c.id_hash.label("nh"))
                    .join(experiments, experiments.c.pk == requests.c.experiment_pk)
                    .join(entities, entities.c.pk == requests.c.entity_pk)
                    .where(entities.c.id_hash.in_(hashes[i : i + CHUNK]))
                    .order_by(requests.c.id)
                )
                if actuator is not None:
                    query = query.where(requests.c.actuator == actuator)
                for r in conn.execute(query):
                    point = keys.get((r.eh, r.nh))
                    if point is not None and point not in out:
                        out[point] = r.id
        return out

    def rows(
        self,
        *,
        operation_id: str | None = None,
        request_ids: Sequence[int] | None = None,
        actuator: str | None = None,
        statuses: Sequence[str] | None = None,
    ) -> list[dict[str, Any]]:
        """Stored outcomes, one per request that has a result, in sampling (or insertion) order.

        Each row: request_id, result_id, status, actuator, experiment_id, base_id, parameters, entity_id,
        entity (values), properties, reasons, error, generator, source_identifier, source_experiment_id
        (+ origin: new | memoised | rules, with operation_id). Decoded JSON values may be shared
        between rows: treat them as read-only.
        """
        with no_gc():  # 100,000s of small acyclic objects: pausing the cyclic GC makes this 2-3x faster
            keys, raw, exps = self._outcomes(Selection(operation_id, request_ids, actuator, statuses))
            return decode_rows(raw, keys, exps)

    def table(self, selection: Selection = Selection()) -> Outcomes:
        """The outcomes of rows(), column by column and undecoded: what reports over 100,000s of rows use."""
        with no_gc():
            keys, raw, exps = self._outcomes(selection)
            columns = list(zip(*raw)) if raw else [() for _ in keys]
            count = len(raw)
            del raw  # free the row tuples before the collector is back on (it would walk all of them)
            return Outcomes(dict(zip(keys, columns)), exps, count)

    def _outcomes(self, selection: Selection) -> tuple[list[str], list[Any], dict[int, dict[str, Any]]]:
        """(column names, row tuples, experiments by pk) of the outcomes asked for (request_ids' order)."""
        query = outcomes_query(selection)
        raw: list[Any] = []
        keys: list[str] = []
        with db.read(self.engine) as conn:
            if selection.request_ids is None:
                result = conn.execute(query)
                keys, raw = list(result.keys()), result.all()
            else:
                ids = list(selection.request_ids)
                for i in range(0, len(ids), CHUNK):
                    result = conn.execute(query.where(requests.c.id.in_(ids[i : i + CHUNK])))
                    keys = list(result.keys())
                    raw += result.all()
                order = {rid: n for n, rid in enumerate(ids)}
                raw.sort(key=lambda r: order[r[0]])
            if not keys:
                keys = [c.name for c in query.selected_columns]
            exps = {
                pk: {"experiment_id": id_, "base_id": base, "parameters": json_value(params)}
                for pk, id_, base, params in conn.execute(
                    select(
                        experiments.c.pk,
                        experiments.c.id,
                        experiments.c.base_id,
                        as_text(experiments.c.parameters),
                    )
                )
            }
        return keys, raw, exps

    def repeats(self, request_ids: Sequence[int] | None = None) -> dict[int, Repeats]:
        """Requests with more than one valid or invalid result (of these ids; None: all) -> their Repeats.

        Computed in the database (count, mean and mean square per column), so 100,000s of results
        cost one pass; the sample standard deviation is sqrt(n/(n-1) * (E[x^2] - E[x]^2)).
        """
        counted = (
            select(
                results.c.request_id,
                func.count().label("n"),
                func.sum(case((results.c.status == VALID, 1), else_=0)).label("valid"),
            )
            .where(results.c.status.in_(DONE))
            .group_by(results.c.request_id)
            .having(func.count() > 1)
        )
        with db.read(self.engine) as conn:
            many = {r.request_id: (r.n, int(r.valid)) for r in conn.execute(counted)}
            if request_ids is not None:
                wanted = set(request_ids)
                many = {k: v for k, v in many.items() if k in wanted}
            moments = [
                c
                for name in MEASURED_COLUMNS
                for c in (
                    func.count(results.c[name]),
                    func.avg(results.c[name]),
                    func.avg(results.c[name] * results.c[name]),
                )
            ]
            out: dict[int, Repeats] = {}
            ids = [k for k, (_, valid) in many.items() if valid > 0]
            for i in range(0, len(ids), CHUNK):
                query = (
                    select(results.c.request_id, *moments)
                    .where(results.c.request_id.in_(ids[i : i + CHUNK]), results.c.status == VALID)
                    .group_by(results.c.request_id)
                )
                for row in conn.execute(query):
                    stats = {}
                    for j, name in enumerate(MEASURED_COLUMNS):
                        n, mean, square = row[1 + 3 * j : 4 + 3 * j]
                        if n:
                            var = max(0.0, float(square) - float(mean) ** 2) * n / (n - 1) if n > 1 else None
                            stats[name] = (float(mean), math.sqrt(var) if var is not None else None)
                    out[row[0]] = Repeats(*many[row[0]], stats)
            for rid, (n, valid) in many.items():
                out.setdefault(rid, Repeats(n, valid, {}))
        return out

    def result_info(self, result_id: int) -> dict[str, Any]:
        """What one result is: result_id, request_id, actuator, status, experiment_id, base_id, parameters,
        entity_id, entity (values), properties, series_points (values in its time series; 0: none).
        UnknownResult (tunebench.store.series) when the store has no result with that id."""
        with db.read(self.engine) as conn:
            row = conn.execute(
                select(
                    results.c.id,
                    results.c.request_id,
                    results.c.actuator,
                    results.c.status,
                    experiments.c.id.label("experiment_id"),
                    experiments.c.base_id,
                    as_text(experiments.c.parameters).label("parameters"),
                    entities.c.id.label("entity_id"),
                    as_text(entities.c.properties).label("entity"),
                    series.c.points,
                    *PROPERTY_COLUMNS,
                )
                .join(requests, requests.c.id == results.c.request_id)
                .join(experiments, experiments.c.pk == requests.c.experiment_pk)
                .join(entities, entities.c.pk == requests.c.entity_pk)
                .outerjoin(series, series.c.result_id == results.c.id)
                .where(results.c.id == _result_key(result_id))
            ).first()
            if row is None:
                raise UnknownResult(result_id, _id_range(conn))
        n = len(PROPERTY_COLUMNS)
        return {
            "result_id": row.id,
            "request_id": row.request_id,
            "actuator": row.actuator,
            "status": row.status,
            "experiment_id": row.experiment_id,
            "base_id": row.base_id,
            "parameters": json_value(row.parameters),
            "entity_id": row.entity_id,
            "entity": json_value(row.entity),
            "series_points": row.points or 0,
            "properties": properties_of(row[-n], row[-n + 1 : -1], row[-1]),
        }

    def series_of(self, result_id: int) -> dict[str, Any] | None:
        """The time series stored with a result (tunebench.worker.series's dict; None: it has none);
        UnknownResult when the store has no result with that id."""
        with db.read(self.engine) as conn:
            key = _result_key(result_id)
            found = stored_series(conn, key)
            if found is None and conn.execute(select(results.c.id).where(results.c.id == key)).first() is None:
                raise UnknownResult(result_id, _id_range(conn))
        return found

    def series_result_ids(self) -> list[int]:
        """The ids of the results that have a time series (the series table's keys alone: no blob is read)."""
        with db.read(self.engine) as conn:
            return list(conn.execute(select(series.c.result_id).order_by(series.c.result_id)).scalars())

    def results_of(self, request_id: int) -> list[Result]:
        """Every result stored for a request, oldest first (retries, remeasurements, imports)."""
        with db.read(self.engine) as conn:
            rows = (
                conn.execute(
                    select(results, experiments.c.id.label("experiment_id"), entities.c.id.label("entity_id"))
                    .join(requests, requests.c.id == results.c.request_id)
                    .join(experiments, experiments.c.pk == requests.c.experiment_pk)
                    .join(entities, entities.c.pk == requests.c.entity_pk)
                    .where(results.c.request_id == request_id)
                    .order_by(results.c.id)
                )
                .mappings()
                .all()
            )
        return [
            Result(
                experiment_id=r["experiment_id"],
                entity_id=r["entity_id"],
                status=r["status"],
                properties=properties_of(r["is_valid"], [r[n] for n in MEASURED_COLUMNS], r["extra_properties"]),
                reasons=list(r["reasons"]),
                metadata=dict(r["meta"]),
                error=r["error"],
                log_tail=r["log_tail"],
                actuator=r["actuator"],
            )
            for r in rows
        ]


def _result_key(result_id: Any) -> int:
    """A result id as the 64-bit integer the key holds (numpy integers too); an id out of that range is one
    that no result has (0). TypeError for anything that is not an integer."""
    key = operator.index(result_id)
    return key if -(2**63) <= key < 2**63 else 0


def _id_range(conn: Any) -> tuple[int, int, int] | None:
    """(smallest, largest, count) of the store's result ids; None without results."""
    low, high, count = conn.execute(select(func.min(results.c.id), func.max(results.c.id), func.count())).one()
    return None if not count else (int(low), int(high), int(count))


def outcomes_query(selection: Selection) -> Select:
    """The outcomes of requests that have a result: an operation's in sampling order, else all by request id
    (the caller picks selection.request_ids, in chunks).

    Columns: request_id, result_id (the result shown: the latest, or each with every_result), status,
    actuator, experiment_pk, entity_id, only_columns, entity (the JSON
    of the values only where the real columns do not hold them all), reasons, error, generator,
    source_identifier, source_experiment_id, every ENTITY_COLUMNS, PROPERTY_COLUMNS (+ origin with
    an operation).
    """
    status = results.c.status if selection.every_result else requests.c.status
    query = (
        select(
            requests.c.id.label("request_id"),
            results.c.id.label("result_id"),
            status.label("status"),
            requests.c.actuator,
            requests.c.experiment_pk,
            entities.c.id.label("entity_id"),
            entities.c.only_columns,
            case((entities.c.only_columns == 1, None), else_=as_text(entities.c.properties)).label("entity"),
            as_text(results.c.reasons).label("reasons"),
            results.c.error,
            results.c.generator,
            results.c.source_identifier,
            results.c.source_experiment_id,
            *(entities.c[name] for name in ENTITY_COLUMNS),
            *PROPERTY_COLUMNS,
        )
        .join(entities, entities.c.pk == requests.c.entity_pk)
        .join(
            results,
            (results.c.request_id if selection.every_result else results.c.id)
            == (requests.c.id if selection.every_result else requests.c.result_id),
        )
    )
    if selection.operation_id is not None:
        here = and_(
            operation_points.c.request_id == requests.c.id, operation_points.c.operation_id == selection.operation_id
        )
        query = (
            query.add_columns(operation_points.c.origin).join(operation_points, here).order_by(operation_points.c.seq)
        )
    else:
        query = query.order_by(requests.c.id)
    if selection.every_result:
        query = query.order_by(results.c.id)  # within a request: oldest first
    if selection.actuator is not None:
        query = query.where(requests.c.actuator == selection.actuator)
    if selection.statuses is not None:
        query = query.where(status.in_(list(selection.statuses)))
    return query
