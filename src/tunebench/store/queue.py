"""The store's queue: operations, registration of sampled points, claims with leases, completion.

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
"""

from __future__ import annotations

import dataclasses
import getpass
import os
import socket
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import psutil
from sqlalchemy import Connection, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from tunebench.spec.experiments import Entity, Experiment
from tunebench.spec.results import Result
from tunebench.store import db
from tunebench.store.base import StoreBase
from tunebench.store.rows import Claim, Registered, clean_json, insert_result
from tunebench.store.schema import (
    DONE,
    FAILED,
    INVALID,
    PENDING,
    RUNNING,
    entities,
    experiments,
    operation_points,
    operations,
    requests,
)


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


class Queue(StoreBase):
    """Operations, registration, claims, completion and re-queueing of a store (see the module)."""

    # ------------------------------------------------------------------------------------ operations

    def open_operation(self, operation_id: str, *, sampler: str, actuator: str, space: dict, name: str | None) -> bool:
        """Create the operation if new, else count one more run; True if it was new.

        Explorers that start the same operation at once on PostgreSQL (READ COMMITTED: no lock between the
        check and the insert, unlike SQLite's BEGIN IMMEDIATE) may both find it missing; the loser's insert
        violates the primary key, and its transaction is redone, which then counts its run on the winner's row.
        """
        try:
            return self._open_operation(operation_id, sampler, actuator, space, name)
        except IntegrityError:
            return self._open_operation(operation_id, sampler, actuator, space, name)

    def _open_operation(self, operation_id: str, sampler: str, actuator: str, space: dict, name: str | None) -> bool:
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
        try:
            operation_id.encode("utf-8")
        except UnicodeEncodeError:  # bytes of another encoding (lone surrogates): no id here; databases refuse them
            return None
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
            values = dict(
                experiment_pk=exp_pk,
                entity_pk=ent_pk,
                actuator=actuator,
                status=PENDING,
                attempts=0,
                operation_id=operation_id,
                created_at=now,
            )
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
            result_id = insert_result(conn, request_id, result, generator=generator)
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
        with db.write(self.engine) as conn:
            candidates = conn.execute(query.limit(limit * 4)).scalars().all()
            won = _take(conn, candidates, limit, operation_id, owner, lease_seconds)
            return _claims(conn, won, operation_id) if won else []

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
            recorded = recorded_by(result, claim.operation_id)
            result_id = insert_result(conn, claim.request_id, recorded, generator=generator)
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
                    status=status,
                    result_id=result_id,
                    finished_at=now,
                    owner=None,
                    claim_token=None,
                    lease_expires_at=None,
                )
            ).rowcount
        return status if changed == 1 else "lost"

    def release(self, claims: Iterable[Claim]) -> int:
        """Give claims back unmeasured (an interrupted explorer): pending again, the attempt not counted."""
        return self._update_held(
            claims,
            status=PENDING,
            attempts=requests.c.attempts - 1,
            owner=None,
            claim_token=None,
            lease_expires_at=None,
        )

    def requeue_stale(self, *, max_retries: int, now: float | None = None) -> int:
        """Re-queue running requests whose explorer is gone: lease expired, or (same host) process dead.

        A request whose attempts already exceed max_retries is marked failed instead (its explorer
        died measuring it max_retries + 1 times, e.g. killed by the OOM killer).
        """
        now = time.time() if now is None else now
        host = socket.gethostname()
        with db.read(self.engine) as conn:
            rows = conn.execute(
                select(
                    requests.c.id,
                    requests.c.claim_token,
                    requests.c.owner,
                    requests.c.attempts,
                    requests.c.lease_expires_at,
                    requests.c.host,
                    requests.c.operation_id,
                )
                .where(requests.c.status == RUNNING)
                .where(or_(requests.c.lease_expires_at < now, requests.c.host == host))
            ).all()
        stale = [
            r
            for r in rows
            if (r.lease_expires_at is not None and r.lease_expires_at < now) or not _owner_alive(r.owner or "")
        ]
        if not stale:
            return 0
        requeued = 0
        with db.write(self.engine) as conn:
            for r in stale:
                if r.attempts > max_retries:
                    why = f"the explorer {r.owner} stopped while measuring (attempt {r.attempts})"
                    result = Result.failed("", "", error=why, actuator="store")
                    result_id = insert_result(conn, r.id, recorded_by(result, r.operation_id))
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


def recorded_by(result: Result, operation_id: str | None) -> Result:
    """The result with the operation that records it in ``metadata["execution"]["operation_id"]``: a request
    keeps only the operation that last claimed it, while a result belongs to the one that measured it for
    good (the experiment trackers file it there: tunebench.store.stored)."""
    if not operation_id:
        return result
    meta = dict(result.metadata)
    meta["execution"] = {**(meta.get("execution") or {}), "operation_id": operation_id}
    return dataclasses.replace(result, metadata=meta)


def _take(
    conn: Connection, candidates: Sequence[int], limit: int, operation_id: str, owner: str, lease_seconds: float
) -> dict[int, str]:
    """Claim up to limit of the candidate requests still pending: request id -> claim token."""
    now = time.time()
    host = owner.rsplit(":", 2)[0]
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
    return won


def _claims(conn: Connection, won: dict[int, str], operation_id: str) -> list[Claim]:
    """The Claims of the requests won (request id -> token), with their experiments and entities."""
    rows = conn.execute(
        select(
            requests.c.id,
            requests.c.attempts,
            requests.c.actuator,
            experiments.c.id.label("experiment_id"),
            experiments.c.base_id,
            experiments.c.parameters,
            entities.c.id.label("entity_id"),
            entities.c.properties,
        )
        .join(experiments, experiments.c.pk == requests.c.experiment_pk)
        .join(entities, entities.c.pk == requests.c.entity_pk)
        .where(requests.c.id.in_(list(won)))
    ).all()
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


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name (containers)
        return "unknown"
