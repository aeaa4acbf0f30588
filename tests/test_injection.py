"""Values that reach the worker's command line can never become flags (issue 11, item 4).

The worker is ``python -m tunebench.worker --flag value ...``: a property value such as
``target_modules=q_proj --host_memory_limit_gib 0.01`` must not turn into a second flag, and a
string starting with ``--`` must not be accepted anywhere it would be passed on.
"""

from __future__ import annotations

import pytest

from tunebench.errors import InputError
from tunebench.spec.experiments import get_experiment, make_entity
from tunebench.explore.space import parse_space
from tunebench.actuators.launch import build_launch_plan
from tunebench.worker.args import parse_args

LORA = get_experiment("finetune_lora_benchmark-v1.0.0")
BASE = {"model_name": "smollm2-135m", "model_max_length": 256, "number_gpus": 0, "batch_size": 2}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("target_modules", "q_proj --host_memory_limit_gib 0.01"),
        ("target_modules", "q_proj,--result_path=/tmp/x"),
        ("target_modules", '["q_proj", "--weights", "pretrained"]'),
        ("target_modules", "q_proj\nv_proj"),
        ("dataset_text_field", "--host_memory_limit_gib"),
        ("dataset_text_field", "output --max_steps 1"),
        ("dataset_image_field", "-x"),
        ("accelerate_config_fsdp_transformer_layer_cls_to_wrap", "--fsdp_offload_params"),
        ("accelerate_config_fsdp_transformer_layer_cls_to_wrap", "LlamaDecoderLayer\n  fsdp_offload_params: true"),
    ],
)
def test_entity_values_that_would_become_flags_are_input_errors(name, value):
    with pytest.raises(InputError) as caught:
        make_entity(LORA, {**BASE, name: value})
    assert caught.value.field == name


def test_a_yaml_list_cannot_smuggle_a_flag_either():
    space = {
        "experiments": [{"id": LORA.id}],
        "entity_space": {**BASE, "target_modules": [["q_proj", "--host_memory_limit_gib", "0.01"]]},
    }
    with pytest.raises(InputError) as caught:
        parse_space(space)
    assert caught.value.field.startswith("entity_space.target_modules")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("q_proj v_proj", ["q_proj", "v_proj"]),
        ("all-linear", ["all-linear"]),
        ("model.layers.0.self_attn.q_proj", ["model.layers.0.self_attn.q_proj"]),
    ],
)
def test_module_names_still_reach_the_worker_as_values(value, expected):
    plan = build_launch_plan(LORA, make_entity(LORA, {**BASE, "target_modules": value}), data_directory="/d")
    args, unknown = parse_args([a.replace("{output_dir}", "/out") for a in plan.worker_args])
    assert args.target_modules == expected and unknown == []
    assert args.host_memory_limit_gib == -1.0  # untouched: nothing became a flag


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"model_map": {"smollm2-135m": "--host_memory_limit_gib"}}, "model_name_or_path"),
        ({"model_map": {"smollm2-135m": "-v"}}, "model_name_or_path"),
        ({"model_map": {"smollm2-135m": "/models/a\nb"}}, "model_name_or_path"),
    ],
)
def test_paths_from_actuator_options_cannot_become_flags(kwargs, field):
    with pytest.raises(InputError) as caught:
        build_launch_plan(LORA, make_entity(LORA, BASE), data_directory="/d", **kwargs)
    assert caught.value.field == field


def test_a_relative_data_directory_is_passed_as_an_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = build_launch_plan(LORA, make_entity(LORA, BASE), data_directory="-data")
    args, unknown = parse_args([a.replace("{output_dir}", "/out") for a in plan.worker_args])
    assert args.training_data_path == str(tmp_path / "-data" / "news-tokens-16384plus-entries-4096.jsonl")
    assert unknown == []
