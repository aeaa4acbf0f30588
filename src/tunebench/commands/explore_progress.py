"""Progress of an operation: live in a terminal (rich), else log lines; done / total, running, failed, invalid, memoised."""

from __future__ import annotations

import logging
import threading
import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from tunebench.explore.explorer import Progress as Counts
from tunebench.logs import get as get_logger


class ProgressDisplay:
    """A context manager whose update(counts) the explorer calls after every change."""

    WIDE = 120  # terminal columns from which every count has its own labelled column and the bar is long

    def __init__(self, console: Console | None = None, enabled: bool = True):
        self.console = console or Console(stderr=True)
        self.wide = self.console.width >= self.WIDE
        if self.wide:
            counts = (
                TextColumn("running {task.fields[running]}"),
                TextColumn("[red]failed {task.fields[failed]}"),
                TextColumn("invalid {task.fields[invalid]}"),
                TextColumn("memoised {task.fields[memoised]}"),
            )
        else:  # a narrow terminal: the counts that are not 0 in one short column, a shorter bar
            counts = (TextColumn("{task.fields[counts]}"),)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=40 if self.wide else 10),
            MofNCompleteColumn(),
            *counts,
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            disable=not enabled,
            transient=False,
        )
        self.task = None

    def __enter__(self) -> ProgressDisplay:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def update(self, counts: Counts) -> None:
        fields = dict(running=counts.running, failed=counts.failed, invalid=counts.invalid, memoised=counts.memoised)
        fields["counts"] = " ".join(
            f"{name} {n}"
            for name, n in (
                ("run", counts.running),
                ("fail", counts.failed),
                ("inv", counts.invalid),
                ("memo", counts.memoised),
            )
            if n
        )
        if self.task is None:  # start at what is already done, so memoised points do not skew the ETA
            self.task = self.progress.add_task(counts.operation_id, total=counts.total, completed=counts.done, **fields)
        else:
            self.progress.update(self.task, total=counts.total, completed=counts.done, **fields)


HEARTBEAT_S = 30.0  # outside a terminal, a progress line at least this often (a long measurement included)


class ProgressLog:
    """Progress as log lines (stderr outside a terminal): one per finished measurement, and one every
    interval seconds while nothing finishes. A context manager whose update(counts) the explorer calls."""

    def __init__(self, interval: float = HEARTBEAT_S, logger: logging.Logger | None = None):
        self.interval = interval
        self.log = logger or get_logger(__name__)
        self.counts: Counts | None = None
        self._finished = -1
        self._started = time.monotonic()
        self._last = self._started
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="tunebench-progress", daemon=True)

    def __enter__(self) -> ProgressLog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def update(self, counts: Counts) -> None:
        with self._lock:
            self.counts = counts
            finished = counts.done + counts.measured  # a retried measurement counts too
            if finished != self._finished:
                self._finished = finished
                self._say(counts)
            else:
                self.log.debug(self.line(counts))

    def line(self, counts: Counts) -> str:
        elapsed = time.monotonic() - self._started
        return (
            f"{counts.operation_id}: {counts.done}/{counts.total} done — valid {counts.valid}, invalid "
            f"{counts.invalid}, failed {counts.failed}, running {counts.running}, memoised {counts.memoised}; "
            f"{elapsed:.0f} s"
        )

    def _say(self, counts: Counts) -> None:
        self.log.info(self.line(counts))
        self._last = time.monotonic()

    def _beat(self) -> None:
        while not self._stop.wait(min(self.interval, 1.0)):
            with self._lock:
                if self.counts is not None and time.monotonic() - self._last >= self.interval:
                    self._say(self.counts)
