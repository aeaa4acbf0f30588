"""What each measuring engine really runs: the one ordered list of rules that judges an entity before anything runs.

A measurement is of the entity it names. Every setting of an entity (the SFTTrainer spec's and tunebench's
stack settings, docs/experiments.md "Stack settings") either runs as asked, or the entity is judged here:
``unsupported(values, engine)`` returns the reasons (each naming the setting and what to do instead), and
the measuring actuator records is_valid = 0 with them without starting a process (the planner, the
predict actuator, plans every setting). The rules are checked in the order of ``RULES``; each applies to
the engines it names.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tunebench.catalog import get_model
from tunebench.engines import FMS, NATIVE
from tunebench.engines.versions import PLUGINS, engine_reasons, plugins_used
from tunebench.spec.properties import (
    FLASH_ATTENTION_PACKAGES,
    PADDING_FREE_MODEL_TYPES,
    attention_asked,
    class_attentions,
    fast_loss_on,
    loss_path,
)
from tunebench.spec.validity import cannot_run_reasons

NATIVE_HINT = "measure with --engine native"
FMS_HINT = "measure with --engine fms-hf-tuning"


@dataclass(frozen=True)
class Rule:
    """One rule: the setting it is about, the engines it applies to, and its check (values, engine) -> reasons.
    here: the rule asks this machine (an installed package), so it holds only where the run starts."""

    setting: str
    engines: tuple[str, ...]
    check: Callable[[dict[str, Any], str], list[str]]
    here: bool = False


def loss(values: dict[str, Any]) -> str:
    """The loss implementation asked for (spec.properties.loss_path)."""
    return loss_path(values.get("loss_implementation"), values.get("fast_kernels"))


def _gpus(values: dict[str, Any]) -> int:
    return int(values.get("number_gpus") or 0)


# ----------------------------------------------------------------------------------------------- rules


def _fms_version_and_plugins(values: dict[str, Any], engine: str) -> list[str]:
    return engine_reasons(values)  # tunebench.engines.versions: published releases and their plugins


def _cannot_run(values: dict[str, Any], engine: str) -> list[str]:
    # several nodes without GPUs (no process on any) or with one process for all; images for a text model
    return cannot_run_reasons(values)


def _fms_acceleration_native(values: dict[str, Any], engine: str) -> list[str]:
    # The native worker trains with transformers and peft only: fms-acceleration's kernels (fast_kernels, fused_lora,
    # auto_gptq's triton_v2, fast_moe's ScatterMoE) would be on the command line but not run, so a measurement of
    # the entity would describe another one. fms-hf-tuning runs them (tunebench.engines.versions.PLUGINS).
    # padding_free the native worker runs itself (transformers' DataCollatorWithFlattening, training.data)
    used = [flag for flag in plugins_used(values) if flag != "padding_free"]
    if not used:
        return []
    settings = ", ".join(f"{flag} {_shown(values[flag])}" for flag in used)
    packages = ", ".join(dict.fromkeys(PLUGINS[flag].package for flag in used))
    return [f"{settings}: fms-acceleration kernels ({packages}) that only the fms-hf-tuning engine runs: {FMS_HINT}"]


def _shown(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def _deepspeed(values: dict[str, Any], engine: str) -> list[str]:
    # a ZeRO stage without DeepSpeed breaks a validity rule (spec.validity.stack_reasons), judged before this
    if values.get("distributed_backend") == "DeepSpeed":
        return [
            "distributed_backend DeepSpeed is planning only: tunebench measures FSDP and DDP runs "
            "(use the predict actuator, or distributed_backend FSDP)"
        ]
    return []


def _device_map(values: dict[str, Any], engine: str) -> list[str]:
    if values.get("device_map"):
        return [
            f"device_map {values['device_map']} (one process splitting the layers over its GPUs) is planning "
            "only: measure with device_map None (one replica per GPU)"
        ]
    return []


def _fsdp_offload(values: dict[str, Any], engine: str) -> list[str]:
    # accelerate's FSDP plugin refuses a machine without an accelerator ("There are currently no available
    # devices found"), so tunebench's multi-process CPU runs (DDP over gloo) cannot check an offloading FSDP
    # run; it stays planning only until a GPU session verifies it (fsdp_offload_params: true in the plan's
    # accelerate config is all it takes).
    if values.get("fsdp_offload_params"):
        return [
            "fsdp_offload_params is planning only: accelerate's FSDP needs a GPU and tunebench has not "
            "verified an offloading run; measure with fsdp_offload_params False"
        ]
    return []


def _model_parallel(values: dict[str, Any], engine: str) -> list[str]:
    tp, sp = values.get("tensor_parallel_degree") or 1, values.get("sequence_parallel_degree") or 1
    if tp > 1 or sp > 1:
        return [
            f"tensor_parallel_degree {tp} / sequence_parallel_degree {sp} are planning only: tunebench measures "
            "data-parallel runs (FSDP, DDP); set both to 1"
        ]
    return []


def _liger_kernels(values: dict[str, Any], engine: str) -> list[str]:
    if not values.get("liger_kernels"):
        return []
    if engine == NATIVE:
        return [
            "liger_kernels is planning only: the native worker applies Liger's fused linear cross-entropy "
            "alone (loss_implementation fused_linear); set liger_kernels false"
        ]
    return ["liger_kernels is planning only: fms-hf-tuning runs no Liger kernels; set liger_kernels false"]


def _checkpointing_mode(values: dict[str, Any], engine: str) -> list[str]:
    # the granularity of gradient_checkpointing: without it nothing is checkpointed, as the planner plans it
    # (plan.workload selective_checkpointing), and the run is the one the entity names
    if values.get("gradient_checkpointing_mode") == "selective" and values.get("gradient_checkpointing", True):
        return [
            "gradient_checkpointing_mode selective (op-level) is planning only: transformers' Trainer "
            "checkpoints whole blocks; use gradient_checkpointing_mode full"
        ]
    return []


def _attention_fms(values: dict[str, Any], engine: str) -> list[str]:
    attn = values.get("attn_implementation")
    if attn in ("eager", "sdpa", "flash_attention_3"):
        return [
            f"attn_implementation {attn}: fms-hf-tuning chooses only between flash_attention_2 and "
            f"transformers' default (its use_flash_attn flag): {NATIVE_HINT}"
        ]
    return []


def _padding_free_native(values: dict[str, Any], engine: str) -> list[str]:
    # transformers (the native worker's, 5.x) keeps a flattened row's samples apart only where the model's code
    # builds its masks from the packed position ids: the types checked so (spec.properties.PADDING_FREE_MODEL_TYPES).
    # fms-hf-tuning runs its own pinned transformers with flash-attention and its aadp plugin: not judged here.
    if not values.get("padding_free"):
        return []
    model_type = _model_type(str(values["model_name"]))
    if model_type in PADDING_FREE_MODEL_TYPES:
        return []
    return [
        f"padding_free: {model_type} is not among the model types checked to keep the samples of a flattened row "
        f"apart in transformers (bloom, falcon and granitemoehybrid mix them); measure with padding_free false "
        f"(checked: {', '.join(PADDING_FREE_MODEL_TYPES)})"
    ]


@functools.lru_cache(maxsize=256)
def _model_type(model_name: str) -> str:
    return get_model(model_name).model_type  # a config path is read once, not once per entity of a sweep


def _padding_free_fms(values: dict[str, Any], engine: str) -> list[str]:
    # fms-hf-tuning's sft_trainer: "`--padding_free` argument was called without enabling flash attention";
    # without GPUs the plugin rule (engine_reasons) has judged it, an eager or sdpa kernel _attention_fms
    if values.get("padding_free") and _gpus(values) > 0 and values.get("attn_implementation") is None:
        if attention_asked(values) != "flash_attention_2":
            return [
                f"padding_free with flash_attn 0: fms-hf-tuning flattens batches with flash-attention only: {NATIVE_HINT}"
            ]
    return []


def _attention_model_native(values: dict[str, Any], engine: str) -> list[str]:
    # transformers refuses an attn_implementation the model's class does not support (from_config and from_pretrained
    # raise ValueError: bloom has neither sdpa nor flash-attention in 5.x), so the run would fail after loading its
    # data; flash_attn's default asks for flash-attention 2 on every GPU entity
    asked = attention_asked(values)
    model_type = _model_type(str(values["model_name"])) if asked else None
    known = _attention_support(model_type) if model_type else None
    if known is None or asked in known[1]:
        return []
    explicit = values.get("attn_implementation") is not None
    via = (
        f"attn_implementation {asked}"
        if explicit
        else f"flash_attn {'1' if values.get('flash_attn') else '(on with GPUs)'}"
    )
    instead = "attn_implementation sdpa" if "sdpa" in known[1] else "attn_implementation eager"
    instead = instead if explicit else f"flash_attn 0 or {instead}"
    return [
        f"{via}: {model_type}'s transformers class {known[0]} has no {asked} attention (it would not load): set {instead}"
    ]


@functools.lru_cache(maxsize=64)
def _attention_support(model_type: str) -> tuple[str, tuple[str, ...]] | None:
    """The transformers class the native worker builds for this model type (its causal-LM class, or the image-text
    one of a vision model) and the attn_implementations it supports; None where transformers maps no class."""
    import transformers
    from transformers.models.auto import modeling_auto as auto

    mappings = (auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)
    name = next((m[model_type] for m in mappings if model_type in m), None)
    cls = getattr(transformers, name, None) if isinstance(name, str) else None
    if cls is None:
        return None
    attns = class_attentions(cls)
    return name, attns + (("flash_attention_3",) if "flash_attention_2" in attns else ())  # one flag for both


def _attention_package(values: dict[str, Any], engine: str) -> list[str]:
    attn = attention_asked(values)
    if attn in FLASH_ATTENTION_PACKAGES and _gpus(values) > 0:
        module, package = FLASH_ATTENTION_PACKAGES[attn]
        if importlib.util.find_spec(module) is None:
            return [
                f"attn_implementation {attn} needs the {package} package, which is not installed here: install "
                "it, or use attn_implementation sdpa"
            ]
    return []


def _loss_package(values: dict[str, Any], engine: str) -> list[str]:
    if loss(values) == "fused_linear" and _gpus(values) > 0:
        from tunebench.training.loss import liger_available

        if not liger_available():
            return [
                "loss_implementation fused_linear needs liger-kernel and a GPU (liger-kernel is not installed "
                "here): install liger-kernel, or use loss_implementation chunked"
            ]
    return []


def _loss_fms(values: dict[str, Any], engine: str) -> list[str]:
    asked, fast = values.get("loss_implementation"), fast_loss_on(values.get("fast_kernels"))
    if asked == "fused_linear":
        return [
            f"loss_implementation fused_linear: fms-hf-tuning has no fused linear cross-entropy: {NATIVE_HINT} "
            "(needs liger-kernel and a GPU)"
        ]
    if asked == "chunked":
        # tunebench's chunked loss (training.loss), which the planner traces; fms-hf-tuning's 16-bit loss is foak's
        # fast cross-entropy, which the planner budgets apart (plan.workload loss_implementation "fast_loss"): one
        # run must not carry the other's label
        return [
            "loss_implementation chunked is tunebench's chunked loss, which fms-hf-tuning does not run (its 16-bit "
            "loss is fast_kernels' fast_loss, fms-acceleration-foak, GPU, with loss_implementation None): "
            f"{NATIVE_HINT}"
        ]
    if asked == "model_dtype":
        return [
            "loss_implementation model_dtype: fms-hf-tuning computes the loss with transformers' fp32 upcast "
            f"(or fast_kernels' fast_loss): {NATIVE_HINT}"
        ]
    if asked == "upcast" and fast:
        return [
            "loss_implementation upcast: fms-hf-tuning with fast_kernels' fast_loss runs fms-acceleration-foak's "
            "cross-entropy: turn fast_loss off, or leave loss_implementation None"
        ]
    return []


def _adapter_dtype_fms(values: dict[str, Any], engine: str) -> list[str]:
    dtype = values.get("adapter_dtype")
    if dtype not in (None, "float32"):
        return [
            f"adapter_dtype {dtype}: fms-hf-tuning keeps adapter weights in float32 (peft's "
            f"autocast_adapter_dtype): {NATIVE_HINT}"
        ]
    return []


BOTH = (NATIVE, FMS)
RULES: tuple[Rule, ...] = (
    Rule(
        "fms_hf_tuning_version, fast_moe, fast_kernels, fused_lora, auto_gptq, padding_free",
        (FMS,),
        _fms_version_and_plugins,
    ),
    Rule("fast_moe, fast_kernels, fused_lora, auto_gptq", (NATIVE,), _fms_acceleration_native),
    Rule(
        "number_nodes, number_gpus, distributed_backend, dataset_id, model_name, fast_moe, fast_kernels, fused_lora, "
        "auto_gptq, liger_kernels, loss_implementation",
        BOTH,
        _cannot_run,
    ),
    Rule("distributed_backend, deepspeed_zero_stage", BOTH, _deepspeed),
    Rule("device_map", BOTH, _device_map),
    Rule("fsdp_offload_params", BOTH, _fsdp_offload),
    Rule("tensor_parallel_degree, sequence_parallel_degree", BOTH, _model_parallel),
    Rule("gradient_checkpointing_mode", BOTH, _checkpointing_mode),
    Rule("attn_implementation", (FMS,), _attention_fms),
    Rule("padding_free, flash_attn", (FMS,), _padding_free_fms),
    Rule("padding_free, model_name", (NATIVE,), _padding_free_native),
    Rule("attn_implementation, flash_attn, model_name", (NATIVE,), _attention_model_native),
    # flash-attention on a CPU run breaks a validity rule (spec.validity.stack_reasons), judged before these
    Rule("attn_implementation, flash_attn", (NATIVE,), _attention_package, here=True),
    Rule("loss_implementation", (NATIVE,), _loss_package, here=True),
    Rule("loss_implementation", (FMS,), _loss_fms),
    Rule("adapter_dtype", (FMS,), _adapter_dtype_fms),
    Rule("liger_kernels", BOTH, _liger_kernels),
    # torch_compile runs on both (TrainingArguments torch_compile, which fms-hf-tuning's parser takes too).
)


def unsupported(values: dict[str, Any], engine: str = NATIVE, *, here: bool = True) -> list[str]:
    """Why this engine cannot measure these effective values as they are (empty: it can), in RULES' order.
    here=False leaves out the rules that ask this machine (a launch plan built for another one)."""
    return [
        reason
        for rule in RULES
        if engine in rule.engines and (here or not rule.here)
        for reason in rule.check(values, engine)
    ]
