"""run_space: the one entry `tunebench explore` and `tunebench.api.explore` share (explore/run.py)."""

from __future__ import annotations

import socket

import pytest

from tunebench import api
from tunebench.errors import InputError
from tunebench.explore.run import run_space
from tunebench.explore.space import parse_space
from tunebench.store import Store

SPACE = {
    "experiments": [{"id": "finetune_full_benchmark-v1.0.0"}],
    "entity_space": {
        "model_name": ["smollm2-135m"],
        "number_gpus": 0,
        "model_max_length": [128, 256],
        "batch_size": [0, 1, 2],
    },
    "actuator": {"name": "noop"},
    "operation": {"sampler": "grid"},
    "execution": {"max_parallel": 2, "max_retries": 0},
}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


def test_run_space_measures_every_point_with_the_space_files_execution(tmp_path):
    path = tmp_path / "s.db"
    summary = run_space(parse_space(SPACE), str(path))
    assert (summary.total, summary.done, summary.failed) == (6, 6, 0)
    assert summary.rules == 2  # batch_size 0 breaks a validity rule: recorded invalid without running
    with Store(path) as store:
        assert store.counts(summary.operation_id) == {"valid": 4, "invalid": 2}
    again = run_space(parse_space(SPACE), str(path))  # resumed: every point is memoised
    assert (again.operation_id, again.measured, again.memoised) == (summary.operation_id, 0, 6)


def test_bad_options_and_unreachable_trackers_are_errors_before_the_store_is_created(tmp_path):
    path = tmp_path / "s.db"
    with pytest.raises(InputError) as bad:
        run_space(parse_space({**SPACE, "actuator": {"name": "measure", "timeout_seconds": -1}}), str(path))
    assert bad.value.field.startswith("actuator")
    track = f"mlflow:http://127.0.0.1:{_closed_port()}"
    with pytest.raises(InputError, match="cannot reach the MLflow tracking server") as unreachable:
        run_space(parse_space({**SPACE, "track": track}), str(path))
    assert unreachable.value.field == "track"
    with pytest.raises(InputError, match="cannot reach") as named:
        run_space(parse_space(SPACE | {"track": track}), str(path), track_field="--track")
    assert named.value.field == "--track"
    with pytest.raises(InputError, match="cannot reach"):  # the API goes through the same entry
        api.explore({**SPACE, "track": track}, store=str(path))
    assert not path.exists()  # nothing written


def test_the_api_explores_as_run_space_does(tmp_path):
    api_summary = api.explore(SPACE, store=str(tmp_path / "api.db"), max_parallel=1)
    direct = run_space(parse_space(SPACE), str(tmp_path / "direct.db"), max_parallel=1)
    assert api_summary.operation_id == direct.operation_id
    assert (api_summary.total, api_summary.valid, api_summary.invalid) == (direct.total, direct.valid, direct.invalid)
