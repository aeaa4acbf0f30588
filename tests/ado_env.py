"""The real IBM ado for the tests: ado-core and ado-sfttrainer in their own environment, built with uv.

ado is never one of tunebench's dependencies: its environment (about 1 GB: Ray, Aim, pandas) is built
once per test session from the package index, as the fms-hf-tuning engine's are (uv's cache makes a
rebuild take seconds). ``--exclude-newer`` holds every package at the day after ado-sfttrainer 1.8.12
was published: the environment ado's developers had (typer 0.28, published later, breaks ado-core
2.3.0's CLI: ``AttributeError: 'str' object has no attribute 'value'`` on ``ado create``).
TUNEBENCH_ADO_ENV names an environment that is already built (a developer's; it is then used as is).

``build_with_tunebench`` adds tunebench itself (this source tree, built as a wheel, with the CPU torch
the tests run with): ado then loads tunebench's actuator plugin (entry point ado.actuators).

Every ado command runs with HOME in a folder of the test's own (ado keeps its contexts and its SQLite
metastore under ~/.config/ado), and without tunebench's PYTHONPATH.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ADO_PACKAGES = ("ado-core==2.3.0", "ado-sfttrainer==1.8.12")
EXCLUDE_NEWER = "2026-10-23T00:00:00Z"  # ado-sfttrainer 1.8.12 was published on 2026-10-22
TIMEOUT = 600


def build(path: Path, extra: tuple[str, ...] = ()) -> Path:
    """A uv environment at path holding ado (and extra requirements); returns its bin folder."""
    from uv import find_uv_bin

    env = clean_env()
    if not (path / "bin" / "python").exists():
        subprocess.run([find_uv_bin(), "venv", "--quiet", "--python", sys.executable, str(path)], check=True, env=env)
    cmd = [
        find_uv_bin(),
        "pip",
        "install",
        "--quiet",
        "--python",
        str(path / "bin" / "python"),
        "--exclude-newer",
        EXCLUDE_NEWER,
        *ADO_PACKAGES,
        *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=TIMEOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"installing ado failed: {proc.stderr[-2000:]}")
    return path / "bin"


def build_with_tunebench(path: Path) -> Path:
    """An ado environment with tunebench installed in it (its ado.actuators plugin); its bin folder.

    torch is this interpreter's build (the CPU one), found where pip finds it (PIP_FIND_LINKS);
    boto3 >= 1: under --exclude-newer uv resolves aim's unpinned boto3 to 0.0.3 (Python 2 only), which
    accelerate imports (through transformers' model configurations, which the planner reads).
    """
    import importlib.metadata

    root = Path(__file__).resolve().parents[1]
    links = [a for link in os.environ.get("PIP_FIND_LINKS", "").split() for a in ("--find-links", link)]
    return build(path, (str(root), f"torch=={importlib.metadata.version('torch')}", "boto3>=1", *links))


def clean_env(home: Path | None = None) -> dict[str, str]:
    """This process's environment without tunebench's PYTHONPATH (and with HOME, where given)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    if home is not None:
        env["HOME"] = str(home)
    env.setdefault("COLUMNS", "200")  # ado's rich output: one line per message
    # ado's ray.init() would join any Ray cluster running on the machine (a parallel test's, found through
    # /tmp/ray): RAY_ADDRESS=local makes it start its own
    env["RAY_ADDRESS"] = "local"
    return env


@dataclass
class Ado:
    """ado's commands in one environment, with one HOME (one local context, one SQLite metastore)."""

    bin: Path
    home: Path

    def run(self, *args: str, cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [str(self.bin / "ado"), *args],
            capture_output=True,
            text=True,
            cwd=cwd,
            env=clean_env(self.home),
            timeout=TIMEOUT,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"ado {' '.join(args)} failed ({proc.returncode}): {proc.stdout[-1500:]}{proc.stderr[-3000:]}"
            )
        return proc

    def python(self, script: Path, *args: str, cwd: Path | None = None) -> str:
        """Run a script with ado's Python; its stdout."""
        proc = subprocess.run(
            [str(self.bin / "python"), str(script), *args],
            capture_output=True,
            text=True,
            cwd=cwd,
            env=clean_env(self.home),
            timeout=TIMEOUT,
        )
        if proc.returncode != 0:
            raise AssertionError(f"{script} failed ({proc.returncode}): {proc.stderr[-3000:]}")
        return proc.stdout

    def create(self, kind: str, path: Path) -> str:
        """`ado create KIND -f PATH`; the new resource's identifier."""
        proc = self.run("create", kind, "-f", str(path))
        out = proc.stdout + proc.stderr
        found = re.search(r"identifier:?\s+(\S+)", out)
        assert found, f"no identifier in ado's answer: {out}"
        return found.group(1)


def ado_bin(tmp_root: Path) -> Path:
    """The bin folder of an ado environment: TUNEBENCH_ADO_ENV's, else one built under tmp_root."""
    given = os.environ.get("TUNEBENCH_ADO_ENV")
    if given:
        return Path(given) / "bin"
    return build(tmp_root / "ado-env")
