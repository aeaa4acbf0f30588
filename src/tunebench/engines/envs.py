"""One Python environment per fms-hf-tuning version: built with uv on first use, checked before each use.

Layout: ``<root>/fms-hf-tuning-<version>[-plugins]/`` is a uv virtual environment (Python of the
project's own interpreter) holding the release with its own pinned transformers, trl, peft,
accelerate and datasets, plus ``tunebench-engine.json``, the manifest of what was installed.
``root()`` is TUNEBENCH_ENGINES_DIR, else ``<tunebench home>/engines``.

torch comes one of two ways (``TORCH_MODES``), recorded in the manifest and in every measurement:
- ``host`` (default): the project's own torch, linked in (a ``.pth`` file appends a folder of links to
  the host's torch and its dependencies, after the environment's own packages). On a CPU machine
  this is the CPU build; the spec's pinned torch releases are multi-GB CUDA builds.
- ``pinned``: the torch release the SFTTrainer spec pins for the version (engines.versions.pinned_torch),
  installed by uv from the package index.

A build happens in a temporary folder and is renamed into place only after its check passed, under a
file lock, so a half-built environment is never used. ``status`` re-checks a ready one (every
recorded package present at its version, torch and fms-hf-tuning importable); a broken one is
removed and rebuilt by ``ensure``.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tunebench import paths
from tunebench.engines import MANIFEST, RECORDED
from tunebench.engines.versions import check_version, exclude_newer, pinned_torch, requirements
from tunebench.errors import InputError
from tunebench.paths import home

SCHEMA = 1
TORCH_MODES = ("host", "pinned")
HOST_LINKS = "host-packages"  # folder of links to the host's torch (torch mode "host")
# uv overrides that drop a requirement (a marker that never holds): torch comes from the host.
HOST_TORCH_OVERRIDES = ('torch ; sys_platform == "never"', 'torchvision ; sys_platform == "never"',
                        'triton ; sys_platform == "never"')  # fmt: skip
CHECK_SECONDS = 120.0

Progress = Callable[[str], None]


class EngineError(RuntimeError):
    """An environment that cannot be built or used (the reason says which step failed)."""


@dataclass(frozen=True)
class Engine:
    """A ready environment of one fms-hf-tuning version."""

    version: str
    plugins: bool
    path: Path
    manifest: dict

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"


def root() -> Path:
    """TUNEBENCH_ENGINES_DIR (InputError naming it when a file is in the way), else <home>/engines."""
    return paths.env_dir("TUNEBENCH_ENGINES_DIR") or home() / "engines"


def env_name(version: str, plugins: bool) -> str:
    return f"fms-hf-tuning-{version}" + ("-plugins" if plugins else "")


def env_path(version: str, plugins: bool) -> Path:
    return root() / env_name(version, plugins)


def _uv() -> str:
    try:
        from uv import find_uv_bin
    except ImportError:
        raise EngineError("the fms-hf-tuning engine builds its environments with uv: pip install 'tunebench[engines]'")
    return find_uv_bin()


def status(version: str, plugins: bool = False) -> tuple[str, str | None]:
    """('ready' | 'missing' | 'broken', why it is broken)."""
    path = env_path(check_version(version), plugins)
    if not path.exists():
        return "missing", None
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        return "broken", f"no readable manifest ({type(exc).__name__}): the build did not finish"
    if manifest.get("schema") != SCHEMA or manifest.get("version") != version:
        return "broken", f"manifest is for {manifest.get('version')!r}, schema {manifest.get('schema')!r}"
    wanted = requirements(version, plugins)
    if manifest.get("requirements") != wanted:  # e.g. a plugins environment built before a plugin was added
        missing = sorted(set(wanted) - set(manifest.get("requirements") or []))
        return "broken", f"built for other requirements (now also {', '.join(missing) or 'changed'})"
    if manifest.get("torch_mode") == "host" and manifest["packages"].get("torch") != _host_torch_version():
        return "broken", f"linked torch {manifest['packages'].get('torch')} is not the host's {_host_torch_version()}"
    try:
        found = _probe(path / "bin" / "python", list(manifest["packages"]))
    except EngineError as exc:
        return "broken", str(exc)
    changed = {k: (v, found.get(k)) for k, v in manifest["packages"].items() if found.get(k) != v}
    if changed:
        return "broken", "packages changed since the build: " + ", ".join(
            f"{k} {a} -> {b}" for k, (a, b) in changed.items()
        )
    return "ready", None


def ensure(version: str, plugins: bool = False, torch: str = "host", progress: Progress | None = None) -> Engine:
    """The ready environment of a version, built (or rebuilt, if broken) first when needed."""
    say = progress or (lambda _m: None)
    with _locked(env_name(check_version(version), plugins)):
        state, why = status(version, plugins)
        if state == "broken":
            say(f"{env_name(version, plugins)} is broken ({why}): rebuilding")
            shutil.rmtree(env_path(version, plugins))
        if state != "ready":
            build(version, plugins, torch, say)
        path = env_path(version, plugins)
        return Engine(version, plugins, path, json.loads((path / MANIFEST).read_text()))


def build(version: str, plugins: bool, torch: str, say: Progress) -> None:
    """Build the environment in a temporary folder, check it, then rename it into place (caller holds the lock)."""
    if torch not in TORCH_MODES:
        raise InputError("torch", f"unknown torch mode {torch!r}", allowed=", ".join(TORCH_MODES))
    final = env_path(version, plugins)
    for stale in final.parent.glob(f".build-{final.name}-*"):  # a killed build's leftovers (we hold the lock)
        shutil.rmtree(stale, ignore_errors=True)
    tmp = final.with_name(f".build-{final.name}-{os.getpid()}")
    started = time.monotonic()
    try:
        say(f"creating {final.name} (Python {sys.version.split()[0]})")
        _run([_uv(), "venv", "--quiet", "--relocatable", "--python", sys.executable, str(tmp)], "uv venv")
        python = tmp / "bin" / "python"
        reqs = requirements(version, plugins)
        cmd = [
            _uv(),
            "pip",
            "install",
            "--quiet",
            "--python",
            str(python),
            "--exclude-newer",
            exclude_newer(version),
            *reqs,
        ]
        if torch == "host":
            overrides = tmp / "tunebench-overrides.txt"
            overrides.write_text("\n".join(HOST_TORCH_OVERRIDES) + "\n")
            cmd += ["--override", str(overrides)]
        else:
            cmd.append(f"torch=={pinned_torch(version)}")
        say(f"installing {' '.join(reqs[:-3])} with uv")  # fms-hf-tuning and its plugins (not the sampler's three)
        _run(cmd, "uv pip install")
        if torch == "host":
            _link_host_torch(tmp)
        say("checking the environment")
        packages = _probe(python, list(RECORDED))
        manifest = {
            "schema": SCHEMA,
            "version": version,
            "plugins": plugins,
            "torch_mode": torch,
            "python": sys.version.split()[0],
            "requirements": reqs,
            "exclude_newer": exclude_newer(version),
            "packages": {k: v for k, v in packages.items() if v is not None},
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "build_seconds": round(time.monotonic() - started, 1),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    say(f"{final.name} ready in {time.monotonic() - started:.1f} s ({disk_gib(final):.2f} GiB)")


def remove(version: str, plugins: bool = False) -> bool:
    """Delete a version's environment; False if there was none."""
    path = env_path(check_version(version), plugins)
    with _locked(path.name):
        if not path.exists():
            return False
        shutil.rmtree(path)
        return True


def installed() -> list[tuple[str, bool, Path]]:
    """(version, plugins, path) of every environment folder under root(), ready or not."""
    out = []
    for path in sorted(root().glob("fms-hf-tuning-*")):
        rest = path.name.removeprefix("fms-hf-tuning-")
        version, plugins = rest.removesuffix("-plugins"), rest.endswith("-plugins")
        out.append((version, plugins, path))
    return out


def disk_gib(path: Path) -> float:
    """Bytes of the files under path (links not followed; hard links counted once), in GiB."""
    seen, total = set(), 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            st = os.lstat(os.path.join(dirpath, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total / 2**30


# ----------------------------------------------------------------------------- helpers

_PROBE = """
import importlib.metadata as m, json, sys
out = {}
for name in json.loads(sys.argv[1]):
    try:
        out[name] = m.version(name)
    except m.PackageNotFoundError:
        out[name] = None
import torch, transformers, peft, accelerate, datasets, tuning  # importable, not only installed
print(json.dumps(out))
"""


def _probe(python: Path, packages: list[str]) -> dict[str, str | None]:
    """Versions of packages as the environment's interpreter sees them; EngineError if it cannot import them."""
    if not python.exists():
        raise EngineError(f"{python} does not exist")
    try:
        proc = subprocess.run(
            [str(python), "-c", _PROBE, json.dumps(packages)],
            capture_output=True,
            text=True,
            timeout=CHECK_SECONDS,
            env=_clean_env(),
        )
    except subprocess.TimeoutExpired:
        raise EngineError(f"checking the environment took over {CHECK_SECONDS:.0f} s") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise EngineError(f"its interpreter cannot import the engine: {last}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _clean_env() -> dict[str, str]:
    """This process's environment without PYTHONPATH (the project's packages must not leak in)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_clean_env())
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise EngineError(f"{what} failed (exit {proc.returncode}): " + " | ".join(lines[-6:]))


def _host_torch_version() -> str | None:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def _link_host_torch(env: Path) -> None:
    """Link the host's torch, its installed dependencies and torchvision into env/host-packages, and
    append that folder to the environment's sys.path (after its own packages: theirs win)."""
    from packaging.requirements import Requirement

    links = env / HOST_LINKS
    links.mkdir()
    todo, done = ["torch", "torchvision"], set()
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in done:
            continue
        done.add(name)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for top in _top_level(dist):
            target = links / top.name
            if not target.exists():
                target.symlink_to(top)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    site = next((env / "lib").glob("python3*/site-packages"))
    (site / "zz-tunebench-host-torch.pth").write_text(os.path.relpath(links, site) + "\n")


def _top_level(dist: importlib.metadata.Distribution) -> Iterator[Path]:
    """The top-level entries (packages, modules, dist-info) a distribution installed into site-packages."""
    base = Path(str(dist.locate_file("")))
    seen = set()
    for file in dist.files or []:
        first = file.parts[0]
        if first in seen or first == ".." or first.endswith(".data") or first == "__pycache__":
            continue
        seen.add(first)
        path = base / first
        if path.exists():
            yield path


@contextmanager
def _locked(name: str) -> Iterator[None]:
    """An exclusive lock per environment (two measurements never build the same one at once)."""
    root().mkdir(parents=True, exist_ok=True)
    with open(root() / f".{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
