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


def _table_ends(tree) -> set[int]:
    """Last lines of module-level constant tables: UPPER_CASE = a dict, list, tuple, set or call."""
    import ast
    import re

    ends = set()
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        literal = isinstance(getattr(node, "value", None), (ast.Dict, ast.List, ast.Tuple, ast.Set, ast.Call))
        if names and literal and all(re.fullmatch(r"_?[A-Z][A-Z0-9_]*", n) for n in names):
            ends.add(node.end_lineno)
    return ends


def test_the_formatter_is_skipped_only_for_aligned_tables():
    """`# fmt: skip` only ends a module-level constant table (a column-aligned dict or list reads better)."""
    import ast

    found = []
    for path in sorted(p for d in ("src", "tests", "benchmarks") for p in (REPO / d).rglob("*.py")):
        text = path.read_text()
        if "# fmt: skip" not in text:
            continue
        ends = _table_ends(ast.parse(text))
        found += [
            f"{path.relative_to(REPO)}:{n}"
            for n, line in enumerate(text.splitlines(), 1)
            if line.rstrip().endswith("# fmt: skip") and n not in ends
        ]
    assert not found, "# fmt: skip outside a table: " + ", ".join(found[:20])
