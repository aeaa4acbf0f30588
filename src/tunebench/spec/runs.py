"""Runs of fms-acceleration's benchmarks read as runs of the spec's experiments (a ``Record`` each).

The layout (``framework_config, model_name_or_path, num_gpus, per_device_train_batch_size, peft_method, ...,
mem_nvidia_mem_reserved`` (MiB), ``mem_peak_torch_mem_alloc_in_bytes``, ``train_tokens_per_second`` per
device; an empty throughput is a failed run) is read both by the planner's calibration
(``tunebench.plan.measurements``) and by ``tunebench import`` (``tunebench.store.fms_csv``), so it lives
below both. Sources: fms-acceleration's ``scripts/benchmarks`` and its published ``refs*.csv``.
"""

from __future__ import annotations

import csv
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunebench.catalog import ModelSpec, get_model
from tunebench.catalog.models import spec_from_config
from tunebench.spec.experiments import get_experiment
from tunebench.units import GIB

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

FUSED_LORA_BASE = {"qlora": "bitsandbytes", "gptq-lora": "auto_gptq"}  # foak's fused_lora base layers
FMS_MAX_SEQ_LENGTH = 4096  # fms-acceleration scripts/benchmarks: alpaca packed to 4096 tokens


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
    that of the successful runs of the same model, padding and per-device batch in the same file (same data,
    same tokenizer, same count: _tokens_key).
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
    tokens: dict[tuple[str, bool], list[float]] = defaultdict(list)
    for row in rows:
        tps, sps = _f(row, "train_tokens_per_second"), _f(row, "train_steps_per_second")
        if unpacked and tps and sps:
            per_sample = (
                tps
                / sps
                / (_f(row, "gradient_accumulation_steps") or 1)
                / (_f(row, "per_device_train_batch_size") or 1)
            )
            tokens[_tokens_key(row, file_name)].append(per_sample)
    out = []
    for row in rows:
        known = tokens.get(_tokens_key(row, file_name))
        out.append(_fms_row(row, gpu, sum(known) / len(known) if (unpacked and known) else None, file_name))
    return out


def _tokens_key(row: Mapping[str, str], file_name: str) -> tuple[str, bool, float | None]:
    """Runs whose tokens per sample are alike: one model, padded or not, one per-device batch. HF's tokens/s
    counts input_ids.numel() (transformers Trainer.num_tokens): a padded batch counts its padding, up to its
    longest sample, so the more samples a batch the more (orca-math: 737, 884 and 1,048 tokens a sample at 2, 4
    and 8), and fms-acceleration's padding-free plugin (framework_config ...-padding-free: one row of the samples'
    real tokens) counts none (orca-math: about 578 at every batch; the MoE file's padded runs about 278 a sample,
    its padding-free runs about 194)."""
    free = "padding-free" in (row.get("framework_config") or "")
    return fms_model(row, file_name), free, _f(row, "per_device_train_batch_size")


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
        # fms-acceleration's benchmarks set gradient_checkpointing without kwargs (scripts/benchmarks/defaults.yaml),
        # so transformers 4.35-4.x's gradient_checkpointing_enable made it reentrant (use_reentrant=True)
        "gradient_checkpointing_use_reentrant": True,
        "torch_dtype": (row.get("torch_dtype") or "bfloat16").strip(),
        "bf16": _truthy(row.get("bf16")),
        "fp16": _truthy(row.get("fp16")) or method == "gptq-lora",
        "distributed_backend": "FSDP" if gpus > 1 else None,
        "fsdp_sharding_strategy": "FULL_SHARD",
        "optim": "adamw_torch",
        "max_steps": 100,
        "dataset_id": "news-tokens-16384plus-entries-4096",
        "fast_kernels": (True, True, True) if "foak" in framework else None,
        # foak on a 4-bit base runs its fused LoRA ops too, all or nothing (fms-acceleration sample-configurations/
        # accelerated-peft-{bnb-nf4,autogptq}-foak-sample-configuration.yaml: base_layer, fused_lora: true)
        "fused_lora": (FUSED_LORA_BASE[method], True) if "foak" in framework and method in FUSED_LORA_BASE else None,
        "loss_implementation": "fused_linear" if "liger" in framework else None,
        "lora_dropout": 0.05 if method != "full" else None,
        "target_modules": tuple((row.get("target_modules") or "").split()) or None,
        "r": int(_f(row, "r") or 16) if method != "full" else None,
        "_tokens_per_sample": tokens_per_sample,
        # fms-acceleration's aadp plugin (framework_config ...-padding-free); the measured tokens per sample above
        # are then the samples' own (nothing padded)
        "padding_free": True if "padding-free" in framework else None,
        # fms-acceleration's bnb plugin loads QLoRA without peft's fp32 upcast; baseline-peft-bnb upcasts
        "_kbit_upcast": ("baseline" in framework) if method == "qlora" else None,
    }
    ep = re.search(r"-ep(\d+)", framework)
    if "scattermoe" in framework and ep:
        values["fast_moe"] = int(ep.group(1))
    if ("orca" in source or "moe" in source) and tokens_per_sample is None:
        return None  # an unpacked run whose tokens per sample nothing tells
    return Record(
        METHOD_EXPERIMENT[method],
        _defined(values),
        _fms_properties(row, gpus),
        f"fms-acceleration/{source}",
        fit=source not in EVALUATION_ONLY,
    )


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
