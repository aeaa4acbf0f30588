"""Import and export in the reference's layouts (ado `show measurements -o csv`, LLMFineTuningBench)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from layout import DATA

from tunebench.commands.main import main
from tunebench.errors import InputError
from tunebench.store import Store
from tunebench.store.csvio import export_csv, import_csv, parse_entity_id, parse_experiment_id

DATA = DATA
ADO_CSV = (
    DATA / "ado_docs_example_smollm2_cpu_measurements.csv"
)  # also shipped in src/tunebench/plan/data/measurements/ado/
BENCH_CSV = DATA / "llmfinetuningbench_layout_sample.csv"  # LLMFineTuningBench's header, made-up rows


def test_round_trip_of_the_reference_layout_is_exact(tmp_path):
    with Store(tmp_path / "s.db") as store:
        summary = import_csv(store, ADO_CSV)
        assert (summary.rows, summary.added, summary.valid, summary.ignored_columns) == (4, 4, 4, [])
        out = io.StringIO()
        assert export_csv(store, out) == 4
    assert out.getvalue() == ADO_CSV.read_text()


def test_imported_rows_are_memoised_under_tunebench_ids(tmp_path):
    with Store(tmp_path / "s.db") as store:
        import_csv(store, ADO_CSV)
        again = import_csv(store, ADO_CSV)
        assert (again.added, again.already_present) == (0, 4)
        rows = store.rows()
    assert len(rows) == 4
    assert {r["experiment_id"] for r in rows} == {
        "finetune_full_benchmark-v1.0.0-flash_attn.0-fms_hf_tuning_version.2.8.2-stop_after_seconds.30"
    }
    first = rows[0]
    assert first["entity_id"] == "model_name.smollm2-135m-number_gpus.0-model_max_length.512-batch_size.1"
    assert first["properties"]["dataset_tokens_per_second"] == 2624.0452059069926
    assert first["properties"]["is_valid"] == 1 and first["status"] == "valid"


def test_export_of_native_results_reimports_identically(tmp_path):
    with Store(tmp_path / "a.db") as a:
        import_csv(a, ADO_CSV)
        first = io.StringIO()
        export_csv(a, first)
    (tmp_path / "a.csv").write_text(first.getvalue())
    with Store(tmp_path / "b.db") as b:
        import_csv(b, tmp_path / "a.csv")
        second = io.StringIO()
        export_csv(b, second)
    assert second.getvalue() == first.getvalue()


def test_llmfinetuningbench_layout(tmp_path):
    with Store(tmp_path / "s.db") as store:
        with pytest.raises(InputError, match=r"line 5: experiment_id.*finetune-full-fsdp.*--skip-bad-rows"):
            import_csv(store, BENCH_CSV)
        assert store.rows() == []  # all or nothing
        summary = import_csv(store, BENCH_CSV, skip_bad_rows=True)
        assert (summary.added, summary.valid, summary.invalid) == (3, 2, 1)
        assert sum(summary.skipped.values()) == 1
        rows = {r["entity_id"]: r for r in store.rows()}
    lora = rows[
        "model_name.llama3.1-70b-number_gpus.16-model_max_length.1024-batch_size.32"
        "-gpu_model.NVIDIA-A100-SXM4-80GB-number_nodes.2"
    ]
    assert lora["experiment_id"] == "finetune_lora_benchmark-v1.0.0-fms_hf_tuning_version.2.4.0"
    assert lora["properties"]["dataset_tokens_per_second"] == 5775.5 and lora["properties"]["is_valid"] == 1
    oom = next(r for r in rows.values() if r["entity"]["model_name"] == "granite-3.1-8b-instruct")
    assert oom["status"] == "invalid" and oom["properties"] == {"is_valid": 0}
    assert oom["entity"]["enable_roce"] is True and oom["entity"]["model_max_length"] == 8192
    # no is_valid value but a train_runtime: valid; the experiment comes from `method`
    l40s = rows["model_name.llama3-8b-number_gpus.2-model_max_length.2048-batch_size.8-gpu_model.NVIDIA-L40S"]
    assert l40s["experiment_id"] == "finetune_full_benchmark-v1.0.0" and l40s["status"] == "valid"


def test_experiment_ids_with_unknown_parameters_are_named():
    exp = parse_experiment_id(
        "SFTTrainer.finetune_full_benchmark-v1.0.0-fms_hf_tuning_version.2.8.2-stop_after_seconds.30-flash_attn.0"
    )
    assert exp.parameters == {"fms_hf_tuning_version": "2.8.2", "stop_after_seconds": 30.0, "flash_attn": False}
    exp = parse_experiment_id("finetune_lora_benchmark-v1.0.0-dataset_id.news-chars-512-entries-4096-max_steps.2")
    assert exp.parameters["dataset_id"] == "news-chars-512-entries-4096"
    with pytest.raises(InputError, match="unknown parameter 'warp_speed'"):
        parse_experiment_id("SFTTrainer.finetune_full_benchmark-v1.0.0-stop_after_seconds.30-warp_speed.9")
    with pytest.raises(InputError, match="unknown experiment"):
        parse_experiment_id("SFTTrainer.finetune-full-fsdp-v1.3.0")
    assert parse_entity_id("dataset_id.news-tokens-16384plus-entries-4096-model_name.llama3-8b-number_gpus.2.0") == {
        "dataset_id": "news-tokens-16384plus-entries-4096",
        "model_name": "llama3-8b",
        "number_gpus": "2.0",
    }


def test_cli_import_export_show(tmp_path, capsys):
    db = str(tmp_path / "s.db")
    assert main(["import", str(ADO_CSV), "--store", db]) == 0
    assert "4 added" in capsys.readouterr().out
    out = tmp_path / "out.csv"
    assert main(["export", "--format", "ado-csv", "--output", str(out), "--store", db]) == 0
    assert out.read_text() == ADO_CSV.read_text()
    assert main(["show", "--format", "json", "--store", db]) == 0
    records = json.loads(capsys.readouterr().out)
    assert len(records) == 4 and records[0]["status"] == "valid" and records[0]["model_max_length"] == 512
    assert main(["show", "--format", "parquet", "--output", str(tmp_path / "x.parquet"), "--store", db]) == 0
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "x.parquet")
    assert table.num_rows == 4 and table.schema.field("dataset_tokens_per_second").type == "double"
    assert main(["export", "--format", "xml", "--store", db]) == 2
    assert "allowed: ado-csv" in capsys.readouterr().err
    assert main(["import", str(BENCH_CSV), "--store", db]) == 2
    assert "--skip-bad-rows" in capsys.readouterr().err


HEADER = (
    ",identifier,generatorid,experiment_id,model_name,model_max_length,batch_size,number_gpus,is_valid,train_runtime"
)
EXPERIMENT = "SFTTrainer.finetune_lora_benchmark-v1.0.0-max_steps.2"


def _ado_csv(tmp_path, *cells: str) -> Path:
    rows = [f"{i},x,g,{EXPERIMENT},smollm2-135m,256,{i + 1},0,{c}" for i, c in enumerate(cells)]
    path = tmp_path / "ado.csv"
    path.write_text(HEADER + "\n" + "\n".join(rows) + "\n")
    return path


def test_ado_lists_of_repeats_become_one_result_each(tmp_path):
    # is_valid [1, 0]: one valid repeat then an invalid one, which records is_valid alone
    path = _ado_csv(tmp_path, '"[1, 0]",51.7', '"[True, True]","[51.7, 58.6]"')
    with Store(tmp_path / "s.db") as store:
        summary = import_csv(store, path)
        assert (summary.rows, summary.results, summary.valid, summary.invalid) == (2, 4, 3, 1)
        results = [store.results_of(r["request_id"]) for r in store.rows()]
    assert [[(x.status, x.properties.get("train_runtime")) for x in r] for r in results] == [
        [("valid", 51.7), ("invalid", None)],
        [("valid", 51.7), ("valid", 58.6)],
    ]
    assert results[1][1].metadata["repeat"] == {"index": 2, "of": 2}


@pytest.mark.parametrize(
    "cells, column",
    [
        (('"[1, 1]","[51.7, 58.6, 60.0]"',), "train_runtime"),  # three values for two repeats
        (('"[1, 1]","[51.7, fast]"',), "train_runtime"),
        (('"[1, 2]",51.7',), "is_valid"),
        (('1,"[[51.7]]"',), "train_runtime"),
    ],
)
def test_an_unreadable_ado_cell_names_its_column_and_writes_nothing(tmp_path, capsys, cells, column):
    db = tmp_path / "s.db"
    assert main(["import", str(_ado_csv(tmp_path, *cells)), "--store", str(db)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"line 2: {column}:" in err[0]
    assert not db.exists()


def test_ado_aggregated_columns(tmp_path, capsys):
    path = tmp_path / "mean.csv"
    path.write_text(
        HEADER.replace("is_valid,train_runtime", "is_valid-mean,train_runtime-mean") + "\n"
        f"0,x,g,{EXPERIMENT},smollm2-135m,256,2,0,1.0,55.15\n"
    )
    with Store(tmp_path / "s.db") as store:
        assert import_csv(store, path).valid == 1
        (row,) = store.rows()
    assert row["status"] == "valid" and row["properties"]["train_runtime"] == 55.15
    assert store.results_of(row["request_id"])[0].metadata["aggregate"] == "mean"
    path.write_text(path.read_text().replace(",1.0,55.15", ",0.5,55.15"))  # repeats that disagree on validity
    assert main(["import", str(path), "--store", str(tmp_path / "b.db")]) == 2
    assert "is_valid-mean" in capsys.readouterr().err
    path.write_text(path.read_text().replace("train_runtime-mean", "train_runtime-max"))
    assert main(["import", str(path), "--store", str(tmp_path / "b.db")]) == 2
    assert "mean.csv: train_runtime-max: holds the max" in capsys.readouterr().err
    assert not (tmp_path / "b.db").exists()


def test_text_a_spreadsheet_would_run_is_exported_inert(tmp_path):
    # OWASP CSV injection: a cell starting with = + - @ is a formula to Excel/LibreOffice; exported with a leading '
    header, first, *rest = ADO_CSV.read_text().splitlines()
    cells = first.split(",")
    cells[1] = '"=HYPERLINK(""http://example.invalid"",""x"")"'
    (tmp_path / "f.csv").write_text("\n".join([header, ",".join(cells), *rest]) + "\n")
    with Store(tmp_path / "s.db") as store:
        import_csv(store, tmp_path / "f.csv")
        out = io.StringIO()
        export_csv(store, out)
    rows = list(csv.reader(io.StringIO(out.getvalue())))
    identifiers = [r[1] for r in rows[1:]]
    assert '\'=HYPERLINK("http://example.invalid","x")' in identifiers
    assert not any(cell.startswith(("=", "+", "@")) for r in rows for cell in r)
    assert [r[-1] for r in rows[1:]] == ["1", "1", "1", "1"]  # numbers stay numbers
