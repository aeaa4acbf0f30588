"""The predicting actuator: the planner (tunebench.plan) behind the actuator contract.

``predict_actuator(experiment, entity, options) -> Result`` predicts in microseconds and never uses
a GPU (a CPU entity's first plan of a shape times two of its model's layers on this host once, seconds:
plan.host). Its options: calibration (a JSON path), price_per_gpu_hour (default: the GPU catalog's USD list price),
network_gbps, host_memory_gib. Valid results store gpu_hours and cost beside the predicted properties. The measuring
actuator's options and what executors add are accepted and ignored, so a space file written for
measuring can be screened with the planner as is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from tunebench.actuators.options import MeasureOptions
from tunebench.actuators.registry import Actuator
from tunebench.errors import InputError
from tunebench.spec.experiments import Entity, Experiment
from tunebench.spec.results import Result

ACTUATOR_OPTIONS = ("calibration", "price_per_gpu_hour", "network_gbps", "host_memory_gib")
_IGNORED_OPTIONS = tuple(f.name for f in fields(MeasureOptions))  # executor-assigned fields included


def check_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The planner's keyword options from the actuator options; InputError on an unknown or bad one."""
    from tunebench.plan import load_calibration

    unknown = sorted(set(options) - set(ACTUATOR_OPTIONS) - set(_IGNORED_OPTIONS))
    if unknown:
        raise InputError(
            "actuator.options",
            f"unknown option(s) of the predict actuator: {', '.join(unknown)}",
            allowed=", ".join(ACTUATOR_OPTIONS),
        )
    out: dict[str, Any] = {}
    if options.get("calibration"):
        path = Path(str(options["calibration"])).expanduser()
        if not path.is_file():
            raise InputError("actuator.options.calibration", f"no file {str(path)!r}")
        out["calibration"] = load_calibration(path)
    for key in ("price_per_gpu_hour", "network_gbps", "host_memory_gib"):
        if options.get(key) is not None:
            try:
                out[key] = float(options[key])
            except (TypeError, ValueError):
                raise InputError(f"actuator.options.{key}", f"{options[key]!r} is not a number") from None
    return out


def predict_actuator(experiment: Experiment, entity: Entity, options: Mapping[str, Any] | None = None) -> Result:
    """The 'predict' actuator of explore: the planner's Result for the entity (see module docstring)."""
    from tunebench.plan import predict

    return predict(experiment, entity, **check_options(options or {}))


PREDICT = Actuator("predict", predict_actuator, check_options=check_options, needs_hardware=False)
