"""Measurements sent to experiment trackers, read back through the trackers' own clients.

Real trackers only: MLflow's embedded SQLite store (tunebench's default, under its home), a real
`mlflow server` on 127.0.0.1 (started here on a free port, stopped after), a real Aim repository in a
temporary directory. The measurement is a real CPU `tunebench run` of a tiny Llama built from its
config (random weights, nothing downloaded); what each tracker holds is compared with what the store
holds, read through the store's own reads.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import yaml
from layout import SRC as LAYOUT_SRC
from sqlalchemy import select, update
from tiny_models import TINY_LLAMA

from tunebench.commands.main import main
from tunebench.errors import InputError
from tunebench.explore.space import parse_space
from tunebench.spec.experiments import REQUIRED_PROPERTIES, get_experiment, make_entity
from tunebench.spec.properties import render_value
from tunebench.spec.results import Result
from tunebench.store import Store
from tunebench.store.rows import Record
from tunebench.store.schema import results
from tunebench.track.targets import Target, default_location

SRC = str(LAYOUT_SRC)
LORA = "finetune_lora_benchmark-v1.0.0"
PARAMS = ["-p", "max_steps=3", "-p", "dataset_id=news-chars-256-entries-32", "-p", "gradient_accumulation_steps=1"]
SERVERS: dict[str, subprocess.Popen] = {}  # url -> the `mlflow server` process of the fixture
# invalid by rule (batch 3 over 2 GPUs): `run` records it at once, without training
INVALID = ["model_name=smollm2-135m", "model_max_length=64", "number_gpus=2", "batch_size=3"]


# ------------------------------------------------------------------------------------------ helpers


@dataclass
class Measured:
    root: Path
    home: Path
    store: Path
    aim: Path
    stderr: str

    @property
    def mlflow_uri(self) -> str:
        return f"sqlite:///{self.home / 'mlflow' / 'mlflow.db'}"


@dataclass
class Held:
    """What the store holds of one result, read through the store's own reads (not tunebench.track's)."""

    result_id: int
    row: dict
    metadata: dict

    def params(self) -> dict:
        """Every property of the experiment (the entity's value, else its default) and experiment_id."""
        exp = get_experiment(self.row["base_id"], self.row["parameters"])
        names = (*REQUIRED_PROPERTIES, *exp.optional)
        values = {n: self.row["entity"].get(n, exp.default(n) if n in exp.optional else None) for n in names}
        return {**values, "experiment_id": self.row["experiment_id"]}

    def predicted(self, home: Path) -> dict:
        """The planner's prediction of the entity as a process with that tunebench home makes it: a CPU entity's
        rate is this host's training rate, measured once per home (plan.host's cache), so that home's is used,
        as the run found it: nothing measured now (host_busy), or an entity probe the run skipped on a busy host
        (the suite's other worker) would be measured here and the rates differ (7x on a loaded 2-core VM)."""
        from tunebench.plan import host, predict

        exp = get_experiment(self.row["base_id"], self.row["parameters"])
        saved, busy = dict(host._MEMO), host.host_busy
        host._MEMO.clear()
        host._MEMO.update(json.loads((home / host.CACHE_FILE).read_text()))
        host.host_busy = lambda: True
        try:
            found = predict(exp, make_entity(exp, self.row["entity"])).metadata["predicted"]
        finally:
            host.host_busy = busy
            host._MEMO.clear()
            host._MEMO.update(saved)
        return {f"predicted_{k}": v for k, v in found.items() if v is not None and math.isfinite(v)}


def held(store_path: Path) -> list[Held]:
    with Store(store_path) as store:
        rows = store.rows()
        with store.engine.connect() as conn:
            ids = dict(conn.execute(select(results.c.request_id, results.c.id)).all())
        return [Held(ids[r["request_id"]], r, store.results_of(r["request_id"])[-1].metadata) for r in rows]


def as_mlflow_params(params: dict) -> dict:
    return {k: "None" if v is None else render_value(v) for k, v in params.items()}


def as_aim_params(params: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in params.items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(*args: str, home: Path | None = None) -> subprocess.CompletedProcess:
    """tunebench in its own process (its stderr is the user's view: warnings, errors)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    if home is not None:
        env["TUNEBENCH_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "tunebench", *args], env=env, capture_output=True, text=True, timeout=900
    )


def mlflow_runs(uri: str, experiment: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    return [] if found is None else client.search_runs([found.experiment_id])


def aim_runs(repo_path: Path) -> list:
    from aim import Repo, Run

    repo = Repo(str(repo_path))
    return [Run(h, repo=repo, read_only=True) for h in sorted(repo.list_all_runs())]


def aim_metrics(run) -> dict[str, pd.DataFrame]:
    return {m.name: m.dataframe().sort_values("step") for m in run.metrics()}


def check_mlflow_run(
    uri: str,
    h: Held,
    *,
    predicted: Path | None,
    experiment: str = "tunebench run",
    series: dict[str, list[tuple[int, float]]] | None = None,
) -> None:
    """The MLflow run of a stored result holds its params, metrics, tags, series and worker log (predicted: the
    home of the process that sent it with the planner's prediction; None: sent without)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    (run,) = [r for r in mlflow_runs(uri, experiment) if r.data.tags.get("tunebench.result_id") == str(h.result_id)]
    assert run.info.run_name.endswith(" | " + h.row["entity_id"])
    assert run.data.params == as_mlflow_params(h.params())
    props = h.row["properties"]
    measured = {k: v for k, v in run.data.metrics.items() if "." not in k and not k.startswith("predicted_")}
    assert measured == pytest.approx({k: float(v) for k, v in props.items()})
    if predicted:
        expected = h.predicted(predicted)
        assert expected and {k: run.data.metrics[k] for k in expected} == pytest.approx(expected)
    else:
        assert not [k for k in run.data.metrics if k.startswith("predicted_")]
    tags = run.data.tags
    assert (tags["tunebench.status"], tags["tunebench.is_valid"]) == (h.row["status"], str(props["is_valid"]))
    assert tags["tunebench.entity_id"] == h.row["entity_id"] and tags["tunebench.complete"] == "1"
    assert run.info.status == "FINISHED"
    for name, points in (series or {}).items():
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, name))
        assert_points(history, points)
    log = Path(h.metadata["output_dir"]) / "worker.log"
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["worker.log"]
    local = client.download_artifacts(run.info.run_id, "worker.log", dst_path=str(log.parent.parent / "dl"))
    assert Path(local).read_text() == log.read_text()


def check_aim_run(
    run, h: Held, *, experiment: str = "tunebench run", series: dict[str, list[tuple[int, float]]] | None = None
) -> None:
    """The Aim run of a stored result holds its hparams, metrics, tags, series and worker log."""
    assert run.experiment == experiment and run.name.endswith(" | " + h.row["entity_id"])
    assert run["hparams"] == as_aim_params(h.params())
    attrs = run["tunebench"]
    assert (attrs["result_id"], attrs["status"], attrs["complete"]) == (str(h.result_id), h.row["status"], True)
    assert run.props.tags == [h.row["status"]]
    metrics = aim_metrics(run)
    for name, value in h.row["properties"].items():
        assert metrics[name]["value"].tolist() == pytest.approx([float(value)]), name
    for name, points in (series or {}).items():
        frame = metrics[name]
        assert_points(list(zip(frame["step"].astype(int).tolist(), frame["value"].tolist())), points)
    artifact = run.artifacts["worker.log"]
    log = Path(h.metadata["output_dir"]) / "worker.log"
    assert Path(artifact.uri.removeprefix("file://")).read_text() == log.read_text()


def assert_points(found: list[tuple[int, float]], expected: list[tuple[int, float]]) -> None:
    """The same steps, the same values (as floats)."""
    assert [s for s, _ in found] == [s for s, _ in expected]
    assert [v for _, v in found] == pytest.approx([v for _, v in expected])


def losses(h: Held) -> list[tuple[int, float]]:
    return list(enumerate(h.metadata["train_losses"], 1))


# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Measured:
    """One real CPU `tunebench run`, stored, then sent to MLflow (the default: the embedded store under
    tunebench's home) and to an Aim repository."""
    root = tmp_path_factory.mktemp("track")
    model = root / "tiny-llama" / "config.json"
    model.parent.mkdir()
    model.write_text(json.dumps(TINY_LLAMA))
    m = Measured(root, root / "home", root / "s.db", root / "aim", "")
    done = cli(
        "run",
        LORA,
        *PARAMS,
        f"model_name={model}",
        "model_max_length=192",
        "number_gpus=0",
        "batch_size=4",
        "target_modules=q_proj,v_proj",
        "--weights",
        "random",
        "--store",
        str(m.store),
        "--track",
        "mlflow",
        "--track",
        f"aim:{m.aim}",
        home=m.home,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    m.stderr = done.stderr
    return m


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` (SQLite backend, artifacts proxied into a folder) on a free local port."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    log = open(root / "server.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{root / 'server.db'}",
            "--artifacts-destination",
            str(root / "artifacts"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=root,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300  # the server's first start creates its tables: a minute on 2 busy cores
    try:
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not start: {(root / 'server.log').read_text()[-3000:]}")
            time.sleep(1)
        SERVERS[url] = proc
        yield url
    finally:
        with_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with_group(proc, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()


def with_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the server's own workers too (it runs in its own session)
    except ProcessLookupError:
        pass


# ------------------------------------------------------------------------- a CPU run, tracked (slow)


@pytest.mark.slow
def test_run_is_in_the_embedded_mlflow_store(measured, monkeypatch):
    (h,) = held(measured.store)
    assert h.row["status"] == "valid" and h.metadata["train_losses"]
    monkeypatch.setenv("TUNEBENCH_HOME", str(measured.home))
    assert default_location("mlflow") == measured.mlflow_uri  # `--track mlflow`: the store under tunebench's home
    assert (measured.home / "mlflow" / "mlflow.db").is_file()
    assert "tracked in mlflow:sqlite:///" in measured.stderr and "experiment 'tunebench run'" in measured.stderr
    check_mlflow_run(measured.mlflow_uri, h, predicted=measured.home, series={"train.loss": losses(h)})


@pytest.mark.slow
def test_run_is_in_the_aim_repository(measured):
    (h,) = held(measured.store)
    (run,) = aim_runs(measured.aim)
    check_aim_run(run, h, series={"train.loss": losses(h)})
    metrics = aim_metrics(run)
    expected = h.predicted(measured.home)
    assert {k: metrics[k]["value"].iloc[-1] for k in expected} == pytest.approx(expected)


@pytest.mark.slow
def test_run_tags_say_where_and_with_what_it_was_measured(measured):
    """Host, device, the worker's library versions (one tag each, searchable) and the measurement's notes."""
    (h,) = held(measured.store)
    versions = {k: v for k, v in h.metadata["versions"].items() if v}
    assert {"python", "torch", "transformers", "peft"} <= set(versions)
    (run,) = mlflow_runs(measured.mlflow_uri, "tunebench run")
    tags = run.data.tags
    prefix = "tunebench.versions."
    assert {k.removeprefix(prefix): v for k, v in tags.items() if k.startswith(prefix)} == versions
    assert (tags["tunebench.host"], tags["tunebench.device"]) == (h.metadata["host"], "cpu")
    assert tags.get("tunebench.notes", "") == "; ".join(h.metadata.get("notes", []))
    from mlflow.tracking import MlflowClient

    torch = versions["torch"]
    found = MlflowClient(measured.mlflow_uri).search_runs(
        [run.info.experiment_id], filter_string=f"tags.`{prefix}torch` = '{torch}'"
    )
    assert [r.info.run_id for r in found] == [run.info.run_id]
    (aim_run,) = aim_runs(measured.aim)
    assert aim_run["tunebench"]["versions.torch"] == torch and aim_run["tunebench"]["host"] == h.metadata["host"]


@pytest.mark.slow
def test_export_after_run_creates_no_duplicate(measured):
    """`track export` of a store `run --track` already sent: the runs are found by their result id."""
    for to, where in (("mlflow", []), ("aim", ["--uri", str(measured.aim)])):
        done = cli("track", "export", "--to", to, *where, "--store", str(measured.store), home=measured.home)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().endswith(": 0 runs created, 1 already there")
    assert len(mlflow_runs(measured.mlflow_uri, "tunebench run")) == 1
    assert len(aim_runs(measured.aim)) == 1


@pytest.mark.slow
def test_series_of_the_run_go_in_at_their_steps(measured, tmp_path, monkeypatch):
    """A long frame (the store's per-result series format) built from the run's per-step losses plus a sampled
    series without steps: losses at their training steps, samples at milliseconds since the first sample;
    exported twice to a fresh MLflow store and a fresh Aim repository, each holds one run."""
    import tunebench.track.runs as runs

    (h,) = held(measured.store)
    loss = h.metadata["train_losses"]
    frame = pd.DataFrame(
        {
            "series": ["train.loss"] * len(loss) + ["process.rss_gib"] * 3,
            "step": pd.array([*range(1, len(loss) + 1), None, None, None], dtype="Int64"),
            "time_s": [0.4 * i for i in range(1, len(loss) + 1)] + [0.0, 0.5, 1.25],
            "value": [*loss, 1.5, 1.75, 1.625],
        }
    )
    monkeypatch.setattr(runs, "series_frame", lambda store, stored: frame)
    series = {"train.loss": losses(h), "process.rss_gib": [(0, 1.5), (500, 1.75), (1250, 1.625)]}
    uri, aim = f"sqlite:///{tmp_path / 'm.db'}", tmp_path / "aim"
    for _ in range(2):
        assert main(["track", "export", "--to", "mlflow", "--uri", uri, "--store", str(measured.store)]) == 0
        assert main(["track", "export", "--to", "aim", "--uri", str(aim), "--store", str(measured.store)]) == 0
    check_mlflow_run(uri, h, predicted=None, series=series)
    from mlflow.tracking import MlflowClient

    (run,) = mlflow_runs(uri, "tunebench run")
    start = run.info.start_time  # the measurement's start: the store's time less its wall time
    history = MlflowClient(uri).get_metric_history(run.info.run_id, "process.rss_gib")
    assert sorted(m.timestamp - start for m in history) == [0, 500, 1250]
    (aim_run,) = aim_runs(aim)
    check_aim_run(aim_run, h, series=series)


@pytest.mark.slow
def test_mlflow_tracking_server(measured, mlflow_server):
    """`track export` to a real tracking server, twice: one run, equal to the store's result."""
    (h,) = held(measured.store)
    for created in ("1 runs created, 0 already there", "0 runs created, 1 already there"):
        done = cli(
            "track",
            "export",
            "--to",
            "mlflow",
            "--uri",
            mlflow_server,
            "--store",
            str(measured.store),
            "--predicted",
            home=measured.home,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"mlflow:{mlflow_server}: {created}"
    check_mlflow_run(mlflow_server, h, predicted=measured.home, series={"train.loss": losses(h)})


# ---------------------------------------------------------------- explore: every result, failures (slow)


def explore_space(tmp_path: Path, track: list[str], **options) -> Path:
    space = {
        "experiments": [{"id": LORA, "parameters": {"max_steps": 2}}],
        "entity_space": {
            "model_name": ["smollm2-135m"],
            "model_max_length": [64, 128],
            "batch_size": [1],
            "number_gpus": [0],
        },
        "actuator": {"name": "fake_actuators:logs_and_blocks", **options},
        "track": track,
    }
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    return path


@pytest.mark.slow
def test_explore_tracks_each_result_to_a_server_and_aim(tmp_path, mlflow_server):
    path = explore_space(tmp_path, [f"mlflow:{mlflow_server}", f"aim:{tmp_path / 'aim'}"])
    done = cli(
        "explore",
        str(path),
        "--store",
        str(tmp_path / "s.db"),
        "--allow-actuator-import",
        "--json",
        home=tmp_path / "home",
    )
    assert done.returncode == 0, done.stderr
    op = json.loads(done.stdout)["operation_id"]
    stored = held(tmp_path / "s.db")
    assert len(stored) == 2
    for h in stored:
        check_mlflow_run(mlflow_server, h, predicted=tmp_path / "home", experiment=f"tunebench {op}")
    runs = {r["tunebench"]["result_id"]: r for r in aim_runs(tmp_path / "aim")}
    assert sorted(runs) == sorted(str(h.result_id) for h in stored)
    for h in stored:
        check_aim_run(runs[str(h.result_id)], h, experiment=f"tunebench {op}")


@pytest.mark.slow
def test_a_tracker_failing_mid_run_loses_no_measurement(tmp_path):
    """While measuring, the trackers' artifact folders become files: the check passed, each write fails. The
    results are stored all the same, each failure is one warning line, kept with the result; a later
    export completes the interrupted runs, one per result."""
    uri, aim = f"sqlite:///{tmp_path / 'mlflow' / 'm.db'}", tmp_path / "aim"
    (tmp_path / "mlflow").mkdir()  # a local tracker's folder must exist (targets._in_a_directory)
    blocked = [tmp_path / "mlflow" / "artifacts", aim / "artifacts"]
    path = explore_space(tmp_path, [f"mlflow:{uri}", f"aim:{aim}"], block_paths=[str(p) for p in blocked])
    done = cli(
        "explore",
        str(path),
        "--store",
        str(tmp_path / "s.db"),
        "--allow-actuator-import",
        "--quiet",
        home=tmp_path / "home",
    )
    assert done.returncode == 0, done.stderr
    stored = held(tmp_path / "s.db")
    assert [h.row["status"] for h in stored] == ["valid", "valid"]
    warnings = [line for line in done.stderr.splitlines() if "was not tracked" in line]
    assert len(warnings) == 4 and all(
        "NotADirectoryError" in w and "tunebench track export --to" in w for w in warnings
    )
    assert done.stderr.splitlines()[-1].endswith(
        "0 runs created, 0 already there, 4 failed (the warnings above say how to send them)"
    )
    for h in stored:
        kept = h.metadata["tracking_warnings"]
        assert [w.split(":")[0] for w in kept] == ["mlflow", "aim"] and f"result {h.result_id} " in kept[0]
    for p in blocked:
        p.unlink()
    for to, where in (("mlflow", uri), ("aim", str(aim))):
        done = cli("track", "export", "--to", to, "--uri", where, "--store", str(tmp_path / "s.db"))
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().endswith(": 2 runs created, 0 already there")
    op = parse_space(yaml.safe_load(path.read_text())).operation_id
    assert sorted(r.data.tags["tunebench.result_id"] for r in mlflow_runs(uri, f"tunebench {op}")) == sorted(
        str(h.result_id) for h in stored
    )
    assert sorted(r["tunebench"]["result_id"] for r in aim_runs(aim)) == sorted(str(h.result_id) for h in stored)
    for h in stored:
        check_mlflow_run(uri, h, predicted=None, experiment=f"tunebench {op}")  # export's default: no prediction


@pytest.mark.slow
def test_a_server_that_stops_answering_costs_one_timeout(tmp_path, mlflow_server, monkeypatch, capfd):
    """The tracking server passes the check, then accepts connections and never answers (SIGSTOP): the first
    result's send runs into MLflow's timeouts and retries and says so while it waits; every later one is
    refused after one quick re-check (no retries), not after the same retries again; once the server answers,
    an export sends both, nothing half-written."""
    from tunebench.store.stored import result_ids
    from tunebench.track import open_trackers, send

    path = explore_space(tmp_path, [])
    assert main(["explore", str(path), "--store", str(tmp_path / "s.db"), "--allow-actuator-import", "--quiet"]) == 0
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")  # as a user may set it: kept by tunebench
    monkeypatch.setattr(send, "SEND_HEARTBEAT_S", 1.0)
    server = SERVERS[mlflow_server]
    with Store(tmp_path / "s.db") as store, open_trackers([Target("mlflow", mlflow_server)]) as trackers:
        ids = result_ids(store)
        with_group(server, signal.SIGSTOP)
        started = time.monotonic()
        try:
            sent = trackers.send(store, ids)
        finally:
            with_group(server, signal.SIGCONT)
    took = time.monotonic() - started  # MLflow's own retries (7, backoff factor 2) would take over 4 min
    assert took < 120, took
    err = capfd.readouterr().err
    first, second = sent.warnings
    assert f"mlflow: result {ids[0]} was not tracked (MlflowException: timed out); it is in the store" in first
    assert f"was not tracked (cannot reach the MLflow tracking server {mlflow_server}: timed out)" in second
    assert f"track: sending result {ids[0]} to mlflow:{mlflow_server}, " in err  # while it waits
    held_now = {h.result_id: h.metadata["tracking_warnings"] for h in held(tmp_path / "s.db")}
    assert held_now == {ids[0]: [first], ids[1]: [second]}
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT")
    done = cli("track", "export", "--to", "mlflow", "--uri", mlflow_server, "--store", str(tmp_path / "s.db"))
    assert done.stdout.strip().endswith(": 2 runs created, 0 already there"), done.stderr
    op = parse_space(yaml.safe_load(path.read_text())).operation_id
    mine = f"sqlite:///{tmp_path / 's.db'}"  # the server is the module's: other tests' runs share the experiment
    runs = [r for r in mlflow_runs(mlflow_server, f"tunebench {op}") if r.data.tags["tunebench.store"] == mine]
    assert sorted(r.data.tags["tunebench.result_id"] for r in runs) == sorted(str(i) for i in ids)
    assert {r.info.status for r in runs} == {"FINISHED"}


# ------------------------------------------------------------------------------ bad input (fast)


def test_an_unreachable_tracking_server_is_an_error_before_training(tmp_path, capsys):
    port = free_port()  # nothing listens there
    for track, says in (
        (f"mlflow:http://127.0.0.1:{port}", "cannot reach the MLflow tracking server"),
        (f"aim:aim://127.0.0.1:{port}", "cannot reach the Aim server"),
    ):
        started = time.monotonic()
        assert main(["run", LORA, *INVALID, "--store", str(tmp_path / "s.db"), "--track", track]) == 2
        err = capsys.readouterr().err
        (line,) = [x for x in err.splitlines() if x.startswith("error:")]
        assert line == f"error: --track: {says} {track.partition(':')[2]}: connection refused"
        assert "Traceback" not in err and "measuring:" not in err  # nothing was measured
        assert time.monotonic() - started < 60
    assert not (tmp_path / "s.db").exists()  # nothing written
    path = explore_space(tmp_path, [f"mlflow:http://127.0.0.1:{port}"])
    assert main(["explore", str(path), "--store", str(tmp_path / "s.db"), "--allow-actuator-import"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert (
        err[-1] == f"error: track: cannot reach the MLflow tracking server http://127.0.0.1:{port}: connection refused"
    )
    assert not (tmp_path / "s.db").exists()


def test_a_server_that_is_no_mlflow_tracking_server_is_named_so(tmp_path, capsys):
    """A real HTTP server that answers 404 (a wrong URL path) or 401 (no credentials), and https:// to a plain
    HTTP server: one line each saying why, before anything is measured."""
    import http.server
    import threading

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status = 401 if self.path.startswith("/locked/") else 404
            self.send_response(status)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<!doctype html><title>no</title>")

        do_POST = do_GET  # MLflow searches with a POST

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        for uri, says in (
            (f"{url}/nope", "HTTP 404 for MLflow's REST API /api/2.0/mlflow/: no tracking server at this URL"),
            (f"{url}/locked", "HTTP 401: not authenticated (MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"),
            (url.replace("http:", "https:"), "TLS handshake failed: the server speaks plain HTTP"),
        ):
            assert main(["run", LORA, *INVALID, "--store", str(tmp_path / "s.db"), "--track", f"mlflow:{uri}"]) == 2
            (line,) = capsys.readouterr().err.splitlines()
            assert line.startswith(f"error: --track: cannot reach the MLflow tracking server {uri}: {says}"), line
    finally:
        server.shutdown()
    assert not (tmp_path / "s.db").exists()


def test_a_missing_extra_names_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if `pip install 'tunebench[mlflow]'` had not been run
    monkeypatch.setitem(sys.modules, "aim", None)
    for kind in ("mlflow", "aim"):
        assert main(["run", LORA, *INVALID, "--store", str(tmp_path / "s.db"), "--track", kind]) == 2
        assert capsys.readouterr().err == f"error: --track: {kind} is not installed: pip install 'tunebench[{kind}]'\n"
    assert not (tmp_path / "s.db").exists()
    Store(tmp_path / "s.db").close()
    assert main(["track", "export", "--to", "aim", "--store", str(tmp_path / "s.db")]) == 2
    assert capsys.readouterr().err == "error: --to: aim is not installed: pip install 'tunebench[aim]'\n"


def test_track_needs_the_store(tmp_path, capsys):
    assert main(["run", LORA, *INVALID, "--no-store", "--track", "mlflow"]) == 2
    assert capsys.readouterr().err.startswith("error: --track: sends what the store keeps: drop --no-store")


def test_bad_track_values(tmp_path, capsys):
    base = {
        "experiments": [{"id": LORA}],
        "entity_space": {"model_name": "smollm2-135m", "model_max_length": 64, "batch_size": 1, "number_gpus": 0},
    }
    for value, field, says in (
        ("mlfow", "track", "unknown tracker 'mlfow'. Did you mean 'mlflow'?"),
        (["aim", "mlflow:"], "track[1]", "names no location after 'mlflow:'"),
        (["mlflow", "mlflow:sqlite:///x.db"], "track", "mlflow is given twice"),
        (3, "track", "is neither a tracker nor a list"),
    ):
        with pytest.raises(InputError) as exc:
            parse_space({**base, "track": value})
        assert (exc.value.field, says in exc.value.message) == (field, True), exc.value
    assert main(["run", LORA, *INVALID, "--store", str(tmp_path / "s.db"), "--track", "wandb"]) == 2
    assert capsys.readouterr().err.startswith("error: --track: unknown tracker 'wandb' (allowed: mlflow, mlflow:URI")
    assert main(["track", "export", "--to", "wandb", "--store", str(tmp_path / "s.db")]) == 2
    assert capsys.readouterr().err.startswith("error: --to: unknown value 'wandb' (allowed: mlflow, aim)")


@pytest.mark.parametrize(
    ("text", "missing"),
    [("mlflow:sqlite:///{tmp}/no/dir/m.db", "no/dir"), ("aim:{tmp}/no/dir/repo", "no/dir")],
)
def test_a_local_tracker_in_a_missing_directory_is_refused_and_not_made(tmp_path, text, missing):
    """MLflow's sqlite store and Aim's repository would make every missing folder of their path (outside the
    working directory too); like --store, the folder a local tracker is made in must exist."""
    from tunebench.track.targets import parse_target

    with pytest.raises(InputError) as exc:
        parse_target(text.format(tmp=tmp_path))
    assert exc.value.field == "--track"
    assert f"the directory {str(tmp_path / missing)!r} does not exist" in exc.value.message
    assert not (tmp_path / "no").exists()
    assert parse_target(f"aim:{tmp_path}/repo").location == str(tmp_path / "repo")  # the repository itself: made


def test_a_sqlite_tracker_under_a_tilde_is_refused_and_no_folder_named_tilde_made(tmp_path, monkeypatch):
    """SQLite expands no '~': sqlite:///~/m.db is m.db in a folder named '~' of the working directory, which the
    MLflow writer made (the check had expanded it to the home directory, which exists)."""
    from tunebench.track.targets import parse_target

    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError) as exc:
        parse_target("mlflow:sqlite:///~/m.db")
    assert f"the directory {str(tmp_path / '~')!r} does not exist" in exc.value.message
    assert not (tmp_path / "~").exists()


def test_trackers_are_not_part_of_the_operation(tmp_path):
    """A space's trackers change neither its operation id nor what the store keeps of it (a URI may hold a
    password)."""
    base = {
        "experiments": [{"id": LORA}],
        "entity_space": {"model_name": "smollm2-135m", "model_max_length": 64, "batch_size": 1, "number_gpus": 0},
    }
    plain = parse_space(base)
    tracked = parse_space({**base, "track": ["mlflow:https://user:secret@host", "aim:~/runs"]})
    assert tracked.operation_id == plain.operation_id and "track" not in tracked.source
    assert tracked.track == (
        Target("mlflow", "https://user:secret@host"),
        Target("aim", str(Path("~/runs").expanduser().absolute())),
    )
    assert str(tracked.track[0]) == "mlflow:https://user:***@host"


def test_invalid_and_failed_results_are_tracked_with_why(tmp_path, capsys):
    """Results that never trained: an entity that breaks a rule (invalid, its reasons; the planner predicts
    nothing, and says why) and a failed one (MLflow status FAILED, its error)."""
    store = str(tmp_path / "s.db")
    assert main(["run", LORA, *INVALID, "--store", store]) == 0
    failed = [
        "model_name=smollm2-135m",
        "model_max_length=64",
        "number_gpus=2",
        "batch_size=2",
        "gpu_model=NVIDIA-A100-80GB-PCIe",
        "number_nodes=2",
    ]
    assert main(["run", LORA, *failed, "--store", store]) == 1
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    assert main(["track", "export", "--to", "mlflow", "--uri", uri, "--store", store, "--predicted"]) == 0
    assert capsys.readouterr().out.endswith(": 2 runs created, 0 already there\n")
    rows = {h.row["status"]: h for h in held(tmp_path / "s.db")}
    runs = {r.data.tags["tunebench.status"]: r for r in mlflow_runs(uri, "tunebench run")}
    invalid, bad = runs["invalid"], runs["failed"]
    assert invalid.data.tags["tunebench.reasons"] == "; ".join(rows["invalid"].row["reasons"])
    assert invalid.data.tags["tunebench.predicted"].startswith("no prediction: rule 1: batch_size 3")
    assert invalid.data.metrics == {"is_valid": 0.0} and invalid.info.status == "FINISHED"
    assert bad.info.status == "FAILED" and "is_valid" not in bad.data.metrics
    assert bad.data.tags["tunebench.error"] == rows["failed"].row["error"]
    assert invalid.data.params == as_mlflow_params(rows["invalid"].params())


def test_each_result_stays_in_the_experiment_that_recorded_it(tmp_path, capsys):
    """One request measured by operation A, re-measured by operation B (--remeasure) and by `tunebench run`: a
    request remembers only the operation that last claimed it, yet each result stays in the MLflow experiment of
    what recorded it (A, B, `tunebench run`), so exporting after each step never sends a result twice."""
    store, uri = tmp_path / "s.db", f"sqlite:///{tmp_path / 'm.db'}"

    def export() -> str:
        assert main(["track", "export", "--to", "mlflow", "--uri", uri, "--store", str(store)]) == 0
        return capsys.readouterr().out.strip().splitlines()[-1].partition(": ")[2]

    first = explore_space(tmp_path, [])  # model_max_length 64 and 128
    assert main(["explore", str(first), "--store", str(store), "--allow-actuator-import", "--quiet"]) == 0
    assert export() == "2 runs created, 0 already there"
    space = yaml.safe_load(first.read_text())
    space["entity_space"]["model_max_length"] = [64]
    second = tmp_path / "second.yaml"
    second.write_text(yaml.safe_dump(space))
    argv = ["explore", str(second), "--store", str(store), "--allow-actuator-import", "--quiet", "--remeasure"]
    assert main(argv) == 0
    experiment = get_experiment(LORA, {"max_steps": 2})
    entity = make_entity(
        experiment, {"model_name": "smollm2-135m", "model_max_length": 64, "batch_size": 1, "number_gpus": 0}
    )
    result = Result.valid(experiment.id, entity.id, {"train_runtime": 1.0}, actuator="testing")
    with Store(store) as opened:  # what `tunebench run` records (tunebench.commands.store.record_run)
        opened.record_one(Record(experiment, entity, result, actuator=space["actuator"]["name"], generator="run"))
    assert export() == "2 runs created, 2 already there"
    assert export() == "0 runs created, 4 already there"
    ops = [f"tunebench {parse_space(yaml.safe_load(p.read_text())).operation_id}" for p in (first, second)]
    found = {name: sorted(int(r.data.tags["tunebench.result_id"]) for r in mlflow_runs(uri, name)) for name in ops}
    assert found == {ops[0]: [1, 2], ops[1]: [3]}
    (run,) = mlflow_runs(uri, "tunebench run")
    assert run.data.tags["tunebench.result_id"] == "4" and "tunebench.operation_id" not in run.data.tags
    assert {r.data.tags["tunebench.operation_id"] for r in mlflow_runs(uri, ops[1])} == {ops[1].split()[1]}
    with Store(store) as opened, opened.engine.begin() as conn:  # as a store written before results named theirs
        for rid, meta in conn.execute(select(results.c.id, results.c.meta)).all():
            meta.get("execution", {}).pop("operation_id", None)
            conn.execute(update(results).where(results.c.id == rid).values(meta=meta))
    uri = f"sqlite:///{tmp_path / 'older.db'}"  # its results go by the latest operation started before each
    assert export() == "4 runs created, 0 already there"
    assert {name: sorted(int(r.data.tags["tunebench.result_id"]) for r in mlflow_runs(uri, name)) for name in ops} == {
        ops[0]: [1, 2],
        ops[1]: [3],
    }


def test_explore_says_where_its_results_went(tmp_path, capsys):
    """explore --track ends with one line (stderr; stdout may carry --json) naming the trackers, the experiment
    and the runs created; the JSON summary holds the same. A resumed exploration measures nothing new."""
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    path = explore_space(tmp_path, [f"mlflow:{uri}"])
    argv = ["explore", str(path), "--store", str(tmp_path / "s.db"), "--allow-actuator-import", "--quiet"]
    op = parse_space(yaml.safe_load(path.read_text())).operation_id
    assert main([*argv, "--json"]) == 0
    out, err = capsys.readouterr()
    said = f"tracked in mlflow:{uri} (experiment 'tunebench {op}'): "
    assert err.splitlines()[-1] == said + "2 runs created, 0 already there"
    assert json.loads(out)["tracked"] == {
        "trackers": f"mlflow:{uri}",
        "experiment": f"tunebench {op}",
        "created": 2,
        "present": 0,
        "failed": 0,
    }
    assert len(mlflow_runs(uri, f"tunebench {op}")) == 2
    assert main(argv) == 0
    assert capsys.readouterr().err.splitlines()[-1] == said + "0 runs created, 0 already there"


def test_two_explores_sharing_trackers_each_report_their_own(tmp_path, monkeypatch):
    """A library caller may keep one open Trackers for several explorations: each summary counts its own sends,
    not what the trackers did before it (it said 3 created for the second, counting the first's 2)."""
    from tunebench.executors.local import LocalExecutor
    from tunebench.explore import Settings, explore
    from tunebench.track import open_trackers, parse_targets

    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # fake_actuators, as --allow-actuator-import finds it
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    first = parse_space(yaml.safe_load(explore_space(tmp_path, []).read_text()))
    wider = yaml.safe_load(explore_space(tmp_path, []).read_text())
    wider["entity_space"]["model_max_length"] = [64, 128, 192]
    second = parse_space(wider)
    settings = Settings(max_parallel=1, allow_actuator_import=True, output_root=tmp_path / "runs")
    with Store(tmp_path / "s.db") as store, open_trackers(parse_targets([f"mlflow:{uri}"])) as trackers:
        one = explore(first, store, LocalExecutor(1), settings, trackers=trackers)
        two = explore(second, store, LocalExecutor(1), settings, trackers=trackers)
    assert (one.tracked["created"], one.tracked["present"]) == (2, 0)
    # the second space's two shorter lengths are the first's results (memoised): one new run
    assert (two.tracked["created"], two.tracked["present"]) == (1, 0)
    assert trackers.total.created == 3
