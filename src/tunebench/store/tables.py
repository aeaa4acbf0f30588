"""Tables of stored results: what ``tunebench show`` prints and ``tunebench export`` writes.

One row per entity x experiment, in the layout of the reference's ``show measurements -o csv``
(ado-sfttrainer.md §12.5; ``src/tunebench/plan/data/measurements/ado/ado_docs_example_smollm2_cpu_measurements.csv``):
an unnamed index column, ``identifier``, ``generatorid``, ``experiment_id``, the constitutive
columns (entity id order: model_name, number_gpus, model_max_length, batch_size, then the rest
alphabetically), then the measured columns that any row has, in the reference's order with
``is_valid`` last. ``show`` adds ``actuator`` after ``experiment_id`` (measure, predict, noop...: a
prediction never passes for a measurement) and appends ``status`` (valid, invalid, failed, or
pending/running for a point being retried) and ``reason`` (why it is invalid or failed).
An entity measured more than once (ado's repeats, a re-run, an import beside a measurement) is one row
with ``repeats`` (its valid and invalid results), each measured column the mean over its valid
results and ``<name>-std`` beside it (the sample standard deviation; ado's name for that aggregate);
status, reason and is_valid are the latest result's. ``show --repeats`` lists every result instead.
``export --format ado-csv`` writes exactly the reference layout (valid and invalid rows, an
imported row's own identifiers kept, tunebench's own in ado's order: properties sorted by name), where ado names the actuator as the prefix of the experiment
id: measurements get ado's ``SFTTrainer.``, any other actuator its own name (``predict.``), so ado
never reads a prediction or a test row as a measurement.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tunebench.spec.experiments import ID_ORDER, Experiment, get_experiment
from tunebench.spec.measured import REPORT_ORDER, shown_columns
from tunebench.spec.properties import render_value
from tunebench.store.schema import ENTITY_COLUMNS, MEASURED_COLUMNS
from tunebench.store.rows import Outcomes, Repeats, no_gc

ADO_PREFIX = "SFTTrainer."  # the reference's actuator prefix of experiment ids (ado names measurements so)
MEASURE = "measure"  # the actuator that measures; every other one predicts or tests
FORMATS = ("table", "csv", "json", "parquet")
# what the terminal table shows of the measured properties (those any row has): throughput, time, memory
TABLE_MEASURED = ("dataset_tokens_per_second", "train_runtime", "gpu_memory_allocated_peak_gib", "gpu_memory_peak_gib",
                  "gpu_memory_utilization_peak", "cpu_memory_utilization")  # fmt: skip


@dataclass
class Table:
    """A report: column names and the data column by column (rows are built when asked for)."""

    columns: list[str]
    data: list[Sequence[Any]]
    text_columns: tuple[int, ...] = ()  # columns whose values may need rendering (booleans, lists)

    @property
    def rows(self) -> list[tuple]:
        return list(zip(*self.data)) if self.data else []

    def __len__(self) -> int:
        return len(self.data[0]) if self.data else 0

    def records(self) -> list[dict[str, Any]]:
        """Rows as dicts (the unnamed index column left out)."""
        keep = [(name, column) for name, column in zip(self.columns, self.data) if name]
        names = [name for name, _ in keep]
        return [dict(zip(names, values)) for values in zip(*(column for _, column in keep))]


def build(
    outcomes: Outcomes, *, ado: bool = False, constitutive: Sequence[str] = (), repeats: dict[int, Repeats] | None = None
) -> Table:
    """The report of ``Store.table()``; ado=True gives the reference's export layout; repeats
    (``Store.repeats()``) makes each row the aggregate of its request's results (see the module).

    Column by column (list comprehensions and C-level zips, no per-row dicts): 100,000 rows take
    a fraction of a second. Constitutive columns: the entity values any row has (plus the space's
    own dimensions), a value a row leaves at its experiment's default shown as that default.
    Measured columns: those any row has, in REPORT_ORDER, then other properties alphabetically,
    then is_valid.
    """
    with no_gc():  # many small acyclic objects: the cyclic GC would only slow this down
        return _build(outcomes, ado, constitutive, repeats)


def _build(outcomes: Outcomes, ado: bool, constitutive: Sequence[str], repeats: dict[int, Repeats] | None) -> Table:
    cols, n = outcomes.columns, outcomes.count
    pks = cols["experiment_pk"]
    experiment_ids = [outcomes.experiments[pk]["experiment_id"] for pk in pks]
    # entities with values beyond the real columns: decode their JSON (rare)
    decoded = {i: json.loads(text) if isinstance(text, str) else text
               for i, (only, text) in enumerate(zip(cols["only_columns"], cols["entity"])) if not only}  # fmt: skip
    names = set(constitutive) | {name for name in ENTITY_COLUMNS if _present(cols[name], n)}
    for values in decoded.values():
        names.update(values)
    const = [name for name in ID_ORDER if name in names]
    const += sorted(names - set(const))
    defaults = _Defaults(outcomes.experiments)
    const_data = []
    for name in const:
        column = list(cols[name]) if name in cols else [None] * n
        for i, values in decoded.items():
            column[i] = values.get(name)
        if None in column:  # left at the experiment's default
            column = [v if v is not None else defaults.get(pk, name) for v, pk in zip(column, pks)]
        const_data.append(column)
    # measured: real columns, then extra properties (decoded once per distinct text)
    extras = {
        text: json.loads(text) if isinstance(text, str) else (text or {}) for text in set(cols["extra_properties"])
    }
    extra_names = set().union(*extras.values()) if extras else set()
    present = {name for name in MEASURED_COLUMNS if _present(cols[name], n)}
    order = {name: i for i, name in enumerate(REPORT_ORDER)}
    names = present | extra_names
    measured = sorted((m for m in names if m in order), key=order.__getitem__) + sorted(names - set(order))
    measured_data = []
    for name in measured:
        column = cols[name] if name in present else [None] * n
        if name in extra_names:
            column = [v if v is not None else extras[t].get(name) for v, t in zip(column, cols["extra_properties"])]
        measured_data.append(column)
    if repeats is not None:
        measured, measured_data = _aggregate(cols["request_id"], measured, measured_data, repeats)
    if _present(cols["is_valid"], n):
        measured.append("is_valid")
        measured_data.append(cols["is_valid"])
    # head and tail columns
    if ado:
        prefix = {a: ADO_PREFIX if a == MEASURE else f"{a}." for a in set(cols["actuator"])}
        identifier = [s or ado_entity_id(e) for s, e in zip(cols["source_identifier"], cols["entity_id"])]
        experiment = [s if s and a == MEASURE else prefix[a] + e
                      for s, e, a in zip(cols["source_experiment_id"], experiment_ids, cols["actuator"])]  # fmt: skip
        head, head_data = ["experiment_id"], [experiment]
    else:
        identifier = cols["entity_id"]
        head, head_data = ["experiment_id", "actuator"], [experiment_ids, cols["actuator"]]
    generator = [g or "" for g in cols["generator"]]
    columns = ["", "identifier", "generatorid", *head, *const, *measured]
    data = [range(n), identifier, generator, *head_data, *const_data, *measured_data]
    if not ado:
        reasons = [e or (None if r in (None, "[]") else "; ".join(json.loads(r) if isinstance(r, str) else r))
                   for e, r in zip(cols["error"], cols["reasons"])]  # fmt: skip
        columns += ["status", "reason"]
        data += [cols["status"], reasons]
    first = 3 + len(head)
    if repeats is not None:
        at = first + len(const)
        columns.insert(at, "repeats")
        data.insert(at, [repeats[r].count if r in repeats else 1 for r in cols["request_id"]])
    return Table(columns, data, tuple(range(first, first + len(const))))


def _aggregate(
    request_ids: Sequence[int], measured: list[str], data: list[Sequence[Any]], repeats: dict[int, Repeats]
) -> tuple[list[str], list[Sequence[Any]]]:
    """Measured columns as means over each request's valid results, each followed by its -std column
    where any request has two or more values of it."""
    names, out = [], []
    for name, column in zip(measured, data):
        stats = [repeats[r].stats.get(name) if r in repeats else None for r in request_ids]
        names.append(name)
        out.append([s[0] if s else v for v, s in zip(column, stats)])
        if any(s and s[1] is not None for s in stats):
            names.append(f"{name}-std")
            out.append([s[1] if s else None for s in stats])
    return names, out


def ado_entity_id(entity_id: str) -> str:
    """tunebench's entity id in ado's order: ado-core 2.3 names an entity by its properties sorted by name
    (ado/schema/entity.py entity_identifier_from_properties_and_values), tunebench in the spec's order."""
    from tunebench.store.csvio import parse_entity_id

    values = parse_entity_id(entity_id)
    return "-".join(f"{k}.{values[k]}" for k in sorted(values)) if values else entity_id


def _present(column: Sequence[Any], n: int) -> bool:
    return n > 0 and column.count(None) < n


class _Defaults:
    """An experiment's effective default of a property missing from a canonical entity (cached)."""

    def __init__(self, experiments: dict[int, dict[str, Any]]) -> None:
        self.experiments = experiments
        self._cache: dict[tuple[int, str], Any] = {}

    def get(self, pk: int, name: str) -> Any:
        key = (pk, name)
        if key not in self._cache:
            info = self.experiments[pk]
            try:
                experiment: Experiment | None = get_experiment(info["base_id"], info["parameters"])
            except Exception:
                experiment = None
            self._cache[key] = (
                experiment.default(name) if experiment is not None and name in experiment.optional else None
            )
        return self._cache[key]


def _cell(value: Any) -> str:
    """A CSV cell: floats as Python's shortest repr (as pandas writes them), None empty, ids-style otherwise."""
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ""
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        return str(value)
    return render_value(value)


# A cell a spreadsheet would run as a formula (OWASP "CSV Injection"): text starting with one of these.
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def _inert(value: Any) -> Any:
    """Text a spreadsheet would evaluate, quoted with a leading ' (OWASP's advice); numbers stay numbers."""
    if isinstance(value, str) and value.startswith(FORMULA_PREFIXES):
        return "'" + value
    return value


def write_csv(table: Table, out: IO[str]) -> None:
    """CSV as pandas writes it: floats in shortest repr, None empty, booleans 0/1 in constitutive columns;
    text that would start a spreadsheet formula is quoted with a leading '."""
    data = list(table.data)
    for i, column in enumerate(data):  # any column may hold text (ids, names, notes)
        if any(isinstance(v, str) and v.startswith(FORMULA_PREFIXES) for v in column):
            data[i] = [_inert(v) for v in column]
    for i in table.text_columns:
        if not set(map(type, data[i])) <= {str, int, type(None)}:  # booleans, lists, floats: render them
            data[i] = [_cell(v) for v in data[i]]
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(table.columns)
    writer.writerows(zip(*data))


def write_json(table: Table, out: IO[str]) -> None:
    json.dump(table.records(), out, indent=1, default=_json_default)
    out.write("\n")


def _json_default(value: Any) -> Any:
    if isinstance(value, (tuple, set)):
        return list(value)
    return str(value)


def write_parquet(table: Table, path: str | Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrays, names = [], []
    for name, column in zip(table.columns, table.data):
        column = list(column)
        try:
            array = pa.array(column)
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed types: keep the text
            array = pa.array([None if v is None else _cell(v) for v in column], type=pa.string())
        arrays.append(array)
        names.append(name or "index")
    pq.write_table(pa.Table.from_arrays(arrays, names=names), str(path))


def print_table(
    table: Table, *, limit: int | None = 50, title: str | None = None, file: IO[str] | None = None,
    empty: str = "no results", wide: bool = False,
) -> None:
    """A terminal table: constitutive columns, actuator, status, is_valid, throughput, time and memory.

    limit: the rows shown (None: every row); a note under the table says how many were left out.
    An empty table prints the line empty instead of a table of headers. Fitted to the terminal
    (tunebench.terminal): a column with one value in every row is named once in the title, the least
    important columns are left out when narrow, model names shortened in the middle; wide: all in full.
    """
    from rich.console import Console

    from tunebench.terminal import print_table as print_fitted

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
    same = [] if wide or shown < 2 else [n for n in keys if len({_short(v) for v in table.data[cols.index(n)][:shown]}) == 1]
    if "experiment_id" not in same and len(set(table.data[start][:shown])) == 1:
        same.insert(0, "experiment_id")  # one experiment: name it once, above the table
    fixed = ", ".join(
        _short(table.data[start][0]) if n == "experiment_id" else f"{n} {_short(table.data[cols.index(n)][0])}"
        for n in same
    )  # fmt: skip
    title = " — ".join(t for t in (title, fixed) if t) or None
    measured = (TABLE_MEASURED[0], f"{TABLE_MEASURED[0]}-std", *TABLE_MEASURED[1:])  # the throughput's spread too
    wanted = [n for n in keys if n not in same] + ["status"]
    gpus = table.data[cols.index("number_gpus")][:shown] if "number_gpus" in cols and not wide else ()
    wanted += shown_columns([n for n in ("is_valid", *measured) if n in cols], gpus)  # wide: every column
    if wide or "reason" in cols and any(table.data[cols.index("reason")][:shown]):
        wanted.append("reason")  # no reason column when no row has one
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
SHOW_PRIORITY = {"experiment_id": 1, "actuator": 2, "reason": 2, "is_valid": 5, f"{TABLE_MEASURED[0]}-std": 4,
                 "train_runtime": 3, "cpu_memory_utilization": 4, "gpu_memory_utilization_peak": 4}  # fmt: skip


def _column(name: str, identifies: bool) -> Any:
    """How show prints the column name: ids shortened in the middle, the reason wrapped, numbers right."""
    from tunebench.terminal import Column

    if name in ("experiment_id", "model_name"):
        return Column(name, SHOW_PRIORITY.get(name, 0), shrink=True, min_width=16)
    if name == "reason":
        return Column(name, SHOW_PRIORITY[name], wrap=True, min_width=16)
    numeric = name in TABLE_MEASURED or name.endswith("-std")
    priority = SHOW_PRIORITY.get(name, 0 if identifies or name in ("status", TABLE_MEASURED[0]) else 3 if numeric else 1)
    return Column(name, priority, justify="right" if numeric else "left", breaks=True, min_width=4)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return _cell(value)


def render(
    table: Table, fmt: str, output: str | Path | None = None, *, limit: int | None = 50, title: str | None = None,
    empty: str = "no results", wide: bool = False,
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
