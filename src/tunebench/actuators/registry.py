"""Actuator names -> functions: tunebench's own, plugins' entry points, and (opt-in) module:function.

An actuator is an ``Actuator``: its ``run(experiment, entity, options) -> Result``, the check of its
options (run before anything starts), whether it needs the entity's hardware, and for multi-node
entities its ``MultiNode`` steps (executors call only these: they schedule, the actuator runs). A
plugin may give a plain function ``fn(experiment, entity, options) -> Result``: it becomes an
Actuator that needs the hardware and runs on one node. Actuators are named in the space file's
``actuator.name``: a registered name, i.e. tunebench's own (``BUILTIN``: real imports, done
on first use so that naming ``predict`` never loads the measuring stack and the reverse) or a
plugin's (a Python entry point of group ``tunebench.actuators`` whose value is ``module:function``),
so plugins need no change here. A space file cannot name an arbitrary ``module:function`` (it would
import and call anything, ``os:system`` included): that takes an explicit opt-in by whoever runs
it (``explore --allow-actuator-import``, ``Settings.allow_actuator_import``), carried by each task.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tunebench.errors import InputError, suggest
from tunebench.spec.experiments import Entity, Experiment
from tunebench.spec.results import Result

ENTRY_POINTS = "tunebench.actuators"  # plugins register actuators as entry points of this group
_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class MultiNode:
    """The steps of one entity measured over several nodes (tunebench.executors.ray places the nodes).

    judge(experiment, entity) -> reasons it is not measured (asked before any node is placed);
    plan(experiment, entity, options, ip, port) -> LaunchPlan, on the driver;
    run(experiment, entity, options, node_plan, output_dir, ip) -> NodeResult, on each node;
    collect(experiment, entity, options, plan, node_results) -> Result, on the driver.
    """

    plan: Callable[..., Any]
    run: Callable[..., Any]
    collect: Callable[..., Result]
    judge: Callable[[Experiment, Entity], list[str]] | None = None


@dataclass(frozen=True)
class Actuator:
    """What executors and the explorer know of an actuator (they call nothing else)."""

    name: str
    run: Callable[[Experiment, Entity, Mapping[str, Any]], Result]
    check_options: Callable[[Mapping[str, Any]], Any] | None = None  # raises InputError on a bad option
    needs_hardware: bool = True  # False: its tasks ask executors for no GPUs and no nodes
    multinode: MultiNode | None = None  # None: entities with number_nodes > 1 are not run by it

    def __call__(self, experiment: Experiment, entity: Entity, options: Mapping[str, Any]) -> Result:
        return self.run(experiment, entity, options)


def _noop(experiment: Experiment, entity: Entity, options: Mapping[str, Any]) -> Result:
    """Measures nothing and returns at once (valid, no properties)."""
    return Result.valid(experiment.id, entity.id, {}, actuator="noop")


NOOP = Actuator("noop", _noop, needs_hardware=False)  # store and scheduling overhead


def _measure() -> Actuator:
    from tunebench.actuators.measure import MEASURE

    return MEASURE


def _measure_fms() -> Actuator:
    from tunebench.actuators.measure import MEASURE_FMS

    return MEASURE_FMS


def _predict() -> Actuator:
    from tunebench.actuators.predict import PREDICT

    return PREDICT


# tunebench's own actuators: name -> a function importing it (measure pulls the data sets and the
# worker's result rules, predict pulls numpy: neither is paid for by the other or by `--help`).
BUILTIN: dict[str, Callable[[], Actuator]] = {
    "measure": _measure,  # trains for real, with tunebench's own worker (the native engine)
    "fms-hf-tuning": _measure_fms,  # trains for real through fms-hf-tuning at the entity's version
    "predict": _predict,  # the planner's predictions
    "noop": lambda: NOOP,  # returns at once: store and scheduling overhead
}
# tunebench's actuators that never touch the entity's hardware (each one's needs_hardware=False, known
# here without importing it): the planner predicts a 64-GPU entity on a laptop. Any other actuator,
# plugins' included, gets the entity's number_gpus / number_nodes / gpu_model unless it says otherwise.
HARDWARE_FREE = frozenset({"predict", "noop"})


def result_source(name: str) -> str:
    """What an actuator's results are: "predicted" (the planner), "test" (noop measures nothing; a
    module:function actuator runs whatever code was opted in with --allow-actuator-import, tunebench's
    tests' fakes among them, so its numbers are not vouched for), else "measured" (measure,
    fms-hf-tuning, a plugin's entry point, and imported measurements, stored under measure)."""
    if name == "predict":
        return "predicted"
    if name == "noop" or _PATH.match(name):
        return "test"
    return "measured"


def needs_hardware(name: str, *, allow_import: bool = False) -> bool:
    """Whether the actuator's tasks ask executors for the entity's GPUs and nodes."""
    if name in BUILTIN:
        return name not in HARDWARE_FREE
    try:
        return resolve_actuator(name, allow_import=allow_import).needs_hardware
    except InputError:  # cannot be imported: the task asks for the hardware and fails when it runs, saying why
        return True


def registered_actuators() -> dict[str, str | Callable[[], Actuator]]:
    """Actuator name -> its loader (tunebench's own) or module:function (plugins' entry points)."""
    return {**_plugins(), **BUILTIN}


@functools.cache
def _plugins() -> dict[str, str]:
    """The entry points of group tunebench.actuators (read once per process: scanning costs ~10 ms)."""
    return {entry.name: entry.value for entry in importlib.metadata.entry_points(group=ENTRY_POINTS)}


def resolve_actuator(name: str, *, allow_import: bool = False) -> Actuator:
    """The Actuator behind a registered actuator name, or (allow_import only) a module:function path;
    InputError (field actuator.name) if there is none or it is not allowed."""
    registry = registered_actuators()
    target = registry.get(name)
    if callable(target):
        return target()
    if target is None:
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
        target = name
    return _import(name, target)


def _import(name: str, path: str) -> Actuator:
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise InputError(
            "actuator.name", f"actuator {name!r} needs module {module_name!r}, which cannot be imported: {exc}"
        ) from None
    fn = getattr(module, attr, None)
    if isinstance(fn, Actuator):
        return fn
    if not callable(fn):
        raise InputError("actuator.name", f"module {module_name!r} has no function {attr!r}")
    return Actuator(name, fn)  # a plain function: one node, the entity's hardware, no option check


def check_options(name: str, options: dict[str, Any], *, allow_import: bool = False) -> None:
    """Let the actuator reject unknown or bad options before anything runs (InputError)."""
    actuator = resolve_actuator(name, allow_import=allow_import)
    if actuator.check_options is not None:
        actuator.check_options({**options, "visible_devices": "", "output_dir": "."})  # with what the executor adds
