"""Each measurement's time series: sampled by the worker, carried in Result.series, kept by the store, read back
by `show --series`, tunebench.api.series and the report.

One real measurement (`tunebench run` of a tiny Llama from its config.json, random weights, on the CPU) serves
every test of this module; its worker's own rank file is the reference the stored series must equal.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import time
from pathlib import Path

import pytest
from sqlalchemy import insert, inspect, select, update
from tiny_models import TINY_LLAMA

from tunebench import api
from tunebench.commands.main import main
from tunebench.errors import InputError
from tunebench.spec.experiments import get_experiment, make_entity
from tunebench.spec.results import Result
from tunebench.store import SCHEMA_VERSION, Store, owner_id
from tunebench.store.rows import Record, entity_row, experiment_row, id_hash, result_row
from tunebench.store.schema import TABLES, entities, experiments, metadata, requests, results, schema_version, series
from tunebench.store.series import UnknownResult, decode, read_series
from tunebench.worker.metrics import MetricsSampler
from tunebench.worker.series import run_series

pytestmark = pytest.mark.slow

FULL = "finetune_full_benchmark-v1.0.0"
PARAMS = {"max_steps": 3, "dataset_id": "news-chars-256-entries-32"}


class Measured:
    """The module's measurement: its store, result id, the Result `run --json` printed, the worker's rank record."""

    def __init__(self, url: str, result_id: int, result: Result, rank0: dict, experiment, entity):
        self.url, self.result_id, self.result, self.rank0 = url, result_id, result, rank0
        self.experiment, self.entity = experiment, entity


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Measured:
    tmp = tmp_path_factory.mktemp("series")
    config = tmp / "config.json"
    config.write_text(json.dumps(TINY_LLAMA))
    url = str(tmp / "s.db")
    entity_args = [f"model_name={config}", "model_max_length=192", "number_gpus=0", "batch_size=4"]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(
            [
                "run",
                FULL,
                *entity_args,
                *(a for k, v in PARAMS.items() for a in ("--param", f"{k}={v}")),
                "--weights",
                "random",
                "--output-dir",
                str(tmp / "run"),
                "--store",
                url,
                "--json",
            ]
        )
    assert code == 0, err.getvalue()[-3000:]
    result = Result.from_dict(json.loads(out.getvalue()))
    assert result.status == "valid", (result.error, result.log_tail)
    line = next(x for x in err.getvalue().splitlines() if x.startswith("stored in"))
    result_id = int(line.split(" as result ")[1].split()[0])
    assert f"tunebench show --series {result_id}" in line
    rank0 = json.loads((tmp / "run" / "result.rank0.json").read_text())
    experiment = get_experiment(FULL, PARAMS)
    entity = make_entity(
        experiment, {"model_name": str(config), "model_max_length": 192, "number_gpus": 0, "batch_size": 4}
    )
    return Measured(url, result_id, result, rank0, experiment, entity)


def test_the_stored_series_are_what_the_worker_sampled(measured):
    with Store(measured.url) as store:
        frame = read_series(store, measured.result_id)
        (stored,) = store.results_of(store.result_info(measured.result_id)["request_id"])
    samples = measured.rank0["system"]["samples"]
    steps = measured.rank0["steps"]
    counts = frame.groupby("series").size().to_dict()
    # one point per sample (the start sample has no CPU %: no interval before it)
    assert counts["process.rss_gib"] == counts["process.node_memory_percent"] == len(samples) >= 2
    assert counts["process.cpu_percent"] == len(samples) - 1
    by = {name: part for name, part in frame.groupby("series")}
    assert by["process.rss_gib"]["value"].tolist() == [s["process_rss_gib"] for s in samples]
    # the loss curve is the Trainer's logged losses, one per step
    assert by["train.loss"]["value"].tolist() == stored.metadata["train_losses"] == [e["loss"] for e in steps["log"]]
    assert by["train.loss"]["step"].tolist() == [1, 2, 3] and len(stored.metadata["train_losses"]) == 3
    assert by["train.step_time_s"]["value"].tolist() == steps["durations_s"]
    assert sum(by["train.step_time_s"]["value"]) == pytest.approx(stored.properties["train_runtime"])
    tokens = by["train.dataset_tokens"]["value"]
    assert tokens.tolist() == steps["global"]["dataset_tokens"] == [192 * 4 * 4] * 3  # 192 tokens x batch 4 x accum. 4
    assert sum(tokens) == pytest.approx(
        stored.properties["dataset_tokens_per_second"] * stored.properties["train_runtime"]
    )
    assert len(by["train.learning_rate"]) == 3 and by["process.cpu_percent"]["step"].isna().all()
    for name, part in by.items():  # time runs forward in every series, from the first sample
        assert part["time_s"].is_monotonic_increasing and part["time_s"].min() >= 0, name
    assert by["process.rss_gib"]["time_s"].iloc[0] == 0.0
    assert by["train.loss"]["time_s"].iloc[-1] <= by["process.rss_gib"]["time_s"].iloc[-1]  # the stop sample is last
    assert not any(name.startswith("gpu") for name in counts)  # a CPU run: no GPU series
    # the cpu_compute_utilization property is the time-average of the cpu_percent series (note 2)
    seconds = [s["cpu_seconds"] for s in samples if s["cpu_seconds"] is not None]
    intervals = [s["interval_s"] for s in samples if s["cpu_seconds"] is not None]
    assert stored.properties["cpu_compute_utilization"] == pytest.approx(100 * sum(seconds) / sum(intervals))
    # `run --json` printed the same series the store keeps
    assert measured.result.series == read_raw(measured.url, measured.result_id)


def read_raw(url: str, result_id: int) -> dict:
    with Store(url) as store, store.engine.connect() as conn:
        row = conn.execute(
            select(series.c.format, series.c.points, series.c.data).where(series.c.result_id == result_id)
        ).one()
    data = decode(row.data, row.format)
    assert row.points == sum(len(s["value"]) for s in data["series"].values())
    return data


def test_show_series_prints_a_line_per_series_and_every_point_as_csv_or_json(measured, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["show", "--store", measured.url, "--series", str(measured.result_id)]) == 0
    text = capsys.readouterr().out
    assert (
        f"result {measured.result_id} (measure, valid)" in text and "train.loss" in text and "process.rss_gib" in text
    )
    assert all(len(line) <= 80 for line in text.splitlines())
    with Store(measured.url) as store:
        frame = read_series(store, measured.result_id)
    assert main(["show", "--store", measured.url, "--series", str(measured.result_id), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == len(frame) and list(rows[0]) == ["series", "step", "time_s", "value"]
    loss = [r for r in rows if r["series"] == "train.loss"]
    assert [float(r["value"]) for r in loss] == [e["loss"] for e in measured.rank0["steps"]["log"]]
    assert all(r["step"] == "" for r in rows if r["series"].startswith("process."))
    assert main(["show", "--store", measured.url, "--series", str(measured.result_id), "--format", "json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert len(records) == len(frame) and {r["series"] for r in records} == set(frame["series"])
    # show's own table names the result id the series belong to
    assert main(["show", "--store", measured.url, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["result_id"] == measured.result_id


def test_an_unknown_result_id_is_one_line_naming_the_field(measured, capsys):
    before = Path(measured.url).read_bytes()
    assert main(["show", "--store", measured.url, "--series", "999"]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("error: --series: no result 999 in sqlite:///") and "allowed: one of the store's" in line
    assert "Traceback" not in captured.err and captured.out == ""
    assert main(["show", "--store", measured.url, "--series", "1", "--where", "status=valid"]) == 2
    assert capsys.readouterr().err.startswith("error: --where: --series shows one result's time series")
    assert main(["show", "--store", measured.url, "--series", "1", "--format", "parquet", "-o", "x.parquet"]) == 2
    assert "allowed: table, csv, json" in capsys.readouterr().err
    assert Path(measured.url).read_bytes() == before  # a read: nothing written


def test_a_prediction_has_no_series(measured, tmp_path, capsys):
    from tunebench.plan import predict

    url = str(tmp_path / "p.db")
    prediction = predict(measured.experiment, measured.entity)
    assert prediction.series is None
    with Store(url) as store:
        result_id = store.record_one(Record(measured.experiment, measured.entity, prediction, actuator="predict"))
        assert store.series_result_ids() == []
    assert main(["show", "--store", url, "--series", str(result_id)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"result {result_id} (predict, valid) has no time series: a prediction samples nothing")
    assert main(["show", "--store", url, "--series", str(result_id), "--format", "csv"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "series,step,time_s,value\n" and "has no time series" in captured.err
    frame = api.series(result_id, store=url)
    assert frame.empty and list(frame.columns) == ["series", "step", "time_s", "value"]


def test_the_api_reads_a_results_series_as_a_dataframe(measured):
    results = api.results(measured.url)
    result_id = int(results["result_id"].iloc[0])
    assert result_id == measured.result_id
    frame = api.series(result_id, store=measured.url)
    assert list(frame.columns) == ["series", "step", "time_s", "value"]
    assert str(frame["step"].dtype) == "Int64" and frame["time_s"].dtype == float and frame["value"].dtype == float
    with Store(measured.url) as store:
        assert frame.equals(read_series(store, result_id))
        assert api.series(result_id, store=store).equals(frame)  # an open Store too
    assert frame.attrs["result_id"] == result_id and frame.attrs["gpus"] == []
    with pytest.raises(InputError) as error:
        api.series(result_id + 100, store=measured.url)
    assert error.value.field == "result_id" and "no result" in error.value.message
    with pytest.raises(InputError, match="^result_id: '7' is not a result id"):
        api.series("7", store=measured.url)


def test_the_report_draws_utilisation_memory_with_the_predicted_peak_and_the_loss(measured, tmp_path):
    from tunebench.plan import predict
    from tunebench.report import build_report
    from tunebench.report.timeseries import series_plots

    url = str(tmp_path / "r.db")
    with Store(url) as store:  # the measurement in a store of its own, then a stored prediction beside it
        result_id = store.record_one(Record(measured.experiment, measured.entity, measured.result))
        frame = read_series(store, result_id)
        utilisation, memory, loss = series_plots(store, result_id)
        planned = predict(measured.experiment, measured.entity).metadata["predicted"]["gpu_memory_peak_gib"]
        line = memory.figure["data"][-1]
        assert line["y"] == [planned, planned] and "planner, run now" in line["name"]
        stored = Result.valid(
            measured.experiment.id, measured.entity.id, {"gpu_memory_peak_gib": 1.25}, actuator="predict"
        )
        store.record_one(Record(measured.experiment, measured.entity, stored, actuator="predict"))
        _, memory, _ = series_plots(store, result_id)
    names = [t["name"] for t in utilisation.figure["data"]]
    assert names == ["process.cpu_percent", "process.node_memory_percent"]  # a CPU run: no GPU lines
    cpu = frame[frame["series"] == "process.cpu_percent"]
    assert utilisation.figure["data"][0]["x"] == [float(f"{v:.6g}") for v in cpu["time_s"]]
    rss, line = memory.figure["data"]
    assert rss["name"] == "process.rss_gib" and len(rss["y"]) == len(measured.rank0["system"]["samples"])
    assert line["y"] == [1.25, 1.25] and line["x"] == [rss["x"][0], rss["x"][-1]]  # the stored prediction wins
    assert "stored prediction of the predict actuator" in line["name"] and "1.25 GiB" in memory.caption
    losses = [e["loss"] for e in measured.rank0["steps"]["log"]]
    assert loss.figure["data"][0]["x"] == [1.0, 2.0, 3.0]
    assert loss.figure["data"][0]["y"] == [float(f"{v:.6g}") for v in losses]
    assert loss.figure["data"][1]["name"] == "train.learning_rate" and loss.figure["data"][1]["yaxis"] == "y2"
    # the whole report: the figures are in it, for the latest result with series unless one is named
    with Store(url, readonly=True) as store:
        page = build_report(store)
        with pytest.raises(UnknownResult):
            build_report(store, series=result_id + 7)
    for key in ("series-utilisation", "series-memory", "series-loss"):
        assert f"<figure id='{key}' class='plot'>" in page
    out = tmp_path / "r.html"
    assert main(["report", "--store", url, "-o", str(out), "--series", "12345"]) == 2 and not out.exists()


def test_the_explorers_path_stores_series_on_postgresql(measured, postgres_server):
    """register -> claim -> complete (what an explorer does) keeps the series; the blob reads back the same."""
    url = postgres_server.fresh_database()
    with Store(url) as store:
        store.open_operation("op-series", sampler="grid", actuator="measure", space={}, name=None)
        store.register("op-series", [(measured.experiment, measured.entity, [])], actuator="measure", generator="grid")
        (claim,) = store.claim("op-series", owner_id(), 1, lease_seconds=60)
        store.complete(claim, measured.result, max_retries=0)
        (result_id,) = store.series_result_ids()
        frame = read_series(store, result_id)
        assert store.series_of(result_id) == measured.result.series
        with pytest.raises(UnknownResult):
            store.series_of(result_id + 1)
    with Store(measured.url) as local:
        assert frame.equals(read_series(local, measured.result_id))
    assert api.series(result_id, store=url).equals(frame)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_store_of_an_older_schema_opens_and_is_upgraded(backend, tmp_path, capsys, request):
    """A version-1 store (no series table, no operation_points index by request) with a result in it: opening it
    to read upgrades it once, through every version; the old result has no series, and new ones keep theirs."""
    url = (
        str(tmp_path / "old.db") if backend == "sqlite" else request.getfixturevalue("postgres_server").fresh_database()
    )
    experiment = get_experiment(FULL, PARAMS)
    entity = make_entity(
        experiment, {"model_name": "smollm2-135m", "model_max_length": 64, "number_gpus": 0, "batch_size": 1}
    )
    with Store(url) as fresh:  # build the old shape: every table of version 1, stamped 1, and one result
        engine = fresh.engine
        with engine.begin() as conn:
            metadata.drop_all(conn)
            metadata.create_all(conn, tables=[t for t in TABLES if t is not series])
            conn.exec_driver_sql("DROP INDEX ix_operation_points_request")  # version 3's
            conn.execute(insert(schema_version).values(version=1, description="create", applied_at=time.time()))
            exp_pk = conn.execute(
                insert(experiments).values(experiment_row(experiment, id_hash(experiment.id), 0.0))
            ).inserted_primary_key[0]
            ent_pk = conn.execute(insert(entities).values(entity_row(entity, id_hash(entity.id)))).inserted_primary_key[
                0
            ]
            request_id = conn.execute(
                insert(requests).values(
                    experiment_pk=exp_pk,
                    entity_pk=ent_pk,
                    actuator="measure",
                    status="valid",
                    attempts=1,
                    created_at=0.0,
                )
            ).inserted_primary_key[0]
            old = Result.valid(experiment.id, entity.id, {"train_runtime": 2.0})
            old_id = conn.execute(insert(results).values(result_row(request_id, old))).inserted_primary_key[0]
            conn.execute(update(requests).values(result_id=old_id))
        assert "series" not in inspect(engine).get_table_names()
    assert main(["show", "--store", url, "--series", str(old_id)]) == 0  # a read: the store is upgraded first
    assert "has no time series: it was recorded without one" in capsys.readouterr().out
    with Store(url) as store:
        assert store.version == SCHEMA_VERSION == 3
        assert "series" in inspect(store.engine).get_table_names()
        indexes = {i["name"] for i in inspect(store.engine).get_indexes("operation_points")}
        assert "ix_operation_points_request" in indexes
        with store.engine.connect() as conn:
            versions = conn.execute(select(schema_version.c.version).order_by(schema_version.c.version)).scalars()
            assert list(versions) == [1, 2, 3]
        assert store.series_of(old_id) is None and read_series(store, old_id).empty
        rows = store.rows()
        assert [r["result_id"] for r in rows] == [old_id] and rows[0]["properties"]["train_runtime"] == 2.0
        new = Result.valid(experiment.id, entity.id, {"train_runtime": 1.0}, series=_series())
        result_id = store.record_one(Record(experiment, entity, new))
        assert result_id > old_id and store.series_result_ids() == [result_id]
        assert json.dumps(store.series_of(result_id)) == json.dumps(_series())  # NaN kept (NaN != NaN)
        assert [r["result_id"] for r in store.rows()] == [result_id]


def test_a_diverged_loss_is_kept_in_the_store_and_null_in_strict_json(tmp_path):
    """NaN in a series: the store's blob keeps it (a diverged run is a measurement too); `run --json` writes
    strict JSON, with null in its place (json.dumps(allow_nan=False) raised on it)."""
    experiment = get_experiment(FULL, PARAMS)
    entity = make_entity(
        experiment, {"model_name": "smollm2-135m", "model_max_length": 64, "number_gpus": 0, "batch_size": 1}
    )
    result = Result.valid(experiment.id, entity.id, {"train_runtime": 1.0}, series=_series())
    printed = json.loads(result.to_json())
    assert printed["series"]["series"]["train.loss"]["value"] == [2.5, None]
    with Store(tmp_path / "s.db") as store:
        result_id = store.record_one(Record(experiment, entity, result))
        frame = read_series(store, result_id)
    assert frame["value"].iloc[0] == 2.5 and frame["value"].isna().iloc[1]


def _series() -> dict:
    return {
        "format": "tunebench.series/1",
        "warmup_steps": 0,
        "warmup_end_s": None,
        "gpus": [],
        "series": {"train.loss": {"step": [1, 2], "time_s": [0.5, 1.0], "value": [2.5, float("nan")]}},
    }


def test_gpu_series_are_numbered_over_nodes_from_the_samplers_readings():
    """Two nodes, each sampler reading two GPUs (NVML faked: no GPU here): gpu0..gpu3 in node order, every
    GPU value kept (a missing power limit leaves power_percent out), the other node's process series named."""
    from worker.test_metrics import FakeNvml

    records = []
    for node in (0, 1):
        sampler = MetricsSampler(interval_s=0.05, gpu_ids=["GPU-aaaa", "1"], nvml=FakeNvml())
        sampler.start()
        time.sleep(0.15)
        sampler.stop()
        steps = {
            "durations_s": [0.05, 0.05],
            "end_monotonic": [sampler.samples[0].t + 0.05, sampler.samples[0].t + 0.1],
            "log": [{"step": 1, "loss": 3.0, "learning_rate": 1e-5}, {"step": 2, "loss": 2.0}],
            "local": {"padded_tokens": [10, 10], "dataset_tokens": [8, 9]},
        }
        records.append({"rank": 2 * node, "node_rank": node, "system": sampler.summary(), "steps": steps})
    data = run_series(records)
    assert [g["series"] for g in data["gpus"]] == ["gpu0", "gpu1", "gpu2", "gpu3"]
    assert [g["node"] for g in data["gpus"]] == [0, 0, 1, 1]
    names = set(data["series"])
    assert {"gpu0.memory_used_gib", "gpu3.compute_utilization", "node1.process.cpu_percent"} <= names
    assert "gpu1.power_percent" not in names and "gpu0.power_percent" in names
    n0 = len(records[0]["system"]["samples"])
    assert data["series"]["gpu0.compute_utilization"]["value"] == [90.0] * n0
    assert data["series"]["gpu0.memory_used_gib"]["value"][0] == pytest.approx(40 / 2**30)
    assert data["series"]["train.train_tokens"]["value"] == [20.0, 20.0]  # summed over both ranks
    assert data["series"]["train.loss"]["value"] == [3.0, 2.0] and data["series"]["train.learning_rate"]["step"] == [1]
