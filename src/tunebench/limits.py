"""Bounds on the work one value can ask for, taken from this machine: its free memory and disk.

A data set id, a GPU count or a grid size is a number anyone can type; what it costs is bytes. Before
tunebench generates a data set or enumerates candidates it estimates the bytes they need and refuses
(``InputError``, nothing written) when this machine does not have them, instead of growing until the
kernel kills the process.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import psutil

from tunebench.errors import InputError

CGROUP_ROOT = Path("/sys/fs/cgroup")  # where Linux mounts the cgroup file systems (a container sees its own)
NO_LIMIT = 2**62  # cgroup v1 writes "no limit" as the largest page-aligned int64 (9223372036854771712)


def cgroup_memory(root: Path = CGROUP_ROOT) -> tuple[int, int] | None:
    """(limit, usage) bytes of this process's memory cgroup (a container's --memory, a Kubernetes pod's
    limit), or None where it has no limit or none is readable (not Linux).

    psutil reads /proc/meminfo, the whole host's memory, which a container's limit does not lower. cgroup
    v2: ``memory.max`` ("max": none) and ``memory.current`` of the process's group (``0::/path`` in
    /proc/self/cgroup), or of the root a container sees; cgroup v1:
    ``memory/memory.limit_in_bytes`` and ``memory.usage_in_bytes`` (kernel docs, cgroup-v1/memory.rst and
    cgroup-v2.rst)."""
    candidates = [(root / "memory.max", root / "memory.current")]
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::/") and line != "0::/":
                group = root / line[4:]
                candidates.insert(0, (group / "memory.max", group / "memory.current"))
    except OSError:
        pass
    candidates.append((root / "memory" / "memory.limit_in_bytes", root / "memory" / "memory.usage_in_bytes"))
    for limit_file, usage_file in candidates:
        try:
            text = limit_file.read_text().strip()
        except OSError:
            continue
        if text == "max" or not text.isdigit() or int(text) >= NO_LIMIT:
            continue
        try:
            usage = int(usage_file.read_text().strip())
        except (OSError, ValueError):
            usage = 0
        return int(text), usage
    return None


def total_memory(root: Path = CGROUP_ROOT) -> int:
    """Bytes of RAM this process's programs can use: the machine's (psutil), or its cgroup's limit if lower."""
    total = int(psutil.virtual_memory().total)
    group = cgroup_memory(root)
    return min(total, group[0]) if group else total


def available_memory(root: Path = CGROUP_ROOT) -> int:
    """Bytes of memory a new allocation can get without swapping (psutil's 'available'), within the memory
    cgroup's limit where one is set (what the kernel's OOM killer enforces)."""
    available = int(psutil.virtual_memory().available)
    group = cgroup_memory(root)
    return min(available, max(0, group[0] - group[1])) if group else available


def free_disk(path: str | Path) -> int:
    """Free bytes of the file system that holds path (or would hold it: the nearest existing ancestor)."""
    target = Path(path).absolute()
    while not target.exists() and target != target.parent:
        target = target.parent
    return int(shutil.disk_usage(target).free)


def human_bytes(n: float) -> str:
    for unit, scale in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:.0f} B"


def check_memory(field: str, need: float, what: str) -> None:
    """InputError naming field when need bytes exceed the memory available now."""
    have = available_memory()
    if need > have:
        raise InputError(field, f"{what} needs about {human_bytes(need)} of memory; {human_bytes(have)} is available")


def check_disk(field: str, need: float, where: str | Path, what: str) -> None:
    """InputError naming field when need bytes exceed the free space where the files would go."""
    have = free_disk(where)
    if need > have:
        raise InputError(
            field, f"{what} needs about {human_bytes(need)} of disk; {human_bytes(have)} is free in {str(where)!r}"
        )


# gloo DDP on one host: every process holds a copy of the model and a connection to every other, so n
# processes open n*(n-1) connections; 256 processes (65,280 connections) is far past any CPU worth it.
MAX_CPU_PROCESSES = 256
