"""Importing ado's SQLite sample store (tunebench.store.ado_sqlite) without ado: a file in ado's table layout,
written here with sqlite3 in WAL mode as ado's SQLAlchemy store keeps it. The import reads it and writes nothing
beside it (SQLite reading a WAL-mode file in place, even read-only, leaves -wal and -shm files there)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from tunebench.commands.main import main
from tunebench.store import Store

TABLE = "sqlsource_abc123"
ENTITY = {"model_name": "smollm2-135m", "model_max_length": 256, "number_gpus": 0}


def ado_store(path: Path, batches: range) -> sqlite3.Connection:
    """An ado sample store at path in WAL mode, one valid SFTTrainer result per batch size; the open connection
    (closing it checkpoints the WAL into the file and removes the -wal file)."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")  # commits stay in the -wal file while conn is open
    conn.executescript(
        f"""
        CREATE TABLE {TABLE} (identifier TEXT, representation TEXT);
        CREATE TABLE {TABLE}_measurement_results (insert_id INTEGER PRIMARY KEY, uid TEXT, data TEXT);
        CREATE TABLE {TABLE}_measurement_requests
            (uid TEXT, operation_id TEXT, request_id TEXT, timestamp TEXT, experiment_reference TEXT);
        CREATE TABLE {TABLE}_measurement_requests_results (request_uid TEXT, result_uid TEXT);
        """
    )
    add(conn, batches)
    return conn


def add(conn: sqlite3.Connection, batches: range) -> None:
    """One result per batch size, committed."""
    for batch in batches:
        values = {**ENTITY, "batch_size": batch}
        identifier = "-".join(f"{k}.{v}" for k, v in values.items())
        representation = {
            "generatorid": "explicit_grid_sample_generator",
            "constitutive_property_values": [{"property": {"identifier": k}, "value": v} for k, v in values.items()],
        }
        conn.execute(f"INSERT INTO {TABLE} VALUES (?, ?)", (identifier, json.dumps(representation)))
        data = {
            "uid": f"result-{batch}",
            "entityIdentifier": identifier,
            "experimentReference": {
                "actuatorIdentifier": "SFTTrainer",
                "experimentIdentifier": "finetune_lora_benchmark-v1.0.0",
                "parameterization": [],
            },
            "measurements": [
                {"property": {"targetProperty": {"identifier": name}}, "value": value}
                for name, value in (("is_valid", 1), ("train_runtime", 10.0 + batch))
            ],
        }
        conn.execute(
            f"INSERT INTO {TABLE}_measurement_results (uid, data) VALUES (?, ?)", (f"result-{batch}", json.dumps(data))
        )
    conn.commit()


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def runtimes(db: Path) -> list[float]:
    with Store(db, readonly=True) as store:
        return sorted(r["properties"]["train_runtime"] for r in store.rows())


def test_a_wal_mode_sample_store_is_imported_without_a_file_beside_it(tmp_path, capsys):
    folder = tmp_path / "ado"
    folder.mkdir()
    local = folder / "local.db"
    ado_store(local, range(1, 3)).close()
    assert local.read_bytes()[18] == 2  # the header says WAL mode
    before = files(folder)
    db = tmp_path / "s.db"
    assert main(["import", str(local), "--store", str(db)]) == 0
    assert "2 rows, 2 added" in capsys.readouterr().out
    assert files(folder) == before  # no local.db-wal, local.db-shm
    assert runtimes(db) == [11.0, 12.0]


def test_commits_still_in_the_wal_file_are_imported_and_the_files_left_as_they_were(tmp_path, capsys):
    folder = tmp_path / "ado"
    folder.mkdir()
    local = folder / "local.db"
    conn = ado_store(local, range(1, 2))  # ado running: its connection open
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        add(conn, range(2, 4))  # in local.db-wal only
        assert (folder / "local.db-wal").stat().st_size > 0
        before = files(folder)
        db = tmp_path / "s.db"
        assert main(["import", str(local), "--store", str(db)]) == 0
        assert "3 rows, 3 added" in capsys.readouterr().out
        assert files(folder) == before
        assert runtimes(db) == [11.0, 12.0, 13.0]
    finally:
        conn.close()


def test_a_sample_store_without_results_is_refused_and_no_store_made(tmp_path, capsys):
    local = tmp_path / "local.db"
    ado_store(local, range(0)).close()
    db = tmp_path / "s.db"
    assert main(["import", str(local), "--store", str(db)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["error: FILE: local.db holds ado sample stores without results: nothing to import"]
    assert not db.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local.db"]
