"""tunebench.api: plan a DataFrame of entities, explore, read results; docs/api.md runs as written."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import report_data

from tunebench import api
from tunebench.errors import InputError
from tunebench.plan import PREDICTED, predict_many
from tunebench.spec.experiments import get_experiment
from tunebench.store import Store

A100 = report_data.GPU
LORA = "finetune_lora_benchmark-v1.0.0"


def jobs() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "model_name": ["llama3.1-8b", "llama3.1-8b", "llama3.1-8b"],
            "number_gpus": [1, 1, 4],
            "gpu_model": A100,
            "model_max_length": [2048, 8192, 512],
            "batch_size": [8, 64, 6],
        },
        index=["fits", "too big", "rule"],
    )


def test_plan_gives_one_row_per_entity_with_the_planners_predictions():
    frame = jobs()
    plans = api.plan(frame, LORA)
    assert list(plans.index) == ["fits", "too big", "rule"]
    assert list(plans.columns[: len(frame.columns)]) == list(frame.columns)  # the input's columns kept, first
    assert plans["is_valid"].tolist() == [True, False, False]
    assert plans.loc["too big", "reasons"].startswith("out of GPU memory")
    assert plans.loc["rule", "reasons"].startswith("rule 1: batch_size 6 is not divisible by number_gpus 4")
    experiment = get_experiment(LORA)
    expected = predict_many([(experiment, row) for row in frame.to_dict("records")])
    for (_, row), result in zip(plans.iterrows(), expected[:2]):
        assert row["entity_id"] == result.entity_id and row["experiment_id"] == LORA
        for name in PREDICTED:  # the same numbers as the planner, predicted even where the job will not fit
            assert row[name] == pytest.approx(result.metadata["predicted"][name])
        assert row["headroom_gib"] == pytest.approx(result.metadata["headroom_gib"])
    assert plans["verdict"].tolist() == ["fits", "OOM", "invalid"] and plans["fits"].tolist() == [True, False, False]
    # max_oom_risk as the command line takes it: a number, or its text (checked, then a number)
    assert api.plan(frame, LORA, max_oom_risk="0.5")["verdict"].tolist() == ["fits", "OOM", "invalid"]
    with pytest.raises(InputError):
        api.plan(frame, LORA, max_oom_risk="x")
    # an entity that breaks a rule cannot start: nothing is planned for it
    assert expected[2].metadata["planned"] is False and "predicted" not in expected[2].metadata
    assert plans.loc["rule", list(PREDICTED)].isna().all()
    assert plans.loc["too big", "gpu_memory_peak_gib"] > plans.loc["too big", "usable_gib"]


@pytest.mark.slow
def test_plan_reads_gaps_floats_and_an_experiment_column():
    frame = pd.DataFrame(
        {
            "model_name": ["smollm2-135m", "smollm2-135m"],
            "number_gpus": [0, 0],
            "model_max_length": [512.0, 1024.0],
            "batch_size": [2, 4],
            "gradient_checkpointing": [np.nan, 0.0],
            "experiment": ["finetune_full_benchmark-v1.0.0", LORA],
        }
    )
    plans = api.plan(frame)
    assert plans["experiment_id"].tolist() == ["finetune_full_benchmark-v1.0.0", LORA]
    assert plans.loc[0, "entity_id"] == "model_name.smollm2-135m-number_gpus.0-model_max_length.512-batch_size.2"
    assert "gradient_checkpointing" in plans.loc[1, "entity_id"] and "gradient" not in plans.loc[0, "entity_id"]


def test_plan_of_a_bad_row_names_the_row_and_the_field():
    frame = jobs()
    frame.loc["rule", "model_name"] = "lama3.1-8b"
    with pytest.raises(InputError) as error:
        api.plan(frame, LORA)
    assert str(error.value).startswith("row 'rule' (#2): model_name:") and "llama3.1-8b" in str(error.value)
    with pytest.raises(InputError, match="^experiment"):
        api.plan(jobs(), "finetune_nope-v1.0.0")


def test_explore_then_results_as_a_dataframe(tmp_path):
    store = str(tmp_path / "runs.db")
    space = {
        "experiments": [{"id": LORA}],
        "entity_space": {
            "model_name": ["llama3.1-8b"],
            "number_gpus": 1,
            "gpu_model": A100,
            "model_max_length": [1024, 4096],
            "batch_size": [8, 32],
        },
        "actuator": {"name": "predict"},
        "operation": {"sampler": "grid"},
    }
    summary = api.explore(space, store=store)
    assert (summary.total, summary.done, summary.memoised) == (4, 4, 0)
    again = api.explore(space, store=store)  # resumed: nothing measured twice
    assert again.operation_id == summary.operation_id and again.memoised == 4 and again.measured == 0
    frame = api.results(store, operation=summary.operation_id)
    assert len(frame) == 4 and set(frame["actuator"]) == {"predict"} and set(frame["source"]) == {"predicted"}
    assert frame["batch_size"].tolist() == [8, 32, 8, 32] and frame["model_max_length"].tolist() == [
        1024,
        1024,
        4096,
        4096,
    ]
    assert not any(c.startswith("_") for c in frame.columns)
    with Store(store) as opened:  # the same rows as the store's own reading, in the same order
        rows = opened.rows(operation_id=summary.operation_id)
    assert frame["entity_id"].tolist() == [r["entity_id"] for r in rows]
    assert frame["status"].tolist() == [r["status"] for r in rows]
    valid = frame[frame["status"] == "valid"]
    assert valid["dataset_tokens_per_second"].notna().all() and len(valid) == summary.valid
    assert len(api.results(store, statuses=["invalid"])) == summary.invalid
    assert api.results(store, actuator="measure").empty


def test_results_of_a_space_and_of_a_test_actuator(tmp_path):
    store = f"sqlite:///{tmp_path / 'mixed.db'}"
    report_data.explore(tmp_path, store, report_data.TESTING_SPACE, "testing.yaml", "--allow-actuator-import")
    frame = api.results(store, space=tmp_path / "testing.yaml")
    assert len(frame) == 12 and set(frame["actuator"]) == {report_data.OOM_ACTUATOR}
    assert set(frame.loc[frame["batch_size"] > 4, "outcome"]) == {"out of memory"}
    best = frame.loc[frame["dataset_tokens_per_second"].idxmax()]
    assert (best["model_max_length"], best["batch_size"]) == (256, 4)  # the test actuator's peak


def test_explore_through_the_api_with_an_imported_actuator(tmp_path):
    space = tmp_path / "testing.yaml"
    space.write_text(report_data.TESTING_SPACE)
    with pytest.raises(InputError):  # an unregistered module:function needs the explicit opt-in
        api.explore(space, store=str(tmp_path / "a.db"))
    assert not (tmp_path / "a.db").exists()
    summary = api.explore(space, store=str(tmp_path / "a.db"), allow_actuator_import=True, max_parallel=2)
    assert (summary.valid, summary.invalid) == (9, 3)


def test_results_of_a_missing_store_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="^--store: no store at"):
        api.results(str(tmp_path / "missing.db"))
    assert not (tmp_path / "missing.db").exists()


def test_the_notebook_in_docs_runs_and_prints_what_it_shows():
    text = (Path(__file__).parents[1] / "docs" / "api.md").read_text()
    cells = re.findall(r"```python\n(.*?)```\n(?:\n```text\n(.*?)```)?", text, re.S)
    assert len(cells) >= 7 and sum(1 for _, shown in cells if shown) >= 6
    namespace: dict = {}
    for code, shown in cells:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, "docs/api.md", "exec"), namespace)
        if shown:
            printed = out.getvalue()
            if "op-" in shown:  # the operation id is a hash of the space: the same every run
                assert printed == shown
            assert printed.split() == shown.split(), (code, printed)


def test_plan_says_it_defaults_to_full_fine_tuning_and_recommend_sizes_a_job():
    import inspect

    assert inspect.signature(api.plan).parameters["experiment"].default == "finetune_full_benchmark-v1.0.0"
    assert "full fine-tuning" in api.plan.__doc__.lower()
    rec = api.recommend(
        LORA, {"model_name": "llama3.1-8b", "model_max_length": 3584, "batch_size": 8, "gpu_model": A100}, max_gpus=8
    )
    assert rec["minimum"]["number_gpus"] == 2 and rec["minimum"]["oom_probability"] <= 0.1
    assert (
        api.recommend(
            LORA,
            {"model_name": "llama3.1-8b", "model_max_length": 3584, "batch_size": 8, "gpu_model": A100},
            max_gpus=8,
            max_oom_risk=0.5,
        )["minimum"]["number_gpus"]
        == 1
    )
    with pytest.raises(InputError) as err:
        api.recommend(LORA, {"model_name": "llama3.1-8b", "gpu_model": A100}, max_oom_risk=2)
    assert err.value.field == "--max-oom-risk"
