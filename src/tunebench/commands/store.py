"""The store's commands ``show``, ``import``, ``export`` and ``operations``.

``register(app)`` adds the commands to tunebench's CLI. Input errors raise ``InputError``
(tunebench's main prints one line and exits with code 2).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from tunebench.commands.options import Check, argument, option
from tunebench.errors import InputError, one_of, suggest
from tunebench.inputs import Count, InputFile, OutputFile, Text, TextFile
from tunebench.paths import atomic_path, output_errors, write_atomic
from tunebench.secrets import mask_secrets
from tunebench.store.open import open_store

if TYPE_CHECKING:
    from tunebench.spec.experiments import Entity, Experiment
    from tunebench.spec.results import Result
    from tunebench.store import Store
    from tunebench.store.rows import Outcomes

StoreOpt = Annotated[
    str | None,
    option(
        str,
        "--store",
        help="Store URL (any SQLAlchemy URL) or SQLite file; default $TUNEBENCH_STORE or the user data dir. "
        "Commands that only read (show, export, report) open it read-only and never create one: a missing store, "
        "or a database without one, is an error; explore, run and import create it.",
    ),
]
SpaceOpt = Annotated[Path | None, option(TextFile, "--space", help="Rows matching the points of this space file.")]
OperationOpt = Annotated[str | None, option(Text, "--operation", help="Rows of this operation (op-...).")]
MEASURE, ALL = "measure", "all"  # export's default actuator (measurements only), and every actuator


def show(
    space: SpaceOpt = None,
    operation: OperationOpt = None,
    fmt: Annotated[
        str, option(Literal["table", "csv", "json", "parquet"], "--format", "-f", help="table | csv | json | parquet")
    ] = "table",
    output: Annotated[Path | None, option(OutputFile, "--output", "-o", help="Write to this file.")] = None,
    store: StoreOpt = None,
    actuator: Annotated[
        str | None,
        option(
            Text,
            "--actuator",
            help="Only results of this actuator (measure, predict, ...); all: every actuator's (the default).",
        ),
    ] = None,
    where: Annotated[
        list[str] | None,
        option(
            str,
            "--where",
            "-w",
            help="Keep rows where NAME OP VALUE holds (OP: = != < <= > >=), e.g. "
            "batch_size>=4, status=valid; repeatable (all must hold).",
        ),
    ] = None,
    sort: Annotated[
        str | None, option(str, "--sort", "-s", help="Order rows by a column: NAME, NAME:asc or NAME:desc.")
    ] = None,
    top: Annotated[
        int | None,
        option(
            Count,
            "--top",
            help="Only the first N rows after sorting (default order: the highest dataset_tokens_per_second).",
        ),
    ] = None,
    limit: Annotated[
        int, option(Count, "--limit", help="Rows of a table (terminal or file); csv, json and parquet hold every row.")
    ] = 50,
    show_all: Annotated[
        bool, typer.Option("--all", "-a", help="Every row in the table, not only the first --limit.")
    ] = False,
    every: Annotated[
        bool,
        typer.Option(
            "--repeats",
            "-r",
            help="Every result as its own row (repeats, re-runs, imports), "
            "oldest first, instead of one row per entity x experiment with their mean and -std.",
        ),
    ] = False,
    wide: Annotated[
        bool, typer.Option("--wide", help="Every column in full (a table fits the terminal's width otherwise).")
    ] = False,
    series: Annotated[
        int | None,
        option(
            Count,
            "--series",
            metavar="RESULT_ID",
            help="The time series of one result (per GPU, process and "
            "training step; the result_id column of --format csv|json): a line per series at the "
            "terminal, every point with --format csv|json.",
        ),
    ] = None,
) -> None:
    """Stored results, one row per entity x experiment (the mean of its repeats, with their count and
    standard deviation): constitutive columns, actuator, measured columns."""
    from tunebench.commands.tables import render
    from tunebench.store.query import select_rows
    from tunebench.store.tables import build

    if series is not None:
        others = {
            "--space": space,
            "--operation": operation,
            "--actuator": actuator,
            "--where": where,
            "--sort": sort,
            "--top": top,
            "--repeats": every,
        }
        _show_series(store, series, fmt, output, wide, [name for name, value in others.items() if value])
        return
    if fmt == "parquet" and output is None:
        raise InputError("--output", "parquet needs a file: --output FILE.parquet")
    wanted = None if actuator == ALL else actuator
    sample_store = open_store(store, create=False)
    try:
        _check_actuator(sample_store, wanted)
        outcomes, columns, title = _select(sample_store, space, operation, wanted, every_result=every)
        repeats = (
            None
            if every
            else sample_store.repeats(
                None if space is None and operation is None else list(outcomes.columns["request_id"])
            )
        )
        others = _other_actuators(sample_store, space, operation, wanted, every) if not outcomes.count else []
    finally:
        sample_store.close()
    table = select_rows(build(outcomes, constitutive=columns, repeats=repeats), where or (), sort, top)
    empty = _no_results(sample_store.url, operation, space, actuator, where)
    hints = [
        f"{n} rows of actuator {a}:\n  tunebench show{_command(store, space, operation)} --actuator {a}"
        for a, n in others
    ]
    if hints:
        empty = "\n".join([empty + "; the same selection has", *hints])
    with output_errors("--output", output) if output else contextlib.nullcontext():
        render(table, fmt, output, limit=None if show_all else limit, title=title, empty=empty, wide=wide)
    if not len(table) and (fmt != "table" or output):  # a file or csv/json of headers only: say why
        typer.echo(empty, err=True)


def _show_series(
    store: str | None, result_id: int, fmt: str, output: Path | None, wide: bool, others: list[str]
) -> None:
    """`show --series RESULT_ID`: the library reads (tunebench.store.series); this prints."""
    from tunebench.store import series as store_series

    if others:
        raise InputError(
            others[0],
            f"--series shows one result's time series, not a selection of rows: leave out {', '.join(others)}",
            allowed="--store, --format, --output, --wide",
        )
    if fmt == "parquet":
        raise InputError("--format", "--series writes a table, csv or json, not parquet", allowed="table, csv, json")
    sample_store = open_store(store, create=False)
    try:
        info = sample_store.result_info(result_id)
        frame = store_series.read_series(sample_store, result_id)
    except store_series.UnknownResult as exc:
        raise InputError(
            "--series", f"no result {result_id} in {mask_secrets(sample_store.url)}", allowed=exc.allowed()
        ) from None
    finally:
        sample_store.close()
    empty = store_series.no_series_reason(info) if frame.empty else None
    buffer = io.StringIO()
    if fmt in ("csv", "json"):
        store_series.write(frame, fmt, buffer)
    elif empty is None:
        _print_series(frame, info, buffer if output else None, wide)
    if output:
        with output_errors("--output", output):
            write_atomic(output, buffer.getvalue() or (empty + "\n"))
    else:
        sys.stdout.write(buffer.getvalue())
    if empty is not None:
        typer.echo(empty, err=fmt != "table" or output is not None)


def _print_series(frame: Any, info: dict[str, Any], file: io.StringIO | None, wide: bool) -> None:
    """One line per series: points, time span, min, mean, max and last value."""
    from rich.console import Console

    from tunebench.commands.terminal import Column, print_table
    from tunebench.store.series import summary

    def number(value: float | None) -> str:
        return "" if value is None else f"{value:.6g}"

    columns = [
        Column("series", breaks=True, min_width=20),
        Column("points", 1, justify="right"),
        Column("from_s", 4, justify="right"),
        Column("to_s", 2, justify="right"),
        *(
            Column(name, {"min": 1, "mean": 0, "max": 1, "last": 3}[name], justify="right")
            for name in ("min", "mean", "max", "last")
        ),
    ]
    rows = [[r["series"], f"{r['points']:,}", *(number(r[c.header]) for c in columns[2:])] for r in summary(frame)]
    title = (
        f"result {info['result_id']} ({info['actuator']}, {info['status']}): {info['experiment_id']} "
        f"{info['entity_id']}"
    )
    console = Console(file=file) if file is not None else Console()
    print_table(console, columns, rows, title=title, wide=wide, more="--wide or --format csv|json shows them")
    console.print(f"{len(frame):,} points in {len(rows)} series; --format csv|json lists every point", highlight=False)


def _other_actuators(
    store: Store, space: Path | None, operation: str | None, actuator: str | None, every: bool
) -> list[tuple[str, int]]:
    """(actuator, rows) of the actuators other than the one asked for that the same selection finds."""
    asked = actuator if actuator is not None or space is None else None  # --space alone: the space's actuator
    out = []
    for other in sorted(store.actuators()):
        if other == asked:
            continue
        outcomes, _, _ = _select(store, space, operation, other, every_result=every)
        if outcomes.count:
            out.append((other, outcomes.count))
    return out


def _command(store: str | None, space: Path | None, operation: str | None) -> str:
    """The options of a show command that selects the same rows (the store's URL masked)."""
    import shlex

    parts = [
        ("--store", mask_secrets(store) if store else None),
        ("--space", str(space) if space else None),
        ("--operation", operation),
    ]
    return "".join(f" {name} {shlex.quote(value)}" for name, value in parts if value)


def _no_results(
    url: str, operation: str | None, space: Path | None, actuator: str | None, where: list[str] | None
) -> str:
    """The line an empty table prints: which store, and what was asked for."""
    asked = [
        f"operation {operation}" if operation else "",
        f"space {space}" if space else "",
        f"actuator {actuator}" if actuator else "",
        *(f"where {w}" for w in where or ()),
    ]
    asked = [a for a in asked if a]
    return f"no results in {mask_secrets(url)}" + (f" ({', '.join(asked)})" if asked else "")


def import_csv(
    file: Annotated[
        Path,
        argument(
            InputFile,
            "FILE",
            help="CSV: ado's `show measurements -o csv` (either --property-format), or "
            "LLMFineTuningBench's ado-sfttrainer.csv; or ado's SQLite sample store (its local.db).",
        ),
    ],
    store: StoreOpt = None,
    skip_bad_rows: Annotated[
        bool, typer.Option("--skip-bad-rows", help="Import the rows tunebench understands, skip the others.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Load measurements of the reference system; they count for memoisation and calibration."""
    from tunebench.store.csvio import read_import, write_import

    records, summary = read_import(file, skip_bad_rows=skip_bad_rows)  # bad input: nothing is written
    sample_store = open_store(store)
    try:
        summary = write_import(sample_store, records, summary)
    finally:
        sample_store.close()
    if as_json:
        typer.echo(json.dumps(summary.to_dict(), indent=1))
        return
    read = summary.rows - sum(summary.skipped.values())
    repeats = f" holding {summary.results} results (ado's repeats, one each)" if summary.results != read else ""
    typer.echo(
        f"{file.name}: {summary.rows} rows{repeats}, {summary.added} added ({summary.valid} valid, {summary.invalid} "
        f"invalid in the file), {summary.already_present} already in the store"
    )
    for reason, n in summary.skipped.most_common():
        typer.echo(f"  skipped {n}: {reason}")
    if summary.ignored_columns:
        typer.echo("  ignored columns: " + ", ".join(summary.ignored_columns))


def export(
    fmt: Annotated[
        str,
        option(
            Literal["ado-csv", "ado"],
            "--format",
            "-f",
            help="ado-csv (the reference's `show measurements -o csv`) | ado (a "
            "folder ado loads: a discovery space and every result; docs/ado.md).",
        ),
    ] = "ado-csv",
    output: Annotated[  # as typed: a file path's trailing '/' (a directory) is checked below, Path would drop it
        str | None,
        option(
            str,
            "--output",
            "-o",
            help="Write to this file (default stdout); --format ado: this folder.",
            metavar="PATH",
        ),
    ] = None,
    space: SpaceOpt = None,
    operation: OperationOpt = None,
    store: StoreOpt = None,
    actuator: Annotated[
        str,
        option(
            Text,
            "--actuator",
            help="Results of this actuator: measure (the default: measurements only), "
            "predict, ..., or all. Each row names its actuator: the prefix of its experiment_id "
            "(SFTTrainer. for measurements, as ado writes them; predict. for predictions).",
        ),
    ] = MEASURE,
) -> None:
    """Write valid and invalid measurements in the reference's CSV layout (other actuators' results when asked)."""
    from tunebench.store import INVALID, VALID
    from tunebench.store.tables import build, write_csv

    if fmt == "ado":  # --output is a folder
        _export_ado(Check(Path, "--output")(output), space, operation, None if actuator == ALL else actuator, store)
        return
    file = Check(OutputFile, "--output")(output)  # ado-csv: --output is a file
    wanted = None if actuator == ALL else actuator
    sample_store = open_store(store, create=False)
    try:
        _check_actuator(sample_store, actuator, ALL)
        outcomes, _, _ = _select(sample_store, space, operation, wanted, statuses=[VALID, INVALID])
    finally:
        sample_store.close()
    table = build(outcomes, ado=True)
    if file:
        with output_errors("--output", file), atomic_path(file) as tmp, tmp.open("w", newline="") as out:
            write_csv(table, out)
        typer.echo(f"{len(table)} rows -> {file}", err=True)
    else:
        write_csv(table, sys.stdout)
    if not len(table) and actuator == MEASURE:
        typer.echo(
            "no measurements to export; --actuator all (or predict, ...) exports the other actuators' "
            "results, each labelled with its actuator",
            err=True,
        )


def _export_ado(
    folder: Path | None, space: Path | None, operation: str | None, actuator: str | None, store: str | None
) -> None:
    """`export --format ado`: the folder ado loads, and the commands that load it."""
    from tunebench.store.ado_export import LOADER, export_ado

    if folder is None:
        raise InputError("--output", "--format ado writes a folder: --output DIR")
    if folder.exists() and not folder.is_dir():
        raise InputError("--output", f"{folder} is a file; --format ado writes a folder")
    sample_store = open_store(store, create=False)
    try:
        outcomes, _, _ = _select(sample_store, space, operation, actuator, every_result=True)
        ids = sorted(set(outcomes.columns["request_id"]))
        n_exp, n_results = export_ado(sample_store, folder, request_ids=ids, actuator=actuator)
    finally:
        sample_store.close()
    typer.echo(
        f"{n_results} results of {n_exp} experiments -> {folder}/space.yaml, {folder}/results.jsonl\n"
        f"load them in ado:\n  ado create space -f {folder}/space.yaml\n"
        f"  <ado's python> {LOADER} {folder} <the space's identifier>",
        err=True,
    )


def _select(
    store: Store,
    space: Path | None,
    operation: str | None,
    actuator: str | None,
    statuses: list[str] | None = None,
    every_result: bool = False,
) -> tuple[Outcomes, list[str], str | None]:
    """(Store.table outcomes, constitutive columns, title) for --space, --operation or the whole store
    (every_result: each stored result, not only each request's latest)."""
    from tunebench.store.rows import Selection

    if space and operation:
        raise InputError("--space", "give --space or --operation, not both")
    if operation:
        op = store.operation(operation)
        if op is None:
            known = [o["id"] for o in store.operations()]
            raise InputError(
                "--operation",
                f"no operation {operation!r} in {mask_secrets(store.url)}",
                allowed=one_of(known) or "none yet",
            )
        dims = list((op["space"] or {}).get("entity_space", {}))
        outcomes = store.table(
            Selection(operation_id=operation, actuator=actuator, statuses=statuses, every_result=every_result)
        )
        return outcomes, dims, f"{operation} ({op['sampler']})"
    if space:
        from tunebench.explore.space import load_space

        spec = load_space(space)
        points = [
            (e.id, n.id) for e, n, _ in spec.points(field="--space", instead=f"use --operation {spec.operation_id}")
        ]
        ids = store.request_ids(points, actuator=actuator or spec.actuator)
        outcomes = store.table(
            Selection(request_ids=[ids[p] for p in points if p in ids], statuses=statuses, every_result=every_result)
        )
        return outcomes, [d.name for d in spec.dimensions], f"{space} ({outcomes.count} of {len(points)} points)"
    return store.table(Selection(actuator=actuator, statuses=statuses, every_result=every_result)), [], None


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


def run_store(url: str | None, no_store: bool) -> str | None:
    """The store `tunebench run` records its result in, checked before measuring; None with --no-store
    (InputError with --store too, as calibrate says)."""
    if no_store and url:
        raise InputError("--no-store", "give --store URL or --no-store, not both")
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
        result_id = sample_store.record_one(
            Record(experiment, entity, result, actuator=result.actuator, generator="run")
        )
    series = f"; tunebench show --series {result_id} shows its time series" if result.series else ""
    typer.echo(
        f"stored in {mask_secrets(url)} as result {result_id} (tunebench show --store ...{series}; "
        "--no-store skips this)",
        err=True,
    )


def operations(
    store: StoreOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    wide: Annotated[bool, typer.Option("--wide", help="Every column in full.")] = False,
) -> None:
    """The store's operations (explore runs and imports), oldest first: id, sampler, actuator, name, points
    by status, runs and when each was created (`show --operation ID` shows its rows)."""
    import datetime

    from rich.console import Console

    from tunebench.commands.terminal import Column, print_table
    from tunebench.store import STATES

    sample_store = open_store(store, create=False)
    try:
        ops = [(op, sample_store.counts(op["id"])) for op in sample_store.operations()]
    finally:
        sample_store.close()
    rows = [
        {
            "id": op["id"],
            "sampler": op["sampler"],
            "actuator": op["actuator"],
            "name": op["name"],
            "points": sum(counts.values()),
            **{s: counts.get(s, 0) for s in STATES},
            "runs": op["runs"],
            "created_at": datetime.datetime.fromtimestamp(op["created_at"]).isoformat(" ", "minutes"),
            "created_by": op["created_by"],
        }
        for op, counts in ops
    ]
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    if not rows:
        typer.echo(f"no operations in {mask_secrets(sample_store.url)} (tunebench explore SPACE creates one)")
        return
    columns = [
        Column("id"),
        Column("sampler", 2),
        Column("actuator", 1, shrink=True, min_width=8),
        Column("name", 4, shrink=True, min_width=10),
        Column("points", justify="right"),
        *(Column(s, {"valid": 0, "failed": 0, "invalid": 2}.get(s, 3), justify="right") for s in STATES),
        Column("runs", 5, justify="right"),
        Column("created_at"),
        Column("created_by", 6, shrink=True),
    ]
    print_table(
        Console(),
        columns,
        [[str(r[c.header] if r[c.header] is not None else "-") for c in columns] for r in rows],
        title=f"operations in {mask_secrets(sample_store.url)}",
        wide=wide,
        more="--wide or --json shows them",
    )


def register(app: typer.Typer) -> None:
    """Add show, operations, import and export to a Typer app."""
    app.command("show")(show)
    app.command("operations")(operations)
    app.command("import")(import_csv)
    app.command("export")(export)
