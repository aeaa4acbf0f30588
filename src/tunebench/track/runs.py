"""What one tracker run holds, built from one stored result; the writers (mlflow_writer, aim_writer) map it.

- experiment: one per tunebench operation (``tunebench op-1a2b3c4d5e6f``); results no operation produced
  go to ``tunebench run`` (`tunebench run`) or ``tunebench import`` (imported measurements);
- name: a readable name (model, method, batch size, length, devices) and the entity id;
- params: every property of the experiment (the entity's value, else the experiment's default) and
  ``experiment_id``;
- metrics: every measured property that is a number (``is_valid`` 1/0 included); the planner's prediction
  of the same entity as ``predicted_<property>``;
- tags: ``tunebench.status`` (valid | invalid | failed), ``tunebench.is_valid``, ``tunebench.reasons``,
  ``tunebench.error``, the result's identity (``tunebench.result_id``, ``tunebench.result_key``: the
  id and the time the store recorded it, what a re-export looks up; request, operation, store, entity id)
  and its provenance (``tunebench.host``, ``tunebench.device``, ``tunebench.versions.<package>``,
  ``tunebench.notes``);
- series: the result's time series in long format (columns series, step, time_s, value): each point is
  logged at its training step, a sampled series (no step) at ``round(time_s * 1000)``, the milliseconds
  since the run's first sample, so that every series of a run shares one time axis;
- logs: the worker's log files (``worker.log`` under the result's output directory); when they are gone,
  the log tail the store kept (a failed run's last 16 kB).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunebench.errors import one_line
from tunebench.secrets import mask_secrets

if TYPE_CHECKING:
    import pandas as pd

    from tunebench.store.base import StoreBase
    from tunebench.store.stored import StoredResult

PREFIX = "tunebench."  # of every tag tunebench sets
PREDICTED_PREFIX = "predicted_"
MAX_NAME = 250  # characters of a run name: MLflow's runs.name column is VARCHAR(250)
MAX_TAG = 5000  # characters of a tag value (MLflow's limit is 8000; an error or a reason list is cut here)
MS_PER_S = 1000  # a sampled series' step: milliseconds since the run's first sample


@dataclass
class TrackedRun:
    """One tracker run, tracker-independent (see the module)."""

    key: str  # StoredResult.key: what a second export finds
    experiment: str
    name: str
    status: str  # valid | invalid | failed
    params: dict[str, Any]
    metrics: dict[str, float]
    tags: dict[str, str]
    start_s: float | None  # epoch seconds: when the measurement started (the store's time less its wall time)
    end_s: float  # when the store recorded it
    series: pd.DataFrame | None = None
    logs: list[tuple[str, Path]] = field(default_factory=list)  # (name relative to the output directory, file)
    log_tail: str | None = None  # the stored tail, when no log file is left


def series_frame(store: StoreBase, stored: StoredResult) -> pd.DataFrame:
    """The result's time series in long format (series, step, time_s, value), as the store keeps them
    (tunebench.store.series); a result stored before series were kept: its per-step training losses
    (``train_losses``, one per step: logging_steps is 1), without times."""
    from tunebench.store.series import UnknownResult, read_series

    try:
        frame = read_series(store, stored.result_id)
    except UnknownResult:
        frame = None
    return frame if frame is not None and not frame.empty else losses_frame(stored.result.metadata.get("train_losses"))


def losses_frame(losses: Any) -> pd.DataFrame:
    """A long frame of per-step losses: series ``train.loss``, steps 1..n, time_s unknown (NaN)."""
    import pandas as pd

    values = [float(v) for v in losses or () if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return pd.DataFrame(
        {
            "series": pd.Series(["train.loss"] * len(values), dtype=object),
            "step": pd.Series(range(1, len(values) + 1), dtype="Int64"),
            "time_s": pd.Series([math.nan] * len(values), dtype=float),
            "value": pd.Series(values, dtype=float),
        }
    )


def series_points(frame: pd.DataFrame | None) -> Iterator[tuple[str, int, float | None, float]]:
    """(series, step, time_s or None, value) of every point of a long frame: its training step where it has
    one, else round(time_s * 1000) (milliseconds since the first sample); points with neither are left out."""
    if frame is None or frame.empty:
        return
    import pandas as pd

    for name, step, time_s, value in zip(
        frame["series"].tolist(), frame["step"].tolist(), frame["time_s"].tolist(), frame["value"].tolist()
    ):
        t = None if time_s is None or time_s is pd.NA or math.isnan(time_s) else float(time_s)
        if step is not None and step is not pd.NA:
            yield str(name), int(step), t, float(value)
        elif t is not None:
            yield str(name), round(t * MS_PER_S), t, float(value)


def experiment_name(stored: StoredResult) -> str:
    """The tracker experiment of a result: its operation's, else `tunebench run`'s or the imports'."""
    if stored.operation_id:
        return operation_experiment(stored.operation_id)
    return "tunebench import" if stored.result.actuator == "import" else "tunebench run"


def operation_experiment(operation_id: str) -> str:
    """The tracker experiment of an operation's results."""
    return f"tunebench {operation_id}"


def run_name(stored: StoredResult) -> str:
    """A readable name and the entity id (cut in the middle, with a hash, beyond MAX_NAME characters)."""
    values = stored.entity
    model = str(values.get("model_name", "?"))
    path = Path(model)
    if path.name == "config.json":  # a model given as its config file: the directory names it
        model = path.parent.name or model
    elif "/" in model:
        model = path.name
    gpus = values.get("number_gpus", 0)
    devices = "cpu" if not gpus else f"{gpus}x{values.get('gpu_model') or 'gpu'}"
    if (values.get("number_nodes") or 1) > 1:
        devices += f" {values['number_nodes']} nodes"
    method = stored.base_id.removeprefix("finetune_").split("_")[0]
    readable = f"{model} {method} bs{values.get('batch_size', '?')} len{values.get('model_max_length', '?')} {devices}"
    name = f"{readable} | {stored.entity_id}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(stored.entity_id.encode()).hexdigest()[:8]
    room = MAX_NAME - len(readable) - len(digest) - 6
    return f"{readable} | {stored.entity_id[:room]}… {digest}"


def entity_params(stored: StoredResult) -> dict[str, Any]:
    """Every property of the experiment (the entity's value, else the experiment's default) and experiment_id;
    the entity's own values only when this tunebench does not know the experiment (an import's)."""
    from tunebench.spec.experiments import REQUIRED_PROPERTIES, get_experiment

    values = dict(stored.entity)
    try:
        experiment = get_experiment(stored.base_id, stored.parameters)
    except Exception:  # an experiment of another version (an import): its values as stored
        experiment = None
    if experiment is not None:
        for name in (*REQUIRED_PROPERTIES, *experiment.optional):
            values.setdefault(name, experiment.default(name) if name in experiment.optional else None)
    out = {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
    out["experiment_id"] = stored.experiment_id
    return out


def measured_metrics(properties: dict[str, Any]) -> dict[str, float]:
    """The measured properties that are numbers (booleans as 0/1), as floats."""
    return {k: float(v) for k, v in properties.items() if isinstance(v, (int, float)) and math.isfinite(float(v))}


def predicted_metrics(stored: StoredResult) -> dict[str, float]:
    """The planner's prediction of the result's entity (tunebench.plan.predict, the predict actuator), each
    predicted property as ``predicted_<name>`` (also where it predicts the job does not fit); ValueError with
    the planner's reasons when it predicts nothing."""
    from tunebench.plan import predict
    from tunebench.spec.experiments import get_experiment, make_entity

    experiment = get_experiment(stored.base_id, stored.parameters)
    prediction = predict(experiment, make_entity(experiment, stored.entity))
    if prediction.error:
        raise ValueError(prediction.error)
    values = prediction.metadata.get("predicted") or prediction.properties
    found = {PREDICTED_PREFIX + k: v for k, v in measured_metrics(values).items() if k != "is_valid"}
    if not found:  # e.g. an entity that breaks a rule: nothing to plan
        raise ValueError("; ".join(prediction.reasons) or "the planner predicted no property")
    return found


def result_tags(stored: StoredResult, store_url: str) -> dict[str, str]:
    """Validity (status, is_valid, reasons, error) and identity tags, empty values left out."""
    result = stored.result
    is_valid = result.properties.get("is_valid")
    tags = {
        "status": result.status,
        "is_valid": "" if is_valid is None else str(int(is_valid)),
        "reasons": "; ".join(result.reasons),
        "error": one_line(result.error or ""),
        "result_id": str(stored.result_id),
        "result_key": stored.key,
        "request_id": str(stored.request_id),
        "entity_id": stored.entity_id,
        "operation_id": stored.operation_id or "",
        "operation_name": stored.operation_name or "",
        "generator": stored.generator or "",
        "actuator": result.actuator,
        "store": mask_secrets(store_url),
        **provenance(result.metadata),
    }
    return {PREFIX + k: _cut(v) for k, v in tags.items() if v}


def provenance(meta: dict[str, Any]) -> dict[str, str]:
    """Where and with what a result was measured, from its metadata: host, device, each library's version as
    ``versions.<package>`` (the worker's, tunebench.worker.run) and the measurement's notes (caveats, e.g. a
    busy host), joined by "; "."""
    execution = meta.get("execution") if isinstance(meta.get("execution"), dict) else {}
    versions = meta.get("versions") if isinstance(meta.get("versions"), dict) else {}
    notes = meta.get("notes") if isinstance(meta.get("notes"), list) else []
    return {
        "host": str(meta.get("host") or execution.get("host") or ""),
        "device": str(meta.get("device") or ""),
        **{f"versions.{k}": str(v) for k, v in sorted(versions.items()) if v},
        "notes": one_line("; ".join(str(n) for n in notes)),
    }


def tracked_run(store: StoreBase, stored: StoredResult, *, predicted: bool) -> TrackedRun:
    """The tracker run of a stored result (predicted: with the planner's prediction; where the planner
    cannot predict the entity, the tag ``tunebench.predicted`` says why)."""
    result = stored.result
    metrics = measured_metrics(result.properties)
    tags = result_tags(stored, store.url)
    if predicted:
        try:
            metrics.update(predicted_metrics(stored))
            tags[PREFIX + "predicted"] = "planner"
        except Exception as exc:  # the measurement is tracked all the same
            why = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
            tags[PREFIX + "predicted"] = _cut(one_line(f"no prediction: {why}"))
    wall = result.metadata.get("wall_seconds")
    start = stored.created_at - wall if isinstance(wall, (int, float)) and wall >= 0 else None
    logs = _worker_logs(result.metadata.get("output_dir"))
    return TrackedRun(
        key=stored.key,
        experiment=experiment_name(stored),
        name=run_name(stored),
        status=result.status,
        params=entity_params(stored),
        metrics=metrics,
        tags=tags,
        start_s=start,
        end_s=stored.created_at,
        series=series_frame(store, stored),
        logs=logs,
        log_tail=None if logs else result.log_tail,
    )


def _worker_logs(output_dir: Any) -> list[tuple[str, Path]]:
    """(name, file) of the worker logs of a run's output directory, if still there; the name is the file's
    path under the directory (a stability run keeps one per repetition: run0/worker.log, ...)."""
    if not isinstance(output_dir, str) or not output_dir:
        return []
    root = Path(output_dir)
    try:
        found = sorted(p for p in root.rglob("worker.log") if p.is_file()) if root.is_dir() else []
    except OSError:
        return []
    return [(p.relative_to(root).as_posix(), p) for p in found]


def _cut(text: str) -> str:
    return text if len(text) <= MAX_TAG else text[: MAX_TAG - 1] + "…"
