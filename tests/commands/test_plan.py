"""`tunebench plan` on any model and any GPU: published configs, remote-code configs, GPUs given by numbers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_app import invoke_plan as invoke
from layout import REPO
from tiny_models import TINY_DECODER

from tunebench.catalog.gpus import driver_reserve
from tunebench.catalog.user_gpus import read_catalog
from tunebench.plan.measurements import PUBLISHED

LORA = "finetune_lora_benchmark-v1.0.0"
FULL = "finetune_full_benchmark-v1.0.0"
CONFIGS = sorted((PUBLISHED / "configs").glob("*/config.json"))


def plan_json(*args: str, env: dict | None = None) -> dict:
    res = invoke("plan", *args, "--json", env=env)
    assert res.exit_code == 0, (res.output, res.exception)
    return json.loads(res.stdout)


def test_the_published_configs_are_shipped():
    assert len(CONFIGS) == 23


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.parent.name)
def test_plan_works_on_every_published_config(config: Path):
    out = plan_json(
        FULL,
        f"model_name={config}",
        "model_max_length=512",
        "number_gpus=4",
        "batch_size=4",
        "gpu_model=NVIDIA-A10G",
        "gradient_accumulation_steps=1",
    )
    assert out["gpu_memory_allocated_peak_gib"] > 0 and 0 <= out["oom_probability"] <= 1
    assert out["train_tokens_per_second"] > 0
    assert out["is_valid"] == (out["oom_probability"] <= 0.5)


@pytest.mark.slow
def test_remote_code_config_is_planned_with_its_assumptions(tmp_path):
    qwen = {
        "model_type": "qwen",
        "hidden_size": 2048,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "intermediate_size": 11008,
        "vocab_size": 151936,
        "kv_channels": 128,
        "seq_length": 8192,
    }
    path = tmp_path / "Qwen-1_8B" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(qwen))
    out = plan_json(
        LORA,
        f"model_name={path}",
        "model_max_length=1024",
        "number_gpus=1",
        "batch_size=4",
        "gpu_model=A100-80GB",
        "target_modules=c_attn,q_proj,v_proj",
    )
    assert out["is_valid"] is True
    assert any("not built into transformers" in n for n in out["notes"])
    assert any("intermediate_size / 2" in n for n in out["notes"])
    # Qwen's modelling code fuses q, k, v into c_attn: llama's names match nothing there (peft would fail)
    assert any("target_modules q_proj, v_proj match no layer" in n for n in out["notes"])
    table = invoke(
        "plan",
        LORA,
        f"model_name={path}",
        "model_max_length=1024",
        "number_gpus=1",
        "batch_size=4",
        "gpu_model=A100-80GB",
        "target_modules=c_attn",
    )
    assert table.exit_code == 0 and "remote code" in table.output
    llama_names = plan_json(
        LORA,
        f"model_name={path}",
        "model_max_length=1024",
        "number_gpus=1",
        "batch_size=4",
        "gpu_model=A100-80GB",
        "target_modules=q_proj,v_proj",
    )
    assert llama_names["is_valid"] is False and "c_attn" in llama_names["reasons"][0]


def test_lora_targets_that_match_nothing_make_the_entity_invalid():
    out = plan_json(
        LORA,
        "model_name=llama3.2-1b",
        "model_max_length=512",
        "number_gpus=1",
        "batch_size=1",
        "gpu_model=A100-80GB",
        "target_modules=c_attn",
    )
    assert out["is_valid"] is False and "match no layer" in out["reasons"][0] and "q_proj" in out["reasons"][0]


COMMON = ("model_name=llama3.2-1b", "model_max_length=1024", "number_gpus=2", "batch_size=8")


def test_a_gpu_given_by_its_numbers():
    slow = plan_json(
        LORA,
        *COMMON,
        "gpu_model=Acme-X1",
        "--gpu-memory-gib",
        "48",
        "--gpu-bf16-tflops",
        "200",
        "--gpu-interconnect-gbps",
        "64",
    )
    fast = plan_json(
        LORA,
        *COMMON,
        "gpu_model=Acme-X2",
        "--gpu-memory-gib",
        "48",
        "--gpu-bf16-tflops",
        "800",
        "--gpu-interconnect-gbps",
        "64",
        "--gpu-memory-bandwidth-gbps",
        "4000",
    )
    assert slow["capacity_gib"] == 48 and fast["capacity_gib"] == 48
    # what was assumed is said (docs/planner.md section 6), and given numbers assume nothing
    assert "gpu_model Acme-X1: memory bandwidth assumed 1,307 GB/s (153 FLOP/byte)" in slow["notes"], slow["notes"]
    assert not any("Acme-X2" in n for n in fast["notes"]), fast["notes"]
    assert fast["train_tokens_per_second"] > 1.5 * slow["train_tokens_per_second"]  # 4x the FLOP/s; fixed costs stay
    assert fast["gpu_memory_allocated_peak_gib"] == pytest.approx(slow["gpu_memory_allocated_peak_gib"])
    small = plan_json(
        LORA,
        *COMMON,
        "gpu_model=Acme-Tiny",
        "--gpu-memory-gib",
        "2",
        "--gpu-bf16-tflops",
        "50",
        "--gpu-interconnect-gbps",
        "16",
    )
    assert small["is_valid"] is False and small["oom_probability"] > 0.5 and small["headroom_gib"] < 0


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (("--gpu-memory-gib", "48", "--gpu-bf16-tflops", "200"), "--gpu-interconnect-gbps"),
        (("--gpu-memory-gib", "nan", "--gpu-bf16-tflops", "200", "--gpu-interconnect-gbps", "64"), "--gpu-memory-gib"),
        (("--gpu-memory-gib", "-1", "--gpu-bf16-tflops", "200", "--gpu-interconnect-gbps", "64"), "--gpu-memory-gib"),
    ],
)
def test_gpu_numbers_are_checked(extra, field):
    """Each number as it is parsed, by its own flag (a bad one was named --gpu-*: memory_gib); all together after."""
    res = invoke("plan", LORA, *COMMON, "gpu_model=Acme-X3", *extra)
    assert res.exit_code != 0 and res.exception is not None
    assert getattr(res.exception, "field", None) == field, res.exception


def test_an_unknown_gpu_without_numbers_says_what_to_give():
    res = invoke("plan", LORA, *COMMON, "gpu_model=Acme-Unknown")
    assert res.exception is not None and res.exception.field == "gpu_model"
    assert "--gpu-memory-gib" in str(res.exception) and "--gpu-catalog" in str(res.exception)


def test_a_user_gpu_catalog_file(tmp_path):
    catalog = tmp_path / "gpus.yaml"
    catalog.write_text(
        "gpus:\n  - name: Acme-Accel-96\n    memory_gib: 95.6\n    bf16_tflops: 500\n"
        "    interconnect_gbps: 128\n    memory_bandwidth_gbps: 1792\n    aliases: [ACME96]\n"
    )
    out = plan_json(
        LORA, *COMMON[:-2], "number_gpus=1", "batch_size=4", "gpu_model=ACME96", "--gpu-catalog", str(catalog)
    )
    assert out["capacity_gib"] == pytest.approx(95.6, abs=0.01) and out["is_valid"] is True
    env_out = plan_json(
        LORA,
        *COMMON[:-2],
        "number_gpus=1",
        "batch_size=4",
        "gpu_model=Acme-Accel-96",
        env={"TUNEBENCH_GPU_CATALOG": str(catalog)},
    )
    assert env_out["gpu_memory_allocated_peak_gib"] == out["gpu_memory_allocated_peak_gib"]
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps([{"name": "X", "memory_gib": 10, "bf16_tflops": 100}]))
    res = invoke("plan", LORA, *COMMON, "gpu_model=X", "--gpu-catalog", str(broken))
    assert res.exception is not None and "interconnect_gbps is missing" in str(res.exception)
    assert res.exception.field.startswith("--gpu-catalog")
    # torch's "total capacity" of the GPU, when the file gives it, is what the planner can use
    with_cuda = tmp_path / "cuda.yaml"
    with_cuda.write_text(catalog.read_text() + "    cuda_memory_gib: 90.0\n")
    tight = plan_json(
        LORA, *COMMON[:-2], "number_gpus=1", "batch_size=4", "gpu_model=ACME96", "--gpu-catalog", str(with_cuda)
    )
    assert tight["usable_gib"] == pytest.approx(out["usable_gib"] - (95.6 * (1 - driver_reserve()) - 90.0), abs=0.02)
    too_big = tmp_path / "too_big.yaml"
    too_big.write_text(catalog.read_text() + "    cuda_memory_gib: 96\n")
    res = invoke("plan", LORA, *COMMON, "gpu_model=ACME96", "--gpu-catalog", str(too_big))
    assert res.exception is not None and "cuda_memory_gib cannot exceed" in str(res.exception)
    # a name (or alias) twice, a number written as text, NaN: each refused, naming the entry
    entry = "  - {name: %s, memory_gib: %s, bf16_tflops: 100, interconnect_gbps: 64}\n"
    for text, says in (
        ("gpus:\n" + entry % ("MyGPU", "48") + entry % ("mygpu", "24"), "gpus[1]: 'mygpu' also names gpus[0]"),
        ("gpus:\n" + entry % ("ACME96", "48"), "also names gpus[0]"),  # another entry's alias
        ("gpus:\n" + entry % ("MyGPU", '"48"'), "gpus[0]: memory_gib: '48' is not a number"),
        ("gpus:\n" + entry % ("MyGPU", ".nan"), "gpus[0]: memory_gib: Input should be a finite number"),
    ):
        bad = tmp_path / "bad.yaml"
        bad.write_text(catalog.read_text() + text.removeprefix("gpus:\n") if "ACME96" in text else text)
        read_catalog.cache_clear()
        res = invoke("plan", LORA, *COMMON, "gpu_model=MyGPU", "--gpu-catalog", str(bad))
        assert res.exception is not None and says in str(res.exception), (text, res.exception)


@pytest.mark.slow
def test_compare_over_a_whole_store(tmp_path):
    """plan --compare with no entity: every measured entity of the store beside a fresh prediction."""
    import csv
    import statistics

    from tunebench.plan.measurements import CPU_EXAMPLE
    from tunebench.store import Store
    from tunebench.store.csvio import import_csv

    db = str(tmp_path / "s.db")
    with Store(db) as store:
        import_csv(store, CPU_EXAMPLE)
    out = plan_json("--compare", "--store", db)
    rows = list(csv.DictReader(CPU_EXAMPLE.open()))
    assert out["summary"]["entities"] == len(rows) and out["summary"]["not_planned"] == 0
    errors = []
    for row in rows:
        exp = row["experiment_id"].removeprefix("SFTTrainer.")
        base, _, params = exp.partition("-fms_hf_tuning_version")
        args = [base, *(f"{k}={row[k]}" for k in ("model_name", "number_gpus", "model_max_length", "batch_size"))]
        args += ["-p", "fms_hf_tuning_version=2.8.2", "-p", "stop_after_seconds=30", "-p", "flash_attn=False"]
        predicted = plan_json(*args)["dataset_tokens_per_second"]
        measured = float(row["dataset_tokens_per_second"])
        errors.append(abs(100 * (predicted - measured) / measured))
        item = next(
            i
            for i in out["entities"]
            if i["entity_id"].endswith(f"batch_size.{row['batch_size']}")
            and f"model_max_length.{row['model_max_length']}" in i["entity_id"]
        )
        got = next(r for r in item["comparison"] if r["property"] == "dataset_tokens_per_second")
        assert got["measured"] == pytest.approx(measured)
        assert got["error_percent"] == pytest.approx(100 * (predicted - measured) / measured, rel=1e-3)
    summary = out["summary"]["properties"]["dataset_tokens_per_second"]
    assert summary["pairs"] == len(rows)
    assert summary["mdape_percent"] == pytest.approx(statistics.median(errors), rel=1e-3)


def test_compare_over_an_empty_store_says_so(tmp_path):
    from tunebench.store import Store

    Store(tmp_path / "empty.db").close()
    res = invoke("plan", "--compare", "--store", str(tmp_path / "empty.db"))
    assert res.exit_code == 0, res.output
    assert "no measurements to compare" in res.output


def test_compare_over_a_missing_store_is_an_error_and_creates_none(tmp_path):
    """--compare only reads: a store that does not exist (a typo) is named, not created empty."""
    res = invoke("plan", "--compare", "--store", str(tmp_path / "typo.db"))
    assert res.exit_code != 0 and "no store at" in str(res.exception)
    assert not (tmp_path / "typo.db").exists()


# A long-context Phi-3 config.json (microsoft/Phi-3-mini-128k-instruct's shape) whose rope_scaling lost its
# short_factor / long_factor lists: transformers' Phi3Config rejects it (KeyError in its rope validation).
PHI3_LONGROPE = {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "hidden_size": 3072,
                 "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 32,
                 "num_key_value_heads": 32, "vocab_size": 32064, "max_position_embeddings": 131072,
                 "original_max_position_embeddings": 4096, "rope_scaling": {"type": "longrope"}, "pad_token_id": 32000}  # fmt: skip


def _phi3_without_factors(tmp_path) -> Path:
    path = tmp_path / "phi3-128k" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(PHI3_LONGROPE))
    return path


def test_a_batch_plans_every_line_around_a_config_that_cannot_be_built(tmp_path):
    bad = _phi3_without_factors(tmp_path)
    entity = {"model_max_length": 512, "number_gpus": 1, "batch_size": 1, "gpu_model": "A100"}
    lines = [
        {"experiment": LORA, "entity": {"model_name": "llama3.2-1b", **entity}},
        {"experiment": LORA, "entity": {"model_name": str(bad), "target_modules": ["qkv_proj"], **entity}},
        {"experiment": LORA, "entity": {"model_name": "smollm2-135m", **entity}},
    ]
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps(line) + "\n" for line in lines))
    res = invoke("plan", "--batch", str(batch), "--json")
    assert res.exit_code == 1, (res.output, res.exception)  # documented: 1 when any line failed
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(rows) == 3
    assert rows[0]["is_valid"] is True and rows[0]["gpu_memory_peak_gib"] > 0
    assert rows[2]["is_valid"] is True and rows[2]["gpu_memory_peak_gib"] > 0
    error = rows[1]["error"]
    assert error.startswith(f"model_name: {bad}: ") and "long_factor" in error and "short_factor" in error
    assert "internal error" not in error
    table = invoke("plan", "--batch", str(batch))
    assert table.exit_code == 1 and "3 plans" in table.output
    assert re.search(r"│\s+2 │ failed\s+│", table.output), table.output  # api.plan's word for it


@pytest.mark.parametrize("width", [20, 29, 32, 34, 35, 53, 66, 80, 86, 100])
def test_an_id_wraps_within_the_width_between_its_properties(width):
    """Every line of a wrapped entity id fits the width (a segment joins a line with its closing '-'), and a
    line breaks before a property's name, digits in it too (bf16.), unless a segment is wider than the line."""
    from tunebench.commands.terminal import wrap_id

    text = (
        "model_name.smollm2-135m-number_gpus.1-model_max_length.512-batch_size.1-gpu_model.NVIDIA-A100-SXM4-80GB-bf16.1"
    )
    lines = wrap_id(text, width).splitlines()
    assert "".join(lines) == text and all(len(line) <= width for line in lines), lines
    if width >= 32:  # the longest segment, gpu_model.NVIDIA-A100-SXM4-80GB-, fits whole
        assert all(re.match(r"[a-z_][a-z0-9_]*\.", line) for line in lines), lines


def test_a_batch_line_with_an_unknown_or_repeated_key_fails_alone(tmp_path):
    """A key beside experiment/entity/parameters, or a key given twice in one object, fails its own line (json
    keeps the last of two silently; a "params" typo dropped the parameters)."""
    entity = '{"model_name": "smollm2-135m", "model_max_length": 512, "number_gpus": 1, "batch_size": 1, "gpu_model": "A100"}'
    lines = [
        f'{{"experiment": "{LORA}", "entity": {entity}}}',
        f'{{"experiment": "{LORA}", "entity": {entity}, "params": {{"max_steps": 2}}}}',
        f'{{"experiment": "{LORA}", "entity": {entity[:-1]}, "batch_size": 2}}}}',
    ]
    batch = tmp_path / "batch.jsonl"
    batch.write_text("\n".join(lines) + "\n")
    res = invoke("plan", "--batch", str(batch), "--json")
    assert res.exit_code == 1, res.output
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert rows[0]["verdict"] == "fits"
    assert rows[1]["error"].startswith("--batch: unknown key 'params'") and '"parameters"' in rows[1]["error"]
    assert "the key 'batch_size' twice in one object" in rows[2]["error"], rows[2]


@pytest.mark.parametrize(
    ("changed", "says"),
    [
        ({"num_key_value_heads": 3}, "num_key_value_heads 3 does not divide num_attention_heads 4"),
        ({"model_type": "bert"}, "model_type 'bert' is an encoder (masked language model)"),
        ({"model_type": "bart", "d_model": 64, "encoder_layers": 2, "decoder_layers": 2}, "is an encoder-decoder"),
    ],
)
def test_a_config_no_causal_lm_can_be_built_from_is_one_line(tmp_path, capsys, changed, says):
    """Impossible head counts (transformers' attention fails on them; the planner fell back to a formula) and
    encoders (BertLMHeadModel decodes causally only with is_decoder) are refused, not planned."""
    (tmp_path / "config.json").write_text(json.dumps({**TINY_DECODER, **changed}))
    from tunebench.commands.main import main

    job = ["plan", FULL, f"model_name={tmp_path / 'config.json'}", "model_max_length=128", "number_gpus=1"]
    assert main([*job, "batch_size=1", "gpu_model=A100"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: model_name:") and says in lines[0], lines


def test_a_batchs_verdicts_follow_max_oom_risk_as_plan_grid_and_recommend_do(tmp_path):
    """fits / risky / OOM / invalid, one vocabulary: "fits" in a line's JSON is its verdict being fits."""
    job = {"model_name": "llama3.1-8b", "batch_size": 8, "gpu_model": "A100-80GB", "number_gpus": 1}
    lines = [
        {**job, "model_max_length": 512},  # small: fits at any risk
        {**job, "model_max_length": 3584},  # near the limit: fits, at a probability between 0.1 and 0.5
        {**job, "model_max_length": 16384},  # far beyond 80 GB
        {**job, "model_max_length": 512, "number_gpus": 3},  # rule 1: 8 samples over 3 GPUs
    ]
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps({"experiment": LORA, "entity": e}) + "\n" for e in lines))
    rows = [json.loads(line) for line in invoke("plan", "--batch", str(batch), "--json").stdout.splitlines()]
    assert [r["verdict"] for r in rows] == ["fits", "risky", "OOM", "invalid"]
    assert [r["fits"] for r in rows] == [True, False, False, False] and rows[0]["max_oom_risk"] == 0.1
    assert 0.1 < rows[1]["oom_probability"] <= 0.5 and rows[2]["oom_probability"] > 0.5
    loose = invoke("plan", "--batch", str(batch), "--json", "--max-oom-risk", "0.5").stdout.splitlines()
    assert [json.loads(line)["verdict"] for line in loose] == ["fits", "fits", "OOM", "invalid"]
    table = " ".join(invoke("plan", "--batch", str(batch)).output.split())
    assert all(word in table for word in ("fits", "risky", "OOM", "invalid"))


def test_a_config_that_cannot_be_built_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    from tunebench.commands.main import main

    bad = _phi3_without_factors(tmp_path)
    monkeypatch.setenv("TUNEBENCH_HOME", str(tmp_path / "home"))
    job = [f"model_name={bad}", "model_max_length=512", "batch_size=1", "gpu_model=A100", "target_modules=qkv_proj"]
    sweep = ["max-batch", str(bad), "--gpu-model", "A100", "--model-max-length", "512", "target_modules=qkv_proj"]
    for command in (["plan", LORA, *job, "number_gpus=1"], ["recommend", LORA, *job], sweep):
        code = main(command)
        out, err = capsys.readouterr()
        assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, (command, code, out, err)
        assert err.startswith(f"error: model_name: {bad}: the phi3 model cannot be built") and "long_factor" in err
        assert out == "" or command[0] != "plan", out  # recommend says what it sizes before it finds out


@pytest.mark.parametrize(
    "gpu", ["GB200", "H20", "H800", "A800", "RTX-PRO-6000", "RTX-PRO-6000-Max-Q", "MI300X", "MI325X"]
)
def test_a_plan_on_each_added_gpu_gives_a_verdict(gpu):
    from tunebench.catalog.gpus import get_gpu

    spec = get_gpu(gpu)
    out = plan_json(
        LORA, "model_name=llama3-8b", "number_gpus=1", "batch_size=1", "model_max_length=2048", f"gpu_model={gpu}"
    )
    assert out["entity_id"].endswith(f"gpu_model.{spec.name}")
    assert out["capacity_gib"] == pytest.approx(spec.memory_gib, abs=0.01)
    assert out["is_valid"] is True and out["fits"] is True and out["oom_probability"] < 0.01
    assert out["train_tokens_per_second"] > 0 and 0 < out["mfu"] < 1


def test_the_added_gpus_memory_decides_the_verdict():
    # full fine-tuning of an 8 B model at 8 x 4096 tokens: ~116 GiB per GPU, over a 96 GB RTX PRO 6000 or H20,
    # within the 256 GB of an MI325X
    args = ("model_name=llama3-8b", "number_gpus=1", "batch_size=8", "model_max_length=4096")
    small = [plan_json(FULL, *args, f"gpu_model={gpu}") for gpu in ("RTX-PRO-6000", "H20")]
    big = plan_json(FULL, *args, "gpu_model=MI325X")
    for out in small:
        assert out["is_valid"] is False and out["oom_probability"] > 0.5 and "out of GPU memory" in out["reasons"][0]
    assert big["is_valid"] is True and big["oom_probability"] < 0.01
    assert small[0]["gpu_memory_allocated_peak_gib"] == big["gpu_memory_allocated_peak_gib"]  # same need, other verdict


def test_compare_over_one_spaces_exploration(tmp_path):
    """plan --compare --space: only the measurements of that space's operation (the store's others left out)."""
    from tunebench.commands.main import main
    from tunebench.plan.measurements import CPU_EXAMPLE
    from tunebench.store import Store
    from tunebench.store.csvio import import_csv

    db = str(tmp_path / "s.db")
    space = REPO / "examples" / "grid-cpu-noop.yaml"
    assert main(["explore", str(space), "--store", db, "--max-parallel", "2"]) == 0
    with Store(db) as store:
        import_csv(store, CPU_EXAMPLE)
    whole = plan_json("--compare", "--store", db)
    assert whole["summary"]["entities"] == 4  # the imported CPU example
    one = plan_json("--compare", "--space", str(space), "--store", db)
    assert one["summary"]["entities"] == 0 and one["entities"] == []  # the no-op actuator measures nothing


def test_gpus_without_a_gpu_model_is_an_input_error_naming_rule_5():
    res = invoke("plan", LORA, "model_name=smollm2-135m", "number_gpus=1", "batch_size=2", "model_max_length=512")
    assert res.exception is not None and res.exception.field == "gpu_model", res.output
    assert "rule 5" in str(res.exception) and "`tunebench gpus`" in str(res.exception)


@pytest.mark.slow
def test_a_cpu_runs_plan_table_has_no_gpu_rows(monkeypatch):
    """number_gpus=0: the allocated peak and the need in the host's RAM, tokens/s without 'per GPU', MFU against this host's rate, no
    capacity, out-of-memory probability or GPU-hours (a column of dashes says nothing); JSON keeps the spec's
    names."""
    monkeypatch.setenv("COLUMNS", "120")
    job = [LORA, "model_name=smollm2-135m", "model_max_length=128", "number_gpus=0", "batch_size=1"]
    text = invoke("plan", *job).output
    assert "Memory of the CPU run (GiB)" in text and "predicted need in the host's RAM" in text
    assert "MFU (of this host's rate)" in text and "train tokens/s " in text
    for gpu_row in ("nvidia-smi", "capacity", "usable", "probability of running out", "per GPU", "GPU-hours"):
        assert gpu_row not in text, gpu_row
    out = json.loads(invoke("plan", *job, "--json").stdout)
    assert out["gpu_memory_allocated_peak_gib"] > 0 and out["capacity_gib"] is None


def test_the_plan_at_80_columns_wraps_ids_between_properties_and_says_when_no_price_is_known(monkeypatch):
    """An entity id wraps after the '-' between its property.value segments, never inside a name (gpu_ / model);
    a GPU without a catalog price says how to give one, where a cost would be."""
    monkeypatch.setenv("COLUMNS", "80")
    args = [*COMMON, "gpu_model=Acme-X1", "--gpu-memory-gib", "48", "--gpu-bf16-tflops", "200"]
    text = invoke("plan", LORA, *args, "loss_implementation=chunked", "--gpu-interconnect-gbps", "64").output
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("model_name."))
    id_lines = lines[start : next(i for i in range(start, len(lines)) if lines[i].startswith("fits"))]
    assert len(id_lines) >= 2, id_lines
    assert all(len(line) <= 80 for line in id_lines), id_lines
    assert all(line.endswith("-") for line in id_lines[:-1]) and "gpu_model.Acme-X1" in "".join(id_lines), id_lines
    for name in ("model_name", "number_gpus", "model_max_length", "batch_size", "gpu_model", "loss_implementation"):
        assert any(f"{name}." in line for line in id_lines), (name, id_lines)
    assert "no price known: --price-per-gpu-hour gives one" in text


def test_a_batch_is_planned_alone_and_an_empty_one_is_an_error(tmp_path, capsys):
    """--batch with --compare was silently just planned; a file of blank lines printed '0 plans' with exit 0."""
    from tunebench.commands.main import main

    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n")
    assert main(["plan", "--batch", str(empty)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --batch: ") and "has no JSON lines" in err and "(allowed: " in err
    good = tmp_path / "one.jsonl"
    entity = {"model_name": "llama3.2-1b", "model_max_length": 512, "number_gpus": 1, "batch_size": 1}
    good.write_text(json.dumps({"experiment": LORA, "entity": {**entity, "gpu_model": "A100"}}) + "\n")
    assert main(["plan", "--batch", str(good), "--compare"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: --compare: not with --batch") and captured.out == ""
    no_entity = tmp_path / "no-entity.jsonl"
    odd = [
        {"experiment": LORA},
        {"experiment": LORA, "entity": entity, "parameters": [1, 2]},
        {"experiment": 7, "entity": entity},
    ]
    no_entity.write_text("".join(json.dumps(line) + "\n" for line in odd))
    assert main(["plan", "--batch", str(no_entity), "--json"]) == 1  # each line its error, none stops the batch
    errors = [json.loads(line)["error"] for line in capsys.readouterr().out.splitlines()]
    assert errors[0].startswith('--batch: expected {"experiment": ID, "entity"')
    assert errors[1].startswith('--batch: "parameters" must be an object') and "experiment id" in errors[2]


def test_a_cpu_run_over_several_nodes_is_not_planned_to_fit():
    """number_gpus=0 over 2 nodes: no process on any node (the measuring engines refuse it too); it was planned
    to fit with a note on the network between the nodes."""
    from tunebench.plan.predictor import PlanOptions, predict_values
    from tunebench.plan.sweep import method_job

    job = {"model_name": "smollm2-135m", "model_max_length": 128, "number_gpus": 0, "batch_size": 2}
    rows = [("lora", method_job("lora", {**job, **nodes})[1]) for nodes in ({"number_nodes": 2}, {})]
    cols = predict_values(rows, PlanOptions(probe_host=False))  # the verdict needs no timing of this host
    assert cols["rules"][0] == [  # it cannot start: not planned (no figures), as a broken validity rule
        "number_nodes 2 with number_gpus 0: each node would run number_gpus / number_nodes = 0 processes; "
        "a CPU run runs on one machine: set number_nodes 1"
    ]
    assert not cols["fits"][0] and not any("across nodes" in n for n in cols["notes"][0])
    assert cols["dataset_tokens_per_second"][0] != cols["dataset_tokens_per_second"][0]  # NaN: not timed
    assert cols["rules"][1] == [] and cols["fits"][1]


def test_a_short_gpu_alias_says_which_part_it_took():
    # 'A100' is the 80 GB SXM4 (gpus.json sources_note); a plan says so and names the 40 GB parts
    args = ("model_name=llama3-8b", "number_gpus=1", "batch_size=1", "model_max_length=2048")
    out = plan_json(LORA, *args, "gpu_model=A100")
    assert out["capacity_gib"] == pytest.approx(80, abs=0.01)
    note = out["platform_notes"][0]
    assert "A100 is taken as NVIDIA-A100-SXM4-80GB (80 GiB)" in note and "NVIDIA-A100-SXM4-40GB (40 GiB)" in note
    exact = plan_json(LORA, *args, "gpu_model=A100-80GB")  # names its memory: no other A100 holds 80 GiB
    assert not any("is taken as" in n for n in exact["platform_notes"])
    found = json.loads(invoke("max-batch", "llama3-8b", "--gpu-model", "V100", "--json").stdout)
    assert "V100 is taken as Tesla-V100-SXM2-16GB (16 GiB)" in found["notes"][0]
    rec = invoke("recommend", LORA, *args, "gpu_model=H100", "--max-gpus", "2", "--json")
    assert any("H100 is taken as NVIDIA-H100-80GB-HBM3" in n for n in json.loads(rec.stdout)["notes"])


def test_max_batch_refuses_a_job_nothing_can_run_before_searching(capsys):
    from tunebench.commands.main import main

    assert main(["max-batch", "smollm2-135m", "--number-gpus", "0", "liger_kernels=true"]) == 2
    assert "error: liger_kernels: liger_kernels true with number_gpus 0" in capsys.readouterr().err
    job = ["--gpu-model", "A100", "--number-gpus", "4", "number_nodes=2", "distributed_backend=None"]
    assert main(["max-batch", "llama3.2-1b", *job]) == 2
    assert "error: number_nodes: number_nodes 2 with distributed_backend None" in capsys.readouterr().err


def test_durations_and_huge_figures_read_at_a_glance():
    """num_train_epochs has no upper bound in the spec: a plan of 1e300 epochs printed a 300-digit runtime in hours,
    cut off by the table; long runs read in days and years, huge figures in scientific notation."""
    from tunebench.commands.printing import cost_text, duration, fmt

    assert [duration(s) for s in (59, 600, 7200, 3 * 86400, 2 * 365.25 * 86400, 1e300)] == [
        "59 s",
        "10.0 min",
        "2.00 h",
        "3.0 days",
        "2.0 years",
        "3.17e+292 years",
    ]
    assert fmt(1024, 0) == "1024" and fmt(1.024e12, 0) == "1,024,000,000,000" and fmt(1.02e303, 0) == "1.02e+303"
    assert cost_text(5.7e299, "USD") == "5.7e+299 USD" and cost_text(171.784, "USD") == "171.78 USD"
