"""Planner accuracy on the shipped measurements, held out by model and by measuring stack.

    .venv/bin/python benchmarks/planner_accuracy.py [--json] [--lomo-only]

Data: the fms-acceleration runs (fms-hf-tuning on A100/L40) and the published runs of other stacks
(litgpt on A10G, PEFT on L40S, torchtitan on A100), tunebench.plan.measurements. Leave-one-model-out
refits the planner's coefficients without each model family and predicts it; leave-one-source-out
does the same per measuring stack (fms-acceleration, litgpt, peft, torchtitan): the honest measure of
what a new model or a new stack will see. accelerate's and DeepSpeed's estimators (benchmarks/
baselines.py) are scored on the same runs. Targets: peak memory MdAPE <= 10 %, out-of-memory
accuracy >= 95 % (also on the runs within 25 % of the GPU's memory), throughput MdAPE <= 20 %.
The output ends with each wrong verdict near the limit (the run, what was measured, the held-out prediction).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import baselines
import numpy as np

from tunebench.plan.calibration import (
    MEMORY_KEYS,
    Batch,
    fit,
    largest_measured_gib,
    leave_one_model_out,
    leave_one_source_out,
    mdape,
    measured,
    near_limit_misses,
    scores,
)
from tunebench.plan.measurements import default_records

COLUMNS = (("peak_mdape_pct", "peak"), ("peak_full_mdape_pct", "full"), ("peak_lora_mdape_pct", "LoRA"),
           ("peak_qlora_mdape_pct", "QLoRA"), ("allocated_mdape_pct", "alloc"), ("reserved_mdape_pct", "reserved"),
           ("smi_mdape_pct", "smi"), ("oom_accuracy_pct", "OOM acc"), ("oom_near_limit_accuracy_pct", "OOM near"),
           ("oom_precision_pct", "OOM prec"), ("oom_recall_pct", "OOM rec"),
           ("throughput_mdape_pct", "tput"))  # fmt: skip


def naive_scores(records, capacity) -> dict[str, dict[str, float]]:
    """accelerate and DeepSpeed estimates scored like the planner (their one number against every kind)."""
    n = len(records)
    est = {k: np.full(n, np.nan) for k in ("accelerate", "deepspeed", "rule")}
    for w, idx in Batch.of(records).groups:
        est["accelerate"][idx] = baselines.accelerate_estimate_gib(w)
        est["deepspeed"][idx] = baselines.deepspeed_zero3_gib(w)
        est["rule"][idx] = baselines.rule_of_thumb_tokens_per_gpu(w)
    out = {}
    nan = np.full(n, np.nan)
    for name in ("accelerate", "deepspeed"):  # one number against every memory kind, scored like the planner
        pred = {k: est[name] for k in MEMORY_KEYS} | {
            "fits": (est[name] <= capacity).astype(float),
            "capacity": capacity,
            "tps": nan,
            "dtps": nan,
        }
        out[name] = scores(records, pred)
    speed = measured(records, "train_tokens_per_gpu_per_second")
    out["rule of thumb (40% MFU)"] = {k: float("nan") for k, _ in COLUMNS} | {
        "throughput_mdape_pct": mdape(est["rule"], speed)
    }
    return out


def subset(records, pooled, keep) -> dict[str, float]:
    idx = [i for i, r in enumerate(records) if keep(r)]
    return scores([records[i] for i in idx], {k: v[idx] for k, v in pooled.items()})


def miss_line(r, i: int, pred: dict) -> str:
    """One wrong verdict near the limit: the run, what was measured, what the held-out planner said."""
    v = r.values
    gpus = int(v.get("number_gpus") or 0)
    per_gpu = int(v.get("batch_size") or 0) // max(gpus, 1)
    stack = v.get("distributed_backend") or "one process"
    kernels = " fast kernels" if any(v.get("fast_kernels") or ()) else ""
    seen = f"ran at {largest_measured_gib(r):.1f} GiB" if r.valid else "out of memory"
    model = str(v.get("model_name", "?")).removesuffix("/config.json").rsplit("/", 1)[-1]
    tokens = v.get("model_max_length") or "-"
    return (
        f"  {r.source[:41]:41s} {model[:24]:24s} {r.method:9s} {gpus} x {per_gpu:>2d} x {tokens:>5}"
        f" {stack}{kernels}: {seen}; predicted {pred['allocated'][i]:.1f} GiB allocated, p(OOM) {pred['p_oom'][i]:.2f}"
    )


def fmt(x: float, width: int = 9) -> str:
    return f"{x:{width}.1f}" if x == x else f"{'-':>{width}}"


def row(name: str, m: dict[str, float]) -> str:
    return f"{name[:34]:34s}" + "".join(fmt(m.get(k, float("nan")), 9) for k, _ in COLUMNS)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the metrics as JSON")
    args = ap.parse_args(argv)
    records = default_records()
    t0 = time.time()
    print(f"tracing and fitting on {len(records)} runs ...", file=sys.stderr, flush=True)
    in_sample_pred = Batch.of(records).predict(fit(records))
    lomo, pooled = leave_one_model_out(records)
    loso, pooled_src = leave_one_source_out(records)
    naive = naive_scores(records, in_sample_pred["capacity"])
    origins = sorted({r.origin for r in records if r.origin})
    by_source = {o: subset(records, pooled, lambda r, o=o: r.origin == o) for o in origins}
    elapsed = time.time() - t0
    report = {
        "records": len(records),
        "seconds": round(elapsed, 1),
        "in_sample": scores(records, in_sample_pred),
        "leave_one_model_out": lomo,
        "leave_one_source_out": loso,
        "by_source_lomo": by_source,
        "naive": naive,
    }
    if args.json:
        print(json.dumps(report, indent=2, default=lambda x: None))
        return 0
    counts = {o: sum(r.origin == o for r in records) for o in origins}
    print(
        f"tunebench planner accuracy: {len(records)} runs ({', '.join(f'{o} {n}' for o, n in counts.items())}), "
        f"{len(lomo['per_group'])} model families ({elapsed:.0f} s)\n"
    )
    header = f"{'MdAPE %, accuracy %':34s}" + "".join(f"{label:>9s}" for _, label in COLUMNS)
    print(header + "\n" + "-" * len(header))
    print(row("tunebench leave-one-model-out", lomo["pooled"]))
    print(row("tunebench leave-one-source-out", loso["pooled"]))
    print(row("tunebench in-sample", report["in_sample"]))
    for name, m in naive.items():
        print(row(name, m))
    p = lomo["pooled"]
    print(
        f"\nmeasurements: memory {p['peak_n']} (allocated {p['allocated_n']}, reserved {p['reserved_n']}, "
        f"nvidia-smi {p['smi_n']}), OOM verdicts {p['oom_n']} ({p['oom_near_limit_n']} near the limit), "
        f"throughput {p['throughput_n']}"
    )
    print("\nby source (leave-one-model-out):")
    for name, m in by_source.items():
        print(row(f"  {name}", m))
    print("\nper held-out source (leave-one-source-out):")
    for name, m in loso["per_group"].items():
        print(row(f"  {name}", m))
    print("\nper held-out model (leave-one-model-out):")
    for name, m in lomo["per_group"].items():
        print(row(f"  {name.removeprefix('published/')}", m))
    for title, pooled_pred in (("leave-one-model-out", pooled), ("leave-one-source-out", pooled_src)):
        misses = near_limit_misses(records, pooled_pred)
        print(f"\nwrong verdicts near the limit, {title} ({len(misses)}; GPUs x samples per GPU x tokens):")
        for i in misses:
            print(miss_line(records[i], i, pooled_pred))
    print("\ntargets:")
    for title, m in (("leave-one-model-out", lomo["pooled"]), ("leave-one-source-out", loso["pooled"])):
        checks = [
            ("peak memory MdAPE", m["peak_mdape_pct"], "<=", 10.0),
            *((f"peak memory MdAPE {k}", m[f"peak_{k}_mdape_pct"], "<=", 10.0) for k in ("full", "lora", "qlora")),
            ("OOM accuracy", m["oom_accuracy_pct"], ">=", 95.0),
            ("OOM accuracy near the limit", m["oom_near_limit_accuracy_pct"], ">=", 95.0),
            ("OOM precision", m["oom_precision_pct"], ">=", 80.0),
            ("OOM recall", m["oom_recall_pct"], ">=", 80.0),
            ("throughput MdAPE", m["throughput_mdape_pct"], "<=", 20.0),
        ]
        for name, value, op, target in checks:
            ok = value == value and (value <= target if op == "<=" else value >= target)
            print(f"  {title:21s} {name:28s} {value:6.1f} % {op} {target:g} %  {'met' if ok else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
