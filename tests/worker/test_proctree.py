"""ProcessTree: a run's processes, the children listed again at most every refresh_s (worker/proctree.py)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from tunebench.worker.proctree import ProcessTree

HOLD = "import sys, time; b = bytearray(int(sys.argv[1])); b[::4096] = b'x' * len(b[::4096]); time.sleep(60)"
SIZE = 200 * 2**20


def _child() -> subprocess.Popen:
    """A child process holding SIZE bytes resident (waits until it does, up to 60 s)."""
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(SIZE)])
    proc = psutil.Process(child.pid)
    deadline = time.monotonic() + 60
    while proc.memory_info().rss < SIZE and time.monotonic() < deadline:
        time.sleep(0.05)
    return child


def test_children_are_counted_from_the_listing_after_they_started():
    tree = ProcessTree(psutil.Process(), refresh_s=3600)  # listed again only when the test says so
    before = [p.pid for p in tree.members()]
    child = _child()
    try:
        assert child.pid not in [p.pid for p in tree.members()]  # listed before it started: not read
        tree._listed = -float("inf")  # the refresh interval has passed
        assert child.pid in [p.pid for p in tree.members()]
        assert child.pid in tree.cpu_seconds()
        own = psutil.Process(child.pid).memory_info().rss
        assert own >= SIZE and tree.rss_bytes() >= own  # its 200 MiB are in the tree's resident set
    finally:
        child.kill()
        child.wait()
    assert child.pid not in tree.cpu_seconds()  # gone since the listing: skipped, no error
    tree._listed = -float("inf")
    assert child.pid not in [p.pid for p in tree.members()] and before[0] == tree.members()[0].pid
