"""fms-acceleration's benchmark CSVs (``scripts/benchmarks/refs*/``) as results of the spec's experiments.

The planner already reads this layout for its calibration (tunebench.plan.measurements: the method from
``peft_method`` and ``framework_config``, the checkpoint to its catalog model, alpaca packed to 4,096
tokens, 100 steps, FSDP FULL_SHARD on more than one GPU, the GPU from the file's name); an import stores
what that reading gives as an entity of the experiment, with these measured properties
(docs/reference/estimation.md §10.1 defines the columns):

- ``is_valid``: 1 where ``train_tokens_per_second`` is filled, 0 (a failed, out-of-memory run) where not;
- ``train_tokens_per_gpu_per_second`` = ``train_tokens_per_second`` (fms-acceleration's is per device),
  and ``train_tokens_per_second`` = that x ``num_gpus``;
- ``train_runtime``, ``train_samples_per_second``, ``train_steps_per_second``: the columns of those names
  (HF Trainer's, over all devices);
- ``gpu_memory_allocated_peak_gib`` = ``mem_peak_torch_mem_alloc_in_bytes`` / 2^30 (rank 0's torch peak);
- ``gpu_memory_peak_gib`` = ``mem_nvidia_mem_reserved`` / 1024 (MiB, nvidia-smi) on one GPU only: the file
  averages it over the devices.

A row the planner cannot read (a model outside the catalog, such as ``bigcode/gpt_bigcode-santacoder``)
is an InputError naming it, as any import row tunebench cannot understand (``--skip-bad-rows`` skips it).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping

from tunebench.errors import InputError
from tunebench.spec.experiments import get_experiment, make_entity
from tunebench.spec.properties import PROPERTIES
from tunebench.spec.results import Result
from tunebench.store.rows import Record

# The columns that tell this layout (the planner's reader keys on the same two).
MARKERS = ("framework_config", "model_name_or_path")
# Every column the reading uses; the others (epoch, learning_rate, lora_alpha, train_loss, ...) are ignored.
USED = frozenset({
    "framework_config", "model_name_or_path", "num_gpus", "per_device_train_batch_size", "gradient_accumulation_steps",
    "peft_method", "r", "target_modules", "torch_dtype", "bf16", "fp16", "train_tokens_per_second",
    "train_steps_per_second", "train_samples_per_second", "train_runtime", "mem_nvidia_mem_reserved",
    "mem_peak_torch_mem_alloc_in_bytes",
})  # fmt: skip
TIME_COLUMNS = ("train_runtime", "train_samples_per_second", "train_steps_per_second")
NUMERIC = frozenset({"num_gpus", "per_device_train_batch_size", "gradient_accumulation_steps", "r",
                     "train_tokens_per_second", *TIME_COLUMNS, "mem_nvidia_mem_reserved",
                     "mem_peak_torch_mem_alloc_in_bytes"})  # fmt: skip


def is_fms_layout(columns: list[str]) -> bool:
    """Whether a CSV header is fms-acceleration's benchmark layout (and not one with an experiment column)."""
    return "experiment_id" not in columns and "method" not in columns and any(c in columns for c in MARKERS)


def fms_converter(rows: list[dict[str, str]], file_name: str, actuator: str) -> Callable[[int], list[Record]]:
    """A function of a row's index giving its Record (one: the file has no repeats); InputError where the
    row cannot be read. The planner's reading needs the whole file (tokens per sample of unpacked runs)."""
    from tunebench.spec.runs import FMS_MODELS, fms_model, fms_row_records

    planned = fms_row_records(rows, file_name)

    def convert(index: int) -> list[Record]:
        row, rec = rows[index], planned[index]
        model = fms_model(row, file_name)  # the orca multipack files omit it: Mistral-7B
        if rec is None:
            why = (
                "an unpacked run whose tokens per sample nothing in the file tells"
                if model in FMS_MODELS
                else ("a model outside the catalog")
            )
            raise InputError(
                "model_name_or_path",
                f"{model or '(empty)'!r}: {why}",
                allowed="the checkpoints of tunebench.spec.runs.FMS_MODELS",
            )
        experiment = get_experiment(rec.experiment_id)
        values = {k: v for k, v in rec.values.items() if k in PROPERTIES}  # without the planner's own _notes
        values["model_name"] = FMS_MODELS.get(model, model)
        entity = make_entity(experiment, values)
        props = measured(row, rec.properties)
        metadata = {"source": f"{file_name}:{index + 2}", "layout": "fms-acceleration"}
        if props.pop("is_valid"):
            result = Result.valid(experiment.id, entity.id, props, actuator="import", metadata=metadata)
        else:
            why = "imported with is_valid=0 (an fms-acceleration run without throughput: failed, out of memory)"
            result = Result.invalid(experiment.id, entity.id, [why], actuator="import", metadata=metadata)
        key = json.dumps({"layout": "fms-acceleration", **dict(sorted(row.items()))})
        return [
            Record(
                experiment,
                entity,
                result,
                actuator=actuator,
                generator="import",
                source_key=hashlib.sha256(key.encode()).hexdigest(),
            )
        ]

    return convert


def measured(row: Mapping[str, str], planner: Mapping[str, float]) -> dict[str, float]:
    """The measured properties of a row (see the module): the planner's (validity, per-device tokens/s,
    memory), the run's time columns, and the tokens/s over all its GPUs. InputError naming the column
    of a cell that is not a finite number >= 0."""
    for name in sorted(USED & set(row)):
        if name in NUMERIC:
            _number(row, name)
    out: dict[str, float] = {"is_valid": int(planner.get("is_valid", 0))}
    if not out["is_valid"]:
        return out
    out.update({k: v for k, v in planner.items() if k != "is_valid"})
    for name in TIME_COLUMNS:
        value = _number(row, name)
        if value is not None:
            out[name] = value
    per_gpu = out.get("train_tokens_per_gpu_per_second")
    if per_gpu is not None:
        out["train_tokens_per_second"] = per_gpu * int(_number(row, "num_gpus") or 1)
    return out


def _number(row: Mapping[str, str], name: str) -> float | None:
    """A cell as a number (None: empty); InputError naming the column unless a finite number >= 0."""
    text = (row.get(name) or "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise InputError(name, f"{text!r} is not a number", allowed="a finite number >= 0") from None
    if not math.isfinite(value) or value < 0:
        raise InputError(name, f"{text!r} is out of range", allowed="a finite number >= 0")
    return value
