"""The planner: predictions of memory, out-of-memory, GPU count, throughput and cost (the `predict` actuator
of tunebench.actuators.predict wraps it).

Public API:
    predict(experiment, entity, **options) -> Result        one entity
    predict_many([(experiment, entity), ...], **options)     a whole space, vectorised
    predict_values([(method, effective values), ...])        columns of numpy arrays (explorer fast path)
    load_calibration(path=None) -> Calibration               explicit > user refit > shipped default
    options: calibration=Calibration, price_per_gpu_hour=float, network_gbps=float
"""

import importlib
from typing import Any

# Loaded on first use (PEP 562): the CLI registers the planner's commands without importing numpy.
_EXPORTS = {
    "Calibration": "coefficients", "Coefficients": "coefficients", "default_calibration": "coefficients",
    "PREDICTED": "predictor", "PlanOptions": "predictor", "load_calibration": "predictor", "plan_json": "predictor",
    "predict": "predictor", "predict_many": "predictor", "predict_values": "predictor",
}  # fmt: skip
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"tunebench.plan.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'tunebench.plan' has no attribute {name!r}")
