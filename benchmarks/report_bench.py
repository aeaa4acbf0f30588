"""`tunebench report` over a store of 10,000 results: time to write the HTML and its size.

    PYTHONPATH=src python benchmarks/report_bench.py [--results 10000] [--dir DIR] [--repeats 3]

The store holds half planner predictions and half measurements of the same entities (full and LoRA
fine-tuning of three models on 1-8 A100s over a batch_size x model_max_length grid): the measurement
is the prediction times a fixed factor per row (0.8-1.2), entities the planner predicts will not fit
are stored out of memory, plus 200 stability results. Both go in with the store's bulk path
(Store.record_many). Then `tunebench report --store URL -o FILE` runs in a fresh process (imports
included) `--repeats` times. Targets: < 10 s, HTML < 10 MB.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tunebench.plan import predict_many
from tunebench.spec.experiments import get_experiment, make_entity
from tunebench.spec.results import Result
from tunebench.store import Store
from tunebench.store.store import Record

GPU = "NVIDIA-A100-SXM4-80GB"
MODELS = ("llama3.1-8b", "granite-3.1-8b-instruct", "smollm2-1.7b")
METHODS = ("finetune_full_benchmark-v1.0.0", "finetune_lora_benchmark-v1.0.0")
STABILITY = 200


def entities(n: int) -> list[tuple]:
    """n (experiment, entity) pairs over methods x models x GPUs x batch sizes x lengths."""
    out = []
    grid = itertools.product(METHODS, MODELS, (1, 2, 4, 8), range(1, 129), range(256, 16385, 64))
    for method, model, gpus, batch, length in grid:
        if batch % gpus:
            continue
        experiment = get_experiment(method)
        values = {
            "model_name": model,
            "number_gpus": gpus,
            "gpu_model": GPU,
            "batch_size": batch,
            "model_max_length": length,
        }
        out.append((experiment, make_entity(experiment, values)))
        if len(out) == n:
            return out
    raise SystemExit(f"the grid has fewer than {n} entities")


def fill(store: Store, results: int) -> None:
    pairs = entities((results - STABILITY) // 2)
    records = []
    for i, ((experiment, entity), predicted) in enumerate(zip(pairs, predict_many(pairs))):
        records.append(Record(experiment, entity, predicted, actuator="predict"))
        factor = 0.8 + 0.4 * ((i * 7) % 11) / 10
        if predicted.status == "valid":
            props = {k: v * factor for k, v in predicted.properties.items() if k != "is_valid"}
            measured = Result.valid(
                experiment.id,
                entity.id,
                props,
                metadata={
                    "host": "bench",
                    "device": "cuda",
                    "gpus": [{"id": 0, "name": GPU}],
                    "versions": {"torch": "2.13.0", "transformers": "5.23.0"},
                },
            )
        else:
            measured = Result.invalid(experiment.id, entity.id, ["GPU out of memory: CUDA out of memory"])
        records.append(Record(experiment, entity, measured, actuator="measure"))
    stability = get_experiment("finetune_full_stability-v1.0.0")
    for i in range(results - len(records)):
        entity = make_entity(
            stability,
            {
                "model_name": MODELS[0],
                "number_gpus": 1,
                "gpu_model": GPU,
                "batch_size": 1 + i % 64,
                "model_max_length": 512 * (1 + i // 64),
            },
        )
        oom = min(1.0, (i % 64) / 63)
        records.append(
            Record(
                stability,
                entity,
                Result.valid(stability.id, entity.id, {"f_gpu_oom": oom, "f_other_error": 0.0, "f_no_error": 1 - oom}),
            )
        )
    added, _ = store.record_many(records)
    assert added == results, (added, results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    directory = args.dir or Path(tempfile.mkdtemp(prefix="report-bench-"))
    directory.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{directory / 'store.db'}"
    with Store(url) as store:
        if not store.rows(actuator="predict"):
            started = time.perf_counter()
            fill(store, args.results)
            print(f"stored {args.results:,} results in {time.perf_counter() - started:.1f} s")
        n = len(store.rows())
    output = directory / "report.html"
    times = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "tunebench.commands.main", "report", "--store", url, "-o", str(output)],
            check=True,
            capture_output=True,
        )
        times.append(time.perf_counter() - started)
    size = output.stat().st_size / 1e6
    print(f"results in the store: {n:,}")
    print(
        f"tunebench report (fresh process): median {statistics.median(times):.2f} s of {args.repeats} "
        f"({', '.join(f'{t:.2f}' for t in times)}); target < 10 s"
    )
    print(f"HTML: {size:.2f} MB; target < 10 MB")
    text = output.read_text()
    figures, bundles = text.count("class='plot'"), text.count("* plotly.js v")
    print(f"figures: {figures}; plotly.js bundles inlined: {bundles}")


if __name__ == "__main__":
    main()
