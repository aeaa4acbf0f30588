"""The two actuators over one store: plan --compare, explore --actuator predict, --skip-predicted-oom."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tunebench.cli import main

DATA = Path(__file__).parent / "data"


def test_plan_compare_shows_prediction_beside_measurement(tmp_path, capsys):
    store = str(tmp_path / "store.db")
    assert main(["import", str(DATA / "ado_docs_example_smollm2_cpu_measurements.csv"), "--store", store]) == 0
    capsys.readouterr()
    args = ["plan", "finetune_full_benchmark-v1.0.0", "-p", "fms_hf_tuning_version=2.8.2", "-p",
            "stop_after_seconds=30", "-p", "flash_attn=false", "model_name=smollm2-135m", "number_gpus=0",
            "model_max_length=1024", "batch_size=2", "--compare", "--store", store, "--json"]  # fmt: skip
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["property"]: r for r in out["comparison"]}
    tokens = rows["dataset_tokens_per_second"]
    assert tokens["measured"] == 4353.090823344991  # the reference's CSV row
    assert tokens["error_percent"] == pytest.approx(100 * (tokens["predicted"] - 4353.090823344991) / 4353.090823344991)
    # one host-specific coefficient (cpu_tflops) fitted on these 4 rows, in-sample: within 25 %
    assert abs(tokens["error_percent"]) < 25
    # every sample of news-tokens-16384plus fills the 1,024 tokens: samples/s = tokens/s / 1,024 ...
    samples = rows["train_samples_per_second"]
    assert samples["predicted"] == pytest.approx(tokens["predicted"] / 1024, rel=1e-3)  # plan_json rounds to 4 places
    # ... while the reference's CSV reports HF's rate of the *planned* run, 4,096 samples (2 x 4 accumulation
    # x 512 steps) over the 30 s the run was allowed: the inflation docs/planner.md explains
    assert samples["measured"] == pytest.approx(4096 / rows["train_runtime"]["measured"], rel=0.01)
    assert rows["is_valid"] == {"property": "is_valid", "predicted": 1, "measured": 1, "error_percent": None}
    # an entity the store has not measured: the prediction alone, measured None
    args[args.index("batch_size=2")] = "batch_size=4"
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["measured"] is None


def _space(tmp_path: Path, body: dict) -> str:
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(body))
    return str(path)


def test_explore_with_the_predict_actuator_screens_a_space(tmp_path, capsys):
    store = str(tmp_path / "store.db")
    space = _space(tmp_path, {
        "experiments": [{"id": "finetune_lora_benchmark-v1.0.0"}],
        "entity_space": {"model_name": ["llama3.1-8b", "llama3.1-70b"], "model_max_length": [2048, 8192],
                         "batch_size": [8], "number_gpus": [1, 8], "gpu_model": ["NVIDIA-A100-80GB-PCIe"]},
        "actuator": {"weights": "random"},  # a space written for measuring screens as it is
        "operation": {"sampler": "grid"},
    })  # fmt: skip
    assert main(["explore", space, "--actuator", "predict", "--store", store, "--json", "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["total"] == 8 and summary["done"] == 8 and summary["failed"] == 0
    assert summary["valid"] >= 1 and summary["invalid"] >= 1  # 70B at 8192 tokens on one GPU will not fit
    assert main(["show", "--store", store, "--actuator", "predict", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 8 and all("dataset_tokens_per_second" in r for r in rows)


def test_skip_predicted_oom_measures_only_what_fits(tmp_path, capsys):
    store = str(tmp_path / "store.db")
    space = _space(tmp_path, {
        "experiments": [{"id": "finetune_full_benchmark-v1.0.0"}],
        "entity_space": {"model_name": ["smollm2-135m", "llama3.1-70b"], "model_max_length": [4096],
                         "batch_size": [8], "number_gpus": [1], "gpu_model": ["NVIDIA-A100-80GB-PCIe"]},
        "actuator": {"name": "noop"},
        "operation": {"sampler": "grid"},
    })  # fmt: skip
    assert main(["explore", space, "--skip-predicted-oom", "--store", store, "--json", "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["skipped"] == 1 and summary["total"] == 1 and summary["measured"] == 1
