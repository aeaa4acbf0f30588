"""Measured runs as the planner's calibration records, from the data sets it ships and from users.

A ``Record`` is ``(experiment_id, entity values, measured properties)``, what the results store
holds. Readers:

- the fms-acceleration benchmark layout (``data/measurements/fms-acceleration/*.csv``:
  framework_config, model_name_or_path, num_gpus, per_device_train_batch_size, peft_method, ...,
  mem_nvidia_mem_reserved (MiB), mem_peak_torch_mem_alloc_in_bytes, train_tokens_per_second per
  device; empty throughput = failed run, an out-of-memory when memory sits at capacity);
- the published runs of other stacks, written as tunebench requests (``published/cases.jsonl``);
- the spec's measured-property layout (ado's CSV export: experiment_id, the entity's properties,
  gpu_memory_utilization_peak, train_tokens_per_gpu_per_second, ...), and the results store.

``data/measurements/README.md`` names every source.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tunebench.errors import InputError
from tunebench.spec.experiments import get_experiment, list_experiments
from tunebench.spec.runs import Record, read_fms_csv

DATA = Path(__file__).parent / "data" / "measurements"
FMS = DATA / "fms-acceleration"
PUBLISHED = DATA / "published"
CPU_EXAMPLE = DATA / "ado" / "ado_docs_example_smollm2_cpu_measurements.csv"

# Published cases whose request does not describe the run that was measured, so they are evaluated and
# never fitted on: PEFT trains samples of ~210 tokens in length-bucketed batches and reports the 99th
# percentile of memory, while its cases give the 768-token truncation (padded lengths unknown, like the
# unpacked orca runs); torchtitan's are pre-training runs of its own model code on Meta's clusters, whose
# network its cases state (enable_roce, _network_gbps: data/measurements/README.md).
EVALUATED_ONLY_STACKS = ("peft", "torchtitan")
FMS_FILES = ("refs_a100_80gb.csv", "refs_a100_80gb_granite.csv", "refs_a100_80gb_liger.csv",
             "refs_orca_a100_80gb_pf.csv", "refs_orca_a100_80gb_mp.csv", "refs_a100_80gb_moe.csv",
             "hist_8af8fa7_refs_l40_40gb.csv")  # fmt: skip
# Memory kinds of the published cases -> the planner's property of the same definition.
MEMORY_KINDS = {
    "alloc": "gpu_memory_allocated_peak_gib",
    "reserved": "gpu_memory_reserved_peak_gib",
    "nvidia-smi": "gpu_memory_peak_gib",
    None: "gpu_memory_reserved_peak_gib",  # unspecified: the closest of the torch figures
}


def fms_records(directory: str | Path | None = None, files: Iterable[str] = FMS_FILES) -> list[Record]:
    """The fms-acceleration runs (estimation.md §10.1), deduplicated."""
    directory = Path(directory) if directory else FMS
    out: list[Record] = []
    seen = set()
    for name in files:
        path = directory / name
        if not path.exists():
            continue
        for rec in read_fms_csv(path):
            key = (rec.experiment_id, tuple(sorted((k, str(v)) for k, v in rec.values.items())))
            if key not in seen:
                seen.add(key)
                out.append(rec)
    return out


# --- published runs of other stacks -------------------------------------------------------------------
def read_cases(path: str | Path | None = None) -> list[Record]:
    """Records from the published cases (``{"row_id", "source", "request", "measured"}`` per line)."""
    path = Path(path) if path else PUBLISHED / "cases.jsonl"
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        case = json.loads(line)
        request, measured = case["request"], case["measured"]
        values = _spec_values(request["experiment"], {})[1]
        entity = dict(request["entity"])
        model = entity["model_name"]
        if not Path(model).is_absolute() and (path.parent / model).exists():
            entity["model_name"] = str((path.parent / model).resolve())
        exp = get_experiment(request["experiment"])
        # "_"-keys are stack facts no property describes (e.g. _kbit_upcast); they pass as they are
        values.update({k: v if k.startswith("_") else exp.parse(k, v) for k, v in entity.items()})
        if exp.uses_lora and not values.get("target_modules"):
            from tunebench.spec.experiments import target_modules_for

            values["target_modules"] = target_modules_for(exp, values["model_name"])
        props: dict[str, float] = {}
        if measured.get("oom") is not None:
            props["is_valid"] = 0.0 if measured["oom"] else 1.0
        if measured.get("mem_gib"):
            props[MEMORY_KINDS.get(measured.get("mem_kind"), MEMORY_KINDS[None])] = float(measured["mem_gib"])
        if measured.get("tok_s_gpu"):
            props["train_tokens_per_gpu_per_second"] = float(measured["tok_s_gpu"])
        origin = case["source"].split("/")[-1].lower()
        out.append(
            Record(
                request["experiment"],
                values,
                props,
                f"{origin}/{case['row_id']}",
                fit=origin not in EVALUATED_ONLY_STACKS,
                near_limit=bool(measured.get("near_limit")),
            )
        )
    return out


# --- the spec's measured-property layout (ado export, the store) --------------------------------------
def _split_experiment_id(text: str) -> tuple[str, dict[str, str]]:
    """'SFTTrainer.<base>-k.v-k.v' -> (base id, {k: v}); parameter values may contain '.' and '-'."""
    text = text.strip().removeprefix("SFTTrainer.")
    for exp in sorted(list_experiments(), key=lambda e: -len(e.base_id)):
        if text.startswith(exp.base_id):
            rest = text[len(exp.base_id) :]
            names = sorted(exp.optional, key=len, reverse=True)
            pattern = re.compile(r"-(" + "|".join(re.escape(n) for n in names) + r")\.")
            params: dict[str, str] = {}
            marks = list(pattern.finditer(rest))
            for i, m in enumerate(marks):
                end = marks[i + 1].start() if i + 1 < len(marks) else len(rest)
                params[m.group(1)] = rest[m.end() : end]
            return exp.base_id, params
    raise InputError("experiment_id", f"unknown experiment in {text!r}")


def _measured_properties(values: Mapping[str, Any], raw: Mapping[str, Any]) -> dict[str, float]:
    """The measured properties calibration uses, from spec-named properties (percent -> GiB)."""
    from tunebench.catalog import get_gpu

    props: dict[str, float] = {}
    valid = _num_or_none(raw.get("is_valid"))
    props["is_valid"] = 1.0 if valid is None else valid
    for k in (
        "train_tokens_per_gpu_per_second",
        "dataset_tokens_per_second_per_gpu",
        "gpu_memory_allocated_peak_gib",
        "gpu_memory_reserved_peak_gib",
        "gpu_memory_peak_gib",
    ):
        v = _num_or_none(raw.get(k))
        if v:
            props[k] = v
    util = _num_or_none(raw.get("gpu_memory_utilization_peak"))
    if util and "gpu_memory_peak_gib" not in props and values.get("gpu_model") and (values.get("number_gpus") or 0) > 0:
        props["gpu_memory_peak_gib"] = util / 100 * get_gpu(values["gpu_model"]).memory_gib
    return props


def _num_or_none(v: Any) -> float | None:
    if v is None or (isinstance(v, str) and not v.strip()):
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _spec_values(experiment_id: str, entity: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(base experiment id, effective values) of a possibly parameterised experiment id and entity."""
    from tunebench.spec.experiments import target_modules_for
    from tunebench.spec.properties import PROPERTIES

    base, params = _split_experiment_id(experiment_id)
    exp = get_experiment(base)
    values: dict[str, Any] = dict(exp.hardcoded)
    values.update({k: exp.default(k) for k in exp.optional})
    values.update({k: exp.parse(k, v) for k, v in params.items()})
    for k, v in entity.items():
        if k in PROPERTIES and v not in (None, ""):
            values[k] = exp.parse(k, v)
    if exp.uses_lora and not values.get("target_modules") and values.get("model_name"):
        values["target_modules"] = target_modules_for(exp, values["model_name"])
    return base, values


def read_spec_csv(path: str | Path, source: str | None = None) -> list[Record]:
    """Records from a CSV in the spec's measured-property layout (ado's export, our store's); InputError
    naming the file, line and field of a value that cannot be read (as `tunebench import` does)."""
    out = []
    path = Path(path)
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        for row in reader:
            try:
                base, values = _spec_values(row.get("experiment_id") or "", row)
            except InputError as exc:  # reader.line_num: the row's last line (a quoted cell may span lines)
                raise InputError(f"{path.name} line {reader.line_num}: {exc.field}", exc.message, exc.allowed) from None
            out.append(Record(base, values, _measured_properties(values, row), source or str(path)))
    return out


def read_csv(path: str | Path) -> list[Record]:
    """Either layout, recognised by its header."""
    with Path(path).open(newline="") as fh:
        header = next(csv.reader(fh), [])
    if "experiment_id" in header:
        return read_spec_csv(path)
    if "framework_config" in header or "model_name_or_path" in header:
        return read_fms_csv(path)
    raise InputError("--from", f"{path}: neither the fms-acceleration nor the measured-property CSV layout")


def records_from_store(rows: Iterable[tuple[str, Mapping[str, Any], Mapping[str, float]]]) -> list[Record]:
    """Records from (experiment_id, entity values, measured properties) triples, e.g. the results store."""
    out = []
    for experiment_id, entity, props in rows:
        base, values = _spec_values(experiment_id, entity)
        out.append(Record(base, values, _measured_properties(values, props), "store"))
    return out


def store_records(url: str) -> list[Record]:
    """Measured (not predicted) valid and invalid outcomes of the sample store at url."""
    from tunebench.store import DONE, Store

    with Store(url, readonly=True) as store:
        rows = store.rows(statuses=DONE)
    return records_from_store(
        (r["experiment_id"], r["entity"] or {}, r["properties"] or {}) for r in rows if r.get("actuator") == "measure"
    )


def default_records() -> list[Record]:
    """What the shipped calibration is fitted on: the fms-acceleration runs, the published runs of
    other stacks, and the reference system's 4 CPU measurements (the only CPU data, for cpu_tflops)."""
    return fms_records() + read_cases() + read_spec_csv(CPU_EXAMPLE, source="ado/cpu-example")
