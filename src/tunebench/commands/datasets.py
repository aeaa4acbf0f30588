"""``tunebench datasets``: list, generate and count the tokens of the artificial data sets.

Bad input (unknown id or model, a max length below 1, a data set too large for this machine) raises
InputError before anything is written: tunebench's main prints one line and exits with code 2.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from tunebench import paths
from tunebench.commands.options import argument, option
from tunebench.commands.terminal import Column, print_table
from tunebench.datasets.generate import dataset_path, ensure_dataset, generate_dataset, read_manifest, verify
from tunebench.datasets.ids import KNOWN_DATASET_IDS, DatasetId, parse_dataset_id
from tunebench.inputs import Count, OutputDir, Text
from tunebench.paths import output_errors

log = logging.getLogger(__name__)

app = typer.Typer(help="Artificial data sets of the SFTTrainer spec and their token counts.", no_args_is_help=True)

# what `datasets list` shows, most important first (the highest priority is left out first when narrow)
COLUMNS = (Column("id"), Column("kind", 4), Column("entries", 1, justify="right"),
           Column("each entry", 3, wrap=True, min_width=16), Column("file"))  # fmt: skip

DirOption = option(OutputDir, "--dir", help="Data directory (default: TUNEBENCH_DATA_DIR or <home>/data).")
DatasetArg = Annotated[str, argument(str, "DATASET_ID", help="Data set id, e.g. news-tokens-16384plus-entries-4096.")]


def describe(spec: DatasetId) -> str:
    """One line on what each entry holds."""
    if spec.kind == "chars":
        return f"{spec.chars} chars input + {spec.chars} chars response + prompt"
    if spec.kind == "tokens":
        return f">= {spec.min_tokens} tokens (>= {spec.min_tokens} words of response)"
    return f"{spec.width}x{spec.height} JPEG + chat of >= {spec.min_tokens} tokens"


@app.command("list")
def list_cmd(
    data_dir: Annotated[Path | None, DirOption] = None,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """The data set ids of the SFTTrainer spec and whether their files are in the data directory."""
    rows = []
    for ds_id in KNOWN_DATASET_IDS:
        spec = parse_dataset_id(ds_id)
        m = read_manifest(spec, data_dir)
        path = dataset_path(spec, data_dir)
        present = m is not None and path.is_file() and path.stat().st_size == m.size_bytes
        rows.append(
            {
                "id": ds_id,
                "kind": spec.kind,
                "entries": spec.entries,
                "entry": describe(spec),
                "file": str(path) if present else None,
                "size_bytes": m.size_bytes if present else None,
            }
        )
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    table = [
        (
            r["id"],
            r["kind"],
            str(r["entries"]),
            r["entry"],
            f"{r['size_bytes'] / 1e6:.1f} MB" if r["size_bytes"] is not None else "-",
        )
        for r in rows
    ]
    console = Console()
    print_table(console, COLUMNS, table, title=f"data sets in {paths.data_dir(data_dir)}", more="--json shows them")
    console.print(
        "Other sizes: news-chars-N-entries-M, news-tokens-Kplus-entries-M, vision-WxH-Kplus-entries-M.", highlight=False
    )


@app.command()
def generate(
    dataset_id: DatasetArg,
    data_dir: Annotated[Path | None, DirOption] = None,
    force: bool = typer.Option(False, "--force", help="Rewrite even if a valid file exists."),
) -> None:
    """Generate a data set (or verify the existing file) and print its manifest."""
    spec = parse_dataset_id(dataset_id)
    t0 = time.perf_counter()
    where = paths.data_dir(data_dir)
    with output_errors(paths.data_dir_source(data_dir), where), ProgressBar(f"generating {spec.id}") as update:
        if force:
            generate_dataset(spec, data_dir, update)
        else:
            ensure_dataset(spec, data_dir, update)
    m = verify(spec, data_dir)
    if m is None:  # cannot happen unless the file changes under us
        typer.echo(f"error: {spec.id} failed verification after generation", err=True)
        raise typer.Exit(1)
    typer.echo(
        f"{dataset_path(spec, data_dir)}  {m.entries} entries  {m.size_bytes} bytes  "
        f"sha256 {m.sha256}  ({time.perf_counter() - t0:.1f} s)"
    )


@app.command()
def stats(
    dataset_id: DatasetArg,
    model: Annotated[str, option(Text, "--model", help="Catalog model name, or a local tokenizer/model directory.")],
    max_len: Annotated[int | None, option(Count, "--max-len", help="max_seq_length of the run in tokens.")] = None,
    data_dir: Annotated[Path | None, DirOption] = None,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Tokens per entry (min/avg/max) of a data set for a model, truncated at --max-len."""
    from tunebench.datasets.tokens import token_counts

    spec = parse_dataset_id(dataset_id)
    with ProgressBar(f"counting tokens of {spec.id}") as update:
        counts = token_counts(spec, model, max_seq_length=max_len, data_dir=data_dir, progress=update)
    s = counts.summary()
    if as_json:
        typer.echo(json.dumps(s, indent=1))
        return
    why = (
        "text only, no image tokens"
        if spec.is_vision and counts.source != "fallback"
        else {"fallback": "fallback rule", "offline": "stand-in tokenizer"}.get(counts.source, "")
    )
    exact = "exact" if counts.exact else f"not exact ({why})"
    typer.echo(
        f"{spec.id}: {s['entries']} entries, tokens per entry min {s['min_tokens']} "
        f"avg {s['avg_tokens']:.1f} max {s['max_tokens']} (max length {s['max_length'] or 'none'})"
    )
    typer.echo(
        f"tokenizer: {counts.tokenizer} [{counts.source}], {exact}; "
        f"{'from cache' if counts.from_cache else 'counted'} in {counts.seconds:.2f} s"
    )


class ProgressBar:
    """A rich progress bar fed by (done, total) callbacks: entries done of all, their rate, elapsed time and
    ETA; it appears once the work has taken SHOW_AFTER_S (quick calls print nothing), on a terminal; elsewhere
    (a pipe, a log file) a log line every LOG_EVERY_S says the same."""

    SHOW_AFTER_S = 2.0
    LOG_EVERY_S = 5.0  # off a terminal: a log line this often

    def __init__(self, label: str):
        self.label = label
        self.bar: Progress | None = None
        self.task = None

    def __enter__(self):
        console = Console(stderr=True)
        started = time.monotonic()

        last_log = [started]

        def update(done: int, total: int) -> None:
            elapsed = time.monotonic() - started
            if not console.is_terminal:  # piped or logged: a log line every LOG_EVERY_S (step, rate, ETA)
                now = time.monotonic()
                if now - last_log[0] >= self.LOG_EVERY_S or (done == total and elapsed >= self.SHOW_AFTER_S):
                    last_log[0] = now
                    rate = done / max(elapsed, 1e-9)
                    eta = f", ETA {(total - done) / rate:,.0f} s" if done < total and rate > 0 else ""
                    log.info(
                        "%s: %s of %s (%s entries/s%s)", self.label, f"{done:,}", f"{total:,}", f"{rate:,.0f}", eta
                    )
                return
            if self.bar is None and elapsed < self.SHOW_AFTER_S:
                return
            if self.bar is None:
                self.bar = Progress(
                    TextColumn(self.label),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TextColumn("{task.fields[rate]}"),
                    TimeElapsedColumn(),
                    TextColumn("ETA"),
                    TimeRemainingColumn(),
                    console=console,
                    transient=True,
                )
                self.bar.start()
                self.task = self.bar.add_task(self.label, total=total, rate="")
            self.bar.update(self.task, completed=done, total=total, rate=f"{done / elapsed:,.0f} entries/s")

        return update

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
