"""Real stores for the report and API tests: explore with the planner and a test actuator, import CSV rows.

The imported "measurements" are written as the reference's ado CSV layout: A100 rows whose throughput
and memory are the planner's prediction times a fixed factor per row (so prediction errors are known),
rows the planner predicts will not fit imported as is_valid=0 (out of memory), and stability rows.
"""

from __future__ import annotations

import csv
from pathlib import Path

from tunebench.commands.main import main

GPU = "NVIDIA-A100-SXM4-80GB"
MODEL = "llama3.1-8b"
LENGTHS = (512, 1024, 2048, 4096, 8192)
BATCHES = (1, 2, 4, 8, 16, 32)
# a test actuator (tests/fake_actuators.py): invalid as out of memory above max_batch
OOM_ACTUATOR = "fake_actuators:oom_above"

PREDICT_SPACE = f"""
experiments:
  - id: finetune_lora_benchmark-v1.0.0
entity_space:
  model_name: [{MODEL}]
  number_gpus: 1
  gpu_model: {GPU}
  model_max_length: [{", ".join(map(str, LENGTHS))}]
  batch_size: [{", ".join(map(str, BATCHES))}]
actuator: {{name: predict}}
operation: {{sampler: grid}}
"""

TESTING_SPACE = f"""
experiments:
  - id: finetune_full_benchmark-v1.0.0
entity_space:
  model_name: [smollm2-135m]
  number_gpus: 0
  model_max_length: [128, 256, 512]
  batch_size: [1, 2, 4, 8]
actuator: {{name: "{OOM_ACTUATOR}", max_batch: 4}}
operation: {{sampler: grid}}
"""

MEASURED_COLUMNS = ("gpu_memory_utilization_peak", "train_runtime", "train_tokens_per_second",
                    "dataset_tokens_per_second", "dataset_tokens_per_second_per_gpu", "is_valid")  # fmt: skip


def explore(tmp: Path, store: str, text: str, name: str, *extra: str) -> None:
    space = tmp / name
    space.write_text(text)
    code = main(["explore", str(space), "--store", store, "--quiet", *extra])
    assert code == 0


def measured_rows() -> list[dict[str, object]]:
    """ado-layout rows: full fine-tuning of MODEL on one A100, measured = predicted x (0.8 .. 1.2)."""
    from tunebench.plan import predict_many
    from tunebench.spec.experiments import get_experiment

    experiment = get_experiment("finetune_full_benchmark-v1.0.0")
    values = [
        {"model_name": MODEL, "number_gpus": 1, "gpu_model": GPU, "model_max_length": n, "batch_size": b}
        for n in LENGTHS
        for b in BATCHES
    ]
    rows = []
    for i, (v, result) in enumerate(zip(values, predict_many([(experiment, v) for v in values]))):
        factor = 0.8 + 0.4 * ((i * 7) % 11) / 10  # 0.8 .. 1.2, the same every run
        pred = result.metadata["predicted"]
        row: dict[str, object] = {
            "identifier": result.entity_id,
            "generatorid": "explicit_grid_sample_generator",
            "experiment_id": "SFTTrainer.finetune_full_benchmark-v1.0.0",
            **v,
        }
        if result.metadata["fits"]:
            row.update({k: pred[k] * factor for k in MEASURED_COLUMNS[:-1]})
            row["gpu_memory_utilization_peak"] = min(99.0, pred["gpu_memory_utilization_peak"] * factor)
            row["is_valid"] = 1
        else:
            row["is_valid"] = 0
        rows.append(row)
    return rows


def stability_rows() -> list[dict[str, object]]:
    """ado-layout rows of the stability experiment: the OOM fraction grows with the batch size."""
    rows = []
    for i, batch in enumerate((8, 16, 32, 64)):
        oom = min(1.0, i / 3)
        other = 0.1 if i == 1 else 0.0
        rows.append(
            {
                "identifier": f"model_name.{MODEL}-number_gpus.1-model_max_length.4096-batch_size.{batch}-gpu_model.{GPU}",
                "generatorid": "explicit_grid_sample_generator",
                "experiment_id": "SFTTrainer.finetune_full_stability-v1.0.0",
                "model_name": MODEL,
                "number_gpus": 1,
                "gpu_model": GPU,
                "model_max_length": 4096,
                "batch_size": batch,
                "f_gpu_oom": oom,
                "f_other_error": other,
                "f_no_error": 1 - oom - other,
                "is_valid": 1,
            }
        )
    return rows


def write_csv(path: Path, rows: list[dict[str, object]]) -> Path:
    columns = list(dict.fromkeys(k for row in rows for k in row))
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, ["", *columns])
        writer.writeheader()
        for i, row in enumerate(rows):
            writer.writerow({"": i, **row})
    return path


def import_rows(tmp: Path, store: str, rows: list[dict[str, object]], name: str) -> None:
    code = main(["import", str(write_csv(tmp / name, rows)), "--store", store])
    assert code == 0


def mixed_store(tmp: Path) -> str:
    """A store with predictions, test-actuator results (some out of memory), imported A100 and stability rows."""
    store = f"sqlite:///{tmp / 'mixed.db'}"
    explore(tmp, store, PREDICT_SPACE, "predict.yaml")
    explore(tmp, store, TESTING_SPACE, "testing.yaml", "--allow-actuator-import")
    import_rows(tmp, store, measured_rows(), "measured.csv")
    import_rows(tmp, store, stability_rows(), "stability.csv")
    return store


def predicted_store(tmp: Path) -> str:
    """A store with the planner's predictions only."""
    store = f"sqlite:///{tmp / 'predicted.db'}"
    explore(tmp, store, PREDICT_SPACE, "predict.yaml")
    return store


# What a newcomer's first store holds: the planner's LoRA and full fine-tuning of one model on two GPUs in
# bf16 and fp32, noop results (measuring nothing) on one of them, and measured CPU runs (no GPU memory: 0).
NEWCOMER_GPUS = ("NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3")
NEWCOMER_PREDICT = f"""
experiments:
  - id: finetune_lora_benchmark-v1.0.0
  - id: finetune_full_benchmark-v1.0.0
entity_space:
  model_name: [smollm2-135m]
  number_gpus: 1
  gpu_model: [{", ".join(NEWCOMER_GPUS)}]
  torch_dtype: [bfloat16, float32]
  model_max_length: [512, 2048, 4096]
  batch_size: [1, 2, 4]
actuator: {{name: predict}}
operation: {{sampler: grid}}
"""
NOOP_SPACE = f"""
experiments:
  - id: finetune_lora_benchmark-v1.0.0
entity_space:
  model_name: [smollm2-135m]
  number_gpus: 1
  gpu_model: {NEWCOMER_GPUS[0]}
  model_max_length: [512, 2048]
  batch_size: [1, 2]
actuator: {{name: noop}}
operation: {{sampler: grid}}
"""


def cpu_rows() -> list[dict[str, object]]:
    """ado-layout measurements of full fine-tuning on the CPU: GPU memory 0, as the worker records it there."""
    rows = []
    for i, (length, batch) in enumerate([(512, 1), (512, 2), (1024, 1), (1024, 2)]):
        rows.append(
            {
                "identifier": f"model_name.smollm2-135m-number_gpus.0-model_max_length.{length}-batch_size.{batch}",
                "generatorid": "explicit_grid_sample_generator",
                "experiment_id": "SFTTrainer.finetune_full_benchmark-v1.0.0",
                "model_name": "smollm2-135m",
                "number_gpus": 0,
                "model_max_length": length,
                "batch_size": batch,
                "gpu_memory_utilization_peak": 0.0,
                "train_runtime": 30.0 + i,
                "dataset_tokens_per_second": 2000.0 + 500 * i,
                "is_valid": 1,
            }
        )
    return rows


def newcomer_store(tmp: Path) -> str:
    store = f"sqlite:///{tmp / 'newcomer.db'}"
    explore(tmp, store, NEWCOMER_PREDICT, "predict.yaml")
    explore(tmp, store, NOOP_SPACE, "noop.yaml")
    import_rows(tmp, store, cpu_rows(), "cpu.csv")
    return store
