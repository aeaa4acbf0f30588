"""The explorer loop: sample points, claim them, hand them to an executor, store each result.

    space = load_space("space.yaml")
    with Store() as store:
        summary = explore(space, store, LocalExecutor(max_parallel=2), Settings(max_parallel=2))

One pass:

1. open (or resume) the operation, re-queue requests whose explorer died (expired lease, or a dead
   process on this host);
2. grid/random: register every point (memoised, invalid by rule, or pending); optimize: points are
   proposed a few at a time (tunebench.explore.optimize);
3. loop: claim pending requests while fewer than max_parallel are in flight, submit them, store each
   result as it arrives (failed ones return to pending while attempts <= max_retries), renew the
   leases of the claims in flight and re-queue claims whose explorer died (lease expired, or a dead
   process on this host), until nothing of the operation is pending or running anywhere: a point
   another explorer holds is waited for, and measured here if that explorer dies.

Every store write is its own transaction, so the loop can be killed anywhere: re-running the same
space resumes (done points are memoised, claims of the dead explorer are re-queued). Ctrl-C gives the
in-flight claims back before stopping.

Trackers (the space's ``track:``, tunebench.track) are checked before anything is stored, and each result
is sent to them right after the store keeps it, read back from the store: a tracker that fails is a warning
kept with the result, never a lost measurement.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tunebench.actuators import check_options
from tunebench.executors.task import Finished, Task, make_task
from tunebench.explore.search import POLL_S, FixedPoints, Search
from tunebench.explore.space import Space
from tunebench.logs import get as get_logger
from tunebench.paths import home
from tunebench.spec.experiments import Experiment, get_experiment, make_entity
from tunebench.spec.results import Result
from tunebench.store import FAILED, INVALID, PENDING, RUNNING, VALID, Claim, Store, owner_id

if TYPE_CHECKING:
    from tunebench.track import Trackers
    from tunebench.track.send import Sent
REQUEUE_S = 1.0  # how often the loop looks for claims of dead explorers (at least twice per lease)


class Executor(Protocol):
    name: str

    @property
    def in_flight(self) -> int: ...

    def submit(self, task: Task) -> None: ...

    def poll(self, timeout: float = 0.0) -> list[Finished]: ...

    def close(self) -> None: ...


@dataclass
class Settings:
    """How to run an operation (CLI options over the space file's execution section)."""

    max_parallel: int = 1
    max_retries: int = 2
    remeasure: bool = False
    lease_seconds: float = 60.0
    output_root: Path | None = None  # default <home>/runs
    skip_predicted_oom: bool = False  # grid/random: do not measure points the planner says will not fit
    allow_actuator_import: bool = False  # the space's actuator may be an unregistered module:function


@dataclass
class Progress:
    """Counts of the operation's points, as the progress display shows them."""

    operation_id: str
    total: int
    done: int = 0  # points with a final outcome (valid, invalid, failed)
    running: int = 0  # in flight here
    valid: int = 0
    invalid: int = 0
    failed: int = 0
    memoised: int = 0  # done before this run (or by other operations): not measured again
    rules: int = 0  # invalid by a validity rule: recorded without running
    measured: int = 0  # actuator runs completed by this run (retries included)
    retried: int = 0
    lost: int = 0  # results whose claim had expired (kept as history)
    elsewhere: int = 0  # requests of this operation another explorer is running
    skipped: int = 0  # not measured: the planner predicts they will not fit (--skip-predicted-oom)


@dataclass
class Summary(Progress):
    elapsed_s: float = 0.0
    best: dict[str, Any] | None = None
    interrupted: bool = False
    final: dict[str, int] = field(default_factory=dict)  # the operation's requests by status at the end
    # where the results went: trackers (mlflow:URI, ...), experiment, runs created, already there, not tracked
    tracked: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def explore(
    space: Space,
    store: Store,
    executor: Executor,
    settings: Settings | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    trackers: Trackers | None = None,
) -> Summary:  # over 60 lines: the scheduling loop (claim, submit, poll, record, stop) reads in one place
    """Run (or resume) the space's operation to completion; returns what happened.

    trackers: where each stored result goes (open, checked); None: the space's ``track:`` trackers, opened
    and checked here and closed at the end."""
    settings = settings or Settings()
    # fail fast on a bad actuator, before anything is stored
    check_options(space.actuator, space.options, allow_import=settings.allow_actuator_import)
    space.check_explorable()
    if trackers is None and space.track:
        from tunebench.track import open_trackers

        with open_trackers(space.track, kind_field="track", location_field="track") as opened:
            return explore(space, store, executor, settings, on_progress, opened)
    if trackers and space.actuator == "predict":  # trackers take measurements; the planner's are in the store
        get_logger(__name__).warning(
            "track: the predict actuator measures nothing: no result is sent to "
            + ", ".join(str(w.target) for w in trackers.writers)
        )
        trackers = None
    started = time.monotonic()
    sent_before = trackers.total.copy() if trackers else None  # one Trackers may serve several explores
    op_id = space.operation_id
    sampler = space.operation.sampler
    store.open_operation(op_id, sampler=sampler, actuator=space.actuator, space=space.source, name=space.name)
    store.requeue_stale(max_retries=settings.max_retries)
    owner = owner_id()
    output_root = settings.output_root or home() / "runs"
    progress = Progress(op_id, total=0)

    search = _register(space, store, settings, progress)
    _refresh(store, op_id, progress, search)

    experiments: dict[str, Experiment] = {}
    in_flight: dict[int, Claim] = {}
    last_renew = last_requeue = time.monotonic()
    report = on_progress or (lambda p: None)
    report(progress)
    interrupted = False
    try:
        while True:
            now = time.monotonic()
            if in_flight and now - last_renew > settings.lease_seconds / 3:
                store.renew(in_flight.values(), settings.lease_seconds)
                last_renew = now
            if now - last_requeue > min(settings.lease_seconds / 2, REQUEUE_S):
                store.requeue_stale(max_retries=settings.max_retries)  # a dead explorer's claims come back
                last_requeue = now

            capacity = settings.max_parallel - len(in_flight)
            claims = search.claim(owner, capacity, settings.lease_seconds, in_flight) if capacity > 0 else []
            for claim in claims:
                in_flight[claim.request_id] = claim
                error = _submit(executor, _task(claim, experiments, space, output_root, settings.allow_actuator_import))
                if error:
                    in_flight.pop(claim.request_id)
                    failed = Result.failed(claim.experiment_id, claim.entity_id, error)
                    status = store.complete(claim, failed, max_retries=settings.max_retries, generator=sampler)
                    _track(trackers, store, claim, status)

            finished = executor.poll(timeout=POLL_S if in_flight else 0.0)
            _record(store, search, finished, in_flight, progress, settings, sampler, trackers)
            if claims or finished:
                _refresh(store, op_id, progress, search, running=len(in_flight))
                report(progress)

            if not in_flight and not claims and search.done():
                break
    except KeyboardInterrupt:
        interrupted = True
        store.release(in_flight.values())
        in_flight.clear()
        raise
    finally:
        executor.close()
        if not interrupted:
            _refresh(store, op_id, progress, search, running=len(in_flight))
            report(progress)

    summary = Summary(**asdict(progress))
    summary.elapsed_s = time.monotonic() - started
    summary.final = store.counts(op_id)
    summary.best = search.best()
    summary.tracked = _tracked(trackers, sent_before, op_id)
    return summary


def _tracked(trackers: Trackers | None, before: Sent | None, op_id: str) -> dict[str, Any] | None:
    """What the trackers took of this run's results (None without trackers); before: their total at its start."""
    if not trackers or before is None:
        return None
    from tunebench.track.runs import operation_experiment

    total = trackers.total.since(before)
    return {
        "trackers": trackers.names(),
        "experiment": operation_experiment(op_id),
        "created": total.created,
        "present": total.present,
        "failed": len(total.warnings),
    }


def _submit(executor: Executor, task: Task) -> str | None:
    """Hand a task to the executor; why not, when it cannot take it (e.g. the Ray cluster went away)."""
    try:
        executor.submit(task)
    except Exception as exc:  # any failure to submit fails this attempt, not the exploration
        return f"submit: {type(exc).__name__}: {exc}"
    return None


def _register(space: Space, store: Store, settings: Settings, progress: Progress) -> Search:
    """Register the space's points (grid/random) or start the Optuna search (optimize); sets the
    progress totals. Returns the operation's search."""
    op_id, sampler = space.operation_id, space.operation.sampler
    if sampler == "optimize":
        from tunebench.explore.optimize import OptunaSearch

        search = OptunaSearch(space, store, op_id, remeasure=settings.remeasure)
        progress.total = search.budget
        progress.memoised = search.evaluated
        return search
    points = space.sample()
    if settings.skip_predicted_oom and space.actuator != "predict":
        points, skipped = screen_predicted_oom(points)
        progress.skipped = len(skipped)
    regs = store.register(op_id, points, actuator=space.actuator, generator=sampler, remeasure=settings.remeasure)
    unique = {r.request_id: r for r in regs}.values()
    progress.total = len(unique)
    progress.memoised = sum(r.origin == "memoised" for r in unique)
    progress.rules = sum(r.origin == "rules" for r in unique)
    return FixedPoints(space, store)


def _record(
    store: Store,
    search: Search,
    finished: list,
    in_flight: dict[int, Claim],
    progress: Progress,
    settings: Settings,
    sampler: str,
    trackers: Trackers | None = None,
) -> None:
    """Store each finished result (a failure may be requeued for a retry), send it to the trackers and tell
    the search."""
    for fin in finished:
        claim = in_flight.pop(fin.request_id)
        status = store.complete(claim, fin.result, max_retries=settings.max_retries, generator=sampler)
        _track(trackers, store, claim, status)
        progress.measured += 1
        progress.retried += status == PENDING
        progress.lost += status == "lost"
        if status in (VALID, INVALID, FAILED, "lost"):
            search.tell(claim.request_id, status, fin.result.properties)


def _track(trackers: Trackers | None, store: Store, claim: Claim, status: str) -> None:
    """Send the result a claim's completion just stored (a lost claim's result is history: not sent)."""
    if trackers and status != "lost":
        trackers.send_requests(store, [claim.request_id])


def screen_predicted_oom(points: list) -> tuple[list, list]:
    """Split points into (to measure, skipped): skipped are rule-valid points the planner predicts will
    not fit in GPU memory. Points that break a rule stay: they are recorded invalid without running."""
    from tunebench.plan import predict_many

    candidates = [i for i, (_, _, reasons) in enumerate(points) if not reasons]
    predictions = predict_many([(points[i][0], points[i][1]) for i in candidates])
    drop = {i for i, r in zip(candidates, predictions, strict=True) if r.status == "invalid"}
    return [p for i, p in enumerate(points) if i not in drop], [p for i, p in enumerate(points) if i in drop]


def _task(
    claim: Claim, experiments: dict[str, Experiment], space: Space, output_root: Path, allow_import: bool
) -> Task:
    experiment = experiments.get(claim.experiment_id)
    if experiment is None:
        experiment = experiments[claim.experiment_id] = get_experiment(claim.base_id, claim.parameters)
    entity = make_entity(experiment, claim.entity_values)
    options = dict(space.options)
    run_dir = output_root / (claim.operation_id or "adhoc") / f"{claim.request_id}-{claim.attempt}"
    options["output_dir"] = str(run_dir)
    return make_task(claim.request_id, claim.attempt, claim.actuator, experiment, entity, options, allow_import)


def _refresh(store: Store, op_id: str, progress: Progress, search: Search, running: int = 0) -> None:
    """Progress counts from the store (shared with other explorers, so read, not tallied)."""
    counts = store.counts(op_id)
    progress.valid, progress.invalid, progress.failed = (
        counts.get(VALID, 0),
        counts.get(INVALID, 0),
        counts.get(FAILED, 0),
    )
    progress.running = running
    progress.elsewhere = max(0, counts.get(RUNNING, 0) - running)
    search.count(progress)
