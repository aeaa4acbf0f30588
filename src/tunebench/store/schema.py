"""The sample store's tables (SQLAlchemy Core), as of ``migrations.SCHEMA_VERSION``.

Modelled on ado's SQLSampleStore (ado-sfttrainer.md §12.2: entities, measurement requests,
measurement results, request-result links) with what tunebench adds: one *request* row per
(experiment, entity, actuator) that carries the measurement's state (pending, running, valid,
invalid, failed), its attempts and its lease; append-only *results*; *operations* and the points
each one covers.

Portability (SQLite, PostgreSQL, MySQL): integer surrogate keys; long identifiers are stored as
text and made unique through a SHA-256 hash column (MySQL cannot index a 2 kB VARCHAR);
timestamps are Double epoch seconds (UTC; MySQL FLOAT would keep only ~7 digits); JSON columns use
SQLAlchemy's portable JSON type. The constitutive properties every entity has and every measured
property of the SFTTrainer spec are real columns, queryable without JSON functions (and read without JSON
decoding: ``tunebench show`` over 100,000 results stays well under 2 s). A measurement's time series
(the samples its properties reduce) are one compressed blob per result in their own table, ``series``,
which no listing reads or joins (tunebench.store.series).
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Column,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects import mysql

from tunebench.spec.measured import BENCHMARK_MEASURED, STABILITY_MEASURED

metadata = MetaData()

# Request states. valid/invalid are final and memoised; failed is final until the next run retries it.
PENDING, RUNNING, VALID, INVALID, FAILED = "pending", "running", "valid", "invalid", "failed"
STATES = (PENDING, RUNNING, VALID, INVALID, FAILED)
DONE = (VALID, INVALID)  # memoised outcomes (ado-sfttrainer.md §12.4: invalid results count as results)

# Entity properties kept as real columns of `entities` (the SFTTrainer spec required properties + placement):
# the canonical value, NULL where the canonical entity leaves it at the experiment's default.
ENTITY_COLUMNS = ("model_name", "number_gpus", "model_max_length", "batch_size", "gpu_model", "number_nodes")
# Measured properties (spec/measured.py: the benchmark and stability experiments'), one real column
# each in `results`; anything else an actuator measures goes to `results.extra_properties` (JSON). A
# change to these lists changes the table: tests/store/test_store.py holds their fingerprint, so it fails
# until a migration (store/migrations.py) is written with the new fingerprint.
MEASURED_COLUMNS = tuple(p for p in (*BENCHMARK_MEASURED, *STABILITY_MEASURED) if p != "is_valid")

schema_version = Table(
    "schema_version",
    metadata,
    Column("version", Integer, primary_key=True),
    Column("description", String(200), nullable=False),
    Column("applied_at", Double, nullable=False),
)

experiments = Table(
    "experiments",
    metadata,
    Column("pk", Integer, primary_key=True, autoincrement=True),
    Column("id", String(1024), nullable=False),  # e.g. finetune_lora_benchmark-v1.0.0-max_steps.2
    Column("id_hash", String(64), nullable=False, unique=True),  # sha256(id)
    Column("base_id", String(200), nullable=False, index=True),
    Column("parameters", JSON, nullable=False),  # the parameterisation (non-default optional values)
    Column("created_at", Double, nullable=False),
)

entities = Table(
    "entities",
    metadata,
    Column("pk", Integer, primary_key=True, autoincrement=True),
    Column("id", String(2048), nullable=False),  # canonical entity id (tunebench.spec.experiments.Entity.id)
    Column("id_hash", String(64), nullable=False, unique=True),
    Column("properties", JSON, nullable=False),  # canonical constitutive values
    Column("model_name", String(300), index=True),
    Column("number_gpus", Integer),
    Column("model_max_length", Integer),
    Column("batch_size", Integer),
    Column("gpu_model", String(100)),
    Column("number_nodes", Integer),
    Column("only_columns", Integer, nullable=False),  # 1: every value is in the columns above (no JSON needed)
    Column("created_at", Double, nullable=False),
)

operations = Table(
    "operations",
    metadata,
    Column("id", String(64), primary_key=True),  # op-<sha256 of the canonical space>[:12]
    Column("name", String(200)),
    Column("sampler", String(32), nullable=False),  # grid | random | optimize | import
    Column("actuator", String(300), nullable=False),
    Column("space", JSON, nullable=False),  # the validated space file
    Column("created_by", String(300), nullable=False),  # user@host
    Column("created_at", Double, nullable=False),
    Column("last_run_at", Double),
    Column("runs", Integer, nullable=False, default=0),
)

requests = Table(
    "requests",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("experiment_pk", Integer, ForeignKey("experiments.pk"), nullable=False),
    Column("entity_pk", Integer, ForeignKey("entities.pk"), nullable=False),
    Column("actuator", String(300), nullable=False),  # measure | predict | noop | module:function
    Column("status", String(16), nullable=False),  # STATES
    Column("attempts", Integer, nullable=False, default=0),  # claims since the last reset
    Column("operation_id", String(64)),  # the operation that last claimed or recorded it
    Column("owner", String(300)),  # host:pid:process-start of the explorer holding the claim
    Column("host", String(200)),  # host of the last claim (kept after completion)
    Column("claim_token", String(64)),  # random per claim; completion must present it
    Column("created_at", Double, nullable=False),
    Column("claimed_at", Double),
    Column("finished_at", Double),
    Column("lease_expires_at", Double),
    Column("result_id", Integer),  # the latest result that decided the status (no FK: results point here)
    UniqueConstraint("experiment_pk", "entity_pk", "actuator", name="uq_requests_point"),
    Index("ix_requests_status_lease", "status", "lease_expires_at"),
)

results = Table(
    "results",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("request_id", Integer, ForeignKey("requests.id"), nullable=False, index=True),
    Column("status", String(16), nullable=False),  # valid | invalid | failed
    Column("actuator", String(300), nullable=False),  # Result.actuator: measure | predict | import | rules | ...
    Column("is_valid", Integer),  # 1 valid, 0 invalid, NULL failed
    *(Column(name, Double) for name in MEASURED_COLUMNS),
    Column("extra_properties", JSON, nullable=False),  # measured properties without a column of their own
    Column("reasons", JSON, nullable=False),
    Column("meta", JSON, nullable=False),  # Result.metadata (+ "execution": executor, host, attempt, ...)
    Column("error", Text),
    Column("log_tail", Text),
    Column("generator", String(64)),  # how the point was chosen: grid | random | optimize | the import's generatorid
    Column("source_key", String(64), unique=True),  # sha256 of an imported CSV row: re-import is a no-op
    Column("source_identifier", String(2048)),  # an imported row's own entity id (exported back verbatim)
    Column("source_experiment_id", String(1024)),  # an imported row's own experiment id
    Column("created_at", Double, nullable=False),
)

series = Table(
    "series",
    metadata,
    Column("result_id", Integer, ForeignKey("results.id"), primary_key=True),
    Column("format", String(64), nullable=False),  # tunebench.store.series.ENCODING: how data is encoded
    Column("points", Integer, nullable=False),  # values in all its series (what `show --series` would list)
    # zlib-compressed JSON (SQLite BLOB, PostgreSQL BYTEA; MySQL's BLOB stops at 64 kB: LONGBLOB)
    Column("data", LargeBinary().with_variant(mysql.LONGBLOB(), "mysql"), nullable=False),
)

operation_points = Table(
    "operation_points",
    metadata,
    Column("operation_id", String(64), ForeignKey("operations.id"), primary_key=True),
    Column("request_id", Integer, ForeignKey("requests.id"), primary_key=True),
    Column("seq", Integer, nullable=False),  # order in which the operation sampled the point
    Column("origin", String(16), nullable=False),  # new | memoised | rules (invalid by rule, not run)
    Index("ix_operation_points_seq", "operation_id", "seq"),
    # the operations that sampled a request (store.stored files a result under the latest): no scan per result
    Index("ix_operation_points_request", "request_id"),
)

TABLES = (schema_version, experiments, entities, operations, requests, results, series, operation_points)
