"""The local executor: GPUs from a free pool, never shared; what a machine cannot run fails at once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from types import SimpleNamespace

from tunebench.actuators import resolve_actuator
from tunebench.executors.local import Gpu, LocalExecutor, detect_gpus
from tunebench.executors.task import make_task, run_task
from tunebench.spec.experiments import get_experiment, make_entity

EXP = get_experiment("finetune_full_benchmark-v1.0.0")
A100 = "NVIDIA-A100-80GB-PCIe"


def task(i: int, gpus: int, log, *, actuator="fake_actuators:sleepy", gpu_model=A100, nodes=1, sleep_s=0.3):
    values = {
        "model_name": "smollm2-135m",
        "model_max_length": 64 * (i + 1),
        "batch_size": max(1, gpus) * 2,
        "number_gpus": gpus,
    }
    if gpus:
        values["gpu_model"] = gpu_model
    if nodes > 1:
        values["number_nodes"] = nodes
    entity = make_entity(EXP, values)
    options = {"call_log": str(log), "sleep_s": sleep_s}
    return make_task(i, 1, actuator, EXP, entity, options, allow_import=True)  # the test actuators are module:function


def drain(executor: LocalExecutor, n: int, timeout: float = 30.0):
    done, deadline = {}, time.monotonic() + timeout
    while len(done) < n and time.monotonic() < deadline:
        for fin in executor.poll(0.1):
            done[fin.request_id] = fin.result
    return done


def test_gpus_are_never_shared(tmp_path):
    log = tmp_path / "calls.jsonl"
    gpus = [Gpu(str(i), "NVIDIA A100 80GB PCIe") for i in range(3)]
    executor = LocalExecutor(max_parallel=4, gpus=gpus)
    tasks = [task(i, 1, log) for i in range(4)] + [task(4 + i, 2, log) for i in range(2)]
    for t in tasks:
        executor.submit(t)
    done = drain(executor, len(tasks))
    assert {r.status for r in done.values()} == {"valid"}
    events = [json.loads(line) for line in log.read_text().splitlines()]
    spans: dict[str, dict] = {}
    for e in events:
        spans.setdefault(e["entity"], {})[e["event"]] = e
    intervals = [
        (s["start"]["t"], s["end"]["t"], set(s["start"]["visible_devices"].split(","))) for s in spans.values()
    ]
    for i, (a0, a1, da) in enumerate(intervals):
        for b0, b1, db in intervals[i + 1 :]:
            if a0 < b1 and b0 < a1:  # overlapping in time
                assert not da & db, f"GPUs {da & db} shared"
    assert sorted(len(d) for *_, d in intervals) == [1, 1, 1, 1, 2, 2]
    assert done[4].metadata["execution"]["visible_devices"].count(",") == 1


def test_what_this_machine_cannot_run_fails_at_once(tmp_path):
    log = tmp_path / "calls.jsonl"
    executor = LocalExecutor(max_parallel=2, gpus=[Gpu("0", "NVIDIA L40S")])
    executor.submit(task(0, 2, log))  # more GPUs than there are
    executor.submit(task(1, 1, log, gpu_model=A100))  # another GPU model
    executor.submit(task(2, 2, log, nodes=2, gpu_model="NVIDIA-L40S"))  # several nodes
    done = drain(executor, 3, timeout=5)
    assert {r.status for r in done.values()} == {"failed"}
    assert "this machine has 1 GPU" in done[0].error
    assert "needs 1 GPU(s) of gpu_model NVIDIA-A100-80GB-PCIe; this machine has 0 (NVIDIA L40S)" in done[1].error
    assert "--executor ray" in done[2].error
    assert not log.exists()
    cpu_only = LocalExecutor(gpus=[])
    cpu_only.submit(task(3, 1, log))
    assert "no GPU" in drain(cpu_only, 1, timeout=5)[3].error


def test_a_machine_with_gpus_of_several_models_gives_each_task_its_own_model(tmp_path):
    """Was: the first free GPUs, whatever their model (an H100 entity measured on an L40S, or failed at the
    measuring actuator's check although the machine had the H100s)."""
    log = tmp_path / "calls.jsonl"
    gpus = [Gpu("0", "NVIDIA L40S"), Gpu("1", "NVIDIA H100 80GB HBM3"), Gpu("2", "NVIDIA L40S")]
    gpus.append(Gpu("3", "NVIDIA H100 80GB HBM3"))
    executor = LocalExecutor(max_parallel=4, gpus=gpus)
    h100, l40s = "NVIDIA-H100-80GB-HBM3", "NVIDIA-L40S"
    tasks = [task(0, 2, log, gpu_model=h100), task(1, 1, log, gpu_model=l40s), task(2, 1, log, gpu_model=l40s)]
    tasks.append(task(3, 3, log, gpu_model=h100))  # 2 H100s only: fails at once, whatever is free
    for t in tasks:
        executor.submit(t)
    done = drain(executor, len(tasks))
    devices = {i: done[i].metadata["execution"].get("visible_devices") for i in range(3)}
    assert [done[i].status for i in range(3)] == ["valid"] * 3, [done[i].error for i in range(4)]
    assert devices[0] == "1,3" and {devices[1], devices[2]} == {"0", "2"}
    assert done[3].status == "failed"
    assert "needs 3 GPU(s) of gpu_model NVIDIA-H100-80GB-HBM3; this machine has 2" in done[3].error


def test_actuator_errors_become_failed_results(tmp_path):
    result = run_task(task(0, 0, tmp_path / "log", actuator="fake_actuators:crashing"))
    assert result.status == "failed" and result.error == "RuntimeError: actuator crashed"
    assert result.experiment_id == EXP.id and result.metadata["execution"]["attempt"] == 1
    result = run_task(task(0, 0, tmp_path / "log", actuator="tunebench.no_such_module:fn"))
    assert result.status == "failed" and "cannot be imported" in result.error


def test_actuator_names():
    assert resolve_actuator("noop").name == "noop"
    assert resolve_actuator("fake_actuators:sleepy", allow_import=True).run.__name__ == "sleepy"


def fake_nvml(names: list, calls: list) -> SimpleNamespace:
    """A pynvml stand-in reporting the given product names (bytes, as older pynvml returns, or str)."""
    return SimpleNamespace(
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: len(names),
        nvmlDeviceGetHandleByIndex=lambda i: ("handle", i),
        nvmlDeviceGetName=lambda handle: names[handle[1]],
        nvmlDeviceGetUUID=lambda handle: f"GPU-{handle[1]}a2b3c4d-0000-1111-2222-333344445555",
    )


def test_detect_gpus_reads_nvml_in_order_and_honours_cuda_visible_devices(monkeypatch):
    calls: list = []
    names = [b"NVIDIA A100-SXM4-80GB", "NVIDIA L40S", "NVIDIA H100 80GB HBM3"]
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(names, calls))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert detect_gpus() == [
        Gpu("0", "NVIDIA A100-SXM4-80GB"),
        Gpu("1", "NVIDIA L40S"),
        Gpu("2", "NVIDIA H100 80GB HBM3"),
    ]
    assert calls == ["init", "shutdown"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 0")  # CUDA's order: its device 0 is GPU 2
    assert detect_gpus() == [Gpu("2", "NVIDIA H100 80GB HBM3"), Gpu("0", "NVIDIA A100-SXM4-80GB")]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert detect_gpus() == []
    # UUIDs (or a unique prefix), as CUDA takes them; a MIG instance counts as one GPU of unknown model
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1a2b3c4d,MIG-7f00")
    assert detect_gpus() == [Gpu("1", "NVIDIA L40S"), Gpu("MIG-7f00", "MIG-7f00")]


def test_detect_gpus_without_a_driver_is_empty(monkeypatch):
    def no_driver():
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    monkeypatch.setitem(sys.modules, "pynvml", SimpleNamespace(nvmlInit=no_driver))
    assert detect_gpus() == []


def test_detect_gpus_on_this_machine():
    """The real NVML against the driver's own tool: nvidia-smi's list (none where it is absent)."""
    expected = []
    if shutil.which("nvidia-smi"):
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if out.returncode == 0:
            expected = [
                Gpu(*(x.strip() for x in line.split(",", 1))) for line in out.stdout.splitlines() if line.strip()
            ]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        expected = [g for g in expected if g.index in {v.strip() for v in visible.split(",")}]
    assert detect_gpus() == expected


def test_cpu_entity_over_several_nodes_reaches_the_actuator_which_judges_it(tmp_path):
    """number_gpus 0 with number_nodes 2 satisfies rule 2 (0 % 2 == 0); a CPU run asks for one machine, and the
    measuring actuator judges it (no node would run a process): invalid, not a retried executor failure."""
    entity = make_entity(
        EXP,
        {"model_name": "smollm2-135m", "model_max_length": 64, "batch_size": 2, "number_gpus": 0, "number_nodes": 2},
    )
    options = {"weights": "random", "output_dir": str(tmp_path / "run")}
    t = make_task(0, 1, "measure", EXP, entity, options)
    assert t.number_nodes == 1 and t.number_gpus == 0
    executor = LocalExecutor(max_parallel=1, gpus=[])
    executor.submit(t)
    (result,) = drain(executor, 1).values()
    assert result.status == "invalid", (result.error, result.reasons)
    assert "number_nodes 2 with number_gpus 0" in result.reasons[0]
    assert not (tmp_path / "run").exists()  # judged before anything ran
