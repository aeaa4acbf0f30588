"""The demo (`make demo`, `tunebench demo`): the product in five commands, as a user types them.

1. plan a real GPU job: Llama-3.1-8B LoRA at 8,192 tokens on 2 x A100-80GB (memory per GPU with its
   breakdown, the out-of-memory probability, throughput, time and cost);
2. recommend: the fewest GPUs, the fastest and the cheapest configuration, full vs LoRA vs QLoRA;
3. measure a tiny job for real on this CPU: smollm2-135m LoRA, random weights (nothing downloaded),
   2 steps of batch 2 at 256 tokens, kept in the demo's own store;
4. the planner's prediction of that job beside its measurement (plan --compare);
5. the HTML report of the demo's store.

Everything goes in one folder (its store, the run's files, the report), marked as the demo's by a file of
its own; the store is started afresh on every run, so the demo can be run again and shows the same steps.
A folder the demo did not make is refused: the demo replaces what it finds there.
"""

from __future__ import annotations

from pathlib import Path

from tunebench.errors import InputError

LORA = "finetune_lora_benchmark-v1.0.0"
GPU_JOB = ["model_name=llama-3.1-8b", "model_max_length=8192", "batch_size=8", "gpu_model=A100-80GB"]
PRICE = ["--price-per-gpu-hour", "2.5"]
# the CPU job: 2 optimizer steps without gradient accumulation (the spec's default of 4 would take
# four times as long), on the smallest of the spec's data sets
CPU_PARAMETERS = ["-p", "max_steps=2", "-p", "gradient_accumulation_steps=1", "-p",
                  "dataset_id=news-chars-512-entries-4096"]  # fmt: skip
CPU_JOB = ["model_name=smollm2-135m", "model_max_length=256", "number_gpus=0", "batch_size=2"]
STORE, RUN, REPORT = "runs.db", "run", "report.html"
# the file that marks a folder as the demo's own: a re-run replaces what is in it (fresh_store)
MARKER = ".tunebench-demo"
MARKER_TEXT = "tunebench demo's folder: `tunebench demo` replaces its store, run files and report.\n"
SQLITE_SIDE_FILES = tuple(f"{STORE}-{suffix}" for suffix in ("journal", "wal", "shm"))
ALLOWED = "a new or empty folder, or one a previous demo made"


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
    """The demo's folder, with the previous demo's store removed (a re-run starts the same): a new folder (made
    here), an empty one, or one a demo made (its MARKER, or, from before the marker, the demo's outputs alone).
    InputError naming --dir for any other: the demo replaces its store and files, never someone else's."""
    if folder.exists() and not is_demo_folder(folder):
        raise InputError(
            "--dir",
            f"{str(folder)!r} holds files the demo did not write (it replaces its own store and files there)",
            allowed=ALLOWED,
        )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).write_text(MARKER_TEXT)
    (folder / STORE).unlink(missing_ok=True)
    return folder


def is_demo_folder(folder: Path) -> bool:
    """Whether the demo may start afresh in the existing folder: empty, or made by a demo."""
    if not folder.is_dir():
        return False
    names = {p.name for p in folder.iterdir()}
    if not names or (folder / MARKER).is_file():
        return True
    # a demo folder from before the marker: its store, run folder and report, nothing else
    return (
        names - set(SQLITE_SIDE_FILES) == {STORE, RUN, REPORT}
        and (folder / STORE).is_file()
        and (folder / RUN).is_dir()
        and (folder / REPORT).is_file()
    )
