"""The two actuators over one store: plan --compare, explore --actuator predict, --skip-predicted-oom."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from layout import DATA

from tunebench.commands.main import main

DATA = DATA


def smollm2_135m_full_flops_per_token(tokens: int) -> float:
    """The planner's FLOPs per token of SmolLM2-135M full fine-tuning, written out from the model's published
    config.json (hidden 576, 30 layers, MLP 1536, 9 heads / 3 KV heads of 64, vocabulary 49,152, tied head).

    2 per matmul weight forward, 4 backward, 2 more for the layers' recomputed forward (spec 004:
    gradient_checkpointing defaults to True), the head never recomputed; the attention core 2 x layers x
    576 x tokens per pass (causal half of QK^T and AV), 4 passes (Kaplan et al. 2020; PaLM App. B).
    """
    layer = 576 * 576 * 2 + 576 * 192 * 2 + 3 * 576 * 1536  # q, o; k, v (3 x 64 wide); gate, up, down
    body, head = 30 * layer, 576 * 49152
    return 8 * body + 6 * head + 2 * 30 * 576 * tokens * 4


def test_plan_compare_shows_prediction_beside_measurement(tmp_path, capsys, monkeypatch):
    from tunebench.plan import host

    monkeypatch.setattr(host, "host_busy", lambda: False)  # the entity's own probes run (test workers share cores)
    store = str(tmp_path / "store.db")
    assert main(["import", str(DATA / "ado_docs_example_smollm2_cpu_measurements.csv"), "--store", store]) == 0
    capsys.readouterr()
    args = [
        "plan",
        "finetune_full_benchmark-v1.0.0",
        "-p",
        "fms_hf_tuning_version=2.8.2",
        "-p",
        "stop_after_seconds=30",
        "-p",
        "flash_attn=false",
        "model_name=smollm2-135m",
        "number_gpus=0",
        "model_max_length=1024",
        "batch_size=2",
        "--compare",
        "--store",
        store,
        "--json",
    ]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["property"]: r for r in out["comparison"]}
    # the measurement: the reference's CSV row (ado docs, SmolLM2-135M, batch 2 x 1,024 tokens, CPU)
    measured_tps, measured_runtime, measured_sps = 4353.090823344991, 30.1101, 136.034
    # the prediction, from this host's measured training rate for SmolLM2-135M's own layers (bfloat16,
    # checkpointing: the spec's defaults; a micro-batch of 2 x 1,024 tokens) and the FLOPs written out
    # above, plus the optimizer step timed on this host per parameter: the planner predicts the host it runs on
    from tunebench.plan.host import entity_rate, probe_shape
    from tunebench.plan.structure import structure_of
    from tunebench.spec.runs import resolve_model

    structure = structure_of(resolve_model("smollm2-135m"))
    flops = smollm2_135m_full_flops_per_token(1024)
    rate = entity_rate(structure, "bfloat16", None, True, probe_shape(2 * 1024, 1024), flops, "sdpa")
    assert rate.probe.startswith("smollm2-135m at ") and structure.total_params == 134_515_008
    tps = rate.flops / flops
    # batch 2 x gradient_accumulation_steps 4 (spec default) x 1,024 tokens, then one AdamW step
    step = 2 * 4 * 1024 / tps + structure.total_params * rate.optimizer_s_per_param
    tps = 2 * 4 * 1024 / step
    runtime = -(-30 // step) * step  # HF stops at the end of the first step past stop_after_seconds=30
    expected = {  # property: (predicted, measured); plan_json rounds predictions to 4 places
        "dataset_tokens_per_second": (tps, measured_tps),
        "dataset_tokens_per_second_per_gpu": (tps, measured_tps),
        "train_runtime": (runtime, measured_runtime),
        # every sample of news-tokens-16384plus fills the 1,024 tokens: samples/s = tokens/s / 1,024, while
        # the reference's CSV reports HF's rate of the *planned* run, 4,096 samples (2 x 4 accumulation x
        # 512 steps) over the 30 s the run was allowed: the inflation docs/planner.md explains
        "train_samples_per_second": (tps / 1024, measured_sps),
        "train_steps_per_second": (1 / step, 17.004),
    }
    for name, (predicted, measured) in expected.items():
        row = rows[name]
        assert row["measured"] == measured, name
        assert row["predicted"] == pytest.approx(predicted, abs=6e-5), name
        assert row["error_percent"] == pytest.approx(100 * (predicted - measured) / measured, abs=0.01), name
    assert measured_sps == pytest.approx(4096 / measured_runtime, rel=0.01)  # the inflation, in the data itself
    # the reference measured a large server; this host is predicted at its own rate, so --compare says so
    assert "CPU: this host trains at" in json.dumps(out)
    assert rows["is_valid"] == {"property": "is_valid", "predicted": 1, "measured": 1, "error_percent": None}
    # an entity the store has not measured: the prediction alone, measured None
    args[args.index("batch_size=2")] = "batch_size=4"
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["measured"] is None


def _space(tmp_path: Path, body: dict) -> str:
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(body))
    return str(path)


@pytest.mark.slow
def test_explore_with_the_predict_actuator_screens_a_space(tmp_path, capsys):
    store = str(tmp_path / "store.db")
    space = _space(
        tmp_path,
        {
            "experiments": [{"id": "finetune_lora_benchmark-v1.0.0"}],
            "entity_space": {
                "model_name": ["llama3.1-8b", "llama3.1-70b"],
                "model_max_length": [2048, 8192],
                "batch_size": [8],
                "number_gpus": [1, 8],
                "gpu_model": ["NVIDIA-A100-80GB-PCIe"],
            },
            "actuator": {"weights": "random"},  # a space written for measuring screens as it is
            "operation": {"sampler": "grid"},
        },
    )
    assert main(["explore", space, "--actuator", "predict", "--store", store, "--json", "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["total"], summary["done"], summary["failed"], summary["valid"], summary["invalid"]) == (
        8,
        8,
        0,
        5,
        3,
    )
    assert main(["show", "--store", store, "--actuator", "predict", "--format", "json"]) == 0
    rows = {(r["model_name"], r["number_gpus"], r["model_max_length"]): r for r in json.loads(capsys.readouterr().out)}
    assert len(rows) == 8
    # on one 80 GB GPU: 70B's frozen bf16 weights alone are 70.6e9 x 2 B = 131 GiB; 8B at 8,192 tokens x 8
    # samples holds 8 x 8,192 x 128,256 logits (fp32 upcast and gradient: 8 B each, 63 GiB) beside 15 GiB
    # of weights and the layers' activations
    invalid = {("llama3.1-70b", 1, 2048), ("llama3.1-70b", 1, 8192), ("llama3.1-8b", 1, 8192)}
    assert {k for k, r in rows.items() if r["status"] == "invalid"} == invalid
    assert all(rows[k]["reason"].startswith("out of GPU memory") and rows[k]["is_valid"] == 0 for k in invalid)
    from tunebench.plan import predict
    from tunebench.spec.experiments import get_experiment

    experiment = get_experiment("finetune_lora_benchmark-v1.0.0")
    for (model, gpus, length), row in rows.items():
        if (model, gpus, length) in invalid:
            continue
        direct = predict(
            experiment,
            {
                "model_name": model,
                "model_max_length": length,
                "batch_size": 8,
                "number_gpus": gpus,
                "gpu_model": "NVIDIA-A100-80GB-PCIe",
            },
        ).properties
        assert row["dataset_tokens_per_second"] == direct["dataset_tokens_per_second"]  # stored as predicted
        sps = row["train_samples_per_second"]
        # news-tokens-16384plus fills every sample: tokens/s = samples/s x length
        assert row["dataset_tokens_per_second"] == pytest.approx(sps * length, rel=1e-9)
        # 4,096 entries, one epoch: runtime = 4,096 samples / samples/s; steps of 8 x 4 accumulation
        assert row["train_runtime"] == pytest.approx(4096 / sps, rel=1e-9)
        assert row["train_steps_per_second"] == pytest.approx(sps / 32, rel=1e-9)
        assert row["train_tokens_per_gpu_per_second"] == pytest.approx(row["train_tokens_per_second"] / gpus, rel=1e-9)
        assert row["gpu_memory_utilization_peak"] == pytest.approx(100 * row["gpu_memory_peak_gib"] / 80, rel=1e-9)
    best = max((r for r in rows.values() if r["status"] == "valid"), key=lambda r: r["dataset_tokens_per_second"])
    assert summary["best"]["entity"]["model_name"] == best["model_name"] == "llama3.1-8b"
    assert summary["best"]["dataset_tokens_per_second"] == best["dataset_tokens_per_second"]


@pytest.mark.slow
def test_skip_predicted_oom_measures_only_what_fits(tmp_path, capsys):
    store = str(tmp_path / "store.db")
    space = _space(
        tmp_path,
        {
            "experiments": [{"id": "finetune_full_benchmark-v1.0.0"}],
            "entity_space": {
                "model_name": ["smollm2-135m", "llama3.1-70b"],
                "model_max_length": [4096],
                "batch_size": [8],
                "number_gpus": [1],
                "gpu_model": ["NVIDIA-A100-80GB-PCIe"],
            },
            "actuator": {"name": "noop"},
            "operation": {"sampler": "grid"},
        },
    )
    assert main(["explore", space, "--skip-predicted-oom", "--store", store, "--json", "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["skipped"] == 1 and summary["total"] == 1 and summary["measured"] == 1
