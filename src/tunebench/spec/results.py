"""The result of one (experiment, entity): the format both actuators return and the store keeps.

The measuring actuator trains and returns measured properties; the predicting actuator (the planner)
returns predictions of the same properties. Both return a ``Result`` so a prediction and a
measurement of the same entity compare line by line.

Outcomes (the SFTTrainer spec "is_valid logic", ado-sfttrainer.md §5):
- ``valid``: ``properties`` holds is_valid = 1 and every measured property;
- ``invalid``: broke a validity rule, or ran out of memory: ``properties == {"is_valid": 0}`` and
  ``reasons`` says why; memoised, never retried;
- ``failed``: anything else (a crash, a signal, a timeout, an unclassified error): no properties,
  ``error`` and ``log_tail`` say why; retryable.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

STATUSES = ("valid", "invalid", "failed")


LOG_TAIL_CHARS = 16_000  # a failed run keeps the last 16 kB of its log: enough for a Python traceback


@dataclass
class Result:
    """One outcome of measuring (or predicting) an entity under an experiment."""

    experiment_id: str
    entity_id: str
    status: str  # valid | invalid | failed
    properties: dict[str, float] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    log_tail: str | None = None
    actuator: str = "measure"  # measure | predict | import
    # the time series the measured properties reduce (tunebench.worker.series: per GPU, process, step);
    # None: none recorded (predictions, imports, runs that never started)
    series: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {self.status!r}")

    @property
    def is_valid(self) -> bool | None:
        """True/False for valid/invalid results; None for failed ones (spec: no properties)."""
        return None if self.status == "failed" else self.status == "valid"

    @classmethod
    def valid(cls, experiment_id: str, entity_id: str, properties: dict[str, float], **kw: Any) -> Result:
        return cls(experiment_id, entity_id, "valid", {**properties, "is_valid": 1}, **kw)

    @classmethod
    def invalid(cls, experiment_id: str, entity_id: str, reasons: list[str], **kw: Any) -> Result:
        return cls(experiment_id, entity_id, "invalid", {"is_valid": 0}, list(reasons), **kw)

    @classmethod
    def failed(cls, experiment_id: str, entity_id: str, error: str, log_tail: str | None = None, **kw: Any) -> Result:
        return cls(experiment_id, entity_id, "failed", {}, [], error=error, log_tail=log_tail, **kw)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        """Strict JSON: a NaN or infinite float (a diverged loss in the series) is written as null."""
        return json.dumps(finite(self.to_dict()), default=_jsonable, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Result:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def finite(value: Any) -> Any:
    """value with every non-finite float (at any depth of dicts, lists and tuples) replaced by None: what
    strict JSON (allow_nan=False) writes for a number that could not be computed or diverged."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)
