"""One set of outcome rules for single- and multi-node runs (tunebench.actuators.outcome), and the
registry's lazy imports: the command line and the registry pull no torch, transformers or ray."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tunebench.actuators.measure import collect_nodes
from tunebench.actuators.process import NodeResult
from tunebench.actuators.launch import build_launch_plan
from tunebench.spec.experiments import get_experiment, make_entity

EXP = get_experiment("finetune_full_benchmark-v1.0.0")
ENTITY = make_entity(EXP, {"model_name": "smollm2-135m", "model_max_length": 64, "number_gpus": 2, "number_nodes": 2,
                           "batch_size": 2, "gpu_model": "L40S", "distributed_backend": "DDP"})  # fmt: skip


def node(rank: int, returncode: int | None, records: list | None = None, aggregate: dict | None = None) -> NodeResult:
    return NodeResult(rank, returncode, 1.0, f"log of node {rank}", f"/tmp/node{rank}", records=records or [],
                      aggregate=aggregate)  # fmt: skip


def ok(rank: int) -> dict:
    return {"rank": rank, "world_size": 2, "status": "ok", "steps": {"total": 3}}


def collect(*nodes: NodeResult):
    plan = build_launch_plan(EXP, ENTITY, main_process_ip="10.0.0.7")
    return collect_nodes(EXP, ENTITY, {"timeout_seconds": 30}, plan, list(nodes))


def test_a_node_that_timed_out_fails_the_multi_node_run_as_a_timeout():
    result = collect(node(0, 0, [ok(0)]), node(1, None))
    assert result.status == "failed" and result.error == "timeout: the run exceeded 30 s and was killed"
    assert "log of node 1" in result.log_tail


def test_a_node_killed_by_a_signal_names_the_signal():
    result = collect(node(0, -9), node(1, -9))
    assert result.status == "failed" and result.error == "worker killed by signal SIGKILL"


def test_valid_ranks_give_rank_zeros_properties_and_any_oom_is_invalid():
    props = {"train_runtime": 2.0, "dataset_tokens_per_second": 64.0}
    result = collect(node(0, 0, [ok(0)], {"properties": props}), node(1, 0, [ok(1)]))
    assert result.status == "valid" and result.properties == {**props, "is_valid": 1}
    assert [n["rank"] for n in result.metadata["nodes"]] == [0, 1]
    oom = {**ok(1), "status": "oom", "reason": "GPU out of memory: x"}
    result = collect(node(0, 0, [ok(0)]), node(1, 3, [oom]))
    assert result.status == "invalid" and result.reasons == ["rank 1: GPU out of memory: x"]


def test_the_cli_and_the_registry_import_no_torch_transformers_or_ray():
    code = (
        "import sys, tunebench, tunebench.cli, tunebench.executors\n"
        "from tunebench.actuators import resolve_actuator\n"
        "assert resolve_actuator('measure').__module__ == 'tunebench.actuators.measure'\n"
        "print(sorted(m for m in ('torch', 'transformers', 'ray') if m in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent.parent / "src"),
                                                         os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
