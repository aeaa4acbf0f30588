"""Live progress of an operation (rich): done / total, running, failed, invalid, memoised, ETA."""

from __future__ import annotations

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


class ProgressDisplay:
    """A context manager whose update(counts) the explorer calls after every change."""

    def __init__(self, console: Console | None = None, enabled: bool = True):
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("running {task.fields[running]}"),
            TextColumn("[red]failed {task.fields[failed]}"),
            TextColumn("invalid {task.fields[invalid]}"),
            TextColumn("memoised {task.fields[memoised]}"),
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
        if self.task is None:  # start at what is already done, so memoised points do not skew the ETA
            self.task = self.progress.add_task(counts.operation_id, total=counts.total, completed=counts.done, **fields)
        else:
            self.progress.update(self.task, total=counts.total, completed=counts.done, **fields)
