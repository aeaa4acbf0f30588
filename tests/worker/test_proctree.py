"""ProcessTree: a run's processes, the children listed again at most every refresh_s (worker/proctree.py)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from tunebench.worker.proctree import ProcessTree

HOLD = "import sys, time; b = bytearray(int(sys.argv[1])); b[::4096] = b'x' * len(b[::4096]); time.sleep(60)"


def _child(size: int) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(size)])
    proc = psutil.Process(child.pid)
    deadline = time.monotonic() + 30
    while proc.memory_info().rss < size and time.monotonic() < deadline:
        time.sleep(0.05)
    return child


def test_children_are_counted_once_listed_and_listed_again_after_refresh_s():
    tree = ProcessTree(psutil.Process(), refresh_s=0.5)
    alone = tree.rss_bytes()
    child = _child(200 * 2**20)
    try:
        assert tree.rss_bytes() < alone + 100 * 2**20  # listed before the child started: not counted yet
        time.sleep(0.6)
        assert tree.rss_bytes() > alone + 190 * 2**20  # listed again: its 200 MiB counted
        assert child.pid in tree.cpu_seconds()
    finally:
        child.kill()
        child.wait()
    assert tree.rss_bytes() >= 0  # a child gone since the listing counts 0, no error
    time.sleep(0.6)
    assert [p.pid for p in tree.members()] == [psutil.Process().pid]
