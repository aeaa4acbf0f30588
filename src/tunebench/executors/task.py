"""A measurement task and how an executor runs it: resolve the actuator, call it, never raise.

Actuators are plain functions ``fn(experiment, entity, options) -> Result`` named in the space
file's ``actuator.name``: a registered name, i.e. tunebench's own (``ACTUATORS``) or a plugin's
(a Python entry point of group ``tunebench.actuators`` whose value is ``module:function``), so
plugins need no change here. A space file cannot name an arbitrary ``module:function`` (it would
import and call anything, ``os:system`` included): that takes an explicit opt-in by whoever runs
it (``explore --allow-actuator-import``, ``Settings.allow_actuator_import``), carried by each task.
Actuators are imported lazily, so a module that is missing fails only when its actuator is used.

``options`` is the space file's actuator options plus what the executor assigns:

- ``visible_devices``: the CUDA_VISIBLE_DEVICES string of the GPUs given to this measurement
  ("" for a CPU measurement); GPU indices in NVML (PCI bus) order;
- ``output_dir``: a fresh directory for this attempt (``<home>/runs/<operation>/<request>-<attempt>``).

A task is plain data (picklable: Ray ships it to a worker); the worker rebuilds the experiment and
entity from their ids and values.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
import re
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tunebench.errors import InputError, suggest
from tunebench.spec.experiments import Entity, Experiment, effective_values, get_experiment, make_entity
from tunebench.spec.results import LOG_TAIL_CHARS, Result

ENTRY_POINTS = "tunebench.actuators"  # plugins register actuators as entry points of this group
_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")

# tunebench's own actuator names -> "module:function" (imported on first use).
ACTUATORS = {
    "measure": "tunebench.measure:measure",  # trains for real (issue 4)
    "predict": "tunebench.plan:predict_actuator",  # the planner's predictions (issue 6)
    "noop": "tunebench.executors.task:noop",  # returns at once: store and scheduling overhead
}
# Actuators that never touch the entity's hardware: their tasks ask executors for no GPUs and no nodes
# (the planner predicts a 64-GPU entity on a laptop). Any other actuator, module:function ones
# included, gets the entity's number_gpus / number_nodes / gpu_model.
HARDWARE_FREE = frozenset({"predict", "noop"})


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
    number_gpus: int = 0  # what the task asks the executor for (0 for HARDWARE_FREE actuators)
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
    hardware = actuator not in HARDWARE_FREE
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
        number_gpus=int(values["number_gpus"]) if hardware else 0,
        number_nodes=int(values.get("number_nodes") or 1) if hardware else 1,
        gpu_model=values.get("gpu_model") if hardware else None,
        allow_import=allow_import,
    )


def registered_actuators() -> dict[str, str]:
    """Actuator name -> module:function: tunebench's own, then those plugins register as entry points."""
    return {**_plugins(), **ACTUATORS}


@functools.cache
def _plugins() -> dict[str, str]:
    """The entry points of group tunebench.actuators (read once per process: scanning costs ~10 ms)."""
    return {entry.name: entry.value for entry in importlib.metadata.entry_points(group=ENTRY_POINTS)}


def resolve_actuator(name: str, *, allow_import: bool = False) -> Callable[..., Any]:
    """The function behind a registered actuator name, or (allow_import only) a module:function path;
    InputError (field actuator.name) if there is none or it is not allowed."""
    registry = registered_actuators()
    path = registry.get(name)
    if path is None:
        allowed = ", ".join(registry)
        if not _PATH.match(name):
            raise InputError("actuator.name", f"unknown actuator {name!r}." + suggest(name, registry), allowed=allowed)
        if not allow_import:
            raise InputError(
                "actuator.name",
                f"{name!r} is not a registered actuator; importing an arbitrary module:function runs any code "
                "and needs --allow-actuator-import",
                allowed=allowed + " (plugins: entry points of group tunebench.actuators)",
            )
        path = name
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise InputError(
            "actuator.name", f"actuator {name!r} needs module {module_name!r}, which cannot be imported: {exc}"
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise InputError("actuator.name", f"module {module_name!r} has no function {attr!r}")
    return fn


def check_options(name: str, options: dict[str, Any], *, allow_import: bool = False) -> None:
    """Let the actuator reject unknown or bad options before anything runs (InputError).

    An actuator may carry a ``check_options(options)`` attribute; the measuring actuator's options
    are checked by ``tunebench.measure.MeasureOptions.from_mapping``.
    """
    fn = resolve_actuator(name, allow_import=allow_import)
    full = {**options, "visible_devices": "", "output_dir": "."}  # what the executor adds
    check = getattr(fn, "check_options", None)
    if check is None and name == "measure":
        check = importlib.import_module(fn.__module__).MeasureOptions.from_mapping
    if check is not None:
        check(full)


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


def noop(experiment: Experiment, entity: Entity, options: dict[str, Any]) -> Result:
    """An actuator that measures nothing and returns at once (valid, no properties)."""
    return Result.valid(experiment.id, entity.id, {}, actuator="noop")
