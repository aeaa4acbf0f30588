"""Fit the planner's few free coefficients to measurements; leave-one-model-out and leave-one-source-out error.

Memory comes from arithmetic and traced activations (plan.memory, plan.trace); what is fitted is
what neither can see (estimation.md §10 warns against tuning to one stack): the fused kernels' bytes,
FSDP's extra checkpoint copies under PEFT, the CUDA context and the caching allocator's slack
(reserved, nvidia-smi), the fragmentation left when the device is full (the out-of-memory
boundary), the log-error of the peak (the out-of-memory probability), and the throughput model's
efficiencies and fixed costs. Each coefficient is pulled towards its physical prior (a Gaussian prior
in log space, DATA_SIGMA / PRIOR_SIGMA) and bounded; groups are fitted in turn by scipy's bounded
least squares on log errors. The
honest score holds out a whole model family (leave-one-model-out) or a whole measuring stack
(leave-one-source-out), refits without it and predicts it.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tunebench.errors import InputError
from tunebench.plan.coefficients import Calibration, Coefficients
from tunebench.plan.memory import predict_memory
from tunebench.plan.throughput import predict_throughput
from tunebench.plan.workload import Workload, build_workload, group_key
from tunebench.spec.runs import METHOD_EXPERIMENT, Record, resolve_model

MEMORY_KEYS = {"allocated": "gpu_memory_allocated_peak_gib", "reserved": "gpu_memory_reserved_peak_gib",
               "smi": "gpu_memory_peak_gib"}  # fmt: skip
NEAR_LIMIT = 0.75  # a run "near the limit" used >= 75 % of the GPU's memory (or ran out of it)


@dataclass
class Batch:
    """Records grouped into Workloads once, so a fit evaluates every coefficient vector quickly."""

    records: list[Record]
    groups: list[tuple[Workload, list[int]]] = field(default_factory=list)

    @classmethod
    def of(cls, records: list[Record]) -> Batch:
        buckets: dict[tuple, list[int]] = defaultdict(list)
        for i, rec in enumerate(records):
            key = (*group_key(rec.values, rec.method), "_tokens_per_sample" in rec.values)
            buckets[key].append(i)
        groups = []
        for idx in buckets.values():
            first = records[idx[0]]
            rows = [records[i].values for i in idx]
            groups.append((build_workload(first.method, rows, model=resolve_model(first.values["model_name"])), idx))
        return cls(records, groups)

    def predict(self, c: Coefficients, memory: bool = True, throughput: bool = True) -> dict[str, np.ndarray]:
        """Per record: memory peaks (GiB), the OOM verdict and probability, train and dataset tokens/s/GPU."""
        n = len(self.records)
        out = {k: np.full(n, np.nan) for k in (*MEMORY_KEYS, "fits", "p_oom", "capacity", "tps", "dtps")}
        for w, idx in self.groups:
            if memory:
                m = predict_memory(w, c)
                out["allocated"][idx] = m.allocated_gib
                out["reserved"][idx] = m.reserved_gib
                out["smi"][idx] = m.nvidia_smi_gib
                out["fits"][idx] = m.fits
                out["p_oom"][idx] = m.oom_probability
                out["capacity"][idx] = m.capacity_gib if m.capacity_gib is not None else np.nan
            if throughput:
                t = predict_throughput(w, c)
                out["tps"][idx] = t.train_tokens_per_gpu_per_second
                out["dtps"][idx] = t.dataset_tokens_per_second / w.devices
        return out


def ship_traces(records: list[Record], path: Path | None = None) -> int:
    """Trace the activation profiles records need afresh (not from the shipped set) and ship them with the
    package (plan.trace.SHIPPED); returns how many. Profiles in the user's cache are reused: run it with
    a fresh TUNEBENCH_HOME."""
    from tunebench.plan import trace

    with trace.without_shipped():
        profiles = [w.activations for w, _ in Batch.of(records).groups]
    return trace.ship_profiles(profiles, path or trace.SHIPPED)


def measured(records: list[Record], key: str) -> np.ndarray:
    return np.array([r.properties.get(key, np.nan) for r in records], dtype=float)


def measured_throughput(records: list[Record]) -> tuple[np.ndarray, np.ndarray]:
    """(measured per-GPU tokens/s, 1 if it is a train_tokens figure else 0 for dataset tokens)."""
    train = measured(records, "train_tokens_per_gpu_per_second")
    data = measured(records, "dataset_tokens_per_second_per_gpu")
    use_train = ~np.isnan(train)
    return np.where(use_train, train, data), use_train.astype(float)


def near_limit(records: list[Record], pred: dict[str, np.ndarray]) -> np.ndarray:
    """Runs within 25 % of the GPU's memory: the flag a data set gives, else measured >= 75 % or OOM."""
    out = np.zeros(len(records), dtype=bool)
    for i, r in enumerate(records):
        if r.near_limit is not None:
            out[i] = r.near_limit
            continue
        cap = pred["capacity"][i]
        out[i] = (not r.valid) or (cap == cap and largest_measured_gib(r) >= NEAR_LIMIT * cap)
    return out


def largest_measured_gib(r: Record) -> float:
    """The largest memory figure a run reports, of any kind (allocated, reserved, nvidia-smi), GiB; 0 if none."""
    return max((r.properties.get(k, 0.0) for k in MEMORY_KEYS.values()), default=0.0)


def verdicts(records: list[Record], pred: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per run: (its out-of-memory verdict is known, the prediction's verdict is right)."""
    known = np.array(["is_valid" in r.properties for r in records], dtype=bool)
    right = (pred["fits"] > 0) == np.array([r.valid for r in records], dtype=bool)
    return known, right


def near_limit_misses(records: list[Record], pred: dict[str, np.ndarray]) -> list[int]:
    """Indices of the runs near the limit (``near_limit``) with a known verdict that the prediction gets wrong."""
    known, right = verdicts(records, pred)
    return [int(i) for i in np.flatnonzero(near_limit(records, pred) & known & ~right)]


# --- fitting --------------------------------------------------------------------------------------
MEMORY_FIT = ("fused_loss_bytes_per_vocab", "fast_kernels_activation_fraction", "fsdp_peft_checkpoint_copies",
              "compile_activation_fraction")  # fmt: skip
SLACK_FIT = ("cuda_context_gib", "reserve_fixed_gib", "reserve_transient_fraction", "reserve_loss_fraction")
SPEED_FIT = (
    "hfu_max", "hidden_half", "elementwise_passes", "qlora_speed", "gptq_speed", "fast_kernels_speed", "compile_speed",
    "layer_overhead_s", "sharded_unit_overhead_s", "expert_overhead_s", "alltoall_latency_s", "comm_exposed_fraction",
    "cpu_tflops",
)  # fmt: skip
# The fit is a maximum a posteriori estimate: each measurement's log error ~ N(0, DATA_SIGMA) and each
# coefficient's log ratio to its physical prior ~ N(0, PRIOR_SIGMA). Hundreds of runs outweigh the
# priors; a handful (a held-out source, a user's few CPU runs) move them only as far as they inform.
DATA_SIGMA = 0.10
PRIOR_SIGMA = 0.5
BOUNDS = {
    "fused_loss_bytes_per_vocab": (0.0, 12.0),
    "fast_kernels_activation_fraction": (0.3, 1.0),
    "compile_activation_fraction": (0.3, 1.0),
    "fsdp_peft_checkpoint_copies": (0.0, 3.0),
    "cuda_context_gib": (0.3, 1.0),  # CUDA context + cuBLAS/cuDNN workspaces: 0.3-1 GiB per process (estimation.md §5)
    "reserve_fixed_gib": (0.0, 6.0),
    "reserve_transient_fraction": (0.0, 1.5),
    "reserve_loss_fraction": (0.0, 2.0),
    "hfu_max": (0.2, 0.95),
    "hidden_half": (0.0, 4000.0),
    "elementwise_passes": (0.0, 20.0),
    "qlora_speed": (0.4, 1.5),
    "gptq_speed": (0.4, 1.5),
    "fast_kernels_speed": (0.8, 1.6),
    "compile_speed": (0.8, 1.6),
    "layer_overhead_s": (0.0, 0.02),
    "sharded_unit_overhead_s": (0.0, 0.02),
    "expert_overhead_s": (0.0, 0.02),
    "alltoall_latency_s": (0.0, 0.02),
    "comm_exposed_fraction": (0.0, 1.0),
    "cpu_tflops": (0.05, 50.0),
}


def _fit_group(
    batch: Batch, base: Coefficients, names: tuple[str, ...], residuals: Callable[[dict], np.ndarray], memory: bool
) -> Coefficients:
    """Coefficients `names` at the posterior mode (see DATA_SIGMA), by scipy's bounded least squares."""
    from scipy.optimize import least_squares

    prior = base.to_dict()
    lo = np.array([BOUNDS[n][0] for n in names])
    hi = np.array([BOUNDS[n][1] for n in names])

    def coeffs(x: np.ndarray) -> Coefficients:
        return base.replace(**{n: float(v) for n, v in zip(names, np.clip(x, lo, hi), strict=True)})

    def objective(x: np.ndarray) -> np.ndarray:
        c = coeffs(x)
        r = residuals(batch.predict(c, memory=memory, throughput=not memory))
        ridge = [math.log((getattr(c, n) + 1e-3) / (prior[n] + 1e-3)) / PRIOR_SIGMA for n in names]
        return np.concatenate([r / DATA_SIGMA, ridge])

    x0 = np.clip(np.array([prior[n] for n in names], dtype=float), lo, hi)
    scale = np.maximum(np.abs(x0), (hi - lo) * 1e-3)
    best = least_squares(objective, x0, bounds=(lo, hi), x_scale=scale, diff_step=1e-3, max_nfev=40 * len(names))
    return coeffs(best.x)


def _log_residuals(pred: np.ndarray, meas: np.ndarray) -> np.ndarray:
    ok = ~np.isnan(meas) & (meas > 0) & (pred > 0)
    return np.log(pred[ok] / meas[ok])


def _log_sq(pred: np.ndarray, meas: np.ndarray) -> float:
    r = _log_residuals(pred, meas)
    return float(np.mean(r**2)) if r.size else 0.0


def log_errors(records: list[Record], pred: dict[str, np.ndarray]) -> np.ndarray:
    """ln(measured / predicted) of every memory measurement, each against the prediction of its kind."""
    return -np.concatenate([_log_residuals(pred[key], measured(records, prop)) for key, prop in MEMORY_KEYS.items()])


def _memory_residuals(records: list[Record], keys: tuple[str, ...]) -> Callable[[dict], np.ndarray]:
    meas = {k: measured(records, MEMORY_KEYS[k]) for k in keys}

    def residuals(p: dict) -> np.ndarray:
        return np.concatenate([_log_residuals(p[k], meas[k]) for k in keys])

    return residuals


def _oom_fragmentation(batch: Batch, c: Coefficients) -> float:
    """The fragmentation fraction under which the observed verdicts are most likely (ties: the smallest).

    The log-likelihood of fits and OOMs under the model's own out-of-memory probability (memory.oom_probability,
    with c's peak_log_sigma): a proper scoring rule, so a run predicted at p = 0.45 counts as nearly right and
    one at p = 0.01 as badly wrong, where 0-1 accuracy counts both alike and, on a source with a few OOM runs,
    jumps between grid values."""
    labels = np.array([r.valid for r in batch.records])
    verdict = np.array(["is_valid" in r.properties for r in batch.records])  # as scores() counts them
    likelihoods = []
    grid = np.arange(0.0, 0.51, 0.025)
    for fraction in grid:
        p = batch.predict(c.replace(oom_fragmentation_fraction=float(fraction)), throughput=False)["p_oom"]
        p = np.clip(p, 1e-4, 1 - 1e-4)  # one impossible record (a verdict against p ~ 0) must not decide alone
        known = verdict & np.isfinite(p)
        likelihoods.append(float(np.sum(np.where(labels, np.log1p(-p), np.log(p))[known])))
    if max(likelihoods) - min(likelihoods) < 1e-9:  # no verdict the share can move (CPU runs): keep the prior
        return c.oom_fragmentation_fraction
    return float(grid[int(np.argmax(likelihoods))])  # the first maximum: ties go to the smallest share


def fit(records: list[Record], start: Coefficients | None = None) -> Coefficients:
    """Coefficients fitted to records: memory, allocator slack, OOM boundary, peak log-error, throughput."""
    c = start or Coefficients()
    records = [r for r in records if r.fit]
    if not records:
        raise InputError("--from", "no measurements to fit on")
    batch = Batch.of(records)
    if np.isfinite(measured(records, MEMORY_KEYS["allocated"])).sum() >= 4:
        c = _fit_group(batch, c, MEMORY_FIT, _memory_residuals(records, ("allocated",)), memory=True)
    if sum(np.isfinite(measured(records, MEMORY_KEYS[k])).sum() for k in ("reserved", "smi")) >= 4:
        c = _fit_group(batch, c, SLACK_FIT, _memory_residuals(records, ("reserved", "smi")), memory=True)
    errors = log_errors(records, batch.predict(c, throughput=False))  # the peaks: not moved by the OOM boundary
    if errors.size >= 4:
        c = c.replace(peak_log_sigma=float(max(0.02, _robust_sd(errors))))
    if any(not r.valid for r in records):
        c = c.replace(oom_fragmentation_fraction=_oom_fragmentation(batch, c))
    speed, is_train = measured_throughput(records)
    if np.isfinite(speed).sum() >= 4:
        c = _fit_group(
            batch,
            c,
            SPEED_FIT,
            lambda p: _log_residuals(np.where(is_train > 0, p["tps"], p["dtps"]), speed),
            memory=False,
        )
    return c


def model_label(family: str) -> str:
    """A model family's name in a calibration: a published run's config file by its folder
    (``.../configs/llama-3-8b/config.json`` -> ``published/llama-3-8b``), so no machine's paths are shipped."""
    return f"published/{Path(family).parent.name}" if family.endswith("config.json") else family


def _robust_sd(x: np.ndarray) -> float:
    """Standard deviation estimated from the median absolute deviation (robust to a few odd runs)."""
    return float(1.4826 * np.median(np.abs(x - np.median(x))))


# --- scoring ----------------------------------------------------------------------------------------
def mdape(pred: np.ndarray, meas: np.ndarray) -> float:
    """Median absolute percentage error over the finite pairs."""
    ok = ~np.isnan(meas) & ~np.isnan(pred) & (meas > 0)
    return float(np.median(np.abs(pred[ok] / meas[ok] - 1)) * 100) if ok.any() else float("nan")


METHOD_OF = {exp: method for method, exp in METHOD_EXPERIMENT.items()}


def scores(records: list[Record], pred: dict[str, np.ndarray]) -> dict[str, float]:
    """MdAPE of each memory kind and of all memory measurements, OOM accuracy (all, near the limit), throughput."""
    out: dict[str, float] = {}
    pairs_pred, pairs_meas = [], []
    for key, prop in MEMORY_KEYS.items():
        m = measured(records, prop)
        out[f"{key}_mdape_pct"] = mdape(pred[key], m)
        out[f"{key}_n"] = int(np.isfinite(m).sum())
        pairs_pred.append(pred[key])
        pairs_meas.append(m)
    out["peak_mdape_pct"] = mdape(np.concatenate(pairs_pred), np.concatenate(pairs_meas))
    out["peak_n"] = int(sum(out[f"{k}_n"] for k in MEMORY_KEYS))
    known, right = verdicts(records, pred)
    labels = np.array([r.valid for r in records], dtype=bool)
    near_n = int((near_limit(records, pred) & known).sum())
    out["oom_accuracy_pct"] = float(np.mean(right[known]) * 100) if known.any() else float("nan")
    out["oom_n"] = int(known.sum())
    misses = len(near_limit_misses(records, pred))
    out["oom_near_limit_accuracy_pct"] = 100.0 * (near_n - misses) / near_n if near_n else float("nan")
    out["oom_near_limit_n"] = near_n
    # the "does not fit" verdict as a detector of real out-of-memory runs: accuracy alone rewards "fits"
    said_oom, was_oom = (pred["fits"] <= 0) & known, ~labels & known
    hits = int((said_oom & was_oom).sum())
    out["oom_precision_pct"] = 100.0 * hits / said_oom.sum() if said_oom.any() else float("nan")
    out["oom_recall_pct"] = 100.0 * hits / was_oom.sum() if was_oom.any() else float("nan")
    out["oom_true_n"] = int(was_oom.sum())
    methods = np.array([METHOD_OF.get(r.experiment_id, "?") for r in records])
    for method in ("full", "lora", "qlora"):
        rows = methods == method
        out[f"peak_{method}_mdape_pct"] = mdape(
            np.concatenate([p[rows] for p in pairs_pred]), np.concatenate([m[rows] for m in pairs_meas])
        )
    speed, is_train = measured_throughput(records)
    out["throughput_mdape_pct"] = mdape(np.where(is_train > 0, pred["tps"], pred["dtps"]), speed)
    out["throughput_n"] = int(np.isfinite(speed).sum())
    return out


def leave_one_out(
    records: list[Record],
    group: Callable[[Record], str],
    start: Coefficients | None = None,
    progress: Callable[..., None] | None = None,
    fit_s: float | None = None,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Refit without each group (model family or source) and predict it: pooled and per-group scores.

    progress(message, eta_s) before each refit; eta_s: seconds left, the mean refit time so far times the
    refits left (before the first: fit_s, the time of a fit on every record, per refit; None if not given).
    """
    names = sorted({group(r) for r in records})
    say = progress or (lambda _msg, eta_s=None: None)
    n = len(records)
    pooled = {k: np.full(n, np.nan) for k in (*MEMORY_KEYS, "fits", "p_oom", "capacity", "tps", "dtps")}
    per_group = {}
    started = time.monotonic()
    for number, name in enumerate(names, start=1):
        done = number - 1
        per_fit = (time.monotonic() - started) / done if done else fit_s
        say(f"held out {number}/{len(names)}: {name}", eta_s=None if per_fit is None else per_fit * (len(names) - done))
        train = [r for r in records if group(r) != name]
        test_idx = [i for i, r in enumerate(records) if group(r) == name]
        if not any(r.fit for r in train):
            continue
        c = fit(train, start)
        test = [records[i] for i in test_idx]
        pred = Batch.of(test).predict(c)
        for k in pooled:
            pooled[k][test_idx] = pred[k]
        per_group[name] = scores(test, pred)
    return {"pooled": scores(records, pooled), "per_group": per_group}, pooled


def leave_one_model_out(
    records: list[Record],
    start: Coefficients | None = None,
    progress: Callable[..., None] | None = None,
    fit_s: float | None = None,
):
    return leave_one_out(records, lambda r: model_label(r.family), start, progress, fit_s)


def leave_one_source_out(records: list[Record], start: Coefficients | None = None):
    return leave_one_out(records, lambda r: r.origin, start)


def calibrate(
    records: list[Record], source: str, lomo: bool = True, progress: Callable[..., None] | None = None
) -> Calibration:
    """A Calibration fitted on all records, with in-sample and leave-one-model-out metrics.

    The out-of-memory probability's uncertainty (peak_log_sigma) is set from the held-out log errors
    when leave-one-model-out runs: the error a new model will really see; the OOM boundary is then
    chosen again under it.
    """
    if not records:
        raise InputError("--from", "no usable measurements to calibrate on")
    say = progress or (lambda _msg, eta_s=None: None)
    say(f"fitting on {len(records)} runs")
    started = time.monotonic()
    c = fit(records)
    fit_s = time.monotonic() - started  # each held-out refit is on fewer runs: at most about this long
    metrics: dict[str, Any] = {}
    families = len({r.family for r in records})
    if lomo and families > 1:
        say(f"leave-one-model-out: refitting once per model family ({families} refits)", eta_s=fit_s * families)
        held_out, pooled = leave_one_model_out(records, progress=say, fit_s=fit_s)
        metrics["leave_one_model_out"] = held_out
        errors = log_errors(records, pooled)
        if errors.size >= 4:
            c = c.replace(peak_log_sigma=float(max(0.02, _robust_sd(errors))))
            # the OOM boundary again, under the probabilities the planner will give (fit chose it under the
            # in-sample spread)
            fitted = [r for r in records if r.fit]
            if any(not r.valid for r in fitted):
                c = c.replace(oom_fragmentation_fraction=_oom_fragmentation(Batch.of(fitted), c))
    metrics = {"in_sample": scores(records, Batch.of(records).predict(c)), **metrics}
    return Calibration(
        coefficients=c,
        source=source,
        records=len(records),
        models=tuple(sorted({model_label(r.family) for r in records})),
        metrics=metrics,
    )
