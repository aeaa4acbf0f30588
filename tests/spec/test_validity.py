"""Each validity rule of spec 004 on both sides of its boundary."""

from __future__ import annotations

import json

import pytest
from layout import REPO

from tunebench.spec.experiments import get_experiment, make_entity
from tunebench.spec.validity import check

LORA = get_experiment("finetune_lora_benchmark-v1.0.0")
BASE = {"model_name": "llama3.1-8b", "model_max_length": 1024, "number_gpus": 4, "batch_size": 8,
        "gpu_model": "NVIDIA-A100-80GB-PCIe"}  # fmt: skip


def verdict(experiment=LORA, **changes):
    result = check(experiment, make_entity(experiment, {**BASE, **changes}))
    return result.is_valid, " | ".join(result.reasons)


def test_base_entity_is_valid():
    assert verdict() == (True, "")


@pytest.mark.parametrize(
    ("changes", "valid", "rule"),
    [
        # 1. batch_size % number_gpus
        ({"batch_size": 12, "number_gpus": 4}, True, None),
        ({"batch_size": 10, "number_gpus": 4}, False, "rule 1"),
        ({"batch_size": 3, "number_gpus": 0, "gpu_model": ""}, True, None),  # CPU: one device
        # 2. number_gpus % number_nodes
        ({"number_gpus": 8, "batch_size": 8, "number_nodes": 2}, True, None),
        ({"number_gpus": 6, "batch_size": 6, "number_nodes": 4}, False, "rule 2"),
        # the spec's number_gpus % number_nodes: 0 GPUs divide over any number of nodes (not max(1, 0) % 2)
        ({"number_gpus": 0, "gpu_model": "", "batch_size": 8, "number_nodes": 2}, True, None),
        ({"number_gpus": 2, "batch_size": 8, "number_nodes": 4}, False, "rule 2"),
        # 3. number_nodes > 0
        ({"number_nodes": 1}, True, None),
        ({"number_nodes": 0}, False, "rule 3"),
        ({"number_nodes": -2}, False, "rule 3"),
        # 4. batch_size > 0
        ({"batch_size": 4}, True, None),
        ({"batch_size": 0}, False, "rule 4"),
        ({"batch_size": -4}, False, "rule 4"),
        # 5. gpu_model non-empty when number_gpus > 0
        ({"number_gpus": 0, "gpu_model": "", "batch_size": 8}, True, None),
        ({"number_gpus": 1, "gpu_model": "", "batch_size": 8}, False, "rule 5"),
    ],
)
def test_rules_1_to_5(changes, valid, rule):
    is_valid, reasons = verdict(**changes)
    assert is_valid is valid, reasons
    if rule:
        assert rule in reasons
    else:
        assert reasons == ""


MOE = {"model_name": "mixtral-8x7b-instruct-v0.1", "fms_hf_tuning_version": "2.4.0"}  # 8 experts


@pytest.mark.parametrize(
    ("changes", "valid", "rule"),
    [
        # 6. number_gpus % fast_moe
        ({**MOE, "number_gpus": 4, "fast_moe": 2}, True, None),
        ({**MOE, "number_gpus": 4, "fast_moe": 8, "batch_size": 8}, False, "rule 6"),
        # 7. num_local_experts % fast_moe (8 experts)
        ({**MOE, "number_gpus": 4, "fast_moe": 4}, True, None),
        ({**MOE, "number_gpus": 6, "batch_size": 6, "fast_moe": 3}, False, "rule 7"),
        ({"model_name": "llama3.1-8b", "fms_hf_tuning_version": "2.4.0", "fast_moe": 2}, False, "rule 7"),
        # fast_moe 0 is off: no rule applies
        ({**MOE, "number_gpus": 6, "batch_size": 6, "fast_moe": 0}, True, None),
    ],
)
def test_rules_6_and_7(changes, valid, rule):
    is_valid, reasons = verdict(**changes)
    assert is_valid is valid, reasons
    if rule:
        assert rule in reasons


def test_rule_7_reads_experts_from_config_json(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(
        '{"model_type": "granitemoe", "hidden_size": 64, "num_hidden_layers": 2, '
        '"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 32, '
        '"vocab_size": 100, "num_local_experts": 6, "num_experts_per_tok": 2}'
    )
    base = {**MOE, "model_name": str(cfg), "target_modules": "q_proj,v_proj"}
    assert verdict(**base, number_gpus=6, batch_size=6, fast_moe=3)[0] is True
    assert "rule 7" in verdict(**base, number_gpus=4, fast_moe=4)[1]


def test_fast_moe_needs_fms_hf_tuning_2_4():
    is_valid, reasons = verdict(**{**MOE, "fms_hf_tuning_version": "2.3.1"}, fast_moe=2)
    assert not is_valid and "2.4.0" in reasons


def test_several_rules_report_every_reason():
    is_valid, reasons = verdict(batch_size=-3, number_nodes=0, gpu_model="")
    assert not is_valid
    assert all(f"rule {n}" in reasons for n in (1, 3, 4, 5))


def test_stability_experiment_is_single_node():
    stability = get_experiment("finetune_full_stability-v1.0.0")
    entity = make_entity(stability, {k: v for k, v in BASE.items()})
    assert check(stability, entity).is_valid
    result = check(stability, make_entity(stability, {**BASE, "number_nodes": 2}))
    assert not result.is_valid and "one node" in result.reasons[0]


def test_watsonx_platform_notes_qlora_on_l40s_and_gaudi_3():
    """The watsonx.ai tuning guide: no QLoRA on L40S, no tuning at all on Gaudi 3 (notes, still valid)."""
    qlora = get_experiment("finetune_qlora_benchmark-v1.0.0")
    on = {"number_gpus": 1, "batch_size": 1}
    l40s = check(qlora, make_entity(qlora, {**BASE, **on, "gpu_model": "NVIDIA-L40S"}))
    assert l40s.is_valid and len(l40s.notes) == 1 and "QLoRA" in l40s.notes[0] and "L40S" in l40s.notes[0]
    assert "Planning for foundation model tuning" in l40s.notes[0]
    assert check(qlora, make_entity(qlora, {**BASE, **on})).notes == []  # A100: supported
    assert check(LORA, make_entity(LORA, {**BASE, **on, "gpu_model": "NVIDIA-L40S"})).notes == []  # LoRA on L40S
    gaudi = check(LORA, make_entity(LORA, {**BASE, **on, "gpu_model": "Intel-Gaudi-3"}))
    assert gaudi.is_valid and "Gaudi 3" in gaudi.notes[0] and gaudi.to_dict()["notes"] == gaudi.notes


def test_validate_and_plan_print_the_platform_notes():
    from typer.testing import CliRunner

    from tunebench.commands.main import app

    args = [
        "finetune_qlora_benchmark-v1.0.0",
        "model_name=llama3.1-8b",
        "model_max_length=1024",
        "number_gpus=1",
        "batch_size=1",
        "gpu_model=NVIDIA-L40S",
    ]
    validate = CliRunner().invoke(app, ["validate", *args])
    assert validate.exit_code == 0 and "QLoRA fine tuning is not supported on NVIDIA L40S" in validate.output
    plan = CliRunner().invoke(app, ["plan", *args, "--json"])
    assert plan.exit_code == 0, plan.output
    assert "not supported on NVIDIA L40S" in " ".join(json.loads(plan.stdout)["platform_notes"])


def test_validate_notes_that_a_cpu_run_over_several_nodes_cannot_run():
    """The spec's rules hold for it (rule 2: 0 % 2 == 0), so it stays valid as the spec says; validate's note says
    what plan and the measuring engines answer (spec.validity.cpu_nodes_reason)."""
    from typer.testing import CliRunner

    from tunebench.commands.main import app

    args = ["finetune_full_benchmark-v1.0.0", "model_name=smollm2-135m", "model_max_length=512", "number_gpus=0"]
    several = CliRunner().invoke(app, ["validate", *args, "batch_size=2", "number_nodes=2", "--json"])
    assert several.exit_code == 0, several.output
    out = json.loads(several.stdout)
    assert out["is_valid"] is True and out["reasons"] == []
    assert len(out["notes"]) == 1 and "number_nodes 2 with number_gpus 0" in out["notes"][0]
    one = CliRunner().invoke(app, ["validate", *args, "batch_size=2", "--json"])
    assert "notes" not in json.loads(one.stdout)


def test_one_process_over_several_nodes_is_noted_and_not_planned():
    """distributed_backend None runs one process (DataParallel) for every GPU, and a process runs on one machine:
    the spec's rules allow 4 GPUs over 2 nodes, validate notes it, and plan refuses it (it planned DataParallel
    over the network, while the launch plan started one node; spec.validity.one_process_nodes_reason)."""
    from typer.testing import CliRunner

    from tunebench.commands.main import app

    args = [
        "finetune_full_benchmark-v1.0.0",
        "model_name=llama3.2-1b",
        "model_max_length=512",
        "number_gpus=4",
        "batch_size=4",
        "gpu_model=A100",
        "distributed_backend=None",
    ]
    validate = CliRunner().invoke(app, ["validate", *args, "number_nodes=2", "--json"])
    out = json.loads(validate.stdout)
    assert out["is_valid"] is True and "number_nodes 2 with distributed_backend None" in out["notes"][0]
    plan = json.loads(CliRunner().invoke(app, ["plan", *args, "number_nodes=2", "--json"]).stdout)
    assert plan["verdict"] == "invalid" and plan["planned"] is False
    assert any("distributed_backend None" in r for r in plan["reasons"])
    one = json.loads(CliRunner().invoke(app, ["plan", *args, "--json"]).stdout)
    assert one["verdict"] == "fits"


def test_an_image_text_data_set_for_a_text_model_is_noted_and_not_planned():
    """A model without a vision tower cannot take images (the worker raises): plan planned the chat's text alone
    and called it a fit; it is now invalid there, with validate's note (spec.validity.vision_data_reason)."""
    from typer.testing import CliRunner

    from tunebench.commands.main import app

    args = [
        "finetune_lora_benchmark-v1.0.0",
        "model_max_length=4096",
        "number_gpus=1",
        "batch_size=2",
        "gpu_model=H100",
        "dataset_id=vision-384x384-16384plus-entries-4096",
    ]
    validate = json.loads(CliRunner().invoke(app, ["validate", *args, "model_name=llama3.1-8b", "--json"]).stdout)
    assert validate["is_valid"] is True and "has no vision tower" in validate["notes"][0]
    text = json.loads(CliRunner().invoke(app, ["plan", *args, "model_name=llama3.1-8b", "--json"]).stdout)
    assert text["verdict"] == "invalid" and any("llama3.1-8b has no vision tower" in r for r in text["reasons"])
    vision = json.loads(CliRunner().invoke(app, ["plan", *args, "model_name=granite-vision-3.2-2b", "--json"]).stdout)
    assert vision["verdict"] == "fits" and vision["reasons"] == []


def test_gpu_only_kernels_on_a_cpu_run_are_noted_and_not_planned():
    """GPTQ-LoRA sets fms-acceleration's Triton kernels (spec 004): on number_gpus 0 plan planned 0.04 tokens/s and
    1.3e7 s; it is now invalid there, with validate's note (spec.validity.gpu_kernels_reason)."""
    from typer.testing import CliRunner

    from tunebench.commands.main import app

    args = ["finetune_gptq-lora_benchmark-v1.0.0", "model_name=granite-8b-code-instruct", "model_max_length=512"]
    cpu = [*args, "number_gpus=0", "batch_size=1", "--json"]
    validate = json.loads(CliRunner().invoke(app, ["validate", *cpu]).stdout)
    assert validate["is_valid"] is True
    assert (
        "fast_kernels True,True,True; fused_lora auto_gptq,True; auto_gptq triton_v2 with number_gpus 0"
        in (validate["notes"][0])
    )
    plan = json.loads(CliRunner().invoke(app, ["plan", *cpu]).stdout)
    assert plan["verdict"] == "invalid" and "run on a GPU only" in plan["reasons"][0]
    gpu = json.loads(
        CliRunner().invoke(app, ["plan", *args, "number_gpus=1", "batch_size=1", "gpu_model=A100", "--json"]).stdout
    )
    assert gpu["verdict"] == "fits"
    lora = ["finetune_lora_benchmark-v1.0.0", "model_name=smollm2-135m", "model_max_length=512", "number_gpus=0"]
    assert json.loads(CliRunner().invoke(app, ["plan", *lora, "batch_size=1", "--json"]).stdout)["verdict"] == "fits"


def test_validity_section_of_the_docs_states_the_rules_as_checked():
    """docs/experiments.md "Validity" writes rule 1 with max(1, number_gpus) and rule 2 as the spec does."""

    docs = (REPO / "docs" / "experiments.md").read_text()
    section = docs.split("## Validity", 1)[1].split("###", 1)[0]
    assert "1. `batch_size % max(1, number_gpus) != 0`" in section
    assert "2. `number_gpus % number_nodes != 0`" in section and "max(1, number_gpus) % number_nodes" not in section


def test_mig_slice_gets_the_watsonx_partitioning_note_and_is_planned_by_its_own_memory():
    """watsonx.ai: GPUs used for tuning cannot be partitioned. A note (still valid); the planner sizes the slice."""
    from typer.testing import CliRunner

    from tunebench.commands.main import app

    mig = "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb"
    result = check(LORA, make_entity(LORA, {**BASE, "number_gpus": 1, "batch_size": 1, "gpu_model": mig}))
    assert result.is_valid and len(result.notes) == 1
    assert "cannot be partitioned" in result.notes[0] and mig in result.notes[0]
    assert check(LORA, make_entity(LORA, {**BASE, "number_gpus": 1, "batch_size": 1})).notes == []  # whole A100
    args = [
        "finetune_lora_benchmark-v1.0.0",
        "model_name=llama3.1-8b",
        "model_max_length=1024",
        "number_gpus=1",
        "batch_size=1",
        f"gpu_model={mig}",
    ]
    validate = CliRunner().invoke(app, ["validate", *args])
    assert validate.exit_code == 0 and "cannot be partitioned" in validate.output
    plan = CliRunner().invoke(app, ["plan", *args, "--json"])
    assert plan.exit_code == 0, plan.output
    out = json.loads(plan.stdout)
    assert any("cannot be partitioned" in n for n in out["platform_notes"])
    assert out["capacity_gib"] == 40.0  # the slice's 4/8 of the A100's 80 GiB, not the whole GPU
    whole = CliRunner().invoke(app, ["plan", *args[:-1], "gpu_model=NVIDIA-A100-SXM4-80GB", "--json"])
    whole = json.loads(whole.stdout)
    assert whole["capacity_gib"] == 80.0
    assert whole["train_tokens_per_gpu_per_second"] > out["train_tokens_per_gpu_per_second"]  # 7/7 vs 3/7 of the SMs


@pytest.mark.parametrize(
    "flag, value, on",
    [
        ("fast_kernels", (True, False, False), True),
        ("fast_kernels", (False, False, False), False),
        ("fast_kernels", "True,False", True),
        ("fast_kernels", "False,False,False", False),
        ("fast_kernels", True, True),
        ("fused_lora", ("auto_gptq", True), True),
        ("fused_lora", ("auto_gptq", False), False),  # the base layer names the kernel, the flag switches it
        ("auto_gptq", ("triton_v2",), True),
        ("auto_gptq", None, False),
    ],
)
def test_an_fms_acceleration_setting_is_on_by_its_flags(flag, value, on):
    from tunebench.spec.validity import flag_on

    assert flag_on(flag, value) is on
