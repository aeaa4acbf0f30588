"""Where measurements run: ``local`` (this machine, a free-GPU pool) or ``ray`` (a Ray cluster).

An executor takes ``Task``s (``submit``, never blocking) and hands back ``Finished`` results
(``poll``); the explorer decides what to submit. ``tunebench.executors.ray`` imports Ray lazily.
"""

from tunebench.executors.local import LocalExecutor, detect_gpus
from tunebench.executors.task import ACTUATORS, Finished, Task, make_task, noop, resolve_actuator, run_task

__all__ = [
    "ACTUATORS",
    "Finished",
    "LocalExecutor",
    "Task",
    "detect_gpus",
    "make_task",
    "noop",
    "resolve_actuator",
    "run_task",
]
