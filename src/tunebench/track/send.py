"""Stored results to trackers: opened and checked before anything is measured, then sent from the store.

    trackers = open_trackers(parse_targets(["mlflow"]))   # InputError now: a missing extra, a dead server
    ... measure, store the result ...
    trackers.send_requests(store, [request_id])           # the stored result that decided the request
    trackers.close()

    sent = export(store, Target("mlflow", uri))           # every measurement in the store, idempotently

What a tracker gets is read back from the store (tunebench.store.stored), never taken from the measurement
in memory: the store is written first and is the record; a tracker holds a copy. A tracker that fails
while sending costs the measurement nothing: the failure is one warning line (logged, kept in the result's
metadata under ``tracking_warnings``, and returned), and the next result is sent as usual.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tunebench.errors import InputError, one_line
from tunebench.logs import duration, get, heartbeat
from tunebench.secrets import mask_secrets
from tunebench.track.runs import TrackedRun, tracked_run
from tunebench.track.targets import Target, default_location, require

if TYPE_CHECKING:
    from tunebench.store.base import StoreBase

log = get(__name__)
CHECK_HEARTBEAT_S = 5.0  # a check that takes longer says so (the embedded store's first use creates its tables)
SEND_HEARTBEAT_S = 30.0  # a send that takes longer says so (a server that accepts and never answers: minutes)


@dataclass
class Sent:
    """What a send did: runs created, results the tracker already held, one line per failure."""

    created: int = 0
    present: int = 0
    warnings: list[str] = field(default_factory=list)

    def since(self, earlier: Sent) -> Sent:
        """What was done after ``earlier``, a copy of this running total taken then."""
        return Sent(
            self.created - earlier.created, self.present - earlier.present, self.warnings[len(earlier.warnings) :]
        )

    def copy(self) -> Sent:
        return Sent(self.created, self.present, list(self.warnings))


def writer_of(target: Target, location_field: str) -> Any:
    """The writer of a target's kind (its module imported here: only when that tracker is used)."""
    if target.kind == "mlflow":
        from tunebench.track.mlflow_writer import MlflowWriter

        return MlflowWriter(target, location_field)
    from tunebench.track.aim_writer import AimWriter

    return AimWriter(target, location_field)


class Trackers:
    """Open, checked writers of one or more trackers (see the module)."""

    def __init__(self, writers: Sequence[Any], *, predicted: bool = True):
        self.writers = list(writers)
        self.predicted = predicted  # add the planner's prediction of each entity (predicted_<property>)
        self.total = Sent()  # what every send so far did (a caller reports its own part: total.since(its copy))
        self.failing: set[int] = set()  # writers (by index) whose last send failed: checked again first

    def __bool__(self) -> bool:
        return bool(self.writers)

    def send_requests(self, store: StoreBase, request_ids: Sequence[int]) -> Sent:
        """Send the stored result that decided each request (what `run` and `explore` just stored)."""
        from tunebench.store.stored import result_ids

        return self.send(store, result_ids(store, latest_of=request_ids))

    def send(
        self,
        store: StoreBase,
        ids: Sequence[int],
        *,
        record: bool = True,
        progress: Callable[[int, int], None] | None = None,
    ) -> Sent:
        """Send the stored results ids to every tracker; a result a tracker already holds is left as it is.
        record: keep each failure in the result's metadata (False: the store is open read-only)."""
        from tunebench.store.stored import add_warning, read_results

        sent = Sent()
        stored = read_results(store, ids)
        for done, item in enumerate(stored, 1):
            run: TrackedRun | None = None
            for n, writer in enumerate(self.writers):
                try:
                    run = run or tracked_run(store, item, predicted=self.predicted)
                    started = time.monotonic()
                    waited = lambda: (  # noqa: E731
                        f"track: sending result {item.result_id} to {writer.target}, "
                        f"{duration(time.monotonic() - started)} elapsed"
                    )
                    with heartbeat(log, waited, SEND_HEARTBEAT_S):
                        created = self._send_one(n, writer, run)
                    sent.created += created
                    sent.present += not created
                except Exception as exc:  # the measurement is stored: a tracker's failure is a warning
                    self.failing.add(n)
                    text = _warning(writer, item.result_id, exc, store.url)
                    log.warning(text)
                    sent.warnings.append(text)
                    if record:
                        _keep(store, item.result_id, text, add_warning)
            if progress:
                progress(done, len(stored))
        self.total.created += sent.created
        self.total.present += sent.present
        self.total.warnings += sent.warnings
        return sent

    def _send_one(self, n: int, writer: Any, run: TrackedRun) -> bool:
        """Write run to the n-th writer unless its tracker holds it already; True when created. A tracker whose
        last send failed is checked first (one request, no retries, 10 s: MlflowWriter.check): a server that
        stays down costs seconds per result, not a write's retries (4 x 60 s where it accepts and never
        answers, MLflow's HTTP retries under WRITE_ENV)."""
        if n in self.failing:
            writer.check()
            self.failing.discard(n)
        if writer.has(run):
            return False
        writer.write(run)
        return True

    def names(self) -> str:
        """The trackers, as one says them: mlflow:URI, aim:REPO (passwords masked)."""
        return ", ".join(str(w.target) for w in self.writers)

    def close(self) -> None:
        for writer in self.writers:
            writer.close()

    def __enter__(self) -> Trackers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_trackers(
    targets: Sequence[Target], *, predicted: bool = True, kind_field: str = "--track", location_field: str = "--track"
) -> Trackers:
    """Writers for targets, each checked (its library installed, its server reached, its store opened)
    before anything is measured; InputError naming kind_field (a missing extra) or location_field."""
    writers = []
    try:
        for target in targets:
            require(target.kind, kind_field)
            writer = writer_of(target, location_field)
            writers.append(writer)
            started = time.monotonic()
            waited = lambda: f"track: checking {target}, {duration(time.monotonic() - started)} elapsed"  # noqa: E731
            with heartbeat(log, waited, CHECK_HEARTBEAT_S):  # quiet when quick: an error stays one line
                writer.check()
            log.debug(f"track: {target} ready in {time.monotonic() - started:.1f} s")
    except BaseException:
        for writer in writers:
            writer.close()
        raise
    return Trackers(writers, predicted=predicted)


def export(
    store: StoreBase, target: Target, *, predicted: bool = False, progress: Callable[[int, int], None] | None = None
) -> Sent:
    """Send every measurement in the store (tunebench.store.stored.result_ids) to target; results the tracker
    already holds (its runs are tagged with their result key) are not sent again."""
    from tunebench.store.stored import result_ids

    with open_trackers([target], predicted=predicted, kind_field="--to", location_field="--uri") as trackers:
        return trackers.send(store, result_ids(store), record=False, progress=progress)


def export_command(target: Target, store_url: str) -> str:
    """The command that sends the store's measurements to target again (named in each warning)."""
    uri = "" if target.location == default_location(target.kind) else f" --uri {mask_secrets(target.location)}"
    return f"tunebench track export --to {target.kind}{uri} --store {mask_secrets(store_url)}"


def _warning(writer: Any, result_id: int, exc: BaseException, store_url: str) -> str:
    """One line: why the result was not tracked (a failed re-check says it in its own words; the writer's reason(),
    where it has one, names a known failure in a few words) and how to send it."""
    target = writer.target
    reason = getattr(writer, "reason", str)
    text = exc.message if isinstance(exc, InputError) else reason(exc)
    why = one_line(text.strip().splitlines()[0] if text.strip() else "")
    why = mask_secrets(why if len(why) <= 300 else why[:299] + "…")
    why = why if isinstance(exc, InputError) else f"{type(exc).__name__}: {why}"
    return (
        f"{target.kind}: result {result_id} was not tracked ({why}); it is in the store, and "
        f"`{export_command(target, store_url)}` sends it"
    )


def _keep(store: StoreBase, result_id: int, text: str, add: Callable[[StoreBase, int, str], None]) -> None:
    """Keep the warning on the result; a store that cannot take it leaves the warning logged only."""
    try:
        add(store, result_id, text)
    except Exception as exc:
        log.warning(
            f"the warning could not be kept with result {result_id}: {type(exc).__name__}: {one_line(str(exc))}"
        )
