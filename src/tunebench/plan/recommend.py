"""Recommendations: the fewest GPUs that fit, the fastest and the cheapest (batch, GPUs), and a
per-method table for a model (in the spirit of the table 'Average resource requirements by tuning
method' of watsonx.ai's 'Planning for foundation model tuning': full 4 GPUs, LoRA 2, QLoRA 1 on A100-80GB).

Candidates are evaluated in one vectorised pass through ``predict_values``. GPU counts are 1, 2, 4, ...
up to one node (gpus_per_node), then whole nodes; more than one GPU runs FSDP (the spec's default
backend) unless the entity says DDP. Times and costs are for processing the experiment's data set
(its num_train_epochs), not for max_steps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tunebench.errors import InputError
from tunebench.spec.experiments import Experiment, effective_values, get_experiment, make_entity
from tunebench.plan.predictor import PlanOptions, predict_values
from tunebench.spec.validity import check_values

METHOD_EXPERIMENTS = {
    "full": "finetune_full_benchmark-v1.0.0",
    "lora": "finetune_lora_benchmark-v1.0.0",
    "qlora": "finetune_qlora_benchmark-v1.0.0",
}
PER_DEVICE_BATCHES = (1, 2, 4, 8, 16, 32, 64)
FALLBACK_TARGET_MODULES = ("q_proj", "v_proj")


@dataclass
class Candidate:
    """One (GPUs, nodes, batch) configuration and its prediction."""

    number_gpus: int
    number_nodes: int
    batch_size: int
    fits: bool
    gpu_memory_peak_gib: float
    gpu_memory_allocated_peak_gib: float
    gpu_memory_utilization_peak: float
    dataset_tokens_per_second: float
    train_runtime: float
    gpu_hours: float
    cost: float | None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = dict(vars(self))
        for k, v in out.items():
            if isinstance(v, float):
                out[k] = round(v, 4) if math.isfinite(v) else None
        return out


def gpu_counts(gpus_per_node: int, max_gpus: int) -> list[int]:
    """1, 2, 4, ... within a node, then multiples of gpus_per_node up to max_gpus."""
    out = []
    d = 1
    while d <= min(gpus_per_node, max_gpus):
        out.append(d)
        d *= 2
    if gpus_per_node not in out and gpus_per_node <= max_gpus:
        out.append(gpus_per_node)
    n = 2
    while n * gpus_per_node <= max_gpus:
        out.append(n * gpus_per_node)
        n += 1
    return out


def _variant(values: Mapping[str, Any], gpus: int, batch: int, gpus_per_node: int) -> dict[str, Any]:
    v = dict(values)
    v["number_gpus"] = gpus
    v["number_nodes"] = max(1, math.ceil(gpus / gpus_per_node)) if gpus > gpus_per_node else 1
    v["batch_size"] = batch
    v["max_steps"] = -1  # process the data set (num_train_epochs), not a step budget
    if gpus >= 2 and v.get("distributed_backend") is None:
        v["distributed_backend"] = "FSDP"
    return v


def evaluate(
    experiment: Experiment, variants: list[dict[str, Any]], options: PlanOptions
) -> list[Candidate]:
    """Predict every variant (one vectorised pass); rule-breaking variants count as not fitting."""
    cols = predict_values([(experiment.method, v) for v in variants], options)
    out = []
    for i, v in enumerate(variants):
        valid = check_values(v, single_node_only=experiment.single_node_only)
        cost = cols["cost"][i] if "cost" in cols else None
        out.append(
            Candidate(
                number_gpus=v["number_gpus"],
                number_nodes=v["number_nodes"],
                batch_size=v["batch_size"],
                fits=bool(cols["fits"][i]) and valid.is_valid,
                gpu_memory_peak_gib=float(cols["gpu_memory_peak_gib"][i]),
                gpu_memory_allocated_peak_gib=float(cols["gpu_memory_allocated_peak_gib"][i]),
                gpu_memory_utilization_peak=float(cols["gpu_memory_utilization_peak"][i]),
                dataset_tokens_per_second=float(cols["dataset_tokens_per_second"][i]),
                train_runtime=float(cols["train_runtime"][i]),
                gpu_hours=float(cols["gpu_hours"][i]),
                cost=None if cost is None else float(cost),
                notes=list(valid.reasons),
            )
        )
    return out


def minimum_gpus(
    experiment: Experiment, values: Mapping[str, Any], options: PlanOptions, gpus_per_node: int = 8, max_gpus: int = 64
) -> Candidate | None:
    """The fewest GPUs on which the entity fits, keeping its effective batch_size.

    Where the GPU count does not divide batch_size (rule 1), the batch is rounded up to the next
    multiple of it (one more sample per device at most) and a note says so.
    """
    batch = int(values["batch_size"])
    variants, notes = [], []
    for d in gpu_counts(gpus_per_node, max_gpus):
        b = batch if batch % d == 0 else math.ceil(batch / d) * d
        variants.append(_variant(values, d, b, gpus_per_node))
        notes.append([] if b == batch else [f"batch_size rounded up from {batch} to {b} (a multiple of {d} GPUs)"])
    for cand, note in zip(evaluate(experiment, variants, options), notes, strict=True):
        if cand.fits:
            cand.notes = note + cand.notes
            return cand
    return None


def fastest(
    experiment: Experiment, values: Mapping[str, Any], options: PlanOptions, gpus_per_node: int = 8, max_gpus: int = 64
) -> dict[str, Candidate | None]:
    """Over GPU counts x per-device batches: the fastest fitting configuration, and the cheapest
    (most data-set tokens per GPU-second) one."""
    variants = [
        _variant(values, d, pd * d, gpus_per_node)
        for d in gpu_counts(gpus_per_node, max_gpus)
        for pd in PER_DEVICE_BATCHES
    ]
    cands = [
        c for c in evaluate(experiment, variants, options) if c.fits and math.isfinite(c.dataset_tokens_per_second)
    ]
    if not cands:
        return {"fastest": None, "cheapest": None}
    best = max(cands, key=lambda c: (c.dataset_tokens_per_second, -c.number_gpus))
    cheap = max(cands, key=lambda c: (c.dataset_tokens_per_second / max(1, c.number_gpus), -c.number_gpus))
    return {"fastest": best, "cheapest": cheap}


def method_values(
    method: str, base: Mapping[str, Any], experiment_params: Mapping[str, Any] | None = None
) -> tuple[Experiment, dict[str, Any], list[str]]:
    """Effective values of the same job under another method's experiment (LoRA defaults apply)."""
    exp = get_experiment(METHOD_EXPERIMENTS[method], experiment_params or None)
    keep = {k: v for k, v in base.items() if k in exp.optional or k in exp.required}
    notes: list[str] = []
    try:
        entity = make_entity(exp, keep)
    except InputError as err:
        if err.field != "target_modules":
            raise
        keep["target_modules"] = FALLBACK_TARGET_MODULES
        entity = make_entity(exp, keep)
        notes.append(f"no reference target modules for this model; LoRA on {', '.join(FALLBACK_TARGET_MODULES)}")
    return exp, effective_values(exp, entity), notes


def recommend(
    experiment: Experiment,
    raw: Mapping[str, Any],
    options: PlanOptions,
    gpus_per_node: int = 8,
    max_gpus: int = 64,
    methods: tuple[str, ...] = ("full", "lora", "qlora"),
) -> dict[str, Any]:
    """The whole recommendation for an entity: minimum GPUs, fastest/cheapest, per-method table."""
    if gpus_per_node < 1:
        raise InputError("--gpus-per-node", f"must be >= 1 (got {gpus_per_node})")
    if max_gpus < 1:
        raise InputError("--max-gpus", f"must be >= 1 (got {max_gpus})")
    raw = dict(raw)
    raw.setdefault("number_gpus", 1)
    if "gpu_model" not in raw or not raw["gpu_model"]:
        raise InputError("gpu_model", "recommend needs the GPU type to size for", allowed="a GPU from `tunebench gpus`")
    entity = make_entity(experiment, raw)
    values = effective_values(experiment, entity)
    minimum = minimum_gpus(experiment, values, options, gpus_per_node, max_gpus)
    speed = fastest(experiment, values, options, gpus_per_node, max_gpus)
    table = []
    common = {k: values[k] for k in entity.values}
    for method in methods:
        exp, vals, notes = method_values(method, common)
        cand = minimum_gpus(exp, vals, options, gpus_per_node, max_gpus)
        row: dict[str, Any] = {"method": method, "experiment": exp.id}
        if cand is None:
            row.update({"fits": False, "notes": notes + [f"does not fit on {max_gpus} GPUs"]})
        else:
            row.update(cand.to_dict())
            row["notes"] = notes + cand.notes
        table.append(row)
    return {
        "experiment_id": experiment.id,
        "entity_id": entity.id,
        "gpu_model": values["gpu_model"],
        "gpus_per_node": gpus_per_node,
        "max_gpus": max_gpus,
        "price_per_gpu_hour": options.price_per_gpu_hour,
        "minimum": None if minimum is None else minimum.to_dict(),
        "fastest": None if speed["fastest"] is None else speed["fastest"].to_dict(),
        "cheapest": None if speed["cheapest"] is None else speed["cheapest"].to_dict(),
        "methods": table,
    }

