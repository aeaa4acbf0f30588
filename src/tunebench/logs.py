"""tunebench's log lines on stderr: progress where no live display can be drawn, more with -v, none with --quiet.

``configure(verbosity)`` (the CLI's ``-v/--verbose`` and ``--quiet``): 0 shows INFO lines (progress
of long commands outside a terminal), 1 also DEBUG, -1 only warnings. Every module logs under the
``tunebench`` logger; nothing else touches the root logger.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

LOGGER = "tunebench"
LEVELS = {-1: logging.WARNING, 0: logging.INFO, 1: logging.DEBUG}


class _Stderr(logging.StreamHandler):
    """A handler writing to the sys.stderr of the moment (tests and callers may replace it)."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


class _Format(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"{time.strftime('%H:%M:%S', time.localtime(record.created))} {record.getMessage()}"


def configure(verbosity: int = 0) -> None:
    """Log tunebench's lines to stderr at the level of verbosity (-1 quiet, 0 normal, 1 verbose)."""
    logger = logging.getLogger(LOGGER)
    logger.setLevel(LEVELS[max(-1, min(1, verbosity))])
    if not any(isinstance(h, _Stderr) for h in logger.handlers):
        handler = _Stderr()
        handler.setFormatter(_Format())
        logger.addHandler(handler)
    logger.propagate = False


def is_quiet() -> bool:
    """Whether --quiet asked for no progress at all (live displays included)."""
    return logging.getLogger(LOGGER).level >= logging.WARNING


def get(name: str) -> logging.Logger:
    """The logger of a tunebench module (name: its __name__)."""
    return logging.getLogger(name if name.startswith(LOGGER) else f"{LOGGER}.{name}")


def duration(seconds: float) -> str:
    """A duration to read at a glance in progress lines: '42 s', '3 min 05 s', '1 h 02 min'."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


@contextmanager
def heartbeat(log: logging.Logger, line: Callable[[], str], interval: float = 30.0) -> Iterator[None]:
    """While the block runs, log line() every interval seconds (long steps that say nothing themselves)."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(interval):
            log.info(line())

    thread = threading.Thread(target=beat, name="tunebench-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
