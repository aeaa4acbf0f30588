"""The import graph of src/tunebench keeps the layers docs/architecture.md draws.

Data flows one way (command -> spec -> actuator -> result -> store -> report); a package imports only
packages of its own layer or below. Every import counts, at module level or inside a function: a
function-level import against the flow is still a dependency, only a later one. The command-line
layer (typer, rich) is `tunebench.commands` alone.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tunebench

SRC = Path(tunebench.__file__).parent

# Lowest first: a unit may import units of its own layer or of a layer above it in this list.
# Same as the diagram in docs/architecture.md ("Packages and the two data paths").
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__init__", "errors", "units", "paths", "secrets", "inputs", "limits", "yamlfile", "logs"),
    ("catalog",),
    ("datasets",),
    ("spec",),
    ("training",),
    ("worker",),
    ("engines",),
    ("store",),
    ("plan",),
    ("actuators",),
    ("executors",),
    ("track",),
    ("explore",),
    ("report",),
    ("api",),
    ("commands", "__main__"),
)
LAYER = {unit: n for n, units in enumerate(LAYERS) for unit in units}
# Known edges against the layers, each with why and what removes it (docs/architecture.md lists them too).
# A new one fails the test until it is fixed or added here with its reason.
EXCEPTIONS: dict[tuple[str, str], str] = {}
# Only the command-line layer prints to a terminal or parses a command line.
CLI_LIBRARIES = ("typer", "click", "rich")


def unit_of(module: str) -> str:
    """The layer unit of a dotted module name inside tunebench: its package, or its module at the top."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("__version__", "__all__"):  # tunebench itself, or a name of its __init__
        return "__init__"
    return parts[1]


def imports(path: Path, module: str) -> list[tuple[str, int]]:
    """(imported module, line) of every import statement in the file, relative imports resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name == "tunebench":  # from tunebench import x: x is the unit
                out += [(f"tunebench.{alias.name}", node.lineno) for alias in node.names]
            else:
                out.append((name, node.lineno))
    return out


def modules(root: Path = SRC) -> list[tuple[Path, str]]:
    out = []
    for path in sorted(root.rglob("*.py")):
        parts = ("tunebench", *path.relative_to(root).with_suffix("").parts)
        out.append((path, ".".join(parts[:-1] if parts[-1] == "__init__" else parts)))
    return out


def violations(root: Path = SRC) -> list[str]:
    """One line per import against the layers, or of a command-line library outside tunebench.commands."""
    found = []
    for path, module in modules(root):
        unit = unit_of(module)
        if unit not in LAYER:
            found.append(f"{module}: not placed in a layer (add it to LAYERS and docs/architecture.md)")
            continue
        for name, line in imports(path, module):
            where = f"{path.relative_to(root.parent)}:{line}"
            top = name.split(".")[0]
            if top in CLI_LIBRARIES and unit != "commands":
                found.append(f"{where}: {module} imports {name}; only tunebench.commands may")
            if top != "tunebench" or name == "tunebench":
                continue
            target = unit_of(name)
            if (module, name) in EXCEPTIONS:
                continue
            if target != unit and LAYER.get(target, len(LAYERS)) > LAYER[unit]:
                found.append(f"{where}: {module} ({unit}) imports {name} ({target}), a layer above it")
    return found


def test_every_import_keeps_the_layers():
    assert violations() == []


def test_an_import_against_the_flow_is_found(tmp_path):
    """The check itself: a copy of the package with one upward import added fails it, naming the line."""
    import shutil

    copy = tmp_path / "tunebench"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__", "*.json", "*.gz"))
    target = copy / "spec" / "validity.py"
    target.write_text(target.read_text() + "\n\ndef _late():\n    from tunebench.store import Store  # noqa\n")
    rich = copy / "plan" / "memory.py"
    rich.write_text(rich.read_text() + "\nimport rich  # noqa\n")
    found = violations(copy)
    assert any("spec/validity.py" in v and "tunebench.store (store), a layer above it" in v for v in found), found
    assert any("plan/memory.py" in v and "imports rich; only tunebench.commands may" in v for v in found), found
    assert len(found) == 2


@pytest.mark.parametrize("unit", sorted({unit_of(m) for _, m in modules()}))
def test_every_unit_is_placed(unit):
    assert unit in LAYER, f"{unit}: add it to LAYERS (tests/test_layers.py) and docs/architecture.md"
