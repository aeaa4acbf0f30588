"""The planner: the predicting actuator (memory, out-of-memory, GPU count, throughput, cost).

Public API:
    predict(experiment, entity, **options) -> Result        one entity
    predict_many([(experiment, entity), ...], **options)     a whole space, vectorised
    predict_values([(method, effective values), ...])        columns of numpy arrays (explorer fast path)
    predict_actuator(experiment, entity, options) -> Result  the executors' 'predict' actuator
    load_calibration(path=None) -> Calibration               explicit > user refit > shipped default
    options: calibration=Calibration, price_per_gpu_hour=float, network_gbps=float
"""

from tunebench.plan.coefficients import Calibration, Coefficients, default_calibration
from tunebench.plan.predict import (
    PREDICTED,
    PlanOptions,
    load_calibration,
    plan_json,
    predict,
    predict_actuator,
    predict_many,
    predict_values,
)

__all__ = [
    "PREDICTED",
    "Calibration",
    "Coefficients",
    "PlanOptions",
    "default_calibration",
    "load_calibration",
    "plan_json",
    "predict",
    "predict_actuator",
    "predict_many",
    "predict_values",
]
