"""The code keeps the one formatter and linter configured in pyproject.toml ([tool.ruff]): `make lint`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from layout import REPO

RUFF = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")


@pytest.mark.parametrize("command", [["format", "--check"], ["check"]], ids=["format", "check"])
def test_ruff_passes(command):
    assert RUFF, "ruff is not installed (it is in the test extra: pip install -e '.[test]')"
    proc = subprocess.run(
        [RUFF, *command, "src", "tests", "benchmarks"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
