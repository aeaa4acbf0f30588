"""Values that reach the worker's command line can never become flags (issue 11, item 4).

The worker is ``python -m tunebench.worker --flag value ...``: a property value such as
``target_modules=q_proj --host_memory_limit_gib 0.01`` must not turn into a second flag, and a
string starting with ``--`` must not be accepted anywhere it would be passed on.
"""

from __future__ import annotations

import pytest

from tunebench.actuators.launch import build_launch_plan
from tunebench.errors import InputError
from tunebench.explore.space import parse_space
from tunebench.spec.experiments import get_experiment, make_entity
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


# --- actuator.extra_worker_args: only the worker flags tunebench never sets, each value checked

GPU = {"model_name": "llama3.1-8b", "model_max_length": 2048, "number_gpus": 2, "batch_size": 8, "gpu_model": "H100"}
EVERY_OPTIONAL_FLAG = {"fast_kernels": "True,True,True", "dataset_image_field": "images", "remove_unused_columns": False,
                       "dataset_kwargs_skip_prepare_dataset": True, "attn_implementation": "sdpa",
                       "loss_implementation": "upcast", "adapter_dtype": "float32", "torch_compile": True,
                       "padding_free": True, "fms_hf_tuning_version": "2.4.0"}  # fmt: skip


def flags_tunebench_sets() -> set[str]:
    """Every flag a launch passes the worker: from each experiment's entities (every optional flag on),
    from the actuator's options and from the placement."""
    from tunebench.actuators.launch import plan_of_values
    from tunebench.actuators.measure import with_gpu_count
    from tunebench.actuators.options import MeasureOptions
    from tunebench.actuators.process import _option_flags
    from tunebench.spec.experiments import effective_values, list_experiments

    seen: set[str] = set()
    for experiment in list_experiments():
        names = {*experiment.required, *experiment.optional}
        for base in (BASE, GPU):
            for extra in ({}, EVERY_OPTIONAL_FLAG):
                values = {**base, **{k: v for k, v in extra.items() if k in names}}
                if experiment.method == "gptq-lora":
                    values["target_modules"] = "q_proj v_proj"
                entity = make_entity(experiment, values)  # every engine's flags: no engine's judgement first
                plan = plan_of_values(experiment, entity.id, effective_values(experiment, entity), data_directory="/d")
                seen |= {a.split("=")[0] for node in plan.nodes for a in node.command if a.startswith("--")}
    options = MeasureOptions(host_memory_limit_gib=1, metrics_interval_seconds=1, auto_stop_windows_seconds=(1, 2, 3))
    return seen | {a for a in _option_flags(with_gpu_count(options, {"number_gpus": 2})) if a.startswith("--")}


def test_the_extra_flags_are_exactly_the_worker_flags_tunebench_never_sets():
    from tunebench.worker.args import build_parser, extra_flags

    every = set(build_parser()._option_string_actions) - {"-h", "--help"}
    launch = flags_tunebench_sets() & every  # accelerate's own (--config_file, --num_processes) aside
    assert set(extra_flags()) == every - launch
    assert set(extra_flags()) == {"--seed", "--tokenizer_name_or_path", "--tunebench_tiny", "--use_cpu"}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (["--result_path", "/etc/passwd"], "'--result_path' is set by tunebench itself"),
        (["--result_path=/etc/passwd"], "'--result_path' is set by tunebench itself"),
        (["--output_dir", "/"], "'--output_dir' is set by tunebench itself"),
        (["--max_steps", "100000"], "'--max_steps' is set by tunebench itself"),
        (["--host_memory_limit_gib", "0.01"], "'--host_memory_limit_gib' is set by tunebench itself"),
        (["--tunebench_number_gpus", "64"], "'--tunebench_number_gpus' is set by tunebench itself"),
        (["--bogus", "1"], "'--bogus' is not a flag tunebench passes on"),
        (["--res", "/x"], "'--res' is not a flag tunebench passes on"),  # no abbreviations
        (["--seed"], "--seed needs one value"),
        (["--seed", "seven"], "--seed: bad value 'seven'"),
        (["--tunebench_tiny", "maybe"], "--tunebench_tiny: bad value 'maybe'"),
        (["--tokenizer_name_or_path", "--result_path"], "starts with '-'"),
        (["--tokenizer_name_or_path", "/tok\n--result_path"], "control characters"),
        (["--seed", ["7"]], "is not a flag or a value"),
        ("--seed 7", "must be a list"),
        ({"--seed": 7}, "must be a list"),
    ],
)
def test_extra_worker_args_take_only_flags_tunebench_never_sets(value, message):
    from tunebench.actuators import check_options

    with pytest.raises(InputError) as caught:
        check_options("measure", {"extra_worker_args": value})
    assert caught.value.field == "actuator.extra_worker_args"
    assert message in str(caught.value)
    assert "(allowed: " in str(caught.value)


def test_extra_worker_args_reach_the_worker_and_replace_none_of_tunebench_s_flags(tmp_path):
    from tunebench.actuators.measure import with_gpu_count
    from tunebench.actuators.options import MeasureOptions
    from tunebench.actuators.process import node_command

    opts = MeasureOptions.from_mapping({"extra_worker_args": ["--seed", 7, "--tunebench_tiny=True", "--use_cpu", True]})
    assert opts.extra_worker_args == ("--seed", "7", "--tunebench_tiny", "True", "--use_cpu", "True")
    plan = build_launch_plan(LORA, make_entity(LORA, BASE), data_directory="/d")
    command, _ = node_command(plan.nodes[0], tmp_path, with_gpu_count(opts, {"number_gpus": 0}))
    args, unknown = parse_args(command[command.index("tunebench.worker") + 1 :])
    assert (args.seed, args.tunebench_tiny, args.use_cpu, unknown) == (7, True, True, [])
    assert (args.result_path, args.output_dir) == (f"{tmp_path}/result", str(tmp_path))
