"""The same tiny entity measured by both engines on this CPU: dataset_tokens_per_second of each.

LoRA and full fine-tuning of smollm2-135m shrunk with --tunebench_tiny, news-chars-512 at 384 tokens
(no padding: both engines train on exactly the same token count), max_steps STEPS. The engines
alternate, REPEATS times each, so drift of the machine hits both alike; the median of each is
compared. Prints every run, then a Markdown table with the difference in %.

    python benchmarks/engine_compare.py [VERSION]      (fms-hf-tuning version, default 3.2.2)
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from tunebench.actuators.measure import measure
from tunebench.engines import FMS, NATIVE
from tunebench.spec.experiments import get_experiment, make_entity

STEPS, REPEATS, BATCH, LENGTH = 40, 5, 4, 384
EXPERIMENTS = {"lora": "finetune_lora_benchmark-v1.0.0", "full": "finetune_full_benchmark-v1.0.0"}


def _rate(method: str, engine: str, version: str, out: Path) -> float:
    exp = get_experiment(
        EXPERIMENTS[method],
        {
            "max_steps": STEPS,
            "dataset_id": "news-chars-512-entries-4096",
            "gradient_accumulation_steps": 1,
            "fms_hf_tuning_version": version,
        },
    )
    entity = make_entity(
        exp, {"model_name": "smollm2-135m", "model_max_length": LENGTH, "number_gpus": 0, "batch_size": BATCH}
    )
    result = measure(
        exp,
        entity,
        {
            "weights": "random",
            "output_dir": str(out),
            "timeout_seconds": 900,
            "extra_worker_args": ("--tunebench_tiny", "True"),
        },
        engine=engine,
    )
    if result.status != "valid":
        raise SystemExit(f"{engine} {method}: {result.status} {result.reasons} {result.error}")
    return result.properties["dataset_tokens_per_second"]


def main(version: str) -> None:
    rows = []
    with tempfile.TemporaryDirectory(prefix="tunebench-engines-") as tmp:
        for method in EXPERIMENTS:
            rates: dict[str, list[float]] = {NATIVE: [], FMS: []}
            for i in range(REPEATS):
                for engine in (NATIVE, FMS):
                    rate = _rate(method, engine, version, Path(tmp) / f"{method}-{engine}-{i}")
                    rates[engine].append(rate)
                    print(f"{method} {engine} run {i + 1}: {rate:,.0f} tokens/s", flush=True)
            native, fms = statistics.median(rates[NATIVE]), statistics.median(rates[FMS])
            rows.append((method, native, fms, 100.0 * (fms - native) / native))
    print(f"\n| method | native (tokens/s) | fms-hf-tuning {version} (tokens/s) | difference |")
    print("|---|---|---|---|")
    for method, native, fms, diff in rows:
        print(f"| {method} | {native:,.0f} | {fms:,.0f} | {diff:+.1f} % |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "3.2.2")
