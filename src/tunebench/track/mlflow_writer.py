"""TrackedRuns into MLflow, through MLflow's own client (``MlflowClient``): a tracking server or a local store.

One MLflow experiment per tracker experiment name (created on first use; a local ``sqlite:///`` store
gets its artifacts in ``artifacts/`` beside the database file, never in the working directory). A run is
created with its name, its identity tags and its start time; params, metrics (step metrics at their
steps, with their times) and tags go in batches of MLflow's own limits; the worker logs are artifacts;
the tag ``tunebench.complete`` is set last, then the run ends (FINISHED, or FAILED for a failed
measurement). A run found without that tag (a write that was interrupted) is deleted and written again,
so a re-export never leaves a half run nor makes a second one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tunebench.errors import InputError, one_line, shown
from tunebench.secrets import mask_secrets
from tunebench.spec.properties import render_value
from tunebench.track.runs import PREFIX, TrackedRun, series_points
from tunebench.track.targets import MLFLOW_URIS, Target, sqlite_file

KEY_TAG, COMPLETE_TAG = PREFIX + "result_key", PREFIX + "complete"
# MLflow's settings while tunebench calls it: the check fails fast; a server that dies mid-run costs ~15 s per
# result, not minutes of retries; no "View run ... at" lines on stdout (it carries tunebench's own output, JSON)
QUIET = {"MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
CHECK_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10", **QUIET}
WRITE_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3", "MLFLOW_HTTP_REQUEST_TIMEOUT": "60", **QUIET}
PAGE = 1000  # runs per search page while reading which results an experiment already holds


class MlflowWriter:
    """Writes TrackedRuns to the MLflow tracking URI of a Target."""

    def __init__(self, target: Target, field: str = "--track"):
        from mlflow.tracking import MlflowClient

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # its INFO lines (tables created, ...) are noise here
        self.target, self.uri, self.field = target, target.location, field
        self.database = sqlite_file(self.uri)
        if self.database is not None:
            _check_database(self.database, self.uri, field)
        try:  # MLflow opens its model registry here: a URI it cannot use fails now, not in check()
            with _env(CHECK_ENV):
                self.client = MlflowClient(tracking_uri=self.uri)
        except Exception as exc:
            raise InputError(
                field, f"mlflow tracking URI {shown(mask_secrets(self.uri))} cannot be used: {_why(exc)}", MLFLOW_URIS
            ) from None
        self._experiments: dict[str, str] = {}  # name -> id
        self._runs: dict[str, dict[str, tuple[str, bool]]] = {}  # experiment id -> result key -> (run id, complete)

    def check(self) -> None:
        """Reach the tracking server (or open the local store, creating its tables) before anything is
        measured; InputError naming the field when it cannot be used."""
        if self.database is not None:
            self.database.parent.mkdir(parents=True, exist_ok=True)
        try:
            with _env(CHECK_ENV):
                self.client.search_experiments(max_results=1)
        except Exception as exc:
            what = "reach the MLflow tracking server" if self.target.remote else "open the MLflow tracking store"
            raise InputError(self.field, f"cannot {what} {mask_secrets(self.uri)}: {_why(exc)}") from None

    def has(self, run: TrackedRun) -> bool:
        """Whether the experiment holds a complete run of this result (an interrupted one does not count); its
        requests under the write settings too (MLflow's own, 7 retries and 120 s each, cost a dead server
        minutes per result)."""
        with _env(WRITE_ENV):
            found = self._known(self._experiment(run.experiment)).get(run.key)
        return found is not None and found[1]

    def write(self, run: TrackedRun) -> str:
        """Create the run (after deleting an interrupted one of the same result); returns its run id."""
        from mlflow.entities import Metric, Param, RunTag
        from mlflow.utils.validation import MAX_METRICS_PER_BATCH, MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        with _env(WRITE_ENV):
            experiment_id = self._experiment(run.experiment)
            known = self._known(experiment_id)
            if run.key in known:
                self.client.delete_run(known.pop(run.key)[0])
            end_ms = _ms(run.end_s)
            start_ms = _ms(run.start_s) if run.start_s is not None else end_ms
            created = self.client.create_run(
                experiment_id, start_time=start_ms, run_name=run.name, tags={KEY_TAG: run.key}
            )
            run_id = created.info.run_id
            known[run.key] = (run_id, False)
            params = [Param(k, _param(v)[:MAX_PARAM_VAL_LENGTH]) for k, v in run.params.items()]
            tags = [RunTag(k, v) for k, v in run.tags.items()]
            metrics = [Metric(k, v, end_ms, 0) for k, v in run.metrics.items()]
            metrics += [
                Metric(name, value, start_ms + round(t * 1000) if t is not None else end_ms, step)
                for name, step, t, value in series_points(run.series)
            ]
            for i in range(0, len(params), MAX_PARAMS_TAGS_PER_BATCH):
                self.client.log_batch(run_id, params=params[i : i + MAX_PARAMS_TAGS_PER_BATCH])
            for i in range(0, len(tags), MAX_PARAMS_TAGS_PER_BATCH):
                self.client.log_batch(run_id, tags=tags[i : i + MAX_PARAMS_TAGS_PER_BATCH])
            for i in range(0, len(metrics), MAX_METRICS_PER_BATCH):
                self.client.log_batch(run_id, metrics=metrics[i : i + MAX_METRICS_PER_BATCH])
            for name, path in run.logs:
                folder = str(Path(name).parent)
                self.client.log_artifact(run_id, str(path), artifact_path=None if folder == "." else folder)
            if not run.logs and run.log_tail:
                with tempfile.TemporaryDirectory(prefix="tunebench-track-") as tmp:
                    tail = Path(tmp) / "worker.log.tail"
                    tail.write_text(run.log_tail)
                    self.client.log_artifact(run_id, str(tail))
            self.client.set_tag(run_id, COMPLETE_TAG, "1")
            self.client.set_terminated(run_id, "FAILED" if run.status == "failed" else "FINISHED", end_time=end_ms)
            known[run.key] = (run_id, True)
        return run_id

    def close(self) -> None:
        """Nothing to release: every call above is a complete request."""

    @staticmethod
    def reason(exc: BaseException) -> str:
        """Why a request failed, in a few words where the failure is a known one (REASONS)."""
        return _why(exc)

    def _experiment(self, name: str) -> str:
        """The id of the experiment name (created, or restored from MLflow's trash, on first use)."""
        if name in self._experiments:
            return self._experiments[name]
        found = self.client.get_experiment_by_name(name)
        if found is None:
            location = None
            if self.database is not None:  # a local store: artifacts beside it, not in ./mlruns
                folder = name.replace(" ", "-").replace("/", "-")
                location = (self.database.parent / "artifacts" / folder).absolute().as_uri()
            experiment_id = self.client.create_experiment(
                name, artifact_location=location, tags={PREFIX + "experiment": name}
            )
        else:
            experiment_id = found.experiment_id
            if found.lifecycle_stage == "deleted":
                self.client.restore_experiment(experiment_id)
        self._experiments[name] = experiment_id
        return experiment_id

    def _known(self, experiment_id: str) -> dict[str, tuple[str, bool]]:
        """result key -> (run id, complete) of the experiment's runs written by tunebench (read once)."""
        if experiment_id not in self._runs:
            from mlflow.entities import ViewType

            known: dict[str, tuple[str, bool]] = {}
            token = None
            while True:
                page = self.client.search_runs(
                    [experiment_id],
                    filter_string=f"tags.`{KEY_TAG}` LIKE '%'",
                    run_view_type=ViewType.ACTIVE_ONLY,
                    max_results=PAGE,
                    page_token=token,
                )
                for found in page:
                    tags = found.data.tags
                    key = tags[KEY_TAG]
                    if not known.get(key, ("", False))[1]:
                        known[key] = (found.info.run_id, tags.get(COMPLETE_TAG) == "1")
                token = page.token
                if not token:
                    break
            self._runs[experiment_id] = known
        return self._runs[experiment_id]


def _check_database(path: Path, uri: str, field: str) -> None:
    """InputError naming field when the file of a sqlite:/// tracking URI exists and is not an SQLite database
    (MLflow would fail deep inside SQLAlchemy) or is a directory."""
    from tunebench.store.db import SQLITE_HEADER

    shown_uri = shown(mask_secrets(uri))
    if path.is_dir():
        raise InputError(field, f"mlflow tracking URI {shown_uri}: {str(path)!r} is a directory", MLFLOW_URIS)
    if path.is_file():
        with path.open("rb") as f:
            header = f.read(len(SQLITE_HEADER))
        if header and header != SQLITE_HEADER:
            raise InputError(
                field, f"mlflow tracking URI {shown_uri}: {str(path)!r} is not an SQLite database", MLFLOW_URIS
            )


def _param(value: Any) -> str:
    return "None" if value is None else render_value(value)


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


# what a connection failure says deep inside the text of MLflow's error (requests' and urllib3's wording), an
# HTTP status its REST client refuses, and MLflow 3's refusal of a directory (file) store (maintenance mode)
REASONS = (("Connection refused", "connection refused"), ("Name or service not known", "unknown host"),
           ("Failed to resolve", "unknown host"), ("timed out", "timed out"), ("Read timed out", "timed out"),
           ("CERTIFICATE_VERIFY_FAILED", "TLS certificate verification failed"),
           ("WRONG_VERSION_NUMBER", "TLS handshake failed: the server speaks plain HTTP (http://, not https://?)"),
           # MLflow's REST client on a status that is not 200 (mlflow.utils.rest_utils.verify_rest_response)
           ("failed with error code 401", "HTTP 401: not authenticated (MLFLOW_TRACKING_USERNAME and "
            "MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN)"),
           ("failed with error code 403", "HTTP 403: forbidden (the user lacks permission)"),
           ("failed with error code 404", "HTTP 404 for MLflow's REST API /api/2.0/mlflow/: no tracking server at "
            "this URL (its root, without a path?)"),
           ("filesystem tracking backend", "this MLflow keeps no runs in a directory unless MLFLOW_ALLOW_FILE_STORE=true;"
            " sqlite:///FILE.db is its successor"))  # fmt: skip


def _why(exc: BaseException) -> str:
    """Why MLflow failed, in a few words when it is a known connection failure, else its first line (cut)."""
    text = str(exc).strip()
    for needle, reason in REASONS:
        if needle in text:
            return reason
    text = one_line(text.splitlines()[0] if text else type(exc).__name__)
    return text if len(text) <= 300 else text[:299] + "…"


@contextlib.contextmanager
def _env(values: dict[str, str]) -> Iterator[None]:
    """MLflow's HTTP settings for the block (it reads them from the environment at each request); a value
    the user set is kept."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update({k: v for k, v in values.items() if old[k] is None})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
