"""How `show` and `export` write a table of results: at the terminal's width, or as CSV, JSON or Parquet
(the table itself is built by tunebench.store.tables)."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import IO, Any

from rich.console import Console

from tunebench.commands.terminal import Column
from tunebench.commands.terminal import print_table as print_fitted
from tunebench.spec.measured import REPORT_ORDER, shown_columns
from tunebench.store.tables import TABLE_MEASURED, Table, cell_text, write_csv, write_json, write_parquet


def print_table(
    table: Table,
    *,
    limit: int | None = 50,
    title: str | None = None,
    file: IO[str] | None = None,
    empty: str = "no results",
    wide: bool = False,
) -> None:
    """A terminal table: constitutive columns, actuator, status, is_valid, throughput, time and memory.

    limit: the rows shown (None: every row); a note under the table says how many were left out.
    An empty table prints the line empty instead of a table of headers. Fitted to the terminal
    (tunebench.commands.terminal): a column with one value in every row is named once in the title, the least
    important columns are left out when narrow, model names shortened in the middle; wide: all in full.
    """
    console = Console(file=file or sys.stdout)
    if not len(table):
        console.print(empty, highlight=False, soft_wrap=True)  # a command in it stays on one line
        return
    cols = table.columns
    start = cols.index("experiment_id")
    end = len(cols)
    for name in REPORT_ORDER + ("is_valid",):
        if name in cols:
            end = min(end, cols.index(name))
    shown = len(table) if limit is None else min(limit, len(table))
    keys = ["experiment_id", *cols[start + 1 : end]]
    same = (
        []
        if wide or shown < 2
        else [n for n in keys if len({_short(v) for v in table.data[cols.index(n)][:shown]}) == 1]
    )
    if "experiment_id" not in same and len(set(table.data[start][:shown])) == 1:
        same.insert(0, "experiment_id")  # one experiment: name it once, above the table
    fixed = ", ".join(  # an empty value named as '-' (not 'gpu_model , fast_kernels ,')
        _short(table.data[start][0]) if n == "experiment_id" else f"{n} {_short(table.data[cols.index(n)][0]) or '-'}"
        for n in same
    )
    title = " — ".join(t for t in (title, fixed) if t) or None
    measured = (TABLE_MEASURED[0], f"{TABLE_MEASURED[0]}-std", *TABLE_MEASURED[1:])  # the throughput's spread too
    wanted = [n for n in keys if n not in same] + ["status"]
    gpus = table.data[cols.index("number_gpus")][:shown] if "number_gpus" in cols and not wide else ()
    wanted += shown_columns([n for n in ("is_valid", *measured) if n in cols], gpus)  # wide: every column
    if wide or "reason" in cols and any(table.data[cols.index("reason")][:shown]):
        wanted.append("reason")  # no reason column when no row has one
    wanted.append("result_id")  # what show --series takes
    index = [cols.index(n) for n in wanted if n in cols]
    columns = [_column(cols[i], cols[i] in keys[1:5]) for i in index]
    rows = [[_short(row[i]) for i in index] for row in zip(*(column[:shown] for column in table.data))]
    print_fitted(console, columns, rows, title=title, wide=wide, more="show --wide shows them")
    if shown < len(table):
        console.print(
            f"showing {shown:,} of {len(table):,} rows: {len(table) - shown:,} more not shown "
            "(--all shows every row; --limit N, --top N, --where; --format csv|json|parquet hold every row)",
            highlight=False,
        )


# what show leaves out first on a narrow terminal (0: never): spreads and flags, then memory and time
SHOW_PRIORITY = {"experiment_id": 1, "actuator": 2, "reason": 2, "result_id": 2, "is_valid": 5, f"{TABLE_MEASURED[0]}-std": 4,
                 "train_runtime": 3, "cpu_memory_utilization": 4, "gpu_memory_utilization_peak": 4}  # fmt: skip


def _column(name: str, identifies: bool) -> Any:
    """How show prints the column name: ids shortened in the middle, the reason wrapped, numbers right."""
    if name in ("experiment_id", "model_name"):
        return Column(name, SHOW_PRIORITY.get(name, 0), shrink=True, min_width=16)
    if name == "reason":
        return Column(name, SHOW_PRIORITY[name], wrap=True, min_width=16)
    numeric = name in TABLE_MEASURED or name.endswith("-std")
    priority = SHOW_PRIORITY.get(
        name, 0 if identifies or name in ("status", TABLE_MEASURED[0]) else 3 if numeric else 1
    )
    return Column(name, priority, justify="right" if numeric else "left", breaks=True, min_width=4)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return cell_text(value)


def render(
    table: Table,
    fmt: str,
    output: str | Path | None = None,
    *,
    limit: int | None = 50,
    title: str | None = None,
    empty: str = "no results",
    wide: bool = False,
) -> None:
    """Write a table as fmt to output (a file, replaced only once complete: tunebench.paths.atomic_path)
    or stdout; parquet needs a file."""
    from tunebench.paths import atomic_path, write_atomic

    if fmt == "parquet":
        if not output:
            raise ValueError("parquet needs --output FILE")
        with atomic_path(output) as tmp:
            write_parquet(table, tmp)
        return
    if fmt == "table" and not output:
        print_table(table, limit=limit, title=title, empty=empty, wide=wide)
        return
    buffer = io.StringIO()
    if fmt == "csv":
        write_csv(table, buffer)
    elif fmt == "json":
        write_json(table, buffer)
    else:  # a table into a file: the first `limit` rows, as on a terminal (csv/json/parquet hold every row;
        # rich takes minutes to lay out 100,000 rows that nobody reads as a table)
        print_table(table, limit=limit, title=title, file=buffer, empty=empty, wide=wide)
    text = buffer.getvalue()
    if output:
        write_atomic(output, text)
    else:
        sys.stdout.write(text)
