"""The planner's CPU speed against real CPU runs on this host (docs/planner.md section 5).

Measures small fine-tuning runs with `tunebench run` (random weights, nothing downloaded; bfloat16 and
gradient checkpointing, the spec's defaults; accumulation 1) into a fresh store, then sets the planner's
prediction beside each with `tunebench plan --compare`, in a fresh tunebench home so the planner probes
this host anew (plan/host.py: two of each model's own layers). Runs one after the other, on a host
that should be otherwise quiet: the planner's probe and the run are timed at different moments.

    python benchmarks/cpu_planner.py [--steps 6]

Prints one line per run (dataset tokens/s predicted, measured, error) and the median absolute error.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TUNEBENCH = str(Path(sys.executable).with_name("tunebench"))
# (experiment, model, model_max_length, batch_size, data set): SmolLM2-135M (576 wide, 30 layers) at
# the newcomer's settings, granite-4.0-350m (1,024 wide, 28 layers, 100 k vocabulary) full and LoRA
RUNS = [
    ("finetune_lora_benchmark-v1.0.0", "smollm2-135m", 256, 1, "news-chars-512-entries-4096"),
    ("finetune_lora_benchmark-v1.0.0", "smollm2-135m", 256, 4, "news-chars-512-entries-4096"),
    ("finetune_full_benchmark-v1.0.0", "smollm2-135m", 256, 1, "news-chars-512-entries-4096"),
    ("finetune_full_benchmark-v1.0.0", "smollm2-135m", 256, 4, "news-chars-512-entries-4096"),
    ("finetune_full_benchmark-v1.0.0", "granite-4.0-350m", 256, 1, "news-tokens-16384plus-entries-4096"),
    ("finetune_lora_benchmark-v1.0.0", "granite-4.0-350m", 512, 2, "news-tokens-16384plus-entries-4096"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per run (default 6)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TUNEBENCH_HOME": str(Path(tmp) / "home")}
        store = str(Path(tmp) / "runs.db")
        start = time.monotonic()
        for i, (exp, model, length, batch, data) in enumerate(RUNS, 1):
            print(f"[{i}/{len(RUNS)}] measuring {exp} {model} batch {batch} x {length}", file=sys.stderr, flush=True)
            values = f"model_name={model} model_max_length={length} number_gpus=0 batch_size={batch}".split()
            options = f"-p max_steps={args.steps} -p gradient_accumulation_steps=1 -p dataset_id={data}".split()
            cmd = [TUNEBENCH, "run", exp, *values, *options, "--weights", "random", "--store", store]
            subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
        print("planning (probes this host)", file=sys.stderr, flush=True)
        out = subprocess.run(
            [TUNEBENCH, "plan", "--compare", "--store", store, "--json"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        elapsed = time.monotonic() - start
        probes = json.loads((Path(tmp) / "home" / "host_flops.json").read_text())
    report = json.loads(out.stdout)
    print(
        f"tunebench CPU planner against {len(RUNS)} CPU runs of {args.steps} steps on {os.cpu_count()} cores ({elapsed:.0f} s)"
    )
    print(f"{'experiment':32s} {'entity':58s} {'predicted':>9s} {'measured':>9s} {'error %':>8s}")
    for e in report["entities"]:
        row = {c["property"]: c for c in e["comparison"]}["dataset_tokens_per_second"]
        entity = e["entity_id"].replace("-number_gpus.0", "")
        print(
            f"{e['experiment_id'][:32]:32s} {entity[:58]:58s} {row['predicted']:9.1f} {row['measured']:9.1f} "
            f"{row['error_percent']:+8.1f}"
        )
    summary = report["summary"]["properties"]["dataset_tokens_per_second"]
    print(f"dataset tokens/s: MdAPE {summary['mdape_percent']:.1f} % over {summary['pairs']} runs")
    print("the planner's probes of this host (plan/host.py):")
    for key, entry in probes.items():
        what = key.split(" | ", 4)[-1]  # after CPU model, cores, threads, torch version
        rate = (
            f"{1 / entry['seconds_per_token']:.0f} tokens/s"
            if "seconds_per_token" in entry
            else f"{entry['flops'] / 1e9:.0f} GFLOP/s"
        )
        print(
            f"  {what}: {rate}, optimizer {entry['optimizer_s_per_param'] * 1e9:.2f} ns/parameter{', busy' if entry.get('busy') else ''}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
