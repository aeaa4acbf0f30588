"""`tunebench show` and `export` on a real store (SQLite and PostgreSQL): which actuator produced each row,
filters, sorting, top-k, memory columns, every row when asked, cut and empty tables."""

from __future__ import annotations

import csv
import io
import json

import pytest
from layout import DATA

from tunebench.commands.main import main
from tunebench.spec.experiments import get_experiment, make_entity
from tunebench.spec.results import Result
from tunebench.store import Store
from tunebench.store.store import Record

ADO_CSV = DATA / "ado_docs_example_smollm2_cpu_measurements.csv"
EXP = get_experiment("finetune_full_benchmark-v1.0.0", {"stop_after_seconds": 30})


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # rich lays tables out this wide: whole names, one line per row


def records(actuator: str, n: int, *, start: int = 0, memory: bool = False) -> list[Record]:
    """n valid results of actuator: batch sizes start+1.., throughput 1000 + 10 * batch size."""
    out = []
    for i in range(start, start + n):
        gpu = {"number_gpus": 1, "gpu_model": "A100-80GB"} if memory else {"number_gpus": 0}  # GPU memory: a GPU run
        entity = make_entity(EXP, {"model_name": "smollm2-135m", **gpu, "model_max_length": 128, "batch_size": i + 1})
        props = {"dataset_tokens_per_second": 1000.0 + 10 * (i + 1), "train_runtime": 3.0, "is_valid": 1}
        if memory:
            props["gpu_memory_allocated_peak_gib"] = 0.5 * (i + 1)
        result = Result.valid(EXP.id, entity.id, props, actuator=actuator)
        out.append(Record(EXP, entity, result, actuator=actuator, generator="test"))
    return out


def fill(url: str, *groups: list[Record]) -> None:
    with Store(url) as store:
        for group in groups:
            store.record_many(group)


def show_json(url: str, capsys, *args: str) -> list[dict]:
    assert main(["show", "--store", url, "--format", "json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_every_command_works_on_the_store(any_store_url, tmp_path, capsys):
    """import, show in every format and export, on SQLite and on a PostgreSQL server."""
    assert main(["import", str(ADO_CSV), "--store", any_store_url]) == 0
    assert "4 added" in capsys.readouterr().out
    out = tmp_path / "out.csv"
    assert main(["export", "--output", str(out), "--store", any_store_url]) == 0
    assert out.read_text() == ADO_CSV.read_text()
    rows = show_json(any_store_url, capsys)
    assert len(rows) == 4 and rows[0]["model_max_length"] == 512 and rows[0]["actuator"] == "measure"
    assert main(["show", "--store", any_store_url, "--format", "csv"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 5
    assert main(["show", "--store", any_store_url, "--format", "parquet", "-o", str(tmp_path / "x.parquet")]) == 0
    assert main(["show", "--store", any_store_url]) == 0
    assert "smollm2-135m" in capsys.readouterr().out


def test_show_names_the_actuator_of_every_row(tmp_path, capsys):
    url = str(tmp_path / "s.db")
    fill(url, records("measure", 2), records("predict", 3), records("noop", 1, start=5))
    rows = show_json(url, capsys)
    assert sorted(r["actuator"] for r in rows) == ["measure", "measure", "noop", "predict", "predict", "predict"]
    assert main(["show", "--store", url, "--format", "csv"]) == 0
    header = capsys.readouterr().out.splitlines()[0].split(",")
    assert header[3:5] == ["experiment_id", "actuator"]
    assert main(["show", "--store", url]) == 0  # the terminal table too
    assert "actuator" in capsys.readouterr().out
    assert len(show_json(url, capsys, "--actuator", "all")) == 6  # all: every actuator's, as without the option
    assert len(show_json(url, capsys, "--actuator", "predict")) == 3


def test_repeats_are_one_row_with_their_mean_and_spread_or_each_its_own_row(tmp_path, capsys):
    url = str(tmp_path / "s.db")
    first = records("measure", 2)
    again = records("measure", 1)  # batch size 1 measured a second time, slower
    again[0].result.properties["dataset_tokens_per_second"] = 1030.0
    fill(url, first, again)
    rows = show_json(url, capsys)
    assert [(r["batch_size"], r["repeats"]) for r in rows] == [(1, 2), (2, 1)]
    assert rows[0]["dataset_tokens_per_second"] == 1020.0 and rows[0]["dataset_tokens_per_second-std"] == pytest.approx(
        (2 * 10.0**2) ** 0.5
    )  # sample standard deviation of 1010 and 1030
    assert rows[1]["dataset_tokens_per_second"] == 1020.0 and rows[1]["dataset_tokens_per_second-std"] is None
    every = show_json(url, capsys, "--repeats")
    assert [(r["batch_size"], r["dataset_tokens_per_second"]) for r in every] == [(1, 1010.0), (1, 1030.0), (2, 1020.0)]
    assert main(["show", "--store", url]) == 0
    assert "dataset_tokens_per_second-std" in capsys.readouterr().out


def test_export_writes_measurements_only_unless_asked(tmp_path, capsys):
    url = str(tmp_path / "s.db")
    fill(url, records("measure", 2), records("predict", 3), records("noop", 1, start=5))
    assert main(["export", "--store", url]) == 0
    exported = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(exported) == 2 and all(r["experiment_id"].startswith("SFTTrainer.") for r in exported)
    assert main(["export", "--store", url, "--actuator", "all"]) == 0
    every = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    prefixes = sorted(r["experiment_id"].split(".", 1)[0] for r in every)
    assert prefixes == ["SFTTrainer", "SFTTrainer", "noop", "predict", "predict", "predict"]
    assert main(["export", "--store", url, "--actuator", "predict"]) == 0
    predicted = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(predicted) == 3 and not any(r["experiment_id"].startswith("SFTTrainer.") for r in predicted)
    # what ado would read back as measurements: only the measured rows
    (tmp_path / "all.csv").write_text(",".join(every[0]) + "\n")
    with (tmp_path / "all.csv").open("a", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(r.values() for r in every)
    assert main(["import", str(tmp_path / "all.csv"), "--store", str(tmp_path / "b.db"), "--skip-bad-rows"]) == 0
    assert "2 added" in capsys.readouterr().out


def test_where_sort_and_top(any_store_url, capsys):
    fill(any_store_url, records("measure", 6), records("predict", 2, start=10))
    rows = show_json(any_store_url, capsys, "--where", "batch_size>=3", "--where", "actuator=measure")
    assert sorted(r["batch_size"] for r in rows) == [3, 4, 5, 6]
    rows = show_json(any_store_url, capsys, "--sort", "dataset_tokens_per_second:desc", "--actuator", "measure")
    assert [r["batch_size"] for r in rows] == [6, 5, 4, 3, 2, 1]
    rows = show_json(any_store_url, capsys, "--sort", "batch_size")
    assert [r["batch_size"] for r in rows] == [1, 2, 3, 4, 5, 6, 11, 12]
    rows = show_json(any_store_url, capsys, "--top", "2")  # the fastest two
    assert [r["batch_size"] for r in rows] == [12, 11] and {r["actuator"] for r in rows} == {"predict"}
    rows = show_json(any_store_url, capsys, "--top", "1", "--where", "actuator=measure", "--sort", "batch_size:asc")
    assert [r["batch_size"] for r in rows] == [1]
    assert main(["show", "--store", any_store_url, "--where", "warp_speed>1"]) == 2
    assert "--where: no column 'warp_speed'" in capsys.readouterr().err
    assert main(["show", "--store", any_store_url, "--where", "batch_size"]) == 2
    assert "--where" in capsys.readouterr().err
    assert main(["show", "--store", any_store_url, "--sort", "batch_size:sideways"]) == 2
    assert "--sort" in capsys.readouterr().err


def test_the_table_shows_memory_and_says_when_rows_are_cut(tmp_path, capsys):
    url = str(tmp_path / "s.db")
    fill(url, records("measure", 60, memory=True))
    assert main(["show", "--store", url]) == 0
    out = capsys.readouterr().out
    assert "gpu_memory_allocated_peak_gib" in out and "24.5" in out  # batch size 49: 24.5 GiB
    rows = [line for line in out.splitlines() if line.startswith("│")]  # one line per row on a wide terminal
    assert len(rows) == 50 and "showing 50 of 60 rows" in out and "--all" in out
    assert main(["show", "--store", url, "--all"]) == 0
    out = capsys.readouterr().out
    assert len([line for line in out.splitlines() if line.startswith("│")]) == 60 and "showing" not in out
    assert main(["show", "--store", url, "--limit", "10"]) == 0
    assert "showing 10 of 60 rows" in capsys.readouterr().out


def test_an_empty_table_says_no_results(tmp_path, capsys):
    url = str(tmp_path / "s.db")
    Store(url).close()
    assert main(["show", "--store", url]) == 0
    out = capsys.readouterr().out
    assert out.startswith("no results in sqlite:///") and "status" not in out and "reason" not in out
    fill(url, records("measure", 2))
    assert main(["show", "--store", url, "--where", "batch_size>100"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("no results in") and "where batch_size>100" in out


@pytest.mark.parametrize("actuator", ["predict", "noop"])
def test_export_of_other_actuators_is_never_read_back_as_measured(tmp_path, capsys, actuator):
    url = str(tmp_path / "s.db")
    fill(url, records(actuator, 2))
    assert main(["export", "--store", url]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("\n") == 1  # the header only
    assert "--actuator all" in captured.err


def test_explore_run_and_plan_compare_on_the_store(any_store_url, tmp_path, capsys):
    """explore (and its resume), run and plan --compare, on SQLite and on a PostgreSQL server."""
    space = tmp_path / "space.yaml"
    space.write_text(
        json.dumps(
            {
                "experiments": [{"id": "finetune_full_benchmark-v1.0.0"}],
                "entity_space": {
                    "model_name": "smollm2-135m",
                    "model_max_length": 64,
                    "number_gpus": 0,
                    "batch_size": [1, 2],
                },
                "actuator": {"name": "noop"},
            }
        )
    )
    assert main(["explore", str(space), "--store", any_store_url, "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["valid"] == 2
    assert main(["explore", str(space), "--store", any_store_url, "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["memoised"] == 2
    entity = ["model_name=smollm2-135m", "model_max_length=64", "number_gpus=2", "batch_size=3"]  # invalid: no run
    assert main(["run", "finetune_full_benchmark-v1.0.0", *entity, "--store", any_store_url, "--json"]) == 0
    capsys.readouterr()
    rows = show_json(any_store_url, capsys, "--sort", "batch_size")
    assert [(r["actuator"], r["batch_size"], r["status"]) for r in rows] == [
        ("noop", 1, "valid"),
        ("noop", 2, "valid"),
        ("measure", 3, "invalid"),
    ]
    fill(any_store_url, records("measure", 1))  # batch size 1 of EXP, 1010 tokens/s
    assert (
        main(
            [
                "plan",
                EXP.base_id,
                "-p",
                "stop_after_seconds=30",
                "model_name=smollm2-135m",
                "number_gpus=0",
                "model_max_length=128",
                "batch_size=1",
                "--compare",
                "--store",
                any_store_url,
                "--json",
            ]
        )
        == 0
    )
    compared = json.loads(capsys.readouterr().out)
    assert compared["measured"]["properties"]["dataset_tokens_per_second"] == 1010.0


def test_a_column_empty_in_every_row_is_named_once_as_a_dash(tmp_path, capsys):
    url = str(tmp_path / "s.db")
    fill(url, records("measure", 2, memory=True), records("measure", 2, start=5))  # gpu_model set, then none
    assert main(["show", "--store", url, "--where", "number_gpus=0"]) == 0
    title = capsys.readouterr().out.splitlines()[0]
    assert "gpu_model -" in title and "gpu_model ," not in title


def test_a_long_experiment_id_in_the_title_wraps_whole_at_80_columns(tmp_path, capsys, monkeypatch):
    """The title names the one experiment in full, wrapped after '-' or '_' as plan prints it (was: shortened in
    the middle, so it could not be copied into the next command)."""
    monkeypatch.setenv("COLUMNS", "80")
    long = get_experiment(EXP.base_id, {"stop_after_seconds": 30, "gradient_accumulation_steps": 2, "max_steps": 7})
    assert len(long.id) > 80
    url = str(tmp_path / "s.db")
    entity = make_entity(
        long, {"model_name": "smollm2-135m", "number_gpus": 0, "model_max_length": 128, "batch_size": 1}
    )
    result = Result.valid(long.id, entity.id, {"dataset_tokens_per_second": 10.0, "is_valid": 1}, actuator="measure")
    fill(url, [Record(long, entity, result, actuator="measure", generator="test")])
    assert main(["show", "--store", url]) == 0
    lines = capsys.readouterr().out.splitlines()
    title = "".join(lines[: next(i for i, line in enumerate(lines) if line.startswith("┏"))])
    assert long.id in title and "…" not in title
    assert all(len(line) <= 80 for line in lines)
