"""The launch plan of every experiment on every kind of machine: the CPU, one GPU, several GPUs, several
nodes. Each builds (the plan's mode, node count and processes match the entity), or, for an experiment
restricted to one node, is refused with the validity rule as an input error, never a crash."""

from __future__ import annotations

import pytest

from tunebench.actuators.launch import build_launch_plan
from tunebench.engines import FMS, NATIVE
from tunebench.errors import InputError
from tunebench.spec.experiments import get_experiment, list_experiments, make_entity

A100 = "NVIDIA-A100-80GB-PCIe"
MACHINES = {
    "cpu": {"number_gpus": 0},
    "1gpu": {"number_gpus": 1, "gpu_model": A100},
    "4gpu": {"number_gpus": 4, "gpu_model": A100},
    "2node_8gpu": {"number_gpus": 8, "number_nodes": 2, "gpu_model": A100},
}


def _experiment_ids() -> list[str]:
    return [e if isinstance(e, str) else e.id for e in list_experiments()]


@pytest.mark.parametrize("machine", sorted(MACHINES))
@pytest.mark.parametrize("experiment_id", _experiment_ids())
def test_every_experiment_on_every_machine(experiment_id, machine):
    exp = get_experiment(experiment_id)
    values = {"model_name": "llama3.1-8b", "model_max_length": 1024, "batch_size": 8, **MACHINES[machine]}
    if exp.uses_lora:
        values["target_modules"] = "q_proj,v_proj"
    if "torch_dtype" in exp.restricted:
        values["torch_dtype"] = exp.restricted["torch_dtype"][0]
    entity = make_entity(exp, {k: v for k, v in values.items() if k in exp.optional or k in exp.required})
    nodes = values.get("number_nodes", 1)
    if nodes > 1 and exp.single_node_only:
        with pytest.raises(InputError, match="is not valid"):
            build_launch_plan(exp, entity, data_directory="/data")
        return
    gpus = values["number_gpus"]
    engine = NATIVE
    if exp.method == "gptq-lora":  # fms-acceleration's kernels: only the fms-hf-tuning engine runs them
        with pytest.raises(InputError, match="measure with --engine fms-hf-tuning"):
            build_launch_plan(exp, entity, data_directory="/data")
        engine = FMS
        if gpus == 0:
            with pytest.raises(InputError, match="run on a GPU only"):  # their Triton/CUDA kernels
                build_launch_plan(exp, entity, data_directory="/data", engine=engine)
            return
    plan = build_launch_plan(exp, entity, data_directory="/data", main_process_ip="10.0.0.7", engine=engine)
    assert plan.number_gpus == gpus and len(plan.nodes) == nodes and plan.number_nodes == nodes
    assert plan.mode == ("single" if gpus < 2 else "FSDP")  # FSDP: the spec's default distributed_backend
    assert plan.processes_per_node * plan.number_nodes == max(1, gpus)
    for node in plan.nodes:
        assert node.env.get("CUDA_VISIBLE_DEVICES") == ",".join(str(i) for i in range(gpus // nodes))  # its own
        assert node.env.get("NCCL_IB_DISABLE") == (None if gpus == 0 else "1")  # RoCE off by default
        assert ("accelerate" in node.command) == (gpus >= 2)
