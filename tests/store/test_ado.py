"""tunebench and the real IBM ado (ado-core 2.3.0, ado-sfttrainer 1.8.12) on the same data.

ado runs in its own environment (tests/ado_env.py); its discovery spaces, sample store and CSV export
are its own. Its SFTTrainer actuator's training is left out (it installs fms-hf-tuning in a Ray
runtime environment and downloads weights): tunebench's loader (tunebench/store/ado_load.py, run with
ado's Python) hands ado the results the actuator would, through the same ado calls.
"""

from __future__ import annotations

import csv
import json

import pytest
from ado_env import Ado, ado_bin, build_with_tunebench

from tunebench.commands.main import main
from tunebench.store.ado_export import LOADER

pytestmark = pytest.mark.engines  # builds environments from the package index with uv

SPACE = """\
experiments:
- actuatorIdentifier: SFTTrainer
  experimentIdentifier: finetune_lora_benchmark-v1.0.0
  parameterization:
  - {property: {identifier: max_steps}, value: 2}
  - {property: {identifier: torch_dtype}, value: float32}
- actuatorIdentifier: SFTTrainer
  experimentIdentifier: finetune_lora_benchmark-v1.0.0
  parameterization:
  - {property: {identifier: max_steps}, value: 3}
  - {property: {identifier: torch_dtype}, value: float32}
entitySpace:
- {identifier: model_name, propertyDomain: {values: [smollm2-135m]}}
- {identifier: model_max_length, propertyDomain: {values: [256]}}
- {identifier: batch_size, propertyDomain: {values: [2, 4]}}
- {identifier: number_gpus, propertyDomain: {values: [0]}}
"""
EXP2 = "finetune_lora_benchmark-v1.0.0-max_steps.2-torch_dtype.float32"
EXP3 = "finetune_lora_benchmark-v1.0.0-max_steps.3-torch_dtype.float32"
B2 = {"model_name": "smollm2-135m", "model_max_length": 256, "batch_size": 2, "number_gpus": 0}
B4 = dict(B2, batch_size=4)
# batch 2 measured twice by the first experiment, once by the second; batch 4 invalid (ado records is_valid alone)
PLAN = [
    {"experiment": 0, "entity": B2, "properties": {"is_valid": True, "dataset_tokens_per_second": 19.81,
                                                    "train_runtime": 51.7, "cpu_memory_utilization": 12.5}},
    {"experiment": 0, "entity": B2, "properties": {"is_valid": True, "dataset_tokens_per_second": 17.46,
                                                    "train_runtime": 58.6, "cpu_memory_utilization": 12.7}},
    {"experiment": 1, "entity": B2, "properties": {"is_valid": True, "dataset_tokens_per_second": 21.0,
                                                    "train_runtime": 70.0, "cpu_memory_utilization": 13.0}},
    {"experiment": 0, "entity": B4, "properties": {"is_valid": False}},
]  # fmt: skip


@pytest.fixture(scope="module")
def ado(tmp_path_factory):
    root = tmp_path_factory.mktemp("ado")
    return Ado(ado_bin(root), root / "home")


@pytest.fixture(scope="module")
def measured(ado, tmp_path_factory):
    """An ado space of two experiments, measured as PLAN says; (space id, folder of ado's exports)."""
    work = tmp_path_factory.mktemp("ado-space")
    (work / "space.yaml").write_text(SPACE)
    space = ado.create("space", work / "space.yaml")
    (work / "results.jsonl").write_text("".join(json.dumps(item) + "\n" for item in PLAN))
    ado.python(LOADER, str(work), space)
    for name, extra in (
        ("lists", ()),
        ("mean", ("--aggregate", "mean")),
        ("std", ("--aggregate", "std")),
        ("observed", ("--property-format", "observed")),
        ("observed-mean", ("--property-format", "observed", "--aggregate", "mean")),
    ):
        ado.run(
            "show",
            "measurements",
            "space",
            space,
            "--include",
            "matching",
            "-o",
            "csv",
            "--output-file",
            str(work / f"{name}.csv"),
            *extra,
        )
    return space, work


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_ados_export_with_repeats_imports_every_repeat_as_its_own_result(measured, tmp_path, capsys):
    _, work = measured
    rows = list(csv.DictReader((work / "lists.csv").open()))
    assert {r["dataset_tokens_per_second"] for r in rows} >= {"[19.81, 17.46]"}  # ado's own list cell
    db = str(tmp_path / "s.db")
    assert main(["import", str(work / "lists.csv"), "--store", db]) == 0
    assert "3 rows holding 4 results" in capsys.readouterr().out
    every = _json(capsys, ["show", "--repeats", "--format", "json", "--store", db])
    b2 = sorted((r["experiment_id"], r["dataset_tokens_per_second"]) for r in every if r["batch_size"] == 2)
    assert b2 == [(EXP2, 17.46), (EXP2, 19.81), (EXP3, 21.0)]  # experiments and parameters kept apart
    b4 = [r for r in every if r["batch_size"] == 4]
    assert [(r["experiment_id"], r["status"], r["is_valid"]) for r in b4] == [(EXP2, "invalid", 0)]
    # the same entity under tunebench's id (the spec's order); ado's own id is kept for the export
    assert {r["identifier"] for r in every} == {
        "model_name.smollm2-135m-number_gpus.0-model_max_length.256-batch_size.2",
        "model_name.smollm2-135m-number_gpus.0-model_max_length.256-batch_size.4",
    }
    one = _json(capsys, ["show", "--format", "json", "--store", db])  # one row per entity x experiment
    mean = next(r for r in one if r["experiment_id"] == EXP2 and r["batch_size"] == 2)
    assert mean["repeats"] == 2 and mean["dataset_tokens_per_second"] == pytest.approx((19.81 + 17.46) / 2)
    assert mean["dataset_tokens_per_second-std"] == pytest.approx(abs(19.81 - 17.46) / 2**0.5)
    assert main(["import", str(work / "lists.csv"), "--store", db]) == 0  # twice: nothing added
    assert "0 added" in capsys.readouterr().out


def test_ados_aggregated_export_imports_as_valid_means(measured, tmp_path, capsys):
    _, work = measured
    db = str(tmp_path / "s.db")
    assert main(["import", str(work / "mean.csv"), "--store", db]) == 0
    capsys.readouterr()
    rows = _json(capsys, ["show", "--format", "json", "--store", db])
    mean = next(r for r in rows if r["experiment_id"] == EXP2 and r["batch_size"] == 2)
    assert mean["status"] == "valid" and mean["dataset_tokens_per_second"] == pytest.approx((19.81 + 17.46) / 2)
    assert mean["train_runtime"] == pytest.approx((51.7 + 58.6) / 2)


def test_a_spread_ado_aggregated_is_refused_naming_the_column(measured, tmp_path, capsys):
    _, work = measured
    db = tmp_path / "s.db"
    assert main(["import", str(work / "std.csv"), "--store", str(db)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "-std" in err and "no measurement" in err
    assert not db.exists()


def _repeats(capsys, db):
    rows = _json(capsys, ["show", "--repeats", "--format", "json", "--store", db])
    return sorted(
        (
            r["experiment_id"],
            r["identifier"],
            r["status"],
            r["is_valid"],
            r.get("dataset_tokens_per_second"),
            r.get("train_runtime"),
            r.get("cpu_memory_utilization"),
        )
        for r in rows
    )


def test_ados_observed_property_format_imports_as_its_target_format(measured, tmp_path, capsys):
    """`--property-format observed`: columns <experiment>-<property>, no experiment_id; the same results."""
    _, work = measured
    header = (work / "observed.csv").read_text().splitlines()[0].split(",")
    assert "experiment_id" not in header and f"{EXP3}-train_runtime" in header  # ado's own layout
    db, ref = str(tmp_path / "o.db"), str(tmp_path / "t.db")
    assert main(["import", str(work / "observed.csv"), "--store", db]) == 0
    assert main(["import", str(work / "lists.csv"), "--store", ref]) == 0
    capsys.readouterr()
    mine = _repeats(capsys, db)
    assert len(mine) == 4 and mine == _repeats(capsys, ref)  # both experiments, every repeat
    assert main(["import", str(work / "observed.csv"), "--store", db]) == 0 and "0 added" in capsys.readouterr().out
    mean, ref = str(tmp_path / "om.db"), str(tmp_path / "tm.db")  # with --aggregate mean: <experiment>-<property>-mean
    assert main(["import", str(work / "observed-mean.csv"), "--store", mean]) == 0
    assert main(["import", str(work / "mean.csv"), "--store", ref]) == 0
    capsys.readouterr()
    assert _repeats(capsys, mean) == _repeats(capsys, ref)
    assert (EXP2, "valid", (19.81 + 17.46) / 2) in {(r[0], r[2], r[4]) for r in _repeats(capsys, mean)}
    # an experiment tunebench does not know: one line naming the column, nothing written
    bad = tmp_path / "bad.csv"
    bad.write_text((work / "observed.csv").read_text().replace(EXP3, "finetune-full-fsdp-v1.3.0", 1))
    assert main(["import", str(bad), "--store", str(tmp_path / "bad.db")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "finetune-full-fsdp-v1.3.0-" in err and "unknown experiment" in err
    assert not (tmp_path / "bad.db").exists()


def test_ados_sqlite_sample_store_imports_every_repeat_with_its_experiment(measured, ado, tmp_path, capsys):
    """ado's local.db read directly: the same results as its CSV export, each repeat its own."""
    local = ado.home / ".config" / "ado" / "databases" / "local.db"
    db, ref = str(tmp_path / "q.db"), str(tmp_path / "t.db")
    assert main(["import", str(local), "--store", db]) == 0
    assert "4 rows" in capsys.readouterr().out
    assert main(["import", str(measured[1] / "lists.csv"), "--store", ref]) == 0
    capsys.readouterr()
    mine = _repeats(capsys, db)
    assert mine == _repeats(capsys, ref)
    b2 = [(r[0], r[4]) for r in mine if "batch_size.2" in r[1]]
    assert b2 == [(EXP2, 17.46), (EXP2, 19.81), (EXP3, 21.0)]  # parameters kept, both repeats
    every = _json(capsys, ["show", "--repeats", "--format", "json", "--store", db])
    assert {r["actuator"] for r in every} == {"measure"}  # SFTTrainer's results are measurements
    assert main(["import", str(local), "--store", db]) == 0 and "0 added" in capsys.readouterr().out


def test_a_file_that_is_neither_csv_nor_an_ado_store_is_refused(tmp_path, capsys):
    import sqlite3

    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x INTEGER)").connection.commit()
    db = tmp_path / "s.db"
    assert main(["import", str(other), "--store", str(db)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no sqlsource_" in err and not db.exists()


def test_a_tunebench_export_loads_into_ado_with_its_experiments_and_repeats(measured, ado, tmp_path, capsys):
    """ado's measurements -> tunebench -> `export --format ado` -> a new ado space: the same table in ado."""
    _, work = measured
    db = str(tmp_path / "s.db")
    assert main(["import", str(work / "lists.csv"), "--store", db]) == 0
    out = tmp_path / "for-ado"
    assert main(["export", "--format", "ado", "--output", str(out), "--store", db]) == 0
    assert "ado create space" in capsys.readouterr().err
    home = Ado(ado.bin, tmp_path / "home")  # a new ado project: nothing but tunebench's export in it
    space = home.create("space", out / "space.yaml")
    assert json.loads(home.python(LOADER, str(out), space))["added"] == 4
    home.run(
        "show",
        "measurements",
        "space",
        space,
        "--include",
        "matching",
        "-o",
        "csv",
        "--output-file",
        str(tmp_path / "back.csv"),
    )
    back = {(r["experiment_id"], r["identifier"]): r for r in csv.DictReader((tmp_path / "back.csv").open())}
    mine = {(r["experiment_id"], r["identifier"]): r for r in csv.DictReader((work / "lists.csv").open())}
    assert back.keys() == mine.keys()  # ado's own ids, both experiments with their parameters
    for key, row in mine.items():
        for name in ("is_valid", "dataset_tokens_per_second", "train_runtime", "cpu_memory_utilization"):
            assert back[key][name] == row[name], (key, name)  # repeats as ado's lists, in their order


def test_the_ado_csv_export_names_entities_as_ado_does(tmp_path, capsys):
    from tunebench.spec.experiments import get_experiment, make_entity
    from tunebench.spec.results import Result
    from tunebench.store import Store
    from tunebench.store.store import Record

    experiment = get_experiment(EXP2.split("-max_steps")[0], {"max_steps": 2, "torch_dtype": "float32"})
    entity = make_entity(experiment, B2)
    result = Result.valid(experiment.id, entity.id, {"train_runtime": 50.0, "is_valid": 1}, actuator="measure")
    with Store(tmp_path / "s.db") as store:
        store.record_many([Record(experiment, entity, result)])
    assert main(["export", "--store", str(tmp_path / "s.db")]) == 0
    (row,) = csv.DictReader(capsys.readouterr().out.splitlines())
    assert row["identifier"] == "batch_size.2-model_max_length.256-model_name.smollm2-135m-number_gpus.0"
    assert row["experiment_id"] == "SFTTrainer." + EXP2


OPERATION = """\
operation:
  module: {operatorName: random_walk, operationType: explore}
  parameters:
    numberEntities: 2
    batchSize: 1
    maxRetries: 1
    singleMeasurement: true
    samplerConfig: {mode: sequential, samplerType: generator}
"""
ACTUATOR_CONFIG = """\
actuatorIdentifier: SFTTrainer
parameters:
  data_directory: /data/sft
  model_map: {smollm2-135m: {Vanilla: /models/smollm2}}
"""


def test_ados_resource_files_are_a_tunebench_space(measured, ado, tmp_path, capsys):
    """The space (created by ado in `measured`), an operation and an actuator configuration that ado accepts."""
    space, _ = measured
    (tmp_path / "space.yaml").write_text(SPACE)
    (tmp_path / "op.yaml").write_text(f"spaces: [{space}]\n" + OPERATION)
    (tmp_path / "ac.yaml").write_text(ACTUATOR_CONFIG)
    ado.create("actuatorconfiguration", tmp_path / "ac.yaml")
    assert "valid" in ado.run("create", "operation", "-f", str(tmp_path / "op.yaml"), "--dry-run").stderr
    out = tmp_path / "tunebench.yaml"
    assert (
        main(
            [
                "space",
                "from-ado",
                str(tmp_path / "space.yaml"),
                "--operation",
                str(tmp_path / "op.yaml"),
                "--actuator-config",
                str(tmp_path / "ac.yaml"),
                "--output",
                str(out),
            ]
        )
        == 0
    )
    import yaml

    converted = yaml.safe_load(out.read_text())
    assert converted["experiments"][1] == {
        "id": "finetune_lora_benchmark-v1.0.0",
        "parameters": {"max_steps": 3, "torch_dtype": "float32"},
    }
    assert converted["actuator"] == {
        "name": "measure",
        "data_dir": "/data/sft",
        "model_map": {"smollm2-135m": "/models/smollm2"},
    }
    assert converted["operation"] == {"sampler": "grid", "n": 2}
    assert converted["execution"] == {"max_parallel": 1, "max_retries": 1}
    # explore reads ado's space file as it is: the planner screens its 2 entities x 2 experiments
    db = str(tmp_path / "s.db")
    capsys.readouterr()
    assert main(["explore", str(tmp_path / "space.yaml"), "--actuator", "predict", "--store", db, "-q", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["operation_id"]
    rows = _json(capsys, ["show", "--format", "json", "--store", db])
    assert sorted((r["experiment_id"], r["batch_size"]) for r in rows) == [(EXP2, 2), (EXP2, 4), (EXP3, 2), (EXP3, 4)]
    (tmp_path / "op.yaml").write_text((tmp_path / "op.yaml").read_text().replace("random_walk", "ray_tune"))
    assert main(["space", "from-ado", str(tmp_path / "space.yaml"), "--operation", str(tmp_path / "op.yaml")]) == 2
    assert "operation.module.operatorName" in capsys.readouterr().err


# tunebench's planner inside ado: an ado space whose experiment names the actuator tunebench_predict
PLUGIN_SPACE = """\
experiments:
- actuatorIdentifier: tunebench_predict
  experimentIdentifier: finetune_lora_benchmark-v1.0.0
  parameterization:
  - {property: {identifier: max_steps}, value: 10}
entitySpace:
- {identifier: model_name, propertyDomain: {values: [smollm2-135m]}}
- {identifier: model_max_length, propertyDomain: {values: [512, 2048]}}
- {identifier: batch_size, propertyDomain: {values: [2, 3]}}
- {identifier: number_gpus, propertyDomain: {values: [2]}}
- {identifier: gpu_model, propertyDomain: {values: [NVIDIA-A100-80GB-PCIe]}}
"""
PLUGIN_EXP = "finetune_lora_benchmark-v1.0.0-max_steps.10"
WALK = """\
operation:
  module: {operatorName: random_walk, operationType: explore}
  parameters:
    numberEntities: all
    batchSize: 1
    samplerConfig: {mode: sequential, samplerType: generator}
"""


@pytest.fixture(scope="module")
def screened(tmp_path_factory):
    """ado with tunebench installed; a space of 4 entities (batch 3 on 2 GPUs breaks rule 1) screened by a
    random_walk operation through the actuator tunebench_predict: (ado, space id, folder)."""
    root = tmp_path_factory.mktemp("ado-tunebench")
    ado = Ado(build_with_tunebench(root / "env"), root / "home")
    work = root / "work"
    work.mkdir()
    (work / "space.yaml").write_text(PLUGIN_SPACE)
    space = ado.create("space", work / "space.yaml")
    (work / "walk.yaml").write_text(f"spaces: [{space}]\n" + WALK)
    out = ado.run("create", "operation", "-f", str(work / "walk.yaml"))
    assert "exit_state: success" in out.stdout + out.stderr
    ado.run("show", "measurements", "space", space, "-o", "csv", "--output-file", str(work / "screened.csv"))
    return ado, space, work


def test_an_ado_operation_screens_a_space_with_tunebenchs_planner(screened, capsys):
    """ado's stored measurements are what `tunebench plan` predicts for the same entities."""
    from tunebench.plan import PREDICTED

    _, _, work = screened
    rows = list(csv.DictReader((work / "screened.csv").open()))
    cells = sorted((int(r["model_max_length"]), int(r["batch_size"])) for r in rows)
    assert cells == [(512, 2), (512, 3), (2048, 2), (2048, 3)]
    assert {r["experiment_id"] for r in rows} == {"tunebench_predict." + PLUGIN_EXP}  # its parameter kept
    for row in rows:
        props = [f"{k}={row[k]}" for k in ("model_name", "model_max_length", "batch_size", "number_gpus", "gpu_model")]
        plan = _json(capsys, ["plan", PLUGIN_EXP.split("-max_steps")[0], *props, "-p", "max_steps=10", "--json"])
        if row["batch_size"] == "3":  # rule 1: ado records is_valid 0 alone
            assert not plan["is_valid"] and plan["reasons"][0].startswith("rule 1")
            assert row["is_valid"] == "0" and all(row[p] == "" for p in PREDICTED)
            continue
        assert plan["is_valid"] and row["is_valid"] == "1"
        for name in PREDICTED:  # plan --json rounds to 4 decimals
            assert float(row[name]) == pytest.approx(plan[name], abs=1e-4), name
        assert plan["train_runtime"] == pytest.approx(10 / plan["train_steps_per_second"], rel=1e-3)  # max_steps 10


def test_the_screened_sample_store_imports_as_predictions_with_their_reasons(screened, tmp_path, capsys):
    ado, _, work = screened
    db = str(tmp_path / "s.db")
    assert main(["import", str(ado.home / ".config" / "ado" / "databases" / "local.db"), "--store", db]) == 0
    capsys.readouterr()
    rows = _json(capsys, ["show", "--repeats", "--format", "json", "--store", db])
    assert {(r["actuator"], r["experiment_id"]) for r in rows} == {("predict", PLUGIN_EXP)}
    invalid = [r for r in rows if r["batch_size"] == 3]
    assert len(invalid) == 2 and all(r["status"] == "invalid" and r["reason"].startswith("rule 1") for r in invalid)
    ado_rows = {r["identifier"]: r for r in csv.DictReader((work / "screened.csv").open())}
    for row in rows:
        if row["status"] == "valid":  # the values ado stored, exactly
            theirs = next(
                r
                for r in ado_rows.values()
                if int(r["model_max_length"]) == row["model_max_length"] and int(r["batch_size"]) == row["batch_size"]
            )
            assert row["gpu_memory_peak_gib"] == float(theirs["gpu_memory_peak_gib"])
            assert row["train_tokens_per_second"] == float(theirs["train_tokens_per_second"])


def test_ado_checks_a_tunebench_predict_configuration_with_the_planners_options(screened, tmp_path):
    ado = screened[0]
    (tmp_path / "bad.yaml").write_text(
        "actuatorIdentifier: tunebench_predict\nparameters:\n  calibration: /nonexistent/calibration.json\n"
    )
    proc = ado.run("create", "actuatorconfiguration", "-f", str(tmp_path / "bad.yaml"), check=False)
    assert proc.returncode != 0 and "actuator.options.calibration: no file" in proc.stdout + proc.stderr
    good = "actuatorIdentifier: tunebench_predict\nparameters: {price_per_gpu_hour: 2.5}\n"
    (tmp_path / "good.yaml").write_text(good)
    assert ado.create("actuatorconfiguration", tmp_path / "good.yaml").startswith("actuatorconfiguration-tunebench")
