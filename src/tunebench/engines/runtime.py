"""How the measuring actuator starts an engine's processes: which interpreter, which environment variables.

The native engine runs under the actuator's own interpreter. The fms-hf-tuning engine runs under the
interpreter of the entity's ``fms_hf_tuning_version`` environment (built on first use, checked
before every use: tunebench.engines.envs), with only tunebench itself added to its path: a folder
holding one link to this tunebench package goes on PYTHONPATH, so the engine's transformers, peft,
trl and accelerate are the ones that run, never the project's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tunebench
from tunebench.engines import FMS, NATIVE


@dataclass(frozen=True)
class Runtime:
    """The interpreter and extra environment of an engine's processes, and what the result records of it."""

    python: str
    env: dict[str, str] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)


def runtime(engine: str, values: dict[str, Any], out_dir: Path, progress: Callable[[str], None] | None) -> Runtime:
    """The runtime of a measurement of these effective values (fms-hf-tuning: its environment, ready)."""
    if engine == NATIVE:
        version = values.get("fms_hf_tuning_version")
        note = f"fms-hf-tuning {version} did not run: the native engine trains with tunebench's worker"
        return Runtime(sys.executable, {}, {"name": NATIVE, "fms_hf_tuning_version": note})
    if engine != FMS:
        raise ValueError(f"unknown engine {engine!r}")
    from tunebench.engines import envs
    from tunebench.engines.versions import plugins_used

    ready = envs.ensure(values["fms_hf_tuning_version"], plugins=bool(plugins_used(values)), progress=progress)
    path = out_dir / "tunebench-path"
    path.mkdir(parents=True, exist_ok=True)
    link = path / "tunebench"
    if not link.exists():
        link.symlink_to(Path(tunebench.__file__).parent, target_is_directory=True)
    manifest = ready.manifest
    facts = {
        "name": FMS,
        "version": manifest["version"],
        "plugins": manifest["plugins"],
        "torch_mode": manifest["torch_mode"],
        "packages": manifest["packages"],
        "environment": str(ready.path),
    }
    env = {"PYTHONPATH": str(path), "PYTHONNOUSERSITE": "1", "TUNEBENCH_HOST_PYTHON": sys.executable}
    return Runtime(str(ready.python), env, facts)
