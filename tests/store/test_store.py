"""The sample store on real SQLite files: schema versions, claims, leases, retries, bulk records."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from layout import DATA, SRC
from sqlalchemy import inspect, select, text

from tunebench.spec.experiments import get_experiment, make_entity
from tunebench.spec.results import Result
from tunebench.store import SCHEMA_VERSION, SchemaError, Store, migrations, owner_id, store_url
from tunebench.store.schema import TABLES, metadata, requests, results, schema_version
from tunebench.store.store import Record

EXP = get_experiment("finetune_lora_benchmark-v1.0.0", {"max_steps": 2})


def points(n: int, reasons: list[str] | None = None):
    return [
        (
            EXP,
            make_entity(
                EXP, {"model_name": "smollm2-135m", "number_gpus": 0, "model_max_length": 64 * (i + 1), "batch_size": 1}
            ),
            list(reasons or []),
        )
        for i in range(n)
    ]


@pytest.fixture
def store(any_store_url):
    with Store(any_store_url) as s:
        s.open_operation("op-test", sampler="grid", actuator="noop", space={}, name=None)
        yield s


def test_url_resolution(tmp_path, monkeypatch):
    assert store_url(tmp_path / "a.db") == f"sqlite:///{tmp_path / 'a.db'}"
    assert store_url("postgresql+psycopg://u@h/db") == "postgresql+psycopg://u@h/db"
    monkeypatch.setenv("TUNEBENCH_STORE", str(tmp_path / "env.db"))
    assert store_url(None) == f"sqlite:///{tmp_path / 'env.db'}"
    monkeypatch.delenv("TUNEBENCH_STORE")
    monkeypatch.setenv("TUNEBENCH_HOME", str(tmp_path / "home"))
    assert store_url(None) == f"sqlite:///{tmp_path / 'home' / 'store.db'}"


def test_fresh_store_has_schema_and_wal(tmp_path):
    with Store(tmp_path / "s.db") as s:
        assert s.version == SCHEMA_VERSION
        with s.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
            versions = conn.execute(select(schema_version.c.version)).scalars().all()
        assert versions == [SCHEMA_VERSION]
        # the database has exactly the tables and columns schema.py declares (no drift)
        inspector = inspect(s.engine)
        for table in TABLES:
            assert {c["name"] for c in inspector.get_columns(table.name)} == set(table.columns.keys())
    with Store(tmp_path / "s.db") as again:  # reopening migrates nothing
        assert again.version == SCHEMA_VERSION


def test_upgrade_steps_run_in_order_once(tmp_path, monkeypatch):
    Store(tmp_path / "s.db").close()  # a store at version SCHEMA_VERSION

    calls = []

    def add_column(conn):
        calls.append(SCHEMA_VERSION + 1)
        conn.exec_driver_sql("ALTER TABLE results ADD COLUMN energy_joules FLOAT")

    monkeypatch.setattr(migrations, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    monkeypatch.setitem(migrations.UPGRADES, SCHEMA_VERSION + 1, ("results.energy_joules", add_column))
    with Store(tmp_path / "s.db") as s:
        assert s.version == SCHEMA_VERSION + 1
        assert "energy_joules" in {c["name"] for c in inspect(s.engine).get_columns("results")}
    with Store(tmp_path / "s.db"):
        pass
    assert calls == [SCHEMA_VERSION + 1]


def test_newer_store_is_refused(tmp_path):
    with Store(tmp_path / "s.db") as s, s.engine.begin() as conn:
        conn.execute(schema_version.insert().values(version=SCHEMA_VERSION + 5, description="future", applied_at=0.0))
    with pytest.raises(SchemaError, match="newer"):
        Store(tmp_path / "s.db")


def test_register_claim_complete_and_memoise(store):
    regs = store.register("op-test", points(3), actuator="noop", generator="grid")
    assert [r.origin for r in regs] == ["new"] * 3
    claims = store.claim("op-test", owner_id(), 10, lease_seconds=60)
    assert [c.attempt for c in claims] == [1, 1, 1]
    assert store.claim("op-test", owner_id(), 10, lease_seconds=60) == []  # nothing pending any more
    for c in claims:
        assert (
            store.complete(c, Result.valid(c.experiment_id, c.entity_id, {"train_runtime": 1.0}), max_retries=0)
            == "valid"
        )
    regs = store.register("op-test", points(3), actuator="noop", generator="grid")
    assert [r.origin for r in regs] == ["memoised"] * 3
    # another actuator does not reuse them (a prediction never stands in for a measurement)
    assert [r.origin for r in store.register("op-test", points(3), actuator="predict", generator="grid")] == ["new"] * 3
    # remeasure sends them back to pending and keeps the old results
    regs = store.register("op-test", points(1), actuator="noop", generator="grid", remeasure=True)
    assert regs[0].origin == "new" and regs[0].status == "pending"
    assert len(store.results_of(regs[0].request_id)) == 1


def test_invalid_by_rule_is_recorded_without_running(store):
    regs = store.register(
        "op-test", points(1, reasons=["rule 4: batch_size must be greater than 0"]), actuator="noop", generator="grid"
    )
    assert regs[0].origin == "rules" and regs[0].status == "invalid"
    assert store.claim("op-test", owner_id(), 5, 60) == []
    (row,) = store.rows(operation_id="op-test")
    assert row["properties"] == {"is_valid": 0} and row["reasons"] == ["rule 4: batch_size must be greater than 0"]
    assert row["origin"] == "rules"


def test_failed_is_retried_up_to_max_retries(store):
    store.register("op-test", points(1), actuator="noop", generator="grid")
    statuses = []
    for _ in range(3):
        (c,) = store.claim("op-test", owner_id(), 1, 60)
        statuses.append(store.complete(c, Result.failed(c.experiment_id, c.entity_id, "boom"), max_retries=2))
    assert statuses == ["pending", "pending", "failed"]
    assert store.claim("op-test", owner_id(), 1, 60) == []
    assert store.counts("op-test") == {"failed": 1}
    # a new run gives failed points a fresh retry budget
    (reg,) = store.register("op-test", points(1), actuator="noop", generator="grid")
    assert reg.status == "pending"
    (c,) = store.claim("op-test", owner_id(), 1, 60)
    assert c.attempt == 1
    assert len(store.results_of(c.request_id)) == 3  # every failure is kept as history


def test_claims_are_atomic_across_threads(store):
    store.register("op-test", points(40), actuator="noop", generator="grid")
    won: list[list[int]] = [[] for _ in range(4)]

    def worker(i):
        other = Store(store.url)  # its own engine and connections, like another process
        while True:
            claims = other.claim("op-test", f"{socket.gethostname()}:{os.getpid()}:{i}", 3, 60)
            if not claims:
                break
            won[i] += [c.request_id for c in claims]
        other.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [rid for w in won for rid in w]
    assert len(every) == len(set(every)) == 40


def test_expired_lease_is_requeued_and_late_result_is_kept(store):
    store.register("op-test", points(1), actuator="noop", generator="grid")
    (old,) = store.claim("op-test", "elsewhere:1:1", 1, lease_seconds=0.01)
    time.sleep(0.05)
    assert store.requeue_stale(max_retries=3) == 1
    (new,) = store.claim("op-test", owner_id(), 1, 60)
    assert new.attempt == 2
    # the first explorer comes back late: its result is kept as history, the claim belongs to the new one
    assert store.complete(old, Result.valid(old.experiment_id, old.entity_id, {}), max_retries=3) == "lost"
    assert store.complete(new, Result.valid(new.experiment_id, new.entity_id, {}), max_retries=3) == "valid"
    assert len(store.results_of(new.request_id)) == 2


def test_dead_explorer_on_this_host_is_requeued_at_once(store):
    store.register("op-test", points(2), actuator="noop", generator="grid")
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = f"{socket.gethostname()}:{proc.stdout.strip()}:1"
    store.claim("op-test", dead, 1, lease_seconds=3600)
    store.claim("op-test", owner_id(), 1, lease_seconds=3600)  # alive: left alone
    assert store.requeue_stale(max_retries=3) == 1
    assert store.counts("op-test") == {"pending": 1, "running": 1}


def test_explorer_dying_too_often_fails_the_request(store):
    store.register("op-test", points(1), actuator="noop", generator="grid")
    for _ in range(2):
        store.claim("op-test", "elsewhere:1:1", 1, lease_seconds=0.0)
        store.requeue_stale(max_retries=1, now=time.time() + 1)
    assert store.counts("op-test") == {"failed": 1}
    (row,) = store.rows(operation_id="op-test")
    assert "stopped while measuring" in row["error"]


def test_release_gives_claims_back_uncounted(store):
    store.register("op-test", points(2), actuator="noop", generator="grid")
    claims = store.claim("op-test", owner_id(), 2, 60)
    assert store.release(claims) == 2
    assert [c.attempt for c in store.claim("op-test", owner_id(), 2, 60)] == [1, 1]


def test_record_many_is_idempotent_and_sets_status(store):
    recs = [
        Record(
            EXP,
            e,
            Result.valid(EXP.id, e.id, {"dataset_tokens_per_second": 100.0 + i}, actuator="import"),
            source_key=f"key{i}",
        )
        for i, (_, e, _) in enumerate(points(5))
    ]
    assert store.record_many(recs) == (5, 0)
    assert store.record_many(recs) == (0, 5)
    regs = store.register("op-test", points(5), actuator="measure", generator="grid")
    assert {r.origin for r in regs} == {"memoised"}
    with store.engine.connect() as conn:
        assert conn.execute(select(results.c.dataset_tokens_per_second).order_by(results.c.id)).scalars().all() == [
            100.0,
            101.0,
            102.0,
            103.0,
            104.0,
        ]
        assert set(conn.execute(select(requests.c.status)).scalars()) == {"valid"}


def test_a_killed_writer_leaves_no_half_written_result(tmp_path):
    """kill -9 in the middle of a transaction: the store keeps the state before it."""
    path = tmp_path / "s.db"
    with Store(path) as s:
        s.open_operation("op-test", sampler="grid", actuator="noop", space={}, name=None)
        s.register("op-test", points(1), actuator="noop", generator="grid")
    code = f"""
import os, signal
from tunebench.store import Store, owner_id
from tunebench.store import db
from sqlalchemy import text
s = Store({str(path)!r})
(c,) = s.claim("op-test", owner_id(), 1, 60)
with db.write(s.engine) as conn:
    conn.execute(text("INSERT INTO results (request_id, status, actuator, extra_properties, reasons, meta, created_at) "
                      "VALUES (:r, 'valid', 'x', '{{}}', '[]', '{{}}', 0)"), {{"r": c.request_id}})
    conn.execute(text("UPDATE requests SET status='valid' WHERE id=:r"), {{"r": c.request_id}})
    os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = subprocess.run([sys.executable, "-c", code], env=os.environ.copy())
    assert proc.returncode == -9
    with Store(path) as s:
        assert s.counts("op-test") == {"running": 1}  # the claim committed, the half result did not
        with s.engine.connect() as conn:
            assert conn.execute(text("SELECT COUNT(*) FROM results")).scalar() == 0
        assert s.requeue_stale(max_retries=2) == 1
        assert s.counts("op-test") == {"pending": 1}


def test_metadata_declares_every_table():
    assert {t.name for t in TABLES} == set(metadata.tables)


def test_frozen_schema_matches_the_spec_lists():
    """The results table has one column per measured property of spec/; a change to those lists must
    come with a migration: this fingerprint is of the columns schema version {SCHEMA_VERSION} created."""
    import hashlib

    from tunebench.spec.experiments import ID_ORDER
    from tunebench.spec.measured import REPORT_ORDER
    from tunebench.store.schema import ENTITY_COLUMNS, MEASURED_COLUMNS

    fingerprint = hashlib.sha256(",".join(MEASURED_COLUMNS).encode()).hexdigest()
    assert fingerprint == "44c5b645f1e4f741526820ff4aec34f92dbcc2430a2bf07df020bb7cfb09bb6e", (
        "measured columns changed: write a migration"
    )
    assert len(MEASURED_COLUMNS) == 25 and "is_valid" not in MEASURED_COLUMNS
    assert sorted(REPORT_ORDER) == sorted(MEASURED_COLUMNS)
    assert ENTITY_COLUMNS == (*ID_ORDER, "number_nodes")  # the id's keys, then the placement


# --- PostgreSQL: explorers creating one new store at once; a server that never answers


def _bounded() -> None:
    """preexec_fn: a subprocess of these tests gets bounded memory and CPU time."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    resource.setrlimit(resource.RLIMIT_CPU, (300, 300))


def _env() -> dict[str, str]:
    src = str(SRC)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}


def test_three_explorers_on_a_fresh_postgresql_database(postgres_server, tmp_path):
    """Three explorers start at once on a database without a store: they race to create the schema
    (PostgreSQL fails the loser's CREATE TABLE on pg_type's unique index unless they serialise); every one
    finishes, and every point is measured exactly once."""
    import json

    import yaml
    from explore.test_explorer import make_space

    log = tmp_path / "calls.jsonl"
    space = make_space("sleepy", lengths=tuple(range(64, 64 * 7, 64)), batches=(1, 2), call_log=str(log), sleep_s=0.2)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    for _ in range(2):  # two fresh databases: the race is won differently each time
        url = postgres_server.fresh_database()
        command = [
            sys.executable,
            "-m",
            "tunebench",
            "explore",
            str(tmp_path / "space.yaml"),
            "--store",
            url,
            "--quiet",
            "--allow-actuator-import",
        ]
        explorers = [
            subprocess.Popen(
                command, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_bounded
            )
            for _ in range(3)
        ]
        outs = [p.communicate(timeout=240) for p in explorers]
        assert [p.returncode for p in explorers] == [0, 0, 0], [err[-1500:] for _, err in outs]
        with Store(url) as s:
            assert s.counts(s.operations()[0]["id"]) == {"valid": 12}
    starts = [json.loads(line) for line in log.read_text().splitlines() if '"start"' in line]
    assert len(starts) == 24 and len({(c["entity"], c["pid"]) for c in starts}) == 24  # once per database


def _at_once(work, n: int = 4) -> tuple[list, list[BaseException]]:
    """Runs work(start) in n threads, each calling start() where the others must be reached, so the next
    step happens at the same instant; the results and the exceptions raised."""
    barrier = threading.Barrier(n, timeout=60)  # a thread that fails before start() breaks it for the others
    results: list = []
    errors: list[BaseException] = []

    def run():
        try:
            results.append(work(barrier.wait))
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return results, errors


def test_concurrent_first_opens_of_a_postgresql_store_create_it_once(postgres_server):
    """The same race, made likely: threads open a new store at the same instant, several times."""
    for _ in range(3):
        url = postgres_server.fresh_database()

        def open_it(start):
            start()
            Store(url).close()

        _, errors = _at_once(open_it)
        assert not errors, errors
        with Store(url) as s, s.engine.connect() as conn:
            assert conn.execute(select(schema_version.c.version)).scalars().all() == [SCHEMA_VERSION]


def test_concurrent_opens_of_one_operation_on_postgresql_count_every_run(postgres_server):
    """Explorers starting the same operation at the same instant: each finds it missing (no lock between the
    check and the insert on PostgreSQL); the losers count their run on the winner's row instead of failing."""
    url = postgres_server.fresh_database()
    with Store(url):
        pass  # the schema first: this test is about the operation row, the one above about the schema
    for attempt in range(3):

        def open_it(start, op=f"op-{attempt}"):
            with Store(url) as store:
                start()
                return store.open_operation(op, sampler="grid", actuator="predict", space={}, name=None)

        created, errors = _at_once(open_it)
        assert not errors, errors
        assert sorted(created) == [False, False, False, True]
        with Store(url) as s:
            assert s.operation(f"op-{attempt}")["runs"] == 4


def test_postgresql_sessions_have_timeouts(postgres_server):
    url = postgres_server.fresh_database()
    with Store(url) as s, s.engine.connect() as conn:
        shown = {
            name: conn.exec_driver_sql(f"SHOW {name}").scalar()
            for name in ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")
        }
        assert shown == {
            "statement_timeout": "5min",
            "lock_timeout": "1min",
            "idle_in_transaction_session_timeout": "5min",
        }
    with Store(url + "?options=-c%20statement_timeout%3D7s", readonly=True) as s, s.engine.connect() as conn:
        assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "7s"  # the URL's own settings win
        assert conn.exec_driver_sql("SHOW default_transaction_read_only").scalar() == "on"


@pytest.mark.slow
def test_a_database_server_that_never_answers_is_an_error_not_a_hang(tmp_path):
    """A server that accepts connections and never answers: every command fails within the connect
    timeout, on one line naming the store (its password masked), instead of hanging."""
    from tunebench.store.db import PG_CONNECT_TIMEOUT_S

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept_forever():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])  # ... and never a byte back
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept_forever, daemon=True)
    thread.start()
    url = f"postgresql+psycopg://me:s3cret-pw@127.0.0.1:{listener.getsockname()[1]}/tunebench"
    try:
        for argv in (
            ["show", "--store", url],
            ["import", str(DATA / "ado_docs_example_smollm2_cpu_measurements.csv"), "--store", url],
        ):
            started = time.monotonic()
            proc = subprocess.run(
                [sys.executable, "-m", "tunebench", *argv],
                capture_output=True,
                text=True,
                timeout=PG_CONNECT_TIMEOUT_S + 60,
                env=_env(),
                preexec_fn=_bounded,
            )
            took = time.monotonic() - started
            assert proc.returncode == 2, proc.stderr
            (line,) = proc.stderr.strip().splitlines()
            assert line.startswith("error: --store: cannot open the store postgresql+psycopg://me:***@127.0.0.1:"), line
            assert "timeout" in line and "s3cret-pw" not in line, line
            assert took < PG_CONNECT_TIMEOUT_S + 30, took
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in accepted:
            conn.close()
        listener.close()
    assert accepted  # the commands did reach the silent server


# --- stores opened to read: read-only, and never created in another program's database


def _foreign_sqlite(path: Path) -> bytes:
    import sqlite3

    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE users (name TEXT)")
        conn.execute("INSERT INTO users VALUES ('ada')")
    conn.close()
    return path.read_bytes()


def test_reading_a_foreign_sqlite_database_is_refused_and_leaves_it_untouched(tmp_path):
    before = _foreign_sqlite(tmp_path / "app.db")
    with pytest.raises(SchemaError, match=r"another program's tables \(users\), not a tunebench store"):
        Store(tmp_path / "app.db", readonly=True)
    assert (tmp_path / "app.db").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]  # no -wal, -shm or journal left


def test_an_empty_database_opened_to_read_gets_no_store(tmp_path, any_store_url):
    if any_store_url.startswith("sqlite"):
        (tmp_path / "store.db").touch()
    with pytest.raises(SchemaError, match="holds no tunebench store yet"):
        Store(any_store_url, readonly=True)
    with Store(any_store_url) as s:  # the tables are created only by a store opened to write
        assert s.version == SCHEMA_VERSION


def test_a_store_opened_to_read_cannot_be_written(any_store_url, tmp_path):
    with Store(any_store_url) as s:
        s.open_operation("op-test", sampler="grid", actuator="noop", space={}, name=None)
        s.register("op-test", points(2), actuator="noop", generator="grid")
    with Store(any_store_url, readonly=True) as s:
        assert s.counts("op-test") == {"pending": 2}
        with pytest.raises(Exception, match="read-only|readonly"):
            s.register("op-test", points(3), actuator="noop", generator="grid")
        assert s.counts("op-test") == {"pending": 2}
    if any_store_url.startswith("sqlite"):  # a WAL store read leaves no -wal or -shm file behind
        assert sorted(p.name for p in tmp_path.iterdir()) == ["store.db"]


def test_a_command_that_creates_a_store_may_add_it_to_another_programs_database(tmp_path):
    """explore, run and import create a store where asked, beside the tables already there."""
    from tunebench.commands.main import main

    _foreign_sqlite(tmp_path / "app.db")
    csv = DATA / "ado_docs_example_smollm2_cpu_measurements.csv"
    assert main(["import", str(csv), "--store", str(tmp_path / "app.db")]) == 0
    with Store(tmp_path / "app.db", readonly=True) as s, s.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT name FROM users").scalars().all() == ["ada"]
        assert len(s.rows()) == 4


def test_an_operation_id_of_another_encoding_is_no_operation(tmp_path):
    """An argument's bytes that were not UTF-8 arrive as lone surrogates, which SQLite refuses to bind: the id
    names no operation (show/export --operation then say so in one line) rather than failing in the driver."""
    with Store(tmp_path / "s.db") as s:
        s.open_operation("op-1", sampler="grid", actuator="predict", space={}, name=None)
        assert s.operation("op-\udcff") is None
        assert s.operation("op-1")["id"] == "op-1"
