"""Planner speed: 100,000 entities over 10+ architectures warm, and the first plan of a new one cold.

    .venv/bin/python benchmarks/planner_speed.py [--n 100000]

Warm: a space of full and LoRA entities over 12 architectures (dense, GQA, MoE, hybrid Mamba, code
and small models), GPU counts, sequence lengths, batch sizes, GPU types, accumulation and
checkpointing goes through predict_many once the traces are cached (target < 5 s wall). Cold: a
fresh process with an empty cache plans one entity of an architecture it has never seen (model
built on the meta device, reduced model traced; target < 20 s on the 2-core machine).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time

from tunebench.plan import predict_many
from tunebench.spec.experiments import get_experiment, make_entity

MODELS = ("llama3.1-8b", "mistral-7b-v0.1", "granite-3.1-8b-instruct", "llama3-70b", "granite-4.0-h-tiny",
          "mixtral-8x7b-instruct-v0.1", "granite-3.1-2b", "llama3.2-3b", "granite-34b-code-base", "smollm2-135m",
          "granite-3.1-3b-a800m-instruct", "llama3.2-1b")  # fmt: skip
DATASETS = ("news-tokens-16384plus-entries-4096", "news-chars-2048-entries-4096")


def space(n: int):
    exps = [get_experiment("finetune_full_benchmark-v1.0.0"), get_experiment("finetune_lora_benchmark-v1.0.0")]
    grid = itertools.product(
        (1, 2, 4, 8),
        (512, 1024, 2048, 4096, 8192),
        (8, 16, 32, 64, 128),
        ("A100-80GB", "H100", "L40S", "H200"),
        (1, 2, 4),
        (True, False),
        DATASETS,
        (4, 8, 16),
        exps,
        MODELS,
    )
    out = []
    for gpus, length, batch, gpu, ga, gc, data, r, exp, model in grid:
        raw = {
            "model_name": model,
            "number_gpus": gpus,
            "model_max_length": length,
            "batch_size": batch,
            "gpu_model": gpu,
            "gradient_accumulation_steps": ga,
            "gradient_checkpointing": gc,
            "dataset_id": data,
        }
        if exp.uses_lora:
            raw["r"] = r
            if model == "granite-34b-code-base":
                raw["target_modules"] = "c_attn"
        elif r != 4:
            continue
        out.append((exp, raw))
        if len(out) == n:
            break
    return out


def cold_plan_seconds(model: dict) -> float:
    """Wall time of `tunebench plan` of a never-seen architecture in a fresh process with an empty cache."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "config.json")
        with open(path, "w") as fh:
            json.dump(model, fh)
        env = {**os.environ, "TUNEBENCH_HOME": os.path.join(tmp, "home")}
        cmd = [
            sys.executable,
            "-m",
            "tunebench.commands.main",
            "plan",
            "finetune_lora_benchmark-v1.0.0",
            f"model_name={path}",
            "model_max_length=4096",
            "number_gpus=1",
            "batch_size=4",
            "gpu_model=A100-80GB",
            "target_modules=q_proj,v_proj",
            "--json",
        ]
        t = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, capture_output=True)
        return time.perf_counter() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    args = ap.parse_args(argv)
    raw = space(args.n)
    t = time.perf_counter()
    items = [(exp, make_entity(exp, values)) for exp, values in raw]
    build = time.perf_counter() - t
    t = time.perf_counter()
    predict_many(items)  # cold: structures and traces of every architecture and set-up, cached on disk
    cold = time.perf_counter() - t
    t, c = time.perf_counter(), time.process_time()
    results = predict_many(items)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    valid = sum(r.status == "valid" for r in results)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    models = len({values["model_name"] for _, values in raw})
    print(f"entities: {len(items):,} over {models} architectures (built in {build:.2f} s, not counted)")
    print(f"first pass (tracing every architecture and set-up, filling the cache): {cold:.1f} s")
    print(
        f"predict_many, warm: {wall:.2f} s wall, {cpu:.2f} s CPU, {len(items) / wall:,.0f} entities/s "
        f"(load average {load:.1f} on {os.cpu_count()} CPUs)"
    )
    print(f"valid (fit and obey the rules): {valid:,}; invalid: {len(items) - valid:,}")
    print(f"target < 5 s warm: {'met' if wall < 5 else 'NOT MET'}")
    new = {
        "model_type": "qwen3",
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": True,
    }  # Qwen3-4B's config.json
    seconds = cold_plan_seconds(new)
    print(f"cold `tunebench plan` of a new architecture (Qwen3-4B config, empty cache, fresh process): {seconds:.1f} s")
    print(f"target < 20 s cold: {'met' if seconds < 20 else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
