"""Host memory around a training run, seen from the measuring process: the evidence of a kernel OOM kill.

The worker enforces tunebench's own host memory limit (tunebench.worker.hostmem) and reports an
out-of-memory result itself. When the kernel's OOM killer (of the container's cgroup or of the
host) is faster, the worker dies by SIGKILL and writes nothing; the parent then needs its own
evidence to call the run out of memory rather than failed:

- peak resident memory (RSS) of the run's process tree, sampled with psutil every ``POLL_S`` (its
  children listed again every second: tunebench.worker.proctree);
- the limit that applied: tunebench's host memory limit, else the cgroup's (v2 ``memory.max``, v1
  ``memory.limit_in_bytes``), else ``/proc/meminfo`` MemTotal;
- the cgroup's OOM-kill counter before and after the run (v2 ``memory.events``, v1
  ``memory.oom_control``: ``oom_kill``);
- the lowest ``/proc/meminfo`` MemAvailable seen during the run.

``oom_kill_reason`` says out of memory when the run ended by SIGKILL and either the cgroup counted
an OOM kill, the peak RSS reached ``OOM_RSS_FRACTION`` of the limit, or MemAvailable fell below
``LOW_AVAILABLE_FRACTION`` of MemTotal. ``default_host_memory_limit_bytes`` is the limit CPU runs
get when none is given, so that tunebench's own limit is hit before the kernel's.
"""

from __future__ import annotations

import signal
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from tunebench.units import GIB
from tunebench.worker.proctree import ProcessTree

POLL_S = 0.1  # parent-side RSS sampling interval, s
# A SIGKILL with the peak RSS within 10% of the limit is the limit's doing: the kernel kills when an
# allocation cannot be satisfied, and the last samples before the kill can miss up to POLL_S of growth.
OOM_RSS_FRACTION = 0.9
LOW_AVAILABLE_FRACTION = 0.02  # MemAvailable below 2% of MemTotal: the host's memory is exhausted
# Default host memory limit of CPU runs: 80% of the memory the run can have at launch, the smaller of
# the room left in the cgroup (limit - usage) and MemAvailable; the 20% left covers the measuring
# process, page cache the kernel will not drop and the overshoot of the worker's 50 ms poll.
DEFAULT_LIMIT_FRACTION = 0.8
NO_LIMIT = 1 << 60  # cgroup v1 reports "no limit" as a page-rounded 2**63-1; anything above this is none

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_LIMIT_FILES = ("memory.max", "memory/memory.limit_in_bytes")  # v2, v1
CGROUP_USAGE_FILES = ("memory.current", "memory/memory.usage_in_bytes")
CGROUP_EVENT_FILES = ("memory.events", "memory/memory.oom_control")  # both hold an "oom_kill N" line


def _read(root: Path, names: tuple[str, ...]) -> tuple[str, Path] | None:
    for name in names:
        try:
            return (root / name).read_text(), root / name
        except OSError:
            continue
    return None


def cgroup_limit(root: Path = CGROUP_ROOT) -> tuple[int, str] | None:
    """(bytes, file) of this cgroup's memory limit, or None without one."""
    found = _read(root, CGROUP_LIMIT_FILES)
    if found is None or found[0].strip() == "max" or int(found[0]) >= NO_LIMIT:
        return None
    return int(found[0]), str(found[1])


def cgroup_usage(root: Path = CGROUP_ROOT) -> int | None:
    found = _read(root, CGROUP_USAGE_FILES)
    return int(found[0]) if found else None


def cgroup_oom_kills(root: Path = CGROUP_ROOT) -> tuple[int, str] | None:
    """(count, file) of the cgroup's OOM kills so far, or None when not readable."""
    found = _read(root, CGROUP_EVENT_FILES)
    if found is None:
        return None
    for line in found[0].splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value), str(found[1])
    return None


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes (MemTotal, MemAvailable, ...); {} where there is none."""
    out = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                out[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    except OSError:
        pass
    return out


def default_host_memory_limit_bytes(root: Path = CGROUP_ROOT) -> int | None:
    """DEFAULT_LIMIT_FRACTION of the memory a run can have now (see the constant); None if unknown."""
    room = [meminfo().get("MemAvailable")]
    limit, usage = cgroup_limit(root), cgroup_usage(root)
    if limit is not None and usage is not None:
        room.append(max(limit[0] - usage, 0))
    known = [r for r in room if r is not None]
    return int(DEFAULT_LIMIT_FRACTION * min(known)) if known else None


@dataclass
class MemoryEvidence:
    """What the parent saw of a run's memory (bytes)."""

    peak_rss_bytes: int = 0
    limit_bytes: int | None = None
    limit_source: str | None = None
    oom_kills_before: int | None = None
    oom_kills_after: int | None = None
    oom_kills_file: str | None = None
    mem_available_min_bytes: int | None = None
    mem_total_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["peak_rss_gib"] = round(self.peak_rss_bytes / GIB, 3)
        out["limit_gib"] = None if self.limit_bytes is None else round(self.limit_bytes / GIB, 3)
        return out


class MemoryWatch:
    """Samples a process tree's RSS and MemAvailable in a thread from ``start(pid)`` to ``stop()``.

    limit_bytes / limit_source: tunebench's host memory limit of the run, if any; else the cgroup's
    limit, else MemTotal, is recorded as the limit.
    """

    def __init__(self, limit_bytes: int | None = None, limit_source: str | None = None, root: Path = CGROUP_ROOT):
        self.root = root
        info = meminfo()
        cg = cgroup_limit(root)
        if limit_bytes:
            limit = (int(limit_bytes), limit_source or "host_memory_limit_gib")
        elif cg is not None:
            limit = (cg[0], f"cgroup {cg[1]}")
        else:
            limit = (info.get("MemTotal"), "/proc/meminfo MemTotal")
        kills = cgroup_oom_kills(root)
        self.evidence = MemoryEvidence(
            limit_bytes=limit[0],
            limit_source=limit[1],
            oom_kills_before=kills[0] if kills else None,
            oom_kills_file=kills[1] if kills else None,
            mem_available_min_bytes=info.get("MemAvailable"),
            mem_total_bytes=info.get("MemTotal"),
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, pid: int) -> MemoryWatch:
        self._thread = threading.Thread(target=self._loop, args=(pid,), name="tunebench-memwatch", daemon=True)
        self._thread.start()
        return self

    def _loop(self, pid: int) -> None:
        try:
            tree = ProcessTree(pid)
        except psutil.Error:
            return
        while True:
            self._sample(tree)
            if self._stop.wait(POLL_S):
                return

    def _sample(self, tree: ProcessTree) -> None:
        total = tree.rss_bytes()
        ev = self.evidence
        ev.peak_rss_bytes = max(ev.peak_rss_bytes, total)
        available = meminfo().get("MemAvailable")
        if available is not None:
            ev.mem_available_min_bytes = min(ev.mem_available_min_bytes or available, available)

    def stop(self) -> MemoryEvidence:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        kills = cgroup_oom_kills(self.root)
        self.evidence.oom_kills_after = kills[0] if kills else None
        return self.evidence


def oom_kill_reason(returncode: int, log_tail: str, ev: MemoryEvidence | None) -> str | None:
    """The out-of-memory reason of a run killed by SIGKILL with memory evidence; None otherwise."""
    sigkill = returncode in (-signal.SIGKILL, 128 + signal.SIGKILL) or (
        returncode != 0 and "Signal 9 (SIGKILL)" in log_tail  # torchrun/accelerate reporting a killed rank
    )
    if ev is None or not sigkill:
        return None
    evidence = []
    if ev.oom_kills_before is not None and (ev.oom_kills_after or 0) > ev.oom_kills_before:
        evidence.append(f"{ev.oom_kills_file} oom_kill {ev.oom_kills_before} -> {ev.oom_kills_after}")
    if ev.limit_bytes and ev.peak_rss_bytes >= OOM_RSS_FRACTION * ev.limit_bytes:
        evidence.append(f"peak RSS within {1 - OOM_RSS_FRACTION:.0%} of the limit")
    total, low = ev.mem_total_bytes, ev.mem_available_min_bytes
    if total and low is not None and low < LOW_AVAILABLE_FRACTION * total:
        evidence.append(f"/proc/meminfo MemAvailable fell to {low / GIB:.2f} GiB of {total / GIB:.2f} GiB")
    if not evidence:
        return None
    limit = f"{ev.limit_bytes / GIB:.2f} GiB ({ev.limit_source})" if ev.limit_bytes else "unknown"
    return (
        f"out of memory: the training process was killed by SIGKILL (kernel OOM killer) at peak resident memory "
        f"{ev.peak_rss_bytes / GIB:.2f} GiB, limit {limit}; evidence: {'; '.join(evidence)}"
    )
