"""Measured properties: the SFTTrainer spec's, in its order, and the few tunebench adds; each list defined once."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

# the SFTTrainer spec "Measured properties" of the benchmark experiments, in the spec's order.
BENCHMARK_MEASURED = (
    "gpu_compute_utilization_min", "gpu_compute_utilization_avg", "gpu_compute_utilization_max",
    "gpu_memory_utilization_min", "gpu_memory_utilization_avg", "gpu_memory_utilization_max",
    "gpu_power_percent_min", "gpu_power_percent_avg", "gpu_power_percent_max",
    "gpu_power_watts_min", "gpu_power_watts_avg", "gpu_power_watts_max",
    "gpu_memory_utilization_peak", "cpu_compute_utilization", "cpu_memory_utilization",
    "train_runtime", "train_samples_per_second", "train_steps_per_second", "train_tokens_per_second",
    "train_tokens_per_gpu_per_second", "dataset_tokens_per_second", "dataset_tokens_per_second_per_gpu",
    "is_valid",
)  # fmt: skip
# the SFTTrainer spec finetune_full_stability-v1.0.0 "Measured properties".
STABILITY_MEASURED = ("f_gpu_oom", "f_other_error", "f_no_error", "is_valid")
# tunebench's additions: peak memory per GPU in GiB as torch allocated, torch reserved and nvidia-smi
# report it (the spec has only the nvidia-smi percentage); both actuators produce them.
MEMORY_GIB = ("gpu_memory_allocated_peak_gib", "gpu_memory_reserved_peak_gib", "gpu_memory_peak_gib")
# The reference CSV's measured columns in its order (its exports put gpu_memory_utilization_peak after the
# memory utilisation family and power watts before percent), then the stability fractions; reports list
# these first and any other measured property (MEMORY_GIB among them) after them, alphabetically.
REPORT_ORDER = (
    "gpu_compute_utilization_min", "gpu_compute_utilization_avg", "gpu_compute_utilization_max",
    "gpu_memory_utilization_min", "gpu_memory_utilization_avg", "gpu_memory_utilization_max",
    "gpu_memory_utilization_peak",
    "gpu_power_watts_min", "gpu_power_watts_avg", "gpu_power_watts_max",
    "gpu_power_percent_min", "gpu_power_percent_avg", "gpu_power_percent_max",
    "cpu_compute_utilization", "cpu_memory_utilization",
    "train_runtime", "train_samples_per_second", "train_steps_per_second",
    "train_tokens_per_second", "train_tokens_per_gpu_per_second",
    "dataset_tokens_per_second", "dataset_tokens_per_second_per_gpu",
    "f_gpu_oom", "f_other_error", "f_no_error",
)  # fmt: skip
# The measured properties only GPUs produce (their utilisation, power and memory): a run on the CPU
# (number_gpus 0) records them as 0, or not at all.
GPU_ONLY = tuple(name for name in (*BENCHMARK_MEASURED, *MEMORY_GIB) if name.startswith("gpu_"))


def shown_columns(columns: Sequence[str], number_gpus: Iterable[Any]) -> list[str]:
    """The columns a table of results shows: all of them, without GPU_ONLY where every row ran on the CPU
    (number_gpus 0 in each: a column of zeros says nothing; a row whose number_gpus is unknown keeps them).
    For tables people read: files (CSV, JSON, ado's layout) keep every column."""
    gpus = list(number_gpus)
    if gpus and all(n == 0 for n in gpus):
        return [c for c in columns if c not in GPU_ONLY]
    return list(columns)
