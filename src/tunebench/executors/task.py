"""A measurement task and how an executor runs it: resolve the actuator, call it, never raise.

The actuator is named by the task (``actuator``: a registered name, or with ``allow_import`` a
module:function; see tunebench.actuators.registry). ``options`` is the space file's actuator
options plus what the executor assigns:

- ``visible_devices``: the CUDA_VISIBLE_DEVICES string of the GPUs given to this measurement
  ("" for a CPU measurement); GPU indices in NVML (PCI bus) order;
- ``output_dir``: a fresh directory for this attempt (``<home>/runs/<operation>/<request>-<attempt>``).

A task is plain data (picklable: Ray ships it to a worker); the worker rebuilds the experiment and
entity from their ids and values.
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from tunebench.actuators.registry import needs_hardware, resolve_actuator
from tunebench.spec.experiments import Entity, Experiment, effective_values, get_experiment, make_entity
from tunebench.spec.results import LOG_TAIL_CHARS, Result


@dataclass
class Task:
    """One attempt at measuring (experiment, entity) with an actuator."""

    request_id: int
    attempt: int
    actuator: str
    base_id: str
    parameters: dict[str, Any]
    experiment_id: str
    entity_id: str
    entity_values: dict[str, Any]
    options: dict[str, Any] = field(default_factory=dict)
    number_gpus: int = 0  # what the task asks the executor for (0 for actuators that need no hardware)
    number_nodes: int = 1
    gpu_model: str | None = None
    allow_import: bool = False  # the actuator may be an unregistered module:function (explicit opt-in)

    def rebuild(self) -> tuple[Experiment, Entity]:
        experiment = get_experiment(self.base_id, self.parameters)
        return experiment, make_entity(experiment, self.entity_values)


@dataclass
class Finished:
    """A task's outcome, as an executor hands it back."""

    request_id: int
    result: Result


def make_task(
    request_id: int,
    attempt: int,
    actuator: str,
    experiment: Experiment,
    entity: Entity,
    options: dict[str, Any],
    allow_import: bool = False,
) -> Task:
    values = effective_values(experiment, entity)
    hardware = needs_hardware(actuator, allow_import=allow_import)
    gpus = int(values["number_gpus"]) if hardware else 0
    # a CPU entity asks for one machine whatever its number_nodes: the measuring actuators judge number_nodes > 1
    # without GPUs before running (tunebench.engines.support), which an executor's refusal would hide
    nodes = int(values.get("number_nodes") or 1) if hardware and gpus > 0 else 1
    return Task(
        request_id=request_id,
        attempt=attempt,
        actuator=actuator,
        base_id=experiment.base_id,
        parameters=dict(experiment.parameters),
        experiment_id=experiment.id,
        entity_id=entity.id,
        entity_values=dict(entity.values),
        options=dict(options),
        number_gpus=gpus,
        number_nodes=nodes,
        gpu_model=values.get("gpu_model") if hardware else None,
        allow_import=allow_import,
    )


def run_task(task: Task, execution: dict[str, Any] | None = None) -> Result:
    """Run one task in this process; any exception becomes a failed Result (never raises).

    The result's ids are the store's (whatever the actuator wrote), and ``metadata["execution"]``
    records where and how it ran: executor fields passed in ``execution``, host, pid, attempt,
    start time (epoch s) and duration (s).
    """
    started = time.time()
    try:
        experiment, entity = task.rebuild()
        result = resolve_actuator(task.actuator, allow_import=task.allow_import)(experiment, entity, dict(task.options))
        if not isinstance(result, Result):
            raise TypeError(f"actuator {task.actuator!r} returned {type(result).__name__}, not a Result")
    except Exception as exc:  # the actuator's bug or crash is this measurement's failure, not the explorer's
        result = Result.failed(
            task.experiment_id,
            task.entity_id,
            error=f"{type(exc).__name__}: {exc}",
            log_tail=traceback.format_exc()[-LOG_TAIL_CHARS:],
            actuator=task.actuator,
        )
    result.experiment_id, result.entity_id = task.experiment_id, task.entity_id
    result.metadata = dict(result.metadata)
    result.metadata["execution"] = {
        **(execution or {}),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "attempt": task.attempt,
        "visible_devices": task.options.get("visible_devices"),
        "started_at": started,
        "duration_s": time.time() - started,
    }
    return result
