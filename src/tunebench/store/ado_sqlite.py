"""Read IBM ado's SQLite sample store (its ``~/.config/ado/databases/local.db``) as tunebench Records.

ado-core 2.3.0's SQLSampleStore (ado/core/samplestore/sql.py) keeps each sample store ``ID`` in four
tables: ``sqlsource_ID`` (entities: identifier, representation = the Entity's JSON with its
constitutive_property_values), ``sqlsource_ID_measurement_requests`` (operation_id, request_id,
status, timestamp), ``sqlsource_ID_measurement_results`` (one row per result: data = the
MeasurementResult's JSON: entityIdentifier, experimentReference with its parameterization,
measurements, metadata; or, for a failed measurement, reason) and
``sqlsource_ID_measurement_requests_results`` (which request produced which result).

Every result becomes one tunebench result (ado's repeats each their own, in insert order), of the
experiment its reference names with its parameters: is_valid 1 -> valid with every measured
property tunebench knows; is_valid 0 -> invalid (the reasons tunebench's ado actuator leaves in the
result's metadata, else a generic one); a failed measurement (ado's InvalidMeasurementResult) ->
failed with ado's reason. The actuator: SFTTrainer -> measure, tunebench_predict -> predict.
Importing the file again adds nothing (each result's ado uid is its source key).

The file is read from a copy in a temporary directory (with its ``-wal`` file, whose commits are part of
the database): SQLite opening a WAL-mode file, even ``?mode=ro``, makes ``-wal`` and ``-shm`` files
beside it (tunebench.store.db's "Read-Only Databases" trap), and an import never writes next to its
input. A file SQLite cannot read (a damaged or truncated one) is an InputError naming it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import DatabaseError

from tunebench.errors import InputError, one_of
from tunebench.inputs import input_error
from tunebench.spec.experiments import get_experiment, make_entity
from tunebench.spec.results import Result
from tunebench.store.rows import Record

SQLITE_MAGIC = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite 3 database file
# ado actuator id -> the tunebench actuator whose memoised requests the results join
ACTUATORS = {"SFTTrainer": "measure", "tunebench_predict": "predict"}
_RESULTS = "_measurement_results"


def is_sqlite(path: Path) -> bool:
    """True when path is an SQLite 3 database (by its header)."""
    try:
        with path.open("rb") as f:
            return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False


def read_ado_store(path: Path, summary: Any, *, skip_bad_rows: bool = False) -> list[Record]:
    """Every result of every ado sample store in the SQLite file; fills summary (an ImportSummary).

    InputError naming the table and row for a result tunebench cannot read (all or nothing unless
    skip_bad_rows), and naming the file if SQLite cannot read it or it holds no ado result.
    """
    # csvio calls this module (read_import): imported here, not at the top
    from tunebench.store.csvio import MEASURED

    with tempfile.TemporaryDirectory(prefix="tunebench-import-") as tmp:
        copy = Path(tmp) / "ado.db"
        shutil.copyfile(path, copy)
        wal = path.with_name(path.name + "-wal")
        if wal.is_file():  # commits not yet checkpointed into the file
            shutil.copyfile(wal, copy.with_name(copy.name + "-wal"))
        try:
            records, errors = _read_copy(copy, path, summary, MEASURED)
        except DatabaseError as exc:
            raise InputError("FILE", _unreadable(path, exc)) from None
    if not summary.rows:  # an import that adds nothing would still make the store: say so instead
        raise InputError("FILE", f"{path.name} holds ado sample stores without results: nothing to import")
    if errors and not skip_bad_rows:
        where, first = errors[0]
        raise InputError(
            f"{path.name} {where}: {first.field}",
            f"{first.message} ({len(errors)} of {summary.rows} "
            "results cannot be imported; nothing was imported; --skip-bad-rows imports the others)",
            first.allowed,
        )
    for _, exc in errors:
        summary.skipped[f"{exc.field}: {exc.message}"] += 1
    return records


def _read_copy(
    copy: Path, path: Path, summary: Any, measured: set[str]
) -> tuple[list[Record], list[tuple[str, InputError]]]:
    """The records of the ado sample stores in copy (of the file at path), and the rows that cannot be read
    (where, error); sqlalchemy's DatabaseError when SQLite cannot read the file."""
    engine = create_engine(URL.create("sqlite", database=str(copy)))
    try:
        stores = sorted(
            t[: -len(_RESULTS)]
            for t in inspect(engine).get_table_names()
            if t.startswith("sqlsource_") and t.endswith(_RESULTS)
        )
        if not stores:
            raise InputError(
                "FILE",
                f"{path.name} is an SQLite file without an ado sample store (no sqlsource_*_measurement_results table)",
            )
        records: list[Record] = []
        errors: list[tuple[str, InputError]] = []
        with engine.connect() as conn:
            for table in stores:
                entities = dict(conn.execute(text(f'SELECT identifier, representation FROM "{table}"')).all())
                rows = conn.execute(
                    text(
                        "SELECT r.insert_id, r.uid, r.data, q.operation_id, q.request_id, q.timestamp, "
                        f'q.experiment_reference FROM "{table}{_RESULTS}" r '
                        f'LEFT JOIN "{table}_measurement_requests_results" l ON l.result_uid = r.uid '
                        f'LEFT JOIN "{table}_measurement_requests" q ON q.uid = l.request_uid ORDER BY r.insert_id'
                    )
                ).all()
                count = Counter(_cell_key(row.data) for row in rows)
                seen: Counter = Counter()
                for row in rows:
                    summary.rows += 1
                    key = _cell_key(row.data)
                    seen[key] += 1
                    try:
                        records.append(_record(row, entities, table, (seen[key], count[key]), path, measured))
                    except InputError as exc:
                        errors.append((f"{table}{_RESULTS} row {row.insert_id}", exc))
    finally:
        engine.dispose()
    return records, errors


def _unreadable(path: Path, exc: DatabaseError) -> str:
    """Why SQLite cannot read the file at path, for an InputError: not a database, or damaged."""
    why = str(getattr(exc, "orig", None) or exc).splitlines()[0]
    if "not a database" in why:  # "file is not a database", "file is encrypted or is not a database"
        return f"{path.name} is not a SQLite database, though it starts with SQLite's header ({why})"
    if "malformed" in why or "corrupt" in why:
        return f"{path.name} is a damaged SQLite database ({why}): a truncated or partly written copy?"
    return f"{path.name} cannot be read as ado's sample store ({why})"


def _cell_key(data: str) -> tuple[str, str]:
    """(entity, experiment reference) of a result's JSON: the results of one cell are its repeats."""
    try:
        item = json.loads(data)
        return item.get("entityIdentifier", ""), json.dumps(item.get("experimentReference"), sort_keys=True)
    except (TypeError, ValueError, AttributeError):
        return "", ""


def _record(
    row: Any, entities: dict[str, str], table: str, repeat: tuple[int, int], path: Path, measured: set[str]
) -> Record:
    """One ado result row as a Record; InputError naming what cannot be read."""
    from tunebench.store.csvio import Measurements

    try:
        item = json.loads(row.data)
        reference = item["experimentReference"]
        entity_id = item["entityIdentifier"]
    except (TypeError, ValueError, KeyError) as exc:
        raise InputError("data", f"is not an ado measurement result ({exc})") from None
    ado_actuator = reference.get("actuatorIdentifier")
    if ado_actuator not in ACTUATORS:
        raise InputError(
            "experimentReference.actuatorIdentifier",
            f"{ado_actuator!r} is not an actuator tunebench reads",
            allowed=one_of(ACTUATORS),
        )
    parameters = {p["property"]["identifier"]: p["value"] for p in reference.get("parameterization") or ()}
    experiment = get_experiment(reference["experimentIdentifier"], parameters)
    if entity_id not in entities:
        raise InputError("entityIdentifier", f"{entity_id!r} is not among the entities of {table}")
    try:
        representation = json.loads(entities[entity_id])
        values = {v["property"]["identifier"]: v["value"] for v in representation["constitutive_property_values"]}
    except (TypeError, ValueError, KeyError) as exc:
        raise InputError("representation", f"entity {entity_id!r} cannot be read ({exc})") from None
    entity = make_entity(experiment, values)

    index, of = repeat
    when = str(row.timestamp) if row.timestamp else None
    metadata: dict[str, Any] = {
        "source": f"{path.name}:{table}",
        "ado": {"operation": row.operation_id, "request": row.request_id, "timestamp": when},
    }
    if of > 1:
        metadata["repeat"] = {"index": index, "of": of}
    if "measurements" not in item:  # ado's InvalidMeasurementResult: the measurement failed
        result = Result.failed(
            experiment.id, entity.id, str(item.get("reason") or "failed in ado"), actuator="import", metadata=metadata
        )
    else:
        props = {}
        for value in item["measurements"]:
            name = value["property"]["targetProperty"]["identifier"]
            if name in measured and isinstance(value.get("value"), (int, float)):
                props[name] = value["value"]
        try:
            Measurements.model_validate(props)
        except ValidationError as exc:
            error = input_error(exc)
            raise InputError(error.field, error.message, error.allowed) from None
        reasons = (item.get("metadata") or {}).get("reasons") or []
        if int(props.pop("is_valid", 1)) == 1:
            result = Result.valid(experiment.id, entity.id, props, actuator="import", metadata=metadata)
        else:
            reasons = reasons or ["imported with is_valid=0 (out of memory or a rejected configuration)"]
            result = Result.invalid(experiment.id, entity.id, reasons, actuator="import", metadata=metadata)
    return Record(
        experiment=experiment,
        entity=entity,
        result=result,
        actuator=ACTUATORS[ado_actuator],
        generator=representation.get("generatorid") or "import",
        source_key=hashlib.sha256(f"ado-sqlite:{item.get('uid') or row.uid}".encode()).hexdigest(),
        source_identifier=entity_id,
        source_experiment_id=row.experiment_reference or f"{ado_actuator}.{experiment.id}",
    )
