"""PEFT methods of a measured run: LoRA / QLoRA adapters and prompt tuning (peft).

LoRA: dropout 0.05, bias none, task CAUSAL_LM (ado-sfttrainer.md §6.2); target modules from the
command line, else derived from the model's module names (hf-stack.md §4.4: q_proj/v_proj on
Llama-like models, c_attn on GPTBigCode, query_key_value on Bloom). Prompt tuning: TEXT init with
8 virtual tokens from the run's (local) tokenizer, as fms-hf-tuning's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


QUANTIZED_LINEAR = ("Linear4bit", "Linear8bitLt", "QuantLinear")  # bitsandbytes / GPTQ linear layers
# First candidate set whose modules all exist in the model wins (hf-stack.md §4.4).
TARGET_CANDIDATES = (("q_proj", "v_proj"), ("c_attn",), ("query_key_value",), ("qkv_proj",), ("Wqkv",))


@dataclass(frozen=True)
class PeftSettings:
    """What the worker's command line asks of peft (the SFTTrainer spec flags of the same names); the
    worker's WorkerConfig is one (it adds the other flags)."""

    gradient_checkpointing: bool
    gradient_checkpointing_kwargs: dict[str, Any]
    peft_method: str  # none | lora | qlora | pt
    target_modules: list[str] | None  # None: derived from the model (TARGET_CANDIDATES)
    r: int
    lora_alpha: int
    lora_dropout: float
    num_virtual_tokens: int
    prompt_tuning_init: str  # TEXT | RANDOM
    prompt_tuning_init_text: str


def linear_module_names(model: torch.nn.Module) -> set[str]:
    """Leaf names of the model's linear layers (e.g. 'q_proj')."""
    import torch

    names = set()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) or type(module).__name__ in QUANTIZED_LINEAR:
            names.add(name.rsplit(".", 1)[-1])
    return names


def default_target_modules(model: torch.nn.Module) -> list[str] | str:
    names = linear_module_names(model)
    for candidate in TARGET_CANDIDATES:
        if all(c in names for c in candidate):
            return list(candidate)
    return "all-linear"


def build_peft_config(peft: PeftSettings, model: torch.nn.Module, tokenizer_path: str) -> Any | None:
    """peft config for --peft_method (None for full fine-tuning)."""
    from peft import LoraConfig, PromptTuningConfig, PromptTuningInit, TaskType

    if peft.peft_method in ("lora", "qlora"):
        targets: list[str] | str
        if not peft.target_modules:
            targets = default_target_modules(model)
        elif peft.target_modules == ["all-linear"]:
            targets = "all-linear"  # fms-hf-tuning maps ["all-linear"] to "all-linear"
        elif len(peft.target_modules) == 1 and peft.target_modules[0].startswith(".*"):
            targets = peft.target_modules[0]  # a regex (peft full-matches a string): vision language-model layers
        else:
            targets = list(peft.target_modules)
        return LoraConfig(
            r=peft.r,
            lora_alpha=peft.lora_alpha,
            lora_dropout=peft.lora_dropout,
            bias="none",
            target_modules=targets,
            task_type=TaskType.CAUSAL_LM,
        )
    if peft.peft_method == "pt":
        text_init = peft.prompt_tuning_init == "TEXT"
        return PromptTuningConfig(
            task_type=TaskType.CAUSAL_LM,
            num_virtual_tokens=peft.num_virtual_tokens,
            prompt_tuning_init=PromptTuningInit.TEXT if text_init else PromptTuningInit.RANDOM,
            prompt_tuning_init_text=peft.prompt_tuning_init_text if text_init else None,
            tokenizer_name_or_path=tokenizer_path if text_init else None,
            tokenizer_kwargs={"local_files_only": True} if text_init else None,
        )
    return None


def apply_peft(
    peft: PeftSettings, model: torch.nn.Module, tokenizer_path: str
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Wrap the model for the PEFT method; returns (model, facts for the result)."""
    config = build_peft_config(peft, model, tokenizer_path)
    if config is None:
        return model, {"method": "none"}
    from peft import get_peft_model, prepare_model_for_kbit_training

    gc_kwargs = peft.gradient_checkpointing_kwargs or {}
    if peft.peft_method == "qlora":
        model = prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=peft.gradient_checkpointing,
            gradient_checkpointing_kwargs=gc_kwargs,
        )
    elif peft.gradient_checkpointing and gc_kwargs.get("use_reentrant", True) and peft.peft_method == "lora":
        # Reentrant checkpointing needs an input that requires grad; frozen embeddings give none.
        model.enable_input_require_grads()
    model = get_peft_model(model, config)
    facts: dict[str, Any] = {"method": peft.peft_method}
    targets = getattr(config, "target_modules", None)
    if targets is not None:
        facts["target_modules"] = sorted(targets) if not isinstance(targets, str) else targets
    if peft.peft_method == "pt":
        facts.update(
            num_virtual_tokens=config.num_virtual_tokens,
            prompt_tuning_init=str(config.prompt_tuning_init.value),
            prompt_tuning_init_text=config.prompt_tuning_init_text,
        )
    return model, facts
