"""The local executor: at most max_parallel measurements at once on this machine, GPUs never shared.

Each measurement runs in a supervising thread that calls the actuator; the measuring actuator
starts the training in its own subprocess, so a crash of the training never takes the explorer
down. GPUs come from a free pool (NVML, restricted to $CUDA_VISIBLE_DEVICES when set): a task that
needs n GPUs waits until n are free and gets them as ``options["visible_devices"]``; none on a CPU
machine, where CPU measurements (number_gpus = 0) run max_parallel at a time. On a machine with GPUs of
several models a task gets GPUs of its gpu_model only. A task this machine can never run (more GPUs of its
model than it has, several nodes) fails at once with the reason.
"""

from __future__ import annotations

import queue
import threading

from tunebench.actuators.machine import Gpu, cannot_run_here, detect_gpus, same_gpu_model
from tunebench.executors.task import Finished, Task, run_task
from tunebench.spec.results import Result


class LocalExecutor:
    """Runs tasks on this machine; submit() never blocks, poll() hands back finished tasks."""

    name = "local"

    def __init__(self, max_parallel: int = 1, gpus: list[Gpu] | None = None):
        self.max_parallel = max(1, int(max_parallel))
        self.gpus = detect_gpus() if gpus is None else list(gpus)
        self._free = [g.index for g in self.gpus]
        self._names = {g.index: g.name for g in self.gpus}
        self._waiting: list[Task] = []
        self._running: dict[int, list[str]] = {}  # request id -> GPUs it holds
        self._done: queue.Queue[Finished] = queue.Queue()

    @property
    def in_flight(self) -> int:
        return len(self._waiting) + len(self._running)

    def submit(self, task: Task) -> None:
        why = self._cannot_run(task)
        if why:
            self._done.put(
                Finished(
                    task.request_id, Result.failed(task.experiment_id, task.entity_id, why, actuator=task.actuator)
                )
            )
            return
        self._waiting.append(task)
        self._start_ready()

    def poll(self, timeout: float = 0.0) -> list[Finished]:
        """Finished tasks (waits up to timeout seconds for the first one)."""
        out: list[Finished] = []
        try:
            out.append(self._done.get(timeout=timeout) if timeout > 0 else self._done.get_nowait())
            while True:
                out.append(self._done.get_nowait())
        except queue.Empty:
            pass
        for finished in out:
            self._free += self._running.pop(finished.request_id, [])
        self._start_ready()
        return out

    def close(self) -> None:
        """Forget tasks not started yet (their claims are released by the explorer)."""
        self._waiting.clear()

    def _cannot_run(self, task: Task) -> str | None:
        if task.number_nodes > 1:
            return f"number_nodes is {task.number_nodes}: multi-node measurements need --executor ray"
        why = cannot_run_here(task.number_gpus, None, self.gpus)  # too few GPUs of any model
        mine = self._of_model(task, list(self._names))  # the pool hands out these (_start_ready)
        if why is None and task.number_gpus > len(mine):
            models = ", ".join(sorted(set(self._names.values())))
            why = f"needs {task.number_gpus} GPU(s) of gpu_model {task.gpu_model}; this machine has {len(mine)} ({models})"
        return None if why is None else f"{why} (local executor)"

    def _of_model(self, task: Task, indices: list[str]) -> list[str]:
        """The GPUs among indices a task of gpu_model may take (any GPU when it names none)."""
        return [i for i in indices if not task.gpu_model or same_gpu_model(task.gpu_model, self._names[i])]

    def _start_ready(self) -> None:
        for task in list(self._waiting):
            if len(self._running) >= self.max_parallel:
                return
            fitting = self._of_model(task, self._free) if task.number_gpus else []
            if task.number_gpus > len(fitting):
                continue  # first fit: a smaller task behind it may start
            self._waiting.remove(task)
            devices = fitting[: task.number_gpus]
            self._free = [i for i in self._free if i not in devices]
            self._running[task.request_id] = devices
            task.options["visible_devices"] = ",".join(devices)
            thread = threading.Thread(target=self._run, args=(task,), name=f"measure-{task.request_id}", daemon=True)
            thread.start()

    def _run(self, task: Task) -> None:
        result = run_task(task, {"executor": self.name})
        self._done.put(Finished(task.request_id, result))
