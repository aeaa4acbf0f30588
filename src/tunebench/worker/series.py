"""A run's time series, from the rank records the worker wrote: what its measured properties reduce.

The measured properties are reductions (tunebench.worker.metrics, tunebench.worker.results) of series
the worker records anyway: the sampler's samples (local rank 0 of each node) and rank 0's steps. This
module keeps them, in one compact JSON-able dict that a Result carries and the store compresses:

    {"format": FORMAT, "warmup_steps": int, "warmup_end_s": float | None,
     "gpus": [{"series": "gpu0", "id": NVML id, "node": node rank}, ...],
     "series": {name: {"time_s": [...], "value": [...], "step": [...] (train.* only)}}}

Names (one per sampled quantity; "gpu<i>" numbers the GPUs of every node in node order):

- ``gpu<i>.compute_utilization`` / ``memory_utilization`` / ``power_watts`` / ``power_percent`` (%, %, W,
  % of the enforced limit: reduced to the SFTTrainer spec's gpu_<X>_{min,avg,max}, note 1) and
  ``gpu<i>.memory_used_gib`` (GiB, NVML);
- ``process.cpu_percent`` (the training process tree, 100 = one core: cpu_compute_utilization, note 2),
  ``process.node_memory_percent`` (the node's RAM %: cpu_memory_utilization) and ``process.rss_gib``
  (GiB); another node's are ``node<k>.process.<X>``;
- ``train.loss`` and ``train.learning_rate`` (the Trainer's log, every logging step), ``train.step_time_s``
  (each step's duration, s: train_runtime is their sum after the warm-up), ``train.train_tokens``
  (padded tokens of the step over every rank) and ``train.dataset_tokens`` (the spec's note 3 count).

time_s: seconds since the run's first sample (the earliest over nodes; each node's monotonic clock,
aligned by its first sample's wall time). Values a sample does not have (no NVML power sensor, the
start sample's CPU %) are left out, not stored as gaps. Pure: imports neither torch nor pandas.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tunebench.worker.results import global_steps

FORMAT = "tunebench.series/1"
GPU_VALUES = ("compute_utilization", "memory_utilization", "memory_used_gib", "power_watts", "power_percent")
# process.<name> <- the sample's field
PROCESS_VALUES = {"cpu_percent": "cpu_percent", "node_memory_percent": "node_memory_percent",
                  "rss_gib": "process_rss_gib"}  # fmt: skip
# train.<name> <- rank 0's global per-step counts (tunebench.worker.meter)
STEP_COUNTS = {"train_tokens": "padded_tokens", "dataset_tokens": "dataset_tokens"}


def run_series(ranks: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The time series of a run from its rank records (any outcome: a run that ran out of memory keeps
    what it sampled); None when no rank sampled or stepped."""
    if not ranks:
        return None
    by_rank = sorted(ranks, key=lambda r: r.get("rank", 0))
    nodes = sorted((r for r in by_rank if (r.get("system") or {}).get("samples")), key=lambda r: r.get("node_rank", 0))
    firsts = {r.get("node_rank", 0): r["system"]["samples"][0] for r in nodes}
    t0_wall = min((f["wall"] for f in firsts.values()), default=None)

    def clock(node: int, t: float) -> float | None:
        """time_s of monotonic time t on a node."""
        first = firsts.get(node)
        return None if first is None else t - first["t"] + (first["wall"] - t0_wall)

    series: dict[str, dict[str, list]] = {}
    gpus: list[dict[str, Any]] = []
    for record in nodes:
        node = record.get("node_rank", 0)
        samples = record["system"]["samples"]
        index = {}  # NVML id -> gpu<i>
        for s in samples:
            for g in s.get("gpus") or []:
                if g["id"] not in index:
                    index[g["id"]] = f"gpu{len(gpus)}"
                    gpus.append({"series": index[g["id"]], "id": g["id"], "node": node})
        process = "process" if node == 0 else f"node{node}.process"
        for s in samples:
            t = clock(node, s["t"])
            for name, field in PROCESS_VALUES.items():
                _add(series, f"{process}.{name}", t, s.get(field))
            for g in s.get("gpus") or []:
                for name in GPU_VALUES:
                    _add(series, f"{index[g['id']]}.{name}", t, g.get(name))
    r0 = by_rank[0]
    steps = r0.get("steps") or {}
    node0 = r0.get("node_rank", 0)
    ends = steps.get("end_monotonic") or []
    durations = steps.get("durations_s") or []
    times = (
        [clock(node0, t) for t in ends] if node0 in firsts and len(ends) == len(durations) else _cumulative(durations)
    )
    for i, d in enumerate(durations):
        _add(series, "train.step_time_s", times[i], d, i + 1)
    for name, key in STEP_COUNTS.items():
        for i, n in enumerate(_global_counts(by_rank, key)[: len(times)]):
            _add(series, f"train.{name}", times[i], n, i + 1)
    for entry in steps.get("log") or []:
        step = int(entry["step"])
        t = times[step - 1] if 0 < step <= len(times) else None
        _add(series, "train.loss", t, entry.get("loss"), step)
        _add(series, "train.learning_rate", t, entry.get("learning_rate"), step)
    if not series:
        return None
    warmup = int(steps.get("warmup") or 0)
    return {
        "format": FORMAT,
        "warmup_steps": warmup,
        "warmup_end_s": times[warmup - 1] if 0 < warmup <= len(times) else None,
        "gpus": gpus,
        "series": series,
    }


def _add(series: dict[str, dict[str, list]], name: str, t: float | None, value: Any, step: int | None = None) -> None:
    """Append a point (a missing value or time adds nothing)."""
    if value is None or t is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    entry = series.setdefault(
        name, {"time_s": [], "value": []} if step is None else {"step": [], "time_s": [], "value": []}
    )
    entry["time_s"].append(round(float(t), 6))  # microseconds: more is clock noise
    entry["value"].append(float(value))
    if step is not None:
        entry["step"].append(step)


def _cumulative(durations: Sequence[float]) -> list[float]:
    """Step end times from the durations alone (no sample to align them with): s since the first step began."""
    out, total = [], 0.0
    for d in durations:
        total += d
        out.append(total)
    return out


def _global_counts(ranks: Sequence[dict[str, Any]], key: str) -> list[float]:
    """A per-step count over every rank (tunebench.worker.results.global_steps); [] when the records lack it
    (a failed run records only its durations)."""
    try:
        return list(global_steps(ranks)[key])
    except (KeyError, TypeError):
        return []
