"""Shared test setup: tunebench's files go to a per-session temporary home, never the user's; the
fake actuators of tests/fake_actuators.py are importable here, in subprocesses and in Ray workers.

Skip policy: tests never skip silently. The only skip allowed is a test marked ``gpu`` on a machine
without an NVIDIA GPU (NVML finds none); every other skip, including a module that skips at import,
is turned into a failure that names the reason. ``-ra`` (pyproject's addopts) prints the skips.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
if TESTS not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH")) if p)

NO_GPU_REASON = "needs an NVIDIA GPU: NVML finds none on this machine (run with pytest -m gpu where one exists)"


def nvidia_gpu_count() -> int:
    """NVIDIA GPUs the driver reports (NVML, independent of torch's build); 0 without a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver, no library: a CPU machine
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


HAVE_GPU = nvidia_gpu_count() > 0


# A test that uses one of these fixtures gets the marker: what it needs is what it asks for.
FIXTURE_MARKERS = {
    "postgres_server": "postgres",  # a real PostgreSQL server (initdb + pg_ctl)
    "browser": "browser",  # Debian's Chromium driven by playwright
    "engines_dir": "engines",  # builds an fms-hf-tuning environment from the package index with uv
    "ado": "engines",  # builds IBM ado's environment from the package index with uv
}


def _needs(item) -> set[str]:
    needs = {marker for fixture, marker in FIXTURE_MARKERS.items() if fixture in getattr(item, "fixturenames", ())}
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("any_store_url") == "postgresql":
        needs.add("postgres")
    return needs


def pytest_configure(config):
    """Under pytest-xdist, each worker's share of the cores as its threads (OMP_NUM_THREADS, inherited by the
    workers and the training processes they start): two trainings of 2 OpenMP threads each on the 2-core
    CI machine spin against each other (the end-to-end measurement took 60 s alone and 229 s beside
    another test's training). A value already set is kept."""
    workers = getattr(config.option, "numprocesses", None)
    if isinstance(workers, int) and workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // workers))


# The files that take longest (seconds of one test worker in `make test` on the 2-core VM, 2026-11-25, shipped
# trace profiles, one thread per worker), run first: `--dist loadfile` hands files out in collection order, and
# a long file handed out last keeps one worker busy while the other waits (longest first: the LPT schedule).
LONGEST_FIRST = (
    "store/test_ado.py",  # 180 s: IBM ado's environment built with uv, its operations
    "track/test_track.py",  # 140 s: MLflow (embedded and a server) and Aim
    "engines/test_fms.py",  # 135 s: fms-hf-tuning environments built with uv, trained in
    "actuators/test_measure.py",  # 110 s
    "explore/test_e2e.py",  # 95 s: the minimal space measured for real
    "executors/test_ray.py",  # 80 s: a local Ray cluster, two-node runs
    "plan/test_predict.py",  # 60 s
    "commands/test_plan.py",  # 55 s
    "worker/test_process.py",  # 55 s
    "commands/test_demo.py",  # 30 s
)


def _file_rank(item) -> int:
    try:
        path = Path(str(item.fspath)).resolve().relative_to(TESTS).as_posix()
    except ValueError:  # an item outside tests/ (a path given on the command line, a doctest)
        return len(LONGEST_FIRST)
    return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config, items):
    """Markers from the fixtures a test uses (`make test-fast` leaves those tests out); the longest files
    first (LONGEST_FIRST); tests marked gpu are skipped (and reported) where no NVIDIA GPU exists."""
    for item in items:
        for marker in sorted(_needs(item) - {m.name for m in item.iter_markers()}):
            item.add_marker(getattr(pytest.mark, marker))
    items.sort(key=_file_rank)  # stable: the other files, and the tests within a file, keep their order
    if HAVE_GPU:
        return
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=NO_GPU_REASON))


def _reason(longrepr) -> str:
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


def _allowed_skip(item) -> bool:
    return "gpu" in item.keywords and not HAVE_GPU


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A skip outside the gpu marker (or of a gpu test on a GPU machine) is reported as a failure."""
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and not hasattr(rep, "wasxfail") and not _allowed_skip(item):
        reason = _reason(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = f"skipped outside the gpu marker (tests never skip silently): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A module that skips while being imported (pytest.skip, importorskip) is a collection error."""
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped:
        reason = _reason(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = f"{collector.nodeid} skipped at import (tests never skip silently): {reason}"


@pytest.fixture(autouse=True, scope="session")
def _tunebench_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("tunebench-home")
    old = {
        k: os.environ.get(k)
        for k in ("TUNEBENCH_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
    }
    os.environ["TUNEBENCH_HOME"] = str(home)
    # Nothing in the tests may download from the Hugging Face hub.
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ[key] = "1"
    yield home
    for key, value in old.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def postgres_server():
    """A real PostgreSQL server for this test session (started on first use, stopped at the end).

    Without PostgreSQL installed the tests that need it fail in CI (CI=true) and are skipped with
    this reason elsewhere (`pytest -ra` lists them)."""
    from postgres_server import binaries, start_server

    if binaries() is None:
        why = "PostgreSQL is not installed (Debian: apt-get install -y postgresql); .ci/run installs it"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    server = start_server()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def any_store_url(request, tmp_path):
    """The URL of a new empty store: an SQLite file, then a database on the session's PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return request.getfixturevalue("postgres_server").fresh_database()
