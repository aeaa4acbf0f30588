"""End-to-end latency of a CPU LoRA measurement of a tiny model (issue 4 target: < 30 s).

Runs `tunebench run` as a fresh process (imports, data set, worker process start, model build,
training, result) and reports the wall time from process start to the printed result.

    python benchmarks/measure_latency.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TINY = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 512,
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="measure-latency-"))
    (tmp / "config.json").write_text(json.dumps(TINY))
    env = {**os.environ, "TUNEBENCH_HOME": str(tmp / "home")}
    command = [
        sys.executable,
        "-m",
        "tunebench.commands.main",
        "run",
        "finetune_lora_benchmark-v1.0.0",
        f"model_name={tmp / 'config.json'}",
        "model_max_length=128",
        "number_gpus=0",
        "batch_size=4",
        "target_modules=q_proj,v_proj",
        "-p",
        "max_steps=4",
        "-p",
        "dataset_id=news-chars-512-entries-4096",
        "--weights",
        "random",
        "--json",
    ]
    # the data set is generated once per data directory; the first run pays for it
    times = []
    for i in range(args.repeats + 1):
        start = time.perf_counter()
        out = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        elapsed = time.perf_counter() - start
        result = json.loads(out.stdout)
        assert result["status"] == "valid", result
        label = "first (generates the data set)" if i == 0 else f"repeat {i}"
        print(f"{label}: {elapsed:.1f} s, train_runtime {result['properties']['train_runtime']:.2f} s")
        if i:
            times.append(elapsed)
    median = statistics.median(times)
    print(f"median process start to result: {median:.1f} s  (target < 30 s: {'met' if median < 30 else 'NOT met'})")


if __name__ == "__main__":
    main()
