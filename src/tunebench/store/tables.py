"""Tables of stored results: what ``tunebench show`` prints and ``tunebench export`` writes.

One row per entity x experiment, in the layout of the reference's ``show measurements -o csv``
(ado-sfttrainer.md §12.5; ``src/tunebench/plan/data/measurements/ado/ado_docs_example_smollm2_cpu_measurements.csv``):
an unnamed index column, ``identifier``, ``generatorid``, ``experiment_id``, the constitutive
columns (entity id order: model_name, number_gpus, model_max_length, batch_size, then the rest
alphabetically), then the measured columns that any row has, in the reference's order with
``is_valid`` last. ``show`` adds ``actuator`` after ``experiment_id`` (measure, predict, noop...: a
prediction never passes for a measurement) and appends ``result_id`` (the stored result the row shows:
``show --series RESULT_ID`` prints its time series), ``status`` (valid, invalid, failed, or
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
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tunebench.spec.experiments import ID_ORDER, Experiment, get_experiment
from tunebench.spec.measured import REPORT_ORDER
from tunebench.spec.properties import render_value
from tunebench.store.rows import Outcomes, Repeats, no_gc
from tunebench.store.schema import ENTITY_COLUMNS, MEASURED_COLUMNS

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
    outcomes: Outcomes,
    *,
    ado: bool = False,
    constitutive: Sequence[str] = (),
    repeats: dict[int, Repeats] | None = None,
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
    decoded = {
        i: json.loads(text) if isinstance(text, str) else text
        for i, (only, text) in enumerate(zip(cols["only_columns"], cols["entity"]))
        if not only
    }
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
        experiment = [
            s if s and a == MEASURE else prefix[a] + e
            for s, e, a in zip(cols["source_experiment_id"], experiment_ids, cols["actuator"])
        ]
        head, head_data = ["experiment_id"], [experiment]
    else:
        identifier = cols["entity_id"]
        head, head_data = ["experiment_id", "actuator"], [experiment_ids, cols["actuator"]]
    generator = [g or "" for g in cols["generator"]]
    columns = ["", "identifier", "generatorid", *head, *const, *measured]
    data = [range(n), identifier, generator, *head_data, *const_data, *measured_data]
    if not ado:
        reasons = [
            e or (None if r in (None, "[]") else "; ".join(json.loads(r) if isinstance(r, str) else r))
            for e, r in zip(cols["error"], cols["reasons"])
        ]
        columns += ["result_id", "status", "reason"]  # result_id: the latest result's (show --series RESULT_ID)
        data += [cols["result_id"], cols["status"], reasons]
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


def cell_text(value: Any) -> str:
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
            data[i] = [cell_text(v) for v in data[i]]
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
            array = pa.array([None if v is None else cell_text(v) for v in column], type=pa.string())
        arrays.append(array)
        names.append(name or "index")
    pq.write_table(pa.Table.from_arrays(arrays, names=names), str(path))
