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


def available_memory() -> int:
    """Bytes of memory a new allocation can get without swapping (psutil's 'available')."""
    return int(psutil.virtual_memory().available)


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
