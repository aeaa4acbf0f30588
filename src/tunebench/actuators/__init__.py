"""Actuators: what turns (experiment, entity, options) into a Result.

- ``measure`` (tunebench.actuators.measure): trains for real; its launch plans in
  tunebench.actuators.launch, its subprocesses in tunebench.actuators.process, the rank results ->
  Result step (single- and multi-node alike) in tunebench.actuators.outcome;
- ``predict`` (tunebench.actuators.predict): the planner's predictions (tunebench.plan);
- ``noop``: returns at once (store and scheduling overhead).

Executors call them by name through the registry (tunebench.actuators.registry); this package's
``__init__`` imports neither torch, transformers, ray nor numpy.
"""

from tunebench.actuators.registry import (
    ENTRY_POINTS,
    HARDWARE_FREE,
    Actuator,
    MultiNode,
    check_options,
    needs_hardware,
    registered_actuators,
    resolve_actuator,
)

__all__ = [
    "ENTRY_POINTS",
    "HARDWARE_FREE",
    "Actuator",
    "MultiNode",
    "check_options",
    "needs_hardware",
    "registered_actuators",
    "resolve_actuator",
]
