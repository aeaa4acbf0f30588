"""Where measurements run: ``local`` (this machine, a free-GPU pool) or ``ray`` (a Ray cluster).

An executor takes ``Task``s (``submit``, never blocking) and hands back ``Finished`` results
(``poll``); the explorer decides what to submit, the actuators (tunebench.actuators) measure.
``tunebench.executors.ray`` imports Ray lazily.
"""

from tunebench.executors.local import LocalExecutor, detect_gpus
from tunebench.executors.task import Finished, Task, make_task, run_task

__all__ = ["Finished", "LocalExecutor", "Task", "detect_gpus", "make_task", "run_task"]
