"""One set of outcome rules for single- and multi-node runs (tunebench.actuators.outcome), and the
registry's lazy imports: the command line and the registry pull no torch, transformers or ray."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from layout import SRC

from tunebench.actuators.launch import build_launch_plan
from tunebench.actuators.measure import collect_nodes
from tunebench.actuators.process import NodeResult
from tunebench.spec.experiments import get_experiment, make_entity

EXP = get_experiment("finetune_full_benchmark-v1.0.0")
ENTITY = make_entity(EXP, {"model_name": "smollm2-135m", "model_max_length": 64, "number_gpus": 2, "number_nodes": 2,
                           "batch_size": 2, "gpu_model": "L40S", "distributed_backend": "DDP"})  # fmt: skip


def node(rank: int, returncode: int | None, records: list | None = None, aggregate: dict | None = None) -> NodeResult:
    return NodeResult(
        rank, returncode, 1.0, f"log of node {rank}", f"/tmp/node{rank}", records=records or [], aggregate=aggregate
    )


def ok(rank: int) -> dict:
    return {"rank": rank, "world_size": 2, "status": "ok", "steps": {"total": 3}}


def collect(*nodes: NodeResult):
    plan = build_launch_plan(EXP, ENTITY, main_process_ip="10.0.0.7")
    return collect_nodes(EXP, ENTITY, {"timeout_seconds": 30}, plan, list(nodes))


def test_a_node_that_timed_out_fails_the_multi_node_run_as_a_timeout():
    result = collect(node(0, 0, [ok(0)]), node(1, None))
    assert result.status == "failed" and result.error == "timeout: the run exceeded 30 s and was killed"
    assert "log of node 1" in result.log_tail


def test_a_node_killed_by_a_signal_names_the_signal():
    result = collect(node(0, -9), node(1, -9))
    assert result.status == "failed" and result.error == "worker killed by signal SIGKILL"


def test_valid_ranks_give_rank_zeros_properties_and_any_oom_is_invalid():
    props = {"train_runtime": 2.0, "dataset_tokens_per_second": 64.0}
    result = collect(node(0, 0, [ok(0)], {"properties": props}), node(1, 0, [ok(1)]))
    assert result.status == "valid" and result.properties == {**props, "is_valid": 1}
    assert [n["rank"] for n in result.metadata["nodes"]] == [0, 1]
    oom = {**ok(1), "status": "oom", "reason": "GPU out of memory: x"}
    result = collect(node(0, 0, [ok(0)]), node(1, 3, [oom]))
    assert result.status == "invalid" and result.reasons == ["rank 1: GPU out of memory: x"]


def test_the_cli_and_the_registry_import_no_torch_transformers_or_ray():
    code = (
        "import sys, tunebench, tunebench.commands.main, tunebench.executors\n"
        "from tunebench.actuators import resolve_actuator\n"
        "assert resolve_actuator('measure').run.__module__ == 'tunebench.actuators.measure'\n"
        "print(sorted(m for m in ('torch', 'transformers', 'ray') if m in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def _cgroup(root: Path, v2: bool, limit: str, usage: int, oom_kills: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if v2:
        (root / "memory.max").write_text(limit + "\n")
        (root / "memory.current").write_text(f"{usage}\n")
        (root / "memory.events").write_text(f"low 0\nhigh 0\nmax 3\noom 1\noom_kill {oom_kills}\n")
    else:
        (root / "memory").mkdir(parents=True, exist_ok=True)
        (root / "memory/memory.limit_in_bytes").write_text(limit + "\n")
        (root / "memory/memory.usage_in_bytes").write_text(f"{usage}\n")
        (root / "memory/memory.oom_control").write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {oom_kills}\n")
    return root


def test_cgroup_v1_and_v2_limits_counters_and_the_default_host_limit(tmp_path):
    from tunebench.actuators.memwatch import cgroup_limit, cgroup_oom_kills, default_host_memory_limit_bytes, meminfo

    v2 = _cgroup(tmp_path / "v2", True, str(8 << 30), 2 << 30, 4)
    assert cgroup_limit(v2) == (8 << 30, str(v2 / "memory.max")) and cgroup_oom_kills(v2)[0] == 4
    v1 = _cgroup(tmp_path / "v1", False, "9223372036854771712", 1 << 30, 0)  # v1's "no limit"
    assert cgroup_limit(v1) is None and cgroup_oom_kills(v1) == (0, str(v1 / "memory/memory.oom_control"))
    assert cgroup_limit(_cgroup(tmp_path / "max", True, "max", 0, 0)) is None
    # 80% of the smaller of the cgroup's room (8 - 2 GiB) and MemAvailable
    expected = 0.8 * min(6 << 30, meminfo()["MemAvailable"])
    assert default_host_memory_limit_bytes(v2) == pytest.approx(expected, rel=0.05)  # MemAvailable moves
    assert default_host_memory_limit_bytes(v2) <= 0.8 * (6 << 30)


def test_a_sigkill_is_out_of_memory_only_with_evidence(tmp_path):
    from tunebench.actuators.memwatch import MemoryWatch, oom_kill_reason

    root = _cgroup(tmp_path, True, str(64 << 30), 0, 2)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    watch = MemoryWatch(root=root).start(proc.pid)
    proc.wait()
    _cgroup(tmp_path, True, str(64 << 30), 0, 3)  # the kernel counted an OOM kill in this cgroup
    ev = watch.stop()
    assert ev.peak_rss_bytes > 0 and ev.limit_source == f"cgroup {root / 'memory.max'}"
    reason = oom_kill_reason(-9, "", ev)
    assert reason and "killed by SIGKILL" in reason and "oom_kill 2 -> 3" in reason and "64.00 GiB" in reason
    assert oom_kill_reason(1, "", ev) is None  # not a kill
    ev.oom_kills_after = 2  # no OOM kill counted, peak far below the limit, memory available: a crash
    assert oom_kill_reason(-9, "", ev) is None
    ev.peak_rss_bytes = int(0.95 * ev.limit_bytes)  # at the limit: out of memory
    assert "peak RSS within 10% of the limit" in oom_kill_reason(-9, "", ev)


def test_a_cpu_run_on_a_busy_host_says_its_timings_are_not_the_hosts_own():
    from tunebench.actuators.outcome import BUSY_OTHER_CPU_PERCENT, RunOutcome, result_of_run

    cpu = make_entity(EXP, {"model_name": "smollm2-135m", "model_max_length": 64, "number_gpus": 0, "batch_size": 2})
    props = {"train_runtime": 2.0, "dataset_tokens_per_second": 64.0}

    def outcome(other: float, entity=cpu, quota=None):
        system = {"cpu_count": 2, "cpu_quota": quota, "other_cpu_percent": other}
        run = RunOutcome(0, False, [{**ok(0), "world_size": 1, "system": system}], {"properties": props}, 1, "")
        return result_of_run(EXP, entity, run, 30)

    busy = outcome(107.0)
    assert busy.metadata["host_cpu"] == {"cpus": 2, "cpu_quota": None, "other_cpu_percent": 107.0}
    assert busy.status == "valid"
    assert busy.metadata["notes"] == [
        "other processes kept 1.1 CPU cores of the 2 it trains on busy during the run: its CPU timings are not "
        "this host's own (torch's threads wait for the slowest core); measure on an idle host"
    ]
    assert "notes" not in outcome(BUSY_OTHER_CPU_PERCENT).metadata  # an idle enough host: no note
    assert "notes" not in outcome(107.0, ENTITY).metadata  # a GPU run's timings are the GPUs'
    assert "notes" not in outcome(107.0, quota=2.0).metadata  # a cgroup quota: the node's CPUs are shared by design
