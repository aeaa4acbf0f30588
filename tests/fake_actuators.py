"""Cheap, real actuators for tests (name them as ``fake_actuators:<fn>`` with the import opt-in).

tests/ is on the import path of the tests, of the subprocesses they start and of the Ray workers
(tests/conftest.py puts it on $PYTHONPATH).

They honour the actuator contract ``fn(experiment, entity, options) -> Result`` and leave traces in
files named by their options, so tests running explorers in other processes can check who measured
what:

- ``options["call_log"]``: a file to which each call appends one JSON line {pid, entity, experiment,
  visible_devices, event} at start and end (O_APPEND writes of < 4 kB lines are atomic on Linux);
- ``options["sleep_s"]``: seconds each measurement takes (default 0);
- ``options["state_dir"]``: where ``flaky`` counts its calls per entity.

Properties are deterministic functions of the entity, so tests know the best point in advance:
``dataset_tokens_per_second = 1000 - (model_max_length/64 - peak_len/64)^2 * 10 - (batch_size - peak_batch)^2 * 10``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tunebench.actuators.registry import Actuator, MultiNode
from tunebench.spec.experiments import Entity, Experiment
from tunebench.spec.results import Result


def _log(options: dict[str, Any], entity: Entity, experiment: Experiment, event: str) -> None:
    path = options.get("call_log")
    if not path:
        return
    line = (
        json.dumps(
            {
                "pid": os.getpid(),
                "entity": entity.id,
                "experiment": experiment.id,
                "event": event,
                "visible_devices": options.get("visible_devices"),
                "t": time.time(),
            }
        )
        + "\n"
    )
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def throughput(entity: Entity, options: dict[str, Any]) -> float:
    """The made-up property: peaks at (peak_len, peak_batch)."""
    length, batch = entity.values["model_max_length"], entity.values["batch_size"]
    peak_len, peak_batch = options.get("peak_len", 256), options.get("peak_batch", 4)
    return 1000.0 - 10.0 * (length / 64 - peak_len / 64) ** 2 - 10.0 * (batch - peak_batch) ** 2


def sleepy(experiment: Experiment, entity: Entity, options: dict[str, Any]) -> Result:
    """Sleeps options["sleep_s"] (first waiting, up to 10 minutes, until the file options["hold_until"] exists,
    when given: a test releases it), then returns a valid result with the made-up throughput."""
    _log(options, entity, experiment, "start")
    hold, give_up = options.get("hold_until"), time.monotonic() + 600
    while hold and not Path(hold).exists() and time.monotonic() < give_up:
        time.sleep(0.05)
    time.sleep(float(options.get("sleep_s", 0.0)))
    props = {
        "dataset_tokens_per_second": throughput(entity, options),
        "train_runtime": float(options.get("sleep_s", 0.0)),
    }
    _log(options, entity, experiment, "end")
    return Result.valid(experiment.id, entity.id, props, actuator="testing", metadata={"pid": os.getpid()})


def flaky(experiment: Experiment, entity: Entity, options: dict[str, Any]) -> Result:
    """Fails the first options["fail_times"] calls for each entity (counted in state_dir), then succeeds."""
    state = Path(options["state_dir"]) / (entity.id + ".calls")
    state.parent.mkdir(parents=True, exist_ok=True)
    calls = int(state.read_text()) + 1 if state.exists() else 1
    state.write_text(str(calls))
    _log(options, entity, experiment, f"call{calls}")
    if calls <= int(options.get("fail_times", 1)):
        return Result.failed(
            experiment.id, entity.id, error=f"flaky failure {calls}", log_tail="simulated crash\n", actuator="testing"
        )
    return sleepy(experiment, entity, options)


def crashing(experiment: Experiment, entity: Entity, options: dict[str, Any]) -> Result:
    """Raises: the executor must turn this into a failed result."""
    _log(options, entity, experiment, "crash")
    raise RuntimeError("actuator crashed")


def oom_above(experiment: Experiment, entity: Entity, options: dict[str, Any]) -> Result:
    """Invalid (as if out of memory) when batch_size > options["max_batch"], else like sleepy, with made-up
    time series (made_up_series)."""
    if entity.values["batch_size"] > int(options.get("max_batch", 4)):
        _log(options, entity, experiment, "oom")
        return Result.invalid(experiment.id, entity.id, ["simulated out of memory"], actuator="testing")
    return dataclasses.replace(sleepy(experiment, entity, options), series=made_up_series(entity))


def made_up_series(entity: Entity, steps: int = 5) -> dict[str, Any]:
    """Time series in tunebench.worker.series's form, a deterministic function of the entity: a CPU run of
    `steps` steps sampled every 0.5 s (CPU %, resident GiB growing with the batch) and its loss falling."""
    times = [0.5 * i for i in range(2 * steps + 1)]
    batch = entity.values["batch_size"]
    return {
        "format": "tunebench.series/1",
        "warmup_steps": 0,
        "warmup_end_s": None,
        "gpus": [],
        "series": {
            "process.cpu_percent": {"time_s": times[1:], "value": [90.0 + i % 3 for i in range(len(times) - 1)]},
            "process.rss_gib": {"time_s": times, "value": [0.5 + 0.1 * batch * min(i, 2) for i in range(len(times))]},
            "train.loss": {
                "step": list(range(1, steps + 1)),
                "time_s": [float(s) for s in range(1, steps + 1)],
                "value": [4.0 / s for s in range(1, steps + 1)],
            },
        },
    }


def in_subprocess(experiment: Experiment, entity: Entity, options: dict[str, Any]) -> Result:
    """Runs a real `python -c` child that computes the property and reports its CUDA_VISIBLE_DEVICES."""
    _log(options, entity, experiment, "start")
    code = (
        "import json, os, sys; "
        f"print(json.dumps({{'value': {entity.values['model_max_length']} * {entity.values['batch_size']}, "
        "'cvd': os.environ.get('CUDA_VISIBLE_DEVICES')}))"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": options.get("visible_devices", "")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    if proc.returncode != 0:
        return Result.failed(
            experiment.id, entity.id, f"exit code {proc.returncode}", log_tail=proc.stderr[-2000:], actuator="testing"
        )
    out = json.loads(proc.stdout)
    _log(options, entity, experiment, "end")
    return Result.valid(
        experiment.id,
        entity.id,
        {"dataset_tokens_per_second": float(out["value"])},
        actuator="testing",
        metadata={"child_cuda_visible_devices": out["cvd"]},
    )


def where(experiment: Experiment, entity: Entity, options: dict[str, Any]) -> Result:
    """Valid at once; records where it ran (the executor adds node_id/host in metadata["execution"])."""
    _log(options, entity, experiment, "where")
    return Result.valid(
        experiment.id,
        entity.id,
        {"dataset_tokens_per_second": throughput(entity, options)},
        actuator="testing",
        metadata={"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")},
    )


# ------------------------------------------------------------------ multi-node: gloo all_reduce per node

# Each node runs this script: torch.distributed over gloo, rendezvous at MASTER_ADDR:MASTER_PORT (the
# address the Ray executor got from the node of bundle 0), all_reduce of rank + 1, result file per rank.
GLOO_SCRIPT = """
import json, os, socket, sys, time
import torch
import torch.distributed as dist
if os.environ["MASTER_ADDR"].startswith("127."):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
t0 = time.time()
dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                        timeout=__import__("datetime").timedelta(seconds=60))
x = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(x)
out = {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "sum": float(x.item()),
       "host": socket.gethostname(), "seconds": time.time() - t0}
dist.destroy_process_group()
with open(os.path.join(sys.argv[1], f"result.rank{out['rank']}.json"), "w") as f:
    json.dump(out, f)
print(json.dumps(out))
"""


def gloo_allreduce(experiment: Experiment, entity: Entity, options: dict[str, Any]) -> Result:
    """Single-node runs of the gloo actuator: nothing distributed to do."""
    return Result.valid(experiment.id, entity.id, {}, actuator="testing")


def _gloo_plan(experiment: Experiment, entity: Entity, options: dict[str, Any], ip: str, port: int):
    from tunebench.actuators.launch import OUTPUT_DIR, LaunchPlan, NodePlan

    nodes = int(entity.values.get("number_nodes", 1))
    plan = LaunchPlan(
        experiment.id,
        entity.id,
        mode="DDP",
        number_gpus=nodes,
        number_nodes=nodes,
        processes_per_node=1,
        per_device_train_batch_size=1,
        worker_args=[],
    )
    for rank in range(nodes):
        env = {
            "MASTER_ADDR": "{main_process_ip}",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(nodes),
            "CUDA_VISIBLE_DEVICES": "",
        }
        plan.nodes.append(NodePlan(machine_rank=rank, command=["python", "-c", GLOO_SCRIPT, OUTPUT_DIR], env=env))
    return plan


def _gloo_collect(experiment: Experiment, entity: Entity, options: dict[str, Any], plan: Any, nodes: list) -> Result:
    sums, expected = [], sum(range(1, plan.number_nodes + 1))
    for node in nodes:
        path = Path(node.output_dir) / f"result.rank{node.machine_rank}.json"
        if node.returncode != 0 or not path.exists():
            return Result.failed(
                experiment.id,
                entity.id,
                f"node {node.machine_rank} exited {node.returncode}",
                log_tail=node.log_tail,
                actuator="testing",
            )
        sums.append(json.loads(path.read_text())["sum"])
    if any(s != expected for s in sums):
        return Result.failed(experiment.id, entity.id, f"all_reduce sums {sums} != {expected}", actuator="testing")
    return Result.valid(
        experiment.id,
        entity.id,
        {"train_runtime": max(n.duration_s for n in nodes)},
        actuator="testing",
        metadata={"allreduce_sums": sums, "node_ips": [n.node_ip for n in nodes]},
    )


def _measure_run_node(*args: Any, **kwargs: Any):
    from tunebench.actuators.measure import run_node

    return run_node(*args, **kwargs)


# A multi-node actuator of its own: plan and collect here, each node's command run by the measuring
# actuator's run_node (a process with the plan's environment).
GLOO_ALLREDUCE = Actuator(
    "gloo_allreduce", gloo_allreduce, multinode=MultiNode(plan=_gloo_plan, run=_measure_run_node, collect=_gloo_collect)
)


def logs_and_blocks(experiment: Experiment, entity: Entity, options: dict[str, Any]) -> Result:
    """Writes a worker.log in its output directory and, while it "measures", puts a regular file where each
    directory of options["block_paths"] is (a tracker that writes there fails after its check passed);
    then valid like sleepy, with the output directory in its metadata (what the measure actuator records)."""
    out = Path(options["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "worker.log").write_text(f"training {entity.id}\n")
    for path in options.get("block_paths") or ():
        target = Path(path)
        if target.is_dir():
            import shutil

            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("not a directory")
    props = {"dataset_tokens_per_second": throughput(entity, options), "train_runtime": 1.0}
    return Result.valid(experiment.id, entity.id, props, actuator="testing", metadata={"output_dir": str(out)})
