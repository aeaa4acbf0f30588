"""The sample store: every (experiment, entity) measurement, its state and its results.

State machine of a request (one row per experiment x entity x actuator)::

    pending --claim--> running --complete--> valid | invalid          (final, memoised)
                          |                  failed                   (final for this run)
                          +--failed, attempts <= max_retries--> pending (retried)
                          +--lease expired / explorer dead-----> pending (or failed past max_retries)

Every state change is one transaction (``db.write``), so a killed explorer leaves either the old
state or the new one, never half of a result. Claims are atomic and portable: a conditional
``UPDATE requests SET status='running' ... WHERE id=? AND status='pending'`` whose rowcount says
whether this explorer won the row (no SELECT ... FOR UPDATE). A claim carries a random token and a
lease the explorer renews while it measures; completion presents the token.

Memoisation keys (ado-sfttrainer.md §12.4, pitfall 18): the canonical entity id (values, not
spelling; defaults dropped) + the experiment id including its parameterisation + the actuator name
(a prediction never stands in for a measurement).
"""

from __future__ import annotations

import gc
import getpass
import hashlib
import json
import math
import os
import socket
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psutil
from sqlalchemy import Connection, Table, Text, and_, bindparam, case, func, insert, or_, select, type_coerce, update
from sqlalchemy.exc import IntegrityError

from tunebench.spec.experiments import Entity, Experiment
from tunebench.spec.results import LOG_TAIL_CHARS, Result
from tunebench.store import db
from tunebench.store.migrations import migrate
from tunebench.store.schema import (
    DONE,
    ENTITY_COLUMNS,
    FAILED,
    INVALID,
    MEASURED_COLUMNS,
    PENDING,
    RUNNING,
    entities,
    experiments,
    operation_points,
    operations,
    requests,
    results,
)

CHUNK = 500  # ids per IN (...) list: well under SQLite's 32766 variable limit


def id_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def owner_id() -> str:
    """host:pid:process-start-time of this process: tells a dead explorer from a live one on the same host."""
    start = psutil.Process(os.getpid()).create_time()
    return f"{socket.gethostname()}:{os.getpid()}:{start:.0f}"


def _owner_alive(owner: str) -> bool:
    """Whether the explorer that wrote owner (on this host) still runs."""
    try:
        _host, pid, start = owner.rsplit(":", 2)
        proc = psutil.Process(int(pid))
        return abs(proc.create_time() - float(start)) < 2 and proc.status() != psutil.STATUS_ZOMBIE
    except (ValueError, psutil.Error):
        return False


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


def _number(value: Any) -> float | None:
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


@dataclass
class Outcomes:
    """Store.table(): outcome columns by name (Store._outcomes' names), experiments by pk, row count."""

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


class Store:
    """A sample store at an SQLAlchemy URL (created and migrated on first use)."""

    def __init__(self, url: str | os.PathLike | None = None):
        self.url = db.store_url(url)
        self.engine = db.make_engine(self.url)
        self.version = migrate(self.engine)
        self._experiment_pks: dict[str, int] = {}
        self._entity_pks: dict[str, int] = {}

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------ identities

    def _experiment_pk(self, conn: Connection, experiment: Experiment) -> int:
        key = id_hash(experiment.id)
        pk = self._experiment_pks.get(key)
        if pk is None:
            pk = conn.execute(select(experiments.c.pk).where(experiments.c.id_hash == key)).scalar()
            if pk is None:
                row = {
                    "id": experiment.id,
                    "id_hash": key,
                    "base_id": experiment.base_id,
                    "parameters": clean_json(dict(experiment.parameters)),
                    "created_at": time.time(),
                }
                pk = conn.execute(insert(experiments).values(row)).inserted_primary_key[0]
            self._experiment_pks[key] = pk
        return pk

    def _entity_pk(self, conn: Connection, entity: Entity) -> int:
        key = id_hash(entity.id)
        pk = self._entity_pks.get(key)
        if pk is None:
            pk = conn.execute(select(entities.c.pk).where(entities.c.id_hash == key)).scalar()
            if pk is None:
                pk = conn.execute(insert(entities).values(_entity_row(entity, key))).inserted_primary_key[0]
            self._entity_pks[key] = pk
        return pk

    def _forget_new_keys(self) -> None:
        """After a rolled-back transaction, cached primary keys may not exist: drop the caches."""
        self._experiment_pks.clear()
        self._entity_pks.clear()

    # ------------------------------------------------------------------------------------ operations

    def open_operation(self, operation_id: str, *, sampler: str, actuator: str, space: dict, name: str | None) -> bool:
        """Create the operation if new, else count one more run; True if it was new."""
        now = time.time()
        with db.write(self.engine) as conn:
            exists = conn.execute(select(operations.c.id).where(operations.c.id == operation_id)).scalar()
            if exists:
                conn.execute(
                    update(operations)
                    .where(operations.c.id == operation_id)
                    .values(last_run_at=now, runs=operations.c.runs + 1)
                )
                return False
            conn.execute(
                insert(operations).values(
                    id=operation_id,
                    name=name,
                    sampler=sampler,
                    actuator=actuator,
                    space=clean_json(space),
                    created_by=f"{_user()}@{socket.gethostname()}",
                    created_at=now,
                    last_run_at=now,
                    runs=1,
                )
            )
            return True

    def operation(self, operation_id: str) -> dict[str, Any] | None:
        with db.read(self.engine) as conn:
            row = conn.execute(select(operations).where(operations.c.id == operation_id)).mappings().first()
        return dict(row) if row else None

    def operations(self) -> list[dict[str, Any]]:
        with db.read(self.engine) as conn:
            rows = conn.execute(select(operations).order_by(operations.c.created_at)).mappings().all()
        return [dict(r) for r in rows]

    # ---------------------------------------------------------------------------------- registration

    def register(
        self,
        operation_id: str,
        points: Sequence[tuple[Experiment, Entity, list[str]]],
        *,
        actuator: str,
        generator: str,
        remeasure: bool = False,
    ) -> list[Registered]:
        """Record sampled points (experiment, entity, rule violations) under an operation.

        New points become pending; points with a valid/invalid result are memoised (unless
        remeasure: then pending again); failed points become pending with a fresh retry budget;
        points that break a validity rule are recorded invalid without running (ado-sfttrainer.md
        §5.1). Idempotent: registering the same points again changes nothing but what it must.
        One transaction per batch; a crash between batches leaves whole batches.
        """
        out: list[Registered] = []
        for start in range(0, len(points), 200):
            batch = points[start : start + 200]
            for attempt in range(3):
                try:
                    out += self._register_batch(operation_id, batch, actuator, generator, remeasure)
                    break
                except IntegrityError:
                    # another explorer inserted the same experiment/entity/request meanwhile (databases
                    # without SQLite's BEGIN IMMEDIATE serialisation): the batch is redone on their rows
                    self._forget_new_keys()
                    if attempt == 2:
                        raise
                except Exception:
                    self._forget_new_keys()
                    raise
        return out

    def _register_batch(
        self,
        operation_id: str,
        batch: Sequence[tuple[Experiment, Entity, list[str]]],
        actuator: str,
        generator: str,
        remeasure: bool,
    ) -> list[Registered]:
        out = []
        with db.write(self.engine) as conn:
            seq = conn.execute(
                select(func.coalesce(func.max(operation_points.c.seq), -1)).where(
                    operation_points.c.operation_id == operation_id
                )
            ).scalar()
            for experiment, entity, reasons in batch:
                reg = self._register_one(
                    conn, experiment, entity, reasons, actuator, generator, remeasure, operation_id
                )
                linked = conn.execute(
                    select(operation_points.c.seq).where(
                        operation_points.c.operation_id == operation_id,
                        operation_points.c.request_id == reg.request_id,
                    )
                ).scalar()
                if linked is None:
                    seq += 1
                    conn.execute(
                        insert(operation_points).values(
                            operation_id=operation_id, request_id=reg.request_id, seq=seq, origin=reg.origin
                        )
                    )
                out.append(reg)
        return out

    def _register_one(
        self,
        conn: Connection,
        experiment: Experiment,
        entity: Entity,
        reasons: list[str],
        actuator: str,
        generator: str,
        remeasure: bool,
        operation_id: str,
    ) -> Registered:
        exp_pk = self._experiment_pk(conn, experiment)
        ent_pk = self._entity_pk(conn, entity)
        now = time.time()
        row = conn.execute(
            select(requests.c.id, requests.c.status).where(
                requests.c.experiment_pk == exp_pk, requests.c.entity_pk == ent_pk, requests.c.actuator == actuator
            )
        ).first()
        if row is None:
            values = dict(experiment_pk=exp_pk, entity_pk=ent_pk, actuator=actuator, status=PENDING, attempts=0,
                          operation_id=operation_id, created_at=now)  # fmt: skip
            request_id = conn.execute(insert(requests).values(values)).inserted_primary_key[0]
            status = PENDING
        else:
            request_id, status = row
        if reasons:  # invalid by rule: recorded, never run
            if status in DONE:
                return Registered(request_id, "memoised", status)
            if status == RUNNING:  # someone measures it anyway; leave them be
                return Registered(request_id, "new", status)
            result = Result.invalid(experiment.id, entity.id, reasons, actuator="rules")
            result_id = _insert_result(conn, request_id, result, generator=generator)
            conn.execute(
                update(requests)
                .where(requests.c.id == request_id)
                .values(status=INVALID, result_id=result_id, finished_at=now, operation_id=operation_id)
            )
            return Registered(request_id, "rules", INVALID)
        if status in DONE and not remeasure:
            return Registered(request_id, "memoised", status)
        if status in DONE or status == FAILED:
            conn.execute(
                update(requests)
                .where(requests.c.id == request_id, requests.c.status == status)
                .values(status=PENDING, attempts=0, operation_id=operation_id)
            )
            status = PENDING
        return Registered(request_id, "new", status)

    # ------------------------------------------------------------------------------------ claiming

    def claim(
        self,
        operation_id: str,
        owner: str,
        limit: int,
        lease_seconds: float,
        request_ids: Iterable[int] | None = None,
    ) -> list[Claim]:
        """Atomically take up to limit pending requests of the operation (or of request_ids) to run."""
        if limit <= 0:
            return []
        now = time.time()
        host = owner.rsplit(":", 2)[0]
        with db.write(self.engine) as conn:
            query = select(requests.c.id).where(requests.c.status == PENDING)
            if request_ids is not None:
                ids = list(request_ids)
                if not ids:
                    return []
                query = query.where(requests.c.id.in_(ids)).order_by(requests.c.id)
            else:
                query = (
                    query.join(operation_points, operation_points.c.request_id == requests.c.id)
                    .where(operation_points.c.operation_id == operation_id)
                    .order_by(operation_points.c.seq)
                )
            candidates = conn.execute(query.limit(limit * 4)).scalars().all()
            won: dict[int, str] = {}
            for request_id in candidates:
                token = uuid.uuid4().hex
                changed = conn.execute(
                    update(requests)
                    .where(requests.c.id == request_id, requests.c.status == PENDING)
                    .values(
                        status=RUNNING,
                        attempts=requests.c.attempts + 1,
                        owner=owner,
                        host=host,
                        claim_token=token,
                        claimed_at=now,
                        lease_expires_at=now + lease_seconds,
                        operation_id=operation_id,
                    )
                ).rowcount
                if changed == 1:
                    won[request_id] = token
                    if len(won) == limit:
                        break
            if not won:
                return []
            rows = conn.execute(
                select(
                    requests.c.id, requests.c.attempts, requests.c.actuator, experiments.c.id.label("experiment_id"),
                    experiments.c.base_id, experiments.c.parameters, entities.c.id.label("entity_id"),
                    entities.c.properties,
                )
                .join(experiments, experiments.c.pk == requests.c.experiment_pk)
                .join(entities, entities.c.pk == requests.c.entity_pk)
                .where(requests.c.id.in_(list(won)))
            ).all()  # fmt: skip
        by_id = {r.id: r for r in rows}
        return [
            Claim(
                request_id=rid,
                token=token,
                attempt=by_id[rid].attempts,
                experiment_id=by_id[rid].experiment_id,
                base_id=by_id[rid].base_id,
                parameters=dict(by_id[rid].parameters),
                entity_id=by_id[rid].entity_id,
                entity_values=dict(by_id[rid].properties),
                actuator=by_id[rid].actuator,
                operation_id=operation_id,
            )
            for rid, token in won.items()
        ]

    def renew(self, claims: Iterable[Claim], lease_seconds: float) -> int:
        """Extend the leases of claims this explorer still holds; returns how many it still holds."""
        return self._update_held(claims, lease_expires_at=time.time() + lease_seconds)

    def _update_held(self, claims: Iterable[Claim], **values: Any) -> int:
        """Set values on the requests of claims still held (running under their token); one transaction."""
        tokens = [c.token for c in claims]
        if not tokens:
            return 0
        with db.write(self.engine) as conn:
            return conn.execute(
                update(requests)
                .where(requests.c.claim_token.in_(tokens), requests.c.status == RUNNING)
                .values(**values)
            ).rowcount

    def complete(self, claim: Claim, result: Result, *, max_retries: int, generator: str | None = None) -> str:
        """Store a claim's result in one transaction; returns the request's new status.

        A failed result sends the request back to pending while its attempts <= max_retries. If the
        claim was lost (lease expired and someone else claimed it) the result is still kept as
        history, the request is left to its new holder, and "lost" is returned.
        """
        now = time.time()
        with db.write(self.engine) as conn:
            result_id = _insert_result(conn, claim.request_id, result, generator=generator)
            status = result.status
            if status == FAILED and claim.attempt <= max_retries:
                status = PENDING
            changed = conn.execute(
                update(requests)
                .where(
                    requests.c.id == claim.request_id,
                    or_(requests.c.claim_token == claim.token, requests.c.status == PENDING),
                )
                .values(
                    status=status, result_id=result_id, finished_at=now, owner=None, claim_token=None,
                    lease_expires_at=None,
                )
            ).rowcount  # fmt: skip
        return status if changed == 1 else "lost"

    def release(self, claims: Iterable[Claim]) -> int:
        """Give claims back unmeasured (an interrupted explorer): pending again, the attempt not counted."""
        return self._update_held(
            claims, status=PENDING, attempts=requests.c.attempts - 1, owner=None, claim_token=None,
            lease_expires_at=None,
        )  # fmt: skip

    def requeue_stale(self, *, max_retries: int, now: float | None = None) -> int:
        """Re-queue running requests whose explorer is gone: lease expired, or (same host) process dead.

        A request whose attempts already exceed max_retries is marked failed instead (its explorer
        died measuring it max_retries + 1 times, e.g. killed by the OOM killer).
        """
        now = time.time() if now is None else now
        host = socket.gethostname()
        with db.read(self.engine) as conn:
            rows = conn.execute(
                select(requests.c.id, requests.c.claim_token, requests.c.owner, requests.c.attempts,
                       requests.c.lease_expires_at, requests.c.host)
                .where(requests.c.status == RUNNING)
                .where(or_(requests.c.lease_expires_at < now, requests.c.host == host))
            ).all()  # fmt: skip
        stale = [
            r for r in rows
            if (r.lease_expires_at is not None and r.lease_expires_at < now) or not _owner_alive(r.owner or "")
        ]  # fmt: skip
        if not stale:
            return 0
        requeued = 0
        with db.write(self.engine) as conn:
            for r in stale:
                if r.attempts > max_retries:
                    why = f"the explorer {r.owner} stopped while measuring (attempt {r.attempts})"
                    result = Result.failed("", "", error=why, actuator="store")
                    result_id = _insert_result(conn, r.id, result)
                    values: dict[str, Any] = {"status": FAILED, "result_id": result_id, "finished_at": now}
                else:
                    values = {"status": PENDING}
                changed = conn.execute(
                    update(requests)
                    .where(requests.c.id == r.id, requests.c.claim_token == r.claim_token, requests.c.status == RUNNING)
                    .values(owner=None, claim_token=None, lease_expires_at=None, **values)
                ).rowcount
                requeued += changed
        return requeued

    # ------------------------------------------------------------------------------------- queries

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

    def states(self, request_ids: Iterable[int]) -> dict[int, tuple[str, dict[str, Any]]]:
        """request id -> (status, properties of its deciding result)."""
        ids = list(request_ids)
        out: dict[int, tuple[str, dict[str, Any]]] = {}
        with db.read(self.engine) as conn:
            for i in range(0, len(ids), CHUNK):
                rows = conn.execute(
                    select(requests.c.id, requests.c.status, *_PROPERTY_COLUMNS)
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

        Each row: request_id, status, actuator, experiment_id, base_id, parameters, entity_id,
        entity (values), properties, reasons, error, generator, source_identifier, source_experiment_id
        (+ origin: new | memoised | rules, with operation_id). Decoded JSON values may be shared
        between rows: treat them as read-only.
        """
        with no_gc():  # 100,000s of small acyclic objects: pausing the cyclic GC makes this 2-3x faster
            keys, raw, exps = self._outcomes(operation_id, request_ids, actuator, statuses)
            return _decode_rows(raw, keys, exps)

    def table(
        self,
        *,
        operation_id: str | None = None,
        request_ids: Sequence[int] | None = None,
        actuator: str | None = None,
        statuses: Sequence[str] | None = None,
    ) -> Outcomes:
        """The outcomes of rows(), column by column and undecoded: what reports over 100,000s of rows use."""
        with no_gc():
            keys, raw, exps = self._outcomes(operation_id, request_ids, actuator, statuses)
            columns = list(zip(*raw)) if raw else [() for _ in keys]
            count = len(raw)
            del raw  # free the row tuples before the collector is back on (it would walk all of them)
            return Outcomes(dict(zip(keys, columns)), exps, count)

    def _outcomes(
        self,
        operation_id: str | None,
        request_ids: Sequence[int] | None,
        actuator: str | None,
        statuses: Sequence[str] | None,
    ) -> tuple[list[str], list[Any], dict[int, dict[str, Any]]]:
        """(column names, row tuples, experiments by pk) of the outcomes asked for.

        Speed: measured properties and the common entity values are real columns, so most rows need
        no JSON decoding at all; experiments are read once each, not once per row.
        """
        query = (
            select(
                requests.c.id.label("request_id"), requests.c.status, requests.c.actuator, requests.c.experiment_pk,
                entities.c.id.label("entity_id"), entities.c.only_columns,
                # the JSON of the values only where the real columns do not hold them all
                case((entities.c.only_columns == 1, None), else_=type_coerce(entities.c.properties, Text))
                .label("entity"),
                type_coerce(results.c.reasons, Text).label("reasons"), results.c.error, results.c.generator,
                results.c.source_identifier, results.c.source_experiment_id,
                *(entities.c[name] for name in ENTITY_COLUMNS), *_PROPERTY_COLUMNS,
            )
            .join(entities, entities.c.pk == requests.c.entity_pk)
            .join(results, results.c.id == requests.c.result_id)
        )  # fmt: skip
        if operation_id is not None:
            query = (
                query.add_columns(operation_points.c.origin)
                .join(
                    operation_points,
                    and_(
                        operation_points.c.request_id == requests.c.id, operation_points.c.operation_id == operation_id
                    ),
                )
                .order_by(operation_points.c.seq)
            )
        else:
            query = query.order_by(requests.c.id)
        if actuator is not None:
            query = query.where(requests.c.actuator == actuator)
        if statuses is not None:
            query = query.where(requests.c.status.in_(list(statuses)))
        raw: list[Any] = []
        keys: list[str] = []
        with db.read(self.engine) as conn:
            if request_ids is None:
                result = conn.execute(query)
                keys, raw = list(result.keys()), result.all()
            else:
                ids = list(request_ids)
                for i in range(0, len(ids), CHUNK):
                    result = conn.execute(query.where(requests.c.id.in_(ids[i : i + CHUNK])))
                    keys = list(result.keys())
                    raw += result.all()
                order = {rid: n for n, rid in enumerate(ids)}
                raw.sort(key=lambda r: order[r[0]])
            if not keys:
                keys = [c.name for c in query.selected_columns]
            exps = {
                pk: {"experiment_id": id_, "base_id": base, "parameters": _json(params)}
                for pk, id_, base, params in conn.execute(
                    select(
                        experiments.c.pk, experiments.c.id, experiments.c.base_id,
                        type_coerce(experiments.c.parameters, Text),
                    )
                )
            }  # fmt: skip
        return keys, raw, exps

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
                experiment_id=r["experiment_id"], entity_id=r["entity_id"], status=r["status"],
                properties=properties_of(r["is_valid"], [r[n] for n in MEASURED_COLUMNS], r["extra_properties"]),
                reasons=list(r["reasons"]), metadata=dict(r["meta"]),
                error=r["error"], log_tail=r["log_tail"], actuator=r["actuator"],
            )
            for r in rows
        ]  # fmt: skip

    # ------------------------------------------------------------------------------- bulk records

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
                # requests
                want = dict.fromkeys(  # ordered: requests are created in the file's order
                    (exp_pks[id_hash(r.experiment.id)], ent_pks[id_hash(r.entity.id)], r.actuator) for r in records
                )
                req_ids = self._existing_requests(conn, want)
                missing = [k for k in want if k not in req_ids]
                if missing:
                    conn.execute(
                        insert(requests),
                        [dict(experiment_pk=e, entity_pk=n, actuator=a, status=PENDING, attempts=0, created_at=now)
                         for e, n, a in missing],
                    )  # fmt: skip
                    req_ids.update(self._existing_requests(conn, dict.fromkeys(missing)))
                # results, skipping source keys already stored
                keys = [r.source_key for r in records if r.source_key]
                seen = set()
                for i in range(0, len(keys), CHUNK):
                    seen.update(
                        conn.execute(select(results.c.source_key).where(results.c.source_key.in_(keys[i : i + CHUNK])))
                        .scalars()
                        .all()
                    )
                rows = []
                for r in records:
                    if r.source_key and (r.source_key in seen):
                        continue
                    if r.source_key:
                        seen.add(r.source_key)
                    rid = req_ids[(exp_pks[id_hash(r.experiment.id)], ent_pks[id_hash(r.entity.id)], r.actuator)]
                    rows.append(_result_row(rid, r.result, r.generator, r.source_key, r.source_identifier,
                                            r.source_experiment_id, now))  # fmt: skip
                if not rows:
                    return 0, len(records)
                conn.execute(insert(results), rows)
                # the latest result of each request decides its status
                latest = dict(self._latest_results(conn, sorted({row["request_id"] for row in rows})))
                status_of = dict(self._result_status(conn, list(latest.values())))
                conn.execute(
                    update(requests)
                    .where(requests.c.id == bindparam("rid"), requests.c.status != RUNNING)
                    .values(status=bindparam("st"), result_id=bindparam("res"), finished_at=now),
                    [{"rid": rid, "st": status_of[res], "res": res} for rid, res in latest.items()],
                )
        except Exception:
            self._forget_new_keys()
            raise
        return len(rows), len(records) - len(rows)

    def _latest_results(self, conn: Connection, request_ids: list[int]) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for i in range(0, len(request_ids), CHUNK):
            out += conn.execute(
                select(results.c.request_id, func.max(results.c.id))
                .where(results.c.request_id.in_(request_ids[i : i + CHUNK]))
                .group_by(results.c.request_id)
            ).all()
        return out

    def _result_status(self, conn: Connection, result_ids: list[int]) -> list[tuple[int, str]]:
        out: list[tuple[int, str]] = []
        for i in range(0, len(result_ids), CHUNK):
            out += conn.execute(
                select(results.c.id, results.c.status).where(results.c.id.in_(result_ids[i : i + CHUNK]))
            ).all()
        return out

    def _bulk_pks(self, conn: Connection, table: Table, objects: dict[str, Any]) -> dict[str, int]:
        """hash -> pk for experiments or entities, inserting the missing ones."""
        hashes = list(objects)
        found: dict[str, int] = {}
        for i in range(0, len(hashes), CHUNK):
            found.update(
                conn.execute(
                    select(table.c.id_hash, table.c.pk).where(table.c.id_hash.in_(hashes[i : i + CHUNK]))
                ).all()
            )
        missing = [h for h in hashes if h not in found]
        if missing:
            now = time.time()
            if table is experiments:
                rows = [
                    {"id": objects[h].id, "id_hash": h, "base_id": objects[h].base_id,
                     "parameters": clean_json(dict(objects[h].parameters)), "created_at": now}
                    for h in missing
                ]  # fmt: skip
            else:
                rows = [_entity_row(objects[h], h) for h in missing]
            conn.execute(insert(table), rows)
            for i in range(0, len(missing), CHUNK):
                found.update(
                    conn.execute(
                        select(table.c.id_hash, table.c.pk).where(table.c.id_hash.in_(missing[i : i + CHUNK]))
                    ).all()
                )
        return found

    def _existing_requests(
        self, conn: Connection, want: dict[tuple[int, int, str], None]
    ) -> dict[tuple[int, int, str], int]:
        entity_pks = sorted({n for _, n, _ in want})
        out: dict[tuple[int, int, str], int] = {}
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


def _decode_rows(raw: list[Any], keys: list[str], experiments_by_pk: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Store.rows' dicts from its query's tuples (see there)."""
    memo: dict[str, Any] = {}

    def load(text: Any) -> Any:
        if not isinstance(text, str):  # drivers that decode JSON themselves (psycopg)
            return text
        found = memo.get(text)
        if found is None:
            found = memo[text] = json.loads(text)
        return found

    n_entity, n_props = len(ENTITY_COLUMNS), len(_PROPERTY_COLUMNS)
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


# is_valid, every measured column, extra_properties (as text): what properties_of() takes
_PROPERTY_COLUMNS = (
    results.c.is_valid,
    *(results.c[name] for name in MEASURED_COLUMNS),
    type_coerce(results.c.extra_properties, Text).label("extra_properties"),
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


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name (containers)
        return "unknown"


def _entity_row(entity: Entity, key: str) -> dict[str, Any]:
    row: dict[str, Any] = {"id": entity.id, "id_hash": key, "properties": clean_json(dict(entity.values)),
                           "created_at": time.time()}  # fmt: skip
    for name in ENTITY_COLUMNS:
        value = entity.values.get(name)
        row[name] = value if isinstance(value, (int, str)) and not isinstance(value, bool) else None
    row["only_columns"] = int(all(k in ENTITY_COLUMNS and row[k] == v for k, v in entity.values.items()))
    return row


def _result_row(
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
        number = _number(props.get(name))
        row[name] = number
        if number is not None:
            del props[name]
    row["extra_properties"] = props  # whatever has no column (a non-numeric value included)
    return row


def _json(value: Any) -> Any:
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


def _insert_result(conn: Connection, request_id: int, result: Result, *, generator: str | None = None) -> int:
    return conn.execute(insert(results).values(_result_row(request_id, result, generator))).inserted_primary_key[0]
