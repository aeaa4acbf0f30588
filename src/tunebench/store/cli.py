"""The store's commands ``show``, ``import`` and ``export``, and ``open_store`` that every command uses.

``register(app)`` adds the commands to tunebench's CLI. Input errors raise ``InputError``
(tunebench's main prints one line and exits with code 2).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from tunebench.errors import InputError, one_of, suggest
from tunebench.inputs import Options, OutputFile, Text, TextFile, parse
from tunebench.paths import atomic_path, output_errors
from tunebench.secrets import mask_secrets

if TYPE_CHECKING:
    from tunebench.explore.samplers import Point
    from tunebench.spec.experiments import Entity, Experiment
    from tunebench.spec.results import Result
    from tunebench.explore.space import Space
    from tunebench.store import Store
    from tunebench.store.rows import Outcomes

StoreOpt = Annotated[
    str | None,
    typer.Option(
        "--store", help="Store URL (any SQLAlchemy URL) or SQLite file; default $TUNEBENCH_STORE or the user data dir. "
        "Commands that only read (show, export, report) open it read-only and never create one: a missing store, "
        "or a database without one, is an error; explore, run and import create it.",
    ),
]
SpaceOpt = Annotated[Path | None, typer.Option("--space", help="Rows matching the points of this space file.")]
OperationOpt = Annotated[str | None, typer.Option("--operation", help="Rows of this operation (op-...).")]
MEASURE, ALL = "measure", "all"  # export's default actuator (measurements only), and every actuator


def open_store(url: str | None, *, create: bool = True) -> Store:
    """The store at url (default: $TUNEBENCH_STORE, else the user's); InputError if it cannot be used.

    create=False (commands that only read): the store is opened read-only; one that does not exist, or a
    database without one (empty, or another program's tables), is an error, not a new empty store.
    """
    from sqlalchemy.exc import ArgumentError, DatabaseError

    from tunebench.store import SchemaError, Store
    from tunebench.store.db import check_location, store_url

    target = store_url(url)
    check_location(target, create=create)
    try:
        return Store(target, readonly=not create)
    except (ArgumentError, DatabaseError, SchemaError) as exc:
        why = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        raise InputError("--store", f"cannot open the store {mask_secrets(target)}: {mask_secrets(why)}") from None
    except ModuleNotFoundError as exc:  # e.g. a PostgreSQL URL without its driver
        raise InputError("--store", f"the store's database driver is not installed: {exc}") from None


class ShowOptions(Options):
    """Options of `show` (and, with its one format, of `export`)."""

    NAMES = {"fmt": "--format"}
    fmt: Literal["table", "csv", "json", "parquet"]
    output: OutputFile | None
    space: TextFile | None
    operation: Text | None
    actuator: Text | None


class ExportOptions(ShowOptions):
    fmt: Literal["ado-csv"]


class ImportOptions(Options):
    NAMES = {"file": "FILE"}
    file: TextFile


def show(
    space: SpaceOpt = None,
    operation: OperationOpt = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table | csv | json | parquet")] = "table",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file.")] = None,
    store: StoreOpt = None,
    actuator: Annotated[
        str | None, typer.Option("--actuator", help="Only results of this actuator (measure, predict, ...).")
    ] = None,
    where: Annotated[
        list[str] | None,
        typer.Option("--where", "-w", help="Keep rows where NAME OP VALUE holds (OP: = != < <= > >=), e.g. "
                     "batch_size>=4, status=valid; repeatable (all must hold)."),
    ] = None,
    sort: Annotated[
        str | None, typer.Option("--sort", "-s", help="Order rows by a column: NAME, NAME:asc or NAME:desc.")
    ] = None,
    top: Annotated[
        int | None,
        typer.Option("--top", min=1, help="Only the first N rows after sorting (default order: the highest "
                     "dataset_tokens_per_second)."),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="Rows of a table (terminal or file); csv, json and parquet hold every row.")] = 50,
    show_all: Annotated[bool, typer.Option("--all", "-a", help="Every row in the table, not only the first --limit.")] = False,
) -> None:
    """Stored results, one row per entity x experiment: constitutive columns, actuator, measured columns."""
    from tunebench.store.query import select_rows
    from tunebench.store.tables import build, render

    parse(ShowOptions, fmt=fmt, output=output, space=space, operation=operation, actuator=actuator)
    if fmt == "parquet" and output is None:
        raise InputError("--output", "parquet needs a file: --output FILE.parquet")
    sample_store = open_store(store, create=False)
    try:
        _check_actuator(sample_store, actuator)
        outcomes, columns, title = _select(sample_store, space, operation, actuator)
    finally:
        sample_store.close()
    table = select_rows(build(outcomes, constitutive=columns), where or (), sort, top)
    with output_errors("--output", output) if output else contextlib.nullcontext():
        render(table, fmt, output, limit=None if show_all else limit, title=title,
               empty=_no_results(sample_store.url, operation, space, actuator, where))  # fmt: skip


def _no_results(url: str, operation: str | None, space: Path | None, actuator: str | None, where: list[str] | None) -> str:
    """The line an empty table prints: which store, and what was asked for."""
    asked = [f"operation {operation}" if operation else "", f"space {space}" if space else "",
             f"actuator {actuator}" if actuator else "", *(f"where {w}" for w in where or ())]  # fmt: skip
    asked = [a for a in asked if a]
    return f"no results in {mask_secrets(url)}" + (f" ({', '.join(asked)})" if asked else "")


def import_csv(
    file: Annotated[
        Path, typer.Argument(help="CSV: ado's `show measurements -o csv`, or LLMFineTuningBench's ado-sfttrainer.csv.")
    ],
    store: StoreOpt = None,
    skip_bad_rows: Annotated[
        bool, typer.Option("--skip-bad-rows", help="Import the rows tunebench understands, skip the others.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Load measurements of the reference system; they count for memoisation and calibration."""
    from tunebench.store.csvio import read_import, write_import

    parse(ImportOptions, file=file)
    records, summary = read_import(file, skip_bad_rows=skip_bad_rows)  # bad input: nothing is written
    sample_store = open_store(store)
    try:
        summary = write_import(sample_store, records, summary)
    finally:
        sample_store.close()
    if as_json:
        typer.echo(json.dumps(summary.to_dict(), indent=1))
        return
    typer.echo(
        f"{file.name}: {summary.rows} rows, {summary.added} added ({summary.valid} valid, {summary.invalid} invalid "
        f"in the file), {summary.already_present} already in the store"
    )
    for reason, n in summary.skipped.most_common():
        typer.echo(f"  skipped {n}: {reason}")
    if summary.ignored_columns:
        typer.echo("  ignored columns: " + ", ".join(summary.ignored_columns))


def export(
    fmt: Annotated[
        str, typer.Option("--format", "-f", help="ado-csv (the reference's `show measurements -o csv`).")
    ] = "ado-csv",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file (default stdout).")] = None,
    space: SpaceOpt = None,
    operation: OperationOpt = None,
    store: StoreOpt = None,
    actuator: Annotated[
        str,
        typer.Option("--actuator", help="Results of this actuator: measure (the default: measurements only), "
                     "predict, ..., or all. Each row names its actuator: the prefix of its experiment_id "
                     "(SFTTrainer. for measurements, as ado writes them; predict. for predictions)."),
    ] = MEASURE,
) -> None:
    """Write valid and invalid measurements in the reference's CSV layout (other actuators' results when asked)."""
    from tunebench.store import INVALID, VALID
    from tunebench.store.tables import build, write_csv

    parse(ExportOptions, fmt=fmt, output=output, space=space, operation=operation, actuator=actuator)
    wanted = None if actuator == ALL else actuator
    sample_store = open_store(store, create=False)
    try:
        _check_actuator(sample_store, actuator, ALL)
        outcomes, _, _ = _select(sample_store, space, operation, wanted, statuses=[VALID, INVALID])
    finally:
        sample_store.close()
    table = build(outcomes, ado=True)
    if output:
        with output_errors("--output", output), atomic_path(output) as tmp, tmp.open("w", newline="") as out:
            write_csv(table, out)
        typer.echo(f"{len(table)} rows -> {output}", err=True)
    else:
        write_csv(table, sys.stdout)
    if not len(table) and actuator == MEASURE:
        typer.echo("no measurements to export; --actuator all (or predict, ...) exports the other actuators' "
                   "results, each labelled with its actuator", err=True)  # fmt: skip


def _select(
    store: Store, space: Path | None, operation: str | None, actuator: str | None, statuses: list[str] | None = None
) -> tuple[Outcomes, list[str], str | None]:
    """(Store.table outcomes, constitutive columns, title) for --space, --operation or the whole store."""
    from tunebench.store.rows import Selection

    if space and operation:
        raise InputError("--space", "give --space or --operation, not both")
    if operation:
        op = store.operation(operation)
        if op is None:
            known = [o["id"] for o in store.operations()]
            raise InputError(
                "--operation", f"no operation {operation!r} in {mask_secrets(store.url)}", allowed=one_of(known) or "none yet"
            )
        dims = list((op["space"] or {}).get("entity_space", {}))
        outcomes = store.table(Selection(operation_id=operation, actuator=actuator, statuses=statuses))
        return outcomes, dims, f"{operation} ({op['sampler']})"
    if space:
        from tunebench.explore.space import load_space

        spec = load_space(space)
        points = [(e.id, n.id) for e, n, _ in _space_points(spec)]
        ids = store.request_ids(points, actuator=actuator or spec.actuator)
        outcomes = store.table(Selection(request_ids=[ids[p] for p in points if p in ids], statuses=statuses))
        return outcomes, [d.name for d in spec.dimensions], f"{space} ({outcomes.count} of {len(points)} points)"
    return store.table(Selection(actuator=actuator, statuses=statuses)), [], None


def _check_actuator(store: Store, actuator: str | None, *also: str) -> None:
    """InputError (--actuator) unless actuator is None, a registered actuator, one with requests in the
    store (a plugin's, a module:function) or one of also: a misspelt name is an error, not an empty table."""
    from sqlalchemy import select

    from tunebench.actuators.registry import registered_actuators
    from tunebench.store import db
    from tunebench.store.schema import requests

    if actuator is None or actuator in also:
        return
    with db.read(store.engine) as conn:
        stored = set(conn.execute(select(requests.c.actuator).distinct()).scalars())
    known = sorted({*registered_actuators(), *stored})
    if actuator not in known:
        hint = suggest(actuator, known)
        message = f"no actuator {actuator!r} in {mask_secrets(store.url)}" + (f".{hint}" if hint else "")
        raise InputError("--actuator", message, allowed=one_of([*known, *also]))


MAX_SHOW_POINTS = 200_000


def _space_points(spec: Space) -> list[Point]:
    """Every point of a space to look up: the sampled ones, or the whole grid for optimize."""
    from tunebench.explore.samplers import point, sample

    if spec.operation.sampler != "optimize":
        return sample(spec)
    if spec.size * len(spec.experiments) > MAX_SHOW_POINTS:
        raise InputError("--space", f"the space has {spec.size:,} entities; use --operation {spec.operation_id}")
    return [point(e, spec.entity_values(i)) for i in range(spec.size) for e in spec.experiments]


def run_store(url: str | None, no_store: bool) -> str | None:
    """The store `tunebench run` records its result in, checked before measuring; None with --no-store."""
    if no_store:
        return None
    from tunebench.store.db import check_location, store_url

    target = store_url(url)
    check_location(target, create=True)
    return target


def record_run(url: str, experiment: Experiment, entity: Entity, result: Result) -> None:
    """Store the result of `tunebench run` as a measurement (memoised for explore; read by plan --compare,
    calibrate and show), and say where it went."""
    from tunebench.store.rows import Record

    with open_store(url) as sample_store:
        sample_store.record_many([Record(experiment, entity, result, actuator=result.actuator, generator="run")])
    typer.echo(f"stored in {mask_secrets(url)} (tunebench show --store ...; --no-store skips this)", err=True)


def register(app: typer.Typer) -> None:
    """Add show, import and export to a Typer app."""
    app.command("show")(show)
    app.command("import")(import_csv)
    app.command("export")(export)
