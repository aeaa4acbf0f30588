"""A process and its live children, listed again at most once a second: how the memory watchdogs and the
CPU sampler find the processes of a run.

Listing the children (``psutil.Process.children(recursive=True)``) reads ``/proc/<pid>/stat`` of every
process on the host: 1.6 ms with 85 processes on the 2-core CI VM. The worker's memory watchdog polls every
50 ms and the measuring process every 100 ms, so listing on each poll took about 50 ms of CPU a second
from the training it measures, 2-3 % of two cores. Reading the resident set of a known process is 0.03 ms
(``/proc/<pid>/statm``). So the tree is listed every ``REFRESH_S`` and only read in between: a child started
since the last listing is counted up to ``REFRESH_S`` late (dataloader workers and ranks start once, at the
beginning of a run, and then live as long as it).
"""

from __future__ import annotations

import time

import psutil

REFRESH_S = 1.0  # how often the children are listed again, s


class ProcessTree:
    """root (a pid or a psutil.Process) and its children, re-listed at most every refresh_s seconds."""

    def __init__(self, root: int | psutil.Process, refresh_s: float = REFRESH_S):
        self.root = root if isinstance(root, psutil.Process) else psutil.Process(root)
        self.refresh_s = refresh_s
        self._children: list[psutil.Process] = []
        self._listed = -float("inf")

    def members(self) -> list[psutil.Process]:
        """The root and its children as last listed (listed again when refresh_s has passed)."""
        now = time.monotonic()
        if now - self._listed >= self.refresh_s:
            try:
                self._children = self.root.children(recursive=True)
            except psutil.Error:
                self._children = []
            self._listed = now
        return [self.root, *self._children]

    def rss_bytes(self) -> int:
        """Resident set size of the tree in bytes (processes gone since the listing count 0)."""
        total = 0
        for proc in self.members():
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                continue
        return total

    def cpu_seconds(self) -> dict[int, float]:
        """User + system CPU seconds used so far by each live process of the tree, by pid."""
        out = {}
        for proc in self.members():
            try:
                t = proc.cpu_times()
                out[proc.pid] = t.user + t.system
            except psutil.Error:
                continue
        return out
