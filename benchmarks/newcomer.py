"""A newcomer's six questions, answered with the commands a user types: runs each in an empty folder at 80
columns and writes docs/benchmarks/newcomer.md with their real output.

    .venv/bin/python benchmarks/newcomer.py [--out docs/benchmarks/newcomer.md] [--folder /tmp/newcomer]

The `tunebench` of the running Python's environment (its bin/ folder) answers; question 5 measures two
tiny jobs on this CPU (a minute or two).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CPU = "-p max_steps=2 -p gradient_accumulation_steps=1 -p dataset_id=news-chars-512-entries-4096"
MY_CONFIG = """\
{
  "architectures": ["Qwen2ForCausalLM"],
  "model_type": "qwen2",
  "hidden_size": 1536,
  "intermediate_size": 8960,
  "num_hidden_layers": 28,
  "num_attention_heads": 12,
  "num_key_value_heads": 2,
  "vocab_size": 151936,
  "max_position_embeddings": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16"
}
"""
NOTEBOOK = """\
import pandas as pd
from tunebench import api

pd.set_option("display.width", 80)  # the notebook's width: wide tables wrap
pd.set_option("display.max_columns", None)
jobs = pd.DataFrame({
    "model_name": ["llama-3.1-8b", "llama-3.1-8b", "mistral-7b"],
    "model_max_length": [4096, 8192, 4096],
    "number_gpus": [1, 2, 1],
    "batch_size": [4, 8, 8],
    "gpu_model": ["A100-80GB", "A100-80GB", "H100"],
})
plans = api.plan(jobs, "finetune_lora_benchmark-v1.0.0", price_per_gpu_hour=2.5)
print(plans[["model_name", "model_max_length", "number_gpus", "batch_size",
             "is_valid", "oom_probability", "gpu_memory_peak_gib",
             "dataset_tokens_per_second", "cost"]].round(3))

runs = api.results("runs.db")  # question 5's store: a row per measurement
print(runs[["model_name", "batch_size", "status", "train_runtime",
            "dataset_tokens_per_second"]].round(1))
"""

# (title, what to say first, [(kind, text)]): kind "sh" is a shell command, "file" writes (path, text)
QUESTIONS = [
    ("1. Will Llama-3.1-8B LoRA at 8k tokens fit on 2 x A100, and what does it cost?",
     ("`plan` gives memory per GPU with its breakdown, the out-of-memory probability, speed, time and cost. "
     "At batch 8 the job fits but is `risky`: its chance of running out of memory is above the default "
     "`--max-oom-risk` of 0.10; the loss on a 128k vocabulary dominates. `max-batch` finds the largest batch "
     "within the risk; a chunked loss (`loss_implementation=chunked`) makes batch 8 safe."),
     [("sh", ("tunebench plan finetune_lora_benchmark-v1.0.0 model_name=llama-3.1-8b model_max_length=8192 "
             "number_gpus=2 batch_size=8 gpu_model=A100-80GB --price-per-gpu-hour 2.5")),
      ("sh", ("tunebench max-batch llama-3.1-8b --gpu-model A100-80GB --number-gpus 2 --model-max-length 8192 "
             "--price-per-gpu-hour 2.5")),
      ("sh", ("tunebench plan finetune_lora_benchmark-v1.0.0 model_name=llama-3.1-8b model_max_length=8192 "
             "number_gpus=2 batch_size=8 gpu_model=A100-80GB --price-per-gpu-hour 2.5 loss_implementation=chunked "
             "--json | grep -E '\"(is_valid|oom_probability|headroom_gib|gpu_memory_peak_gib|cost)\"'"))]),
    ("2. Full vs LoRA vs QLoRA for Mistral-7B on one H100",
     ("`recommend` with `--max-gpus 1` sizes the job (4,096 tokens, batch 8) under each method; `max-batch` "
     "per method gives the largest batch each allows on the one GPU."),
     [("sh", ("tunebench recommend finetune_lora_benchmark-v1.0.0 model_name=mistral-7b model_max_length=4096 "
             "batch_size=8 gpu_model=H100 --max-gpus 1 --price-per-gpu-hour 3")),
      ("sh", ("for m in full lora qlora; do tunebench max-batch mistral-7b --gpu-model H100 --method $m "
             "--model-max-length 4096; done"))]),
    ("3. Plan my own config.json",
     ("Any Hugging Face `config.json` (here Qwen2.5-1.5B's dimensions), or the folder holding it, is a "
     "`model_name`; so is any Hugging Face id whose `config.json` is in the local Hugging Face cache "
     "(`HF_HUB_CACHE`, read offline). LoRA on a model outside the catalog needs `target_modules=...`."),
     [("file", ("my-model/config.json", MY_CONFIG)),
      ("sh", ("tunebench plan finetune_full_benchmark-v1.0.0 model_name=./my-model model_max_length=4096 "
             "number_gpus=1 batch_size=4 gpu_model=L40S")),
      ("sh", "tunebench max-batch ./my-model --gpu-model L40S --method full --model-max-length 4096")]),
    ("4. Sweep batch and length on an L40S and show me the out-of-memory boundary",
     ("`plan --grid` plans every point without a space file, one row per point at the terminal's width "
     "(`KEY=LOW..HIGH` is the powers of two between). `max-length` answers the other way round; the default "
     "data set's samples are about 21k tokens, so long sequences need the 128k data set."),
     [("sh", ("tunebench plan finetune_lora_benchmark-v1.0.0 model_name=llama-3.1-8b number_gpus=1 gpu_model=L40S "
             "--grid batch_size=1,2,4,8,16 model_max_length=512..8192")),
      ("sh", ("tunebench max-length llama-3.1-8b --gpu-model L40S --batch-size 4 "
             "dataset_id=news-tokens-128kplus-entries-320"))]),
    ("5. Measure two tiny configurations and compare with the planner",
     ("Two LoRA runs of smollm2-135m on this CPU (random weights: nothing is downloaded), kept in `runs.db`; "
     "`plan --compare` sets a fresh prediction beside every measurement of the store: on the CPU the planner "
     "times two of the model's own layers on this host once (`plan/host.py`; its notes name the probe) and "
     "caches the rate. The CPU is shared with other work, the measured speed varies from run to run, and a "
     "two-step run is mostly its first steps; the error column says how far apart they are here "
     "(docs/planner.md §5 has longer CPU runs, §8 the accuracy on the GPU runs the planner is calibrated on)."),
     [("sh", (f"tunebench run finetune_lora_benchmark-v1.0.0 model_name=smollm2-135m model_max_length=256 "
             f"number_gpus=0 batch_size=1 {CPU} --weights random --store runs.db")),
      ("sh", (f"tunebench run finetune_lora_benchmark-v1.0.0 model_name=smollm2-135m model_max_length=256 "
             f"number_gpus=0 batch_size=4 {CPU} --weights random --store runs.db")),
      ("sh", "tunebench plan --compare --store runs.db"),
      ("sh", "tunebench show --store runs.db")]),
    ("6. Use it from a notebook",
     ("`tunebench.api` takes and gives pandas DataFrames: a table of jobs planned in one call, and a store's "
     "results (docs/api.md has the whole API)."),
     [("file", ("notebook.py", NOTEBOOK)), ("sh", "python notebook.py")]),
]  # fmt: skip


def run(command: str, folder: Path, env: dict[str, str]) -> str:
    """The command's stdout and stderr as a terminal shows them (one stream, in order)."""
    proc = subprocess.run(
        ["bash", "-c", command],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=1800,
        check=False,
    )
    return proc.stdout.rstrip() + ("" if proc.returncode == 0 else f"\n[exit code {proc.returncode}]")


def fill(text: str) -> str:
    """A paragraph at 104 columns, options (--max-oom-risk) never split."""
    return textwrap.fill(text, 104, break_on_hyphens=False, break_long_words=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "newcomer.md")
    parser.add_argument("--folder", type=Path, default=Path("/tmp/newcomer"))
    args = parser.parse_args()
    shutil.rmtree(args.folder, ignore_errors=True)
    args.folder.mkdir(parents=True)
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "COLUMNS": "80", "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    env.pop("TUNEBENCH_STORE", None)
    started = time.monotonic()
    parts = [
        "# A newcomer's first questions, answered\n",
        fill(
            "Six questions a newcomer asks, each answered with the commands a user types and their real output "
            "at 80 columns (`COLUMNS=80`), run one after the other in an empty folder "
            f"(`{args.folder}`) by `benchmarks/newcomer.py` on "
            f"{datetime.date.today().isoformat()} ({platform.machine()}, {os.cpu_count()} cores, no GPU; "
            "the planner's answers need none). Model names are the short ones people type "
            "(`llama-3.1-8b`, `mistral-7b`); GPU names too (`A100-80GB`, `H100`, `L40S`)."
        ),
    ]
    for title, intro, steps in QUESTIONS:
        parts += [f"\n## {title}\n", fill(intro) + "\n"]
        for kind, body in steps:
            if kind == "file":
                path, text = body
                (args.folder / path).parent.mkdir(parents=True, exist_ok=True)
                (args.folder / path).write_text(text)
                lang = "python" if path.endswith(".py") else "json"
                parts.append(f"`{path}`:\n\n```{lang}\n{text.rstrip()}\n```\n")
                continue
            print(f"$ {body}", file=sys.stderr, flush=True)
            parts.append(f"```console\n$ {body}\n{run(body, args.folder, env)}\n```\n")
    parts.append(f"\n(all six: {time.monotonic() - started:.0f} s)\n")
    args.out.write_text("\n".join(parts))
    print(f"-> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
