"""The NCCL environment of GPU launch plans: enable_roce, and the fabric settings given as an option."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tunebench.actuators.launch import build_launch_plan
from tunebench.actuators.measure import plan_nodes
from tunebench.actuators.options import MeasureOptions
from tunebench.errors import InputError
from tunebench.spec.experiments import get_experiment, make_entity

ROCE = {"NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_IB_GID_INDEX": 3, "NCCL_SOCKET_IFNAME": "net1", "NCCL_IB_TC": "106"}
TWO_NODES = {"model_name": "llama3.1-70b", "model_max_length": 8192, "number_gpus": 8, "batch_size": 8,
             "gpu_model": "NVIDIA-H100-80GB-HBM3", "number_nodes": 2, "enable_roce": True}  # fmt: skip
GPUS = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}  # each node's own 4 GPUs


def _plan(entity: dict, **options):
    exp = get_experiment("finetune_full_benchmark-v1.0.0")
    return build_launch_plan(exp, make_entity(exp, entity), data_directory="/data", **options)


def test_roce_settings_reach_every_node():
    plan = _plan(TWO_NODES, nccl_env=ROCE, main_process_ip="10.0.0.7")
    expected = {**GPUS, "NCCL_IB_DISABLE": "0", **{k: str(v) for k, v in ROCE.items()}}
    assert [n.env for n in plan.nodes] == [expected, expected]


def test_without_roce_infiniband_stays_off_and_socket_settings_apply():
    plan = _plan({**TWO_NODES, "enable_roce": False}, nccl_env={"NCCL_SOCKET_IFNAME": "eth0"})
    assert plan.nodes[0].env == {**GPUS, "NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth0"}


def test_single_node_roce_is_not_in_effect_and_cpu_plans_get_no_nccl():
    one = _plan({**TWO_NODES, "number_nodes": 1, "number_gpus": 4, "batch_size": 4}, nccl_env={"NCCL_DEBUG": "INFO"})
    assert one.nodes[0].env == {**GPUS, "NCCL_IB_DISABLE": "1", "NCCL_DEBUG": "INFO"}  # spec: multi-node only
    cpu = _plan(
        {"model_name": "smollm2-135m", "model_max_length": 512, "number_gpus": 0, "batch_size": 2}, nccl_env=ROCE
    )
    assert cpu.nodes[0].env == {"CUDA_VISIBLE_DEVICES": ""}


def test_ray_multi_node_plan_takes_the_option():
    exp = get_experiment("finetune_full_benchmark-v1.0.0")
    plan = plan_nodes(exp, make_entity(exp, TWO_NODES), {"nccl_env": ROCE}, "10.0.0.7", 29511)
    assert all(n.env["NCCL_IB_GID_INDEX"] == "3" and n.env["NCCL_IB_DISABLE"] == "0" for n in plan.nodes)


@pytest.mark.parametrize("bad", [{"NCCL_IB_DISABLE": "1"}, {"LD_PRELOAD": "x.so"}, {"NCCL_IB_TC": [1]}])
def test_bad_nccl_settings_are_refused(bad):
    with pytest.raises(InputError) as err:
        MeasureOptions.from_mapping({"nccl_env": bad})
    assert err.value.field == "actuator.nccl_env"
    assert MeasureOptions.from_mapping({"nccl_env": {"NCCL_IB_GID_INDEX": 3}}).nccl_env == {"NCCL_IB_GID_INDEX": "3"}


def test_cli_launch_plan_takes_nccl_env_and_refuses_bad_input():
    base = [
        sys.executable,
        "-c",
        "import sys; from tunebench.commands.main import main; sys.exit(main())",
        "launch-plan",
        "finetune_full_benchmark-v1.0.0",
        *[f"{k}={v}" for k, v in TWO_NODES.items()],
        "--json",
    ]
    ok = subprocess.run(base + ["--nccl-env", "NCCL_IB_GID_INDEX=3"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert '"NCCL_IB_GID_INDEX": "3"' in ok.stdout
    bad = subprocess.run(base + ["--nccl-env", "NCCL_IB_GID_INDEX"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "error: --nccl-env:" in bad.stderr
    assert "Traceback" not in bad.stderr and not bad.stdout


def test_multi_node_bundle_asks_for_a_roce_node_only_with_enable_roce():
    from tunebench.executors.ray import node_bundle
    from tunebench.executors.task import Task

    def task(roce: bool) -> Task:
        return Task(
            request_id=1,
            attempt=1,
            actuator="measure",
            base_id="finetune_full_benchmark-v1.0.0",
            parameters={},
            experiment_id="e",
            entity_id="x",
            entity_values={**TWO_NODES, "enable_roce": roce},
            number_gpus=8,
            number_nodes=2,
            gpu_model="NVIDIA-H100-80GB-HBM3",
        )

    assert node_bundle(task(True)) == {"CPU": 8, "GPU": 4, "NVIDIA-H100-80GB-HBM3": 4, "RoCE": 1}
    assert "RoCE" not in node_bundle(task(False))
