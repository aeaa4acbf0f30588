"""Recommendations: the fewest GPUs that fit, the fastest and the cheapest (batch, GPUs), and a
per-method table for a model (in the spirit of the table 'Average resource requirements by tuning
method' of watsonx.ai's 'Planning for foundation model tuning': full 4 GPUs, LoRA 2, QLoRA 1 on A100-80GB).

Candidates are evaluated in one vectorised pass through ``predict_values``. GPU counts are 1, 2, 4, ...
up to one node (gpus_per_node), then whole nodes; more than one GPU runs FSDP (the spec's default
backend) unless the entity says DDP or DeepSpeed, or sets device_map (one process, no backend). Times
and costs are for processing the experiment's data set (its num_train_epochs), not for max_steps.

A configuration counts as fitting when the planner says it fits (its median peak within usable memory,
out-of-memory probability <= 0.5) *and* its out-of-memory probability is at most ``max_oom_risk``
(default DEFAULT_MAX_OOM_RISK). Where nothing fits, ``diagnose`` says why at the largest GPU count
tried and ``nearest_fit`` finds the first change that fits.
"""

from __future__ import annotations

import dataclasses
import math
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tunebench.catalog.gpus import alias_note
from tunebench.errors import InputError
from tunebench.spec.experiments import Experiment, effective_values, get_experiment, make_entity, render_value
from tunebench.spec.properties import NODE_GPUS

if TYPE_CHECKING:  # the planner (numpy, torch when tracing) loads when a recommendation runs, not with --help
    from tunebench.plan.predictor import PlanOptions

METHOD_EXPERIMENTS = {
    "full": "finetune_full_benchmark-v1.0.0",
    "lora": "finetune_lora_benchmark-v1.0.0",
    "qlora": "finetune_qlora_benchmark-v1.0.0",
}
PER_DEVICE_BATCHES = (1, 2, 4, 8, 16, 32, 64)
FALLBACK_TARGET_MODULES = ("q_proj", "v_proj")
# One run in ten out of memory is the most a recommendation accepts by default: the planner's own
# "fits" is a coin flip (probability <= 0.5), and an out-of-memory run wastes its whole start-up.
DEFAULT_MAX_OOM_RISK = 0.10


def verdict_of(oom_probability: float | None, blocked: bool, max_oom_risk: float) -> str:
    """A job's verdict, one vocabulary for plan, --batch, --grid, max-batch and recommend: invalid (it breaks a
    validity rule or exceeds the host's RAM: blocked), OOM (the planner's own verdict, out-of-memory
    probability above 0.5), risky (it fits, at a probability above max_oom_risk), else fits. "fits" in every
    JSON answer is this verdict being fits."""
    if blocked:
        return "invalid"
    p = oom_probability if oom_probability is not None and math.isfinite(oom_probability) else 0.0
    if p > 0.5:
        return "OOM"
    return "risky" if p > max_oom_risk else "fits"


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
    oom_probability: float  # the planner's probability of running out of GPU memory (NaN on the CPU)
    required_gib: float  # the predicted need: allocated peak + fragmentation, GiB per GPU (memory.predict_memory)
    headroom_gib: float  # usable GPU memory minus the predicted need, GiB per GPU (NaN on the CPU)
    # host RAM per node that offload keeps, GiB (0 without offload); checked against PlanOptions.host_memory_gib
    host_memory_gib: float
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
    v["distributed_backend"] = candidate_backend(values, gpus)
    return v


def candidate_backend(values: Mapping[str, Any], gpus: int) -> Any:
    """The distributed_backend a candidate on gpus GPUs runs: the job's, but FSDP (the spec's default) on 2 or more
    GPUs where the job has none, except with device_map, whose one process needs none (spec.validity)."""
    backend = values.get("distributed_backend")
    if gpus >= 2 and backend is None and not values.get("device_map"):
        return "FSDP"
    return backend


def evaluate(
    experiment: Experiment,
    variants: list[dict[str, Any]],
    options: PlanOptions,
    max_oom_risk: float = DEFAULT_MAX_OOM_RISK,
) -> list[Candidate]:
    """Predict every variant (one vectorised pass); rule-breaking variants (no figures: predict_values), and
    those whose out-of-memory probability exceeds max_oom_risk, count as not fitting."""
    from tunebench.plan.predictor import predict_values

    cols = predict_values(
        [(experiment.method, v) for v in variants], options, single_node_only=experiment.single_node_only
    )
    _raise_sizing_error(cols)
    out = []
    for i, v in enumerate(variants):
        cost = float(cols["cost"][i]) if math.isfinite(cols["cost"][i]) else None  # NaN: no price, or a broken rule
        p_oom = float(cols["oom_probability"][i]) if math.isfinite(cols["oom_probability"][i]) else 0.0
        out.append(
            Candidate(
                number_gpus=v["number_gpus"],
                number_nodes=v["number_nodes"],
                batch_size=v["batch_size"],
                fits=verdict_of(p_oom, bool(cols["rules"][i] or cols["reasons"][i]), max_oom_risk) == "fits",
                gpu_memory_peak_gib=float(cols["gpu_memory_peak_gib"][i]),
                gpu_memory_allocated_peak_gib=float(cols["gpu_memory_allocated_peak_gib"][i]),
                gpu_memory_utilization_peak=float(cols["gpu_memory_utilization_peak"][i]),
                # none where a rule is broken or on the CPU, which has no GPU to run out of (NaN: null in JSON)
                oom_probability=p_oom if not cols["rules"][i] and v["number_gpus"] else math.nan,
                required_gib=float(cols["required_gib"][i]),
                headroom_gib=float(cols["headroom_gib"][i]),
                host_memory_gib=float(np.nan_to_num(cols["host_memory_gib"][i])) if not cols["rules"][i] else math.nan,
                dataset_tokens_per_second=float(cols["dataset_tokens_per_second"][i]),
                train_runtime=float(cols["train_runtime"][i]),
                gpu_hours=float(cols["gpu_hours"][i]),
                cost=cost,
                notes=list(cols["rules"][i]) + list(cols["reasons"][i]),  # the rules, then out of host memory
            )
        )
    return out


def _raise_sizing_error(cols: Mapping[str, Any]) -> None:
    """The InputError of a variant the planner could not size (its model: every variant shares it), raised: a
    recommendation of figures it does not have would be nonsense (predict_values keeps it per row)."""
    error = next((e for e in cols["errors"] if e is not None), None)
    if error is not None:
        raise error


def tried_counts(batch: int, gpus_per_node: int, max_gpus: int) -> list[int]:
    """The GPU counts minimum_gpus tries for a batch: gpu_counts, at most one sample per GPU (validity
    rule 1, batch_size % number_gpus == 0: a batch of 16 uses at most 16 GPUs)."""
    return [d for d in gpu_counts(gpus_per_node, max_gpus) if d <= max(1, batch)]


def rounded_batch(batch: int, gpus: int) -> int:
    """batch_size, or the next multiple of gpus where they do not divide it (rule 1)."""
    return batch if batch % gpus == 0 else math.ceil(batch / gpus) * gpus


def minimum_gpus(
    experiment: Experiment,
    values: Mapping[str, Any],
    options: PlanOptions,
    gpus_per_node: int = NODE_GPUS,
    max_gpus: int = 64,
    max_oom_risk: float = DEFAULT_MAX_OOM_RISK,
) -> Candidate | None:
    """The fewest GPUs on which the entity fits, keeping its effective batch_size.

    Where the GPU count does not divide batch_size (rule 1), the batch is rounded up to the next
    multiple of it (one more sample per device at most) and a note says so.
    """
    batch = int(values["batch_size"])
    variants, notes = [], []
    for d in tried_counts(batch, gpus_per_node, max_gpus):
        b = rounded_batch(batch, d)
        variants.append(_variant(values, d, b, gpus_per_node))
        notes.append([] if b == batch else [f"batch_size rounded up from {batch} to {b} (a multiple of {d} GPUs)"])
    for cand, note in zip(evaluate(experiment, variants, options, max_oom_risk), notes, strict=True):
        if cand.fits:
            cand.notes = note + cand.notes
            return cand
    return None


def fastest(
    experiment: Experiment,
    values: Mapping[str, Any],
    options: PlanOptions,
    gpus_per_node: int = NODE_GPUS,
    max_gpus: int = 64,
    max_oom_risk: float = DEFAULT_MAX_OOM_RISK,
) -> dict[str, Candidate | None]:
    """Over GPU counts x per-device batches: the fastest fitting configuration, the cheapest (most
    data-set tokens per GPU-second) one, and the fastest on the largest GPU count (what the last
    GPUs allowed buy where fewer are cheapest)."""
    counts = gpu_counts(gpus_per_node, max_gpus)
    variants = [_variant(values, d, pd * d, gpus_per_node) for d in counts for pd in PER_DEVICE_BATCHES]
    cands = [
        c
        for c in evaluate(experiment, variants, options, max_oom_risk)
        if c.fits and math.isfinite(c.dataset_tokens_per_second)
    ]
    if not cands:
        return {"fastest": None, "cheapest": None, "largest": None}
    best = max(cands, key=lambda c: (c.dataset_tokens_per_second, -c.number_gpus))
    cheap = max(cands, key=lambda c: (c.dataset_tokens_per_second / max(1, c.number_gpus), -c.number_gpus))
    top = [c for c in cands if c.number_gpus == counts[-1]]
    largest = max(top, key=lambda c: c.dataset_tokens_per_second) if top else None
    return {"fastest": best, "cheapest": cheap, "largest": largest}


def diagnose(
    experiment: Experiment, values: Mapping[str, Any], options: PlanOptions, gpus_per_node: int, max_gpus: int
) -> dict[str, Any]:
    """Why the entity does not fit: at the largest GPU count tried, the largest memory component, the
    need against usable memory, the out-of-memory probability, and the plan's notes and reasons."""
    batch = int(values["batch_size"])
    top = tried_counts(batch, gpus_per_node, max_gpus)[-1]
    v = _variant(values, top, rounded_batch(batch, top), gpus_per_node)
    from tunebench.plan.predictor import predict_values

    cols = predict_values([(experiment.method, v)], options, single_node_only=experiment.single_node_only)
    _raise_sizing_error(cols)
    breakdown = cols["breakdown"][0] or {}
    name, gib = max(breakdown.items(), key=lambda kv: kv[1]) if breakdown else (None, math.nan)
    rules = cols["rules"][0]
    if rules:  # it cannot start at all: the rules are why, and its memory figures would mean nothing
        return {"number_gpus": top, "rules": rules, "notes": list(cols["notes"][0])}
    return {
        "number_gpus": top,
        "largest_component": name,
        "largest_component_gib": float(gib),
        "required_gib": float(cols["required_gib"][0]),
        "usable_gib": float(cols["usable_gib"][0]),
        "oom_probability": float(cols["oom_probability"][0]),
        "notes": [*cols["reasons"][0], *cols["notes"][0]],
    }


def _lengths_notes(
    experiment: Experiment, values: Mapping[str, Any], options: PlanOptions, gpus: int, gpus_per_node: int
) -> list[str]:
    """The plan's note on the user's sample lengths (plan.predictor._note_lengths) at ``gpus`` GPUs: the candidates
    keep only their rules and reasons, so the job says it once."""
    from tunebench.plan.predictor import LENGTHS_NOTE, predict_values

    v = _variant(values, gpus, rounded_batch(int(values["batch_size"]), gpus), gpus_per_node)
    cols = predict_values([(experiment.method, v)], options, single_node_only=experiment.single_node_only)
    return [f"{n} (at {gpus} GPU(s))" for n in cols["notes"][0] if n.startswith(LENGTHS_NOTE)]


def command(
    experiment: Experiment, raw: Mapping[str, Any], change: Mapping[str, Any], options: Mapping[str, Any]
) -> str:
    """The `tunebench recommend` command line of raw with change applied (pasteable: shell-quoted)."""
    words = ["tunebench", "recommend", experiment.base_id]
    for k, v in sorted(experiment.parameters.items()):
        words += ["-p", f"{k}={render_value(v)}"]
    props = {**{k: v for k, v in raw.items() if k != "number_gpus"}, **change}
    words += [f"{k}={str(v).lower() if isinstance(v, bool) else render_value(v)}" for k, v in props.items()]
    for k, v in options.items():
        words += [k, str(v)]
    return " ".join(shlex.quote(w) for w in words)


def nearest_fit(
    experiment: Experiment,
    raw: Mapping[str, Any],
    values: Mapping[str, Any],
    options: PlanOptions,
    gpus_per_node: int = NODE_GPUS,
    max_gpus: int = 64,
    max_oom_risk: float = DEFAULT_MAX_OOM_RISK,
    cli_options: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The first change that fits, in this order: gradient_accumulation_steps=1 (FSDP keeps unsharded
    gradients while it accumulates), half the batch (down to 1), twice the batch spread over more GPUs
    (rule 1 lets a batch use at most one GPU per sample; FSDP shards the model over them), LoRA, QLoRA.
    None if none fits."""
    tries: list[tuple[str, str | None, dict[str, Any]]] = []  # (label, other method or None, change)
    if int(values.get("gradient_accumulation_steps") or 1) > 1:
        tries.append(("gradient_accumulation_steps=1", None, {"gradient_accumulation_steps": 1}))
    batch = int(values["batch_size"])
    b = batch // 2
    while b >= 1:
        tries.append((f"batch_size={b}", None, {"batch_size": b}))
        b //= 2
    b = 2 * max(1, batch)
    while b <= max_gpus:
        tries.append((f"batch_size={b} over more GPUs", None, {"batch_size": b}))
        b *= 2
    if experiment.method == "full":
        tries += [("LoRA", "lora", {}), ("QLoRA", "qlora", {})]
    elif experiment.method == "lora":
        tries.append(("QLoRA", "qlora", {}))
    for label, method, change in tries:
        exp, vals = experiment, {**values, **change}
        if method is not None:
            try:
                exp, vals, _ = method_values(method, {**raw, "number_gpus": 1})
            except InputError:  # a property the other method's experiment does not take
                continue
        cand = minimum_gpus(exp, vals, options, gpus_per_node, max_gpus, max_oom_risk)
        if cand is not None:
            keep = {k: v for k, v in raw.items() if k in exp.optional or k in exp.required}
            return {
                "change": label,
                "experiment_id": exp.id,
                "candidate": cand.to_dict(),
                "command": command(exp, keep, change, cli_options or {}),
            }
    return None


def method_values(
    method: str, base: Mapping[str, Any], experiment_params: Mapping[str, Any] | None = None
) -> tuple[Experiment, dict[str, Any], list[str]]:
    """Effective values of the same job under another method's experiment (LoRA defaults apply)."""
    exp = get_experiment(METHOD_EXPERIMENTS[method], experiment_params or None)
    entity, notes = method_entity(exp, base)
    return exp, effective_values(exp, entity), notes


def method_entity(exp: Experiment, base: Mapping[str, Any]) -> tuple[Any, list[str]]:
    """The job's entity under exp: the properties exp has (a full fine-tuning job keeps no LoRA rank), LoRA on
    FALLBACK_TARGET_MODULES where the model has no reference target modules; and the notes saying so."""
    keep = {k: v for k, v in base.items() if k in exp.optional or k in exp.required}
    try:
        return make_entity(exp, keep), []
    except InputError as err:
        if err.field != "target_modules":
            raise
        keep["target_modules"] = FALLBACK_TARGET_MODULES
        note = f"no reference target modules for this model; LoRA on {', '.join(FALLBACK_TARGET_MODULES)}"
        return make_entity(exp, keep), [note]


def recommend(
    experiment: Experiment,
    raw: Mapping[str, Any],
    options: PlanOptions,
    gpus_per_node: int = NODE_GPUS,
    max_gpus: int = 64,
    methods: tuple[str, ...] = ("full", "lora", "qlora"),
    max_oom_risk: float = DEFAULT_MAX_OOM_RISK,
    cli_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The whole recommendation for an entity: minimum GPUs, fastest/cheapest, the fastest on the largest
    GPU count, a per-method table; where nothing fits, why (``diagnosis``) and the nearest change that
    fits (``nearest``, with a command line; cli_options are the options that command repeats)."""
    if gpus_per_node < 1:
        raise InputError("--gpus-per-node", f"must be >= 1 (got {gpus_per_node})")
    if max_gpus < 1:
        raise InputError("--max-gpus", f"must be >= 1 (got {max_gpus})")
    if not 0 <= max_oom_risk <= 1:
        raise InputError("--max-oom-risk", f"must be a probability (got {max_oom_risk})", allowed="0 to 1")
    options = dataclasses.replace(options, node_gpus=gpus_per_node)  # the node the user lays GPUs out on
    raw = dict(raw)
    given_gpus = _given_gpu_count(raw.pop("number_gpus", None))
    raw["number_gpus"] = 1  # replaced by every count tried
    if "gpu_model" not in raw or not raw["gpu_model"]:
        raise InputError("gpu_model", "recommend needs the GPU type to size for", allowed="a GPU from `tunebench gpus`")
    entity = make_entity(experiment, raw)
    values = effective_values(experiment, entity)
    minimum = minimum_gpus(experiment, values, options, gpus_per_node, max_gpus, max_oom_risk)
    speed = fastest(experiment, values, options, gpus_per_node, max_gpus, max_oom_risk)
    tried = tried_counts(int(values["batch_size"]), gpus_per_node, max_gpus)
    job_notes = [] if given_gpus is None else [_gpu_count_note(given_gpus, tried)]
    alias = alias_note(raw["gpu_model"]) if isinstance(raw["gpu_model"], str) else None
    job_notes += [alias] if alias else []
    if "distributed_backend" in entity.values and candidate_backend(values, 2) != values["distributed_backend"]:
        job_notes.append(
            "distributed_backend None (one process) is planned as FSDP on 2 or more GPUs: each pick's entity says so"
        )
    if options.lengths is not None:  # what the plans assume of the user's samples (and what padding costs them)
        top = tried[-1] if minimum is None else minimum.number_gpus
        job_notes += _lengths_notes(experiment, values, options, top, gpus_per_node)
    table = []
    common = {k: values[k] for k in entity.values}
    for method in methods:
        exp, vals, notes = method_values(method, common)
        cand = minimum_gpus(exp, vals, options, gpus_per_node, max_gpus, max_oom_risk)
        row: dict[str, Any] = {"method": method, "experiment": exp.id}
        if cand is None:
            row.update(
                {
                    "fits": False,
                    "notes": notes + [f"does not fit on up to {tried[-1]} GPU{'s' if tried[-1] != 1 else ''}"],
                }
            )
        else:
            row.update(_picked(exp, common, cand))
            row["notes"] = notes + cand.notes
        table.append(row)
    out: dict[str, Any] = {
        "experiment_id": experiment.id,
        "job": {k: values[k] for k in raw if k != "number_gpus"},  # the properties given, parsed (not the GPUs)
        "gpu_model": values["gpu_model"],
        "gpus_per_node": gpus_per_node,
        "max_gpus": max_gpus,
        "batch_size": int(values["batch_size"]),
        "max_gpus_tried": tried[-1],
        "max_oom_risk": max_oom_risk,
        **_price(values["gpu_model"], options.price_per_gpu_hour),
        "minimum": _picked(experiment, common, minimum),
        "fastest": _picked(experiment, common, speed["fastest"]),
        "cheapest": _picked(experiment, common, speed["cheapest"]),
        "largest": _picked(experiment, common, speed["largest"]),
        "methods": table,
        "notes": job_notes,
    }
    if minimum is None:
        out["diagnosis"] = diagnose(experiment, values, options, gpus_per_node, max_gpus)
        if options.lengths is not None:  # the job's notes have said it (_lengths_notes, at the same GPU count)
            from tunebench.plan.predictor import LENGTHS_NOTE

            notes = out["diagnosis"].get("notes") or []
            out["diagnosis"]["notes"] = [n for n in notes if not n.startswith(LENGTHS_NOTE)]
        raw_given = {k: v for k, v in raw.items() if k in entity.values}
        out["nearest"] = nearest_fit(
            experiment, raw_given, values, options, gpus_per_node, max_gpus, max_oom_risk, cli_options
        )
    return out


def _picked(experiment: Experiment, common: Mapping[str, Any], cand: Candidate | None) -> dict[str, Any] | None:
    """A recommended configuration with the id of the entity it plans (the job's properties at its GPUs,
    nodes and batch): what `tunebench run` or `plan` takes to measure or plan that configuration."""
    if cand is None:
        return None
    layout = {"number_gpus": cand.number_gpus, "batch_size": cand.batch_size}
    if cand.number_nodes > 1 or "number_nodes" in common:
        layout["number_nodes"] = cand.number_nodes
    if "distributed_backend" in common:  # a given None is planned as FSDP on several GPUs (candidate_backend)
        layout["distributed_backend"] = candidate_backend(common, cand.number_gpus)
    return {"entity_id": method_entity(experiment, {**common, **layout})[0].id, **cand.to_dict()}


def _given_gpu_count(given: Any) -> int | None:
    """A number_gpus given with a plan's entity (None: none); 0, a CPU run, has no GPU count to recommend: bad
    input."""
    from tunebench.spec.experiments import parse_value

    if given is None:
        return None
    count = parse_value("number_gpus", given)
    if count == 0:
        raise InputError(
            "number_gpus",
            "0 is a CPU run, which has no GPU count to recommend: plan it with `tunebench plan ... number_gpus=0` "
            "and find its largest batch with `tunebench max-batch MODEL number_gpus=0`",
            allowed="leave number_gpus out (recommend searches the GPU count)",
        )
    return count


def _gpu_count_note(count: int, tried: list[int]) -> str:
    """What recommend says of a number_gpus it was given: not used, and the counts it tried instead."""
    return (
        f"number_gpus={count} is not used: recommend searches the GPU count itself (tried {', '.join(map(str, tried))})"
    )


def _price(gpu_model: str, override: float | None) -> dict[str, Any]:
    """The price of one GPU-hour recommend's costs use, and its source (None: no cost)."""
    from tunebench.catalog import get_gpu
    from tunebench.plan.predictor import gpu_price

    price, source = gpu_price(get_gpu(gpu_model), override)
    return {"price_per_gpu_hour": price, "price_source": source or None}
