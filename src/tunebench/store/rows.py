"""How the store's rows are written and read: ids, JSON-safe values, result rows, decoded outcomes.

Plain functions and dataclasses shared by the queue (store/queue.py), the reads (store/reads.py),
the bulk import (store/imports.py) and the tables (store/tables.py); nothing here opens a store.
"""

from __future__ import annotations

import gc
import hashlib
import json
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Connection, Text, cast, insert

from tunebench.spec.experiments import Entity, Experiment
from tunebench.spec.results import LOG_TAIL_CHARS, Result
from tunebench.store.schema import ENTITY_COLUMNS, MEASURED_COLUMNS, results
from tunebench.store.series import insert_series

CHUNK = 500  # ids per IN (...) list: well under SQLite's 32766 variable limit


def id_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def clean_json(value: Any) -> Any:
    """JSON-safe copy: non-finite floats -> None, tuples/sets -> lists, unknown objects -> str."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, dict):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [clean_json(v) for v in value]
    if hasattr(value, "items"):
        return {str(k): clean_json(v) for k, v in value.items()}
    return str(value)


def finite_number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


@dataclass
class Claim:
    """A request this explorer holds: everything an executor needs to run it (picklable)."""

    request_id: int
    token: str
    attempt: int
    experiment_id: str
    base_id: str
    parameters: dict[str, Any]
    entity_id: str
    entity_values: dict[str, Any]
    actuator: str
    operation_id: str | None


@dataclass(frozen=True)
class Selection:
    """Which stored outcomes to read (None: no condition): an operation's (in sampling order), these
    request ids (in their order), one actuator's, of these statuses. every_result: each stored result
    of a request (repeats, retries, imports) as its own outcome, oldest first, not only the latest."""

    operation_id: str | None = None
    request_ids: Sequence[int] | None = None
    actuator: str | None = None
    statuses: Sequence[str] | None = None
    every_result: bool = False


@dataclass(frozen=True)
class Repeats:
    """The valid and invalid results of one request (an entity measured again: ado's repeats, re-runs):
    how many, how many valid, and each measured property's mean and sample standard deviation over
    the valid ones (std None with fewer than two values)."""

    count: int
    valid: int
    stats: dict[str, tuple[float, float | None]]


@dataclass
class Outcomes:
    """Store.table(): outcome columns by name (see reads.outcomes_query), experiments by pk, row count."""

    columns: dict[str, tuple]
    experiments: dict[int, dict[str, Any]]
    count: int


@dataclass
class Registered:
    """Where a sampled point stands after registration."""

    request_id: int
    origin: str  # new | memoised | rules
    status: str


@dataclass
class Record:
    """One result to store in bulk (imports): the point, the outcome, and where it came from."""

    experiment: Experiment
    entity: Entity
    result: Result
    actuator: str = "measure"
    generator: str | None = None
    source_key: str | None = None
    source_identifier: str | None = None
    source_experiment_id: str | None = None


def decode_rows(raw: list[Any], keys: list[str], experiments_by_pk: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Store.rows' dicts from its query's tuples (see there)."""
    memo: dict[str, Any] = {}

    def load(text: Any) -> Any:
        if not isinstance(text, str):  # drivers that decode JSON themselves (psycopg)
            return text
        found = memo.get(text)
        if found is None:
            found = memo[text] = json.loads(text)
        return found

    n_entity, n_props = len(ENTITY_COLUMNS), len(PROPERTY_COLUMNS)
    first = keys.index(ENTITY_COLUMNS[0])
    named = keys[:first] + keys[first + n_entity + n_props :]  # origin, with operation_id
    out = []
    for values in raw:
        columns = values[first : first + n_entity]
        measured = values[first + n_entity : first + n_entity + n_props]
        row = dict(zip(named, values[:first] + values[first + n_entity + n_props :]))
        row.update(experiments_by_pk[row.pop("experiment_pk")])
        if row.pop("only_columns"):
            row["entity"] = {k: v for k, v in zip(ENTITY_COLUMNS, columns) if v is not None}
        else:
            row["entity"] = json.loads(row["entity"]) if isinstance(row["entity"], str) else row["entity"]
        row["reasons"] = load(row["reasons"])
        row["properties"] = properties_of(measured[0], measured[1:-1], load(measured[-1]))
        out.append(row)
    return out


def as_text(column: ColumnElement) -> ColumnElement:
    """A JSON column read as its text on every database: decoded here once per distinct text (and
    never a dict, which psycopg would otherwise return for PostgreSQL's json)."""
    return cast(column, Text)


# is_valid, every measured column, extra_properties (as text): what properties_of() takes
PROPERTY_COLUMNS = (
    results.c.is_valid,
    *(results.c[name] for name in MEASURED_COLUMNS),
    as_text(results.c.extra_properties).label("extra_properties"),
)


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while building many acyclic objects (2-3x faster)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def experiment_row(experiment: Experiment, key: str, now: float) -> dict[str, Any]:
    """The experiments row of an experiment whose id hashes to key."""
    return {
        "id": experiment.id,
        "id_hash": key,
        "base_id": experiment.base_id,
        "parameters": clean_json(dict(experiment.parameters)),
        "created_at": now,
    }


def entity_row(entity: Entity, key: str) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": entity.id,
        "id_hash": key,
        "properties": clean_json(dict(entity.values)),
        "created_at": time.time(),
    }
    for name in ENTITY_COLUMNS:
        value = entity.values.get(name)
        row[name] = value if isinstance(value, (int, str)) and not isinstance(value, bool) else None
    row["only_columns"] = int(all(k in ENTITY_COLUMNS and row[k] == v for k, v in entity.values.items()))
    return row


def result_row(
    request_id: int,
    result: Result,
    generator: str | None = None,
    source_key: str | None = None,
    source_identifier: str | None = None,
    source_experiment_id: str | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    props = clean_json(dict(result.properties))
    valid = props.pop("is_valid", None)
    row: dict[str, Any] = {
        "request_id": request_id,
        "status": result.status,
        "actuator": result.actuator,
        "is_valid": int(valid) if isinstance(valid, (bool, int, float)) else None,
        "reasons": clean_json(list(result.reasons)),
        "meta": clean_json(dict(result.metadata)),
        "error": result.error,
        "log_tail": result.log_tail[-LOG_TAIL_CHARS:] if result.log_tail else None,
        "generator": generator,
        "source_key": source_key,
        "source_identifier": source_identifier,
        "source_experiment_id": source_experiment_id,
        "created_at": time.time() if now is None else now,
    }
    for name in MEASURED_COLUMNS:
        number = finite_number(props.get(name))
        row[name] = number
        if number is not None:
            del props[name]
    row["extra_properties"] = props  # whatever has no column (a non-numeric value included)
    return row


def json_value(value: Any) -> Any:
    """A JSON column read as text (SQLite, MySQL) or already decoded (psycopg)."""
    return json.loads(value) if isinstance(value, str) else value


def properties_of(is_valid: Any, measured: Sequence[Any], extra: Any) -> dict[str, Any]:
    """A result's properties from its columns (MEASURED_COLUMNS order) and extra_properties."""
    props = {name: value for name, value in zip(MEASURED_COLUMNS, measured) if value is not None}
    if extra:
        props.update(json.loads(extra) if isinstance(extra, str) else extra)
    if is_valid is not None:
        props["is_valid"] = int(is_valid)
    return props


def insert_result(conn: Connection, request_id: int, result: Result, *, generator: str | None = None) -> int:
    """Insert one result (and its time series, if it has one); returns its id."""
    result_id = conn.execute(insert(results).values(result_row(request_id, result, generator))).inserted_primary_key[0]
    if result.series:
        insert_series(conn, result_id, result.series)
    return result_id
