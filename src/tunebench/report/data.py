"""The report's data: a store's results as one tidy table (a row per stored outcome) plus where they ran.

Columns of ``ReportData.frame``: request_id, result_id (the latest result: its time series), experiment_id, base_id, entity_id, actuator, source
(``predicted`` for ``predict``, ``test`` for ``noop`` and module:function actuators, ``measured`` for
the others: tunebench.actuators.registry.result_source), status, outcome (fits | out of memory |
invalid by rule | invalid | failed), reason, the entity's values (one column per property, an
experiment's default filled in where the entity left it out) and the measured properties (one column
each). ``_entity`` holds each row's own entity values (for the planner). The report's own columns
(``load``): method (full, lora, ...), precision (torch_dtype, with the AMP dtype under mixed
precision), and gpu_model "CPU" for a run without GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from tunebench.actuators.registry import result_source
from tunebench.spec.experiments import ID_ORDER, get_experiment
from tunebench.spec.measured import MEMORY_GIB, REPORT_ORDER
from tunebench.store import Store

PREDICT = "predict"  # the planner's actuator name
SOURCES = ("measured", "predicted", "test")  # what a row is (result_source), in the order figures draw them
CPU = "CPU"  # gpu_model of a run without GPUs, in the report's figures and table
ENV_SAMPLES_PER_ACTUATOR = 10  # results whose metadata the environment table reads, per actuator
OUTCOMES = ("fits", "out of memory", "invalid by rule", "invalid", "failed")


@dataclass
class ReportData:
    """What the report draws: the tidy table, the swept dimensions and the environments."""

    frame: pd.DataFrame
    dims: list[str]
    properties: list[str]  # measured properties with at least one value, in REPORT_ORDER then the rest
    environment: list[dict[str, Any]] = field(default_factory=list)
    title: str = "tunebench report"
    store_url: str = ""


def load(
    store: Store,
    *,
    points: set[tuple[str, str]] | None = None,
    dims: Sequence[str] = (),
    title: str = "tunebench report",
) -> ReportData:
    """Every stored outcome (or those of points: (experiment id, entity id) pairs) as a ReportData."""
    rows = store.rows()
    if points is not None:
        rows = [r for r in rows if (r["experiment_id"], r["entity_id"]) in points]
    frame = with_report_columns(tidy(rows))
    constitutive = [c for c in _constitutive(rows) if c in frame.columns]
    swept = [d for d in dims if d in frame.columns] if dims else _swept(frame, constitutive)
    props = [c for c in _property_names(rows) if c in frame.columns and frame[c].notna().any()]
    return ReportData(frame, swept, props, environment(store, frame), title, _safe_url(store.url))


def tidy(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Store.rows() dicts -> one flat row each (see the module docstring for the columns)."""
    defaults = _Defaults()
    constitutive = _constitutive(rows)
    records = []
    for r in rows:
        entity = r["entity"]
        rec: dict[str, Any] = {
            "request_id": r["request_id"],
            "result_id": r["result_id"],
            "experiment_id": r["experiment_id"],
            "base_id": r["base_id"],
            "entity_id": r["entity_id"],
            "actuator": r["actuator"],
            "source": result_source(r["actuator"]),
            "status": r["status"],
            "outcome": outcome(r["status"], r.get("reasons") or [], r.get("error")),
            "reason": r.get("error") or "; ".join(r.get("reasons") or []) or None,
        }
        for name in constitutive:
            value = entity.get(name)
            if value is None:
                value = defaults.get(r["base_id"], r["parameters"], name)
            rec[name] = value if not isinstance(value, (list, tuple)) else ",".join(map(str, value))
        for name, value in r["properties"].items():
            if name != "is_valid":
                rec[name] = value
        rec["_entity"] = entity
        rec["_parameters"] = r["parameters"]
        records.append(rec)
    if not records:
        return pd.DataFrame(
            columns=[
                "request_id",
                "result_id",
                "experiment_id",
                "base_id",
                "entity_id",
                "actuator",
                "source",
                "status",
                "outcome",
                "reason",
                "_entity",
                "_parameters",
            ]
        )
    return pd.DataFrame.from_records(records)


def with_report_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """frame with the report's own columns: method, precision, and gpu_model "CPU" where number_gpus is 0
    (no gpu_model: validity rule 5 needs one only with GPUs), so CPU runs are a category of their own."""
    if frame.empty:
        return frame.assign(method=[], precision=[])
    defaults = _Defaults()
    methods, precisions = [], []
    for base_id, parameters, entity in zip(frame["base_id"], frame["_parameters"], frame["_entity"]):
        methods.append(defaults.method(base_id, parameters))
        values = [entity[n] if n in entity else defaults.get(base_id, parameters, n) for n in PRECISION_PROPERTIES]
        precisions.append(precision(*values))
    frame = frame.assign(method=methods, precision=precisions)
    if "number_gpus" in frame.columns:
        cpu = pd.to_numeric(frame["number_gpus"], errors="coerce") == 0
        column = frame["gpu_model"] if "gpu_model" in frame.columns else pd.Series(None, index=frame.index)
        frame["gpu_model"] = column.astype(object).where(~cpu | column.notna(), CPU)
    return frame


PRECISION_PROPERTIES = ("torch_dtype", "bf16", "accelerate_config_mixed_precision")  # precision()'s arguments


def precision(torch_dtype: str | None, bf16: bool | None, mixed_precision: str | None) -> str:
    """What a run computes in: torch_dtype (the spec's default bfloat16), plus the autocast dtype under
    mixed precision (the bf16 flag, accelerate_config_mixed_precision), e.g. 'float32 + bf16 AMP'."""
    dtype = torch_dtype or "bfloat16"
    amp = "bf16" if bf16 else (mixed_precision if mixed_precision not in (None, "no") else None)
    same = {"bf16": "bfloat16", "fp16": "float16"}.get(amp or "") == dtype  # autocast to the weights' own dtype
    return f"{dtype} + {amp} AMP" if amp and not same else dtype


def outcome(status: str, reasons: Sequence[str], error: str | None) -> str:
    """fits | out of memory | invalid by rule | invalid | failed, from a result's status and reasons."""
    if status == "valid":
        return "fits"
    if status == "invalid":
        text = " ".join(reasons).lower()
        if "out of memory" in text or "out of gpu memory" in text or "oom" in text:
            return "out of memory"
        if text.startswith("rule ") or " rule " in text:
            return "invalid by rule"
        return "invalid"
    return "failed"


def _constitutive(rows: Sequence[dict[str, Any]]) -> list[str]:
    names: set[str] = set()
    for r in rows:
        names.update(r["entity"])
    names.update(ID_ORDER)
    return [n for n in ID_ORDER if n in names] + sorted(names - set(ID_ORDER))


def _property_names(rows: Sequence[dict[str, Any]]) -> list[str]:
    names: set[str] = set()
    for r in rows:
        names.update(r["properties"])
    names.discard("is_valid")
    known = [n for n in (*REPORT_ORDER, *MEMORY_GIB) if n in names]
    return known + sorted(names - set(known))


def _swept(frame: pd.DataFrame, constitutive: Sequence[str]) -> list[str]:
    """Constitutive columns with more than one value among the rows."""
    out = []
    for name in constitutive:
        values = {v if not isinstance(v, (dict, list)) else str(v) for v in frame[name].tolist()}
        if len({v for v in values if v is not None and v == v}) > 1:  # None and NaN are no value
            out.append(name)
    return out


class _Defaults:
    """An experiment's default of a property an entity left out (cached per experiment and name)."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str], Any] = {}

    def method(self, base_id: str, parameters: dict[str, Any]) -> str:
        """The experiment's method (full, lora, qlora, ...), or its base id when tunebench does not know it."""
        key = (base_id + repr(sorted((parameters or {}).items())), "")
        if key not in self._cache:
            try:
                self._cache[key] = get_experiment(base_id, dict(parameters or {})).method
            except Exception:  # an imported experiment tunebench does not know
                self._cache[key] = base_id
        return self._cache[key]

    def get(self, base_id: str, parameters: dict[str, Any], name: str) -> Any:
        key = (base_id + repr(sorted((parameters or {}).items())), name)
        if key not in self._cache:
            try:
                experiment = get_experiment(base_id, dict(parameters or {}))
                value = experiment.default(name) if name in experiment.optional else experiment.hardcoded.get(name)
            except Exception:  # an imported experiment tunebench does not know: no default
                value = None
            self._cache[key] = value
        return self._cache[key]


def environment(store: Store, frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Distinct (actuator, host, device, GPUs, versions) of a sample of the results, with counts.

    Reads the metadata of at most ENV_SAMPLES_PER_ACTUATOR results per actuator, spread evenly over
    its rows (Store.results_of, one query each), so a report of 100,000 rows reads a few dozen.
    """
    seen: dict[tuple, dict[str, Any]] = {}
    for actuator, ids in frame.groupby("actuator", sort=True)["request_id"]:
        ids = list(ids)
        step = max(1, math.ceil(len(ids) / ENV_SAMPLES_PER_ACTUATOR))
        sample = ids[::step]
        for rid in sample:
            results = store.results_of(int(rid))
            if not results:
                continue
            info = describe_metadata(str(actuator), results[-1].metadata)
            key = tuple(sorted((k, str(v)) for k, v in info.items()))
            entry = seen.setdefault(key, {**info, "results_read": 0, "rows": len(ids)})
            entry["results_read"] += 1
    return list(seen.values())


def describe_metadata(actuator: str, meta: dict[str, Any]) -> dict[str, Any]:
    """What a result's metadata says about where and with what it was produced (strings, '' if unknown)."""
    execution = meta.get("execution") or {}
    gpus = meta.get("gpus") or []
    names = sorted({str(g.get("name")) for g in gpus if isinstance(g, dict) and g.get("name")})
    versions = meta.get("versions") or {}
    return {
        "actuator": actuator,
        "host": str(meta.get("host") or execution.get("host") or ""),
        "executor": str(execution.get("executor") or ""),
        "device": str(meta.get("device") or ("planner" if actuator == PREDICT else "")),
        "gpus": ", ".join(f"{len([g for g in gpus if str(g.get('name')) == n])}x {n}" for n in names),
        "versions": ", ".join(f"{k} {v}" for k, v in sorted(versions.items()) if v),
        "calibration": str(meta.get("calibration") or ""),
    }


def _safe_url(url: str) -> str:
    from tunebench.secrets import mask_secrets

    return mask_secrets(str(url))


def space_points(path: Path) -> tuple[set[tuple[str, str]], list[str], str]:
    """(points, swept dimensions, title) of a space file: every sampled point, or the whole grid for optimize."""
    from tunebench.explore.space import load_space

    spec = load_space(path)
    points = spec.points(field="SPACE", instead="report the whole store instead")
    dims = [d.name for d in spec.dimensions if len(d.values) > 1]
    return {(e.id, n.id) for e, n, _ in points}, dims, f"{spec.name or path.name}: {len(points)} points"
