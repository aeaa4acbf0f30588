"""Shared test setup: tunebench's files go to a per-session temporary home, never the user's; the
fake actuators of tests/fake_actuators.py are importable here, in subprocesses and in Ray workers."""

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


@pytest.fixture(autouse=True, scope="session")
def _tunebench_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("tunebench-home")
    old = {k: os.environ.get(k) for k in ("TUNEBENCH_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")}
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
