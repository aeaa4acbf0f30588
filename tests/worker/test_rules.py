"""Pure parts of the worker: stop rules, outcome classification, properties, flags, label masking."""

from __future__ import annotations

import random

import pytest

from tunebench.worker.args import parse_args
from tunebench.worker.results import STOP_AFTER_DROPPED_RATES, classify_exception, outcome, properties_from_results
from tunebench.worker.stopping import (
    AutoStopWindows,
    StopRule,
    auto_stop_reached,
    excluded_warmup_steps,
    should_stop,
    stop_after_reached,
    warmup_steps,
)

SPEC = AutoStopWindows()  # 60 s warm-up, 120 s and 10 steps stable


# ---------------------------------------------------------------------------------------------- auto-stop


def test_warmup_is_the_first_steps_reaching_60_s():
    assert warmup_steps([30.0, 29.9], 60) is None  # 59.9 s: still warming up
    assert warmup_steps([30.0, 30.0], 60) == 2  # exactly 60 s: "at least 60 seconds"
    assert warmup_steps([30.0, 29.0, 5.0], 60) == 3  # the crossing step is warm-up
    assert warmup_steps([61.0], 60) == 1
    assert warmup_steps([], 60) is None
    assert warmup_steps([1.0], 0) == 0


def test_stable_window_needs_120_s_and_10_steps():
    warm = [60.0]
    # 10 steps of 12 s = 120 s: both reached -> stop
    assert auto_stop_reached(warm + [12.0] * 10, SPEC)
    # 10 steps but 119.9 s -> not yet (the longer of 120 s and 10 steps)
    assert not auto_stop_reached(warm + [12.0] * 9 + [11.9], SPEC)
    # 9 steps of 20 s = 180 s -> not yet: fewer than 10 steps
    assert not auto_stop_reached(warm + [20.0] * 9, SPEC)
    assert auto_stop_reached(warm + [20.0] * 10, SPEC)
    # fast steps: 10 steps after 1 s each is not enough; stops at 120 s
    fast = warm + [1.0] * 119
    assert not auto_stop_reached(fast, SPEC)
    assert auto_stop_reached(fast + [1.0], SPEC)
    # steps during warm-up do not count towards the stable window
    assert not auto_stop_reached([5.0] * 11 + [12.0] * 9, SPEC)  # warm-up ends at step 12 (60 s)


def test_stop_after_seconds_boundary():
    assert not stop_after_reached([0.5, 0.49], 1.0)
    assert stop_after_reached([0.5, 0.5], 1.0)
    assert not stop_after_reached([100.0], -1)  # -1 = off
    assert should_stop([0.6, 0.6], 1.0, None)
    assert not should_stop([0.6, 0.6], -1, SPEC)


def test_incremental_rule_matches_the_pure_function():
    rng = random.Random(1)
    windows = AutoStopWindows(warmup_s=3.0, stable_s=2.0, stable_steps=4)
    for trial in range(200):
        stop_after = rng.choice([-1.0, rng.uniform(1, 8)])
        auto = rng.choice([None, windows])
        rule = StopRule(stop_after, auto)
        durations: list[float] = []
        for _ in range(60):
            durations.append(rng.choice([0.25, 0.5, rng.uniform(0.01, 1.0)]))
            assert rule.update(durations[-1]) == should_stop(durations, stop_after, auto), (trial, durations)


def test_excluded_warmup_steps():
    w = AutoStopWindows(warmup_s=1.0, stable_s=1.0, stable_steps=2)
    assert excluded_warmup_steps([0.5, 0.5, 0.6, 0.6], w) == 2
    assert excluded_warmup_steps([0.5, 0.5], w) == 0  # nothing after the warm-up: keep every step
    assert excluded_warmup_steps([0.5, 0.4], w) == 0  # warm-up never finished
    assert excluded_warmup_steps([0.5, 0.5, 0.6], None) == 0


# ---------------------------------------------------------------------------------------------- outcomes


class OutOfMemoryError(RuntimeError):  # stands in for torch.cuda.OutOfMemoryError (module checked below)
    pass


OutOfMemoryError.__module__ = "torch.cuda"


def test_oom_classification():
    assert classify_exception(OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))[0] == "oom"
    assert classify_exception(RuntimeError("CUDA error: out of memory"))[0] == "oom"
    assert classify_exception(RuntimeError("CUDA error: an illegal memory access was encountered"))[0] == "oom"
    assert classify_exception(RuntimeError("NCCL error: unhandled system error"))[0] == "error"
    assert classify_exception(ValueError("bad"))[0] == "error"
    status, reason = classify_exception(KeyError("x"), host_memory_exceeded="host memory limit exceeded: 2 GiB")
    assert status == "oom" and "host memory" in reason
    # host allocator failures are out of memory on CPU runs only
    alloc = RuntimeError("[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: can't allocate memory")
    assert classify_exception(alloc, on_cpu=True)[0] == "oom"
    assert classify_exception(alloc, on_cpu=False)[0] == "error"
    import torch

    assert classify_exception(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20 MiB")) == (
        "oom",
        "GPU out of memory: OutOfMemoryError: CUDA out of memory. Tried to allocate 20 MiB",
    )
    # wrapped: the cause chain is searched
    try:
        try:
            raise RuntimeError("CUDA error: out of memory")
        except RuntimeError as inner:
            raise ValueError("while running the step") from inner
    except ValueError as outer:
        assert classify_exception(outer)[0] == "oom"


def test_outcome_any_oom_invalidates():
    ok = {"status": "ok", "rank": 0, "world_size": 2}
    assert outcome([ok, {**ok, "rank": 1}]) == ("valid", None)
    assert outcome([ok, {**ok, "rank": 1, "status": "oom", "reason": "GPU out of memory"}])[0] == "invalid"
    assert outcome([{**ok, "status": "error", "reason": "x"}, {**ok, "rank": 1, "status": "oom"}])[0] == "invalid"
    assert outcome([ok, {**ok, "rank": 1, "status": "error", "reason": "x"}])[0] == "failed"
    assert outcome([ok])[0] == "failed"  # rank 1 wrote nothing
    assert outcome([])[0] == "failed"


# ---------------------------------------------------------------------------------------------- properties


def _rank(rank, durations, samples, non_pad, padded, warmup=0, system=None, torch_memory=None, dataset=None, world=2):
    n = len(durations)
    dataset = non_pad if dataset is None else dataset
    return {
        "status": "ok",
        "rank": rank,
        "world_size": world,
        "steps": {
            "durations_s": durations,
            "warmup": warmup,
            "local": {
                "samples": [samples] * n,
                "non_pad_tokens": [non_pad] * n,
                "padded_tokens": [padded] * n,
                "dataset_tokens": [dataset] * n,
            },
            "global": None,
        },
        "system": system,
        "torch_memory": torch_memory,
    }


def _gpu(gid, util, mem, mem_max, watts, percent):
    return {
        "id": gid,
        "compute_utilization_avg": util,
        "memory_utilization_avg": mem,
        "memory_utilization_max": mem_max,
        "power_watts_avg": watts,
        "power_percent_avg": percent,
    }


def test_properties_sum_ranks_and_divide_per_gpu():
    system = {
        "cpu_compute_utilization": 150.0,
        "cpu_memory_utilization": 40.0,
        "gpus": [_gpu("GPU-a", 80.0, 50.0, 70.0, 300.0, 43.0), _gpu("GPU-b", 60.0, 30.0, 90.0, 200.0, 29.0)],
    }
    ranks = [
        _rank(
            0,
            [2.0, 1.0, 1.0],
            4,
            400,
            512,
            dataset=396,
            system=system,
            torch_memory={"max_allocated_gib": 10.0, "max_reserved_gib": 12.0},
        ),
        _rank(
            1,
            [2.0, 1.0, 1.0],
            4,
            300,
            640,
            dataset=298,
            torch_memory={"max_allocated_gib": 11.0, "max_reserved_gib": 11.5},
        ),
    ]
    p = properties_from_results(ranks, number_gpus=2)
    assert p["train_runtime"] == 4.0
    assert p["train_samples_per_second"] == 24 / 4
    assert p["train_steps_per_second"] == 3 / 4
    # the spec: num_gpus x rank 0's rate (padding included), and rank 0's rate per GPU; rank 1's own padding
    # (640 a step, not 512) is not in them
    assert p["train_tokens_per_second"] == 2 * 3 * 512 / 4
    assert p["train_tokens_per_gpu_per_second"] == 3 * 512 / 4
    # the spec's note 3 count of every rank's entries (not the attention mask's 700 a step)
    assert p["dataset_tokens_per_second"] == 3 * (396 + 298) / 4
    assert p["dataset_tokens_per_second_per_gpu"] == 3 * (396 + 298) / 4 / 2
    assert (p["gpu_compute_utilization_min"], p["gpu_compute_utilization_avg"], p["gpu_compute_utilization_max"]) == (
        60.0,
        70.0,
        80.0,
    )
    assert p["gpu_memory_utilization_peak"] == 90.0
    assert p["gpu_power_watts_avg"] == 250.0 and p["gpu_power_percent_max"] == 43.0
    assert p["cpu_compute_utilization"] == 150.0 and p["cpu_memory_utilization"] == 40.0
    assert p["gpu_memory_allocated_peak_gib"] == 11.0 and p["gpu_memory_reserved_peak_gib"] == 12.0


def test_properties_warmup_and_stop_after():
    ranks = [_rank(0, [5.0, 5.0, 1.0, 1.0], 2, 100, 128, warmup=2, world=1)]
    p = properties_from_results(ranks, number_gpus=0, auto_stop="WARMUP_60S_STABLE_120S_OR_10_STEPS")
    assert p["train_runtime"] == 2.0 and p["dataset_tokens_per_second"] == 100.0
    assert p["train_steps_per_second"] == 1.0  # kept with auto-stop: computed from real post-warm-up steps
    assert all(p[k] == 0.0 for k in p if k.startswith("gpu_"))
    q = properties_from_results(ranks, number_gpus=0, stop_after_seconds=30)
    assert not set(STOP_AFTER_DROPPED_RATES) & set(q) and q["dataset_tokens_per_second_per_gpu"] == 100.0
    assert set(STOP_AFTER_DROPPED_RATES) == {"train_tokens_per_second", "train_tokens_per_gpu_per_second"}
    # spec 004 omits only the two token rates: the samples and steps rates stay
    assert q["train_steps_per_second"] == 1.0 and q["train_samples_per_second"] == 2.0
    with pytest.raises(ValueError):
        properties_from_results([_rank(0, [5.0], 2, 100, 128, warmup=1)], 0)
    with pytest.raises(ValueError):
        properties_from_results([{**ranks[0], "status": "oom", "reason": "x"}], 0)


def test_gpu_properties_ignored_for_cpu_runs():
    system = {
        "cpu_compute_utilization": 90.0,
        "cpu_memory_utilization": 5.0,
        "gpus": [_gpu("GPU-a", 80.0, 50.0, 70.0, 300.0, 43.0)],
    }
    p = properties_from_results([_rank(0, [1.0], 1, 10, 10, system=system)], number_gpus=0)
    assert p["gpu_compute_utilization_avg"] == 0.0 and p["cpu_compute_utilization"] == 90.0


# ---------------------------------------------------------------------------------------------- flags, data


# spec 004 "Commandline" (LoRA experiment) as a shell would pass it.
SPEC_COMMAND = r"""
--model_name_or_path m --torch_dtype bfloat16 --use_flash_attn False --training_data_path d.jsonl
--response_template "\n### Response:" --dataset_text_field output --log_level debug --num_train_epochs 1
--per_device_train_batch_size 4 --max_seq_length 512 --eval_strategy no --output_dir o
--gradient_accumulation_steps 4 --save_strategy no --learning_rate 1e-05 --weight_decay 0.0
--warmup_ratio 0.03 --lr_scheduler_type cosine --logging_steps 1 --include_tokens_per_second True
--gradient_checkpointing True --packing False --peft_method lora --target_modules q_proj v_proj
--optim adamw_torch --bf16 False --gradient_checkpointing_kwargs='{"use_reentrant": false}' --fast_moe 0
"""


def test_spec_command_line_parses():
    import shlex

    args, unknown = parse_args(shlex.split(SPEC_COMMAND) + ["--some_fms_flag", "1"])
    assert args.response_template == "\n### Response:"  # unescaped, as fms-hf-tuning does
    assert args.gradient_checkpointing is True and args.bf16 is False and args.use_flash_attn is False
    assert args.target_modules == ["q_proj", "v_proj"] and args.fast_moe == ["0"]
    assert args.gradient_checkpointing_kwargs == {"use_reentrant": False}
    assert args.auto_stop_method is None and args.stop_after_seconds == -1.0
    assert unknown == ["--some_fms_flag", "1"]


def test_completion_only_labels():
    from tunebench.training.data import IGNORE_INDEX, CompletionCollator, tokenize_record
    from tunebench.training.tokenizer import train_bpe_tokenizer

    text = "### Input:\nthe market rose\n\n### Response: shares rose"
    tok = train_bpe_tokenizer([text] * 20, 300)
    ex = tokenize_record(tok, text, "\n### Response:", 64)
    assert ex.input_ids[0] == tok.bos_token_id and ex.input_ids[-1] == tok.eos_token_id
    trained = [t for t, lab in zip(ex.input_ids, ex.labels) if lab != IGNORE_INDEX]
    assert tok.decode(trained[:-1]).strip() == "shares rose" and trained[-1] == tok.eos_token_id
    assert all(lab == IGNORE_INDEX for lab in ex.labels[: len(ex.labels) - len(trained)])
    assert ex.dataset_tokens == len(tok(text)["input_ids"]) == len(ex.input_ids) - 1  # the spec's note 3: no EOS
    # truncation keeps the first max_length tokens; no template -> nothing trained
    short = tokenize_record(tok, text, "\n### Response:", 5)
    assert short.input_ids == ex.input_ids[:5] and all(lab == IGNORE_INDEX for lab in short.labels)
    assert short.dataset_tokens == 5
    assert not tokenize_record(tok, "no template here", "\n### Response:", 64).has_template
    # long records tokenized on a prefix give the same ids as the whole text
    long_text = text + " rose" * 5000
    assert tokenize_record(tok, long_text, "\n### Response:", 40).input_ids == tok(long_text)["input_ids"][:40]
    batch = CompletionCollator(tok.pad_token_id)(
        [
            {"input_ids": [1, 2, 3], "labels": [-100, 2, 3], "entry_index": 7, "dataset_tokens": 2},
            {"input_ids": [1], "labels": [1], "entry_index": 2, "dataset_tokens": 1},
        ]
    )
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 2, 3], [1, -100, -100]] and batch["entry_index"] == [7, 2]
    assert batch["dataset_tokens"] == [2, 1]
    assert batch["input_ids"][1, 1].item() == tok.pad_token_id  # right padding


def test_trained_tokens_sum_every_step_and_rank_and_name_the_cause_when_zero():
    from tunebench.worker.results import no_trained_tokens_reason, trained_tokens

    ranks = [_rank(0, [1.0, 1.0], 2, 100, 128, warmup=1), _rank(1, [1.0, 1.0], 2, 100, 128)]
    assert trained_tokens(ranks) is None  # records that do not count them
    ranks[0]["steps"]["local"]["trained_tokens"] = [5, 7]  # warm-up steps count: they trained too
    ranks[1]["steps"]["local"]["trained_tokens"] = [0, 3]
    assert trained_tokens(ranks) == 15
    for r in ranks:
        r["steps"]["local"]["trained_tokens"] = [0, 0]
    assert trained_tokens(ranks) == 0
    cut = no_trained_tokens_reason(
        {"records": 32, "records_without_response_template": 0, "max_length": 64, "records_without_label_tokens": 32},
        "\n### Response:",
    )
    assert cut.startswith("no label tokens trained") and "cut off" in cut and "max_length 64" in cut
    assert "32 of 32 records" in cut and "raise model_max_length" in cut
    missing = no_trained_tokens_reason({"records": 4, "records_without_response_template": 4}, "\n### Response:")
    assert "no record of the data set contains the response template" in missing
