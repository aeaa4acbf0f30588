"""Planner accuracy on the shared fms-acceleration runs, leave-one-model-out, beside naive formulas.

    PYTHONPATH=src python benchmarks/planner_accuracy.py [--data-dir DIR] [--json]

For each model family the planner's coefficients are refitted without that model and the model's runs
are predicted (estimation.md §10: leave-one-model-out is the honest measure). Targets (issue 6): peak
memory median absolute percentage error <= 10 %, out-of-memory accuracy >= 95 %, throughput MdAPE
<= 20 %. The naive estimators (accelerate estimate-memory, DeepSpeed ZeRO-3, 40 %-MFU rule of thumb;
tunebench/plan/baselines.py) are scored on the same runs. Takes a few minutes (7 refits).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from tunebench.plan import baselines
from tunebench.plan.calibration import (
    SHARED,
    Batch,
    _measured,
    _throughput_measured,
    fit,
    fms_records,
    leave_one_model_out,
    mdape,
    scores,
)

TARGETS = {"peak memory MdAPE": ("<=", 10.0), "OOM accuracy": (">=", 95.0), "throughput MdAPE": ("<=", 20.0)}


def naive_predictions(records):
    """Per record: accelerate and DeepSpeed GiB, their fits-on-GPU flags, rule-of-thumb tokens/s."""
    n = len(records)
    out = {k: np.full(n, np.nan) for k in ("accelerate", "deepspeed", "rule")}
    cap = np.full(n, np.nan)
    for w, idx in Batch.of(records).groups:
        out["accelerate"][idx] = baselines.accelerate_estimate_gib(w)
        out["deepspeed"][idx] = baselines.deepspeed_zero3_gib(w)
        out["rule"][idx] = baselines.rule_of_thumb_tokens_per_gpu(w)
        cap[idx] = w.gpu.memory_gib
    return out, cap


def naive_scores(records, pred, cap):
    alloc = _measured(records, "gpu_memory_allocated_peak_gib")
    smi = _measured(records, "gpu_memory_peak_gib")
    speed, _ = _throughput_measured(records)
    labels = np.array([r.valid for r in records])
    rows = {}
    for name in ("accelerate", "deepspeed"):
        rows[name] = {
            "allocated_mdape_pct": mdape(pred[name], alloc),
            "nvidia_smi_mdape_pct": mdape(pred[name], smi),
            "oom_accuracy_pct": float(np.mean((pred[name] <= cap) == labels) * 100),
            "throughput_mdape_pct": float("nan"),
        }
    rows["rule of thumb (40% MFU)"] = {
        "allocated_mdape_pct": float("nan"),
        "nvidia_smi_mdape_pct": float("nan"),
        "oom_accuracy_pct": float("nan"),
        "throughput_mdape_pct": mdape(pred["rule"], speed),
    }
    return rows


def subset(records, pooled, keep):
    idx = [i for i, r in enumerate(records) if keep(r)]
    return scores([records[i] for i in idx], {k: v[idx] for k, v in pooled.items()})


def fmt(x, width=9):
    return f"{x:{width}.1f}" if x == x else f"{'-':>{width}}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=str(SHARED), help="folder of the fms-acceleration CSVs")
    ap.add_argument("--json", action="store_true", help="print the metrics as JSON")
    args = ap.parse_args(argv)
    records = fms_records(args.data_dir)
    if not records:
        print(f"no fms-acceleration CSVs in {args.data_dir}", file=sys.stderr)
        return 2
    t0 = time.time()
    lomo, pooled = leave_one_model_out(records)
    in_sample = scores(records, Batch.of(records).predict(fit(records)))
    naive_pred, cap = naive_predictions(records)
    naive = naive_scores(records, naive_pred, cap)
    by_source = {
        "packed A100 runs": subset(records, pooled, lambda r: r.fit and "l40" not in r.source and "moe" not in r.source),
        "MoE runs (unpacked)": subset(records, pooled, lambda r: "moe" in r.source),
        "L40 runs": subset(records, pooled, lambda r: "l40" in r.source),
        "orca-math (unpacked, not fitted)": subset(records, pooled, lambda r: not r.fit),
    }
    elapsed = time.time() - t0
    report = {"leave_one_model_out": lomo, "in_sample": in_sample, "naive": naive, "by_source": by_source,
              "records": len(records), "seconds": round(elapsed, 1)}  # fmt: skip
    if args.json:
        print(json.dumps(report, indent=2, default=lambda x: None))
        return 0
    p = lomo["pooled"]
    print(f"tunebench planner accuracy: {len(records)} fms-acceleration runs, "
          f"{len(lomo['per_model'])} model families, leave-one-model-out ({elapsed:.0f} s)\n")  # fmt: skip
    header = f"{'estimator':34s}{'alloc MdAPE':>12s}{'smi MdAPE':>11s}{'OOM acc':>9s}{'tput MdAPE':>12s}"
    print(header)
    print("-" * len(header))
    def row(name, m):
        print(f"{name:34s}{fmt(m['allocated_mdape_pct'], 11)}%{fmt(m['nvidia_smi_mdape_pct'], 10)}%"
              f"{fmt(m['oom_accuracy_pct'], 8)}%{fmt(m['throughput_mdape_pct'], 11)}%")  # fmt: skip
    row("tunebench (leave-one-model-out)", p)
    row("tunebench (in-sample)", in_sample)
    for name, m in naive.items():
        row(name, m)
    print(f"\nsamples: allocated {p['allocated_n']}, nvidia-smi {p['nvidia_smi_n']}, OOM {p['oom_n']}, "
          f"throughput {p['throughput_n']}")  # fmt: skip
    print("\nper held-out model (leave-one-model-out):")
    for fam, m in lomo["per_model"].items():
        row(f"  {fam[:32]}", m)
    print("\nby source (leave-one-model-out):")
    for name, m in by_source.items():
        row(f"  {name[:32]}", m)
    peak = p["allocated_mdape_pct"]
    print("\ntargets (issue 6), leave-one-model-out:")
    checks = [
        ("peak memory MdAPE (torch allocated)", peak, "<=", 10.0),
        ("peak memory MdAPE (nvidia-smi)", p["nvidia_smi_mdape_pct"], "<=", 10.0),
        ("OOM accuracy", p["oom_accuracy_pct"], ">=", 95.0),
        ("throughput MdAPE", p["throughput_mdape_pct"], "<=", 20.0),
    ]
    for name, value, op, target in checks:
        ok = value <= target if op == "<=" else value >= target
        print(f"  {name:38s} {value:6.1f} % {op} {target:g} %  {'met' if ok else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
