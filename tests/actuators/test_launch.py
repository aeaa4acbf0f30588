"""Golden launch plans: exactly what a measurement of each kind of entity would execute.

Regenerate after a deliberate change with UPDATE_GOLDEN=1 and review the diff of tests/golden/.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml
from layout import TESTS

from tunebench.actuators.launch import build_launch_plan
from tunebench.errors import InputError
from tunebench.spec.experiments import get_experiment, make_entity

GOLDEN = TESTS / "golden"
A100 = "NVIDIA-A100-80GB-PCIe"

CASES = {
    "cpu": ("finetune_full_benchmark-v1.0.0", {},
            {"model_name": "smollm2-135m", "model_max_length": 512, "number_gpus": 0, "batch_size": 2}, {}),
    "1gpu": ("finetune_lora_benchmark-v1.0.0", {},
             {"model_name": "llama3.1-8b", "model_max_length": 4096, "number_gpus": 1, "batch_size": 4,
              "gpu_model": A100}, {}),
    "4gpu_fsdp": ("finetune_full_benchmark-v1.0.0", {"max_steps": 10},
                  {"model_name": "granite-3.1-8b-instruct", "model_max_length": 2048, "number_gpus": 4,
                   "batch_size": 16, "gpu_model": "NVIDIA-A100-SXM4-80GB", "fsdp_sharding_strategy": "HYBRID_SHARD"},
                  {}),
    "4gpu_ddp": ("finetune_lora_benchmark-v1.0.0", {},
                 {"model_name": "mistral-7b-v0.1", "model_max_length": 1024, "number_gpus": 4, "batch_size": 8,
                  "gpu_model": A100, "distributed_backend": "DDP", "r": 16, "lora_alpha": 32}, {}),
    "2node_4gpu_roce": ("finetune_full_benchmark-v1.0.0", {"fms_hf_tuning_version": "3.1.0"},
                        {"model_name": "llama3.1-70b", "model_max_length": 8192, "number_gpus": 8,
                         "batch_size": 8, "gpu_model": "NVIDIA-H100-80GB-HBM3", "number_nodes": 2,
                         "enable_roce": True},
                        {"main_process_ip": "10.0.0.7", "main_process_port": 29511}),
    "gptq_lora": ("finetune_gptq-lora_benchmark-v1.0.0", {},
                  {"model_name": "llama-7b", "model_max_length": 2048, "number_gpus": 2, "batch_size": 8,
                   "gpu_model": A100}, {"engine": "fms-hf-tuning"}),  # fms-acceleration's kernels: that engine only
    "prompt_tuning": ("finetune_pt_benchmark-v1.0.0", {"dataset_id": "news-chars-1024-entries-4096"},
                      {"model_name": "smollm2-135m", "model_max_length": 1024, "number_gpus": 1, "batch_size": 8,
                       "gpu_model": "L40S"}, {}),
}  # fmt: skip


def plan_of(case: str):
    exp_id, params, entity, options = CASES[case]
    exp = get_experiment(exp_id, params)
    return build_launch_plan(exp, make_entity(exp, entity), data_directory="/data", **options)


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_launch_plan(case):
    got = plan_of(case).to_dict()
    path = GOLDEN / f"launch_{case}.json"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=2) + "\n")
    assert got == json.loads(path.read_text())


def test_cpu_plan_is_one_process_without_gpus_or_flash_attention():
    plan = plan_of("cpu")
    (node,) = plan.nodes
    assert plan.mode == "single" and node.accelerate_config is None
    assert node.command[:3] == ["python", "-m", "tunebench.worker"]
    assert node.env == {"CUDA_VISIBLE_DEVICES": ""}
    args = node.command
    assert args[args.index("--use_flash_attn") + 1] == "False"
    assert args[args.index("--per_device_train_batch_size") + 1] == "2"
    assert args[args.index("--peft_method") + 1] == "none"


def test_fsdp_plan_follows_the_spec_block():
    plan = plan_of("4gpu_fsdp")
    cfg = plan.nodes[0].accelerate_config
    assert cfg["distributed_type"] == "FSDP" and cfg["num_processes"] == 4 and cfg["num_machines"] == 1
    assert cfg["fsdp_config"]["fsdp_sharding_strategy"] == "HYBRID_SHARD"
    assert cfg["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"] == "GraniteDecoderLayer"
    assert cfg["mixed_precision"] == "no" and "main_process_ip" not in cfg
    cmd = plan.nodes[0].command
    assert cmd[:6] == [
        "accelerate",
        "launch",
        "--config_file",
        "{output_dir}/accelerate_config.yaml",
        "--num_processes",
        "4",
    ]
    assert cmd[cmd.index("--per_device_train_batch_size") + 1] == "4"
    assert cmd[cmd.index("--max_steps") + 1] == "10"
    # the YAML round-trips, with "no" kept a string (bare `no` is a YAML boolean)
    assert yaml.safe_load(plan.nodes[0].accelerate_config_yaml()) == cfg


def test_multi_node_plans_differ_only_in_machine_rank():
    plan = plan_of("2node_4gpu_roce")
    assert [n.machine_rank for n in plan.nodes] == [0, 1]
    assert plan.processes_per_node == 4 and plan.per_device_train_batch_size == 1
    first, second = (n.accelerate_config for n in plan.nodes)
    assert first["num_machines"] == 2 and first["num_processes"] == 8
    assert first["main_process_ip"] == "10.0.0.7" and first["main_process_port"] == 29511
    assert {**first, "machine_rank": 1} == second
    # each node sees exactly its 4 GPUs; RoCE on
    assert all(
        n.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0,1,2,3", "NCCL_IB_DISABLE": "0"}
        for n in plan.nodes
    )
    assert "--fast_moe" in plan.nodes[0].command  # fms-hf-tuning 3.1.0 >= 2.4.0


def test_roce_off_disables_infiniband():
    exp_id, params, entity, options = CASES["2node_4gpu_roce"]
    exp = get_experiment(exp_id, params)
    plan = build_launch_plan(exp, make_entity(exp, {**entity, "enable_roce": False}), data_directory="/data")
    assert plan.nodes[0].env["NCCL_IB_DISABLE"] == "1"
    assert plan.nodes[0].accelerate_config["main_process_ip"] == "{main_process_ip}"


def test_gptq_and_prompt_tuning_flags():
    gptq = plan_of("gptq_lora").nodes[0].command_line
    assert "--torch_dtype float16" in gptq
    assert "--fp16 true --fast_kernels true true true --fused_lora auto_gptq true --auto_gptq triton_v2" in gptq
    assert "--target_modules q_proj k_proj" in gptq  # llama-7b's GPTQ map (spec 004)
    pt = plan_of("prompt_tuning").nodes[0].command
    assert pt[pt.index("--peft_method") + 1] == "pt"
    assert pt[pt.index("--num_virtual_tokens") + 1] == "8"
    assert pt[pt.index("--training_data_path") + 1] == "/data/news-chars-1024-entries-4096.jsonl"
    assert "--target_modules" not in pt


def test_command_line_is_a_faithful_bash_line(tmp_path):
    node = plan_of("1gpu").nodes[0]
    script = tmp_path / "argv.py"
    script.write_text("import sys, json; print(json.dumps(sys.argv[1:]))")
    line = node.command_line.replace("python -m tunebench.worker", f"python3 {script}", 1)
    out = subprocess.run(["bash", "-c", line], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == node.command[3:]
    assert node.command[node.command.index("--response_template") + 1] == "\n### Response:"


def test_invalid_entity_has_no_plan():
    exp = get_experiment("finetune_full_benchmark-v1.0.0")
    entity = make_entity(
        exp,
        {"model_name": "smollm2-135m", "model_max_length": 64, "number_gpus": 4, "batch_size": 6, "gpu_model": A100},
    )
    with pytest.raises(InputError, match="rule 1"):
        build_launch_plan(exp, entity)
