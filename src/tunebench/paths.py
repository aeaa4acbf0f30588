"""Where tunebench keeps its files.

TUNEBENCH_HOME overrides the root (default: the user's cache directory, via platformdirs);
data sets live in ``<home>/data`` unless TUNEBENCH_DATA_DIR or a CLI option says otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def home() -> Path:
    """Root of tunebench's files."""
    env = os.environ.get("TUNEBENCH_HOME")
    return Path(env).expanduser() if env else Path(platformdirs.user_cache_dir("tunebench"))


def data_dir(override: str | os.PathLike | None = None) -> Path:
    """Directory of generated data sets, absolute (it is passed to the worker, which may run elsewhere)."""
    if override:
        return Path(override).expanduser().absolute()
    env = os.environ.get("TUNEBENCH_DATA_DIR")
    return Path(env).expanduser().absolute() if env else home().absolute() / "data"
