"""Command ``explore``: ``register(app)`` adds it to tunebench's CLI (the store's commands: commands/store.py).

Input errors raise ``InputError`` (tunebench's main prints one line and exits with code 2).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from tunebench.commands.options import argument, option
from tunebench.commands.store import StoreOpt
from tunebench.commands.track import TrackOpt
from tunebench.errors import InputError
from tunebench.inputs import Count, NonNegativeInt, OutputFile, Seconds, Text, TextFile

if TYPE_CHECKING:
    from tunebench.explore.explorer import Summary


def explore(
    space: Annotated[
        Path, argument(TextFile, "SPACE", help="Space file (YAML): experiments, entity_space, actuator, operation.")
    ],
    executor: Annotated[
        str | None,
        option(Literal["local", "ray"], "--executor", help="local or ray (default: the space file's, else local)."),
    ] = None,
    store: StoreOpt = None,
    max_parallel: Annotated[int | None, option(Count, "--max-parallel", help="Measurements in flight at once.")] = None,
    remeasure: Annotated[
        bool, typer.Option("--remeasure", help="Measure again points that already have results.")
    ] = False,
    max_retries: Annotated[
        int | None, option(NonNegativeInt, "--max-retries", help="Retries of a failed measurement.")
    ] = None,
    ray_address: Annotated[
        str | None, option(Text, "--ray-address", help="auto | ray://host:port (default: a local Ray).")
    ] = None,
    lease_seconds: Annotated[
        float | None, option(Seconds, "--lease-seconds", help="Claim lease, renewed while measuring.")
    ] = None,
    actuator: Annotated[
        str | None,
        option(
            Text,
            "--actuator",
            help="measure | predict (screen the space with the planner) | noop | a plugin's "
            "name | module:function (with --allow-actuator-import); default: the space file's.",
        ),
    ] = None,
    skip_predicted_oom: Annotated[
        bool, typer.Option("--skip-predicted-oom", help="Do not measure points the planner predicts will not fit.")
    ] = False,
    allow_actuator_import: Annotated[
        bool,
        typer.Option(
            "--allow-actuator-import",
            help="Let the actuator be any module:function, not only a registered one (it imports and runs that code).",
        ),
    ] = False,
    track: TrackOpt = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress (live or logged).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> int:
    """Measure the points of a space (grid, random or optimize); resumable by running it again.

    Progress: live in a terminal, else a log line per finished measurement and at least every 30 s.
    Exit code 1 when measurements failed (after their retries), 0 otherwise."""
    # over 60 lines only through its Typer options: the body is short
    from tunebench.explore.run import run_space
    from tunebench.explore.space import load_space

    spec = load_space(space)
    if actuator:
        spec = dataclasses.replace(spec, actuator=actuator)  # its own operation id: results never mix
    if track:
        from tunebench.track import parse_targets

        spec = dataclasses.replace(spec, track=parse_targets(track))  # instead of the space file's track:
    if skip_predicted_oom and spec.operation.sampler == "optimize":
        raise InputError("--skip-predicted-oom", "works with the grid and random samplers", allowed="grid, random")
    with _display(quiet) as display:
        summary = run_space(
            spec,
            store,
            executor=executor,
            ray_address=ray_address,
            max_parallel=max_parallel,
            max_retries=max_retries,
            lease_seconds=lease_seconds,
            remeasure=remeasure,
            skip_predicted_oom=skip_predicted_oom,
            allow_actuator_import=allow_actuator_import,
            on_progress=display.update,
            track_field="--track" if track else "track",
        )
    if as_json:
        typer.echo(json.dumps(summary.to_dict(), indent=1, default=str))
    else:
        print_summary(summary)
    if summary.tracked:
        print_tracked(summary.tracked)
    if summary.failed:  # after their retries: the exit code says so too
        typer.echo(
            f"{summary.failed} point(s) failed: tunebench show --operation {summary.operation_id} "
            "--where status=failed",
            err=True,
        )
        return 1
    return 0


def _display(quiet: bool) -> Any:
    """Where explore's progress goes: live in a terminal, a line per finished measurement (and every 30 s)
    in a log or a pipe, nowhere with --quiet or TUNEBENCH_QUIET."""
    from rich.console import Console

    from tunebench.commands.explore_progress import ProgressDisplay, ProgressLog
    from tunebench.logs import is_quiet

    quiet = quiet or is_quiet()
    console = Console(stderr=True)
    if not quiet and not console.is_terminal:
        return ProgressLog()
    return ProgressDisplay(console, enabled=not quiet)


def print_tracked(tracked: dict[str, Any]) -> None:
    """Where explore's results went (stderr, as `run`'s line: stdout may carry --json)."""
    failed = f", {tracked['failed']} failed (the warnings above say how to send them)" if tracked["failed"] else ""
    typer.echo(
        f"tracked in {tracked['trackers']} (experiment '{tracked['experiment']}'): {tracked['created']} runs "
        f"created, {tracked['present']} already there{failed}",
        err=True,
    )


def print_summary(summary: Summary) -> None:
    """What explore did, in a few lines."""
    typer.echo(
        f"{summary.operation_id}: {summary.done}/{summary.total} done — valid {summary.valid}, "
        f"invalid {summary.invalid} ({summary.rules} by rule), failed {summary.failed}; "
        f"measured {summary.measured} now, memoised {summary.memoised}, "
        f"retried {summary.retried}; {summary.elapsed_s:.1f} s"
    )
    if summary.skipped:
        typer.echo(f"{summary.skipped} point(s) not measured: the planner predicts they will not fit")
    if summary.elsewhere:
        typer.echo(f"{summary.elsewhere} point(s) are being measured by another explorer")
    if summary.best:
        typer.echo("best: " + json.dumps(summary.best, default=str))
    typer.echo(f"show them: tunebench show --operation {summary.operation_id}")


space_app = typer.Typer(help="Space files: ado's resources as a tunebench space.", no_args_is_help=True)


@space_app.command("from-ado")
def space_from_ado(
    # the files are read (and refused with their field) by read_text below
    space: Annotated[Path, argument(Path, "SPACE", help="ado discovery space (YAML): experiments, entitySpace.")],
    operation: Annotated[
        Path | None, option(Path, "--operation", help="ado operation (YAML): random_walk and its parameters.")
    ] = None,
    actuator_config: Annotated[
        Path | None,
        option(Path, "--actuator-config", help="ado actuator configuration (YAML): data_directory, model_map."),
    ] = None,
    output: Annotated[
        Path | None, option(OutputFile, "--output", "-o", help="Write the space file here (default stdout).")
    ] = None,
) -> None:
    """Convert ado's discovery space (with its operation and actuator configuration) to a tunebench space file."""
    import yaml

    from tunebench.explore.ado_space import from_ado
    from tunebench.explore.space import load_yaml, parse_space
    from tunebench.inputs import read_text

    docs = {}
    for name, path in (("SPACE", space), ("--operation", operation), ("--actuator-config", actuator_config)):
        if path is not None:
            docs[name] = load_yaml(read_text(path, name), str(path))
            if not isinstance(docs[name], dict):
                raise InputError(name, f"{path} is not a YAML mapping (an ado resource)")
    converted = from_ado(docs["SPACE"], docs.get("--operation"), docs.get("--actuator-config"))
    parse_space(converted)  # what explore will check: values in their domains, known experiments
    text = yaml.safe_dump(converted, sort_keys=False)
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.write_text(text)
        typer.echo(f"{output}: tunebench explore {output}", err=True)


def register(app: typer.Typer) -> None:
    """Add explore and space to a Typer app."""
    app.command("explore")(explore)
    app.add_typer(space_app, name="space")
