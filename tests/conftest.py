"""Shared test setup: tunebench's files go to a per-session temporary home, never the user's."""

from __future__ import annotations

import os

import pytest


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
