"""Values the spec's domains accept that tunebench used to refuse, and what they do when measured.

max_steps 0 and -1 both respect num_train_epochs (transformers runs max_steps only when > 0; the spec:
"num_train_epochs ... Ignored if max_steps is greater than 0"); stop_after_seconds <= 0 is off (the spec omits
the HF rates only "when stop_after_seconds is greater than 0"); the stability experiment's torch_dtype takes
float64 and trains in it. Real tiny runs of the worker on the CPU.
"""

from __future__ import annotations

import math

import pytest
from worker.test_training import run

from tunebench.actuators.launch import build_launch_plan
from tunebench.spec.experiments import get_experiment, make_entity
from tunebench.training import model as model_mod
from tunebench.training.model import cpu_precision_note

pytestmark = pytest.mark.slow  # trains tiny models


def test_max_steps_0_trains_num_train_epochs(tmp_path):
    lora = get_experiment("finetune_lora_benchmark-v1.0.0")
    entity = make_entity(
        lora, {"model_name": "smollm2-135m", "model_max_length": 64, "number_gpus": 0, "batch_size": 2, "max_steps": 0}
    )
    args = build_launch_plan(lora, entity).worker_args
    assert args[args.index("--max_steps") + 1] == "-1"  # what every transformers version reads as "the epochs"
    rc, r, agg = run(tmp_path, steps=0, num_train_epochs=1)  # 48 records, 2 per micro-batch
    assert rc == 0, r.get("reason")
    accumulation = int(r["args"]["gradient_accumulation_steps"])
    assert r["steps"]["total"] == math.ceil(48 / 2 / accumulation)  # one epoch, as with max_steps -1
    assert agg["properties"]["train_runtime"] > 0


def test_stop_after_seconds_0_is_off(tmp_path):
    rc, r, agg = run(tmp_path, steps=2, stop_after_seconds=0)
    assert rc == 0, r.get("reason")
    assert r["steps"]["total"] == 2 and r["steps"]["stopped_by"] is None  # ran its max_steps
    props = agg["properties"]
    assert props["train_tokens_per_second"] > 0 and props["train_tokens_per_gpu_per_second"] > 0  # kept: not > 0


def test_stability_experiment_trains_in_float64(tmp_path):
    stability = get_experiment("finetune_full_stability-v1.0.0")
    entity = make_entity(
        stability,
        {
            "model_name": "smollm2-135m",
            "model_max_length": 64,
            "number_gpus": 0,
            "batch_size": 2,
            "torch_dtype": "float64",
        },
    )
    args = build_launch_plan(stability, entity).worker_args
    assert args[args.index("--torch_dtype") + 1] == "float64"
    rc, r, _ = run(tmp_path, steps=2, torch_dtype="float64", peft_method="none")
    assert rc == 0, r.get("reason")
    assert r["metadata"]["dtype"] == "float64" and "precision_note" not in r["metadata"]


def test_float64_is_native_on_every_cpu_and_bf16_autocast_over_it_runs_as_asked(monkeypatch):
    monkeypatch.setattr(model_mod, "cpu_has_fast_bf16", lambda: False)  # a CPU without AVX512-BF16 / AMX
    assert cpu_precision_note("float64", bf16=False, on_gpu=False) is None
    note = cpu_precision_note("float64", bf16=True, on_gpu=False)
    assert note is not None and note.startswith("bfloat16 trained as asked")
