"""Experiments as code: defaults, domains, parameterisation, canonical entity identity, input errors."""

from __future__ import annotations

import pytest

from tunebench.errors import InputError
from tunebench.spec.experiments import (
    effective_values,
    get_experiment,
    list_experiments,
    make_entity,
)
from tunebench.spec.measured import BENCHMARK_MEASURED, STABILITY_MEASURED

IDS = [
    "finetune_full_benchmark-v1.0.0",
    "finetune_full_stability-v1.0.0",
    "finetune_lora_benchmark-v1.0.0",
    "finetune_gptq-lora_benchmark-v1.0.0",
    "finetune_pt_benchmark-v1.0.0",
    "finetune_qlora_benchmark-v1.0.0",
]
SMOL = {"model_name": "smollm2-135m", "model_max_length": 512, "number_gpus": 0, "batch_size": 2}


def test_the_six_experiments():
    assert sorted(e.id for e in list_experiments()) == sorted(IDS)
    assert get_experiment("SFTTrainer.finetune_lora_benchmark-v1.0.0").id == IDS[2]  # ado's prefixed form


def test_methods_and_measured_properties():
    methods = {e.id: e.method for e in list_experiments()}
    assert methods[IDS[3]] == "gptq-lora" and methods[IDS[4]] == "pt" and methods[IDS[5]] == "qlora"
    assert get_experiment(IDS[1]).measured == STABILITY_MEASURED
    assert get_experiment(IDS[5]).measured == BENCHMARK_MEASURED
    assert set(get_experiment(IDS[5]).optional) == set(get_experiment(IDS[2]).optional)  # QLoRA = LoRA props


def test_hardcoded_values():
    stability = get_experiment(IDS[1])
    assert stability.hardcoded["max_steps"] == 5 and stability.hardcoded["repetitions"] == 5
    gptq = get_experiment(IDS[3])
    assert gptq.hardcoded["auto_gptq"] == ("triton_v2",) and gptq.hardcoded["fp16"] is True
    assert gptq.default("torch_dtype") == "float16" and gptq.default("fast_kernels") == (True, True, True)
    qlora = get_experiment(IDS[5]).hardcoded
    assert qlora["bnb_4bit_quant_type"] == "nf4" and qlora["bnb_4bit_use_double_quant"] is True
    for exp in list_experiments():
        assert exp.hardcoded["learning_rate"] == 1e-05 and exp.hardcoded["response_template"] == "\n### Response:"


def test_identity_is_canonical():
    exp = get_experiment(IDS[2])
    base = make_entity(exp, SMOL)
    assert base.id == "model_name.smollm2-135m-number_gpus.0-model_max_length.512-batch_size.2"
    # argument order, string values, aliases and spelled-out defaults do not change the id
    shuffled = make_entity(
        exp,
        {
            "batch_size": "2",
            "number_gpus": "0",
            "model_max_length": "512",
            "model_name": "HuggingFaceTB/SmolLM2-135M",
            "r": 4,
            "torch_dtype": "bfloat16",
            "gradient_checkpointing": "true",
            "dataset_id": "news-tokens-16384plus-entries-4096",
        },
    )
    assert shuffled.id == base.id and shuffled == base
    # a non-default value does
    other = make_entity(exp, {**SMOL, "r": 8})
    assert other.id == base.id + "-r.8"
    assert make_entity(exp, {**SMOL, "gpu_model": "A100-80GB"}).id.endswith("gpu_model.NVIDIA-A100-SXM4-80GB")


def test_parameterised_experiments_have_distinct_ids():
    exp = get_experiment(IDS[0])
    p1 = get_experiment(IDS[0], {"stop_after_seconds": 30, "fms_hf_tuning_version": "2.8.2"})
    p2 = get_experiment(IDS[0], {"fms_hf_tuning_version": "2.8.2", "stop_after_seconds": "30.0"})
    assert p1.id == p2.id == IDS[0] + "-fms_hf_tuning_version.2.8.2-stop_after_seconds.30"
    assert get_experiment(IDS[0], {"max_steps": -1}).id == exp.id  # the default is no parameter
    assert p1.default("stop_after_seconds") == 30.0
    # an entity value equal to the parameterised default is dropped from the entity
    assert make_entity(p1, {**SMOL, "stop_after_seconds": 30}).id == make_entity(p1, SMOL).id
    values = effective_values(p1, make_entity(p1, SMOL))
    assert values["stop_after_seconds"] == 30.0 and values["learning_rate"] == 1e-05


def test_target_modules_from_map_or_override(tmp_path):
    exp = get_experiment(IDS[2])
    assert effective_values(exp, make_entity(exp, SMOL))["target_modules"] == ("q_proj", "v_proj")
    bloom = {**SMOL, "model_name": "hf-tiny-model-private/tiny-random-BloomForCausalLM"}
    assert effective_values(exp, make_entity(exp, bloom))["target_modules"] == ("dense_h_to_4h", "dense_4h_to_4h")
    cfg = tmp_path / "config.json"
    cfg.write_text(
        '{"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,'
        ' "vocab_size": 100}'
    )
    with pytest.raises(InputError, match="^target_modules: .*no target-module mapping") as err:
        make_entity(exp, {**SMOL, "model_name": str(cfg)})
    # the line says what peft itself would adapt for this model_type
    assert "target_modules=q_proj,v_proj (peft's default for model_type qwen2)" in str(err.value)
    entity = make_entity(exp, {**SMOL, "model_name": str(cfg), "target_modules": "q_proj, o_proj"})
    assert effective_values(exp, entity)["target_modules"] == ("q_proj", "o_proj")
    # full fine-tuning needs no mapping
    make_entity(get_experiment(IDS[0]), {**SMOL, "model_name": str(cfg)})


def test_any_node_label_is_a_gpu_model_and_known_ones_are_canonical():
    exp = get_experiment(IDS[2])
    assert make_entity(exp, {**SMOL, "gpu_model": "Acme-X1"})["gpu_model"] == "Acme-X1"  # the spec takes any label
    assert make_entity(exp, {**SMOL, "gpu_model": "H100"})["gpu_model"] == "NVIDIA-H100-80GB-HBM3"


def test_open_domains_accept_what_real_jobs_use():
    exp = get_experiment(IDS[2])
    big = make_entity(
        exp, {**SMOL, "number_gpus": 512, "batch_size": 8192, "gpu_model": "H100", "number_nodes": 64, "r": 1024}
    )
    assert big["r"] == 1024 and big["number_gpus"] == 512


@pytest.mark.parametrize(
    ("experiment", "changes", "field", "fragment"),
    [
        (IDS[2], {"optim": "adamw"}, "optim", "Did you mean"),
        (IDS[2], {"r": 2048}, "r", "integer in [1, 1024]"),
        (IDS[2], {"r": 0}, "r", "outside the domain"),
        (IDS[2], {"model_max_length": "long"}, "model_max_length", "not an integer"),
        (IDS[2], {"batch_size": 2.5}, "batch_size", "not an integer"),
        (IDS[2], {"torch_dtype": "int8"}, "torch_dtype", "bfloat16, float32, float16"),
        (IDS[2], {"gpu_model": "A100 80GB!"}, "gpu_model", "not a node label"),
        (IDS[2], {"model_name": "lama3-8b"}, "model_name", "llama3-8b"),
        (IDS[2], {"dataset_id": "news-512"}, "dataset_id", "news-chars-N-entries-M"),
        (IDS[2], {"max_steps": -2}, "max_steps", "an integer >= -1"),
        (IDS[2], {"stop_after_seconds": -5}, "stop_after_seconds", "outside the domain"),
        (IDS[2], {"torch_dtype": "float64"}, "torch_dtype", "allowed: bfloat16, float32, float16)"),
        (IDS[1], {"torch_dtype": "int8"}, "torch_dtype", "bfloat16, float32, float16, float64"),
        (IDS[2], {"gradient_checkpointing": "maybe"}, "gradient_checkpointing", "not a boolean"),
        (IDS[2], {"fast_kernels": "true,false"}, "fast_kernels", "exactly 3"),
        (IDS[2], {"learning_rate": 0.1}, "learning_rate", "fixed at 1e-05"),
        (IDS[2], {"optimizer": "sgd"}, "optimizer", "unknown property"),
        (IDS[0], {"r": 8}, "r", "not a property of finetune_full_benchmark"),
        (IDS[3], {"torch_dtype": "bfloat16"}, "torch_dtype", "allowed: float16"),
        (IDS[1], {"max_steps": 9}, "max_steps", "fixed at 5"),
    ],
)
def test_input_errors_name_the_field_and_allowed_values(experiment, changes, field, fragment):
    with pytest.raises(InputError) as err:
        make_entity(get_experiment(experiment), {**SMOL, **changes})
    text = str(err.value)
    assert text.startswith(f"{field}: ") and fragment in text and "\n" not in text


def test_missing_required_and_bad_parameterisation():
    with pytest.raises(InputError, match="^batch_size: is required"):
        make_entity(get_experiment(IDS[0]), {k: v for k, v in SMOL.items() if k != "batch_size"})
    with pytest.raises(InputError, match="^batch_size: is a required entity property"):
        get_experiment(IDS[0], {"batch_size": 4})
    with pytest.raises(InputError, match="^experiment: unknown experiment"):
        get_experiment("finetune_ful_benchmark-v1.0.0")


def test_fsdp_sharding_strategy_accepts_the_spec_numbers():
    exp = get_experiment(IDS[0])
    assert make_entity(exp, {**SMOL, "fsdp_sharding_strategy": 2})["fsdp_sharding_strategy"] == "SHARD_GRAD_OP"
    assert "fsdp_sharding_strategy" not in make_entity(exp, {**SMOL, "fsdp_sharding_strategy": "1"}).values


def test_offload_devices_accept_their_default_none_in_any_spelling():
    exp = get_experiment(IDS[0])
    ds = {**SMOL, "distributed_backend": "DeepSpeed"}
    for spelled in ("none", "None", "NONE", None):
        entity = make_entity(exp, {**ds, "offload_optimizer_device": spelled, "offload_param_device": spelled})
        assert entity == make_entity(exp, ds)  # the default: the same identity as leaving it out
    assert make_entity(exp, {**ds, "offload_optimizer_device": "CPU"})["offload_optimizer_device"] == "cpu"


def test_domains_are_the_specs_validity_or_the_run_judges_the_rest():
    """The spec's domains: max_steps from -1 (0 and -1 both respect num_train_epochs), stop_after_seconds from -1
    (<= 0 is off), and the stability experiment's "any valid torch_dtype value" (float64, torch's aliases)."""
    lora = get_experiment(IDS[2])
    assert make_entity(lora, {**SMOL, "max_steps": 0})["max_steps"] == 0
    assert make_entity(lora, {**SMOL, "stop_after_seconds": 0})["stop_after_seconds"] == 0.0
    assert make_entity(lora, {**SMOL, "stop_after_seconds": -0.5})["stop_after_seconds"] == -0.5
    stability = get_experiment("finetune_full_stability-v1.0.0")
    for raw, dtype in (
        ("float64", "float64"),
        ("double", "float64"),
        ("torch.float64", "float64"),
        ("half", "float16"),
        ("float", "float32"),
        ("bfloat16", "bfloat16"),
    ):
        assert stability.parse("torch_dtype", raw) == dtype
    assert make_entity(stability, {**SMOL, "torch_dtype": "float64"}).id.endswith("-torch_dtype.float64")
    assert lora.parse("torch_dtype", "half") == "float16"  # an alias of a value the benchmark takes
