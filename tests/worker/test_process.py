"""The worker as the launch plan runs it: ``python -m tunebench.worker`` and ``accelerate launch`` (subprocesses)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import worker_data
from layout import SRC

pytestmark = pytest.mark.slow  # subprocesses that train

_WORDS = (
    "market shares rose after the company reported strong quarterly earnings".split()
)  # this file's own records (worker_data.write_data)
SRC = str(SRC)
TIMEOUT_S = 240  # a hung worker fails the test instead of hanging CI


def write_data(path: Path, n: int = 48, seed: int = 0) -> Path:
    return worker_data.write_data(path, n, seed, words=_WORDS)


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def _flags(tmp_path: Path, **flags) -> list[str]:
    data = tmp_path / "data.jsonl"
    if not data.exists():
        write_data(data)
    base = {
        "tunebench_model": "llama3-8b",
        "tunebench_tiny": "True",
        "weights": "random",
        "training_data_path": str(data),
        "max_steps": "3",
        "per_device_train_batch_size": "2",
        "max_seq_length": "48",
        "torch_dtype": "float32",
        "use_flash_attn": "False",
        "output_dir": str(tmp_path / "out"),
        "result_path": str(tmp_path / "result.json"),
    }
    base.update({k: str(v) for k, v in flags.items()})
    return [x for k, v in base.items() for x in (f"--{k}", v)]


def _result(tmp_path: Path, rank: int = 0) -> dict:
    return json.loads((tmp_path / f"result.json.rank{rank}.json").read_text())


def _worker(args: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tunebench.worker", *args],
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def test_spec_command_line_runs_and_prints_the_result(tmp_path):
    """spec 004's LoRA command line (fms flags included) + tunebench's flags, as launch.py passes them."""
    extra = [
        "--response_template",
        "\\n### Response:",
        "--dataset_text_field",
        "output",
        "--log_level",
        "debug",
        "--num_train_epochs",
        "1",
        "--eval_strategy",
        "no",
        "--gradient_accumulation_steps",
        "2",
        "--save_strategy",
        "no",
        "--learning_rate",
        "1e-05",
        "--weight_decay",
        "0.0",
        "--warmup_ratio",
        "0.03",
        "--lr_scheduler_type",
        "cosine",
        "--logging_steps",
        "1",
        "--include_tokens_per_second",
        "True",
        "--gradient_checkpointing",
        "True",
        "--packing",
        "False",
        "--peft_method",
        "lora",
        "--target_modules",
        "q_proj",
        "v_proj",
        "--r",
        "4",
        "--lora_alpha",
        "16",
        "--lora_dropout",
        "0.05",
        "--optim",
        "adamw_torch",
        "--bf16",
        "False",
        "--gradient_checkpointing_kwargs",
        '{"use_reentrant": false}',
        "--fast_moe",
        "0",
        "--stop_after_seconds",
        "-1",
        "--auto_stop_method",
        "None",
        "--seed",
        "7",
        "--metrics_interval_seconds",
        "0.2",
        "--aim_db",
        "ignored",
    ]
    proc = _worker(_flags(tmp_path, torch_dtype="bfloat16") + extra)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("TUNEBENCH_RESULT "))
    printed = json.loads(line.split(" ", 1)[1])
    agg = json.loads((tmp_path / "result.json").read_text())
    assert printed["status"] == "ok" and printed["properties"] == agg["properties"]
    assert sum(x.startswith("TUNEBENCH_STEP ") for x in proc.stdout.splitlines()) == 3
    r = _result(tmp_path)
    assert r["unknown_args"] == ["--aim_db", "ignored"]
    from tunebench.training.model import cpu_has_fast_bf16

    # pure bf16 (spec default) on any CPU: the entity's precision runs, natively or (slowly) without AVX512-BF16
    assert r["metadata"]["dtype"] == r["metadata"]["compute_dtype"] == "bfloat16" and r["args"]["bf16"] is False
    assert ("precision_note" in r["metadata"]) != cpu_has_fast_bf16()
    assert r["data"]["records_without_response_template"] == 0


def test_gpu_only_method_fails_fast_with_exit_code(tmp_path):
    proc = _worker(_flags(tmp_path, peft_method="qlora"))
    assert proc.returncode == 1
    r = _result(tmp_path)
    assert r["status"] == "error" and "NVIDIA GPU" in r["reason"] and not (tmp_path / "result.json").exists()


def test_host_memory_limit_is_out_of_memory(tmp_path):
    """Real: a ~68M-parameter fp32 model loads under a 1.1 GiB limit; gradients + AdamW states do not fit."""
    config = {
        "model_type": "llama",
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "vocab_size": 512,
        "max_position_embeddings": 512,
    }
    (tmp_path / "big.json").write_text(json.dumps(config))
    proc = _worker(
        _flags(
            tmp_path,
            tunebench_model=str(tmp_path / "big.json"),
            tunebench_tiny="False",
            host_memory_limit_gib=1.1,
            per_device_train_batch_size=1,
            max_seq_length=8,
        )
    )
    r = _result(tmp_path)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert r["status"] == "oom" and "host memory" in r["reason"]
    assert r["phase"] == "train"  # the model itself fitted: the limit was crossed by training
    assert r["host_memory"]["peak_rss_gib"] > 1.1 and r["exception"]["type"].endswith("HostMemoryLimitExceeded")


def test_sigterm_writes_a_failed_result(tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tunebench.worker",
            *_flags(tmp_path, max_steps=1_000_000, per_device_train_batch_size=1),
        ],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        for line in proc.stdout:  # wait until training runs
            if line.startswith("TUNEBENCH_STEP "):
                break
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 1
    r = _result(tmp_path)
    assert r["status"] == "error" and "SIGTERM" in r["reason"] and r["phase"] == "train"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_two_cpu_processes_sum_throughput_and_agree_on_stop(tmp_path):
    """DDP over gloo with 2 CPU processes (hf-stack.md §6): accelerate launch --multi_gpu without a GPU."""
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(_free_port()),
        "-m",
        "tunebench.worker",
        *_flags(
            tmp_path,
            tunebench_model="granite-3.1-2b",
            max_steps=100000,
            stop_after_seconds=1.5,
            gradient_accumulation_steps=2,
            peft_method="lora",
            gradient_checkpointing="True",
        ),
    ]
    proc = subprocess.run(cmd, env=_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r0, r1 = _result(tmp_path, 0), _result(tmp_path, 1)
    assert r0["world_size"] == r1["world_size"] == 2 and r0["metadata"]["distributed_type"] == "MULTI_CPU"
    assert r0["metadata"]["wrapped_model_class"] == "DistributedDataParallel"
    # the stop decision is agreed: same steps, same (agreed) durations, on both ranks
    assert r0["steps"]["stopped_by"] == r1["steps"]["stopped_by"] == "stop_after_seconds"
    assert r0["steps"]["durations_s"] == r1["steps"]["durations_s"]
    n = r0["steps"]["total"]
    assert n == r1["steps"]["total"] >= 2
    # global counts = sum over the two processes; each consumed its own entries
    for key in ("samples", "non_pad_tokens", "padded_tokens", "dataset_tokens"):
        summed = [a + b for a, b in zip(r0["steps"]["local"][key], r1["steps"]["local"][key])]
        assert r0["steps"]["global"][key] == r1["steps"]["global"][key] == summed
    assert r0["steps"]["global"]["samples"] == [2 * 2 * 2] * n  # 2 processes x batch 2 x GAS 2
    assert r1.get("system") is None and r0["system"]["n_samples"] >= 2  # sampler on local rank 0 only
    props = json.loads((tmp_path / "result.json").read_text())["properties"]
    runtime = sum(r0["steps"]["durations_s"])
    assert props["train_runtime"] == pytest.approx(runtime)
    assert props["dataset_tokens_per_second"] == pytest.approx(sum(r0["steps"]["global"]["dataset_tokens"]) / runtime)
    assert "train_tokens_per_second" not in props  # stop_after_seconds > 0 (spec 004)


def _ddp_cpu(tmp_path: Path, **flags) -> subprocess.CompletedProcess:
    """accelerate launch --multi_gpu with 2 CPU processes (DDP over gloo) of the worker."""
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(_free_port()),
        "-m",
        "tunebench.worker",
        *_flags(tmp_path, **flags),
    ]
    return subprocess.run(
        cmd, check=False, env=_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=TIMEOUT_S
    )


def test_ddp_train_tokens_are_world_size_times_rank_0s_rate(tmp_path):
    """The spec: train_tokens_per_second = num_gpus x rank 0's rate, train_tokens_per_gpu_per_second = rank 0's
    rate. Records of varied length padded per micro-batch: the two ranks pad to different lengths, so the
    sum over ranks would give another number. dataset_tokens (the spec's note 3) are summed over both ranks."""
    from transformers import AutoTokenizer

    max_len = 128  # no record is cut: every micro-batch pads to its own longest record
    proc = _ddp_cpu(
        tmp_path, max_steps=3, max_seq_length=max_len, gradient_accumulation_steps=1, tunebench_number_gpus=2
    )  # the per-GPU rates of a 2-GPU entity (gloo stands in for NCCL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r0, r1 = _result(tmp_path, 0), _result(tmp_path, 1)
    props = json.loads((tmp_path / "result.json").read_text())["properties"]
    runtime = props["train_runtime"]
    assert runtime == pytest.approx(sum(r0["steps"]["durations_s"]))
    # rank 0's padded tokens, re-tokenised here: per micro-batch, batch x its longest record (BOS + text + EOS)
    tok = AutoTokenizer.from_pretrained(r0["metadata"]["tokenizer"]["path"])
    texts = [json.loads(line)["output"] for line in (tmp_path / "data.jsonl").read_text().splitlines()]
    ids = [tok(t)["input_ids"] for t in texts]
    assert max(len(x) for x in ids) < max_len

    def padded(r):
        consumed = r["consumed"]["indices"]
        return sum(2 * max(len(ids[i]) + 1 for i in consumed[j : j + 2]) for j in range(0, len(consumed), 2))

    rank0, rank1 = padded(r0), padded(r1)
    assert rank0 == sum(r0["steps"]["local"]["padded_tokens"]) and rank1 == sum(r1["steps"]["local"]["padded_tokens"])
    assert rank0 != rank1  # otherwise both formulas agree and this test could not tell them apart
    assert props["train_tokens_per_gpu_per_second"] == pytest.approx(rank0 / runtime, rel=1e-12)
    assert props["train_tokens_per_second"] == pytest.approx(2 * rank0 / runtime, rel=1e-12)
    assert props["train_tokens_per_second"] != pytest.approx((rank0 + rank1) / runtime, rel=1e-6)
    dataset = sum(len(ids[i]) for r in (r0, r1) for i in r["consumed"]["indices"])  # all shorter than max_len
    assert props["dataset_tokens_per_second"] * runtime == pytest.approx(dataset, rel=1e-12)
    assert props["dataset_tokens_per_second_per_gpu"] == pytest.approx(dataset / 2 / runtime, rel=1e-12)
