"""The Ray executor on a local Ray cluster of simulated nodes (ray.cluster_utils.Cluster, no real GPUs).

Three worker nodes, each with one simulated GPU (Ray allows num_gpus without devices) and a GPU
model as custom resource: one "NVIDIA-A100-80GB-PCIe", two "NVIDIA-L40S". Everything listens on
127.0.0.1 (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps Ray on the loopback address, as on a laptop).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
import ray

from tunebench.explore import Settings, explore, parse_space
from tunebench.store import Store

pytestmark = pytest.mark.ray
A100, L40S = "NVIDIA-A100-80GB-PCIe", "NVIDIA-L40S"


@pytest.fixture(scope="module")
def cluster():
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    old = os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"), ray_constants.ENABLE_RAY_CLUSTER
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback only, in the processes Ray starts ...
    ray_constants.ENABLE_RAY_CLUSTER = False  # ... and in this one (read when ray was imported)
    temp = tempfile.mkdtemp(prefix="tbray")  # short: Ray's socket paths must fit 107 bytes
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False, "temp_dir": temp})
    nodes = {
        A100: [c.add_node(num_cpus=4, num_gpus=1, resources={A100: 1})],
        L40S: [c.add_node(num_cpus=4, num_gpus=1, resources={L40S: 1}) for _ in range(2)],
    }
    ray.init(address=c.address, log_to_driver=False)
    try:
        yield {model: {n.node_id for n in group} for model, group in nodes.items()}
    finally:
        ray.shutdown()
        c.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
        ray_constants.ENABLE_RAY_CLUSTER = old[1]
        if old[0] is None:
            os.environ.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        else:
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = old[0]


def space(actuator: str, entity_space: dict, **options) -> dict:
    return {
        "experiments": [{"id": "finetune_full_benchmark-v1.0.0"}],
        "entity_space": {"model_name": "smollm2-135m", "model_max_length": 64, **entity_space},
        "actuator": {"name": f"fake_actuators:{actuator}", **options},
        "operation": {"sampler": "grid"},
    }


def execution(store: Store, request_id: int) -> dict:
    return store.results_of(request_id)[-1].metadata["execution"]


def test_sweep_lands_on_the_nodes_of_each_gpu_model(cluster, tmp_path):
    from tunebench.executors.ray import RayExecutor

    spec = parse_space(
        space("where", {"number_gpus": [0, 1], "batch_size": [2, 4], "gpu_model": [A100, L40S, "NVIDIA-H100-PCIe"]})
    )
    with Store(tmp_path / "s.db") as store:
        summary = explore(
            spec, store, RayExecutor(), Settings(max_parallel=4, max_retries=0, allow_actuator_import=True)
        )
        rows = store.rows(operation_id=summary.operation_id)
        placed = {
            (r["entity"].get("number_gpus"), r["entity"].get("gpu_model")): (r, execution(store, r["request_id"]))
            for r in rows
        }
    assert summary.total == 12 and summary.valid == 10 and summary.failed == 2
    for (gpus, model), (row, ex) in placed.items():
        if gpus == 1 and model in (A100, L40S):
            assert row["status"] == "valid" and ex["node_id"] in cluster[model], (model, ex)
            assert ex["visible_devices"] == "0" and ex["node_ip"] == "127.0.0.1"
        elif gpus == 1:  # no node has an H100: fails at once instead of waiting forever
            assert row["status"] == "failed" and "no node with" in row["error"] and "NVIDIA-H100-PCIe" in row["error"]
        else:  # CPU measurements: anywhere, no GPU
            assert row["status"] == "valid" and ex["visible_devices"] == ""


def test_two_node_measurement_rendezvous_over_gloo(cluster, tmp_path):
    from tunebench.executors.ray import RayExecutor

    spec = parse_space(
        space("GLOO_ALLREDUCE", {"number_gpus": 2, "number_nodes": 2, "batch_size": 2, "gpu_model": L40S})
    )
    with Store(tmp_path / "s.db") as store:
        summary = explore(
            spec, store, RayExecutor(), Settings(max_parallel=1, max_retries=0, allow_actuator_import=True)
        )
        (row,) = store.rows(operation_id=summary.operation_id)
        result = store.results_of(row["request_id"])[-1]
    assert row["status"] == "valid", row["error"]
    assert result.metadata["allreduce_sums"] == [3.0, 3.0]  # ranks 0 and 1 each contributed rank + 1
    ex = result.metadata["execution"]
    assert ex["placement"] == "STRICT_SPREAD" and ex["rendezvous"].startswith("127.0.0.1:")
    assert len(set(ex["node_ids"])) == 2 and set(ex["node_ids"]) == cluster[L40S]  # one bundle per L40S node


@pytest.mark.slow
@pytest.mark.parametrize("actuator", ["measure", "fms-hf-tuning"])
def test_two_node_ddp_training_with_the_measuring_actuator(cluster, tmp_path, actuator):
    """Real training: the 2-node DDP launch plan (accelerate static rendezvous) on two simulated L40S
    nodes, gloo on the CPU (the nodes' 'GPUs' are simulated, so torch sees no CUDA); with tunebench's
    worker, and through fms-hf-tuning 3.2.2 (each node makes the version's environment ready itself)."""
    import json

    from tunebench.executors.ray import RayExecutor

    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "vocab_size": 512,
                "max_position_embeddings": 512,
            }
        )
    )
    spec = parse_space(
        {
            "experiments": [
                {
                    "id": "finetune_full_benchmark-v1.0.0",
                    "parameters": {
                        "max_steps": 3,
                        "dataset_id": "news-chars-256-entries-32",
                        "gradient_accumulation_steps": 1,
                        "fms_hf_tuning_version": "3.2.2",
                    },
                }
            ],
            "entity_space": {
                "model_name": str(config),
                "model_max_length": 192,
                "number_gpus": 2,
                "number_nodes": 2,
                "batch_size": 4,
                "gpu_model": L40S,
                "distributed_backend": "DDP",
                "flash_attn": False,
            },
            "actuator": {"name": actuator, "weights": "random", "timeout_seconds": 300},
            "operation": {"sampler": "grid"},
        }
    )
    with Store(tmp_path / "s.db") as store:
        summary = explore(spec, store, RayExecutor(), Settings(max_parallel=1, max_retries=0, output_root=tmp_path))
        (row,) = store.rows(operation_id=summary.operation_id)
        result = store.results_of(row["request_id"])[-1]
    assert row["status"] == "valid", (row["error"], result.log_tail)
    ex = result.metadata["execution"]
    assert set(ex["node_ids"]) == cluster[L40S] and ex["placement"] == "STRICT_SPREAD"
    p = result.properties
    # 3 steps x batch 4 (2 per process, one process on each node) x 192 tokens (the response marker ends
    # by token 152, every entry is longer than 192), summed over both nodes
    assert p["dataset_tokens_per_second"] == pytest.approx(3 * 4 * 192 / p["train_runtime"], rel=1e-6)
    assert p["dataset_tokens_per_second_per_gpu"] == pytest.approx(p["dataset_tokens_per_second"] / 2, rel=1e-6)
    assert row["actuator"] == actuator
    engine = result.metadata["engine"]
    assert engine["name"] == ("native" if actuator == "measure" else "fms-hf-tuning")
    if actuator == "fms-hf-tuning":
        assert engine["packages"]["fms-hf-tuning"] == "3.2.2" and result.metadata["world_size"] == 2


def test_multi_node_needing_more_nodes_than_exist_fails(cluster, tmp_path):
    from tunebench.executors.ray import RayExecutor

    spec = parse_space(
        space("GLOO_ALLREDUCE", {"number_gpus": 2, "number_nodes": 2, "batch_size": 2, "gpu_model": A100})
    )
    with Store(tmp_path / "s.db") as store:
        summary = explore(spec, store, RayExecutor(), Settings(max_retries=0, allow_actuator_import=True))
        (row,) = store.rows(operation_id=summary.operation_id)
    assert row["status"] == "failed" and "needs 2" in row["error"]
