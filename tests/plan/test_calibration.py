"""Calibration: CSV readers (both layouts), store records, fitting, the shipped default."""

from __future__ import annotations

import json

import numpy as np
import pytest
import typer
from cli_app import invoke_plan as invoke
from layout import DATA
from typer.testing import CliRunner

from tunebench.plan.calibration import Batch, _log_sq, fit, scores
from tunebench.plan.coefficients import DEFAULT_FILE, Calibration, Coefficients, default_calibration
from tunebench.plan.measurements import default_records, read_cases, read_csv, records_from_store, store_records

# Rows in the fms-acceleration layout (refs_a100_80gb.csv / refs_a100_80gb_liger.csv).
FMS_CSV = """bf16,epoch,fp16,framework_config,learning_rate,lora_alpha,lora_dropout,mem_nvidia_mem_reserved,mem_peak_torch_mem_alloc_in_bytes,mem_torch_mem_alloc_in_bytes,model_name_or_path,num_gpus,peft_method,per_device_train_batch_size,r,target_modules,torch_dtype,train_loss,train_runtime,train_samples_per_second,train_steps_per_second,train_tokens_per_second
,0.07,,none,2.00E-05,,,77256,72434837504,43467876352,mistralai/Mistral-7B-v0.1,1,,4,,,bfloat16,0.9,534.9538,0.748,0.187,3062.694
,0.07,,none,2.00E-05,,,44382,36225939968,28984199680,mistralai/Mistral-7B-v0.1,2,,2,,,bfloat16,0.9,294.9755,1.356,0.339,2777.18
,,,none,2.00E-05,16,,29576,26704571904,14664493056,mistralai/Mistral-7B-v0.1,1,lora,4,16,q_proj k_proj v_proj o_proj,bfloat16,0.9,492.8771,0.81,0.203,3324.155
,,,none,2.00E-05,16,,43232,38742912512,14664886272,mistralai/Mistral-7B-v0.1,1,lora,8,16,q_proj k_proj v_proj o_proj,bfloat16,0.9,977.0384,0.819,0.102,3353.809
,,,accelerated-peft-bnb,2.00E-05,16,,19912,16373838336,4306496512,mistralai/Mistral-7B-v0.1,1,lora,4,16,q_proj k_proj v_proj o_proj,bfloat16,0.9,455.6536,0.878,0.219,3595.714
,,,none,2.00E-05,16,,81214,,,mistralai/Mixtral-8x7B-Instruct-v0.1,1,lora,4,16,q_proj k_proj v_proj o_proj,bfloat16,,,,,
True,,,foak-fast-kernels-liger,2e-05,16,,25465,24905936896,16241584128,meta-llama/Meta-Llama-3-8B,1,lora,4,16,q_proj k_proj v_proj o_proj,bfloat16,1.0,426.2687,0.938,0.235,3843.585
True,,,foak-fast-kernels-liger,2e-05,16,,34681,33567698944,16241977344,meta-llama/Meta-Llama-3-8B,1,lora,8,16,q_proj k_proj v_proj o_proj,bfloat16,1.0,844.8273,0.947,0.118,3878.662
,0.07,,none,2.00E-05,,,15116,11267745280,6770300416,bigcode/gpt_bigcode-santacoder,1,,4,,,bfloat16,2.3,47.6604,8.393,2.098,17188.262
"""
# The spec's measured-property layout (ado's CSV export; docs/reference/published-runs.md).
SPEC_CSV = """,identifier,experiment_id,model_name,number_gpus,model_max_length,batch_size,gpu_model,gpu_memory_utilization_peak,train_runtime,train_samples_per_second,dataset_tokens_per_second,dataset_tokens_per_second_per_gpu,is_valid
0,x,SFTTrainer.finetune_full_benchmark-v1.0.0-fms_hf_tuning_version.2.8.2-stop_after_seconds.30-flash_attn.0,smollm2-135m,0,512,1,,0.0,30.4385,134.566,2624.0452059069926,2624.0452059069926,1
1,y,SFTTrainer.finetune_lora_benchmark-v1.0.0,llama3.1-8b,1,2048,4,NVIDIA-A100-SXM4-80GB,55.0,100.0,1.0,4000.0,4000.0,1
2,z,SFTTrainer.finetune_full_benchmark-v1.0.0,llama3-70b,1,2048,4,NVIDIA-A100-SXM4-80GB,,,,,,0
"""


@pytest.fixture
def fms_csv(tmp_path):
    path = tmp_path / "refs.csv"
    path.write_text(FMS_CSV)
    return path


def test_read_fms_layout(fms_csv):
    recs = read_csv(fms_csv)
    assert len(recs) == 9
    full = recs[0]
    assert full.method == "full" and full.values["batch_size"] == 4 and full.values["number_gpus"] == 1
    assert full.properties["gpu_memory_allocated_peak_gib"] == pytest.approx(72434837504 / 2**30)
    assert full.properties["gpu_memory_peak_gib"] == pytest.approx(77256 / 1024)
    assert "gpu_memory_peak_gib" not in recs[1].properties  # multi-GPU nvidia-smi is averaged: not used
    assert recs[1].values["batch_size"] == 4  # per-device 2 x 2 GPUs
    # fms-acceleration's benchmarks give the Trainer no checkpointing kwargs: transformers 4.x made it reentrant
    assert all(r.values["gradient_checkpointing_use_reentrant"] is True for r in recs)
    assert recs[4].method == "qlora" and recs[5].valid is False
    assert recs[6].values["loss_implementation"] == "fused_linear" and recs[6].values["bf16"] is True
    assert recs[8].family == "bigcode/gpt_bigcode-santacoder"


def test_read_spec_layout(tmp_path):
    path = tmp_path / "ado.csv"
    path.write_text(SPEC_CSV)
    recs = read_csv(path)
    assert [r.experiment_id for r in recs] == [
        "finetune_full_benchmark-v1.0.0",
        "finetune_lora_benchmark-v1.0.0",
        "finetune_full_benchmark-v1.0.0",
    ]
    assert recs[0].values["stop_after_seconds"] == 30 and recs[0].values["flash_attn"] is False
    assert recs[0].values["fms_hf_tuning_version"] == "2.8.2"
    assert recs[1].properties["gpu_memory_peak_gib"] == pytest.approx(0.55 * 80)
    assert recs[2].valid is False
    pred = Batch.of(recs).predict(default_calibration().coefficients)
    assert np.isfinite(pred["dtps"]).all()


def test_records_from_store_triples():
    recs = records_from_store(
        [
            (
                "finetune_lora_benchmark-v1.0.0",
                {
                    "model_name": "llama3.1-8b",
                    "model_max_length": 2048,
                    "number_gpus": 1,
                    "batch_size": 4,
                    "gpu_model": "NVIDIA-A100-SXM4-80GB",
                },
                {"is_valid": 1, "gpu_memory_utilization_peak": 50.0, "train_tokens_per_gpu_per_second": 3000.0},
            ),
        ]
    )
    assert recs[0].values["target_modules"] == ("q_proj", "v_proj") and recs[0].values["r"] == 4


@pytest.mark.slow
def test_fit_lowers_the_log_error_and_stays_in_bounds(fms_csv):
    recs = read_csv(fms_csv)
    start = Coefficients()
    fitted = fit(recs, start)
    alloc = np.array([r.properties.get("gpu_memory_allocated_peak_gib", np.nan) for r in recs])
    speed = np.array([r.properties.get("train_tokens_per_gpu_per_second", np.nan) for r in recs])
    before, after = Batch.of(recs).predict(start), Batch.of(recs).predict(fitted)
    assert _log_sq(after["allocated"], alloc) < _log_sq(before["allocated"], alloc)
    assert _log_sq(after["tps"], speed) < _log_sq(before["tps"], speed)
    assert 0.3 <= fitted.fast_kernels_activation_fraction <= 1.0 and 0.2 <= fitted.hfu_max <= 0.95


def test_store_records_use_measurements_only(tmp_path):
    from tunebench.spec.experiments import get_experiment, make_entity
    from tunebench.spec.results import Result
    from tunebench.store import Store
    from tunebench.store.store import Record as StoreRecord

    exp = get_experiment("finetune_lora_benchmark-v1.0.0")
    ent = make_entity(
        exp,
        {
            "model_name": "llama3.1-8b",
            "model_max_length": 2048,
            "number_gpus": 1,
            "batch_size": 4,
            "gpu_model": "A100-80GB",
        },
    )
    measured = Result.valid(
        exp.id, ent.id, {"gpu_memory_utilization_peak": 50.0, "train_tokens_per_gpu_per_second": 3000.0}
    )
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with Store(url) as store:
        store.record_many([StoreRecord(exp, ent, measured, actuator="measure", source_key="m1")])
    recs = store_records(url)
    assert len(recs) == 1 and recs[0].properties["gpu_memory_peak_gib"] == pytest.approx(40.0)
    assert recs[0].properties["train_tokens_per_gpu_per_second"] == 3000.0


def test_cli_calibrate_from_csv(fms_csv, tmp_path):
    out = tmp_path / "cal.json"
    res = invoke("calibrate", "--from", str(fms_csv), "--output", str(out), "--no-lomo", "--json", "--replace")
    assert res.exit_code == 0, res.output
    saved = Calibration.load(out)
    assert saved.records == 9 and "mistral-7b-v0.1" in saved.models
    assert json.loads(res.stdout)["saved_to"] == str(out)
    res = invoke(
        "plan",
        "finetune_lora_benchmark-v1.0.0",
        "model_name=llama3.1-8b",
        "model_max_length=1024",
        "number_gpus=1",
        "batch_size=2",
        "gpu_model=A100-80GB",
        "--calibration",
        str(out),
        "--json",
    )
    assert res.exit_code == 0 and json.loads(res.stdout)["calibration"] == saved.source


def test_cli_calibrate_errors(tmp_path):
    res = invoke("calibrate", "--from", str(tmp_path / "missing.csv"))
    assert res.exception is not None and res.exception.field == "--from"
    res = invoke("calibrate", "--store", str(tmp_path / "empty.db"))
    assert res.exception is not None and res.exception.field == "--store"  # an empty store: nothing to fit


def test_published_cases_become_records_with_their_memory_kinds():
    recs = read_cases()
    assert len(recs) == 144  # 49 litgpt/PEFT/torchtitan + 95 PEFT docs, torchtune, Unsloth, Liger-Kernel, Qwen
    kinds = {r.origin: set() for r in recs}
    for r in recs:
        kinds[r.origin] |= {k for k in r.properties if k.startswith("gpu_memory")}
    assert kinds["litgpt"] == {"gpu_memory_allocated_peak_gib"} and kinds["peft"] == {"gpu_memory_reserved_peak_gib"}
    assert all(r.values["model_name"].endswith("config.json") for r in recs)
    oom = [r for r in recs if r.properties.get("is_valid") == 0]
    assert sum(r.origin == "litgpt" for r in oom) == 5  # gemma-7b and gemma-2-9b LoRA, three full
    # HF at 4k-16k; Qwen-7B full; torchtitan's 70B at local batch 2
    assert len(oom) == 12 and {r.origin for r in oom} == {"litgpt", "liger-kernel", "qwen", "torchtitan"}
    assert not any(
        r.fit for r in recs if r.origin in ("peft", "torchtitan")
    )  # requests unlike the runs: evaluated only
    # fms-acceleration's kernels ran only in fms-acceleration's runs: a case that leaves fast_kernels unsaid
    # must not inherit the gptq-lora experiment's default (Qwen's Q-LoRA ran AutoGPTQ through transformers)
    assert not any(any(r.values.get("fast_kernels") or ()) for r in recs)
    # litgpt accumulates global_batch_size / (devices x micro_batch_size) micro-batches of its config (FSDP's
    # no_sync: unsharded gradients); gemma-2b full 16 / (4 x 1), Llama-2-7B full 64 / (4 x 4), phi-2 8 / (2 x 4)
    accumulation = {r.source: r.values["gradient_accumulation_steps"] for r in recs if r.origin == "litgpt"}
    assert (accumulation["litgpt/889"], accumulation["litgpt/899"], accumulation["litgpt/916"]) == (4, 4, 1)


@pytest.mark.slow
def test_shipped_calibration_reproduces_its_recorded_accuracy():
    """The metrics stored with the shipped coefficients are what the current planner computes: a change
    to the predictor that is not followed by a refit fails here."""
    assert DEFAULT_FILE.exists()
    cal = default_calibration()
    recs = default_records()
    assert cal.records == len(recs) and len(cal.models) >= 20
    now = scores(recs, Batch.of(recs).predict(cal.coefficients))
    stored = cal.metrics["in_sample"]
    for key in ("peak_mdape_pct", "allocated_mdape_pct", "smi_mdape_pct", "oom_accuracy_pct", "throughput_mdape_pct"):
        assert now[key] == pytest.approx(stored[key], abs=0.05), key
    lomo = cal.metrics["leave_one_model_out"]["pooled"]
    assert lomo["peak_mdape_pct"] <= 10 and lomo["throughput_mdape_pct"] <= 20
    # the fit agrees with the fast_loss budget derived from foak's loss code (Coefficients' comment): 8 B
    assert cal.coefficients.fused_loss_bytes_per_vocab == pytest.approx(8.0, rel=0.1)


@pytest.mark.slow
def test_refit_adds_measurements_to_the_reference_runs(tmp_path):
    """A refit on a few local runs keeps the reference runs (the GPU coefficients stay informed)."""

    from tunebench.commands.plan import register

    reference = default_records()
    app = typer.Typer()
    register(app)
    csv = DATA / "ado_docs_example_smollm2_cpu_measurements.csv"
    runner = CliRunner()
    out = runner.invoke(app, ["calibrate", "--from", str(csv), "--no-lomo", "--no-save", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["records"] == len(reference) + 4
    alone = runner.invoke(app, ["calibrate", "--from", str(csv), "--no-lomo", "--no-save", "--json", "--replace"])
    assert alone.exit_code == 0, alone.output
    assert json.loads(alone.stdout)["records"] == 4


def test_oom_boundary_is_the_most_likely_fragmentation_and_one_impossible_record_cannot_move_it():
    """The fragmentation share maximises the log-likelihood of the verdicts under the model's own probability
    (on the published runs, where counting right verdicts picked a share the probabilities do not support);
    a record whose verdict contradicts a near-certain prediction (a run reported to fit far over the memory)
    adds the same clipped penalty at every share, so it cannot decide the boundary alone."""
    from dataclasses import replace

    from tunebench.plan.calibration import _oom_fragmentation

    recs = [r for r in default_records() if not r.origin.startswith("fms")]
    c = default_calibration().coefficients.replace(peak_log_sigma=0.1)

    def log_likelihood(records, fraction):
        p = Batch.of(records).predict(c.replace(oom_fragmentation_fraction=fraction), throughput=False)["p_oom"]
        p = np.clip(p, 1e-4, 1 - 1e-4)
        labels = np.array([r.valid for r in records])
        known = np.isfinite(p) & np.array(["is_valid" in r.properties for r in records])
        return float(np.sum(np.where(labels, np.log1p(-p), np.log(p))[known]))

    chosen = _oom_fragmentation(Batch.of(recs), c)
    grid = [float(f) for f in np.arange(0.0, 0.51, 0.025)]
    best = max(log_likelihood(recs, f) for f in grid)
    assert log_likelihood(recs, chosen) >= best - 1e-9
    assert log_likelihood(recs, chosen) > min(log_likelihood(recs, f) for f in grid)  # the share matters here
    oom = next(r for r in recs if not r.valid and r.values.get("number_gpus") == 1)
    huge = {**oom.values, "batch_size": 64 * oom.values["batch_size"]}
    impossible = replace(oom, values=huge, properties={**oom.properties, "is_valid": 1.0})
    assert _oom_fragmentation(Batch.of([*recs, impossible]), c) == chosen


def test_oom_boundary_keeps_its_prior_where_no_verdict_can_move_it():
    """CPU runs have no device to run out of: every share gives the same likelihood, so the prior stays."""
    from tunebench.plan.calibration import _oom_fragmentation

    recs = read_csv(DATA / "ado_docs_example_smollm2_cpu_measurements.csv")
    for prior in (0.05, 0.2):
        c = Coefficients().replace(oom_fragmentation_fraction=prior)
        assert _oom_fragmentation(Batch.of(recs), c) == prior


def test_fms_foak_records_of_4bit_bases_state_fused_lora():
    """fms-acceleration's foak scenarios on 4-bit bases run the fused LoRA ops with the other kernels (all or
    nothing); the records say so, with the base layer, and the other records do not."""
    recs = [r for r in default_records() if r.origin == "fms-acceleration"]
    four_bit = [r for r in recs if r.method in ("qlora", "gptq-lora")]
    foak = [r for r in four_bit if r.values.get("fast_kernels")]
    assert foak and {r.values["fused_lora"] for r in foak} == {("bitsandbytes", True), ("auto_gptq", True)}
    assert all("fused_lora" not in r.values for r in recs if r not in foak)


def test_unpacked_fms_runs_count_tokens_per_sample_as_their_padding_does():
    """HF counts input_ids.numel(): the MoE file's padded runs about 278 tokens a sample, its padding-free runs
    about 194; orca-math's padded runs more the more samples a batch pads to its longest. Each run carries the
    mean of its model, padding and per-device batch; a padding-free run is no duplicate of the padded one."""
    from tunebench.spec.runs import fms_row_records

    def row(framework, tps, sps):
        return {
            "framework_config": framework,
            "model_name_or_path": "ibm-granite/granite-3.0-3b-a800m-instruct",
            "num_gpus": "1",
            "per_device_train_batch_size": "8",
            "gradient_accumulation_steps": "16",
            "torch_dtype": "bfloat16",
            "train_tokens_per_second": tps,
            "train_steps_per_second": sps,
            "mem_nvidia_mem_reserved": "49462",
        }

    rows = [
        row("moe-scattermoe-granite-ep1", "5440.927", "0.152"),
        row("moe-scattermoe-granite-ep1-padding-free", "5741.041", "0.231"),
        row("moe-scattermoe-granite-ep1-padding-free-foak", "6215.913", "0.251"),
        row("moe-scattermoe-granite-ep1-padding-free-foak", "", ""),
    ]
    padded, free, foak, failed = (r.values["_tokens_per_sample"] for r in fms_row_records(rows, "refs_moe.csv"))
    assert padded == pytest.approx(5440.927 / 0.152 / 16 / 8)  # 279.7
    assert free == foak == failed == pytest.approx((5741.041 / 0.231 + 6215.913 / 0.251) / 2 / 16 / 8)  # 194
    shipped = [r for r in default_records() if "moe" in r.source and "granite-3.0" in r.values["model_name"]]
    counts = sorted({round(r.values["_tokens_per_sample"]) for r in shipped})
    assert len(counts) == 2 and 190 < counts[0] < 200 and 275 < counts[1] < 282
    orca = [r for r in default_records() if "orca_a100_80gb_pf" in r.source and "fast_kernels" not in r.values]
    by_batch = {(r.values["batch_size"] // r.values["number_gpus"], r.values["_tokens_per_sample"] < 700) for r in orca}
    padded = sorted(r.values["_tokens_per_sample"] for r in orca if r.values["_tokens_per_sample"] > 700)
    assert {b for b, free in by_batch if not free} == {2, 4, 8} and padded[0] < 750 and padded[-1] > 1000


def test_near_limit_misses_are_the_wrong_verdicts_the_near_limit_accuracy_counts():
    """The accuracy benchmark lists each wrong verdict near the limit: exactly the runs that near-limit accuracy
    counts as wrong, each a run near the limit with a known verdict the prediction contradicts; a prediction
    flipped on one right run adds it to the list."""
    from tunebench.plan.calibration import near_limit, near_limit_misses

    recs = default_records()
    pred = Batch.of(recs).predict(default_calibration().coefficients, throughput=False)
    misses = near_limit_misses(recs, pred)
    s = scores(recs, pred)
    assert misses
    assert len(misses) == round(s["oom_near_limit_n"] * (1 - s["oom_near_limit_accuracy_pct"] / 100))
    near = near_limit(recs, pred)
    assert all(near[i] and bool(pred["fits"][i] > 0) != recs[i].valid for i in misses)
    right = next(i for i in np.where(near)[0] if i not in misses and "is_valid" in recs[i].properties)
    flipped = {**pred, "fits": pred["fits"].copy()}
    flipped["fits"][right] = 0.0 if pred["fits"][right] > 0 else 1.0
    assert near_limit_misses(recs, flipped) == sorted([*misses, int(right)])


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("hfu_max", 0.0, "hfu_max must be > 0 (got 0.0)"),  # an efficiency: numpy's divide-by-zero warnings
        ("link_efficiency", 0.0, "link_efficiency must be > 0 (got 0.0)"),
        ("cuda_context_gib", -5.0, "cuda_context_gib must be >= 0 (got -5.0)"),  # a size: 5 GiB too little
        ("peak_log_sigma", -1.0, "peak_log_sigma must be >= 0 (got -1.0)"),
    ],
)
def test_a_calibration_file_with_a_coefficient_out_of_range_is_refused(tmp_path, name, value, says):
    from tunebench.errors import InputError
    from tunebench.inputs import parse
    from tunebench.plan.options import PlannerOptions

    data = default_calibration().to_dict()
    data["coefficients"][name] = value
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError) as exc:
        parse(PlannerOptions, calibration=path)
    assert exc.value.field == "--calibration" and says in exc.value.message, exc.value
