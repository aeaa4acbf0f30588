"""Every run sees exactly the GPUs it owns (CUDA_VISIBLE_DEVICES), from `run`, `explore` and Ray alike.

A process that sees more GPUs than it owns uses them: with one process, transformers' Trainer wraps the model in
DataParallel over every visible GPU (multiplying the batch) while the sampler watches one. These tests capture
the environment the worker subprocess would be launched with (the launch itself is replaced), so no GPU is needed.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
from actuators.test_measure import PARAMS

import tunebench.actuators.measure as measure_module
import tunebench.actuators.process as process_module
from tunebench.actuators.launch import build_launch_plan
from tunebench.actuators.measure import measure
from tunebench.actuators.options import MeasureOptions
from tunebench.actuators.process import node_command, owned_devices
from tunebench.executors.local import Gpu, LocalExecutor
from tunebench.executors.task import make_task
from tunebench.spec.experiments import get_experiment, make_entity

FULL = get_experiment("finetune_full_benchmark-v1.0.0", PARAMS)
A100 = "NVIDIA-A100-SXM4-80GB"


def entity(gpus: int, **extra):
    values = {"model_name": "smollm2-135m", "model_max_length": 192, "number_gpus": gpus, "batch_size": 4}
    if gpus:
        values |= {"gpu_model": A100, "flash_attn": False}  # flash-attn is not installed here
    return make_entity(FULL, {**values, **extra})


@pytest.fixture
def launched(monkeypatch):
    """The environments the measuring actuator would start the worker with (no process starts), on a host whose
    NVML lists 8 A100s."""
    envs: list[dict[str, str]] = []
    monkeypatch.setattr(measure_module, "detect_gpus", lambda: [Gpu(str(i), "NVIDIA A100-SXM4-80GB") for i in range(8)])

    def capture(command, env, log_path, timeout, watch=None, on_step=None):
        envs.append(env)
        log_path.write_text("not run\n")
        return 1, False

    monkeypatch.setattr(measure_module, "run_logged", capture)
    monkeypatch.setattr(process_module, "run_logged", capture)
    return envs


def test_launch_plans_name_the_gpus_each_node_owns():
    cases = {0: "", 1: "0", 4: "0,1,2,3"}
    for gpus, devices in cases.items():
        (node,) = build_launch_plan(FULL, entity(gpus, batch_size=4)).nodes
        assert node.env["CUDA_VISIBLE_DEVICES"] == devices
    dp = build_launch_plan(FULL, entity(2, distributed_backend=None)).nodes[0]  # one process over 2 GPUs (DP)
    assert dp.command[:3] == ["python", "-m", "tunebench.worker"] and dp.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    two_nodes = build_launch_plan(FULL, entity(8, number_nodes=2, batch_size=8)).nodes
    assert [n.env["CUDA_VISIBLE_DEVICES"] for n in two_nodes] == ["0,1,2,3"] * 2


def test_owned_devices_assigned_inherited_or_the_first_ones():
    assert owned_devices("0", None, None) == "0"  # no executor, no restriction: the first GPU
    assert owned_devices("0,1", None, "3,5,6") == "3,5"  # this process may use 3, 5, 6: their first two
    assert owned_devices("0", "6", "3,5,6") == "6"  # the executor's assignment wins
    assert owned_devices("", "1", None) == "" and owned_devices("", None, "2") == ""  # the CPU hides every GPU


def test_run_without_an_executor_sees_only_the_first_gpu(tmp_path, launched, monkeypatch):
    """`tunebench run` of number_gpus=1 on a host with several GPUs: was every GPU (nothing set)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    result = measure(FULL, entity(1), {"weights": "random", "output_dir": str(tmp_path / "run")})
    assert result.status == "failed"  # the capture launched nothing
    (env,) = launched
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_run_of_gpus_this_machine_lacks_fails_before_anything_starts(tmp_path, launched, monkeypatch):
    """Without the GPUs the entity names (none, too few, another model) `tunebench run` trained on the CPU or the
    wrong GPU and recorded that as the entity's measurement: now a failed Result saying why, nothing launched."""
    options = {"weights": "random", "output_dir": str(tmp_path / "run")}
    monkeypatch.setattr(measure_module, "detect_gpus", lambda: [])
    none = measure(FULL, entity(1), options)
    assert none.status == "failed" and none.error.startswith("needs 1 GPU(s); this machine has no GPU")
    assert "number_gpus=0 for a CPU run" in none.error
    monkeypatch.setattr(measure_module, "detect_gpus", lambda: [Gpu("0", "NVIDIA H100 80GB HBM3")])
    assert "this machine has 1 GPU(s)" in measure(FULL, entity(2), options).error
    other = measure(FULL, entity(1), options)
    assert other.status == "failed" and other.error.startswith(f"needs gpu_model {A100}; the 1 GPU(s) a run takes here")
    # a machine of two models: the GPUs a run takes (the first ones CUDA sees) decide, not any GPU of the machine
    mixed = [Gpu("0", "NVIDIA H100 80GB HBM3"), Gpu("1", "NVIDIA A100-SXM4-80GB")]
    monkeypatch.setattr(measure_module, "detect_gpus", lambda: mixed)
    assert "are NVIDIA H100 80GB HBM3 (CUDA_VISIBLE_DEVICES chooses others)" in measure(FULL, entity(1), options).error
    assert launched == []
    assert measure(FULL, entity(0), options).status == "failed" and len(launched) == 1  # a CPU run needs none


def test_run_of_a_cpu_entity_hides_the_gpus(tmp_path, launched, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    measure(FULL, entity(0), {"weights": "random", "output_dir": str(tmp_path / "run")})
    assert launched[0]["CUDA_VISIBLE_DEVICES"] == ""


def test_run_takes_its_gpus_from_those_this_process_may_use(tmp_path, launched, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6")
    measure(FULL, entity(2, distributed_backend=None), {"weights": "random", "output_dir": str(tmp_path / "run")})
    assert launched[0]["CUDA_VISIBLE_DEVICES"] == "3,5"


def test_explore_local_executor_gives_each_run_its_assigned_gpus(tmp_path, launched):
    executor = LocalExecutor(max_parallel=1, gpus=[Gpu(i, "NVIDIA A100-SXM4-80GB") for i in ("2", "5")])
    for i, gpus in enumerate((1, 2, 0)):
        options = {"weights": "random", "output_dir": str(tmp_path / f"run{i}")}
        executor.submit(make_task(i, 1, "measure", FULL, entity(gpus, batch_size=4), options))
    done = {}
    while len(done) < 3:
        done.update({f.request_id: f.result for f in executor.poll(1.0)})
    assert [sorted(env["CUDA_VISIBLE_DEVICES"].split(",")) for env in launched] == [["2"], ["2", "5"], [""]]


def fake_ray(monkeypatch, gpu_ids):
    ray = SimpleNamespace(
        get_gpu_ids=lambda: list(gpu_ids),
        get_runtime_context=lambda: SimpleNamespace(get_node_id=lambda: "node-1"),
        util=SimpleNamespace(get_node_ip_address=lambda: "127.0.0.1"),
    )
    monkeypatch.setitem(sys.modules, "ray", ray)


def test_ray_task_sees_the_gpus_ray_gave_it(tmp_path, launched, monkeypatch):
    from tunebench.executors.ray import _measure_on_worker

    fake_ray(monkeypatch, [3])
    task = make_task(0, 1, "measure", FULL, entity(1), {"weights": "random", "output_dir": str(tmp_path / "run")})
    _measure_on_worker(task)
    assert launched[0]["CUDA_VISIBLE_DEVICES"] == "3"


def test_ray_multi_node_nodes_see_their_bundles_gpus(tmp_path, launched, monkeypatch):
    from tunebench.executors.ray import _node_on_worker

    fake_ray(monkeypatch, [1, 4])
    two_nodes = entity(4, number_nodes=2)
    task = make_task(0, 1, "measure", FULL, two_nodes, {"weights": "random"})
    plan = measure_module.plan_nodes(FULL, two_nodes, {"weights": "random"}, "127.0.0.1", 29400)
    _node_on_worker(task, 1, plan, str(tmp_path / "node1"), "127.0.0.1")
    assert launched[0]["CUDA_VISIBLE_DEVICES"] == "1,4"


def test_a_plan_silent_on_gpus_gets_the_executors_or_keeps_the_inherited_ones(tmp_path, monkeypatch):
    """Another actuator's node plan without CUDA_VISIBLE_DEVICES: the executor's GPUs, else what it inherits."""
    from tunebench.actuators.launch import NodePlan

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    silent = NodePlan(0, ["python", "-c", "pass"], {})
    assert node_command(silent, tmp_path, MeasureOptions(visible_devices="7"))[1]["CUDA_VISIBLE_DEVICES"] == "7"
    assert node_command(silent, tmp_path, MeasureOptions())[1]["CUDA_VISIBLE_DEVICES"] == "4,5"
    assert owned_devices(None, None, None) is None
