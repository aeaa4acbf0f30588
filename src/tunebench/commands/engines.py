"""`tunebench engines list | install | remove`: the fms-hf-tuning environments on this machine."""

from __future__ import annotations

import json
from typing import Annotated, Literal

import typer
from rich.console import Console
from rich.table import Table

from tunebench.commands.options import argument, option
from tunebench.engines import envs
from tunebench.engines.versions import NEWEST, VERSIONS, check_version, exclude_newer
from tunebench.errors import InputError

app = typer.Typer(help="fms-hf-tuning environments: one per version, built with uv on first use.", no_args_is_help=True)
console = Console(stderr=True)

# each version is checked against the spec's list by check_version (field fms_hf_tuning_version)
Versions = Annotated[list[str] | None, argument(str, "VERSION...", help=f"fms-hf-tuning versions (default: {NEWEST}).")]
Plugins = Annotated[bool, typer.Option("--plugins", help="With the fms-acceleration plugins (foak, moe, peft).")]


def _versions(versions: list[str] | None, published: bool = False) -> list[str]:
    """The versions asked for (InputError for an unknown one, or with published one never on the index)."""
    out = [check_version(v) for v in (versions or [NEWEST])]
    if published:
        for version in out:
            exclude_newer(version)
    return out


@app.command("list")
def list_cmd(
    available: Annotated[bool, typer.Option("--available", help="Every version tunebench can install.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """The environments under the engines folder, their state and what they hold."""
    rows = []
    for version, plugins, path in envs.installed():
        try:
            state, why = envs.status(version, plugins)
        except InputError:
            state, why = "broken", "not a version tunebench knows"
        manifest = _manifest(path)
        rows.append(
            {
                "version": version,
                "plugins": plugins,
                "state": state,
                "why": why,
                "path": str(path),
                "packages": manifest.get("packages", {}),
                "torch_mode": manifest.get("torch_mode"),
                "disk_gib": round(envs.disk_gib(path), 3),
            }
        )
    if as_json:
        typer.echo(json.dumps({"root": str(envs.root()), "environments": rows, "versions": list(VERSIONS)}, indent=2))
        return
    if available:
        typer.echo("installable fms-hf-tuning versions: " + ", ".join(VERSIONS))
    table = Table(title=f"engines in {envs.root()}")
    for column in ("version", "plugins", "state", "torch", "transformers", "peft", "trl", "GiB"):
        table.add_column(column)
    for r in rows:
        p = r["packages"]
        state = r["state"] + (f" ({r['why']})" if r["why"] else "")
        table.add_row(
            r["version"],
            "yes" if r["plugins"] else "no",
            state,
            f"{p.get('torch', '?')} ({r['torch_mode']})",
            p.get("transformers", "?"),
            p.get("peft", "?"),
            p.get("trl", "?"),
            f"{r['disk_gib']:.2f}",
        )
    Console().print(table if rows else f"no environments in {envs.root()} (tunebench engines install VERSION)")


def _manifest(path) -> dict:
    try:
        return json.loads((path / envs.MANIFEST).read_text())
    except (OSError, ValueError):
        return {}


@app.command()
def install(
    versions: Versions = None,
    plugins: Plugins = False,
    torch: Annotated[
        str,
        option(
            Literal[envs.TORCH_MODES],
            "--torch",
            help="host: the project's torch, linked in; pinned: the spec's pin (CUDA, GBs).",
        ),
    ] = "host",  # type: ignore[valid-type]
    rebuild: Annotated[bool, typer.Option("--rebuild", help="Remove and build again even if ready.")] = False,
) -> None:
    """Build (or check) the environment of each version; a broken one is rebuilt."""
    for version in _versions(versions, published=True):
        if rebuild:
            envs.remove(version, plugins)
        with console.status(f"fms-hf-tuning {version}") as status:
            engine = envs.ensure(version, plugins, torch, progress=lambda m: (status.update(m), console.log(m)))
        packages = engine.manifest["packages"]
        typer.echo(
            f"fms-hf-tuning {version}: ready at {engine.path} ("
            + ", ".join(f"{k} {v}" for k, v in packages.items())
            + ")"
        )


@app.command()
def remove(versions: Versions = None, plugins: Plugins = False) -> None:
    """Delete the environment of each version."""
    for version in _versions(versions):
        gone = envs.remove(version, plugins)
        typer.echo(f"fms-hf-tuning {version}: " + ("removed" if gone else "not installed"))
