"""Fit the planner's free coefficients to measurements; leave-one-model-out error.

Inputs are records ``(experiment_id, entity values, measured properties)``: the store will hand its
results over as such (``fit_records``), and two CSV layouts read into them:

- the fms-acceleration benchmark layout (``shared/reference-data/fms-acceleration/*.csv``:
  framework_config, model_name_or_path, num_gpus, per_device_train_batch_size, peft_method, ...,
  mem_nvidia_mem_reserved (MiB), mem_peak_torch_mem_alloc_in_bytes, train_tokens_per_second per
  device; empty throughput = failed run, an out-of-memory when memory sits at capacity), and
- the spec's measured-property layout (ado's CSV export: experiment_id, the entity's properties,
  gpu_memory_utilization_peak, train_tokens_per_gpu_per_second, dataset_tokens_per_second_per_gpu,
  is_valid, ...).

Fitting (estimation.md §10 warns against tuning to one stack): each coefficient is pulled towards its
physical prior (a ridge penalty in log space), memory and throughput are fitted separately by
Nelder-Mead on log errors, and the honest score is leave-one-model-out: refit without a model
family, predict it.
"""

from __future__ import annotations

import csv
import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tunebench.catalog import ModelSpec, get_model
from tunebench.catalog.models import spec_from_config
from tunebench.errors import InputError
from tunebench.experiments import get_experiment, list_experiments
from tunebench.plan.coefficients import Calibration, Coefficients
from tunebench.plan.memory import predict_memory
from tunebench.plan.throughput import predict_throughput
from tunebench.plan.workload import Workload, build_workload, group_key

GIB = 2**30
SHARED = Path(__file__).resolve().parents[4] / "shared" / "reference-data" / "fms-acceleration"

# Models of the fms-acceleration runs that the catalog lacks, from their config.json:
# bigcode/gpt_bigcode-santacoder (GPTBigCode MQA, n_inner = 4 n_embd, tokenizer max 2048) and
# ibm/PowerLM-3b (Granite; dimensions from the PowerLM paper, arXiv:2408.13359 Table 4). Their
# parameter counts match the runs' "allocated after training" = 6N (santacoder 1.128 B, PowerLM 3.515 B).
EXTRA_MODELS: dict[str, dict[str, Any]] = {
    "bigcode/gpt_bigcode-santacoder": {
        "model_type": "gpt_bigcode", "n_embd": 2048, "n_layer": 24, "n_head": 16, "multi_query": True,
        "vocab_size": 49280, "n_positions": 2048, "n_inner": None, "tie_word_embeddings": True,
        "tokenizer_model_max_length": 2048,
    },
    "ibm/PowerLM-3b": {
        "model_type": "granite", "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 40,
        "num_attention_heads": 36, "num_key_value_heads": 36, "vocab_size": 49152, "tie_word_embeddings": True,
        "max_position_embeddings": 4096,
    },
}  # fmt: skip
# fms-acceleration checkpoints -> catalog names (GPTQ checkpoints share their base's architecture).
FMS_MODELS = {
    "mistralai/Mistral-7B-v0.1": "mistral-7b-v0.1",
    "TheBloke/Mistral-7B-v0.1-GPTQ": "mistral-7b-v0.1",
    "mistralai/Mixtral-8x7B-Instruct-v0.1": "mixtral-8x7b-instruct-v0.1",
    "TheBloke/Mixtral-8x7B-Instruct-v0.1-GPTQ": "mixtral-8x7b-instruct-v0.1",
    "NousResearch/Llama-2-70b-hf": "llama2-70b",
    "TheBloke/Llama-2-70B-GPTQ": "llama2-70b",
    "meta-llama/Meta-Llama-3-8B": "llama3-8b",
    "TechxGenus/Meta-Llama-3-8B-GPTQ": "llama3-8b",
    # granite-3.0-3b-a800m has the dimensions of the catalog's granite-3.1-3b-a800m-instruct
    "ibm-granite/granite-3.0-3b-a800m-instruct": "granite-3.1-3b-a800m-instruct",
}
METHOD_EXPERIMENT = {
    "full": "finetune_full_benchmark-v1.0.0",
    "lora": "finetune_lora_benchmark-v1.0.0",
    "qlora": "finetune_qlora_benchmark-v1.0.0",
    "gptq-lora": "finetune_gptq-lora_benchmark-v1.0.0",
    "pt": "finetune_pt_benchmark-v1.0.0",
}
# Evaluated but not fitted on: the orca-math runs are unpacked, so the padded length that sets their
# activation memory is unknown (the files give only mean tokens per sample), and their multi-GPU fp16
# runs spend 0.7-3 s per step that no FLOP or bandwidth term explains (see docs/planner.md).
EVALUATION_ONLY = ("refs_orca_a100_80gb_pf.csv", "refs_orca_a100_80gb_mp.csv")
FMS_MAX_SEQ_LENGTH = 4096  # fms-acceleration scripts/benchmarks: alpaca packed to 4096 tokens
FMS_DEFAULT_FILES = ("refs_a100_80gb.csv", "refs_a100_80gb_granite.csv", "refs_a100_80gb_liger.csv",
                     "refs_orca_a100_80gb_pf.csv", "refs_orca_a100_80gb_mp.csv", "refs_a100_80gb_moe.csv",
                     "hist_8af8fa7_refs_l40_40gb.csv")  # fmt: skip


@dataclass
class Record:
    """One measured run: the experiment, the values it ran with, what was measured."""

    experiment_id: str
    values: dict[str, Any]
    properties: dict[str, float]
    source: str = ""
    fit: bool = True  # False: evaluated, never fitted on (see EVALUATION_ONLY)

    @property
    def method(self) -> str:
        return get_experiment(self.experiment_id).method

    @property
    def family(self) -> str:
        """The model architecture (the leave-one-model-out group)."""
        return resolve_model(self.values["model_name"]).name

    @property
    def valid(self) -> bool:
        return bool(self.properties.get("is_valid", 1))


def resolve_model(name: str) -> ModelSpec:
    """A catalog model, a config.json, or one of the calibration-only EXTRA_MODELS."""
    if name in EXTRA_MODELS:
        cfg = dict(EXTRA_MODELS[name])
        spec = spec_from_config(cfg, name=name)
        if cfg.get("tokenizer_model_max_length"):
            spec.extra["tokenizer_model_max_length"] = cfg["tokenizer_model_max_length"]
        return spec
    return get_model(FMS_MODELS.get(name, name))


# --- readers ---------------------------------------------------------------------------------------
def _f(row: Mapping[str, str], key: str) -> float | None:
    text = (row.get(key) or "").strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _truthy(text: str | None) -> bool:
    return (text or "").strip().lower() in ("true", "1", "yes")


def read_fms_csv(path: str | Path) -> list[Record]:
    """Records from a CSV in the fms-acceleration benchmark layout (see module docstring)."""
    path = Path(path)
    gpu = "NVIDIA-L40" if "l40" in path.name.lower() else "NVIDIA-A100-SXM4-80GB"
    unpacked = "orca" in path.name or "moe" in path.name
    out = []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            rec = _fms_row(row, gpu, unpacked, path.name)
            if rec is not None:
                out.append(rec)
    return out


def _fms_row(row: Mapping[str, str], gpu: str, unpacked: bool, source: str) -> Record | None:
    model = (row.get("model_name_or_path") or "").strip()
    if "orca" in source and not model:
        model = "mistralai/Mistral-7B-v0.1"  # the orca multipack file omits the column: Mistral-7B runs
    if "tiny-preview" in model or "moe-7b-1b" in model:
        return None  # architectures not in the catalog (granite-4.0-tiny-preview, moe-7b-1b-shared)
    if model not in EXTRA_MODELS and model not in FMS_MODELS:
        return None
    framework = (row.get("framework_config") or "none").strip()
    peft = (row.get("peft_method") or "").strip()
    if not peft:
        method = "full"
    elif "autogptq" in framework:
        method = "gptq-lora"
    elif "bnb" in framework:
        method = "qlora"
    else:
        method = "lora"
    gpus = int(_f(row, "num_gpus") or 1)
    per_device = int(_f(row, "per_device_train_batch_size") or 1)
    ga = int(_f(row, "gradient_accumulation_steps") or 1)
    dtype = (row.get("torch_dtype") or "bfloat16").strip()
    values: dict[str, Any] = {
        "model_name": model,
        "model_max_length": FMS_MAX_SEQ_LENGTH,
        "number_gpus": gpus,
        "batch_size": per_device * gpus,
        "gpu_model": gpu,
        "gradient_accumulation_steps": ga,
        "gradient_checkpointing": True,
        "torch_dtype": dtype,
        "bf16": _truthy(row.get("bf16")),
        "fp16": _truthy(row.get("fp16")) or method == "gptq-lora",
        "distributed_backend": "FSDP" if gpus > 1 else None,
        "fsdp_sharding_strategy": "FULL_SHARD",
        "optim": "adamw_torch",
        "max_steps": 100,
        "dataset_id": "news-tokens-16384plus-entries-4096",
        "fast_kernels": (True, True, True) if "foak" in framework else None,
        "loss_implementation": "fused_linear" if "liger" in framework else None,
        "lora_dropout": 0.05 if method != "full" else None,
        "target_modules": tuple((row.get("target_modules") or "").split()) or None,
        "r": int(_f(row, "r") or 16) if method != "full" else None,
    }
    ep = re.search(r"-ep(\d+)", framework)
    if "scattermoe" in framework and ep:
        values["fast_moe"] = int(ep.group(1))
    props: dict[str, float] = {}
    tps = _f(row, "train_tokens_per_second")
    sps = _f(row, "train_steps_per_second")
    props["is_valid"] = 1.0 if tps else 0.0
    if tps:
        props["train_tokens_per_gpu_per_second"] = tps  # HF's value is per device (estimation.md §12)
    if unpacked:
        if not (tps and sps):
            return None  # unpacked: tokens per sample unknown without a measurement
        values["_tokens_per_sample"] = tps / sps / ga / per_device
    smi = _f(row, "mem_nvidia_mem_reserved")
    if smi and tps and gpus <= 1:
        # the file averages nvidia-smi over devices while torch is rank 0 (estimation.md §12):
        # multi-GPU rows mix ranks, so only single-GPU rows calibrate the nvidia-smi model
        props["gpu_memory_peak_gib"] = smi / 1024
    alloc = _f(row, "mem_peak_torch_mem_alloc_in_bytes")
    if alloc and tps:
        props["gpu_memory_allocated_peak_gib"] = alloc / GIB
    values = {k: v for k, v in values.items() if v is not None}
    return Record(METHOD_EXPERIMENT[method], values, props, source, fit=source not in EVALUATION_ONLY)


def _split_experiment_id(text: str) -> tuple[str, dict[str, str]]:
    """'SFTTrainer.<base>-k.v-k.v' -> (base id, {k: v}); parameter values may contain '.' and '-'."""
    text = text.strip().removeprefix("SFTTrainer.")
    for exp in sorted(list_experiments(), key=lambda e: -len(e.base_id)):
        if text.startswith(exp.base_id):
            rest = text[len(exp.base_id):]
            names = sorted(exp.optional, key=len, reverse=True)
            pattern = re.compile(r"-(" + "|".join(re.escape(n) for n in names) + r")\.")
            params: dict[str, str] = {}
            marks = list(pattern.finditer(rest))
            for i, m in enumerate(marks):
                end = marks[i + 1].start() if i + 1 < len(marks) else len(rest)
                params[m.group(1)] = rest[m.end():end]
            return exp.base_id, params
    raise InputError("experiment_id", f"unknown experiment in {text!r}")


def _measured_properties(values: Mapping[str, Any], raw: Mapping[str, Any]) -> dict[str, float]:
    """The measured properties calibration uses, from spec-named properties (percent -> GiB)."""
    from tunebench.catalog import get_gpu

    props: dict[str, float] = {}
    valid = _num_or_none(raw.get("is_valid"))
    props["is_valid"] = 1.0 if valid is None else valid
    for k in ("train_tokens_per_gpu_per_second", "dataset_tokens_per_second_per_gpu",
              "gpu_memory_allocated_peak_gib", "gpu_memory_peak_gib"):  # fmt: skip
        v = _num_or_none(raw.get(k))
        if v:
            props[k] = v
    util = _num_or_none(raw.get("gpu_memory_utilization_peak"))
    if util and "gpu_memory_peak_gib" not in props and values.get("gpu_model") and (values.get("number_gpus") or 0) > 0:
        props["gpu_memory_peak_gib"] = util / 100 * get_gpu(values["gpu_model"]).memory_gib
    return props


def _num_or_none(v: Any) -> float | None:
    if v is None or (isinstance(v, str) and not v.strip()):
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _spec_values(experiment_id: str, entity: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(base experiment id, effective values) of a possibly parameterised experiment id and entity."""
    from tunebench.experiments import target_modules_for
    from tunebench.properties import PROPERTIES

    base, params = _split_experiment_id(experiment_id)
    exp = get_experiment(base)
    values: dict[str, Any] = dict(exp.hardcoded)
    values.update({k: exp.default(k) for k in exp.optional})
    values.update({k: exp.parse(k, v) for k, v in params.items()})
    for k, v in entity.items():
        if k in PROPERTIES and v not in (None, ""):
            values[k] = exp.parse(k, v)
    if exp.uses_lora and not values.get("target_modules"):
        values["target_modules"] = target_modules_for(exp, values["model_name"])
    return base, values


def read_spec_csv(path: str | Path) -> list[Record]:
    """Records from a CSV in the spec's measured-property layout (ado's export, our store's)."""
    out = []
    with Path(path).open(newline="") as fh:
        for row in csv.DictReader(fh):
            base, values = _spec_values(row.get("experiment_id") or "", row)
            out.append(Record(base, values, _measured_properties(values, row), str(path)))
    return out


def read_csv(path: str | Path) -> list[Record]:
    """Either layout, recognised by its header."""
    with Path(path).open(newline="") as fh:
        header = next(csv.reader(fh), [])
    if "experiment_id" in header:
        return read_spec_csv(path)
    if "framework_config" in header or "model_name_or_path" in header:
        return read_fms_csv(path)
    raise InputError("--from", f"{path}: neither the fms-acceleration nor the measured-property CSV layout")


def fms_records(directory: str | Path | None = None, files: Iterable[str] = FMS_DEFAULT_FILES) -> list[Record]:
    """The shared fms-acceleration calibration data (estimation.md §10.1), deduplicated."""
    directory = Path(directory) if directory else SHARED
    out: list[Record] = []
    seen = set()
    for name in files:
        path = directory / name
        if not path.exists():
            continue
        for rec in read_fms_csv(path):
            key = (rec.experiment_id, tuple(sorted((k, str(v)) for k, v in rec.values.items())))
            if key not in seen:
                seen.add(key)
                out.append(rec)
    return out


def default_records(directory: str | Path | None = None) -> list[Record]:
    """What the shipped calibration is fitted on: the fms-acceleration runs plus the reference
    system's CPU example (shared/reference-data/ado/ado_docs_example_smollm2_cpu_measurements.csv),
    the only CPU measurements available, which set cpu_tflops."""
    records = fms_records(directory)
    cpu = (Path(directory) if directory else SHARED).parent / "ado" / "ado_docs_example_smollm2_cpu_measurements.csv"
    if cpu.exists():
        records += read_spec_csv(cpu)
    return records


def records_from_store(rows: Iterable[tuple[str, Mapping[str, Any], Mapping[str, float]]]) -> list[Record]:
    """Records from (experiment_id, entity values, measured properties) triples, e.g. the results store."""
    out = []
    for experiment_id, entity, props in rows:
        base, values = _spec_values(experiment_id, entity)
        out.append(Record(base, values, _measured_properties(values, props), "store"))
    return out


def store_records(url: str) -> list[Record]:
    """Measured (not predicted) valid and invalid outcomes of the sample store at url (issue 5)."""
    from tunebench.store import DONE, Store

    with Store(url) as store:
        rows = store.rows(statuses=DONE)
    return records_from_store(
        (r["experiment_id"], r["entity"] or {}, r["properties"] or {}) for r in rows if r.get("actuator") == "measure"
    )


# --- evaluation ------------------------------------------------------------------------------------
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
        """Per record: allocated, nvidia-smi GiB, fits, train tokens/s/GPU, dataset tokens/s/GPU."""
        n = len(self.records)
        out = {k: np.full(n, np.nan) for k in ("allocated", "smi", "fits", "tps", "dtps")}
        for w, idx in self.groups:
            if memory:
                m = predict_memory(w, c)
                out["allocated"][idx] = m.allocated_gib
                out["smi"][idx] = m.nvidia_smi_gib
                out["fits"][idx] = m.fits
            if throughput:
                t = predict_throughput(w, c)
                out["tps"][idx] = t.train_tokens_per_gpu_per_second
                out["dtps"][idx] = t.dataset_tokens_per_second / w.devices
        return out


def _measured(records: list[Record], key: str) -> np.ndarray:
    return np.array([r.properties.get(key, np.nan) for r in records], dtype=float)


def _throughput_measured(records: list[Record]) -> tuple[np.ndarray, np.ndarray]:
    """(measured per-GPU tokens/s, 1 if it is a train_tokens figure else 0 for dataset tokens)."""
    train = _measured(records, "train_tokens_per_gpu_per_second")
    data = _measured(records, "dataset_tokens_per_second_per_gpu")
    use_train = ~np.isnan(train)
    return np.where(use_train, train, data), use_train.astype(float)


MEMORY_FIT = ("activation_scale", "loss_bytes_per_vocab", "fused_loss_bytes_per_vocab", "fsdp_peft_checkpoint_copies")
SMI_FIT = ("cuda_context_gib", "reserve_fixed_gib", "reserve_transient_fraction", "reserve_loss_fraction")
SPEED_FIT = (
    "hfu_max", "hidden_half", "elementwise_passes", "qlora_speed", "gptq_speed", "fast_kernels_speed",
    "layer_overhead_s", "expert_overhead_s", "alltoall_latency_s", "comm_exposed_fraction", "cpu_tflops",
)  # fmt: skip
RIDGE = 0.02  # weight of the log-space pull towards the physical prior, per coefficient
BOUNDS = {
    "activation_scale": (0.7, 2.0),
    "loss_bytes_per_vocab": (2.0, 16.0),
    "fused_loss_bytes_per_vocab": (0.0, 12.0),
    "fsdp_peft_checkpoint_copies": (0.0, 3.0),
    "cuda_context_gib": (0.2, 3.0),
    "reserve_fixed_gib": (0.0, 6.0),
    "reserve_transient_fraction": (0.0, 1.5),
    "reserve_loss_fraction": (0.0, 2.0),
    "hfu_max": (0.2, 0.95),
    "hidden_half": (0.0, 4000.0),
    "elementwise_passes": (0.0, 100.0),
    "qlora_speed": (0.4, 1.5),
    "gptq_speed": (0.4, 1.5),
    "fast_kernels_speed": (0.8, 1.6),
    "layer_overhead_s": (0.0, 0.02),
    "expert_overhead_s": (0.0, 0.02),
    "alltoall_latency_s": (0.0, 0.02),
    "comm_exposed_fraction": (0.0, 1.0),
    "cpu_tflops": (0.05, 50.0),
}


def _nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, iters: int = 400, step: float = 0.15) -> np.ndarray:
    """Minimise f from x0 (Nelder & Mead 1965, standard coefficients 1, 2, 0.5, 0.5)."""
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] * (abs(x0[i]) if x0[i] else 1.0) for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        centroid = np.mean(simplex[:-1], axis=0)
        worst = simplex[-1]
        xr = centroid + (centroid - worst)
        fr = f(xr)
        if fr < values[0]:
            xe = centroid + 2 * (centroid - worst)
            fe = f(xe)
            simplex[-1], values[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = xr, fr
        else:
            xc = centroid + 0.5 * (worst - centroid)
            fc = f(xc)
            if fc < values[-1]:
                simplex[-1], values[-1] = xc, fc
            else:
                best = simplex[0]
                simplex = [best + 0.5 * (x - best) for x in simplex]
                values = [f(x) for x in simplex]
        if max(values) - min(values) < 1e-9:
            break
    return simplex[int(np.argmin(values))]


def _fit_group(
    batch: Batch, base: Coefficients, names: tuple[str, ...], loss: Callable[[dict], float], memory: bool
) -> Coefficients:
    prior = base.to_dict()

    def coeffs(x: np.ndarray) -> Coefficients:
        vals = {}
        for name, v in zip(names, x, strict=True):
            lo, hi = BOUNDS[name]
            vals[name] = float(np.clip(v, lo, hi))
        return base.replace(**vals)

    def objective(x: np.ndarray) -> float:
        c = coeffs(x)
        ridge = 0.0
        for name in names:
            p0, v = prior[name], getattr(c, name)
            ridge += (math.log((v + 1e-3) / (p0 + 1e-3))) ** 2
        return loss(batch.predict(c, memory=memory, throughput=not memory)) + RIDGE * ridge

    x0 = np.array([prior[n] for n in names], dtype=float)
    best = _nelder_mead(objective, x0)
    return coeffs(best)


def _log_sq(pred: np.ndarray, meas: np.ndarray) -> float:
    ok = ~np.isnan(meas) & (meas > 0) & (pred > 0)
    if not ok.any():
        return 0.0
    return float(np.mean(np.log(pred[ok] / meas[ok]) ** 2))


def _oom_margin(batch: Batch, c: Coefficients) -> float:
    """The OOM margin (GiB) that classifies the fitted runs best (ties: the smallest)."""
    labels = np.array([r.valid for r in batch.records])
    best, best_acc = c.oom_margin_gib, -1.0
    for margin in np.arange(0.0, 6.01, 0.25):
        acc = float(np.mean(batch.predict(c.replace(oom_margin_gib=margin), throughput=False)["fits"] == labels))
        if acc > best_acc + 1e-12:
            best, best_acc = float(margin), acc
    return best


def fit(records: list[Record], start: Coefficients | None = None) -> Coefficients:
    """Coefficients fitted to records (memory, then nvidia-smi, then OOM margin, then throughput)."""
    c = start or Coefficients()
    records = [r for r in records if r.fit]
    if not records:
        raise InputError("--from", "no measurements to fit on")
    batch = Batch.of(records)
    alloc = _measured(records, "gpu_memory_allocated_peak_gib")
    smi = _measured(records, "gpu_memory_peak_gib")
    speed, is_train = _throughput_measured(records)
    if np.isfinite(alloc).sum() >= 4:
        c = _fit_group(batch, c, MEMORY_FIT, lambda p: _log_sq(p["allocated"], alloc), memory=True)
    if np.isfinite(smi).sum() >= 4:
        c = _fit_group(batch, c, SMI_FIT, lambda p: _log_sq(p["smi"], smi), memory=True)
    if any(not r.valid for r in records):
        c = c.replace(oom_margin_gib=_oom_margin(batch, c))
    if np.isfinite(speed).sum() >= 4:
        c = _fit_group(
            batch, c, SPEED_FIT, lambda p: _log_sq(np.where(is_train > 0, p["tps"], p["dtps"]), speed), memory=False
        )
    return c


def mdape(pred: np.ndarray, meas: np.ndarray) -> float:
    """Median absolute percentage error over the finite pairs."""
    ok = ~np.isnan(meas) & ~np.isnan(pred) & (meas > 0)
    return float(np.median(np.abs(pred[ok] / meas[ok] - 1)) * 100) if ok.any() else float("nan")


def scores(records: list[Record], pred: dict[str, np.ndarray]) -> dict[str, float]:
    """MdAPE of allocated peak, nvidia-smi peak, throughput, and OOM accuracy, with counts."""
    alloc = _measured(records, "gpu_memory_allocated_peak_gib")
    smi = _measured(records, "gpu_memory_peak_gib")
    speed, is_train = _throughput_measured(records)
    labels = np.array([r.valid for r in records])
    tput = np.where(is_train > 0, pred["tps"], pred["dtps"])
    return {
        "allocated_mdape_pct": mdape(pred["allocated"], alloc),
        "allocated_n": int(np.isfinite(alloc).sum()),
        "nvidia_smi_mdape_pct": mdape(pred["smi"], smi),
        "nvidia_smi_n": int(np.isfinite(smi).sum()),
        "oom_accuracy_pct": float(np.mean((pred["fits"] > 0) == labels) * 100),
        "oom_n": len(records),
        "throughput_mdape_pct": mdape(tput, speed),
        "throughput_n": int(np.isfinite(speed).sum()),
    }


def leave_one_model_out(
    records: list[Record], start: Coefficients | None = None
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Refit without each model family and predict it; pooled scores, per-family scores, predictions."""
    families = sorted({r.family for r in records})
    n = len(records)
    pooled = {k: np.full(n, np.nan) for k in ("allocated", "smi", "fits", "tps", "dtps")}
    per_family = {}
    for fam in families:
        train = [r for r in records if r.family != fam]
        test_idx = [i for i, r in enumerate(records) if r.family == fam]
        c = fit(train, start)
        test = [records[i] for i in test_idx]
        pred = Batch.of(test).predict(c)
        for k in pooled:
            pooled[k][test_idx] = pred[k]
        per_family[fam] = scores(test, pred)
    return {"pooled": scores(records, pooled), "per_model": per_family}, pooled


def calibrate(records: list[Record], source: str, lomo: bool = True) -> Calibration:
    """A Calibration fitted on all records, with in-sample and leave-one-model-out metrics."""
    if not records:
        raise InputError("--from", "no usable measurements to calibrate on")
    c = fit(records)
    metrics: dict[str, Any] = {"in_sample": scores(records, Batch.of(records).predict(c))}
    if lomo and len({r.family for r in records}) > 1:
        metrics["leave_one_model_out"], _ = leave_one_model_out(records)
    return Calibration(
        coefficients=c,
        source=source,
        records=len(records),
        models=tuple(sorted({r.family for r in records})),
        metrics=metrics,
    )
