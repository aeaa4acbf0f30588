"""Whole stored results by id: what the experiment trackers (tunebench.track) send, and a warning kept on one.

A listing (``Store.rows``, ``Store.table``) gives each request's outcome; a tracker needs each *result*
(every attempt, repeat and re-run is one tracker run) with what the listing leaves out: the result's
id and time, its metadata (the run's output directory, the worker's per-step losses), its log tail and
the operation that produced it.

    ids = result_ids(store)                           # every measurement's result, oldest first
    ids = result_ids(store, latest_of=[request_id])   # the result that decided each request
    for r in read_results(store, ids): ...            # StoredResult, in the order of ids
    add_warning(store, r.result_id, "mlflow: ...")    # kept in the result's metadata (``tracking_warnings``)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import select, update

from tunebench.spec.results import Result
from tunebench.store import db
from tunebench.store.base import StoreBase
from tunebench.store.rows import CHUNK, as_text, clean_json, json_value, properties_of
from tunebench.store.schema import (
    MEASURED_COLUMNS,
    entities,
    experiments,
    operation_points,
    operations,
    requests,
    results,
)

PREDICT, RULES = "predict", "rules"  # a prediction is no measurement; a point invalid by rule never ran
RUN, IMPORT = "run", "import"  # `tunebench run`'s results (their generator) and imported ones (their actuator)
WARNINGS = "tracking_warnings"  # the metadata key of the warnings add_warning keeps


@dataclass(frozen=True)
class StoredResult:
    """One stored result and where it belongs: its point, its operation, its time."""

    result_id: int
    request_id: int
    created_at: float  # epoch seconds (UTC) when the store recorded it
    experiment_id: str
    base_id: str
    parameters: dict[str, Any]  # the experiment's parameterisation
    entity_id: str
    entity: dict[str, Any]  # canonical values (defaults left out)
    result: Result
    operation_id: str | None  # the operation that recorded it; None for `tunebench run` and imports
    operation_name: str | None
    generator: str | None  # grid | random | optimize | run | an import's generatorid

    @property
    def key(self) -> str:
        """An identity that survives copying the store or spelling its URL otherwise: id and creation time."""
        return f"{self.result_id}@{self.created_at:.6f}"


def result_ids(store: StoreBase, *, latest_of: Sequence[int] | None = None) -> list[int]:
    """Result ids, ascending: the result that decided each of the requests latest_of (a failed attempt
    that is retried included); None: every result of a measurement (neither a prediction nor a point
    recorded invalid by rule without running)."""
    with db.read(store.engine) as conn:
        if latest_of is not None:
            ids: set[int] = set()
            wanted = list(latest_of)
            for i in range(0, len(wanted), CHUNK):
                query = select(requests.c.result_id).where(requests.c.id.in_(wanted[i : i + CHUNK]))
                ids.update(r for r in conn.execute(query).scalars() if r is not None)
            return sorted(ids)
        query = (
            select(results.c.id)
            .join(requests, requests.c.id == results.c.request_id)
            .where(requests.c.actuator != PREDICT, results.c.actuator != RULES)
            .order_by(results.c.id)
        )
        return list(conn.execute(query).scalars())


def read_results(store: StoreBase, ids: Sequence[int]) -> list[StoredResult]:
    """The stored results of ids, in that order (ids the store does not have are left out)."""
    columns = (
        results.c.id,
        results.c.request_id,
        results.c.created_at,
        results.c.status,
        results.c.actuator,
        results.c.is_valid,
        *(results.c[n] for n in MEASURED_COLUMNS),
        as_text(results.c.extra_properties),
        as_text(results.c.reasons),
        as_text(results.c.meta),
        results.c.error,
        results.c.log_tail,
        results.c.generator,
        requests.c.operation_id,
        experiments.c.id,
        experiments.c.base_id,
        as_text(experiments.c.parameters),
        entities.c.id,
        as_text(entities.c.properties),
    )
    query = (
        select(*columns)
        .join(requests, requests.c.id == results.c.request_id)
        .join(experiments, experiments.c.pk == requests.c.experiment_pk)
        .join(entities, entities.c.pk == requests.c.entity_pk)
    )
    found: dict[int, StoredResult] = {}
    wanted = list(ids)
    n = len(MEASURED_COLUMNS)
    with db.read(store.engine) as conn:
        for i in range(0, len(wanted), CHUNK):
            sampled_by = _latest_operations(conn, wanted[i : i + CHUNK])
            for row in conn.execute(query.where(results.c.id.in_(wanted[i : i + CHUNK]))):
                (rid, request_id, created, status, actuator, is_valid), rest = row[:6], row[6:]
                (
                    measured,
                    (
                        extra,
                        reasons,
                        meta,
                        error,
                        log_tail,
                        generator,
                        claimed_by,
                        exp_id,
                        base_id,
                        params,
                        entity_id,
                        entity,
                    ),
                ) = rest[:n], rest[n:]
                result = Result(
                    exp_id,
                    entity_id,
                    status,
                    properties_of(is_valid, measured, extra),
                    list(json_value(reasons) or []),
                    dict(json_value(meta) or {}),
                    error,
                    log_tail,
                    actuator,
                )
                op_id = operation_of(result, generator, sampled_by.get(rid) or claimed_by)
                found[rid] = StoredResult(
                    rid,
                    request_id,
                    float(created),
                    exp_id,
                    base_id,
                    dict(json_value(params) or {}),
                    entity_id,
                    dict(json_value(entity) or {}),
                    result,
                    op_id,
                    None,
                    generator,
                )
        names = _operation_names(conn, {r.operation_id for r in found.values() if r.operation_id})
    return [replace(found[i], operation_name=names.get(found[i].operation_id)) for i in wanted if i in found]


def operation_of(result: Result, generator: str | None, likely: str | None) -> str | None:
    """The operation that recorded a result: the one its store write named (``execution.operation_id``,
    tunebench.store.queue.recorded_by); none for `tunebench run`'s and imported results; else (a result stored
    before that was kept) likely: the latest operation started before it that sampled its point, else the one
    that last claimed its request."""
    named = (result.metadata.get("execution") or {}).get("operation_id")
    if isinstance(named, str) and named:
        return named
    if generator == RUN or result.actuator == IMPORT:
        return None
    return likely


def _latest_operations(conn: Any, result_ids: Sequence[int]) -> dict[int, str]:
    """result id -> the latest operation created before the result that sampled its point (results of no
    operation are left out)."""
    query = (
        select(results.c.id, operations.c.id)
        .join(operation_points, operation_points.c.request_id == results.c.request_id)
        .join(operations, operations.c.id == operation_points.c.operation_id)
        .where(results.c.id.in_(result_ids), operations.c.created_at <= results.c.created_at)
        .order_by(operations.c.created_at)
    )
    return dict(conn.execute(query).all())  # the latest of each result's last


def _operation_names(conn: Any, ids: set[str]) -> dict[str, str | None]:
    """Operation id -> its name (None: unnamed), for ids."""
    if not ids:
        return {}
    query = select(operations.c.id, operations.c.name).where(operations.c.id.in_(sorted(ids)))
    return dict(conn.execute(query).all())


def add_warning(store: StoreBase, result_id: int, text: str) -> None:
    """Keep a warning about a stored result (a tracker that could not take it) in its metadata, under
    ``tracking_warnings``: the result itself, its properties and status, stay as they were."""
    with db.write(store.engine) as conn:
        meta = conn.execute(select(as_text(results.c.meta)).where(results.c.id == result_id)).scalar()
        if meta is None:
            return
        meta = dict(json_value(meta) or {})
        meta[WARNINGS] = [*(meta.get(WARNINGS) or []), text]
        conn.execute(update(results).where(results.c.id == result_id).values(meta=clean_json(meta)))
