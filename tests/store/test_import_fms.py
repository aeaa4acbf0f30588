"""`tunebench import` of fms-acceleration's benchmark CSVs (the files the planner ships under
src/tunebench/plan/data/measurements/fms-acceleration/), mapped as tunebench.store.fms_csv says."""

from __future__ import annotations

import csv
import json

import pytest

from tunebench.commands.main import main
from tunebench.commands.terminal import Column, fit
from tunebench.plan.measurements import FMS
from tunebench.units import GIB

LIGER = FMS / "refs_a100_80gb_liger.csv"  # Mistral-7B and Llama-3-8B: every model in the catalog
REFS = FMS / "refs_a100_80gb.csv"  # also gpt_bigcode-santacoder, which the catalog lacks


def _rows(path):
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _stored(db, capsys):
    """Every stored result (show --repeats --format json): one dict each."""
    capsys.readouterr()
    assert main(["show", "--store", str(db), "--repeats", "--format", "json", "--all"]) == 0
    return json.loads(capsys.readouterr().out)


def test_import_the_shipped_fms_acceleration_csv(tmp_path, capsys):
    db = tmp_path / "runs.db"
    assert main(["import", str(LIGER), "--store", str(db)]) == 0
    out = capsys.readouterr().out
    assert "192 rows, 192 added (131 valid, 61 invalid in the file)" in out
    rows = _stored(db, capsys)
    assert len(rows) == 192 and {r["actuator"] for r in rows} == {"measure"}
    # one row by hand: a valid LoRA run of Llama-3-8B on 2 GPUs
    source = next(
        r
        for r in _rows(LIGER)
        if r["num_gpus"] == "2"
        and r["peft_method"] == "lora"
        and r["train_tokens_per_second"]
        and r["model_name_or_path"] == "meta-llama/Meta-Llama-3-8B"
    )
    per_device = int(source["per_device_train_batch_size"])
    stored = [
        r
        for r in rows
        if r["model_name"] == "llama3-8b"
        and r["number_gpus"] == 2
        and r["batch_size"] == 2 * per_device
        and r["experiment_id"] == "finetune_lora_benchmark-v1.0.0"
        and r.get("train_tokens_per_gpu_per_second") == float(source["train_tokens_per_second"])
    ]
    assert len(stored) == 1, "the row's entity: llama3-8b, 2 GPUs, batch = per-device batch x GPUs"
    props = stored[0]
    assert props["model_max_length"] == 4096 and props["gpu_model"] == "NVIDIA-A100-SXM4-80GB"
    assert props["train_tokens_per_second"] == pytest.approx(2 * float(source["train_tokens_per_second"]))
    assert props["train_runtime"] == float(source["train_runtime"])
    assert props["gpu_memory_allocated_peak_gib"] == pytest.approx(
        float(source["mem_peak_torch_mem_alloc_in_bytes"]) / GIB
    )
    assert props["gpu_memory_peak_gib"] is None  # nvidia-smi is averaged over the 2 devices: not rank 0's
    # a run without throughput failed (out of memory): invalid
    assert sum(r["status"] == "invalid" for r in rows) == sum(not r["train_tokens_per_second"] for r in _rows(LIGER))
    # a second import adds nothing
    assert main(["import", str(LIGER), "--store", str(db)]) == 0
    assert "0 added" in capsys.readouterr().out and len(_stored(db, capsys)) == 192


def test_a_model_outside_the_catalog_stops_the_import_naming_its_line(tmp_path, capsys):
    db = tmp_path / "runs.db"
    assert main(["import", str(REFS), "--store", str(db)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "error: refs_a100_80gb.csv line 2: model_name: unknown model 'bigcode/gpt_bigcode-santacoder'"
    )
    assert not db.exists()  # nothing written
    assert main(["import", str(REFS), "--store", str(db), "--skip-bad-rows"]) == 0
    out = capsys.readouterr().out
    assert "124 rows, 108 added" in out and "skipped 16: model_name" in out
    assert len(_stored(db, capsys)) == 108


@pytest.mark.parametrize(
    ("column", "value"), [("train_runtime", "-5"), ("mem_nvidia_mem_reserved", "inf"), ("num_gpus", "two")]
)
def test_a_bad_cell_is_one_line_naming_its_column(tmp_path, capsys, column, value):
    rows = _rows(LIGER)
    rows[3][column] = value
    path = tmp_path / "refs_a100_80gb_liger.csv"
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert main(["import", str(path), "--store", str(tmp_path / "runs.db")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {path.name} line 5: {column}: "), err
    assert "(allowed: a finite number >= 0)" in err[0]


def test_show_a_column_whose_shown_cells_are_all_empty(tmp_path, capsys):
    """show's table fits a column whose every shown cell is empty (r and target_modules of full fine-tuning)."""
    db = tmp_path / "runs.db"
    assert main(["import", str(REFS), "--store", str(db), "--skip-bad-rows"]) == 0
    capsys.readouterr()
    assert main(["show", "--store", str(db), "--limit", "5"]) == 0
    assert "showing 5 of 96 rows" in capsys.readouterr().out
    assert fit([Column("r", breaks=True)], [[""], [""]], 80) == ([0], {0: 1})
