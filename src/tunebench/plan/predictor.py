"""The predicting actuator: a Result for any (experiment, entity), one at a time or a whole space.

``predict`` and ``predict_many`` return ``tunebench.spec.results.Result`` objects with
``actuator="predict"``: status ``valid`` with the predicted measured properties (the measuring
actuator's names), or ``invalid`` when a validity rule breaks or the job will not fit on the GPU
(``reasons`` say which). ``metadata`` explains the prediction: the per-component memory breakdown
(GiB per GPU), the phase that sets the peak, headroom, step time, steps, MFU, cost.

``predict_many`` groups entities by their categorical settings and evaluates each group as numpy
arrays (``workload.py``), so screening 100,000 entities takes about a second; ``predict`` is
``predict_many`` of one, so both always agree.
"""

from __future__ import annotations

import functools
import gc
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tunebench import paths
from tunebench.catalog import ModelSpec
from tunebench.errors import InputError
from tunebench.plan.coefficients import Calibration, default_calibration
from tunebench.plan.host import CACHE_FILE, Adapters, HostRate, entity_rate, probe_shape
from tunebench.plan.lengths import UserLengths
from tunebench.plan.memory import predict_memory
from tunebench.plan.throughput import flops_per_token, network_rate, predict_throughput, tp_spans_nodes
from tunebench.plan.workload import NUMERIC, build_workload, gpu_class, group_key
from tunebench.spec.experiments import Entity, Experiment, make_entity, resolved_defaults, target_modules_for
from tunebench.spec.measured import BENCHMARK_MEASURED, MEMORY_GIB
from tunebench.spec.properties import NODE_GPUS, PADDING_FREE_MODEL_TYPES
from tunebench.spec.results import Result
from tunebench.spec.validity import cannot_run_reasons, check_values

# The measured properties the planner predicts: the spec's memory peak and rates, tunebench's GiB peaks.
PREDICTED = (
    "gpu_memory_utilization_peak",
    *(p for p in BENCHMARK_MEASURED if p.startswith(("train_", "dataset_"))),
    *MEMORY_GIB,
)
USER_CALIBRATION = "calibration.json"


def user_calibration_path() -> Path:
    """Where ``tunebench calibrate`` writes a refit by default (and predictions pick it up)."""
    return paths.home() / USER_CALIBRATION


def load_calibration(path: str | os.PathLike | None = None) -> Calibration:
    """An explicit calibration file, else the user's refit (if any), else the shipped default."""
    if path:
        return _cached_calibration(str(Path(path).expanduser()), Path(path).expanduser().stat().st_mtime)
    user = user_calibration_path()
    if user.exists():
        return _cached_calibration(str(user), user.stat().st_mtime)
    return default_calibration()


@dataclass(frozen=True)
class PlanOptions:
    """Options of a prediction that are not entity properties."""

    calibration: Calibration | None = None
    price_per_gpu_hour: float | None = None  # currency units per GPU-hour, for cost (None: the catalog's USD price)
    network_gbps: float | None = None  # inter-node bandwidth per node and direction (default by RoCE)
    host_memory_gib: float | None = None  # host RAM per node, checked against offload's need and a CPU run's memory
    lengths: UserLengths | None = None  # the user's sample lengths (--avg-tokens, --lengths), else the data set's
    # time a CPU run on this host (plan.host, seconds a shape); False: at the calibrated cpu_tflops, for searches
    # that need only the verdict (a CPU run's memory and verdict do not depend on its speed)
    probe_host: bool = True
    node_gpus: int = NODE_GPUS  # GPUs a node holds, for the layout notes (recommend's --gpus-per-node)


def predict(experiment: Experiment, entity: Entity | Mapping[str, Any], **options: Any) -> Result:
    """The predicted Result of one entity (options: calibration, price_per_gpu_hour, network_gbps).

    InputError when the planner cannot size the entity's model (predict_many returns a failed Result).
    """
    result = predict_many([(experiment, entity)], **options)[0]
    raise_input_error(result)
    return result


def raise_input_error(result: Result) -> None:
    """Re-raise the InputError behind a failed prediction (its field and message), if any."""
    if result.status == "failed" and result.metadata.get("error_field"):
        field, _, message = (result.error or "").partition(": ")
        raise InputError(result.metadata["error_field"], message or (result.error or ""))


def predict_many(items: Iterable[tuple[Experiment, Entity | Mapping[str, Any]]], **options: Any) -> list[Result]:
    """Predicted Results of many (experiment, entity) pairs, in order; raw dicts are parsed first."""
    # Building ~10^5 small dicts triggers the cyclic collector over and over; nothing here makes
    # cycles, so it is paused for the call (halves the time of a 100,000-entity space).
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _predict_many(items, PlanOptions(**options))
    finally:
        if enabled:
            gc.enable()


def _predict_many(items: Iterable[tuple[Experiment, Entity | Mapping[str, Any]]], opts: PlanOptions) -> list[Result]:
    prepared = []
    defaults: dict[int, tuple[str, dict[str, Any]]] = {}  # per experiment: (id, hardcoded + defaults)
    keys = []
    for experiment, entity in items:
        if not isinstance(entity, Entity):
            entity = make_entity(experiment, entity)
        exp_id, values = _effective_values(experiment, entity, defaults)
        prepared.append((exp_id, experiment, entity, values))
        # group by experiment + the entity's own non-numeric values; the rest are the experiment's defaults
        # (entity values are canonical and hashable: tuples, not lists)
        keys.append(
            (
                exp_id,
                gpu_class(values.get("number_gpus")),
                *[kv for kv in entity.values.items() if kv[0] not in NUMERIC],
            )
        )
    columns = predict_values(
        [(e.method, v) for _, e, _, v in prepared],
        opts,
        keys=keys,
        single_node_only=[e.single_node_only for _, e, _, _ in prepared],
    )
    return _results(columns, [(exp_id, entity.id) for exp_id, _, entity, _ in prepared], opts)


def _effective_values(
    experiment: Experiment, entity: Entity, cache: dict[int, tuple[str, dict[str, Any]]]
) -> tuple[str, dict[str, Any]]:
    """(experiment id, tunebench.spec.experiments.effective_values) with the defaults merged once per experiment."""
    cached = cache.get(id(experiment))
    if cached is None:
        cached = cache[id(experiment)] = (experiment.id, {**experiment.hardcoded, **resolved_defaults(experiment)})
    exp_id, base = cached
    values = dict(base)
    values.update(entity.values)
    if experiment.uses_lora and not values.get("target_modules"):
        values["target_modules"] = target_modules_for(experiment, values["model_name"])
    return exp_id, values


def predict_values(
    rows: Sequence[tuple[str, Mapping[str, Any]]],
    options: PlanOptions | None = None,
    model: ModelSpec | None = None,
    keys: Sequence[tuple] | None = None,
    single_node_only: Sequence[bool] | bool = False,
) -> dict[str, Any]:
    """Core: (method, effective values) rows -> columns of predictions (numpy arrays, row order).

    The explorer can call this directly on a whole space; ``predict_many`` wraps it into Results.
    A row that breaks a validity rule (spec.validity, with its experiment's ``single_node_only``) has
    the rules' reasons in ``rules`` and no figures: it cannot start, so numbers computed with a negative
    batch or tp x sp beyond its GPUs would mean nothing. Rows whose GPU is unknown (rule 5) get NaN
    predictions; a group the planner cannot size gets its InputError in ``errors`` and NaN predictions,
    so one bad model never stops the others. ``keys`` (optional, one per row) replace
    ``workload.group_key`` for grouping: they may split groups further, never merge rows whose group_key
    differs; callers that know a cheaper key pass it.
    """
    opts = options or PlanOptions()
    cal = opts.calibration or load_calibration()
    n = len(rows)
    out: dict[str, Any] = {
        k: np.full(n, np.nan) for k in (*PREDICTED, *_META, *_PRICE, "flops_per_token", "padded_tokens_per_sample")
    }
    out["fits"] = np.ones(n, dtype=bool)
    out["peak_phase"] = np.full(n, "", dtype=object)
    out["breakdown"] = [None] * n
    out["price_source"] = [""] * n
    out["notes"] = [[] for _ in range(n)]
    out["reasons"] = [[] for _ in range(n)]
    out["errors"] = [None] * n
    out["calibration"] = cal.source
    single = [single_node_only] * n if isinstance(single_node_only, bool) else list(single_node_only)
    out["rules"] = [
        check_values(values, single_node_only=one).reasons + cannot_run_reasons(values)
        for (_, values), one in zip(rows, single, strict=True)
    ]  # and what the spec allows but cannot start either (spec.validity.cannot_run_reasons)
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, (method, values) in enumerate(rows):
        if values.get("number_gpus", 0) > 0 and not values.get("gpu_model"):
            continue  # rule 5: nothing to plan against
        if out["rules"][i] and not values.get("number_gpus"):
            continue  # a CPU run that cannot start: not timed on this host for figures that are blanked
        groups[keys[i] if keys is not None else group_key(values, method)].append(i)
    for idx in groups.values():
        try:
            _predict_group(out, idx, rows, cal.coefficients, opts, model)
        except InputError as err:
            for i in idx:
                out["errors"][i] = err
                out["fits"][i] = False  # nothing sized, nothing fits
    out["cost"] = out["gpu_hours"] * out["price_per_gpu_hour"]
    _unplanned(out, [i for i, rules in enumerate(out["rules"]) if rules])
    return out


def _unplanned(out: dict[str, Any], broken: list[int]) -> None:
    """Rows that break a validity rule keep their rules, notes and data-set reading (padded tokens per sample),
    and lose every figure: NaN, no breakdown, no reasons of their own (out of memory), not fitting."""
    keep = ("padded_tokens_per_sample", "tokens_per_sample")
    for k, col in out.items():
        if isinstance(col, np.ndarray) and col.dtype.kind == "f" and k not in keep:
            col[broken] = np.nan
    for i in broken:
        out["fits"][i] = False
        out["peak_phase"][i] = ""
        out["breakdown"][i] = None
        out["reasons"][i] = []


def gpu_price(gpu, override: float | None) -> tuple[float | None, str]:
    """(price of one GPU-hour, where it comes from): the caller's price (--price-per-gpu-hour), else the
    GPU catalog's on-demand list price in USD (catalog.gpus.PRICES), else None (no cost)."""
    if override is not None:
        return override, "--price-per-gpu-hour"
    if gpu is None or gpu.price_usd_per_gpu_hour is None:
        return None, ""
    return gpu.price_usd_per_gpu_hour, f"GPU catalog, USD: {gpu.price_source}"


def cpu_rates(w, padded) -> list[HostRate]:
    """This host's rate for each CPU entity of a workload, probed on a micro-batch shaped like its own (a
    padding-free one as its one row), with its attention implementation and LoRA adapters (plan.host)."""
    tokens = np.broadcast_to(w.per_device_batch * padded, (w.size,))
    seqs = np.broadcast_to(w.rows(padded)[1], (w.size,))  # padding_free: one row of the micro-batch's samples
    samples = np.broadcast_to(padded, (w.size,))  # tokens of a sample in that row (its position ids restart)
    fpt = np.broadcast_to(flops_per_token(w), (w.size,))
    adapters = None
    if w.method in ("lora", "qlora", "gptq-lora"):
        request = w.trace_request()
        adapters = Adapters(request.target_modules, request.lora_dropout)
    memo: dict[tuple, HostRate] = {}  # sweeps repeat the probe's shape and FLOPs count
    out = []
    for n, seq, sample, f in zip(tokens, seqs, samples, fpt, strict=True):
        shape = probe_shape(float(n), float(seq))
        packed = max(1, round(float(sample))) if w.padding_free else None
        key = (shape, float(f), packed)
        if key not in memo:
            memo[key] = entity_rate(
                w.structure, w.torch_dtype, w.autocast, w.checkpointing, shape, float(f), w.attention, adapters, packed
            )
        out.append(memo[key])
    return out


def _gflops(rates: np.ndarray) -> str:
    """GFLOP/s of one rate, or the range of several."""
    lo, hi = float(np.min(rates)) / 1e9, float(np.max(rates)) / 1e9
    return f"{lo:.3g}" if lo == hi else f"{lo:.3g}-{hi:.3g}"


def _predict_group(out: dict[str, Any], idx: list[int], rows, c, opts: PlanOptions, model: ModelSpec | None) -> None:
    """Fill the columns of one group of rows (a Workload) in place."""
    method = rows[idx[0]][0]
    lengths = opts.lengths.for_model(str(rows[idx[0]][1]["model_name"])) if opts.lengths is not None else None
    w = build_workload(method, [rows[i][1] for i in idx], model=model, lengths=lengths)
    if w.method in ("lora", "qlora", "gptq-lora") and not w.lora_params_per_rank:
        leaves = sorted({lin.leaf for lin in w.structure.linears if lin.kind == "linear" and lin.part == "layers"})
        reason = (
            f"target_modules {', '.join(w.unmatched_target_modules)} match no layer of {w.model.name}: "
            f"LoRA would fail (its linear layers: {', '.join(leaves)})"
        )
        for i in idx:
            out["reasons"][i].append(reason)
            out["fits"][i] = False
        return
    if reason := _attention_lacking(w):
        for i in idx:
            out["reasons"][i].append(reason)
            out["fits"][i] = False
        return
    m = predict_memory(w, c)
    real, padded = w.sample_tokens()
    rates = None if w.on_gpu or not opts.probe_host else cpu_rates(w, padded)
    host = None if rates is None else np.array([r.flops for r in rates])
    opt = None if rates is None else np.array([r.optimizer_s_per_param for r in rates])
    t = predict_throughput(w, c, opts.network_gbps, host, opt)
    cols = {
        "gpu_memory_utilization_peak": m.utilization_pct,
        "gpu_memory_allocated_peak_gib": m.allocated_gib,
        "gpu_memory_reserved_peak_gib": m.reserved_gib,
        "gpu_memory_peak_gib": m.nvidia_smi_gib,
        "train_runtime": t.train_runtime,
        "train_samples_per_second": t.train_samples_per_second,
        "train_steps_per_second": t.train_steps_per_second,
        "train_tokens_per_second": t.train_tokens_per_second,
        "train_tokens_per_gpu_per_second": t.train_tokens_per_gpu_per_second,
        "dataset_tokens_per_second": t.dataset_tokens_per_second,
        "dataset_tokens_per_second_per_gpu": t.dataset_tokens_per_second / w.devices,
        "step_seconds": t.step_seconds,
        "steps": t.steps,
        "mfu": t.mfu,
        "flops_per_token": t.flops_per_token,
        "per_device_batch": w.per_device_batch,
        "tokens_per_sample": real * np.ones(w.size),
        "padded_tokens_per_sample": padded * np.ones(w.size),
        "gpu_hours": np.where(w.gpus >= 1, t.train_runtime / 3600 * w.gpus, np.nan),  # a CPU run uses none
        "host_memory_gib": m.host_gib,
        "nvme_gib": m.nvme_gib,
    }
    cols["required_gib"] = m.required_gib  # a CPU run's too: its need is weighed against the host's RAM
    if m.capacity_gib is not None:
        cols["capacity_gib"] = np.where(w.gpus >= 1, m.capacity_gib, np.nan)  # a CPU run fills no GPU
        cols["usable_gib"] = m.usable_gib
        cols["headroom_gib"] = m.usable_gib - m.required_gib
        cols["oom_probability"] = np.where(w.gpus >= 1, m.oom_probability, np.nan)  # nor runs out of one
    price, source = gpu_price(w.gpu, opts.price_per_gpu_hour)
    if price is not None and w.on_gpu:
        cols["price_per_gpu_hour"] = np.full(w.size, price)
        for i in idx:
            out["price_source"][i] = source
    for k, v in cols.items():
        out[k][idx] = v
    out["fits"][idx] = m.fits
    out["peak_phase"][idx] = m.peak_moment
    names = list(m.breakdown_gib)
    stacked = np.round(np.stack([m.breakdown_gib[k] for k in names], axis=1), 4).tolist()
    no_sync = ((w.mode() == "FSDP") & (w.grad_accum > 1) & (w.devices > 1)).tolist()
    notes = _group_notes(w)
    if not w.on_gpu and w.gpu is not None:  # number_gpus=0 beside a gpu_model: what was planned
        notes.append(f"number_gpus=0 is a CPU run: gpu_model {w.gpu.name} is not used (no GPU memory, no GPU-hours)")
    if not w.on_gpu and (idle := _cpu_idle_settings(w.settings)):
        notes.append(
            f"number_gpus=0 is a CPU run: {', '.join(idle)} {'has' if len(idle) == 1 else 'have'} no effect "
            "(one process, its model and states in host memory already): planned without"
        )
    if not w.on_gpu and opts.price_per_gpu_hour is not None:
        notes.append("a CPU run uses no GPU-hours: a price per GPU-hour gives it no cost")
    if rates is not None:
        probes = [r.probe for r in sorted(set(rates), key=lambda r: (r.tokens, r.probe))]
        notes.append(
            f"CPU: this host trains at {_gflops(host)} GFLOP/s ({w.torch_dtype}, autocast {w.autocast or 'no'}, "
            f"checkpointing {'on' if w.checkpointing else 'off'}; probe: {', '.join(probes)}; measured once, "
            f"cached in {paths.home() / CACHE_FILE}): throughput is this host's, not another's"
        )
    if w.unmatched_target_modules:
        notes.append(f"target_modules {', '.join(w.unmatched_target_modules)} match no layer of {w.model.name}")
    no_sync_note = (
        "FSDP accumulates unsharded gradients over gradient_accumulation_steps micro-batches "
        "(no_sync; torch FSDP docs): gradient_accumulation_steps=1 shards them"
    )
    rate, why = network_rate(w, opts.network_gbps)
    network_note = (
        f"across nodes, collectives run at {rate:g} GB/s per node ({why}; --network-gbps gives your cluster's)"
    )
    multi_node = ((w.nodes > 1) & (w.gpus >= 1)).tolist()  # a CPU run over nodes is refused (a rule), no network
    variants: dict[tuple[bool, bool], list[str]] = {}  # rows of a group share their (read-only) notes lists
    for j, i in enumerate(idx):
        out["breakdown"][i] = dict(zip(names, stacked[j], strict=True))
        key = (bool(no_sync[j] and w.method == "full"), bool(multi_node[j]))
        if key not in variants:
            variants[key] = [*notes, *([no_sync_note] if key[0] else []), *([network_note] if key[1] else [])]
        out["notes"][i] = variants[key]
    _note_lengths(out, idx, w)
    _note_topology(out, idx, w, f"{rate:g} GB/s per node ({why})", opts.node_gpus)
    _check_host_memory(out, idx, m.host_gib, opts.host_memory_gib)
    if not w.on_gpu:
        _check_cpu_memory(out, idx, m.required_gib, opts.host_memory_gib)


_META = ("capacity_gib", "usable_gib", "required_gib", "headroom_gib", "oom_probability", "step_seconds", "steps",
         "mfu", "per_device_batch", "tokens_per_sample", "gpu_hours", "host_memory_gib", "nvme_gib")  # fmt: skip
_PRICE = ("cost", "price_per_gpu_hour")  # cost = gpu_hours x price_per_gpu_hour (NaN: a CPU run, or no price)
# What a prediction stores beside PREDICTED (the measuring actuator's names): GPU-hours of the run (GPU runs
# only) and its cost (where a price is known), so a store of predictions compares GPUs and methods by cost.
PREDICTED_COST = ("gpu_hours", "cost")


def _check_host_memory(out: dict[str, Any], idx: list[int], need_gib: np.ndarray, node_gib: float | None) -> None:
    """Offloaded states against the node's RAM: over it the job does not fit; not given, a note says
    what the node needs."""
    if not (need_gib > 0).any():
        return
    for j, i in enumerate(idx):
        need = float(need_gib[j])
        if need <= 0:
            continue
        if node_gib is None:
            out["notes"][i] = [
                *out["notes"][i],
                f"offload keeps {need:.{1 if need >= 0.1 else 2}f} GiB in host memory per node "
                "(not checked: give the node's RAM, --host-memory-gib or host_memory_gib)",
            ]
        elif need > node_gib:
            out["reasons"][i].append(
                f"out of host memory: offload keeps {need:.1f} GiB per node against host_memory_gib {node_gib:g}"
            )
            out["fits"][i] = False


def _note_lengths(out: dict[str, Any], idx: list[int], w) -> None:
    """Notes where a sample is not model_max_length tokens long: cut shorter by the model's tokenizer (where the
    samples reach its limit), past the model's context (max_position_embeddings: planned as asked), or shorter
    in the data set (planned at the data set's length). Only the entities concerned are visited: a hot path for
    100,000-entity plans."""
    asked = np.broadcast_to(np.asarray(w.max_length), (w.size,))
    cut = np.broadcast_to(w.length_limit(), (w.size,))  # model_max_length, or the tokenizer's when smaller
    mine = w.lengths  # the user's own samples: their note says how long they are
    if mine is None:
        longest = np.broadcast_to(w.sample_tokens()[0], (w.size,))  # the data set's samples, as cut
    elif mine.longest_known:
        longest = np.minimum(max(mine.counts), cut)
    else:  # a mean alone gives no longest sample: memory is sized at the cut
        longest = cut
    for j in np.flatnonzero((asked > cut) & (longest >= cut - 0.5)):
        _add_note(
            out,
            idx[j],
            f"{w.model.name}'s tokenizer cuts samples at {int(cut[j]):,} tokens (its model_max_length): planned "
            f"at {int(cut[j]):,}, not at model_max_length {int(asked[j]):,}",
        )
    limit = w.structure.max_position
    if limit:
        for j in np.flatnonzero(longest > limit):
            length = f"model_max_length {int(asked[j]):,}" if cut[j] == asked[j] else f"the tokenizer's {int(cut[j]):,}"
            _add_note(
                out,
                idx[j],
                f"{length} exceeds the model's context ({limit:,} positions): planned as asked, but the model was "
                "not trained that long",
            )
    if mine is not None:
        real, padded = (np.broadcast_to(t, (w.size,)) for t in w.sample_tokens())
        batch = np.broadcast_to(w.per_device_batch, (w.size,))
        modes = np.broadcast_to(w.mode(), (w.size,))
        row = np.broadcast_to(w.memory_tokens() * w.per_device_batch, (w.size,))  # padding_free: the largest row
        runs_rows = np.broadcast_to(w.micro_batches(), (w.size,))  # the run's rows (padding_free's note)
        # one text per (mean, cut, padded, batch, rows, largest row): a sweep has a few
        notes: dict[tuple[float | str, ...], str] = {}
        for j in range(w.size):
            key = (
                float(real[j]),
                float(cut[j]),
                float(asked[j]),
                float(padded[j]),
                float(batch[j]),
                str(modes[j]),
                float(runs_rows[j]),
                float(row[j]),
            )
            if key not in notes:
                limit_text = "model_max_length" if cut[j] == asked[j] else f"the tokenizer's limit, {int(cut[j]):,}"
                if w.padding_free and mine.longest_known:
                    size = (
                        f"the expected largest of the run's {runs_rows[j]:,.0f} rows of {batch[j]:,.0f} of your samples drawn "
                        f"at random ({row[j]:,.0f} tokens; each sample capped at {limit_text})"
                    )
                elif mine.longest_known:
                    size = f"its longest sample ({max(mine.counts):,} tokens, capped at {limit_text})"
                else:
                    size = f"{limit_text} (a mean gives no longest sample)"
                mean = float(np.mean(mine.counts))
                cut_text = "" if abs(mean - real[j]) < 0.05 else f", {real[j]:,.1f} once cut at {int(cut[j]):,}"
                notes[key] = (
                    f"{LENGTHS_NOTE} ({mine.source}; mean {mean:,.1f} tokens{cut_text}): time, throughput "
                    f"and cost use them; peak memory is sized for {size}"
                    + _padding_text(w, real[j], padded[j], batch[j], str(modes[j]))
                )
            _add_note(out, idx[j], notes[key])
        return
    # padding adds at most 1 % to a data set's sample (Workload.sample_tokens): shorter by more, the plan is too
    for j in np.flatnonzero(longest * 1.01 < cut - 0.5):
        _add_note(
            out,
            idx[j],
            f"the samples of dataset_id {w.dataset.id} are about {longest[j]:,.0f} tokens, shorter than "
            f"model_max_length {int(asked[j]):,}: planned at their length (memory for {int(cut[j]):,}-token "
            "samples needs a data set of samples that long)",
        )


LENGTHS_NOTE = "samples as long as yours"  # how the note on the user's sample lengths begins (recommend repeats it)
# a micro-batch padded by this much more than its samples' own tokens is worth flattening (padding_free)
PADDING_WORTH_NOTING = 0.10


def _padding_text(w, real: float, padded: float, batch: float, mode: str) -> str:
    """What padding costs the user's samples, or that padding_free removes it (Workload.sample_tokens). The
    suggestion only where padding_free can run: not prompt tuning (its virtual tokens are not padding) or image-text
    samples, not one process over several GPUs (spec.validity), a model type checked to keep a flattened row's
    samples apart (spec.properties.PADDING_FREE_MODEL_TYPES)."""
    if w.padding_free:
        return "; padding_free: each micro-batch is one row of its samples' own tokens, nothing padded"
    runs = (
        w.method != "pt"
        and w.dataset.kind != "vision"
        and mode != "DP"
        and w.structure.model_type in PADDING_FREE_MODEL_TYPES
    )
    if not runs or padded <= real * (1 + PADDING_WORTH_NOTING):
        return ""
    return (
        f"; a micro-batch of {batch:,.0f} padded to its longest sample processes {padded:,.0f} tokens a sample, "
        f"{1 - real / padded:.0%} of them padding: padding_free=1 processes only the samples' own (fms-hf-tuning "
        "--padding_free huggingface, with flash-attention)"
    )


def _note_topology(out: dict[str, Any], idx: list[int], w, network: str, node_gpus: int) -> None:
    """Notes where the GPUs' layout decides the speed: more GPUs in a node than a node holds (planned as if one
    NVLink switch joined them all: number_nodes is likely missing), and a tensor x sequence parallel group
    larger than a node or across a node's edge (its per-layer collectives cross the network:
    throughput.tp_spans_nodes)."""
    per_node = np.broadcast_to(w.gpus_per_node, (w.size,))
    group = np.broadcast_to(w.tp * w.sp, (w.size,))
    spans = np.broadcast_to(tp_spans_nodes(w), (w.size,))
    for j in np.flatnonzero(per_node > node_gpus):
        _add_note(
            out,
            idx[j],
            f"{per_node[j]:g} GPUs in one node (number_gpus / number_nodes): planned as if NVLink joined them all, "
            f"where a node holds {node_gpus} (HGX/DGX; recommend --gpus-per-node says otherwise); give number_nodes "
            "for a job over several nodes",
        )
    for j in np.flatnonzero(spans):
        _add_note(
            out,
            idx[j],
            f"tensor_parallel_degree x sequence_parallel_degree {group[j]:g} spans nodes of {per_node[j]:g} GPUs: "
            f"their per-layer collectives cross the network, {network}; a group within one node runs at NVLink's "
            "rate",
        )


def _add_note(out: dict[str, Any], i: int, note: str) -> None:
    out["notes"][i] = [*out["notes"][i], note]


def _check_cpu_memory(out: dict[str, Any], idx: list[int], need_gib: np.ndarray, node_gib: float | None) -> None:
    """A CPU run (number_gpus=0) keeps its weights, states and activations in the host's RAM: its need (the
    allocated peak + fragmentation, as a GPU's) above the RAM
    (host_memory_gib, else this machine's, the host a CPU plan is timed on too, within a container's
    memory limit) it does not fit."""
    free_gib = None
    if node_gib is None:
        from tunebench.limits import available_memory, total_memory

        node_gib, source = total_memory() / 2**30, "this machine's RAM"
        free_gib = available_memory() / 2**30  # what other programs leave now: a note, the verdict stays repeatable
    else:
        source = "host_memory_gib"
    for j, i in enumerate(idx):
        need = float(need_gib[j])
        if need > node_gib:
            out["reasons"][i].append(
                f"out of host memory: the CPU run needs {need:,.1f} GiB against {node_gib:,.1f} GiB ({source})"
            )
            out["fits"][i] = False
        elif free_gib is not None and need > free_gib:
            _add_note(
                out,
                i,
                f"the CPU run needs {need:,.1f} GiB of this machine's {node_gib:,.1f} GiB, of which {free_gib:,.1f} "
                "GiB are free now: other programs hold the rest (the verdict counts all of it)",
            )


def _attention_lacking(w) -> str | None:
    """Why an attention asked for explicitly cannot run: transformers refuses to build a model with an
    attn_implementation its class does not support (PreTrainedModel._check_and_adjust_attn_implementation raises
    ValueError; bloom has neither sdpa nor flash-attention in 5.x), as the native engine judges it
    (engines.support). flash_attn's default (on with GPUs) is the spec's: planned with what the class has, noted."""
    explicit = w.settings.get("attn_implementation")
    asked = explicit or ("flash_attention_2" if w.settings.get("flash_attn") is True else None)
    if asked in (None, "eager"):
        return None
    needed = "flash_attention_2" if asked.startswith("flash") else asked  # the class flag covers FA2 and FA3
    if needed in w.structure.attention:
        return None
    via = f"attn_implementation {explicit}" if explicit else "flash_attn 1"
    return (
        f"{via}: {w.structure.model_type}'s transformers class has no {asked} attention, so the model would not "
        f"load (it has {', '.join(w.structure.attention)})"
    )


def _cpu_idle_settings(settings: dict[str, Any]) -> list[str]:
    """The GPU-placement settings a CPU run sets to no effect: offload to the host it computes on, device_map over
    GPUs it has none of (a CPU entity is one process: actuators.launch)."""
    offloads = ("offload_optimizer_device", "offload_param_device")
    idle = [f"{name} {settings[name]}" for name in offloads if (settings.get(name) or "none") != "none"]
    if settings.get("fsdp_offload_params"):
        idle.append("fsdp_offload_params true")
    if settings.get("device_map"):
        idle.append(f"device_map {settings['device_map']}")
    return idle


def _group_notes(w) -> list[str]:
    """What the prediction of a group assumed: the model's reading, the attention, the activation source."""
    notes = [f"model: {a}" for a in w.structure.assumptions]
    if w.on_gpu and w.gpu is not None and w.gpu.confidence in ("user", "derived") and w.gpu.notes:
        notes.append(f"gpu_model {w.gpu.name}: {w.gpu.notes}")  # numbers the planner assumed or derived
    if w.flash_asked and w.attention != "flash":
        notes.append(f"{w.structure.model_type} has no flash-attention 2 in transformers: planned with {w.attention}")
    by_default = w.settings.get("flash_attn") is None and w.settings.get("attn_implementation") is None
    if by_default and w.on_gpu and w.gpu is not None and w.gpu.architecture in ("Volta", "Turing"):
        notes.append(  # spec.validity judges an explicit flash_attn 1 there; the default is only warned about
            f"flash-attention 2 does not run on {w.gpu.architecture} GPUs: fms-hf-tuning's default (use_flash_attn) "
            "would fail there; set flash_attn=0 to plan the run that can start"
        )
    notes.extend(w.activations.notes)
    recurrent = [k for k, _ in w.structure.layer_kinds if "attention" not in k or k.startswith("linear")]
    if recurrent and len(w.structure.layer_kinds) > 1 and w.on_gpu:
        layers = ", ".join(f"{n} {k}" for k, n in w.structure.layer_kinds)
        if w.mamba_kernel:
            notes.append(
                f"hybrid layers ({layers}): the Mamba-2 layers are planned as mamba_ssm's fused kernel runs them "
                "(fms-hf-tuning 3.1.0 installs mamba_ssm and causal-conv1d); without those packages transformers "
                "runs its torch scan, which keeps far more (docs/planner.md section 2)"
            )
        else:
            notes.append(
                f"hybrid layers ({layers}): the {'/'.join(recurrent)} layers are traced with transformers' torch "
                "code; a fused kernel keeps less (docs/planner.md section 2)"
            )
    return notes


def _results(cols: dict[str, Any], ids: list[tuple[str, str]], opts: PlanOptions) -> list[Result]:
    """Columns -> one Result per entity (column-wise .tolist(), NaN as None: fast for large spaces)."""
    lists = {  # NaN -> None (v != v only for NaN)
        k: [None if v != v else v for v in np.asarray(cols[k], dtype=float).tolist()]
        for k in (*PREDICTED, *_META, *_PRICE)
    }
    pred_lists = [lists[k] for k in PREDICTED]
    meta_lists = [lists[k] for k in (*_META, *_PRICE)]
    meta_names = (*_META, *_PRICE)
    fits = cols["fits"].tolist()
    phase = cols["peak_phase"].tolist()
    out = []
    for i, (experiment_id, entity_id) in enumerate(ids):
        if cols["errors"][i] is not None:
            err = cols["errors"][i]
            out.append(
                Result.failed(
                    experiment_id, entity_id, str(err), metadata={"error_field": err.field}, actuator="predict"
                )
            )
            continue
        if cols["rules"][i]:  # breaks a validity rule: nothing is planned for it (predict_values)
            meta = {
                "calibration": cols["calibration"],
                "notes": cols["notes"][i],
                "planned": False,
                "fits": False,
                "blocked": True,
            }
            out.append(
                Result.invalid(experiment_id, entity_id, list(cols["rules"][i]), metadata=meta, actuator="predict")
            )
            continue
        predicted = dict(zip(PREDICTED, [col[i] for col in pred_lists], strict=True))
        meta: dict[str, Any] = dict(zip(meta_names, [col[i] for col in meta_lists], strict=True))
        meta["predicted"] = predicted
        meta["breakdown"] = cols["breakdown"][i] or {}
        meta["peak_phase"] = phase[i] or None
        meta["fits"] = fits[i]
        meta["calibration"] = cols["calibration"]
        meta["notes"] = cols["notes"][i]
        if meta["cost"] is None:
            del meta["cost"], meta["price_per_gpu_hour"]
        else:
            meta["price_source"] = cols["price_source"][i]
        reasons = list(cols["reasons"][i])
        meta["blocked"] = bool(reasons)  # a reason besides running out of GPU memory (host RAM, LoRA targets)
        if not fits[i] and (meta.get("oom_probability") or 0) > 0.5:
            reasons.append(oom_reason(meta))
        if reasons:
            out.append(Result.invalid(experiment_id, entity_id, reasons, metadata=meta, actuator="predict"))
        else:
            props = {k: v for k, v in predicted.items() if v is not None}
            props.update((k, meta[k]) for k in PREDICTED_COST if meta.get(k) is not None)
            out.append(Result.valid(experiment_id, entity_id, props, metadata=meta, actuator="predict"))
    return out


def oom_reason(meta: Mapping[str, Any]) -> str:
    """The invalid reason of a prediction that does not fit: probability, need, usable memory, headroom."""
    return (
        f"out of GPU memory (probability {meta['oom_probability']:.2f}): predicted need "
        f"{meta['required_gib']:.1f} GiB per GPU (peak in the {(meta['peak_phase'] or '').replace('_', ' ')}"
        " + fragmentation) against "
        f"{meta['usable_gib']:.1f} GiB usable of the {meta['capacity_gib']:.1f} GiB GPU "
        f"(headroom {meta['headroom_gib']:.1f} GiB)"
    )


def plan_json(result: Result, max_oom_risk: float | None = None) -> dict[str, Any]:
    """The `tunebench plan --json` object: the issue's keys first, then the explanation, then the verdict
    (recommend.verdict_of at max_oom_risk, default DEFAULT_MAX_OOM_RISK) and ``fits``, which is the verdict
    being fits, as in recommend's and max-batch's answers."""
    from tunebench.plan.recommend import DEFAULT_MAX_OOM_RISK

    meta = result.metadata
    pred = meta.get("predicted", {})
    out: dict[str, Any] = {
        "experiment_id": result.experiment_id,
        "entity_id": result.entity_id,
        "is_valid": result.status == "valid",
        "reasons": list(result.reasons),
    }
    for key in (
        "gpu_memory_allocated_peak_gib",
        "gpu_memory_reserved_peak_gib",
        "gpu_memory_peak_gib",
        "gpu_memory_utilization_peak",
        "train_tokens_per_second",
        "train_tokens_per_gpu_per_second",
        "dataset_tokens_per_second",
        "train_runtime",
    ):
        out[key] = _round(pred.get(key))
    out["breakdown"] = meta.get("breakdown", {})
    for key in ("dataset_tokens_per_second_per_gpu", "train_samples_per_second", "train_steps_per_second"):
        out[key] = _round(pred.get(key))
    for key in (
        "fits",
        "oom_probability",
        "headroom_gib",
        "peak_phase",
        "capacity_gib",
        "usable_gib",
        "required_gib",
        "step_seconds",
        "steps",
        "mfu",
        "per_device_batch",
        "tokens_per_sample",
        "gpu_hours",
        "host_memory_gib",
        "nvme_gib",
        "cost",
        "price_per_gpu_hour",
        "price_source",
        "calibration",
        "notes",
    ):
        if key in meta:  # the probability to 4 significant digits: a tiny one still counts against --max-oom-risk 0
            value = meta[key]
            out[key] = float(f"{value:.4g}") if key == "oom_probability" and value is not None else _round(value)
    out["planned"] = meta.get("planned", True)  # false: the entity breaks a validity rule, nothing is predicted
    out["max_oom_risk"] = DEFAULT_MAX_OOM_RISK if max_oom_risk is None else max_oom_risk
    out["verdict"] = result_verdict(result, out["max_oom_risk"])
    out["fits"] = out["verdict"] == "fits"
    return out


def result_verdict(result: Result, max_oom_risk: float) -> str:
    """recommend.verdict_of a predicted Result: blocked where nothing was planned (a validity rule) or where it has
    a reason besides the out-of-memory one (_results records which in metadata["blocked"])."""
    from tunebench.plan.recommend import verdict_of

    if result.status == "failed":  # the planner could not size it (its error says why)
        return "failed"
    p = result.metadata.get("oom_probability")
    blocked = result.metadata.get("blocked")
    if blocked is None:  # stored before "blocked" was recorded: _results adds the OOM reason exactly when p > 0.5
        blocked = not result.metadata.get("planned", True) or len(result.reasons) > int(p is not None and p > 0.5)
    return verdict_of(p, bool(blocked), max_oom_risk)


def _round(v: Any) -> Any:
    if isinstance(v, float):
        return round(v, 4)
    return v


@functools.lru_cache(maxsize=16)
def _cached_calibration(path: str, mtime: float) -> Calibration:
    """A calibration file, read once per modification time."""
    return Calibration.load(path)
