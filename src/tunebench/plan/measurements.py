"""Measured runs as the planner's calibration records, from the data sets it ships and from users.

A ``Record`` is ``(experiment_id, entity values, measured properties)``, what the results store
holds. Readers:

- the fms-acceleration benchmark layout (``data/measurements/fms-acceleration/*.csv``:
  framework_config, model_name_or_path, num_gpus, per_device_train_batch_size, peft_method, ...,
  mem_nvidia_mem_reserved (MiB), mem_peak_torch_mem_alloc_in_bytes, train_tokens_per_second per
  device; empty throughput = failed run, an out-of-memory when memory sits at capacity);
- the published runs of other stacks, written as tunebench requests (``published/cases.jsonl``);
- the spec's measured-property layout (ado's CSV export: experiment_id, the entity's properties,
  gpu_memory_utilization_peak, train_tokens_per_gpu_per_second, ...), and the results store.

``data/measurements/README.md`` names every source.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunebench.catalog import ModelSpec, get_model
from tunebench.catalog.models import spec_from_config
from tunebench.errors import InputError
from tunebench.spec.experiments import get_experiment, list_experiments
from tunebench.units import GIB

DATA = Path(__file__).parent / "data" / "measurements"
FMS = DATA / "fms-acceleration"
PUBLISHED = DATA / "published"
CPU_EXAMPLE = DATA / "ado" / "ado_docs_example_smollm2_cpu_measurements.csv"

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
    "TheBloke/Nous-Hermes-Llama2-70B-GPTQ": "llama2-70b",
    "meta-llama/Meta-Llama-3-8B": "llama3-8b",
    "TechxGenus/Meta-Llama-3-8B-GPTQ": "llama3-8b",
    # granite-3.0-3b-a800m has the dimensions of the catalog's granite-3.1-3b-a800m-instruct
    "ibm-granite/granite-3.0-3b-a800m-instruct": "granite-3.1-3b-a800m-instruct",
    # the preview of granite-4.0-h-tiny: the same GraniteMoeHybrid architecture (7 B total, 1 B active)
    "ibm-granite/granite-4.0-tiny-preview": "granite-4.0-h-tiny",
}
# Runs of models whose architecture no reachable source gives (ibm-research/moe-7b-1b-active-shared-
# experts: a GraniteMoeShared test model without a published config.json here): not planned.
UNKNOWN_ARCHITECTURES = ("ibm-research/moe-7b-1b-active-shared-experts",)
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
# Published cases whose request does not describe the run that was measured, so they are evaluated and
# never fitted on: PEFT trains samples of ~210 tokens in length-bucketed batches and reports the 99th
# percentile of memory, while its cases give the 768-token truncation (padded lengths unknown, like the
# unpacked orca runs); torchtitan ran 8-node jobs over InfiniBand without accumulation, while its cases
# leave enable_roce (off: NCCL over TCP sockets) and gradient_accumulation_steps (4) at their defaults.
EVALUATED_ONLY_STACKS = ("peft", "torchtitan")
FMS_MAX_SEQ_LENGTH = 4096  # fms-acceleration scripts/benchmarks: alpaca packed to 4096 tokens
FMS_FILES = ("refs_a100_80gb.csv", "refs_a100_80gb_granite.csv", "refs_a100_80gb_liger.csv",
             "refs_orca_a100_80gb_pf.csv", "refs_orca_a100_80gb_mp.csv", "refs_a100_80gb_moe.csv",
             "hist_8af8fa7_refs_l40_40gb.csv")  # fmt: skip
# Memory kinds of the published cases -> the planner's property of the same definition.
MEMORY_KINDS = {
    "alloc": "gpu_memory_allocated_peak_gib",
    "reserved": "gpu_memory_reserved_peak_gib",
    "nvidia-smi": "gpu_memory_peak_gib",
    None: "gpu_memory_reserved_peak_gib",  # unspecified: the closest of the torch figures
}


@dataclass
class Record:
    """One measured run: the experiment, the values it ran with, what was measured, where it came from."""

    experiment_id: str
    values: dict[str, Any]
    properties: dict[str, float]
    source: str = ""  # "fms-acceleration/<file>", "litgpt", "peft", "torchtitan", a CSV path, "store"
    fit: bool = True  # False: evaluated, never fitted on (see EVALUATION_ONLY)
    near_limit: bool | None = None  # within 25 % of the GPU's memory (None: derive from the measurement)

    @property
    def method(self) -> str:
        return get_experiment(self.experiment_id).method

    @property
    def family(self) -> str:
        """The model architecture (the leave-one-model-out group)."""
        return resolve_model(self.values["model_name"]).name

    @property
    def origin(self) -> str:
        """The stack that measured it (the leave-one-source-out group)."""
        return self.source.split("/", 1)[0]

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


# --- fms-acceleration ---------------------------------------------------------------------------------
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
    """Records from a CSV in the fms-acceleration benchmark layout (see module docstring).

    Unpacked runs (orca-math, MoE) carry their measured tokens per sample; a failed unpacked run takes
    that of the successful runs of the same model in the same file (same data, same tokenizer).
    """
    path = Path(path)
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    return [rec for rec in fms_row_records(rows, path.name) if rec is not None]


def fms_row_records(rows: list[Mapping[str, str]], file_name: str) -> list[Record | None]:
    """One Record per row of an fms-acceleration CSV named file_name (its name says the GPU: l40 -> NVIDIA-L40,
    else the A100-SXM4-80GB of the refs; orca / moe -> unpacked runs), None for a row the planner cannot use:
    a model whose architecture it lacks (UNKNOWN_ARCHITECTURES, or not in FMS_MODELS / EXTRA_MODELS), an
    unpacked run whose tokens per sample nothing in the file tells."""
    gpu = "NVIDIA-L40" if "l40" in file_name.lower() else "NVIDIA-A100-SXM4-80GB"
    unpacked = "orca" in file_name or "moe" in file_name
    tokens: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        tps, sps = _f(row, "train_tokens_per_second"), _f(row, "train_steps_per_second")
        if unpacked and tps and sps:
            per_sample = (
                tps
                / sps
                / (_f(row, "gradient_accumulation_steps") or 1)
                / (_f(row, "per_device_train_batch_size") or 1)
            )
            tokens[fms_model(row, file_name)].append(per_sample)
    out = []
    for row in rows:
        known = tokens.get(fms_model(row, file_name))
        out.append(_fms_row(row, gpu, sum(known) / len(known) if (unpacked and known) else None, file_name))
    return out


def fms_model(row: Mapping[str, str], source: str) -> str:
    model = (row.get("model_name_or_path") or "").strip()
    return model or ("mistralai/Mistral-7B-v0.1" if "orca" in source else "")  # orca multipack omits it


def _fms_method(row: Mapping[str, str]) -> tuple[str, str]:
    framework = (row.get("framework_config") or "none").strip()
    if not (row.get("peft_method") or "").strip():
        return "full", framework
    if "autogptq" in framework:
        return "gptq-lora", framework
    return ("qlora" if "bnb" in framework else "lora"), framework


def _fms_row(row: Mapping[str, str], gpu: str, tokens_per_sample: float | None, source: str) -> Record | None:
    model = fms_model(row, source)
    if model in UNKNOWN_ARCHITECTURES or (model not in EXTRA_MODELS and model not in FMS_MODELS):
        return None
    method, framework = _fms_method(row)
    gpus = int(_f(row, "num_gpus") or 1)
    per_device = int(_f(row, "per_device_train_batch_size") or 1)
    values: dict[str, Any] = {
        "model_name": model,
        "model_max_length": FMS_MAX_SEQ_LENGTH,
        "number_gpus": gpus,
        "batch_size": per_device * gpus,
        "gpu_model": gpu,
        "gradient_accumulation_steps": int(_f(row, "gradient_accumulation_steps") or 1),
        "gradient_checkpointing": True,
        "torch_dtype": (row.get("torch_dtype") or "bfloat16").strip(),
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
        "_tokens_per_sample": tokens_per_sample,
        # fms-acceleration's bnb plugin loads QLoRA without peft's fp32 upcast; baseline-peft-bnb upcasts
        "_kbit_upcast": ("baseline" in framework) if method == "qlora" else None,
    }
    ep = re.search(r"-ep(\d+)", framework)
    if "scattermoe" in framework and ep:
        values["fast_moe"] = int(ep.group(1))
    if ("orca" in source or "moe" in source) and tokens_per_sample is None:
        return None  # an unpacked run whose tokens per sample nothing tells
    return Record(METHOD_EXPERIMENT[method], _defined(values), _fms_properties(row, gpus), f"fms-acceleration/{source}",
                  fit=source not in EVALUATION_ONLY)  # fmt: skip


def _fms_properties(row: Mapping[str, str], gpus: int) -> dict[str, float]:
    tps = _f(row, "train_tokens_per_second")
    props: dict[str, float] = {"is_valid": 1.0 if tps else 0.0}
    if tps:
        props["train_tokens_per_gpu_per_second"] = tps  # HF's value is per device (estimation.md §12)
    smi = _f(row, "mem_nvidia_mem_reserved")
    if smi and tps and gpus <= 1:
        # the file averages nvidia-smi over devices while torch is rank 0 (estimation.md §12):
        # multi-GPU rows mix ranks, so only single-GPU rows calibrate the nvidia-smi model
        props["gpu_memory_peak_gib"] = smi / 1024
    alloc = _f(row, "mem_peak_torch_mem_alloc_in_bytes")
    if alloc and tps:
        props["gpu_memory_allocated_peak_gib"] = alloc / GIB
    return props


def _defined(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def fms_records(directory: str | Path | None = None, files: Iterable[str] = FMS_FILES) -> list[Record]:
    """The fms-acceleration runs (estimation.md §10.1), deduplicated."""
    directory = Path(directory) if directory else FMS
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


# --- published runs of other stacks -------------------------------------------------------------------
def read_cases(path: str | Path | None = None) -> list[Record]:
    """Records from the published cases (``{"row_id", "source", "request", "measured"}`` per line)."""
    path = Path(path) if path else PUBLISHED / "cases.jsonl"
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        case = json.loads(line)
        request, measured = case["request"], case["measured"]
        values = _spec_values(request["experiment"], {})[1]
        entity = dict(request["entity"])
        model = entity["model_name"]
        if not Path(model).is_absolute() and (path.parent / model).exists():
            entity["model_name"] = str((path.parent / model).resolve())
        exp = get_experiment(request["experiment"])
        # "_"-keys are stack facts no property describes (e.g. _kbit_upcast); they pass as they are
        values.update({k: v if k.startswith("_") else exp.parse(k, v) for k, v in entity.items()})
        if exp.uses_lora and not values.get("target_modules"):
            from tunebench.spec.experiments import target_modules_for

            values["target_modules"] = target_modules_for(exp, values["model_name"])
        props: dict[str, float] = {}
        if measured.get("oom") is not None:
            props["is_valid"] = 0.0 if measured["oom"] else 1.0
        if measured.get("mem_gib"):
            props[MEMORY_KINDS.get(measured.get("mem_kind"), MEMORY_KINDS[None])] = float(measured["mem_gib"])
        if measured.get("tok_s_gpu"):
            props["train_tokens_per_gpu_per_second"] = float(measured["tok_s_gpu"])
        origin = case["source"].split("/")[-1].lower()
        out.append(Record(request["experiment"], values, props, f"{origin}/{case['row_id']}",
                          fit=origin not in EVALUATED_ONLY_STACKS, near_limit=bool(measured.get("near_limit"))))  # fmt: skip
    return out


# --- the spec's measured-property layout (ado export, the store) --------------------------------------
def _split_experiment_id(text: str) -> tuple[str, dict[str, str]]:
    """'SFTTrainer.<base>-k.v-k.v' -> (base id, {k: v}); parameter values may contain '.' and '-'."""
    text = text.strip().removeprefix("SFTTrainer.")
    for exp in sorted(list_experiments(), key=lambda e: -len(e.base_id)):
        if text.startswith(exp.base_id):
            rest = text[len(exp.base_id) :]
            names = sorted(exp.optional, key=len, reverse=True)
            pattern = re.compile(r"-(" + "|".join(re.escape(n) for n in names) + r")\.")
            params: dict[str, str] = {}
            marks = list(pattern.finditer(rest))
            for i, m in enumerate(marks):
                end = marks[i + 1].start() if i + 1 < len(marks) else len(rest)
                params[m.group(1)] = rest[m.end() : end]
            return exp.base_id, params
    raise InputError("experiment_id", f"unknown experiment in {text!r}")


def _measured_properties(values: Mapping[str, Any], raw: Mapping[str, Any]) -> dict[str, float]:
    """The measured properties calibration uses, from spec-named properties (percent -> GiB)."""
    from tunebench.catalog import get_gpu

    props: dict[str, float] = {}
    valid = _num_or_none(raw.get("is_valid"))
    props["is_valid"] = 1.0 if valid is None else valid
    for k in ("train_tokens_per_gpu_per_second", "dataset_tokens_per_second_per_gpu",
              "gpu_memory_allocated_peak_gib", "gpu_memory_reserved_peak_gib", "gpu_memory_peak_gib"):  # fmt: skip
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
    from tunebench.spec.experiments import target_modules_for
    from tunebench.spec.properties import PROPERTIES

    base, params = _split_experiment_id(experiment_id)
    exp = get_experiment(base)
    values: dict[str, Any] = dict(exp.hardcoded)
    values.update({k: exp.default(k) for k in exp.optional})
    values.update({k: exp.parse(k, v) for k, v in params.items()})
    for k, v in entity.items():
        if k in PROPERTIES and v not in (None, ""):
            values[k] = exp.parse(k, v)
    if exp.uses_lora and not values.get("target_modules") and values.get("model_name"):
        values["target_modules"] = target_modules_for(exp, values["model_name"])
    return base, values


def read_spec_csv(path: str | Path, source: str | None = None) -> list[Record]:
    """Records from a CSV in the spec's measured-property layout (ado's export, our store's)."""
    out = []
    with Path(path).open(newline="") as fh:
        for row in csv.DictReader(fh):
            base, values = _spec_values(row.get("experiment_id") or "", row)
            out.append(Record(base, values, _measured_properties(values, row), source or str(path)))
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


def records_from_store(rows: Iterable[tuple[str, Mapping[str, Any], Mapping[str, float]]]) -> list[Record]:
    """Records from (experiment_id, entity values, measured properties) triples, e.g. the results store."""
    out = []
    for experiment_id, entity, props in rows:
        base, values = _spec_values(experiment_id, entity)
        out.append(Record(base, values, _measured_properties(values, props), "store"))
    return out


def store_records(url: str) -> list[Record]:
    """Measured (not predicted) valid and invalid outcomes of the sample store at url."""
    from tunebench.store import DONE, Store

    with Store(url, readonly=True) as store:
        rows = store.rows(statuses=DONE)
    return records_from_store(
        (r["experiment_id"], r["entity"] or {}, r["properties"] or {}) for r in rows if r.get("actuator") == "measure"
    )


def default_records() -> list[Record]:
    """What the shipped calibration is fitted on: the fms-acceleration runs, the published runs of
    other stacks, and the reference system's 4 CPU measurements (the only CPU data, for cpu_tflops)."""
    return fms_records() + read_cases() + read_spec_csv(CPU_EXAMPLE, source="ado/cpu-example")
