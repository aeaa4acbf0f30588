"""Import measurements from CSV files of the reference system; export in its layout.

Two layouts are read (the columns tell them apart, and they may be mixed):

1. ado's ``show measurements -o csv`` (ado-sfttrainer.md §12.5): an index column, ``identifier``,
   ``generatorid``, ``experiment_id`` (``SFTTrainer.<experiment>-<param>.<value>...``), the
   constitutive columns, the measured columns;
2. the public LLMFineTuningBench ``ado-sfttrainer.csv`` (§14): ``identifier``, ``experiment_id``,
   ``method``, constitutive columns (with ``tokens_per_sample`` for the sequence length, numbers
   written as floats: ``2.0``), measured columns and bookkeeping (``lh_created_at``,
   ``model_load_time``). Settings that only the identifier records (e.g. ``dataset_id``,
   ``torch_dtype``) are read from it.

The experiment comes from ``experiment_id`` (its ``-key.value`` suffix is the parameterisation;
a key tunebench does not know is an error that names it), else from ``method`` (full, lora,
qlora, gptq-lora, pt -> the benchmark experiments). ``is_valid`` comes from its column, else from
``train_runtime`` (present -> 1, absent -> 0 = out of memory: §13.2). Valid rows keep every measured
column; invalid rows are ``{is_valid: 0}`` (tunebench's Result contract). Columns that are neither
properties nor known bookkeeping are ignored and listed in the summary.

Repeats (ado keeps every measurement of an entity; docs/ado.md): where ado measured an entity more
than once its export holds one list per cell (``[19.81, 17.46]``, ``is_valid`` ``[1, 0]``); each
repeat becomes its own result, in the list's order. A measured column lists the values of the valid
repeats (an invalid one records only ``is_valid``); a list whose length fits neither the valid
repeats nor all of them is an error naming the column. With ``--aggregate mean`` (or ``median``)
ado suffixes the measured columns (``train_runtime-mean``): one result per row, its metadata saying
which aggregate it holds; a spread or an extreme (``-std``, ``-variance``, ``-min``, ``-max``) is no
measurement and is refused, naming the column, as is an ``is_valid-mean`` strictly between 0 and 1
(repeats that disagree on validity).

ado's ``--property-format observed`` layout names each measured column ``<experiment>-<property>``
(``finetune_lora_benchmark-v1.0.0-max_steps.2-train_runtime``, ``-mean`` after it with --aggregate)
and has no experiment_id column: one row per entity holds every experiment's columns; each experiment
whose columns the row fills becomes a row of the first layout (the actuator is not in that layout:
the results count as the import's actuator's). An SQLite file is ado's sample store itself
(tunebench.store.ado_sqlite).

Import is all or nothing by default: a row tunebench cannot understand (unknown experiment such as
the old ``finetune-full-fsdp-v1.3.0``, unknown model, value outside its domain) is an InputError
naming the row and the field; ``skip_bad_rows`` imports the others and reports the skipped ones by
reason. Importing a file twice adds nothing (each row's content hash is stored).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationError, create_model

from tunebench.errors import InputError, one_of
from tunebench.inputs import NonNegative, input_error, read_text
from tunebench.spec.experiments import (
    REQUIRED_PROPERTIES,
    Experiment,
    get_experiment,
    list_experiments,
    make_entity,
)
from tunebench.spec.measured import BENCHMARK_MEASURED, MEMORY_GIB, STABILITY_MEASURED
from tunebench.spec.properties import PROPERTIES
from tunebench.spec.results import Result
from tunebench.spec.validity import check
from tunebench.store.fms_csv import is_fms_layout
from tunebench.store.rows import Record, Selection
from tunebench.store.schema import INVALID, VALID
from tunebench.store.tables import ADO_PREFIX, build, write_csv

if TYPE_CHECKING:
    from tunebench.store.store import Store

# LLMFineTuningBench "method" -> experiment (ado-sfttrainer.md §3, §13.2)
METHOD_EXPERIMENTS = {
    "full": "finetune_full_benchmark-v1.0.0",
    "lora": "finetune_lora_benchmark-v1.0.0",
    "qlora": "finetune_qlora_benchmark-v1.0.0",
    "gptq-lora": "finetune_gptq-lora_benchmark-v1.0.0",
    "pt": "finetune_pt_benchmark-v1.0.0",
}
MEASURED = set(BENCHMARK_MEASURED) | set(STABILITY_MEASURED) | set(MEMORY_GIB)  # MEMORY_GIB: tunebench's own
# Columns that are neither properties nor measurements, but expected (not reported as ignored).
BOOKKEEPING = {"", "identifier", "generatorid", "experiment_id", "method", "tokens_per_sample", "lh_created_at",
               "model_load_time", "index", "Unnamed: 0"}  # fmt: skip
# ado's PropertyAggregationMethodEnum (ado-core ado/schema/virtual_property.py): `show measurements --aggregate`
# suffixes each measured column with the method. Only a central value can stand for a measurement.
AGGREGATES = ("mean", "median", "variance", "std", "min", "max")
CENTRAL = ("mean", "median")
_AGGREGATED = re.compile(r"^(?P<name>[a-z_]+)-(?P<method>%s)$" % "|".join(AGGREGATES))
_KEY = re.compile(r"-(?=(%s)\.)" % "|".join(sorted(map(re.escape, PROPERTIES), key=len, reverse=True)))
_SUSPECT = re.compile(r"-([a-z_][a-z0-9_]*)\.")


@dataclass
class ImportSummary:
    """What an import found in the file (rows) and what it added to the store."""

    # the file: its rows, the results they hold (one per repeat), the valid and invalid ones, those
    # skipped by reason, columns not understood
    rows: int = 0
    results: int = 0
    valid: int = 0
    invalid: int = 0
    skipped: Counter = field(default_factory=Counter)  # reason -> rows
    ignored_columns: list[str] = field(default_factory=list)
    # the store: rows added, rows it already held
    added: int = 0
    already_present: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "results": self.results,
            "added": self.added,
            "already_present": self.already_present,
            "valid": self.valid,
            "invalid": self.invalid,
            "skipped": dict(self.skipped),
            "ignored_columns": self.ignored_columns,
        }


def split_pairs(text: str) -> tuple[str, dict[str, str]]:
    """'head-k1.v1-k2.v2' -> ('head', {k1: v1, k2: v2}) splitting only before known property names."""
    parts = _KEY.split(text)
    # re.split with a capturing group returns [head, key1, rest1, key2, rest2, ...]; rest starts with "key."
    head, pairs = parts[0], {}
    for i in range(1, len(parts), 2):
        key, rest = parts[i], parts[i + 1]
        pairs[key] = rest[len(key) + 1 :]
    return head, pairs


def parse_entity_id(identifier: str) -> dict[str, str]:
    """Properties in an ado entity identifier ('model_name.X-number_gpus.Y-...')."""
    head, pairs = split_pairs("-" + identifier)
    return pairs if not head else {}


def parse_experiment_id(text: str) -> Experiment:
    """An ado experiment id ('SFTTrainer.<base>-k.v...') as a parameterised experiment; InputError names unknowns."""
    text = text.strip().removeprefix(ADO_PREFIX)
    bases = sorted((e.base_id for e in list_experiments()), key=len, reverse=True)
    base = next((b for b in bases if text == b or text.startswith(b + "-")), None)
    if base is None:
        name = text.split("-v")[0] if "-v" in text else text
        raise InputError(
            "experiment_id",
            f"unknown experiment {name!r} in {text!r}",
            allowed=one_of(e.base_id for e in list_experiments()),
        )
    head, pairs = split_pairs(text[len(base) :])
    if head:
        raise InputError("experiment_id", f"cannot read the parameterisation {head!r} of {text!r}")
    for key, value in pairs.items():
        unknown = _SUSPECT.search(value)
        if unknown and unknown.group(1) not in PROPERTIES:
            raise InputError("experiment_id", f"unknown parameter {unknown.group(1)!r} in {text!r}")
        if key not in get_experiment(base).optional:
            raise InputError("experiment_id", f"parameter {key!r} of {text!r} is not an optional property of {base}")
    return get_experiment(base, {k: _coerce(k, v) for k, v in pairs.items()})


def _coerce(name: str, raw: str) -> Any:
    """A CSV cell for property name: '2.0' -> 2 for integers and booleans (LLMFineTuningBench writes floats)."""
    prop = PROPERTIES.get(name)
    text = raw.strip()
    if prop is not None and prop.kind in ("int", "bool"):
        try:
            number = float(text)
        except ValueError:
            return text
        if number.is_integer():
            return int(number)
    return text


def _number(name: str, text: str) -> float | int | None:
    """A measured cell as a number (None: empty or nan); True/False as 1/0 (ado writes is_valid so)."""
    text = text.strip()
    if not text or text.lower() in ("nan", "none", "null"):
        return None
    if text in ("True", "False"):
        return int(text == "True")
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise InputError(name, f"{text!r} is not a number") from None


def _cell(name: str, text: str | None) -> list[float | int | None] | float | int | None:
    """A measured cell: a number, or ado's list of one value per repeat ('[19.81, 17.46]')."""
    text = (text or "").strip()
    if not (text.startswith("[") and text.endswith("]")):
        return _number(name, text)
    inner = text[1:-1].strip()
    if "[" in inner or "]" in inner:
        raise InputError(name, f"{text!r} is a nested list: one number per repeat expected")
    return [_number(name, item) for item in inner.split(",")] if inner else []


def measured_columns(columns: list[str]) -> dict[str, tuple[str, str | None]]:
    """CSV column -> (measured property, ado aggregate or None) for the columns that hold measurements.

    InputError naming the column for an aggregate that is no measurement (std, variance, min, max) and
    for two columns of one property (``train_runtime`` beside ``train_runtime-mean``).
    """
    out: dict[str, tuple[str, str | None]] = {}
    for column in columns:
        if column in MEASURED:
            out[column] = (column, None)
            continue
        match = _AGGREGATED.match(column)
        if match is None or match["name"] not in MEASURED:
            continue
        if match["method"] not in CENTRAL:
            raise InputError(
                column,
                f"holds the {match['method']} of an entity's repeats, which is no measurement; export from ado "
                "without --aggregate (every repeat is imported) or with --aggregate mean",
                allowed=", ".join(f"{match['name']}-{m}" for m in CENTRAL),
            )
        out[column] = (match["name"], match["method"])
    seen: dict[str, str] = {}
    for column, (name, _) in out.items():
        if name in seen:
            raise InputError(column, f"and {seen[name]!r} both hold {name}: keep one of them")
        seen[name] = column
    return out


def _measurement_fields() -> dict[str, Any]:
    """Every measured property: a finite number >= 0 (fractions <= 1, is_valid 0 or 1), or absent."""
    out: dict[str, Any] = {name: (NonNegative | None, None) for name in sorted(MEASURED)}
    out.update({name: (Fraction | None, None) for name in MEASURED if name.startswith("f_")})
    out["is_valid"] = (Literal[0, 1] | None, None)
    return out


Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Measurements = create_model("Measurements", __config__=ConfigDict(extra="forbid"), **_measurement_fields())


@dataclass
class Repeat:
    """One measurement of a row's entity: its properties (is_valid included), and which of how many it is."""

    properties: dict[str, Any]
    index: int  # 0-based, in ado's order
    count: int  # the repeats the row holds
    aggregate: str | None = None  # the row holds ado's aggregate (mean, median) of an unknown number of repeats


def repeats_of(row: dict[str, str], columns: dict[str, tuple[str, str | None]] | None = None) -> list[Repeat]:
    """The measurements a CSV row holds: one per repeat where ado wrote lists, else one.

    InputError naming the column whose cell is not a number (or list of numbers), whose list does not
    fit the repeats, or whose value is out of its range.
    """
    columns = measured_columns(list(row)) if columns is None else columns
    cells = {}
    aggregate = None
    for column, (_, method) in columns.items():
        value = _cell(column, row.get(column))
        if value is not None and value != []:
            cells[column] = value
            aggregate = aggregate or method
    valid_column = next((c for c, (name, _) in columns.items() if name == "is_valid" and c in cells), None)
    lengths = {len(v) for v in cells.values() if isinstance(v, list)}
    if valid_column is not None:
        flags = cells.pop(valid_column)
        flags = flags if isinstance(flags, list) else [flags]
        for flag in flags:
            if flag not in (0, 1):
                raise InputError(
                    valid_column,
                    f"{flag!r} is neither 0 nor 1"
                    + (": the repeats disagree on validity; export from ado without --aggregate" if aggregate else ""),
                )
        valid = [int(f) for f in flags]
    else:  # ado-sfttrainer.md §13.2: no is_valid column -> a train_runtime means the run completed
        runtime = next((cells[c] for c, (name, _) in columns.items() if name == "train_runtime" and c in cells), None)
        count = max(lengths, default=1)
        runtimes = runtime if isinstance(runtime, list) else [runtime] * count
        valid = [int(r is not None) for r in runtimes] if len(runtimes) == count else [1] * count
    count, n_valid = len(valid), sum(valid)
    props: list[dict[str, Any]] = [{"is_valid": v} for v in valid]
    valid_at = [i for i, v in enumerate(valid) if v]
    for column, value in cells.items():
        name = columns[column][0]
        values = value if isinstance(value, list) else [value]
        if len(values) == n_valid:
            targets = valid_at
        elif len(values) == count:
            targets = list(range(count))
        else:
            raise InputError(
                column,
                f"holds {len(values)} values for {count} repeats ({n_valid} valid): "
                "cannot tell which repeat each belongs to",
            )
        for i, v in zip(targets, values):
            if v is not None:
                props[i][name] = v
    for p in props:
        try:
            Measurements.model_validate(p)
        except ValidationError as exc:
            error = input_error(exc)
            field = next((c for c, (name, _) in columns.items() if name == error.field), error.field)
            raise InputError(field, error.message, error.allowed) from None
    return [Repeat(p, i, count, aggregate) for i, p in enumerate(props)]


def measurements_of(row: dict[str, str]) -> dict[str, Any]:
    """The measured properties of a CSV row's first repeat, as numbers; InputError naming the first
    column that is not a number (or ado's list of numbers), not finite, negative, or out of its range."""
    return repeats_of(row)[0].properties


def row_to_records(
    row: dict[str, str],
    *,
    actuator: str = "measure",
    source: str = "",
    columns: dict[str, tuple[str, str | None]] | None = None,
) -> list[Record]:
    """One CSV row as Records, one per repeat; InputError if it cannot be understood."""
    if row.get("experiment_id", "").strip():
        experiment = parse_experiment_id(row["experiment_id"])
    elif row.get("method", "").strip():
        method = row["method"].strip()
        if method not in METHOD_EXPERIMENTS:
            raise InputError("method", f"unknown method {method!r}", allowed=one_of(METHOD_EXPERIMENTS))
        experiment = get_experiment(METHOD_EXPERIMENTS[method])
    else:
        raise InputError("experiment_id", "the row has neither experiment_id nor method")
    settable = set(REQUIRED_PROPERTIES) | set(experiment.optional)
    values: dict[str, Any] = {}
    for key, raw in parse_entity_id(row.get("identifier", "")).items():
        if key in settable:
            values[key] = _coerce(key, raw)
    for key, raw in row.items():
        if key in PROPERTIES and key not in MEASURED and raw is not None and raw.strip():
            value = _coerce(key, raw)
            if key not in settable:
                if PROPERTIES[key].parse(value) == PROPERTIES[key].default:
                    continue  # e.g. fast_moe 0 for an experiment without fast_moe
                raise InputError(key, f"is not a property of {experiment.base_id}")
            values[key] = value
    if "model_max_length" not in values and (row.get("tokens_per_sample") or "").strip():
        values["model_max_length"] = _coerce("model_max_length", row["tokens_per_sample"])
    entity = make_entity(experiment, values)

    base = {"source": source} if source else {}
    extra = {k: v for k, v in row.items() if k in ("model_load_time", "lh_created_at") and v}
    if extra:
        base["columns"] = extra
    content = json.dumps({k: v for k, v in sorted(row.items()) if k not in ("", "index", "Unnamed: 0")})
    repeats = repeats_of(row, columns)
    if any(r.properties["is_valid"] == 1 for r in repeats):
        verdict = check(experiment, entity)  # a measurement cannot be valid where a rule says it never runs
        if not verdict.is_valid:
            raise InputError(
                "is_valid",
                f"1 for an entity the validity rules make invalid: {verdict.reasons[0]}",
                allowed="0 for such an entity",
            )
    records = []
    for repeat in repeats:
        metadata = dict(base)
        if repeat.count > 1:
            metadata["repeat"] = {"index": repeat.index + 1, "of": repeat.count}
        if repeat.aggregate:
            metadata["aggregate"] = repeat.aggregate  # ado's aggregate of the entity's repeats (how many: unknown)
        props = dict(repeat.properties)
        if props.pop("is_valid") == 1:
            result = Result.valid(experiment.id, entity.id, props, actuator="import", metadata=metadata)
        else:
            why = "imported with is_valid=0 (out of memory or a rejected configuration)"
            result = Result.invalid(experiment.id, entity.id, [why], actuator="import", metadata=metadata)
        key = content if repeat.count == 1 else f"{content}#{repeat.index}"  # a lone row keeps its old key
        records.append(
            Record(
                experiment=experiment,
                entity=entity,
                result=result,
                actuator=actuator,
                generator=(row.get("generatorid") or "").strip() or "import",
                source_key=hashlib.sha256(key.encode()).hexdigest(),
                source_identifier=(row.get("identifier") or "").strip() or None,
                source_experiment_id=(row.get("experiment_id") or "").strip() or None,
            )
        )
    return records


def import_csv(
    store: Store, path: str | Path, *, skip_bad_rows: bool = False, actuator: str = "measure"
) -> ImportSummary:
    """Load a CSV of measurements into the store (memoised like measurements of actuator)."""
    records, summary = read_import(path, skip_bad_rows=skip_bad_rows, actuator=actuator)
    return write_import(store, records, summary)


def observed_columns(columns: list[str]) -> dict[str, dict[str, str]]:
    """ado's observed layout: experiment id -> {its column: the measured column it stands for}.

    A column ending in ``-<measured property>`` (``-<aggregate>`` after it) whose head is no property
    is one; InputError naming the column when its head is not an experiment tunebench knows.
    """
    out: dict[str, dict[str, str]] = {}
    for column in columns:
        if column in MEASURED or column in PROPERTIES:
            continue
        head, name, method = (["", "", ""] + column.rsplit("-", 2))[-3:]
        if method in AGGREGATES and name in MEASURED:  # <experiment>-<property>-<aggregate>
            name = f"{name}-{method}"
        else:
            head, _, name = column.rpartition("-")
            if name not in MEASURED or not head:
                continue
        try:
            parse_experiment_id(head)
        except InputError as exc:
            raise InputError(column, exc.message, exc.allowed) from None
        out.setdefault(head, {})[column] = name
    return out


def split_observed(row: dict[str, str], observed: dict[str, dict[str, str]]) -> list[dict[str, str]]:
    """One observed-layout row as a row of the first layout per experiment whose cells it fills."""
    owned = {c for cols in observed.values() for c in cols}
    base = {k: v for k, v in row.items() if k not in owned}
    out = []
    for experiment, cols in observed.items():
        cells = {name: row.get(column) or "" for column, name in cols.items()}
        if any(v.strip() and v.strip() != "[]" for v in cells.values()):
            out.append({**base, "experiment_id": experiment, **cells})
    return out


def read_import(
    path: str | Path, *, skip_bad_rows: bool = False, actuator: str = "measure"
) -> tuple[list[Record], ImportSummary]:
    """Parse and check every row of a CSV of measurements (or ado's SQLite sample store);
    InputError before anything is stored."""
    from tunebench.store.ado_sqlite import is_sqlite, read_ado_store

    path = Path(path)
    summary = ImportSummary()
    if is_sqlite(path):
        return read_ado_store(path, summary, skip_bad_rows=skip_bad_rows), summary
    columns, rows = read_csv_rows(path, "FILE")
    if is_fms_layout(columns):
        _check_rows(path, rows)
        return _read_fms(path, columns, rows, skip_bad_rows, actuator, summary)
    records: list[Record] = []
    errors: list[tuple[int, InputError]] = []
    lines = list(range(2, len(rows) + 2))  # each row's line in the file (line 1 is the header)
    if "experiment_id" not in columns and "method" not in columns:
        try:
            observed = observed_columns(columns)
        except InputError as exc:
            raise InputError(f"{path.name}: {exc.field}", exc.message, exc.allowed) from None
        if observed:  # one row per (entity, experiment), each keeping its line number
            numbered = [(n, part) for n, row in enumerate(rows, start=2) for part in split_observed(row, observed)]
            rows = [part for _, part in numbered]
            lines = [n for n, _ in numbered]
            names = {name for cols in observed.values() for name in cols.values()}
            columns = [c for c in columns if not any(c in cols for cols in observed.values())]
            columns += ["experiment_id", *sorted(names)]
    try:
        measured = measured_columns(columns)  # a column that is no measurement: an error before any row
    except InputError as exc:
        raise InputError(f"{path.name}: {exc.field}", exc.message, exc.allowed) from None
    summary.ignored_columns = [c for c in columns if c not in PROPERTIES and c not in measured and c not in BOOKKEEPING]
    if "experiment_id" not in columns and "method" not in columns:
        raise InputError(
            "FILE",
            f"{path.name} has neither an experiment_id nor a method column (nor the "
            "fms-acceleration benchmark columns framework_config, model_name_or_path)",
        )
    _check_columns(path, columns, measured)
    _check_rows(path, rows)
    for number, row in zip(lines, rows):
        summary.rows += 1
        try:
            records += row_to_records(row, actuator=actuator, source=f"{path.name}:{number}", columns=measured)
        except InputError as exc:
            errors.append((number, exc))
    return _checked(path, records, errors, skip_bad_rows, summary)


def _check_columns(path: Path, columns: list[str], measured: dict[str, tuple[str, str | None]]) -> None:
    """InputError naming the columns a measurement file lacks: each entity's required properties (unless an
    identifier column may hold them; tokens_per_sample stands for model_max_length), and is_valid or
    train_runtime (without either, nothing tells a completed run from a failed one)."""
    have = set(columns) | ({"model_max_length"} if "tokens_per_sample" in columns else set())
    properties = [] if "identifier" in have else [p for p in REQUIRED_PROPERTIES if p not in have]
    missing = [f"the column{'s' if len(properties) > 1 else ''} {', '.join(properties)}"] if properties else []
    if not {name for name, _ in measured.values()} & {"is_valid", "train_runtime"}:
        missing.append("an is_valid or a train_runtime column (which tells a completed run from a failed one)")
    if missing:
        raise InputError(
            "FILE",
            f"{path.name} lacks {' and '.join(missing)}",
            allowed="ado's `show measurements -o csv`, LLMFineTuningBench's ado-sfttrainer.csv or "
            "fms-acceleration's benchmark CSV",
        )


def _check_rows(path: Path, rows: list[dict[str, str]]) -> None:
    """InputError when the file holds a header and no row: an import of nothing would still make the store."""
    if not rows:
        raise InputError("FILE", f"{path.name} has no rows, only a header: nothing to import")


def _read_fms(
    path: Path,
    columns: list[str],
    rows: list[dict[str, str]],
    skip_bad_rows: bool,
    actuator: str,
    summary: ImportSummary,
) -> tuple[list[Record], ImportSummary]:
    """read_import of fms-acceleration's benchmark layout (tunebench.store.fms_csv)."""
    from tunebench.store.fms_csv import USED, fms_converter

    summary.ignored_columns = [c for c in columns if c not in USED]
    convert = fms_converter(rows, path.name, actuator)
    records: list[Record] = []
    errors: list[tuple[int, InputError]] = []
    for index in range(len(rows)):
        summary.rows += 1
        try:
            records += convert(index)
        except InputError as exc:
            errors.append((index + 2, exc))
    return _checked(path, records, errors, skip_bad_rows, summary)


def _checked(
    path: Path, records: list[Record], errors: list[tuple[int, InputError]], skip_bad_rows: bool, summary: ImportSummary
) -> tuple[list[Record], ImportSummary]:
    """The records, or the InputError of the first bad row (skip_bad_rows: the bad rows counted by reason)."""
    if errors and not skip_bad_rows:
        number, first = errors[0]
        raise InputError(
            f"{path.name} line {number}: {first.field}",
            f"{first.message} ({len(errors)} of {summary.rows} rows cannot be imported; nothing was imported; "
            "--skip-bad-rows imports the others)",
            first.allowed,
        )
    for _, exc in errors:
        summary.skipped[_reason(exc)] += 1
    return records, summary


def read_csv_rows(path: Path, field: str) -> tuple[list[str], list[dict[str, str]]]:
    """The header and the rows of a CSV file; InputError naming field if it is not CSV text, names a column
    twice, or has a row with more or fewer cells than the header (blank lines are skipped)."""
    reader = csv.reader(io.StringIO(read_text(path, field), newline=""), strict=True)
    try:
        header = next(reader, [])
        twice = sorted({c for c in header if header.count(c) > 1})
        if twice:
            raise InputError(field, f"{path.name} line 1 names the column {twice[0]!r} twice")
        rows = []
        for cells in reader:
            if not cells:
                continue
            if len(cells) != len(header):
                raise InputError(
                    field, f"{path.name} line {reader.line_num} has {len(cells)} cells; the header has {len(header)}"
                )
            rows.append(dict(zip(header, cells, strict=True)))
    except csv.Error as exc:
        raise InputError(field, f"{path.name} line {reader.line_num} is not CSV: {exc}") from None
    return header, rows


def write_import(store: Store, records: list[Record], summary: ImportSummary) -> ImportSummary:
    """Store the records read_import parsed; one transaction per batch."""
    summary.added, summary.already_present = store.record_many(records)
    summary.results = len(records)
    for r in records:
        summary.valid += r.result.status == VALID
        summary.invalid += r.result.status == INVALID
    return summary


def _reason(exc: InputError) -> str:
    text = f"{exc.field}: {exc.message}"
    return re.sub(r"'[^']*'", "'...'", text) if "unknown experiment" not in text else text.split(" in ")[0]


def export_csv(
    store: Store,
    out: IO[str],
    *,
    operation_id: str | None = None,
    request_ids: list[int] | None = None,
    actuator: str | None = None,
) -> int:
    """Write valid and invalid results in the reference's CSV layout; returns the number of rows."""
    table = build(store.table(Selection(operation_id, request_ids, actuator, statuses=[VALID, INVALID])), ado=True)
    write_csv(table, out)
    return len(table)
