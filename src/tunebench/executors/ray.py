"""The Ray executor: every measurement a Ray task placed by its GPU count and GPU model.

``pip install 'tunebench[ray]'``. ``address``: ``auto`` (the cluster this machine belongs to),
``ray://host:port`` (Ray client), or None: a local Ray on 127.0.0.1 started on demand (dashboard off), shut
down at the end. tunebench must be importable on the cluster's nodes (installed in their image).

Resources of a measurement of number_gpus GPUs of gpu_model on one node (SFTTrainer spec):
``num_gpus = number_gpus``, ``num_cpus = 2 * max(1, number_gpus)`` and, when number_gpus > 0, the
custom resource ``{gpu_model: number_gpus}``, so that the task lands on a node of that type: start
each node with ``ray start --resources '{"NVIDIA-A100-80GB-PCIe": 8}'`` (labels as ``tunebench gpus``
names them; KubeRay: the group's rayStartParams). A task no live node could ever hold fails at
once with the reason (rather than waiting forever); Ray task errors and node deaths become failed
results (retried by the explorer up to max_retries). Ray never retries a measurement itself.

Multi-node entities (number_nodes > 1) get a placement group of one bundle per node
({CPU: 2 * max(1, g), GPU: g, gpu_model: g, plus RoCE: 1 with enable_roce} with g = number_gpus /
number_nodes), strategy
STRICT_SPREAD (one bundle per distinct node). The rendezvous address is Ray's own view of the node
of bundle 0 (``ray.util.get_node_ip_address()`` in a task placed on that bundle) plus a port that
task found free, so it works wherever Ray runs (bare metal, Slurm, Kubernetes) — the reference
builds a Kubernetes pod DNS name instead (ado-sfttrainer.md §16 pitfall 4). The actuator does
the rest through its ``MultiNode`` steps (tunebench.actuators.registry): ``judge`` and ``plan`` here,
``run`` on the node of each bundle, ``collect`` here; an actuator without them does not run
multi-node entities (a failed result that says so). This module only schedules.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from pathlib import Path
from typing import Any

from tunebench.actuators.launch import LaunchPlan
from tunebench.actuators.process import NodeResult
from tunebench.actuators.registry import MultiNode, resolve_actuator
from tunebench.errors import InputError
from tunebench.executors.task import Finished, Task, run_task
from tunebench.spec.results import LOG_TAIL_CHARS, Result

ROCE_RESOURCE = "RoCE"  # custom resource of nodes on a RoCE fabric (reference bundle, ado-sfttrainer.md §9)
PLACEMENT_TIMEOUT_S = 600.0  # how long a multi-node measurement waits for its nodes


def task_resources(number_gpus: int, gpu_model: str | None) -> dict[str, Any]:
    """Ray task options of a one-node measurement (the SFTTrainer spec: 2 CPUs per GPU, at least 2)."""
    resources = {gpu_model: number_gpus} if number_gpus > 0 and gpu_model else {}
    return {"num_cpus": 2 * max(1, number_gpus), "num_gpus": number_gpus, "resources": resources}


def node_bundle(task: Task) -> dict[str, float]:
    """One placement-group bundle: what each node of a multi-node measurement needs."""
    per_node = task.number_gpus // task.number_nodes
    bundle: dict[str, float] = {"CPU": 2 * max(1, per_node)}
    if per_node:
        bundle["GPU"] = per_node
        if task.gpu_model:
            bundle[task.gpu_model] = per_node
        if task.entity_values.get("enable_roce"):
            bundle[ROCE_RESOURCE] = 1  # ado-sfttrainer.md §9: only nodes with the RDMA devices advertise it
    return bundle


def multinode_steps(actuator: str, allow_import: bool = False) -> MultiNode | None:
    """The actuator's multi-node steps; None if it runs entities on one node only."""
    return resolve_actuator(actuator, allow_import=allow_import).multinode


# ------------------------------------------------------------------------------------- in workers


def _measure_on_worker(task: Task) -> Result:
    """A one-node measurement inside a Ray task: Ray's GPUs become options["visible_devices"]."""
    import ray

    task.options["visible_devices"] = ",".join(str(g) for g in ray.get_gpu_ids())
    context = ray.get_runtime_context()
    return run_task(
        task, {"executor": "ray", "node_id": context.get_node_id(), "node_ip": ray.util.get_node_ip_address()}
    )


def _rendezvous_on_worker() -> tuple[str, int]:
    """This node's IP as Ray knows it, and a TCP port free on it (bound once, then released)."""
    import ray

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return ray.util.get_node_ip_address(), port


def _node_on_worker(task: Task, rank: int, plan: LaunchPlan, output_dir: str, main_process_ip: str) -> NodeResult:
    """One node's part of a multi-node measurement, run by the actuator's run_node on this node."""
    import ray

    experiment, entity = task.rebuild()
    steps = multinode_steps(task.actuator, task.allow_import)
    assert steps is not None  # _run_multinode placed the nodes only for an actuator with multi-node steps
    options = {**task.options, "visible_devices": ",".join(str(g) for g in ray.get_gpu_ids())}  # this bundle's GPUs
    result = steps.run(experiment, entity, options, plan.nodes[rank], output_dir, main_process_ip)
    result.node_ip = ray.util.get_node_ip_address()
    result.node_id = ray.get_runtime_context().get_node_id()
    return result


# ---------------------------------------------------------------------------------------- executor


class RayExecutor:
    """Runs tasks on a Ray cluster; submit() never blocks, poll() hands back finished tasks."""

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        *,
        num_cpus: int | None = None,
        placement_timeout_s: float = PLACEMENT_TIMEOUT_S,
    ):
        try:
            import ray
        except ImportError:
            raise InputError("executor", "ray is not installed: pip install 'tunebench[ray]'") from None
        self.ray = ray
        self.started = False
        if not ray.is_initialized():
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                # a new single-node Ray for this explorer only, listening on the loopback address
                ray.init(
                    address="local",
                    include_dashboard=False,
                    num_cpus=num_cpus,
                    log_to_driver=False,
                    _node_ip_address="127.0.0.1",
                )
                self.started = True
        self.placement_timeout_s = placement_timeout_s
        self._remote = ray.remote(_measure_on_worker)
        self._rendezvous = ray.remote(_rendezvous_on_worker)
        self._node = ray.remote(_node_on_worker)
        self._refs: dict[Any, Task] = {}
        self._coordinated: queue.Queue[Finished] = queue.Queue()  # multi-node results from their threads
        self._coordinating = 0
        self._nodes_cache: tuple[float, list[dict[str, float]]] = (0.0, [])

    @property
    def in_flight(self) -> int:
        return len(self._refs) + self._coordinating

    def submit(self, task: Task) -> None:
        if task.number_nodes > 1:
            self._coordinating += 1
            threading.Thread(
                target=self._coordinate, args=(task,), name=f"multinode-{task.request_id}", daemon=True
            ).start()
            return
        options = task_resources(task.number_gpus, task.gpu_model)
        why = self._infeasible({"CPU": options["num_cpus"], "GPU": options["num_gpus"], **options["resources"]})
        if why:
            self._coordinated.put(Finished(task.request_id, _failed(task, why)))
            self._coordinating += 1
            return
        ref = self._remote.options(
            **options, max_retries=0, retry_exceptions=False, name=f"measure-{task.request_id}"
        ).remote(task)
        self._refs[ref] = task

    def poll(self, timeout: float = 0.0) -> list[Finished]:
        out: list[Finished] = []
        while True:
            try:
                out.append(self._coordinated.get_nowait())
                self._coordinating -= 1
            except queue.Empty:
                break
        if self._refs:
            wait = 0.0 if out else timeout
            ready, _ = self.ray.wait(list(self._refs), num_returns=len(self._refs), timeout=wait)
            for ref in ready:
                task = self._refs.pop(ref)
                try:
                    out.append(Finished(task.request_id, self.ray.get(ref)))
                except self.ray.exceptions.RayError as exc:  # task error, worker or node died, cancelled
                    out.append(
                        Finished(
                            task.request_id, _failed(task, f"ray: {type(exc).__name__}: {_first_line(exc)}", str(exc))
                        )
                    )
        elif not out and self._coordinating and timeout > 0:
            try:
                out.append(self._coordinated.get(timeout=timeout))
                self._coordinating -= 1
            except queue.Empty:
                pass
        return out

    def close(self) -> None:
        for ref in list(self._refs):
            self.ray.cancel(ref, force=True)
        self._refs.clear()
        if self.started:
            self.ray.shutdown()
            self.started = False

    # ------------------------------------------------------------------------------------ helpers

    def _alive_nodes(self) -> list[dict[str, float]]:
        stamp, nodes = self._nodes_cache
        if time.monotonic() - stamp > 10:
            nodes = [n["Resources"] for n in self.ray.nodes() if n.get("Alive")]
            self._nodes_cache = (time.monotonic(), nodes)
        return nodes

    def _infeasible(self, need: dict[str, float], count: int = 1) -> str | None:
        """Why no live node could hold need (count distinct nodes for multi-node); None if some can."""
        need = {k: v for k, v in need.items() if v}
        fits = [n for n in self._alive_nodes() if all(n.get(k, 0) >= v for k, v in need.items())]
        if len(fits) >= count:
            return None
        have = f"{len(fits)} node(s)" if fits else "no node"
        return f"the Ray cluster has {have} with {need} (needs {count}); start nodes with these resources"

    def _coordinate(self, task: Task) -> None:
        try:
            result = self._run_multinode(task)
        except Exception as exc:  # a bug here must still give the explorer a result
            result = _failed(task, f"multi-node coordination: {type(exc).__name__}: {exc}")
        self._coordinated.put(Finished(task.request_id, result))

    def _run_multinode(self, task: Task) -> Result:
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        ray, nodes = self.ray, task.number_nodes
        steps = multinode_steps(task.actuator, task.allow_import)
        if steps is None:
            return _failed(
                task,
                f"actuator {task.actuator!r} runs entities on one node only (it has no multi-node "
                f"steps); number_nodes is {nodes}",
            )
        if steps.judge is not None:  # judged before any node is placed (the measuring actuator's rules)
            reasons = steps.judge(*task.rebuild())
            if reasons:
                return Result.invalid(task.experiment_id, task.entity_id, reasons, actuator=task.actuator)
        if task.number_gpus % nodes:
            return _failed(task, f"number_gpus {task.number_gpus} is not divisible by number_nodes {nodes}")
        bundle = node_bundle(task)
        why = self._infeasible(bundle, count=nodes)
        if why:
            return _failed(task, why)
        started = time.time()
        group = placement_group([dict(bundle)] * nodes, strategy="STRICT_SPREAD", name=f"measure-{task.request_id}")
        try:
            ready, _ = ray.wait([group.ready()], timeout=self.placement_timeout_s)
            if not ready:
                return _failed(
                    task, f"could not place {nodes} nodes of {bundle} within {self.placement_timeout_s:.0f} s"
                )

            def on(i: int) -> PlacementGroupSchedulingStrategy:
                return PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=i)

            ip, port = ray.get(self._rendezvous.options(num_cpus=0, scheduling_strategy=on(0)).remote())
            experiment, entity = task.rebuild()
            plan = steps.plan(experiment, entity, dict(task.options), ip, port)
            out = Path(task.options.get("output_dir") or Path.cwd() / f"measure-{task.request_id}")
            refs = [
                self._node.options(
                    num_cpus=bundle["CPU"],
                    num_gpus=bundle.get("GPU", 0),
                    resources={k: v for k, v in bundle.items() if k not in ("CPU", "GPU")},
                    scheduling_strategy=on(i),
                    max_retries=0,
                ).remote(task, i, plan, str(out / f"node{i}"), ip)
                for i in range(nodes)
            ]
            try:
                node_results = ray.get(refs)
            except ray.exceptions.RayError as exc:
                for ref in refs:
                    ray.cancel(ref, force=True)
                return _failed(
                    task, f"ray: a node of the measurement failed: {type(exc).__name__}: {_first_line(exc)}", str(exc)
                )
            result = steps.collect(experiment, entity, dict(task.options), plan, node_results)
        finally:
            remove_placement_group(group)
        result.experiment_id, result.entity_id = task.experiment_id, task.entity_id
        result.metadata = dict(result.metadata)
        result.metadata["execution"] = {
            "executor": "ray",
            "rendezvous": f"{ip}:{port}",
            "placement": "STRICT_SPREAD",
            "bundle": bundle,
            "node_ids": [n.node_id for n in node_results],
            "node_ips": [n.node_ip for n in node_results],
            "attempt": task.attempt,
            "started_at": started,
            "duration_s": time.time() - started,
        }
        return result


def _failed(task: Task, error: str, log_tail: str | None = None) -> Result:
    return Result.failed(
        task.experiment_id,
        task.entity_id,
        error,
        log_tail=(log_tail or "")[-LOG_TAIL_CHARS:] or None,
        actuator=task.actuator,
        metadata={"execution": {"executor": "ray", "attempt": task.attempt}},
    )


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
