"""The explorer on real SQLite files with real (cheap) actuators, in this process and in subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from layout import SRC

from tunebench.commands.main import main
from tunebench.executors.local import LocalExecutor
from tunebench.explore import Settings, explore, parse_space
from tunebench.store import Store

TESTING = "fake_actuators"


def make_space(actuator: str, *, lengths=(64, 128), batches=(1, 2), operation=None, **options) -> dict:
    return {
        "experiments": [{"id": "finetune_lora_benchmark-v1.0.0", "parameters": {"max_steps": 2}}],
        "entity_space": {
            "model_name": ["smollm2-135m"],
            "model_max_length": list(lengths),
            "batch_size": list(batches),
            "number_gpus": [0],
        },
        "actuator": {"name": f"{TESTING}:{actuator}", **options},
        "operation": operation or {"sampler": "grid"},
    }


def calls(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def run(space: dict, db: Path, **settings) -> object:
    with Store(db) as store:
        settings = {"allow_actuator_import": True, **settings}  # the test actuators are module:function
        return explore(parse_space(space), store, LocalExecutor(settings.get("max_parallel", 1)), Settings(**settings))


def test_grid_sweep_in_subprocesses_then_memoised(tmp_path):
    log = tmp_path / "calls.jsonl"
    space = make_space("in_subprocess", call_log=str(log))
    summary = run(space, tmp_path / "s.db", max_parallel=2)
    assert (summary.total, summary.valid, summary.measured, summary.memoised) == (4, 4, 4, 0)
    with Store(tmp_path / "s.db") as store:
        rows = store.rows(operation_id=summary.operation_id)
    assert [r["properties"]["dataset_tokens_per_second"] for r in rows] == [64.0, 128.0, 128.0, 256.0]
    assert len([c for c in calls(log) if c["event"] == "end"]) == 4
    # run again: nothing is measured twice
    again = run(space, tmp_path / "s.db", max_parallel=2)
    assert (again.measured, again.memoised, again.valid) == (0, 4, 4)
    assert len([c for c in calls(log) if c["event"] == "end"]) == 4
    # --remeasure measures again and keeps both results
    third = run(space, tmp_path / "s.db", max_parallel=2, remeasure=True)
    assert third.measured == 4
    with Store(tmp_path / "s.db") as store:
        assert all(len(store.results_of(r["request_id"])) == 2 for r in store.rows())


def test_cpu_measurements_respect_max_parallel(tmp_path):
    log = tmp_path / "calls.jsonl"
    run(make_space("sleepy", lengths=(64, 128, 192), call_log=str(log), sleep_s=0.3), tmp_path / "s.db", max_parallel=2)
    events = sorted((c["t"], 1 if c["event"] == "start" else -1) for c in calls(log))
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    assert peak == 2
    assert {c["visible_devices"] for c in calls(log)} == {""}  # a CPU measurement gets no GPU


def test_invalid_by_rule_is_recorded_without_running(tmp_path):
    log = tmp_path / "calls.jsonl"
    summary = run(make_space("sleepy", batches=(0, 1), call_log=str(log)), tmp_path / "s.db")
    assert (summary.valid, summary.invalid, summary.rules, summary.measured) == (2, 2, 2, 2)
    assert {c["entity"] for c in calls(log)} == {
        "model_name.smollm2-135m-number_gpus.0-model_max_length.64-batch_size.1",
        "model_name.smollm2-135m-number_gpus.0-model_max_length.128-batch_size.1",
    }


def test_failed_measurements_are_retried(tmp_path):
    space = make_space("flaky", call_log=str(tmp_path / "calls.jsonl"), state_dir=str(tmp_path / "state"), fail_times=1)
    summary = run(space, tmp_path / "s.db", max_retries=1)
    assert (summary.valid, summary.failed, summary.retried, summary.measured) == (4, 0, 4, 8)


def test_failed_measurements_are_reported_after_max_retries(tmp_path, capsys):
    space = make_space("crashing", call_log=str(tmp_path / "calls.jsonl"))
    summary = run(space, tmp_path / "s.db", max_retries=2)
    assert (summary.failed, summary.valid, summary.measured) == (4, 0, 12)
    assert len(calls(tmp_path / "calls.jsonl")) == 12  # 1 attempt + 2 retries each
    with Store(tmp_path / "s.db") as store:
        (first, *_) = store.rows(operation_id=summary.operation_id)
        history = store.results_of(first["request_id"])
    assert first["status"] == "failed" and first["error"] == "RuntimeError: actuator crashed"
    assert len(history) == 3 and "Traceback" in history[-1].log_tail
    assert history[-1].metadata["execution"]["attempt"] == 3
    # show reports them
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    assert (
        main(["show", "--space", str(tmp_path / "space.yaml"), "--format", "csv", "--store", str(tmp_path / "s.db")])
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(",status,reason") and all(
        line.endswith(",failed,RuntimeError: actuator crashed") for line in lines[1:]
    )
    # a new run retries them again (a fresh budget), and they fail again
    again = run(space, tmp_path / "s.db", max_retries=0)
    assert (again.measured, again.failed) == (4, 4)


def test_optimize_finds_the_best_point_with_fewer_measurements_than_the_grid(tmp_path):
    log = tmp_path / "calls.jsonl"
    lengths, batches = tuple(range(64, 513, 64)), (1, 2, 3, 4, 6, 8)  # 8 x 6 = 48 entities
    space = make_space(
        "sleepy",
        lengths=lengths,
        batches=batches,
        call_log=str(log),
        peak_len=256,
        peak_batch=4,
        operation={"sampler": "optimize", "metric": "dataset_tokens_per_second", "budget": 20, "seed": 0},
    )
    summary = run(space, tmp_path / "s.db")
    measured = {c["entity"] for c in calls(log) if c["event"] == "end"}
    assert summary.best["entity"]["model_max_length"] == 256 and summary.best["entity"]["batch_size"] == 4
    assert summary.best["dataset_tokens_per_second"] == 1000.0
    assert len(measured) == summary.measured <= 20 < len(lengths) * len(batches)
    # resuming does not measure again
    again = run(space, tmp_path / "s.db")
    assert again.measured == 0 and again.best == summary.best


def test_optimize_treats_invalid_as_worst(tmp_path):
    space = make_space(
        "oom_above",
        lengths=(64, 128, 192, 256),
        batches=(1, 2, 4, 8, 16),
        max_batch=4,
        operation={"sampler": "optimize", "budget": 12, "seed": 3},
    )
    summary = run(space, tmp_path / "s.db")
    with Store(tmp_path / "s.db") as store:
        rows = store.rows(operation_id=summary.operation_id)
    measured = [(r["entity"]["model_max_length"], r["entity"]["batch_size"], r["status"]) for r in rows]
    # what TPE (Optuna, seed 3; 4 random start-up trials, then 8 guided by the scores) asks for when an
    # invalid point scores -inf (the worst): a different score for invalid points changes the sequence
    assert measured == [
        (192, 8, "invalid"),
        (128, 4, "valid"),
        (256, 16, "invalid"),
        (64, 2, "valid"),
        (192, 1, "valid"),
        (64, 16, "invalid"),
        (256, 4, "valid"),
        (192, 2, "valid"),
        (128, 1, "valid"),
        (256, 2, "valid"),
        (64, 8, "invalid"),
        (256, 8, "invalid"),
    ]
    assert all((status == "invalid") == (batch > 4) for _, batch, status in measured)  # max_batch=4
    for r in rows:  # the made-up property of tests/fake_actuators.py, written out
        length, batch = r["entity"]["model_max_length"], r["entity"]["batch_size"]
        if r["status"] == "valid":
            assert (
                r["properties"]["dataset_tokens_per_second"]
                == 1000 - 10 * (length / 64 - 4) ** 2 - 10 * (batch - 4) ** 2
            )
    assert (summary.done, summary.valid, summary.invalid, summary.measured) == (12, 7, 5, 12)
    assert summary.best["entity"]["model_max_length"] == 256 and summary.best["entity"]["batch_size"] == 4
    assert summary.best["dataset_tokens_per_second"] == 1000.0


def test_unknown_actuator_is_an_input_error_before_anything_is_stored(tmp_path):
    from tunebench.errors import InputError

    with pytest.raises(InputError, match="actuator.name"):
        run(make_space("no_such_function"), tmp_path / "s.db")
    with Store(tmp_path / "s.db") as store:
        assert store.operations() == []


# ---------------------------------------------------------------------------- real explorer processes


def start_explorer(space_file: Path, db: Path, *extra: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    command = [
        sys.executable,
        "-m",
        "tunebench",
        "explore",
        str(space_file),
        "--store",
        str(db),
        "--quiet",
        "--allow-actuator-import",
        *extra,
    ]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def valid_entities(db: Path) -> set[str]:
    with Store(db) as store:
        return {r["entity_id"] for r in store.rows(statuses=["valid"])}


def test_kill_9_mid_sweep_then_rerun_completes_without_duplicates(tmp_path):
    log, db = tmp_path / "calls.jsonl", tmp_path / "s.db"
    space = make_space("sleepy", lengths=tuple(range(64, 64 * 13, 64)), batches=(1,), call_log=str(log), sleep_s=0.4)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    first = start_explorer(tmp_path / "space.yaml", db, "--max-parallel", "2")
    deadline = time.monotonic() + 300  # each phase its own generous deadline: a loaded 2-core machine is slow
    while time.monotonic() < deadline and (not db.exists() or len(valid_entities(db)) < 4):
        time.sleep(0.1)
    first.send_signal(signal.SIGKILL)
    first.wait()
    done_before = valid_entities(db)
    assert 4 <= len(done_before) < 12, "the sweep finished before it could be killed"

    second = start_explorer(tmp_path / "space.yaml", db, "--max-parallel", "2")
    out, err = second.communicate(timeout=300)
    assert second.returncode == 0, err
    with Store(db) as store:
        rows = store.rows()
        per_request = Counter(len(store.results_of(r["request_id"])) for r in rows)
        assert store.counts(store.operations()[0]["id"]) == {"valid": 12}
    assert len(rows) == 12 and per_request == {1: 12}  # no duplicates, nothing lost
    rerun = {c["entity"] for c in calls(log) if c["event"] == "start" and c["pid"] != first.pid}
    assert not rerun & done_before  # what was stored before the kill was not measured again


def test_two_explorers_on_one_store_measure_disjoint_sets(tmp_path):
    log, db = tmp_path / "calls.jsonl", tmp_path / "s.db"
    space = make_space("sleepy", lengths=tuple(range(64, 64 * 13, 64)), batches=(1, 2), call_log=str(log), sleep_s=0.4)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    Store(db).close()  # create the schema once, so both start measuring at about the same time
    explorers = [start_explorer(tmp_path / "space.yaml", db, "--max-parallel", "2") for _ in range(2)]
    for p in explorers:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    starts = [c for c in calls(log) if c["event"] == "start"]
    by_pid: dict[int, set[str]] = {}
    for c in starts:
        by_pid.setdefault(c["pid"], set()).add(c["entity"])
    assert len(starts) == 24 and len({c["entity"] for c in starts}) == 24  # every point measured exactly once
    assert len(by_pid) == 2 and all(by_pid.values())  # both explorers took part, on disjoint sets
    assert len(valid_entities(db)) == 24


# ------------------------------------------------------------------ a dead explorer's claims (item 9)


def test_a_claim_whose_lease_expires_is_reclaimed_within_the_survivors_run(tmp_path):
    """Another host's explorer claimed a point and died: this explorer waits for the lease, then measures it."""

    log, db = tmp_path / "calls.jsonl", tmp_path / "s.db"
    space = make_space("sleepy", lengths=(64, 128), batches=(1,), call_log=str(log))
    spec = parse_space(space)
    with Store(db) as store:
        store.open_operation(spec.operation_id, sampler="grid", actuator=spec.actuator, space=spec.source, name=None)
        store.register(spec.operation_id, spec.sample(), actuator=spec.actuator, generator="grid")
        (held,) = store.claim(spec.operation_id, "other-host:4242:1", 1, lease_seconds=2.0)  # ... and it died
    started = time.monotonic()
    summary = run(space, db, lease_seconds=30.0)
    assert time.monotonic() - started >= 1.5  # it waited for the lease instead of leaving the point running
    assert (summary.valid, summary.done, summary.total) == (2, 2, 2)
    with Store(db) as store:
        assert store.counts(spec.operation_id) == {"valid": 2}
        (result,) = store.results_of(held.request_id)
    assert result.status == "valid" and result.metadata["execution"]["pid"] == os.getpid()


def test_kill_9_of_one_of_two_explorers_the_survivor_finishes_its_points(tmp_path):
    """Two explorers share a space; one is killed while it measures: the other, still running, reclaims
    the dead one's point (dead process on this host) and every point ends measured, none left running."""
    log, db, release = tmp_path / "calls.jsonl", tmp_path / "s.db", tmp_path / "release"
    # every measurement waits for the release file: neither explorer can finish before both measure
    space = make_space(
        "sleepy", lengths=(64, 128), batches=(1,), call_log=str(log), sleep_s=0.5, hold_until=str(release)
    )
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    Store(db).close()
    victim = start_explorer(tmp_path / "space.yaml", db, "--max-parallel", "1")
    deadline = time.monotonic() + 300  # each phase its own generous deadline (a loaded 2-core machine)
    while time.monotonic() < deadline and not any(c["pid"] == victim.pid for c in calls(log)):
        time.sleep(0.05)
    survivor = start_explorer(tmp_path / "space.yaml", db, "--max-parallel", "1")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len({c["pid"] for c in calls(log)}) < 2:
        time.sleep(0.05)  # both are measuring now, one point each: nothing is pending
    assert len({c["pid"] for c in calls(log)}) == 2, "both explorers should be measuring"
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    release.touch()
    out, err = survivor.communicate(timeout=300)
    assert survivor.returncode == 0, err
    with Store(db) as store:
        assert store.counts(store.operations()[0]["id"]) == {"valid": 2}  # the dead explorer's point too
    finished = {c["entity"] for c in calls(log) if c["event"] == "end" and c["pid"] == survivor.pid}
    assert len(finished) == 2
