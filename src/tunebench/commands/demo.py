"""The demo (`make demo`, `tunebench demo`): the product in five commands, as a user types them.

1. plan a real GPU job: Llama-3.1-8B LoRA at 8,192 tokens on 2 x A100-80GB (memory per GPU with its
   breakdown, the out-of-memory probability, throughput, time and cost);
2. recommend: the fewest GPUs, the fastest and the cheapest configuration, full vs LoRA vs QLoRA;
3. measure a tiny job for real on this CPU: smollm2-135m LoRA, random weights (nothing downloaded),
   2 steps of batch 2 at 256 tokens, kept in the demo's own store;
4. the planner's prediction of that job beside its measurement (plan --compare);
5. the HTML report of the demo's store.

Everything goes in one folder (its store, the run's files, the report); the store is started afresh on
every run, so the demo can be run again and shows the same steps.
"""

from __future__ import annotations

from pathlib import Path

LORA = "finetune_lora_benchmark-v1.0.0"
GPU_JOB = ["model_name=llama-3.1-8b", "model_max_length=8192", "batch_size=8", "gpu_model=A100-80GB"]
PRICE = ["--price-per-gpu-hour", "2.5"]
# the CPU job: 2 optimizer steps without gradient accumulation (the spec's default of 4 would take
# four times as long), on the smallest of the spec's data sets
CPU_PARAMETERS = ["-p", "max_steps=2", "-p", "gradient_accumulation_steps=1", "-p",
                  "dataset_id=news-chars-512-entries-4096"]  # fmt: skip
CPU_JOB = ["model_name=smollm2-135m", "model_max_length=256", "number_gpus=0", "batch_size=2"]
STORE, RUN, REPORT = "runs.db", "run", "report.html"


def steps(folder: Path) -> list[tuple[str, list[str]]]:
    """(what the step shows, the tunebench command line) of each step, writing under folder."""
    store = str(folder / STORE)
    return [
        (
            "Plan a GPU job: memory per GPU, out-of-memory probability, speed, time, cost",
            ["plan", LORA, *GPU_JOB, "number_gpus=2", *PRICE],
        ),
        (
            "How many GPUs: the fewest that fit, the fastest, the cheapest; full vs LoRA vs QLoRA",
            ["recommend", LORA, *GPU_JOB, "--max-gpus", "8", *PRICE],
        ),
        (
            "Measure a tiny job for real on this CPU (random weights: nothing is downloaded)",
            [
                "run",
                LORA,
                *CPU_JOB,
                *CPU_PARAMETERS,
                "--weights",
                "random",
                "--store",
                store,
                "--output-dir",
                str(folder / RUN),
            ],
        ),
        (
            "The planner's prediction of that job beside its measurement",
            ["plan", LORA, *CPU_JOB, *CPU_PARAMETERS, "--compare", "--store", store],
        ),
        (
            "Everything in the store as one HTML file (opens offline)",
            ["report", "--store", store, "-o", str(folder / REPORT)],
        ),
    ]


def fresh_store(folder: Path) -> Path:
    """The demo's folder, made if missing, with the previous demo's store removed (a re-run starts the same)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / STORE).unlink(missing_ok=True)
    return folder
