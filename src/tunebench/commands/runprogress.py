"""Progress of one measurement (``tunebench run``, ``demo``): phase, step x/N, tokens/s, loss, elapsed, ETA.

In a terminal a live line (rich); elsewhere (a pipe, a log) log lines on stderr: at each phase, at the
first training step, at least every HEARTBEAT_S seconds (tunebench.logs.heartbeat) and at the end; -v
adds a line per step, --quiet shows nothing. Fed by the measuring actuator's ``progress`` (phases) and
``on_step`` (the worker's step lines, tunebench.worker.progress). A command-line module.
"""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from tunebench.logs import duration, heartbeat, is_quiet
from tunebench.logs import get as get_logger
from tunebench.worker.progress import StepProgress

HEARTBEAT_S = 30.0  # outside a terminal, a progress line at least this often (as explore's)


class RunProgress:
    """A context manager: phase(msg) and step(progress) update what is shown about the measurement of label."""

    def __init__(self, label: str, console: Console | None = None, interval: float = HEARTBEAT_S):
        self.label = label
        self.console = console or Console(stderr=True)
        self.interval = interval
        self.log = get_logger(__name__)
        self.live = self.console.is_terminal and not is_quiet()
        self._phase = "starting"
        self._step: StepProgress | None = None
        self._step_at = 0.0
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self._stack = ExitStack()
        self._bar: Progress | None = None
        self._task = None

    def __enter__(self) -> RunProgress:
        self._started = time.monotonic()
        if self.live:
            self._bar = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
            self._stack.enter_context(self._bar)
            self._task = self._bar.add_task(self.line(elapsed=False))
        else:
            self._stack.enter_context(heartbeat(self.log, self.line, self.interval))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
        if self._step is not None and not self.live:
            self.log.info(f"{self.label}: trained {self.line(elapsed=True, head=False)}")

    def phase(self, message: str) -> None:
        """A new phase of the measurement (data set, environment, training)."""
        with self._lock:
            self._phase = message
        self._show(info=True)

    def step(self, progress: StepProgress) -> None:
        """A training step ended (called from the log-following thread)."""
        with self._lock:
            first = self._step is None
            self._step, self._step_at = progress, time.monotonic()
        self._show(info=first)

    def line(self, elapsed: bool = True, head: bool = True) -> str:
        """'<label>: training step 3/10, 1,234 tokens/s, loss 2.31, ETA 12 s, 40 s elapsed'."""
        with self._lock:
            phase, step, since = self._phase, self._step, time.monotonic() - self._step_at
        text = f"{self.label}: {phase}" if head else ""
        if step is not None:
            text += (" " if head else "") + step.describe(since_s=since)
        if elapsed:
            text += f", {duration(time.monotonic() - self._started)} elapsed"
        return text

    def _show(self, info: bool) -> None:
        if self._bar is not None:
            self._bar.update(self._task, description=self.line(elapsed=False))
        elif info:
            self.log.info(self.line())
        else:
            self.log.debug(self.line())
