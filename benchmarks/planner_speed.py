"""Planner speed: 100,000 entities through the batch API (tunebench.plan.predict_many).

    PYTHONPATH=src python benchmarks/planner_speed.py [--n 100000]

Builds a space of full and LoRA entities over models, GPU counts, sequence lengths, batch sizes, GPU
types, accumulation and checkpointing, then times predict_many on it (target: < 5 s wall). Entity
construction is timed separately (the explorer already holds entities).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

from tunebench.experiments import get_experiment, make_entity
from tunebench.plan import predict_many

MODELS = ("llama3.1-8b", "mistral-7b-v0.1", "granite-3.1-8b-instruct", "llama3-70b", "granite-4.0-h-tiny",
          "mixtral-8x7b-instruct-v0.1", "granite-3.1-2b", "llama3.2-3b")  # fmt: skip
DATASETS = ("news-tokens-16384plus-entries-4096", "news-chars-2048-entries-4096")


def space(n: int):
    exps = [get_experiment("finetune_full_benchmark-v1.0.0"), get_experiment("finetune_lora_benchmark-v1.0.0")]
    grid = itertools.product(exps, MODELS, (1, 2, 4, 8), (512, 1024, 2048, 4096, 8192), (8, 16, 32, 64, 128),
                             ("A100-80GB", "H100", "L40S", "H200"), (1, 2, 4), (True, False), DATASETS, (4, 8, 16))  # fmt: skip
    out = []
    for exp, model, gpus, length, batch, gpu, ga, gc, data, r in grid:
        raw = {"model_name": model, "number_gpus": gpus, "model_max_length": length, "batch_size": batch,
               "gpu_model": gpu, "gradient_accumulation_steps": ga, "gradient_checkpointing": gc, "dataset_id": data}  # fmt: skip
        if exp.uses_lora:
            raw["r"] = r
        elif r != 4:
            continue
        out.append((exp, raw))
        if len(out) == n:
            break
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    args = ap.parse_args(argv)
    raw = space(args.n)
    t = time.perf_counter()
    items = [(exp, make_entity(exp, values)) for exp, values in raw]
    build = time.perf_counter() - t
    predict_many(items[:100])  # warm caches (catalog, calibration file)
    t, c = time.perf_counter(), time.process_time()
    results = predict_many(items)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    valid = sum(r.status == "valid" for r in results)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"entities: {len(items):,} (built in {build:.2f} s, not counted)")
    print(f"predict_many: {wall:.2f} s wall, {cpu:.2f} s CPU, {len(items) / wall:,.0f} entities/s "
          f"(load average {load:.1f} on {os.cpu_count()} CPUs)")  # fmt: skip
    print(f"valid (fit and obey the rules): {valid:,}; invalid: {len(items) - valid:,}")
    print(f"target < 5 s: {'met' if wall < 5 else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
