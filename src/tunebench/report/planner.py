"""What the planner (tunebench.plan) predicts for the report: the measured rows, and OOM boundaries.

Predictions are made now, with the current calibration (tunebench.plan.load_calibration), for the
very entities of the store, so a measurement and its prediction always describe the same job.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from tunebench.spec.experiments import Experiment, get_experiment, make_entity

BOUNDARY_LENGTHS = 40  # model_max_length values per boundary (geometric between the observed extremes)


class Experiments:
    """Experiment objects by (base id, parameters), built once each; None when tunebench cannot build one."""

    def __init__(self) -> None:
        self._cache: dict[str, Experiment | None] = {}

    def get(self, base_id: str, parameters: dict[str, Any]) -> Experiment | None:
        key = base_id + repr(sorted((parameters or {}).items()))
        if key not in self._cache:
            try:
                self._cache[key] = get_experiment(base_id, dict(parameters or {}))
            except Exception:  # an imported experiment id tunebench does not know
                self._cache[key] = None
        return self._cache[key]


def predictions(frame: pd.DataFrame, properties: Sequence[str]) -> pd.DataFrame:
    """The planner's prediction of each row of frame: columns predicted_<property> and predicted_fits.

    Indexed like frame; rows the planner cannot size (an unknown model or GPU) are left out.
    """
    from tunebench.plan import predict_many

    experiments = Experiments()
    items, index = [], []
    for i, base_id, parameters, values in zip(frame.index, frame["base_id"], frame["_parameters"], frame["_entity"]):
        experiment = experiments.get(base_id, parameters)
        if experiment is None:
            continue
        try:
            items.append((experiment, make_entity(experiment, values)))
        except Exception:  # an entity the spec no longer accepts: nothing to predict
            continue
        index.append(i)
    results = predict_many(items) if items else []
    records, kept = [], []
    for i, result in zip(index, results):
        if result.status == "failed":
            continue
        predicted = result.metadata.get("predicted") or {}
        records.append(
            {
                **{f"predicted_{p}": predicted.get(p) for p in properties},
                "predicted_fits": bool(result.metadata.get("fits", True)),
            }
        )
        kept.append(i)
    return pd.DataFrame.from_records(records, index=kept) if records else pd.DataFrame()


def boundary(
    base_id: str,
    parameters: dict[str, Any],
    values: dict[str, Any],
    batch_sizes: Sequence[int],
    lengths: Sequence[int],
) -> list[tuple[int, int | None]]:
    """(batch size, largest model_max_length the planner predicts fits) for each batch size.

    values: the other entity values (model, GPUs, ...) of the group. Lengths tried: BOUNDARY_LENGTHS
    geometric steps between the observed extremes plus the observed lengths. Peak memory grows with
    the length, so each batch size's boundary is found by bisection: all batch sizes advance together,
    one vectorised predict_many per round (about log2(lengths) rounds). None: nothing fits.
    """
    experiment = Experiments().get(base_id, parameters)
    if experiment is None or not batch_sizes or not lengths:
        return []
    lo, hi = max(1, min(lengths)), max(lengths)
    grid = sorted({int(v) for v in np.geomspace(lo, hi, BOUNDARY_LENGTHS).round()} | {int(v) for v in lengths})
    # per batch: grid[:low] fit, grid[high:] do not; bisect until low == high
    bounds = {int(b): [0, len(grid)] for b in batch_sizes}
    while True:
        asks = [(b, (low + high) // 2) for b, (low, high) in bounds.items() if low < high]
        if not asks:
            break
        fits = _fits(experiment, values, [(b, grid[i]) for b, i in asks])
        for (b, i), ok in zip(asks, fits):
            if ok:
                bounds[b][0] = i + 1
            else:
                bounds[b][1] = i
    return [(b, grid[low - 1] if low else None) for b, (low, _) in sorted(bounds.items())]


def _fits(experiment: Experiment, values: dict[str, Any], points: list[tuple[int, int]]) -> list[bool]:
    """Whether the planner predicts each (batch size, length) fits in memory; a point that breaks a validity
    rule is not planned and counts as not fitting."""
    from tunebench.plan import predict_many

    items, index = [], []
    for i, (batch, length) in enumerate(points):
        try:
            items.append(
                (experiment, make_entity(experiment, {**values, "batch_size": batch, "model_max_length": length}))
            )
            index.append(i)
        except Exception:  # a value the spec rejects: treat as not fitting
            continue
    out = [False] * len(points)
    for i, result in zip(index, predict_many(items) if items else []):
        out[i] = result.status != "failed" and bool(result.metadata.get("fits"))
    return out


PEAK = "gpu_memory_peak_gib"  # the planner's peak memory per GPU, GiB (what nvidia-smi would show)
PREDICT = "predict"  # the planner's actuator


def predicted_peak_gib(store: Any, info: dict[str, Any]) -> tuple[float | None, str]:
    """(the planner's predicted peak memory per GPU in GiB, where it comes from) for a stored result
    (Store.result_info): the predict actuator's stored prediction of the same experiment and entity,
    else the planner run on the entity now; (None, why) when neither has one."""
    point = (info["experiment_id"], info["entity_id"])
    request = store.request_ids([point], actuator=PREDICT).get(point)
    stored = store.results_of(request) if request is not None else []
    if stored and stored[-1].properties.get(PEAK) is not None:
        return float(stored[-1].properties[PEAK]), f"stored prediction of the {PREDICT} actuator"
    from tunebench.plan import predict_many

    experiment = Experiments().get(info["base_id"], info["parameters"])
    if experiment is None:
        return None, "an experiment the planner does not know"
    try:
        (result,) = predict_many([(experiment, make_entity(experiment, info["entity"]))])
    except Exception:  # a model the planner cannot size (a config.json path it cannot read, ...)
        return None, "an entity the planner cannot size"
    value = (result.metadata.get("predicted") or {}).get(PEAK)
    if result.status == "failed" or value is None:
        return None, "an entity the planner cannot size"
    return float(value), "planner, run now"
