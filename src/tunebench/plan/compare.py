"""Prediction beside measurement: one entity, or every measured entity of a store or a space.

The predicting and measuring actuators produce the same properties for the same entities, so a
measurement in the store is compared with a fresh prediction property by property:
error_percent = 100 * (predicted - measured) / measured. Over many entities the summary gives, per
property, the number of pairs and the median absolute percentage error (MdAPE), and how often the
planner's valid/out-of-memory verdict agrees with the measured outcome.
"""

from __future__ import annotations

import statistics
from typing import Any

from tunebench.errors import InputError

# Properties both actuators produce, compared line by line.
COMPARED = (
    "is_valid", "gpu_memory_allocated_peak_gib", "gpu_memory_reserved_peak_gib", "gpu_memory_utilization_peak",
    "train_runtime", "train_tokens_per_second", "train_tokens_per_gpu_per_second", "dataset_tokens_per_second",
    "dataset_tokens_per_second_per_gpu", "train_samples_per_second", "train_steps_per_second",
)  # fmt: skip


def measured_rows(store_url: str | None, **filters: Any) -> list[dict]:
    """Measured (actuator ``measure``) valid or invalid outcomes in the store, oldest first."""
    from tunebench.store import DONE
    from tunebench.store.open import open_store

    with open_store(store_url, create=False) as sample_store:
        return sample_store.rows(actuator="measure", statuses=DONE, **filters)


def measured_result(store_url: str | None, experiment_id: str, entity_id: str) -> dict | None:
    """The latest measured (not predicted) valid or invalid outcome of (experiment, entity) in the store."""
    from tunebench.store import DONE
    from tunebench.store.open import open_store

    with open_store(store_url, create=False) as sample_store:
        ids = sample_store.request_ids([(experiment_id, entity_id)], actuator="measure")
        if not ids:
            return None
        rows = sample_store.rows(request_ids=list(ids.values()), statuses=DONE)
    return rows[-1] if rows else None


def compare_rows(predicted: dict, measured: dict | None) -> list[dict]:
    """[{property, predicted, measured, error_percent}] for the properties both sides have."""
    props = (measured or {}).get("properties") or {}
    out = []
    for name in COMPARED:
        p = predicted.get(name)
        m = props.get(name)
        if isinstance(p, bool):
            p = int(p)
        err = None
        if isinstance(p, (int, float)) and isinstance(m, (int, float)) and m and name != "is_valid":
            err = 100.0 * (p - m) / m
        out.append({"property": name, "predicted": p, "measured": m, "error_percent": err})
    return out


def compare_many(rows: list[dict], plan_kw: dict[str, Any]) -> list[dict]:
    """One comparison per stored measurement: {experiment_id, entity_id, comparison} or {..., error}.

    All entities are planned in one ``predict_many`` call (the batch path: one calibration, models
    grouped); an entity the planner cannot read or size gets its error, the others are compared."""
    from tunebench.plan.predictor import plan_json, predict_many
    from tunebench.spec.experiments import get_experiment, make_entity

    latest = {(r["experiment_id"], r["entity_id"]): r for r in rows}  # a re-measured entity: its newest result
    items: list[dict[str, Any]] = []
    planned: list[tuple[dict, dict, tuple]] = []  # (item, measured row, (experiment, entity))
    for (experiment_id, entity_id), row in latest.items():
        item: dict[str, Any] = {"experiment_id": experiment_id, "entity_id": entity_id, "status": row["status"]}
        items.append(item)
        try:
            exp = get_experiment(row["base_id"], row.get("parameters") or {})
            planned.append((item, row, (exp, make_entity(exp, row["entity"]))))
        except InputError as exc:  # an entity this version cannot read
            item["error"] = str(exc)
    results = predict_many([pair for _, _, pair in planned], **plan_kw)
    for (item, row, _), result in zip(planned, results, strict=True):
        if result.status == "failed":  # a model the planner cannot size
            item["error"] = result.error
        else:
            item["comparison"] = compare_rows(plan_json(result), row)
    return items


def summarise(items: list[dict]) -> dict[str, Any]:
    """Per property: pairs and MdAPE (%); the valid/invalid verdict's agreement (%); entities not planned."""
    errors: dict[str, list[float]] = {name: [] for name in COMPARED if name != "is_valid"}
    agree = verdicts = 0
    for item in items:
        for r in item.get("comparison", ()):
            if r["property"] == "is_valid":
                if r["predicted"] is not None and r["measured"] is not None:
                    verdicts += 1
                    agree += int(bool(r["predicted"]) == bool(r["measured"]))
            elif r["error_percent"] is not None:
                errors[r["property"]].append(abs(r["error_percent"]))
    props = {
        name: {"pairs": len(v), "mdape_percent": statistics.median(v) if v else None} for name, v in errors.items()
    }
    return {
        "entities": len(items),
        "not_planned": sum(1 for i in items if "error" in i),
        "verdicts": verdicts,
        "verdict_agreement_percent": 100.0 * agree / verdicts if verdicts else None,
        "properties": props,
    }
