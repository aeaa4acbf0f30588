"""tunebench from Python (a notebook): plan a DataFrame of entities, run an exploration, read results.

    import pandas as pd
    from tunebench import api

    jobs = pd.DataFrame({"model_name": ["llama3.1-8b"] * 2, "number_gpus": 1, "gpu_model": "NVIDIA-A100-SXM4-80GB",
                         "model_max_length": [2048, 8192], "batch_size": 8})
    plans = api.plan(jobs, "finetune_lora_benchmark-v1.0.0")   # one row per entity, predictions as columns
    rec = api.recommend("finetune_full_benchmark-v1.0.0", {"model_name": "llama3.1-70b", "batch_size": 16,
                        "gpu_model": "H100"})                    # as `tunebench recommend --json`
    summary = api.explore("space.yaml", store="runs.db")       # the explorer, as `tunebench explore`
    frame = api.results("runs.db", operation=summary.operation_id)
    curves = api.series(int(frame["result_id"].iloc[0]), store="runs.db")  # per GPU, process and step

Bad input raises tunebench.errors.InputError naming the field (and, for plan, the row). See docs/api.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunebench.spec.properties import NODE_GPUS

if TYPE_CHECKING:
    import pandas as pd

    from tunebench.explore.explorer import Summary
    from tunebench.store import Store

DEFAULT_EXPERIMENT = "finetune_full_benchmark-v1.0.0"  # full fine-tuning: plan's default, stated in its signature
# what plan() adds from a prediction's metadata (memory in GiB per GPU, time in seconds, cost per currency unit), after
# its verdict and fits (the verdict at max_oom_risk, as `tunebench plan --json` gives them)
PLAN_DETAILS = ("oom_probability", "required_gib", "usable_gib", "capacity_gib", "headroom_gib",
                "peak_phase", "step_seconds", "steps", "mfu", "tokens_per_sample", "gpu_hours", "cost", "host_memory_gib")  # fmt: skip


def plan(
    entities: pd.DataFrame | Iterable[Mapping[str, Any]],
    experiment: str = "finetune_full_benchmark-v1.0.0",
    *,
    parameters: Mapping[str, Any] | None = None,
    calibration: str | Path | None = None,
    price_per_gpu_hour: float | None = None,
    network_gbps: float | None = None,
    host_memory_gib: float | None = None,
    avg_tokens: float | None = None,
    lengths: str | Path | None = None,
    max_oom_risk: float | None = None,
) -> pd.DataFrame:
    """The planner's prediction of every entity (a row of KEY=VALUE properties), as a DataFrame.

    experiment: the experiment id; left out, FULL fine-tuning (finetune_full_benchmark-v1.0.0), every
    weight trained. Pass "finetune_lora_benchmark-v1.0.0" or "finetune_qlora_benchmark-v1.0.0" for
    LoRA or QLoRA (`tunebench experiments` lists them). Each input row is an entity (spec property names as columns; an empty cell or NaN leaves a
    property at its default; an ``experiment`` column overrides the experiment per row). The result
    keeps the input's index and columns and adds: experiment_id, entity_id, status (valid | invalid),
    is_valid, reasons (``; ``-joined), every predicted property (tunebench.plan.PREDICTED: peak
    memory in GiB per GPU, tokens/s, runtime s, ...) whether or not the job fits, verdict (fits; risky: it
    fits at an out-of-memory probability above max_oom_risk, default 0.10 as in recommend(); OOM; invalid;
    failed: the planner could not size it), fits (the verdict is fits) and PLAN_DETAILS.
    Cost is in USD at the GPU catalog's list price unless price_per_gpu_hour is given. Your data's sample
    lengths (tunebench.plan.lengths): avg_tokens (mean tokens per sample) or lengths (a JSON-lines file
    of samples, counted with each model's tokenizer) set time, throughput and cost; peak memory still
    sizes the longest sample (model_max_length with avg_tokens). Vectorised (predict_many): 100,000 rows
    take seconds.
    """
    import pandas as pd

    from tunebench.errors import InputError
    from tunebench.inputs import parse
    from tunebench.plan import PREDICTED, load_calibration, predict_many
    from tunebench.plan.options import PlannerOptions
    from tunebench.plan.predictor import result_verdict
    from tunebench.plan.recommend import DEFAULT_MAX_OOM_RISK

    risk = parse(
        PlannerOptions, max_oom_risk=DEFAULT_MAX_OOM_RISK if max_oom_risk is None else max_oom_risk
    ).max_oom_risk
    from tunebench.spec.experiments import get_experiment, make_entity

    frame = entities if isinstance(entities, pd.DataFrame) else pd.DataFrame(list(entities))
    options: dict[str, Any] = {
        "price_per_gpu_hour": price_per_gpu_hour,
        "network_gbps": network_gbps,
        "host_memory_gib": host_memory_gib,
        "lengths": _lengths(avg_tokens, lengths),
    }
    if calibration is not None:
        options["calibration"] = load_calibration(calibration)
    experiments: dict[str, Any] = {experiment: get_experiment(experiment, dict(parameters or {}))}
    items = []
    for n, (index, row) in enumerate(zip(frame.index, frame.to_dict("records"))):
        name = row.pop("experiment", None) or experiment
        try:
            if name not in experiments:
                experiments[name] = get_experiment(str(name), dict(parameters or {}))
            values = {k: _plain(v) for k, v in row.items() if not _missing(v)}
            items.append((experiments[name], make_entity(experiments[name], values)))
        except InputError as exc:
            raise InputError(f"row {index!r} (#{n}): {exc.field}", exc.message, exc.allowed) from None
    results = predict_many(items, **{k: v for k, v in options.items() if v is not None}) if items else []
    records = []
    for result in results:
        meta = result.metadata
        predicted = meta.get("predicted") or {}
        records.append(
            {
                "experiment_id": result.experiment_id,
                "entity_id": result.entity_id,
                "status": result.status,
                "is_valid": result.status == "valid",
                "reasons": "; ".join(result.reasons) or (result.error or ""),
                **{p: predicted.get(p) for p in PREDICTED},
                "verdict": (verdict := result_verdict(result, risk)),
                "fits": verdict == "fits",
                **{k: meta.get(k) for k in PLAN_DETAILS},
            }
        )
    added = pd.DataFrame.from_records(records, index=frame.index, columns=_plan_columns(PREDICTED))
    return pd.concat([frame.drop(columns=[c for c in added.columns if c in frame.columns]), added], axis=1)


def recommend(
    experiment: str,
    entity: Mapping[str, Any],
    *,
    parameters: Mapping[str, Any] | None = None,
    gpus_per_node: int = NODE_GPUS,
    max_gpus: int = 64,
    max_oom_risk: float | None = None,
    calibration: str | Path | None = None,
    price_per_gpu_hour: float | None = None,
    network_gbps: float | None = None,
    avg_tokens: float | None = None,
    lengths: str | Path | None = None,
    host_memory_gib: float | None = None,
) -> dict[str, Any]:
    """What `tunebench recommend --json` prints, as a dict: the fewest GPUs that fit (``minimum``), the
    ``fastest`` and ``cheapest`` (batch, GPUs), the fastest on the largest GPU count (``largest``) and a
    per-method table (``methods``); where nothing fits, ``diagnosis`` (the largest memory component at
    the largest GPU count tried) and ``nearest`` (the first change that fits, with its command).

    entity: property -> value (gpu_model needed; number_gpus is what it searches: a count given is not used,
    which ``notes`` says, and 0, a CPU run, is an InputError). A configuration fits when its out-of-memory
    probability is at most max_oom_risk (default tunebench.plan.recommend.DEFAULT_MAX_OOM_RISK, 0.10).
    Memory in GiB per GPU, time in seconds, cost per currency unit of price_per_gpu_hour (default: the GPU
    catalog's list price, USD). avg_tokens / lengths: your data's sample lengths, as in plan();
    host_memory_gib: each node's RAM, checked against what offload keeps there (and a CPU run's memory),
    as in plan().
    """
    from tunebench.inputs import parse
    from tunebench.plan import load_calibration
    from tunebench.plan.options import PlannerOptions, check_recommend
    from tunebench.plan.predictor import PlanOptions
    from tunebench.plan.recommend import DEFAULT_MAX_OOM_RISK
    from tunebench.plan.recommend import recommend as run
    from tunebench.spec.experiments import get_experiment
    from tunebench.spec.results import finite

    check_recommend(gpus_per_node, max_gpus)
    risk = parse(
        PlannerOptions,
        price=price_per_gpu_hour,
        network=network_gbps,
        host_memory=host_memory_gib,
        max_oom_risk=DEFAULT_MAX_OOM_RISK if max_oom_risk is None else max_oom_risk,
    ).max_oom_risk
    options = PlanOptions(
        calibration=load_calibration(calibration),
        price_per_gpu_hour=price_per_gpu_hour,
        network_gbps=network_gbps,
        host_memory_gib=host_memory_gib,
        lengths=_lengths(avg_tokens, lengths),
    )
    exp = get_experiment(experiment, dict(parameters or {}))
    out = run(exp, dict(entity), options, gpus_per_node=gpus_per_node, max_gpus=max_gpus, max_oom_risk=risk)
    return finite(out)


def _lengths(avg_tokens: float | None, lengths: str | Path | None) -> Any:
    """plan.lengths.UserLengths of avg_tokens or a lengths file (InputError naming avg_tokens / lengths)."""
    from tunebench.errors import InputError
    from tunebench.inputs import parse
    from tunebench.plan.options import PlannerOptions, user_lengths

    path = Path(lengths) if lengths is not None else None
    try:
        parse(PlannerOptions, avg_tokens=avg_tokens, lengths=path)
        return user_lengths(avg_tokens, path)
    except InputError as exc:  # named as this function's arguments, not as the command's options
        field = exc.field.replace("--avg-tokens", "avg_tokens").replace("--lengths", "lengths")
        raise InputError(
            field, exc.message.replace("--avg-tokens", "avg_tokens").replace("--lengths", "lengths"), exc.allowed
        ) from None


def _plan_columns(predicted: Iterable[str]) -> list[str]:
    return ["experiment_id", "entity_id", "status", "is_valid", "reasons", *predicted, "verdict", "fits", *PLAN_DETAILS]


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value == ""


def _plain(value: Any) -> Any:
    """numpy scalars as Python values, 512.0 as 512 (pandas makes int columns with gaps float)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def explore(
    space: str | Path | Mapping[str, Any],
    *,
    store: str | Store | None = None,
    actuator: str | None = None,
    executor: str | None = None,
    max_parallel: int | None = None,
    max_retries: int | None = None,
    remeasure: bool = False,
    allow_actuator_import: bool = False,
) -> Summary:
    """Run (or resume) a space's operation, as `tunebench explore` does; returns its Summary.

    space: a space file's path, or its content as a dict (the same schema). store: a URL, an SQLite
    path or an open Store (default: $TUNEBENCH_STORE or the user's). Options left None take the
    space file's execution section.
    """
    import dataclasses

    from tunebench.explore.run import run_space
    from tunebench.explore.space import load_space, parse_space

    spec = parse_space(dict(space)) if isinstance(space, Mapping) else load_space(space)
    if actuator:
        spec = dataclasses.replace(spec, actuator=actuator)
    return run_space(
        spec,
        store,
        executor=executor,
        max_parallel=max_parallel,
        max_retries=max_retries,
        remeasure=remeasure,
        allow_actuator_import=allow_actuator_import,
    )


def results(
    store: str | Store | None = None,
    *,
    operation: str | None = None,
    space: str | Path | None = None,
    actuator: str | None = None,
    statuses: Iterable[str] | None = None,
) -> pd.DataFrame:
    """The store's results as a DataFrame: one row per stored outcome (entity x experiment x actuator).

    Columns: request_id, result_id (the latest result of the request: ``series(result_id)`` reads its time
    series), experiment_id, base_id, entity_id, actuator, source (measured | predicted | test),
    status, outcome (fits | out of memory | invalid by rule | invalid | failed), reason, one column per
    entity property (an experiment's default where the entity left it out), one per measured
    property. Filters: an operation id (op-...), a space file's points, an actuator, statuses.
    """
    from tunebench.report.data import space_points, tidy

    opened = _open(store, create=False)
    try:
        rows = opened.rows(
            operation_id=operation, actuator=actuator, statuses=list(statuses) if statuses is not None else None
        )
    finally:
        if opened is not store:
            opened.close()
    if space is not None:
        points = space_points(Path(space))[0]
        rows = [r for r in rows if (r["experiment_id"], r["entity_id"]) in points]
    frame = tidy(rows)
    return frame.drop(columns=[c for c in frame.columns if c.startswith("_")])


def series(result_id: int, *, store: str | Store | None = None) -> pd.DataFrame:
    """The time series of one stored result in long format: columns series (gpu0.compute_utilization,
    gpu0.memory_used_gib, process.cpu_percent, train.loss, ...: docs/explore.md lists them), step (the
    training step of train.* series, else <NA>), time_s (s since the run's first sample) and value.

    result_id: the result_id column of ``results()``. A result without series (a prediction, an import)
    gives an empty frame; an id the store does not hold raises InputError naming result_id.
    """
    from tunebench.errors import InputError
    from tunebench.store.series import UnknownResult, read_series

    if isinstance(result_id, bool) or not hasattr(result_id, "__index__"):
        raise InputError("result_id", f"{result_id!r} is not a result id", allowed="an integer (results()'s result_id)")
    opened = _open(store, create=False)
    try:
        return read_series(opened, result_id)
    except UnknownResult as exc:
        raise InputError("result_id", f"no result {result_id!r} in the store", allowed=exc.allowed()) from None
    finally:
        if opened is not store:
            opened.close()


def _open(store: str | Store | None, *, create: bool) -> Store:
    """An open Store: the one given, or a new one at a URL/path (InputError naming --store if it cannot be)."""
    from tunebench.store import Store
    from tunebench.store.open import open_store

    return store if isinstance(store, Store) else open_store(store, create=create)
