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
