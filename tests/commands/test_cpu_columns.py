"""Tables of CPU runs leave out the GPUs' measured properties (a column of zeros says nothing):
spec.measured.shown_columns, used by the report's table, show, run's result and plan --compare."""

from __future__ import annotations

from tunebench.commands.main import main, print_result
from tunebench.report.data import load
from tunebench.report.html import table_columns
from tunebench.spec.experiments import get_experiment, make_entity
from tunebench.spec.measured import (
    BENCHMARK_MEASURED,
    GPU_ONLY,
    MEMORY_GIB,
    shown_columns,
)
from tunebench.spec.results import Result
from tunebench.store import Store
from tunebench.store.rows import Record

EXP = get_experiment("finetune_lora_benchmark-v1.0.0", {"max_steps": 2})
# what the measuring actuator records on the CPU: the GPUs' properties as 0
CPU_RUN = {**{n: 0.0 for n in GPU_ONLY}, "train_runtime": 30.0, "dataset_tokens_per_second": 80.0,
           "cpu_compute_utilization": 120.0, "cpu_memory_utilization": 9.0}  # fmt: skip
GPU_RUN = {**{n: 40.0 for n in GPU_ONLY}, "train_runtime": 3.0, "dataset_tokens_per_second": 8000.0}


def test_gpu_only_is_every_gpu_property_of_the_spec_and_tunebench():
    assert "gpu_power_watts_avg" in GPU_ONLY and "gpu_memory_peak_gib" in GPU_ONLY
    assert len(GPU_ONLY) == sum(n.startswith("gpu_") for n in BENCHMARK_MEASURED) + len(MEMORY_GIB) == 16
    assert not any(n.startswith(("cpu_", "train_", "dataset_")) for n in GPU_ONLY)


def test_shown_columns():
    names = ["train_runtime", "gpu_power_watts_avg", "gpu_memory_peak_gib", "cpu_memory_utilization"]
    assert shown_columns(names, [0, 0]) == ["train_runtime", "cpu_memory_utilization"]
    assert shown_columns(names, [0, 2]) == names  # one GPU run: the GPUs' columns stay
    assert shown_columns(names, []) == names and shown_columns(names, [None]) == names


def _store(tmp_path, runs):
    """A store holding one measured result per (number_gpus, properties)."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    records = []
    for i, (gpus, props) in enumerate(runs):
        values = {
            "model_name": "smollm2-135m",
            "model_max_length": 256 * (i + 1),
            "number_gpus": gpus,
            "batch_size": 2,
            **({"gpu_model": "A100-80GB"} if gpus else {}),
        }
        entity = make_entity(EXP, values)
        records.append(
            Record(EXP, entity, Result.valid(EXP.id, entity.id, props), actuator="measure", source_key=f"k{i}")
        )
    with Store(url) as store:
        store.record_many(records)
    return url


def test_report_table_of_cpu_runs_has_no_gpu_columns(tmp_path):
    url = _store(tmp_path, [(0, CPU_RUN), (0, CPU_RUN)])
    with Store(url, readonly=True) as store:
        columns = table_columns(load(store))
    assert "train_runtime" in columns and "cpu_compute_utilization" in columns
    assert not set(GPU_ONLY) & set(columns)


def test_report_table_with_a_gpu_run_keeps_them(tmp_path):
    url = _store(tmp_path, [(0, CPU_RUN), (1, GPU_RUN)])
    with Store(url, readonly=True) as store:
        columns = table_columns(load(store))
    assert "gpu_power_watts_avg" in columns and "gpu_memory_peak_gib" in columns


def test_show_of_cpu_runs_has_no_gpu_columns(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    url = _store(tmp_path, [(0, CPU_RUN), (0, CPU_RUN)])
    assert main(["show", "--store", url]) == 0
    out = capsys.readouterr().out
    assert "dataset_tokens_per_second" in out and "gpu_memory" not in out
    assert main(["show", "--store", url, "--wide"]) == 0  # every column
    assert "gpu_memory_peak_gib" in capsys.readouterr().out
    url = _store_gpu(tmp_path)
    assert main(["show", "--store", url]) == 0
    assert "gpu_memory_peak_gib" in capsys.readouterr().out


def _store_gpu(tmp_path):
    folder = tmp_path / "gpu"
    folder.mkdir()
    return _store(folder, [(0, CPU_RUN), (1, GPU_RUN)])


def test_a_cpu_runs_result_table_has_no_gpu_rows(capsys):
    result = Result.valid(EXP.id, "e", CPU_RUN)
    print_result(result, 0)
    out = capsys.readouterr().out
    assert "train_runtime" in out and "cpu_compute_utilization" in out and "gpu_" not in out
    print_result(result, 1)
    assert "gpu_power_watts_avg" in capsys.readouterr().out
