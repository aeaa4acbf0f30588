"""The ``report`` command: ``register(app)`` adds it to tunebench's CLI."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated

import typer

from tunebench.commands.options import argument, option
from tunebench.commands.store import StoreOpt
from tunebench.errors import InputError
from tunebench.inputs import Count, OutputFile, TextFile
from tunebench.paths import output_errors, write_atomic
from tunebench.secrets import mask_secrets


def report(
    space: Annotated[
        Path | None,
        argument(TextFile, "SPACE", help="Space file (YAML): report only its points (default: every result)."),
    ] = None,
    store: StoreOpt = None,
    output: Annotated[Path, option(OutputFile, "--output", "-o", help="The HTML file to write.")] = Path("report.html"),
    series: Annotated[
        int | None,
        option(
            Count,
            "--series",
            metavar="RESULT_ID",
            help="Draw this result's time series (utilisation, memory "
            "with the predicted peak, loss); default: the latest result of the report that has them.",
        ),
    ] = None,
) -> None:
    """Write one self-contained HTML report (plots, table, environment) of the stored results; opens offline."""
    from tunebench.report import build_report
    from tunebench.store.open import open_store
    from tunebench.store.series import UnknownResult

    if importlib.util.find_spec("plotly") is None:
        raise InputError("report", "needs plotly, which is not installed: pip install 'tunebench[plot]'")
    sample_store = open_store(store, create=False)
    try:
        text = build_report(sample_store, space=space, series=series)  # bad input raises before anything is written
    except UnknownResult as exc:
        raise InputError(
            "--series", f"no result {series} in {mask_secrets(sample_store.url)}", allowed=exc.allowed()
        ) from None
    finally:
        sample_store.close()
    with output_errors("--output", output):
        write_atomic(output, text)
    typer.echo(f"report -> {output} ({len(text.encode()) / 1e6:.1f} MB)")


def register(app: typer.Typer) -> None:
    """Add `report` to a Typer app."""
    app.command("report")(report)
