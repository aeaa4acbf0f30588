"""Timings of issue 3's targets: data set generation and token statistics.

    python benchmarks/datasets_bench.py [--dir DIR] [--model NAME] [--max-len N]

Targets (2 cores): generating news-tokens-16384plus-entries-4096 < 30 s, a vision data set < 30 s,
token statistics of the 16384plus data set at max length 4096 < 20 s cold and < 0.5 s from cache.
"Cold" means no cached counts; the offline tokenizer's one-time conversion is timed separately.
CPU time (all threads) is printed beside wall time: on a shared machine wall time grows with the
load of other processes, CPU time does not (wall ~ cpu / 2 on 2 idle cores for the tokenizer).
Without --dir the files go to a temporary directory that is removed afterwards.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time

from tunebench.datasets import generate_dataset, resolve_tokenizer, token_counts

TEXT_ID = "news-tokens-16384plus-entries-4096"
VISION_ID = "vision-384x384-16384plus-entries-4096"


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)  # all threads of this process
    return r.ru_utime + r.ru_stime


def timed(label: str, target: float | None, fn):
    """Run fn; print wall time against target, and CPU time (seconds on any core: load-proof)."""
    t0, c0 = time.perf_counter(), _cpu()
    out = fn()
    dt, cpu = time.perf_counter() - t0, _cpu() - c0
    verdict = "" if target is None else ("  OK" if dt < target else "  SLOW") + f" (target < {target:g} s)"
    print(f"{label:<56} {dt:7.2f} s wall {cpu:7.2f} s cpu{verdict}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", help="data directory to use and keep (default: a temporary one)")
    ap.add_argument("--model", default="llama3.1-8b", help="model whose tokenizer counts (default %(default)s)")
    ap.add_argument("--max-len", type=int, default=4096)
    args = ap.parse_args()
    data_dir = args.dir or tempfile.mkdtemp(prefix="tunebench-bench-")
    print(f"cpus {os.cpu_count()}, load average {os.getloadavg()[0]:.2f} (other processes skew timings)")
    try:
        m = timed(f"generate {TEXT_ID}", 30, lambda: generate_dataset(TEXT_ID, data_dir))
        print(f"  {m.entries} entries, {m.size_bytes / 1e6:.0f} MB")
        m = timed(f"generate {VISION_ID}", 30, lambda: generate_dataset(VISION_ID, data_dir))
        print(f"  {m.entries} rows, {m.size_bytes / 1e6:.0f} MB")
        r = resolve_tokenizer(args.model)
        timed(f"load tokenizer ({r.source}; converts once per home)", None, r.load)
        for label, target in (("cold", 20), ("from cache", 0.5)):
            c = timed(
                f"token stats {args.model} max-len {args.max_len} {label}",
                target,
                lambda: token_counts(TEXT_ID, args.model, max_seq_length=args.max_len, data_dir=data_dir),
            )
            print(
                f"  from_cache={c.from_cache} entries {c.entries} min {c.min} avg {c.mean:.1f} max {c.max}"
                f" tokenizer '{c.tokenizer}' exact={c.exact}"
            )
        print(f"load average now {os.getloadavg()[0]:.2f}")
    finally:
        if not args.dir:
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
