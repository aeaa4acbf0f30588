"""Host-memory limit of a training process: exceeding it is an out-of-memory outcome.

Mechanism: a watchdog thread polls the resident set size (RSS) of the training process and its
children with psutil every ``poll_s`` (50 ms; the children are listed again every second:
worker/proctree.py). When it exceeds the limit, the watchdog records the event and sends SIGUSR1
to the process's main thread, whose handler raises :class:`HostMemoryLimitExceeded` (a
``MemoryError``) in the training code, which the worker classifies as ``oom``. If library code swallows the exception and training goes on, the signal is
sent again (at most once a second) while RSS stays above the limit, and the worker still classifies
the run as ``oom`` from the recorded event.

Why not ``RLIMIT_AS``: it limits *virtual* address space, which torch, glibc arenas, thread stacks
and CUDA reserve far beyond what is resident (a CUDA process maps tens of GiB), and an allocation
refused by it surfaces as an arbitrary error in whatever C library asked (thread creation, BLAS,
the tokenizer), not as a recognisable out-of-memory exception. RSS is what a container limit or the
kernel's OOM killer actually acts on.

Limits: the check is a poll, so a single large allocation can overshoot the limit until the next
poll and until the running C operation returns to Python (the handler runs between bytecodes).
Under several processes per node each rank enforces ``limit / LOCAL_WORLD_SIZE`` on its own tree.
"""

from __future__ import annotations

import signal
import threading
import time

import psutil

from tunebench.units import GIB
from tunebench.worker.proctree import ProcessTree

POLL_S = 0.05  # poll interval: 50 ms


class HostMemoryLimitExceeded(MemoryError):
    """RSS of the training process went over --host_memory_limit_gib."""


class HostMemoryWatchdog:
    """Context manager: raise HostMemoryLimitExceeded in the main thread when RSS > limit_bytes.

    Must be entered from the main thread (it installs a SIGUSR1 handler, restored on exit).
    ``exceeded`` holds a message once the limit was crossed; ``peak_rss_bytes`` the largest RSS seen.
    """

    def __init__(self, limit_bytes: int, poll_s: float = POLL_S, resend_s: float = 1.0):
        self.limit_bytes = int(limit_bytes)
        self.poll_s = poll_s
        self.resend_s = resend_s
        self.exceeded: str | None = None
        self.peak_rss_bytes = 0
        self._armed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous_handler = None
        self._tree = ProcessTree(psutil.Process())

    def _on_signal(self, signum, frame):
        if self._armed and self.exceeded:
            raise HostMemoryLimitExceeded(self.exceeded)

    def _loop(self) -> None:
        last_sent = -1e9
        main_ident = threading.main_thread().ident
        while not self._stop.wait(self.poll_s):
            rss = self._tree.rss_bytes()
            self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
            if rss <= self.limit_bytes:
                continue
            if self.exceeded is None:
                self.exceeded = (
                    f"host memory limit exceeded: resident memory {rss / GIB:.2f} GiB > limit "
                    f"{self.limit_bytes / GIB:.2f} GiB"
                )
            now = time.monotonic()
            if self._armed and now - last_sent >= self.resend_s:
                last_sent = now
                signal.pthread_kill(main_ident, signal.SIGUSR1)

    def __enter__(self) -> HostMemoryWatchdog:
        self._previous_handler = signal.signal(signal.SIGUSR1, self._on_signal)
        self._armed = True
        self.peak_rss_bytes = self._tree.rss_bytes()
        self._thread = threading.Thread(target=self._loop, name="tunebench-hostmem", daemon=True)
        self._thread.start()
        return self

    def disarm(self) -> None:
        """Stop raising and polling (idempotent); the recorded ``exceeded`` stays."""
        self._armed = False
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._previous_handler is not None:
            # A signal sent just before disarming must not hit SIGUSR1's default action (terminate).
            previous = self._previous_handler
            signal.signal(signal.SIGUSR1, signal.SIG_IGN if previous == signal.SIG_DFL else previous)
            self._previous_handler = None

    def __exit__(self, *exc) -> None:
        self.disarm()
