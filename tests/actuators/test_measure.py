"""The measuring actuator end to end: real subprocesses training tiny models on the CPU.

Models are given as config.json paths (a user-facing feature) with random weights, so nothing is
downloaded; data sets are small generated ones (news-chars-256-entries-32).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from tiny_models import TINY_LLAMA

import tunebench.actuators.measure as measure_module
from tunebench.actuators.launch import cpu_processes_reason
from tunebench.actuators.measure import measure
from tunebench.spec.experiments import get_experiment, make_entity
from tunebench.spec.measured import BENCHMARK_MEASURED
from tunebench.units import GIB

pytestmark = pytest.mark.slow

# 192 tokens: the response marker of news-chars-256 ends by token 152 (so labels are trained on) and
# every entry is longer (>= 206 tokens with the tiny model's tokenizer): padding-free batches.
LENGTH = 192
PARAMS = {"max_steps": 3, "dataset_id": "news-chars-256-entries-32", "gradient_accumulation_steps": 1}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny-llama") / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return str(path)


def entity_of(experiment, model: str, **extra):
    return make_entity(
        experiment,
        {
            "model_name": model,
            "model_max_length": LENGTH,
            "number_gpus": 0,
            "batch_size": 4,
            "target_modules": "q_proj,v_proj",
            **extra,
        }
        if experiment.uses_lora
        else {"model_name": model, "model_max_length": LENGTH, "number_gpus": 0, "batch_size": 4, **extra},
    )


def opts(tmp_path: Path, **extra) -> dict:
    return {"weights": "random", "output_dir": str(tmp_path / "run"), "timeout_seconds": 300, **extra}


@pytest.mark.parametrize(
    "experiment_id",
    ["finetune_full_benchmark-v1.0.0", "finetune_lora_benchmark-v1.0.0", "finetune_pt_benchmark-v1.0.0"],
)
def test_methods_produce_every_measured_property(tmp_path, tiny, experiment_id):
    exp = get_experiment(experiment_id, PARAMS)
    result = measure(exp, entity_of(exp, tiny), opts(tmp_path))
    assert result.status == "valid", (result.error, result.log_tail)
    assert set(BENCHMARK_MEASURED) <= set(result.properties)
    p = result.properties
    assert p["is_valid"] == 1 and p["train_runtime"] > 0
    assert p["train_steps_per_second"] == pytest.approx(3 / p["train_runtime"], rel=1e-6)
    assert p["train_samples_per_second"] == pytest.approx(12 / p["train_runtime"], rel=1e-6)  # 3 steps x 4
    # every entry is longer than LENGTH tokens: padding-free batches, dataset tokens = LENGTH per sample
    assert p["dataset_tokens_per_second"] == pytest.approx(LENGTH * 12 / p["train_runtime"], rel=1e-6)
    assert result.metadata["trained_tokens"] > 0
    assert p["train_tokens_per_second"] == pytest.approx(p["dataset_tokens_per_second"], rel=1e-6)
    assert all(p[k] == 0.0 for k in BENCHMARK_MEASURED if k.startswith("gpu_"))
    assert 0 < p["cpu_compute_utilization"] and 0 < p["cpu_memory_utilization"] < 100
    assert result.metadata["weights"] == "random" and result.metadata["versions"]["torch"]


def test_invalid_entity_is_not_run(tmp_path, tiny):
    exp = get_experiment("finetune_full_benchmark-v1.0.0", PARAMS)
    result = measure(exp, entity_of(exp, tiny, batch_size=0), opts(tmp_path))
    assert result.status == "invalid" and result.properties == {"is_valid": 0}
    assert "rule 4" in result.reasons[0]
    assert not (tmp_path / "run").exists()


def test_run_that_trains_no_label_token_is_invalid(tmp_path, tiny):
    """model_max_length 64 cuts the response marker of every news-chars-256 record: every label is -100."""
    exp = get_experiment("finetune_lora_benchmark-v1.0.0", {**PARAMS, "max_steps": 1})
    result = measure(exp, entity_of(exp, tiny, model_max_length=64), opts(tmp_path))
    assert result.status == "invalid" and result.properties == {"is_valid": 0}, (result.error, result.log_tail)
    (reason,) = result.reasons
    assert reason.startswith("no label tokens trained") and "cut off" in reason and "max_length 64" in reason
    assert "### Response:" in reason and "32 of 32 records" in reason
    assert result.metadata["trained_tokens"] == 0


def test_host_memory_limit_is_out_of_memory(tmp_path, tiny):
    exp = get_experiment("finetune_full_benchmark-v1.0.0", PARAMS)
    # the limit is below what the Python process with torch loaded already holds
    result = measure(exp, entity_of(exp, tiny), opts(tmp_path, host_memory_limit_gib=0.2))
    assert result.status == "invalid", (result.status, result.error, result.log_tail)
    assert result.properties == {"is_valid": 0}
    assert "host memory" in result.reasons[0]


def _replace_command(monkeypatch, script: str) -> None:
    original = measure_module.node_command

    def fake(node, out_dir, options, **kwargs):
        command, env = original(node, out_dir, options, **kwargs)
        return [sys.executable, "-c", script], env

    monkeypatch.setattr(measure_module, "node_command", fake)


def test_crashing_worker_is_failed_with_reason(tmp_path, tiny, monkeypatch):
    _replace_command(
        monkeypatch, "import os, signal; print('about to crash', flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    )
    exp = get_experiment("finetune_full_benchmark-v1.0.0", PARAMS)
    result = measure(exp, entity_of(exp, tiny), opts(tmp_path))
    assert result.status == "failed" and result.properties == {}
    assert "SIGKILL" in result.error and "about to crash" in result.log_tail


def test_kernel_oom_kill_is_out_of_memory_with_evidence(tmp_path, tiny, monkeypatch):
    """A worker SIGKILLed when its memory crosses the limit (what the kernel's OOM killer does; here a
    thread of the test plays the kernel) is an out-of-memory invalid result with the parent's evidence."""
    limit_gib = 0.25
    # 4 MiB of written (resident) memory every 50 ms, past the limit
    _replace_command(
        monkeypatch, "import time\nheld = []\nwhile True:\n    held.append(b'x' * (4 << 20))\n    time.sleep(0.05)"
    )
    killed: list[int] = []

    def kernel() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed:
            for child in psutil.Process().children(recursive=True):
                try:
                    if "held.append" in " ".join(child.cmdline()) and child.memory_info().rss > limit_gib * GIB:
                        killed.append(child.memory_info().rss)
                        child.send_signal(signal.SIGKILL)
                except psutil.Error:
                    continue
            time.sleep(0.01)

    threading.Thread(target=kernel, daemon=True).start()
    exp = get_experiment("finetune_full_benchmark-v1.0.0", PARAMS)
    result = measure(exp, entity_of(exp, tiny), opts(tmp_path, host_memory_limit_gib=limit_gib))
    assert killed, "the allocating worker never crossed the limit"
    assert result.status == "invalid" and result.properties == {"is_valid": 0}, (result.error, result.log_tail)
    (reason,) = result.reasons
    assert reason.startswith("out of memory: the training process was killed by SIGKILL") and "0.25 GiB" in reason
    evidence = result.metadata["host_memory"]
    assert evidence["limit_source"] == "host_memory_limit_gib" and evidence["limit_gib"] == limit_gib
    assert 0.9 * limit_gib * GIB <= evidence["peak_rss_bytes"] <= killed[0] + (64 << 20)


def test_hanging_worker_times_out(tmp_path, tiny, monkeypatch):
    _replace_command(monkeypatch, "import time; print('hanging', flush=True); time.sleep(600)")
    exp = get_experiment("finetune_full_benchmark-v1.0.0", PARAMS)
    started = time.monotonic()
    result = measure(exp, entity_of(exp, tiny), opts(tmp_path, timeout_seconds=3))
    assert time.monotonic() - started < 30
    assert result.status == "failed" and result.error.startswith("timeout") and "hanging" in result.log_tail


def test_stop_after_seconds_drops_the_two_token_rates(tmp_path, tiny):
    exp = get_experiment("finetune_full_benchmark-v1.0.0", {**PARAMS, "max_steps": 200, "stop_after_seconds": 0.5})
    result = measure(exp, entity_of(exp, tiny), opts(tmp_path))
    assert result.status == "valid", result.error
    for rate in ("train_tokens_per_second", "train_tokens_per_gpu_per_second"):  # spec 004: only these two
        assert rate not in result.properties
    assert result.metadata["stopped_by"] == "stop_after_seconds" and 1 <= result.metadata["steps"] < 200
    # each step: 4 entries longer than LENGTH tokens (gradient_accumulation_steps 1): 4 * LENGTH dataset tokens
    p = result.properties
    assert p["train_runtime"] >= 0.5  # HF stops at the end of the first step past the limit
    assert p["dataset_tokens_per_second"] == pytest.approx(
        4 * LENGTH * result.metadata["steps"] / p["train_runtime"], rel=1e-6
    )
    for rate in ("train_samples_per_second", "train_steps_per_second"):  # the spec drops only the token rates
        assert p[rate] > 0


def test_stability_experiment_reports_fractions(tmp_path, tiny):
    exp = get_experiment("finetune_full_stability-v1.0.0", {"dataset_id": "news-chars-256-entries-32"})
    entity = make_entity(
        exp,
        {
            "model_name": tiny,
            "model_max_length": LENGTH,
            "number_gpus": 0,
            "batch_size": 2,
            "gradient_accumulation_steps": 1,
        },
    )
    result = measure(exp, entity, opts(tmp_path))
    assert result.status == "valid", result.metadata
    assert result.properties == {"f_gpu_oom": 0.0, "f_other_error": 0.0, "f_no_error": 1.0, "is_valid": 1}
    assert [r["status"] for r in result.metadata["runs"]] == ["valid"] * 5


def test_cpu_processes_that_do_not_split_a_points_batch_judge_it_before_running(tmp_path, tiny):
    """An exploration's actuator option cpu_processes 3 over batch sizes 2 and 3: batch 2 cannot be split over 3
    processes, so that point is invalid with the reason and nothing runs (was: a failed measurement with a run
    folder, retried); the batch the processes divide is not judged."""
    exp = get_experiment("finetune_lora_benchmark-v1.0.0", PARAMS)
    result = measure(exp, entity_of(exp, tiny, batch_size=2), opts(tmp_path, cpu_processes=3))
    assert result.status == "invalid"
    assert result.reasons == ["batch_size 2 is not divisible by 3 processes (the actuator's cpu_processes)"]
    assert not (tmp_path / "run").exists()
    assert cpu_processes_reason({"batch_size": 3, "number_gpus": 0}, 3) is None
    assert cpu_processes_reason({"batch_size": 2, "number_gpus": 2}, 3) is None  # GPUs: not used


def test_ddp_with_two_cpu_processes_sums_throughput(tmp_path, tiny):
    exp = get_experiment("finetune_lora_benchmark-v1.0.0", PARAMS)
    result = measure(exp, entity_of(exp, tiny), opts(tmp_path, cpu_processes=2))
    assert result.status == "valid", (result.error, result.log_tail)
    assert result.metadata["world_size"] == 2
    p = result.properties
    # 3 steps x batch 4 (2 per process) x LENGTH tokens, over both processes
    assert p["dataset_tokens_per_second"] == pytest.approx(3 * 4 * LENGTH / p["train_runtime"], rel=1e-6)
